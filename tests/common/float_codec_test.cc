#include "common/float_codec.h"

#include <gtest/gtest.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace parasync {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// The nearest bfloat16 by brute force: the two candidates around `f` (truncation and the
// next one up in magnitude), the closer one, ties to the even one.
uint16_t NearestBfloat16(float f) {
  const uint16_t down = static_cast<uint16_t>(Bits(f) >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const double d = std::fabs(static_cast<double>(f) - Bfloat16ToFloat(down));
  const double u = std::fabs(static_cast<double>(Bfloat16ToFloat(up)) - f);
  if (d < u) return down;
  if (u < d) return up;
  return (down & 1) == 0 ? down : up;
}

TEST(FloatCodecTest, DTypeNamesParseBack) {
  for (DType t : {DType::kFloat32, DType::kBfloat16, DType::kFloat16, DType::kInt8,
                  DType::kInt4, DType::kTopK}) {
    EXPECT_EQ(ParseDType(DTypeName(t)), t);
  }
  EXPECT_EQ(ParseDType("BF16"), DType::kBfloat16);
  EXPECT_EQ(ParseDType("fp16"), DType::kFloat16);
  EXPECT_EQ(ParseDType("fp32"), DType::kFloat32);
  EXPECT_EQ(ParseDType("I4"), DType::kInt4);
  EXPECT_EQ(ParseDType("int2"), std::nullopt);
  EXPECT_EQ(ParseDType(""), std::nullopt);
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBfloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kInt8), 1u);
  EXPECT_EQ(WireBytes(DType::kInt4, 301, 0), 3u + 151u);  // 3 exponents, 151 bytes of pairs
}

// Every half decodes to the value GCC's _Float16 gives it, and encodes back to itself
// (NaNs: to a NaN of the same sign).
TEST(FloatCodecTest, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    _Float16 ref;
    std::memcpy(&ref, &bits, 2);
    const float f = HalfToFloat(bits);
    if (std::isnan(static_cast<float>(ref))) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      const uint16_t back = FloatToHalf(f);
      ASSERT_EQ(back & 0x7c00, 0x7c00) << std::hex << h;
      ASSERT_NE(back & 0x03ff, 0) << std::hex << h;
      ASSERT_EQ(back & 0x8000, bits & 0x8000) << std::hex << h;
      continue;
    }
    ASSERT_EQ(Bits(f), Bits(static_cast<float>(ref))) << std::hex << h;
    ASSERT_EQ(FloatToHalf(f), bits) << std::hex << h;
  }
}

// Float -> half agrees with GCC's _Float16 conversion (round to nearest even) on every
// magnitude class, except that a finite value beyond 65504's rounding range saturates
// instead of becoming Inf.
TEST(FloatCodecTest, FloatToHalfRoundsLikeTheHardwareAndSaturates) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 6.1035156e-05f,
                               5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f, 1e-10f,
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min()};
  for (int i = 0; i < 2000000; ++i) values.push_back(std::bit_cast<float>(any(rng)));
  // Ties: halfway between two halves, in the normal and the subnormal range.
  for (uint32_t h = 0; h < 0x7bff; h += 37) {
    const double a = HalfToFloat(static_cast<uint16_t>(h));
    const double b = HalfToFloat(static_cast<uint16_t>(h + 1));
    values.push_back(static_cast<float>((a + b) / 2));
  }
  int saturated = 0;
  for (float f : values) {
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    const uint16_t got = FloatToHalf(f);
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &ref, 2);
    if (std::isinf(static_cast<float>(ref)) && std::isfinite(f)) {
      ++saturated;
      ASSERT_EQ(got, (Bits(f) >> 31) ? 0xfbff : 0x7bff) << f;
      continue;
    }
    ASSERT_EQ(got, want) << std::hexfloat << f;
  }
  EXPECT_GT(saturated, 100000);  // random bit patterns are mostly beyond 65504
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7bff);
  EXPECT_EQ(FloatToHalf(-1e38f), 0xfbff);
}

