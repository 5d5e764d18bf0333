#include "common/float_codec.h"

#include "common/int8_codec.h"
#include "common/topk_codec.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace parasync {

static_assert(std::endian::native == std::endian::little, "the wire is little-endian");

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kBfloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kInt8: return "int8";
    case DType::kTopK: return "topk";
    case DType::kInt4: return "int4";
  }
  return "unknown";
}

std::optional<DType> ParseDType(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "float32" || t == "fp32" || t == "f32") return DType::kFloat32;
  if (t == "bfloat16" || t == "bf16") return DType::kBfloat16;
  if (t == "float16" || t == "fp16" || t == "f16" || t == "half") return DType::kFloat16;
  if (t == "int8" || t == "i8") return DType::kInt8;
  if (t == "int4" || t == "i4") return DType::kInt4;
  if (t == "topk") return DType::kTopK;
  return std::nullopt;
}

std::optional<WireFormat> ParseWireFormat(std::string_view text) {
  const size_t colon = text.find(':');
  const std::optional<DType> dtype = ParseDType(text.substr(0, colon));
  if (!dtype) return std::nullopt;
  if (*dtype != DType::kTopK) {
    if (colon != std::string_view::npos) return std::nullopt;
    return WireFormat(*dtype);
  }
  if (colon == std::string_view::npos) return WireFormat(DType::kTopK, kTopKDefaultKeep);
  const std::string r(text.substr(colon + 1));
  char* end = nullptr;
  const double density = r.empty() ? 0.0 : std::strtod(r.c_str(), &end);
  if (r.empty() || end != r.c_str() + r.size()) return std::nullopt;
  const std::optional<int> keep = TopKKeepFor(density);
  if (!keep) return std::nullopt;
  return WireFormat(DType::kTopK, *keep);
}

std::string WireFormatName(WireFormat format) {
  if (format.dtype != DType::kTopK) return std::string(DTypeName(format.dtype));
  std::ostringstream out;
  out << "topk:" << static_cast<double>(format.keep) / static_cast<double>(kTopKChunk);
  return out.str();
}

// The conversions are written without branches on the data: each candidate result is
// computed and the right one picked with masks, so the loops in EncodeFloats / DecodeFloats
// vectorize (GCC 12 leaves ternaries here as branches).

namespace {

// All ones where `condition`, else zero.
inline uint32_t Mask(bool condition) { return 0u - static_cast<uint32_t>(condition); }
inline uint32_t Pick(uint32_t mask, uint32_t if_set, uint32_t otherwise) {
  return (if_set & mask) | (otherwise & ~mask);
}

}  // namespace

uint16_t FloatToBfloat16(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint32_t magnitude = u & 0x7fffffffu;
  // Round to nearest even on the 16 bits dropped.
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  // A finite value that rounded up to Inf saturates at the largest finite bfloat16.
  r -= Mask((r & 0x7fffu) == 0x7f80u) & Mask(magnitude < 0x7f800000u) & 1u;
  // NaN: keep the sign and the top of the payload, force it quiet.
  r = Pick(Mask(magnitude > 0x7f800000u), (u >> 16) | 0x0040u, r);
  return static_cast<uint16_t>(r);
}

float Bfloat16ToFloat(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

// After F. Giesen, "float->half variants" (2016): rebias and round in the integer domain for
// normal results; let the FPU's own round-to-nearest-even place subnormal ones.
uint16_t FloatToHalf(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  // Normal half: rebias the exponent (127 -> 15) and round the 13 dropped bits to even.
  const uint32_t normal = (a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // Subnormal half (|value| < 2^-14): adding 0.5 lines the half's ulp (2^-24) up with the
  // float's last mantissa bit, so the addition itself rounds. (Computed for every input,
  // used for the small ones only; an Inf or NaN sum is never picked.)
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3f000000u;
  uint32_t r = Pick(Mask(a < 0x38800000u), sub, normal);
  r = Pick(Mask(a >= 0x477ff000u), 0x7bffu, r);  // rounds to >= 65536: the largest finite half
  r = Pick(Mask(a == 0x7f800000u), 0x7c00u, r);  // Inf
  r = Pick(Mask(a > 0x7f800000u), 0x7e00u | ((a >> 13) & 0x1ffu), r);  // NaN, quiet
  return static_cast<uint16_t>(sign | r);
}

float HalfToFloat(uint16_t bits) {
  const uint32_t h = bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t em = (h & 0x7fffu) << 13;       // exponent and mantissa, in float position
  const uint32_t exponent = em & 0x0f800000u;
  const uint32_t normal = em + (112u << 23);     // rebias 15 -> 127
  // Exponent all ones; a NaN comes out quiet (as the hardware's conversion makes it).
  const uint32_t inf_nan = (em + (224u << 23)) | (Mask((em & 0x007fe000u) != 0) & 0x00400000u);
  // Subnormal: place the mantissa as a float of exponent 2^-14 and subtract the implicit 1.
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(em + (113u << 23)) -
                                               std::bit_cast<float>(113u << 23));
  uint32_t r = Pick(Mask(exponent == 0), sub, normal);
  r = Pick(Mask(exponent == 0x0f800000u), inf_nan, r);
  return std::bit_cast<float>(sign | r);
}

namespace {

// One loop per direction and conversion: the scalar form, for what the vector forms leave.
template <uint16_t (*kNarrow)(float)>
inline void NarrowAll(const float* in, size_t n, unsigned char* out) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t v = kNarrow(in[i]);
    std::memcpy(out + 2 * i, &v, 2);
  }
}

