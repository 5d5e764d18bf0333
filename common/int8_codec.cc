#include "common/int8_codec.h"

#include <algorithm>
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

// q = v / 2^e rounded to nearest even (clamped), residual = v - q 2^e.
void Quantize(const float* v, size_t n, float down, float up, int8_t* q, float* residual) {
  for (size_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(std::clamp(v[i] * down, -127.0f, 127.0f));
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

__attribute__((target("avx2"))) void QuantizeAvx2(const float* v, size_t n, float down,
                                                  float up, int8_t* q, float* residual) {
  const __m256 d = _mm256_set1_ps(down), u = _mm256_set1_ps(up);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
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

int8_t QuantizeInt8Chunk(const float* in, size_t n, int8_t* q, float* residual, float* v) {
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
  const int e = Int8Exponent(m);
  const float down = std::ldexp(1.0f, -e);  // exact: -e is within a float's exponents
  const float up = std::ldexp(1.0f, e);
#if defined(PARASYNC_INT8_AVX2)
  if (wide) return QuantizeAvx2(v, n, down, up, q, residual), static_cast<int8_t>(e);
#endif
  Quantize(v, n, down, up, q, residual);
  return static_cast<int8_t>(e);
}

// m = f * 2^k with f in [0.5, 1): 127 * 2^(k-7) = 2^k * 127/128, so e = k - 7 when
// f <= 127/128, else k - 6.
int Int8Exponent(float m) {
  if (!(m > 0.0f)) return kInt8MinExponent;
  int k = 0;
  const float f = std::frexp(m, &k);
  const int e = f <= 127.0f / 128.0f ? k - 7 : k - 6;
  return std::clamp(e, kInt8MinExponent, kInt8MaxExponent);
}

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

}  // namespace

void EncodeInt8(const float* in, size_t n, int64_t offset, void* out, float* residual) {
  auto* bytes = static_cast<int8_t*>(out);
  int8_t* q = bytes + Int8Chunks(offset, n);
  float v[kInt8Chunk];
  ForEachChunk(offset, n, [&](size_t c, size_t at, size_t len) {
    bytes[c] =
        QuantizeInt8Chunk(in + at, len, q + at, residual != nullptr ? residual + at : nullptr, v);
  });
}

void DecodeInt8(const void* in, size_t n, int64_t offset, float* out) {
  const auto* bytes = static_cast<const int8_t*>(in);
  const int8_t* q = bytes + Int8Chunks(offset, n);
  ForEachChunk(offset, n, [&](size_t c, size_t at, size_t len) {
    const int e = bytes[c];
    if (e == kInt8NonFinite) {
      std::fill(out + at, out + at + len, std::numeric_limits<float>::quiet_NaN());
    } else {
      // An exponent outside the encoder's range comes from a corrupt frame; it decodes to a
      // float like any other (Inf at worst), which the finite check refuses.
      const float up = std::ldexp(1.0f, e);
      for (size_t i = at; i < at + len; ++i) out[i] = static_cast<float>(q[i]) * up;
    }
  });
}

void EncodeInt8Delta(const float* target, const float* base, float* next, size_t n,
                     int64_t offset, void* out) {
  auto* bytes = static_cast<int8_t*>(out);
  int8_t* q = bytes + Int8Chunks(offset, n);
  float d[kInt8Chunk];
  float v[kInt8Chunk];
  ForEachChunk(offset, n, [&](size_t c, size_t at, size_t len) {
    if (base != nullptr) Difference(target + at, base + at, len, d);
    bytes[c] = QuantizeInt8Chunk(base != nullptr ? d : target + at, len, q + at, nullptr, v);
    // What AddInt8 adds on the other side.
    if (base == nullptr) {
      std::fill(next + at, next + at + len, 0.0f);
    } else if (next != base) {
      std::copy(base + at, base + at + len, next + at);
    }
    AddChunk(q + at, len, bytes[c], next + at);
  });
}

void AddInt8(const void* in, size_t n, int64_t offset, float* out, float* also) {
  const auto* bytes = static_cast<const int8_t*>(in);
  const int8_t* q = bytes + Int8Chunks(offset, n);
  ForEachChunk(offset, n, [&](size_t c, size_t at, size_t len) {
    AddChunk(q + at, len, bytes[c], out + at, also != nullptr ? also + at : nullptr);
  });
}

}  // namespace parasync
