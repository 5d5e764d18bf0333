#include "common/topk_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/float_codec.h"
#include "common/int8_codec.h"
#include "tests/support/random_floats.h"

namespace parasync {
namespace {

using testing::GaussianFloats;

std::vector<uint8_t> TopKEncode(const std::vector<float>& in, int64_t offset, int keep,
                                float* residual = nullptr) {
  std::vector<uint8_t> wire(TopKBytes(offset, in.size(), keep));
  EncodeTopK(in.data(), in.size(), offset, keep, wire.data(), residual);
  return wire;
}

std::vector<float> TopKDecode(const std::vector<uint8_t>& wire, size_t n, int64_t offset,
                              int keep) {
  EXPECT_TRUE(TopKWellFormed(wire.data(), n, offset, keep));
  std::vector<float> out(n, -1.0f);
  DecodeTopK(wire.data(), n, offset, keep, out.data());
  return out;
}

TEST(TopKCodecTest, BytesFollowTheVariablesChunks) {
  EXPECT_EQ(TopKBytes(0, 0, 8), 0u);
  EXPECT_EQ(TopKBytes(0, 256, 8), 17u);   // e, 8 indices, 8 values
  EXPECT_EQ(TopKBytes(0, 3, 8), 7u);      // a small tensor goes whole: 1 + 2 * 3
  EXPECT_EQ(TopKBytes(250, 12, 8), 13u + 13u);  // 6 elements of chunk 0, 6 of chunk 1
  EXPECT_EQ(TopKBytes(0, 2560, 8), 170u);
  EXPECT_EQ(WireBytes(WireFormat(DType::kTopK, 8), 2560, 0), 170u);
  EXPECT_EQ(WireBytes(WireFormat(DType::kTopK, 255), 256, 0), 511u);
  EXPECT_EQ(TopKKeepFor(1.0 / 32), 8);
  EXPECT_EQ(TopKKeepFor(0.01), 3);       // 2.56 rounded
  EXPECT_EQ(TopKKeepFor(1e-6), 1);       // at least one
  EXPECT_EQ(TopKKeepFor(1.0), 255);      // at most 255 of 256
  EXPECT_FALSE(TopKKeepFor(0.0));
  EXPECT_FALSE(TopKKeepFor(1.5));
  EXPECT_FALSE(TopKKeepFor(std::nan("")));
}

TEST(TopKCodecTest, SendsEachChunksLargestWithinInt8sErrorAndZeroElsewhere) {
  // Each chunk's frame part: e, m increasing indices, m values; the indices are those of the
  // m largest quantized magnitudes (ties: lower index first), each sent value within
  // 2^(e-1) of what was given, every other element 0.
  for (int keep : {1, 8, 40, 255}) {
    const std::vector<float> v = GaussianFloats(3000, 7, 0.01f);
    const int64_t offset = 70;
    const std::vector<uint8_t> wire = TopKEncode(v, offset, keep);
    const std::vector<float> out = TopKDecode(wire, v.size(), offset, keep);
    size_t at = 0;
    for (size_t begin = 0; begin < v.size();) {
      const auto in_chunk = static_cast<size_t>((offset + static_cast<int64_t>(begin)) % 256);
      const size_t end = std::min(v.size(), begin + 256 - in_chunk);
      const size_t m = std::min<size_t>(static_cast<size_t>(keep), end - begin);
      float largest = 0.0f;
      for (size_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(v[i]));
      const int e = static_cast<int8_t>(wire[at]);
      ASSERT_EQ(e, Int8Exponent(largest));
      auto magnitude = [&](size_t i) {
        return std::nearbyint(std::fabs(v[i]) * std::ldexp(1.0f, -e));
      };
      std::vector<bool> sent(end - begin, false);
      for (size_t j = 0; j < m; ++j) sent[wire[at + 1 + j]] = true;
      float lowest_sent = 1e9f, highest_unsent = -1.0f;
      for (size_t i = begin; i < end; ++i) {
        if (sent[i - begin]) {
          lowest_sent = std::min(lowest_sent, magnitude(i));
          ASSERT_LE(std::fabs(out[i] - v[i]), std::ldexp(1.0f, e - 1)) << keep << " at " << i;
        } else {
          highest_unsent = std::max(highest_unsent, magnitude(i));
          ASSERT_EQ(out[i], 0.0f) << "keep " << keep << " at " << i;
        }
      }
      ASSERT_GE(lowest_sent, highest_unsent) << "keep " << keep << " chunk at " << begin;
      ASSERT_LE(largest, 127.0f * std::ldexp(1.0f, e));
      at += 1 + 2 * m;
      begin = end;
    }
    EXPECT_EQ(at, wire.size());
  }
}

TEST(TopKCodecTest, ErrorFeedbackCarriesEveryElementExactly) {
  // Over steps, what was sent plus the residual is what was given, per element: each step
  // is exact (ResidualIsExactAfterOneStep); over 20 the only error is the float sum
  // g + r each step rounds, far under the 1e-6 relative bound.
  const size_t n = 1000;
  const int64_t offset = 200;
  std::vector<float> residual(n, 0.0f);
  std::vector<double> given(n, 0.0), sent(n, 0.0);
  for (uint32_t step = 0; step < 20; ++step) {
    const std::vector<float> g = GaussianFloats(n, 100 + step, 1.0f / 1024);
    const std::vector<float> out =
        TopKDecode(TopKEncode(g, offset, 4, residual.data()), n, offset, 4);
    for (size_t i = 0; i < n; ++i) {
      given[i] += g[i];
      sent[i] += out[i];
    }
  }
  size_t reached = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(sent[i] + residual[i], given[i], 1e-6 * (1.0 + std::fabs(given[i]))) << i;
    reached += sent[i] != 0.0 ? 1 : 0;
  }
  // 4 of 256 a step for 20 steps: the residual grows where nothing was sent, until sent.
  EXPECT_GT(reached, n / 4);
}

TEST(TopKCodecTest, ResidualIsExactAfterOneStep) {
  const std::vector<float> g = GaussianFloats(512, 3);
  std::vector<float> residual(512, 0.25f);
  const std::vector<float> before = residual;
  const std::vector<float> out = TopKDecode(TopKEncode(g, 0, 16, residual.data()), 512, 0, 16);
  for (size_t i = 0; i < 512; ++i) {
    // v = g + r_before; sent + r_after == v with no rounding in between.
    EXPECT_EQ(out[i] + residual[i], g[i] + before[i]) << i;
  }
}

TEST(TopKCodecTest, DecodingAndEncodingAgainGivesTheSameValues) {
  const std::vector<float> v = GaussianFloats(2000, 5);
  const std::vector<float> once = TopKDecode(TopKEncode(v, 33, 8), v.size(), 33, 8);
  EXPECT_EQ(TopKDecode(TopKEncode(once, 33, 8), v.size(), 33, 8), once);
  // Ties go to the lower index: a constant chunk sends its first elements.
  const std::vector<float> flat(256, 0.5f);
  const std::vector<float> out = TopKDecode(TopKEncode(flat, 0, 3), 256, 0, 3);
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(out[i], i < 3 ? 0.5f : 0.0f) << i;
}

TEST(TopKCodecTest, NonFiniteChunksDecodeToNaNAndResetTheirResidual) {
  std::vector<float> v = GaussianFloats(600, 9);
  v[300] = std::numeric_limits<float>::infinity();
  std::vector<float> residual(600, 0.125f);
  const std::vector<float> out = TopKDecode(TopKEncode(v, 0, 8, residual.data()), 600, 0, 8);
  for (size_t i = 0; i < 600; ++i) {
    if (i >= 256 && i < 512) {
      EXPECT_TRUE(std::isnan(out[i])) << i;
      EXPECT_EQ(residual[i], 0.0f) << i;
    } else {
      EXPECT_TRUE(std::isfinite(out[i])) << i;
    }
  }
}

TEST(TopKCodecTest, MalformedFramesAreRefusedAndNeverWriteOutOfRange) {
  const std::vector<float> v = GaussianFloats(300, 11);
  std::vector<uint8_t> wire = TopKEncode(v, 0, 4);  // chunk 0: 256 elements, chunk 1: 44
  ASSERT_EQ(wire.size(), 9u + 9u);
  EXPECT_TRUE(TopKWellFormed(wire.data(), 300, 0, 4));
  EXPECT_FALSE(TopKWellFormed(wire.data(), 300, 0, 0));
  std::vector<uint8_t> bad = wire;
  std::swap(bad[1], bad[2]);  // indices out of order
  EXPECT_FALSE(TopKWellFormed(bad.data(), 300, 0, 4));
  bad = wire;
  bad[2] = bad[1];  // a repeated index would add twice
  EXPECT_FALSE(TopKWellFormed(bad.data(), 300, 0, 4));
  bad = wire;
  bad[9 + 4] = 200;  // chunk 1's last index beyond its 44 elements
  EXPECT_FALSE(TopKWellFormed(bad.data(), 300, 0, 4));
  // Decoding it anyway writes only inside the range (ASan would see a stray write).
  std::vector<float> out(300);
  DecodeTopK(bad.data(), 300, 0, 4, out.data());
  for (float x : out) EXPECT_TRUE(std::isfinite(x));
  EXPECT_FALSE(WellFormedRange(bad.data(), 300, 0, WireFormat(DType::kTopK, 4)));
  EXPECT_TRUE(WellFormedRange(bad.data(), 300, 0, DType::kInt8));
}

TEST(TopKCodecTest, ParsesWireFormats) {
  EXPECT_EQ(ParseWireFormat("topk"), WireFormat(DType::kTopK, kTopKDefaultKeep));
  EXPECT_EQ(ParseWireFormat("TopK:0.01"), WireFormat(DType::kTopK, 3));
  EXPECT_EQ(ParseWireFormat("topk:1"), WireFormat(DType::kTopK, 255));
  EXPECT_EQ(ParseWireFormat("int8"), WireFormat(DType::kInt8));
  EXPECT_EQ(ParseWireFormat("bf16"), WireFormat(DType::kBfloat16));
  for (const char* bad : {"topk:", "topk:0", "topk:2", "topk:x", "topk:0.1x", "int8:0.5", "k",
                          "topk:nan"}) {
    EXPECT_FALSE(ParseWireFormat(bad)) << bad;
  }
  EXPECT_EQ(WireFormatName(WireFormat(DType::kTopK, 8)), "topk:0.03125");
  EXPECT_EQ(WireFormatName(DType::kInt8), "int8");
}

// Delta pulls in top-k (common/float_codec.h: EncodeDeltaRange, AddRange): the server's and
// the reader's copies stay equal bit for bit; each pull sends keep of each chunk's changes
// and the rest waits in the difference, so over pulls of still parameters the copy reaches
// them; a pull's bytes are top-k's.
TEST(TopKCodecTest, DeltaPullsKeepBothCopiesEqualAndTheUnsentChangeWaits) {
  const size_t n = 700;
  const int64_t offset = 100;  // chunks cut by the range's edges
  const WireFormat topk(DType::kTopK, 32);
  const std::vector<float> target = GaussianFloats(n, 11, 0.05f);
  std::vector<float> server(n, 0.0f), reader(n, 0.0f);
  std::vector<uint8_t> wire(WireBytes(topk, n, offset));
  float previous = std::numeric_limits<float>::infinity();
  for (int pull = 0; pull < 12; ++pull) {
    EncodeDeltaRange(target.data(), server.data(), server.data(), n, offset, topk, wire.data());
    std::vector<float> params(n);
    AddRange(wire.data(), n, offset, topk, reader.data(), params.data());
    ASSERT_EQ(server, reader) << "pull " << pull;
    ASSERT_EQ(params, reader) << "pull " << pull;
    float worst = 0.0f;
    int changed = 0;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(target[i] - reader[i]));
    std::vector<float> sent(n);
    DecodeRange(wire.data(), n, offset, topk, sent.data());
    for (float v : sent) changed += v != 0.0f;
    EXPECT_LE(changed, 4 * 32) << "at most keep of each of the 4 chunks touched";
    EXPECT_LE(worst, previous) << "pull " << pull;
    previous = worst;
  }
  EXPECT_LT(previous, 1e-3f) << "after 12 pulls of 32 of 256 a chunk, every element was sent";
}

}  // namespace
}  // namespace parasync