template <float (*kWiden)(uint16_t)>
inline void WidenAll(const unsigned char* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, in + 2 * i, 2);
    out[i] = kWiden(v);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define PARASYNC_CODEC_AVX2 1

// The array forms run 8 elements at a time where the CPU has AVX2 and F16C (asked once, at
// the first call: no load-time resolver, which ThreadSanitizer's runtime cannot survive),
// and give exactly the scalar functions' bits (tests/common/float_codec_test.cc compares
// them on every half and millions of floats). The scalar loop was one out-of-line call per
// element: 30 % of a float16 run's CPU (perf: the Keras CNN's 2.8 M gradients narrowed and
// widened by workers and servers every step) before these. The conversions ignore
// flush-to-zero and denormals-are-zero (which every compute thread sets: common/denormals.h),
// as the scalar functions' results do not depend on them; the test runs both ways.
bool HasAvx2F16c() {
  static const bool yes = [] {
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 itself: clang's __builtin_cpu_supports does not know "f16c".
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && f16c;
  }();
  return yes;
}

// Each returns how many leading elements it converted (a multiple of 8).
__attribute__((target("avx2,f16c"))) size_t NarrowHalfAvx2(const float* in, size_t n,
                                                             unsigned char* out) {
  const __m256i magnitude_bits = _mm256_set1_epi32(0x7fffffff);
  const __m256i saturates_above = _mm256_set1_epi32(0x477ff000 - 1);  // rounds to >= 65536
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m128i sign = _mm_set1_epi16(static_cast<int16_t>(0x8000));
  const __m128i largest = _mm_set1_epi16(0x7bff);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // A finite value the hardware rounded to Inf saturates at 65504, keeping its sign.
    const __m256i a = _mm256_and_si256(_mm256_castps_si256(x), magnitude_bits);
    const __m256i big = _mm256_and_si256(_mm256_cmpgt_epi32(a, saturates_above),
                                         _mm256_cmpgt_epi32(inf, a));
    const __m128i big16 = _mm_packs_epi32(_mm256_castsi256_si128(big),
                                          _mm256_extracti128_si256(big, 1));
    h = _mm_blendv_epi8(h, _mm_or_si128(_mm_and_si128(h, sign), largest), big16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  return i;
}

__attribute__((target("avx2,f16c"))) size_t WidenHalfAvx2(const unsigned char* in, size_t n,
                                                            float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  return i;
}

// FloatToBfloat16's integer steps, 8 lanes at a time.
__attribute__((target("avx2"))) size_t NarrowBfloat16Avx2(const float* in, size_t n,
                                                          unsigned char* out) {
  const __m256i magnitude_bits = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i one = _mm256_set1_epi32(1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m256i a = _mm256_and_si256(u, magnitude_bits);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
    const __m256i rounded_to_inf = _mm256_cmpeq_epi32(
        _mm256_and_si256(r, _mm256_set1_epi32(0x7fff)), _mm256_set1_epi32(0x7f80));
    const __m256i finite = _mm256_cmpgt_epi32(inf, a);
    r = _mm256_sub_epi32(r, _mm256_and_si256(_mm256_and_si256(rounded_to_inf, finite), one));
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, quiet, _mm256_cmpgt_epi32(a, inf));
    // Lanes hold 0..0xffff, which packus keeps; it packs within 128-bit halves, so the
    // permute brings the two halves' results together.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), _mm256_castsi256_si128(packed));
  }
  return i;
}

__attribute__((target("avx2"))) size_t WidenBfloat16Avx2(const unsigned char* in, size_t n,
                                                         float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
  }
  return i;
}
#endif

// The vector form where the CPU has it, on a multiple of 8 elements; the scalar one after.
void Narrow(const float* in, size_t n, DType to, unsigned char* out) {
  size_t done = 0;
#if defined(PARASYNC_CODEC_AVX2)
  if (HasAvx2F16c()) {
    done = to == DType::kFloat16 ? NarrowHalfAvx2(in, n, out) : NarrowBfloat16Avx2(in, n, out);
  }
#endif
  if (to == DType::kFloat16) {
    NarrowAll<FloatToHalf>(in + done, n - done, out + 2 * done);
  } else {
    NarrowAll<FloatToBfloat16>(in + done, n - done, out + 2 * done);
  }
}

void Widen(const unsigned char* in, size_t n, DType from, float* out) {
  size_t done = 0;
#if defined(PARASYNC_CODEC_AVX2)
  if (HasAvx2F16c()) {
    done = from == DType::kFloat16 ? WidenHalfAvx2(in, n, out) : WidenBfloat16Avx2(in, n, out);
  }
#endif
  if (from == DType::kFloat16) {
    WidenAll<HalfToFloat>(in + 2 * done, n - done, out + done);
  } else {
    WidenAll<Bfloat16ToFloat>(in + 2 * done, n - done, out + done);
  }
}

}  // namespace

