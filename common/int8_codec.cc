#include "common/int8_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PARASYNC_INT8_AVX2 1
#endif

namespace parasync {
namespace {

// v = in (+ residual) into `v`; returns max |v|, or NaN when some v is NaN or Inf.
float Gather(const float* in, size_t n, const float* residual, float* v) {
  float m = 0.0f;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    v[i] = residual != nullptr ? in[i] + residual[i] : in[i];
    finite &= std::isfinite(v[i]);
    m = std::max(m, std::fabs(v[i]));
  }
  return finite ? m : std::numeric_limits<float>::quiet_NaN();
}

// q = v / 2^e rounded to nearest even (clamped to +-levels), residual = v - q 2^e.
void Quantize(const float* v, size_t n, float levels, float down, float up, int8_t* q,
              float* residual) {
  for (size_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(std::clamp(v[i] * down, -levels, levels));
    q[i] = static_cast<int8_t>(r);
    if (residual != nullptr) residual[i] = v[i] - r * up;
  }
}

#if defined(PARASYNC_INT8_AVX2)
// The same two passes 8 elements at a time, for n a multiple of 8, with the same bits: the
// sums and products are the scalar ones, and rounding to nearest even is the hardware's
// (nearbyint's in the default rounding mode, which nothing here changes). Asked of the CPU
// once, at the first call (as common/float_codec.cc does).
bool HasAvx2() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return yes;
}

__attribute__((target("avx2"))) float GatherAvx2(const float* in, size_t n,
                                                 const float* residual, float* v) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 m = _mm256_setzero_ps();
  __m256 bad = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 8) {
    __m256 x = _mm256_loadu_ps(in + i);
    if (residual != nullptr) x = _mm256_add_ps(x, _mm256_loadu_ps(residual + i));
    _mm256_storeu_ps(v + i, x);
    const __m256 a = _mm256_and_ps(x, magnitude);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // Inf, or NaN
    m = _mm256_max_ps(m, a);
  }
  if (_mm256_movemask_ps(bad) != 0) return std::numeric_limits<float>::quiet_NaN();
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  return *std::max_element(lanes, lanes + 8);
}

__attribute__((target("avx2"))) void QuantizeAvx2(const float* v, size_t n, float levels,
                                                  float down, float up, int8_t* q,
                                                  float* residual) {
  const __m256 d = _mm256_set1_ps(down), u = _mm256_set1_ps(up);
  const __m256 lo = _mm256_set1_ps(-levels), hi = _mm256_set1_ps(levels);
  for (size_t i = 0; i < n; i += 8) {
    const __m256 x = _mm256_loadu_ps(v + i);
    const __m256 r = _mm256_round_ps(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(x, d), lo), hi),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i w = _mm256_cvtps_epi32(r);
    const __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packs_epi16(h, h));
    if (residual != nullptr) _mm256_storeu_ps(residual + i, _mm256_sub_ps(x, _mm256_mul_ps(r, u)));
  }
}

// Delta pulls' two loops 8 at a time (n a multiple of 8), with the scalar loops' bits: a
// difference, and an exact product added (no fused multiply-add is asked for, and q * 2^e
// is exact, so one would round the same).
__attribute__((target("avx2"))) void DifferenceAvx2(const float* a, const float* b, size_t n,
                                                    float* out) {
  for (size_t i = 0; i < n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
}

__attribute__((target("avx2"))) void AddScaledAvx2(const int8_t* q, size_t n, float up,
                                                   float* out, float* also) {
  const __m256 u = _mm256_set1_ps(up);
  for (size_t i = 0; i < n; i += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    const __m256 sum = _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_mul_ps(v, u));
    _mm256_storeu_ps(out + i, sum);
    if (also != nullptr) _mm256_storeu_ps(also + i, sum);
  }
}
#endif

// out[i] += q[i] * 2^e, or NaN for a non-finite chunk; `also` (or null) gets the sums too.
void AddChunk(const int8_t* q, size_t n, int e, float* out, float* also = nullptr) {
  if (e == kInt8NonFinite) {
    std::fill(out, out + n, std::numeric_limits<float>::quiet_NaN());
  } else {
    const float up = std::ldexp(1.0f, e);
#if defined(PARASYNC_INT8_AVX2)
    if (n % 8 == 0 && HasAvx2()) return AddScaledAvx2(q, n, up, out, also);
#endif
    for (size_t i = 0; i < n; ++i) out[i] += static_cast<float>(q[i]) * up;
  }
  if (also != nullptr) std::copy(out, out + n, also);
}

}  // namespace