TEST(FloatCodecTest, FloatToBfloat16IsTheNearestTiesToEven) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 2000000; ++i) {
    const float f = std::bit_cast<float>(any(rng));
    const uint16_t got = FloatToBfloat16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(Bfloat16ToFloat(got)));
      ASSERT_EQ(got & 0x8000, Bits(f) >> 31 << 15);
      continue;
    }
    if ((Bits(f) & 0x7fffffff) >= 0x7f7f8000 && std::isfinite(f)) {
      // Rounds up past the largest finite bfloat16: saturates.
      ASSERT_EQ(got & 0x7fff, 0x7f7f) << f;
      continue;
    }
    ASSERT_EQ(got, NearestBfloat16(f)) << std::hexfloat << f;
  }
  // Exact ties go to the even neighbour.
  EXPECT_EQ(FloatToBfloat16(std::bit_cast<float>(0x3f808000u)), 0x3f80);
  EXPECT_EQ(FloatToBfloat16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_EQ(FloatToBfloat16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBfloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(FloatToBfloat16(std::numeric_limits<float>::max()), 0x7f7f);
  EXPECT_EQ(FloatToBfloat16(-0.0f), 0x8000);
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = Bfloat16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBfloat16(f), b) << std::hex << b;
  }
}

// The array forms equal the scalar ones at any alignment, and float32 is a plain copy.
TEST(FloatCodecTest, EncodeDecodeArraysAtAnyAlignment) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> in(1001);
  for (float& v : in) v = normal(rng);
  in[5] = std::numeric_limits<float>::quiet_NaN();
  in[6] = -std::numeric_limits<float>::infinity();
  in[7] = 1e9f;
  for (DType t : {DType::kFloat32, DType::kBfloat16, DType::kFloat16}) {
    for (size_t offset : {0, 1, 3}) {
      std::vector<unsigned char> wire(offset + in.size() * DTypeSize(t) + 1, 0xab);
      EncodeFloats(in.data(), in.size(), t, wire.data() + offset);
      EXPECT_EQ(wire.back(), 0xab) << "wrote past the end";
      std::vector<float> out(in.size() + 1, -7.0f);
      DecodeFloats(wire.data() + offset, in.size(), t, out.data());
      EXPECT_EQ(out.back(), -7.0f);
      for (size_t i = 0; i < in.size(); ++i) {
        float want = in[i];
        if (t == DType::kBfloat16) want = Bfloat16ToFloat(FloatToBfloat16(in[i]));
        if (t == DType::kFloat16) want = HalfToFloat(FloatToHalf(in[i]));
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(out[i])) << i;
        } else {
          ASSERT_EQ(Bits(out[i]), Bits(want)) << DTypeName(t) << " element " << i;
        }
      }
      if (t != DType::kFloat32) {
        EXPECT_TRUE(std::isinf(out[6]) && out[6] < 0);
        EXPECT_TRUE(std::isfinite(out[7])) << "a finite value must stay finite";
        // Relative error of a normal value: 2^-9 for bfloat16, 2^-12 for float16.
        const float bound = t == DType::kBfloat16 ? 1.0f / 256 : 1.0f / 2048;
        EXPECT_NEAR(out[0], in[0], std::fabs(in[0]) * bound + 1e-7f);
      }
    }
  }
}

