#include "common/float_codec.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace parasync {

static_assert(std::endian::native == std::endian::little, "the wire is little-endian");

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kBfloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
  }
  return "unknown";
}

std::optional<DType> ParseDType(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "float32" || t == "fp32" || t == "f32") return DType::kFloat32;
  if (t == "bfloat16" || t == "bf16") return DType::kBfloat16;
  if (t == "float16" || t == "fp16" || t == "f16" || t == "half") return DType::kFloat16;
  return std::nullopt;
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
  const uint32_t inf_nan = em + (224u << 23);    // exponent all ones
  // Subnormal: place the mantissa as a float of exponent 2^-14 and subtract the implicit 1.
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(em + (113u << 23)) -
                                               std::bit_cast<float>(113u << 23));
  uint32_t r = Pick(Mask(exponent == 0), sub, normal);
  r = Pick(Mask(exponent == 0x0f800000u), inf_nan, r);
  return std::bit_cast<float>(sign | r);
}

namespace {

// One loop per direction and conversion; inlined into the clones below.
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

}  // namespace

// An AVX2 build of the loops where the CPU has it, chosen at load time: SSE2 alone has no
// 32 -> 16 bit pack, so narrowing would be several shuffles per vector. Not under
// ThreadSanitizer: the clones' resolver runs while the dynamic loader relocates, before the
// sanitizer's runtime is up, and its instrumented code crashes every binary at start.
#if defined(__SANITIZE_THREAD__)
#define PARASYNC_CODEC_CLONES
#else
#define PARASYNC_CODEC_CLONES __attribute__((target_clones("avx2", "default")))
#endif

PARASYNC_CODEC_CLONES
void EncodeFloats(const float* in, size_t n, DType to, void* out) {
  if (n == 0) return;  // the pointers may then be null (memcpy's are not allowed to be)
  switch (to) {
    case DType::kFloat32: return (void)std::memcpy(out, in, n * sizeof(float));
    case DType::kBfloat16: return NarrowAll<FloatToBfloat16>(in, n, static_cast<unsigned char*>(out));
    case DType::kFloat16: return NarrowAll<FloatToHalf>(in, n, static_cast<unsigned char*>(out));
  }
}

PARASYNC_CODEC_CLONES
void DecodeFloats(const void* in, size_t n, DType from, float* out) {
  if (n == 0) return;
  const auto* bytes = static_cast<const unsigned char*>(in);
  switch (from) {
    case DType::kFloat32: return (void)std::memcpy(out, in, n * sizeof(float));
    case DType::kBfloat16: return WidenAll<Bfloat16ToFloat>(bytes, n, out);
    case DType::kFloat16: return WidenAll<HalfToFloat>(bytes, n, out);
  }
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