int8_t QuantizeChunk(const float* in, size_t n, int levels, int8_t* q, float* residual,
                     float* v) {
#if defined(PARASYNC_INT8_AVX2)
  const bool wide = n % 8 == 0 && HasAvx2();
  const float m = wide ? GatherAvx2(in, n, residual, v) : Gather(in, n, residual, v);
#else
  const float m = Gather(in, n, residual, v);
#endif
  if (std::isnan(m)) {
    std::memset(q, 0, n);
    if (residual != nullptr) std::fill(residual, residual + n, 0.0f);
    return kInt8NonFinite;
  }
  const int e = QuantizedExponent(m, levels);
  const float down = std::ldexp(1.0f, -e);  // exact: -e is within a float's exponents
  const float up = std::ldexp(1.0f, e);
  const auto l = static_cast<float>(levels);
#if defined(PARASYNC_INT8_AVX2)
  if (wide) return QuantizeAvx2(v, n, l, down, up, q, residual), static_cast<int8_t>(e);
#endif
  Quantize(v, n, l, down, up, q, residual);
  return static_cast<int8_t>(e);
}

int8_t QuantizeInt8Chunk(const float* in, size_t n, int8_t* q, float* residual, float* v) {
  return QuantizeChunk(in, n, kInt8Levels, q, residual, v);
}

// levels = 2^b - 1 and m = f * 2^k with f in [0.5, 1): levels * 2^(k-b) = 2^k * levels/2^b,
// so e = k - b when f <= levels / 2^b, else k - b + 1 (int8: b = 7; int4: b = 3).
int QuantizedExponent(float m, int levels) {
  if (!(m > 0.0f)) return kInt8MinExponent;
  const int b = std::bit_width(static_cast<unsigned>(levels));
  const float top = static_cast<float>(levels) / static_cast<float>(1 << b);
  int k = 0;
  const float f = std::frexp(m, &k);
  const int e = f <= top ? k - b : k - b + 1;
  return std::clamp(e, kInt8MinExponent, kInt8MaxExponent);
}

int Int8Exponent(float m) { return QuantizedExponent(m, kInt8Levels); }

size_t Int8Chunks(int64_t offset, size_t n) {
  if (n == 0) return 0;
  const int64_t first = offset / kInt8Chunk;
  const int64_t last = (offset + static_cast<int64_t>(n) - 1) / kInt8Chunk;
  return static_cast<size_t>(last - first + 1);
}

namespace {

// Calls fn(c, at, len) for each chunk c that elements offset..offset+n of a variable touch:
// its elements [at, at + len) of the range.
template <typename Fn>
void ForEachChunk(int64_t offset, size_t n, Fn&& fn) {
  const size_t chunks = Int8Chunks(offset, n);
  size_t at = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const auto in_chunk = static_cast<size_t>((offset + static_cast<int64_t>(at)) % kInt8Chunk);
    const size_t len = std::min(n - at, static_cast<size_t>(kInt8Chunk) - in_chunk);
    fn(c, at, len);
    at += len;
  }
}

// d = a - b over n elements.
void Difference(const float* a, const float* b, size_t n, float* d) {
#if defined(PARASYNC_INT8_AVX2)
  if (n % 8 == 0 && HasAvx2()) return DifferenceAvx2(a, b, n, d);
#endif
  for (size_t i = 0; i < n; ++i) d[i] = a[i] - b[i];
}

// Where a range's q are. int8: in place, a byte each. int4: two to a byte, element i of the
// range in byte i / 2 (the low four bits for an even i, two's complement), through a
// chunk's worth of int8 beside. A chunk's elements are written in order and a byte's low
// half before its high half, so every byte is first written whole (the high half 0 until
// it is set), and a range of odd length ends in a high half of 0.
struct Int8Layout {
  static constexpr int kLevels = kInt8Levels;
  static int8_t* Target(int8_t* payload, size_t at, int8_t* /*scratch*/) { return payload + at; }
  static void Store(const int8_t* /*q*/, size_t /*at*/, size_t /*len*/, int8_t* /*payload*/) {}
  static const int8_t* Load(const int8_t* payload, size_t at, size_t /*len*/, int8_t* /*scratch*/) {
    return payload + at;
  }
};

struct Int4Layout {
  static constexpr int kLevels = kInt4Levels;
  static int8_t* Target(int8_t* /*payload*/, size_t /*at*/, int8_t* scratch) { return scratch; }
  static void Store(const int8_t* q, size_t at, size_t len, int8_t* payload) {
    auto* p = reinterpret_cast<uint8_t*>(payload);
    auto low = [](int8_t x) { return static_cast<uint8_t>(x & 0x0f); };
    size_t i = 0;
    if (at % 2 == 1 && len > 0) {
      p[at / 2] = static_cast<uint8_t>((p[at / 2] & 0x0f) | (low(q[0]) << 4));
      i = 1;
    }
    uint8_t* pairs = p + (at + i) / 2;
    for (size_t k = 0; i + 1 < len; i += 2, ++k) {
      pairs[k] = static_cast<uint8_t>(low(q[i]) | (low(q[i + 1]) << 4));
    }
    if (i < len) p[(at + i) / 2] = low(q[i]);
  }
  static const int8_t* Load(const int8_t* payload, size_t at, size_t len, int8_t* scratch) {
    const auto* p = reinterpret_cast<const uint8_t*>(payload);
    // The high half by an arithmetic shift of the byte, the low one moved up first.
    auto high = [](uint8_t b) { return static_cast<int8_t>(static_cast<int8_t>(b) >> 4); };
    auto low = [](uint8_t b) {
      return static_cast<int8_t>(static_cast<int8_t>(static_cast<uint8_t>(b << 4)) >> 4);
    };
    size_t i = 0;
    if (at % 2 == 1 && len > 0) scratch[i++] = high(p[at / 2]);
    const uint8_t* pairs = p + (at + i) / 2;
    for (size_t k = 0; i + 1 < len; i += 2, ++k) {
      scratch[i] = low(pairs[k]);
      scratch[i + 1] = high(pairs[k]);
    }
    if (i < len) scratch[i] = low(p[(at + i) / 2]);
    return scratch;
  }
};