#if defined(__x86_64__)
// The array forms (8 at a time where the CPU has AVX2 and F16C) give the scalar functions'
// bits for every half and bfloat16 pattern and millions of floats (specials, ties, both
// subnormal ranges), from an offset that leaves a scalar tail, whether the calling thread
// flushes denormals (FTZ and DAZ, as every compute thread does) or not.
TEST(FloatCodecTest, ArrayFormsGiveTheScalarBitsUnderEitherMxcsr) {
  RecordProperty("vectorized", FloatCodecIsVectorized() ? "yes" : "no");
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> any;
  std::vector<float> floats = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xffc01234u),
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::max()};
  for (int i = 0; i < 1000000; ++i) floats.push_back(std::bit_cast<float>(any(rng)));
  for (uint32_t h = 0; h <= 0xffff; ++h) {  // every half, and the ties above each
    floats.push_back(HalfToFloat(static_cast<uint16_t>(h)));
    floats.push_back(std::bit_cast<float>(Bits(HalfToFloat(static_cast<uint16_t>(h))) + 0x1000));
  }
  std::vector<uint16_t> patterns(0x10000);
  for (uint32_t b = 0; b <= 0xffff; ++b) patterns[b] = static_cast<uint16_t>(b);
  const unsigned original = _mm_getcsr();
  for (unsigned flush : {0u, 0x8040u}) {
    _mm_setcsr((original & ~0x8040u) | flush);
    const size_t skip = 3;  // the vector body from an odd address, then a scalar tail
    std::vector<uint16_t> half(floats.size()), bf16(floats.size());
    EncodeFloats(floats.data() + skip, floats.size() - skip, DType::kFloat16, half.data());
    EncodeFloats(floats.data() + skip, floats.size() - skip, DType::kBfloat16, bf16.data());
    std::vector<float> from_half(patterns.size()), from_bf16(patterns.size());
    DecodeFloats(patterns.data() + skip, patterns.size() - skip, DType::kFloat16,
                 from_half.data());
    DecodeFloats(patterns.data() + skip, patterns.size() - skip, DType::kBfloat16,
                 from_bf16.data());
    _mm_setcsr(original);
    for (size_t i = 0; i + skip < floats.size(); ++i) {
      const float f = floats[i + skip];
      ASSERT_EQ(half[i], FloatToHalf(f)) << std::hexfloat << f << " flush " << flush;
      ASSERT_EQ(bf16[i], FloatToBfloat16(f)) << std::hexfloat << f << " flush " << flush;
    }
    for (size_t i = 0; i + skip < patterns.size(); ++i) {
      const uint16_t p = patterns[i + skip];
      ASSERT_EQ(Bits(from_half[i]), Bits(HalfToFloat(p))) << std::hex << p << " flush " << flush;
      ASSERT_EQ(Bits(from_bf16[i]), Bits(Bfloat16ToFloat(p))) << std::hex << p;
    }
  }
}
#endif

// The streaming copy at every alignment of both ends (its head, vector body and tail), for
// lengths around the vector width: every element copied bit for bit (NaN payloads too), and
// nothing written outside [out, out + n).
TEST(FloatCodecTest, CopyFloatsStreamingIsMemcpyAtEveryAlignment) {
  std::vector<float> source(1100);
  for (size_t i = 0; i < source.size(); ++i) {
    source[i] = std::bit_cast<float>(static_cast<uint32_t>(0x3f800000u + 977u * i));
  }
  source[9] = std::bit_cast<float>(0x7fc01234u);  // a NaN with a payload
  source[10] = -std::numeric_limits<float>::infinity();
  constexpr float kUntouched = -7.0f;
  for (size_t n : {0, 1, 3, 4, 5, 8, 17, 1000}) {
    for (size_t in_offset = 0; in_offset < 4; ++in_offset) {
      for (size_t out_offset = 0; out_offset < 8; ++out_offset) {
        std::vector<float> out(out_offset + n + 8, kUntouched);
        CopyFloatsStreaming(source.data() + in_offset, n, out.data() + out_offset);
        for (size_t i = 0; i < out.size(); ++i) {
          const bool inside = i >= out_offset && i < out_offset + n;
          const float want = inside ? source[in_offset + i - out_offset] : kUntouched;
          ASSERT_EQ(Bits(out[i]), Bits(want))
              << "n " << n << ", in offset " << in_offset << ", out offset " << out_offset
              << ", element " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace parasync