bool FloatCodecIsVectorized() {
#if defined(PARASYNC_CODEC_AVX2)
  return HasAvx2F16c();
#else
  return false;
#endif
}

void EncodeFloats(const float* in, size_t n, DType to, void* out) {
  if (n == 0) return;  // the pointers may then be null (memcpy's are not allowed to be)
  if (to == DType::kFloat32) return (void)std::memcpy(out, in, n * sizeof(float));
  if (to == DType::kInt8) return EncodeInt8(in, n, 0, out, nullptr);
  if (to == DType::kInt4) return EncodeInt4(in, n, 0, out, nullptr);
  if (to == DType::kTopK) return EncodeTopK(in, n, 0, kTopKDefaultKeep, out, nullptr);
  Narrow(in, n, to, static_cast<unsigned char*>(out));
}

void DecodeFloats(const void* in, size_t n, DType from, float* out) {
  if (n == 0) return;
  if (from == DType::kFloat32) return (void)std::memcpy(out, in, n * sizeof(float));
  if (from == DType::kInt8) return DecodeInt8(in, n, 0, out);
  if (from == DType::kInt4) return DecodeInt4(in, n, 0, out);
  if (from == DType::kTopK) return DecodeTopK(in, n, 0, kTopKDefaultKeep, out);
  Widen(static_cast<const unsigned char*>(in), n, from, out);
}

size_t WireBytes(WireFormat format, size_t n, int64_t offset) {
  switch (format.dtype) {
    case DType::kInt8: return Int8Bytes(offset, n);
    case DType::kInt4: return Int4Bytes(offset, n);
    case DType::kTopK: return TopKBytes(offset, n, format.keep);
    default: return n * DTypeSize(format.dtype);
  }
}

void EncodeRange(const float* in, size_t n, int64_t offset, WireFormat to, void* out,
                 float* residual) {
  if (to.dtype == DType::kInt8) return EncodeInt8(in, n, offset, out, residual);
  if (to.dtype == DType::kInt4) return EncodeInt4(in, n, offset, out, residual);
  if (to.dtype == DType::kTopK) return EncodeTopK(in, n, offset, to.keep, out, residual);
  EncodeFloats(in, n, to.dtype, out);
}

bool WellFormedRange(const void* in, size_t n, int64_t offset, WireFormat from) {
  return from.dtype != DType::kTopK || TopKWellFormed(in, n, offset, from.keep);
}

void DecodeRange(const void* in, size_t n, int64_t offset, WireFormat from, float* out) {
  if (from.dtype == DType::kInt8) return DecodeInt8(in, n, offset, out);
  if (from.dtype == DType::kInt4) return DecodeInt4(in, n, offset, out);
  if (from.dtype == DType::kTopK) return DecodeTopK(in, n, offset, from.keep, out);
  DecodeFloats(in, n, from.dtype, out);
}

void EncodeDeltaRange(const float* target, const float* base, float* next, size_t n,
                      int64_t offset, WireFormat to, void* out) {
  if (to.dtype == DType::kInt8) return EncodeInt8Delta(target, base, next, n, offset, out);
  if (to.dtype == DType::kInt4) return EncodeInt4Delta(target, base, next, n, offset, out);
  // top-k: its selection of target - base, without a residual (the difference is one).
  thread_local std::vector<float> difference;
  const float* from = target;
  if (base != nullptr) {
    difference.resize(n);
    for (size_t i = 0; i < n; ++i) difference[i] = target[i] - base[i];
    from = difference.data();
  }
  EncodeRange(from, n, offset, to, out, nullptr);
  if (base == nullptr) {
    std::fill(next, next + n, 0.0f);
  } else if (next != base) {
    std::copy(base, base + n, next);
  }
  AddRange(out, n, offset, to, next);
}

void AddRange(const void* in, size_t n, int64_t offset, WireFormat from, float* out,
              float* also) {
  if (from.dtype == DType::kInt8) return AddInt8(in, n, offset, out, also);
  if (from.dtype == DType::kInt4) return AddInt4(in, n, offset, out, also);
  thread_local std::vector<float> decoded;
  decoded.resize(n);
  DecodeRange(in, n, offset, from, decoded.data());
  for (size_t i = 0; i < n; ++i) out[i] += decoded[i];
  if (also != nullptr) std::copy(out, out + n, also);
}

void CopyFloatsStreaming(const float* in, size_t n, float* out) {
#if defined(__SSE2__)
  size_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(out + i) % 16 != 0; ++i) out[i] = in[i];
  for (; i + 4 <= n; i += 4) _mm_stream_ps(out + i, _mm_loadu_ps(in + i));
  for (; i < n; ++i) out[i] = in[i];
  _mm_sfence();
#else
  if (n != 0) std::memcpy(out, in, n * sizeof(float));
#endif
}

}  // namespace parasync