template <typename Layout>
void Encode(const float* in, size_t n, int64_t offset, void* out, float* residual) {
  auto* bytes = static_cast<int8_t*>(out);
  int8_t* payload = bytes + Int8Chunks(offset, n);
  float v[kInt8Chunk];
  int8_t scratch[kInt8Chunk];
  ForEachChunk(offset, n, [&](size_t c, size_t at, size_t len) {
    int8_t* q = Layout::Target(payload, at, scratch);
    bytes[c] = QuantizeChunk(in + at, len, Layout::kLevels, q,
                             residual != nullptr ? residual + at : nullptr, v);
    Layout::Store(q, at, len, payload);
  });
}

template <typename Layout>
void Decode(const void* in, size_t n, int64_t offset, float* out) {
  const auto* bytes = static_cast<const int8_t*>(in);
  const int8_t* payload = bytes + Int8Chunks(offset, n);
  int8_t scratch[kInt8Chunk];
  ForEachChunk(offset, n, [&](size_t c, size_t at, size_t len) {
    const int e = bytes[c];
    if (e == kInt8NonFinite) {
      std::fill(out + at, out + at + len, std::numeric_limits<float>::quiet_NaN());
    } else {
      // An exponent outside the encoder's range comes from a corrupt frame; it decodes to a
      // float like any other (Inf at worst), which the finite check refuses.
      const int8_t* q = Layout::Load(payload, at, len, scratch);
      const float up = std::ldexp(1.0f, e);
      for (size_t i = 0; i < len; ++i) out[at + i] = static_cast<float>(q[i]) * up;
    }
  });
}

template <typename Layout>
void EncodeDelta(const float* target, const float* base, float* next, size_t n, int64_t offset,
                 void* out) {
  auto* bytes = static_cast<int8_t*>(out);
  int8_t* payload = bytes + Int8Chunks(offset, n);
  float d[kInt8Chunk];
  float v[kInt8Chunk];
  int8_t scratch[kInt8Chunk];
  ForEachChunk(offset, n, [&](size_t c, size_t at, size_t len) {
    if (base != nullptr) Difference(target + at, base + at, len, d);
    int8_t* q = Layout::Target(payload, at, scratch);
    bytes[c] =
        QuantizeChunk(base != nullptr ? d : target + at, len, Layout::kLevels, q, nullptr, v);
    Layout::Store(q, at, len, payload);
    // What Add adds on the other side.
    if (base == nullptr) {
      std::fill(next + at, next + at + len, 0.0f);
    } else if (next != base) {
      std::copy(base + at, base + at + len, next + at);
    }
    AddChunk(q, len, bytes[c], next + at);
  });
}

template <typename Layout>
void Add(const void* in, size_t n, int64_t offset, float* out, float* also) {
  const auto* bytes = static_cast<const int8_t*>(in);
  const int8_t* payload = bytes + Int8Chunks(offset, n);
  int8_t scratch[kInt8Chunk];
  ForEachChunk(offset, n, [&](size_t c, size_t at, size_t len) {
    AddChunk(Layout::Load(payload, at, len, scratch), len, bytes[c], out + at,
             also != nullptr ? also + at : nullptr);
  });
}

}  // namespace

void EncodeInt8(const float* in, size_t n, int64_t offset, void* out, float* residual) {
  Encode<Int8Layout>(in, n, offset, out, residual);
}
void DecodeInt8(const void* in, size_t n, int64_t offset, float* out) {
  Decode<Int8Layout>(in, n, offset, out);
}
void EncodeInt8Delta(const float* target, const float* base, float* next, size_t n,
                     int64_t offset, void* out) {
  EncodeDelta<Int8Layout>(target, base, next, n, offset, out);
}
void AddInt8(const void* in, size_t n, int64_t offset, float* out, float* also) {
  Add<Int8Layout>(in, n, offset, out, also);
}

void EncodeInt4(const float* in, size_t n, int64_t offset, void* out, float* residual) {
  Encode<Int4Layout>(in, n, offset, out, residual);
}
void DecodeInt4(const void* in, size_t n, int64_t offset, float* out) {
  Decode<Int4Layout>(in, n, offset, out);
}
void EncodeInt4Delta(const float* target, const float* base, float* next, size_t n,
                     int64_t offset, void* out) {
  EncodeDelta<Int4Layout>(target, base, next, n, offset, out);
}
void AddInt4(const void* in, size_t n, int64_t offset, float* out, float* also) {
  Add<Int4Layout>(in, n, offset, out, also);
}

}  // namespace parasync
