#include "common/int8_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/float_codec.h"
#include "tests/support/random_floats.h"

namespace parasync {
namespace {

using testing::GaussianFloats;

std::vector<float> RoundTrip(const std::vector<float>& in, int64_t offset,
                             float* residual = nullptr) {
  std::vector<int8_t> wire(Int8Bytes(offset, in.size()));
  EncodeInt8(in.data(), in.size(), offset, wire.data(), residual);
  std::vector<float> out(in.size());
  DecodeInt8(wire.data(), in.size(), offset, out.data());
  return out;
}

TEST(Int8CodecTest, ChunksFollowTheVariableNotTheRange) {
  EXPECT_EQ(Int8Chunks(0, 0), 0u);
  EXPECT_EQ(Int8Chunks(0, 1), 1u);
  EXPECT_EQ(Int8Chunks(0, 128), 1u);
  EXPECT_EQ(Int8Chunks(0, 129), 2u);
  EXPECT_EQ(Int8Chunks(127, 2), 2u);   // elements 127 and 128 sit in two chunks
  EXPECT_EQ(Int8Chunks(128, 128), 1u);
  EXPECT_EQ(Int8Bytes(100, 300), 300u + 4u);  // chunks 0..3
  EXPECT_EQ(WireBytes(DType::kInt8, 300, 100), 304u);
  EXPECT_EQ(WireBytes(DType::kFloat16, 300, 100), 600u);

  // A variable sent whole or as two ranges decodes to the same values but in the chunk the
  // cut falls in (each side of it is a chunk of its own).
  const std::vector<float> v = GaussianFloats(1000, 1);
  const std::vector<float> whole = RoundTrip(v, 0);
  for (size_t cut : {1u, 127u, 128u, 300u, 512u, 999u}) {
    std::vector<float> a(v.begin(), v.begin() + cut), b(v.begin() + cut, v.end());
    std::vector<float> joined = RoundTrip(a, 0);
    const std::vector<float> tail = RoundTrip(b, static_cast<int64_t>(cut));
    joined.insert(joined.end(), tail.begin(), tail.end());
    const size_t cut_chunk = cut / kInt8Chunk;
    size_t differ = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i / kInt8Chunk == cut_chunk && cut % kInt8Chunk != 0) {
        differ += joined[i] != whole[i];
        continue;
      }
      ASSERT_EQ(joined[i], whole[i]) << "cut at " << cut << ", element " << i;
    }
    if (cut % kInt8Chunk == 0) {
      EXPECT_EQ(differ, 0u);
    }
  }
}

TEST(Int8CodecTest, ErrorWithinOneStepOfEachChunksScale) {
  for (float scale : {1e-30f, 1e-6f, 1.0f, 1e6f, 1e30f}) {
    const std::vector<float> v = GaussianFloats(4096, 2, scale);
    const std::vector<float> out = RoundTrip(v, 5);
    for (size_t c = 0; c < v.size(); c += kInt8Chunk) {
      // Chunk boundaries sit at multiples of 128 of the variable: offset 5 shifts them.
      const size_t begin = c == 0 ? 0 : c - 5, end = std::min(v.size(), c + kInt8Chunk - 5);
      float m = 0.0f;
      for (size_t i = begin; i < end; ++i) m = std::max(m, std::fabs(v[i]));
      for (size_t i = begin; i < end; ++i) {
        ASSERT_LE(std::fabs(out[i] - v[i]), m / 127.0f)
            << "scale " << scale << " element " << i;
      }
    }
  }
}

TEST(Int8CodecTest, ExactForValuesOnTheGridAndIdempotent) {
  std::vector<float> grid;
  for (int q = -127; q <= 127; ++q) grid.push_back(static_cast<float>(q) * 0.25f);
  EXPECT_EQ(RoundTrip(grid, 0), grid);
  const std::vector<float> v = GaussianFloats(777, 3);
  const std::vector<float> once = RoundTrip(v, 64);
  EXPECT_EQ(RoundTrip(once, 64), once);
  std::vector<int8_t> a(Int8Bytes(64, once.size())), b(a.size());
  EncodeInt8(once.data(), once.size(), 64, a.data(), nullptr);
  EncodeInt8(RoundTrip(once, 64).data(), once.size(), 64, b.data(), nullptr);
  EXPECT_EQ(a, b);
}

TEST(Int8CodecTest, ZerosHugeValuesAndNonFiniteChunks) {
  std::vector<float> v(300, 0.0f);
  EXPECT_EQ(RoundTrip(v, 0), v);
  v[0] = std::numeric_limits<float>::max();
  v[1] = -std::numeric_limits<float>::max();
  std::vector<float> out = RoundTrip(v, 0);
  EXPECT_TRUE(std::isfinite(out[0]));
  EXPECT_GT(out[0], 3.3e38f);
  EXPECT_LT(out[1], -3.3e38f);
  // NaN or Inf anywhere in a chunk: the chunk decodes to NaN, the others keep their values.
  v.assign(300, 1.0f);
  v[130] = std::numeric_limits<float>::infinity();
  std::vector<float> residual(300, 0.5f);
  std::vector<int8_t> wire(Int8Bytes(0, 300));
  EncodeInt8(v.data(), 300, 0, wire.data(), residual.data());
  DecodeInt8(wire.data(), 300, 0, out.data());
  for (size_t i = 0; i < 300; ++i) {
    if (i >= 128 && i < 256) {
      EXPECT_TRUE(std::isnan(out[i])) << i;
      EXPECT_EQ(residual[i], 0.0f) << i;  // reset, not NaN for ever after
    } else {
      EXPECT_EQ(out[i], 1.5f) << i;
      EXPECT_EQ(residual[i], 0.0f) << i;
    }
  }
}

// Per step: what was sent plus the new residual is exactly gradient + old residual (the
// float sum). Over 200 steps the residual stays below `bound` (about half a step of a
// chunk's scale), and the sum of what was sent tracks the sum of the gradients to within it.
void CheckErrorFeedback(WireFormat format, size_t n, float bound) {
  std::vector<float> residual(n, 0.0f), sent(n);
  std::vector<double> given_sum(n, 0.0), sent_sum(n, 0.0);
  std::vector<int8_t> wire(WireBytes(format, n, 3));
  for (uint32_t step = 0; step < 200; ++step) {
    const std::vector<float> g = GaussianFloats(n, 100 + step, 1e-3f);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = g[i] + residual[i];
    EncodeRange(g.data(), n, 3, format, wire.data(), residual.data());
    DecodeRange(wire.data(), n, 3, format, sent.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(sent[i] + residual[i], v[i]) << "step " << step << " element " << i;
      given_sum[i] += g[i];
      sent_sum[i] += sent[i];
    }
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(sent_sum[i] + residual[i], given_sum[i], 1e-6) << i;
    EXPECT_LT(std::fabs(residual[i]), bound) << i;
  }
}

TEST(Int8CodecTest, ErrorFeedbackCarriesWhatWasNotSentExactly) {
  CheckErrorFeedback(DType::kInt8, 1000, 1e-4f);
}

// Delta pulls: the server's copy and the reader's, updated by the same bytes, stay equal bit
// for bit; the copy follows parameters that move every step to within one step of each
// chunk's scale of the change (what was not sent stays in the difference, not lost); a copy
// starting from zeros reaches the parameters within a few pulls.
TEST(Int8CodecTest, DeltaPullsKeepBothCopiesEqualAndFollowTheTarget) {
  const size_t n = 1000;
  const int64_t offset = 77;  // chunks cut by the range's edges
  std::vector<float> target = GaussianFloats(n, 7, 0.05f);
  std::vector<float> server(n, 0.0f), reader(n, 0.0f);
  std::vector<int8_t> wire(Int8Bytes(offset, n));
  float first_error = 0.0f;
  for (uint32_t pull = 0; pull < 60; ++pull) {
    if (pull >= 4) {
      const std::vector<float> step = GaussianFloats(n, 300 + pull, 1e-3f);  // an optimizer step
      for (size_t i = 0; i < n; ++i) target[i] -= step[i];
    }
    EncodeInt8Delta(target.data(), server.data(), server.data(), n, offset, wire.data());
    AddInt8(wire.data(), n, offset, reader.data());
    ASSERT_EQ(server, reader) << "pull " << pull;
    float worst = 0.0f;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(target[i] - reader[i]));
    if (pull == 0) first_error = worst;
    if (pull == 3) EXPECT_LT(worst, 1e-7f) << "a copy from zeros after 4 pulls";
    // One step moves an element by about 1e-3 (at most ~4.5e-3 here); a chunk's change is
    // sent to within half of 2^e <= max/127.
    if (pull >= 4) EXPECT_LT(worst, 5e-3f / 127.0f) << "pull " << pull;
  }
  EXPECT_GT(first_error, 1e-5f) << "the first pull, from zeros, is 7 bits of the parameters";
  // A null base is zeros; a `next` apart from `base` leaves the base as it was.
  std::vector<int8_t> from_null(wire.size()), from_zeros(wire.size());
  std::vector<float> zeros(n, 0.0f), made(n), in_place(n, 0.0f);
  EncodeInt8Delta(target.data(), nullptr, made.data(), n, offset, from_null.data());
  EncodeInt8Delta(target.data(), in_place.data(), in_place.data(), n, offset, from_zeros.data());
  EXPECT_EQ(from_null, from_zeros);
  EXPECT_EQ(made, in_place);
  std::vector<float> apart(n);
  EncodeInt8Delta(target.data(), server.data(), apart.data(), n, offset, wire.data());
  AddInt8(wire.data(), n, offset, reader.data());
  EXPECT_EQ(apart, reader);
  EXPECT_NE(server, reader) << "the base is left as it was";
  // Bytes decoded by the other side's AddInt8 are the EncodeInt8 layout.
  std::vector<float> decoded(n);
  DecodeInt8(wire.data(), n, offset, decoded.data());
  std::vector<float> again(n, 0.0f);
  AddInt8(wire.data(), n, offset, again.data());
  EXPECT_EQ(decoded, again);
}

// The header's definition, written plainly, element by element: the codec (8 at a time
// where the CPU has AVX2, for whole chunks) must give its bits.
// `levels`: 127 for int8; int4's 7 gives its q a byte each, before they are packed.
void Reference(const std::vector<float>& in, int64_t offset, std::vector<float>& residual,
               std::vector<int8_t>& out, int levels = kInt8Levels) {
  const size_t chunks = Int8Chunks(offset, in.size());
  out.assign(chunks + in.size(), 0);
  size_t at = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const auto first = static_cast<size_t>((offset + static_cast<int64_t>(at)) % kInt8Chunk);
    const size_t len = std::min(in.size() - at, static_cast<size_t>(kInt8Chunk) - first);
    std::vector<float> v(len);
    float m = 0.0f;
    bool finite = true;
    for (size_t i = 0; i < len; ++i) {
      v[i] = in[at + i] + residual[at + i];
      finite = finite && std::isfinite(v[i]);
      m = std::max(m, std::fabs(v[i]));
    }
    if (!finite) {
      out[c] = kInt8NonFinite;
      for (size_t i = 0; i < len; ++i) residual[at + i] = 0.0f;
    } else {
      int e = kInt8MinExponent;
      while (e < kInt8MaxExponent && m > levels * std::ldexp(1.0, e)) ++e;  // the smallest
      out[c] = static_cast<int8_t>(e);
      for (size_t i = 0; i < len; ++i) {
        const double scaled =
            std::clamp(static_cast<double>(v[i]) / std::ldexp(1.0, e), -1.0 * levels, 1.0 * levels);
        const double q = std::nearbyint(scaled);  // to nearest, ties to even
        out[chunks + at + i] = static_cast<int8_t>(q);
        residual[at + i] = static_cast<float>(static_cast<double>(v[i]) - q * std::ldexp(1.0, e));
      }
    }
    at += len;
  }
}

TEST(Int8CodecTest, GivesTheDefinitionsBitsWholeChunksAndPartOnes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + rng() % 700;
    const auto offset = static_cast<int64_t>(rng() % 300);
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
    std::vector<float> in = GaussianFloats(n, 1000 + trial, scale);
    // Ties: values an exact half step apart on the grid of the chunk's scale.
    if (trial % 3 == 0) {
      for (size_t i = 0; i < n; ++i) in[i] = (static_cast<float>(i % 255) - 127.0f + 0.5f) * scale;
    }
    if (trial % 17 == 0) in[n / 2] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> mine = GaussianFloats(n, 5000 + trial, scale / 200), theirs = mine;
    std::vector<int8_t> want, got(Int8Bytes(offset, n));
    Reference(in, offset, theirs, want);
    EncodeInt8(in.data(), n, offset, got.data(), mine.data());
    ASSERT_EQ(got, want) << "trial " << trial << ", n " << n << ", offset " << offset;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(mine[i]), std::bit_cast<uint32_t>(theirs[i]))
          << "trial " << trial << ", residual " << i;
    }
  }
}

TEST(Int8CodecTest, EncodeRangeDispatchesOnTheDtype) {
  const std::vector<float> v = GaussianFloats(200, 4);
  std::vector<uint8_t> wire(WireBytes(DType::kInt8, v.size(), 50));
  std::vector<float> out(v.size()), direct(v.size());
  EncodeRange(v.data(), v.size(), 50, DType::kInt8, wire.data());
  DecodeRange(wire.data(), v.size(), 50, DType::kInt8, out.data());
  EXPECT_EQ(out, RoundTrip(v, 50));
  wire.assign(WireBytes(DType::kBfloat16, v.size(), 50), 0);
  EncodeRange(v.data(), v.size(), 50, DType::kBfloat16, wire.data());
  DecodeRange(wire.data(), v.size(), 50, DType::kBfloat16, out.data());
  EncodeFloats(v.data(), v.size(), DType::kBfloat16, wire.data());
  DecodeFloats(wire.data(), v.size(), DType::kBfloat16, direct.data());
  EXPECT_EQ(out, direct);
  EXPECT_EQ(ParseDType("INT8"), DType::kInt8);
  EXPECT_EQ(ParseDType("i8"), DType::kInt8);
  EXPECT_EQ(DTypeName(DType::kInt8), "int8");
}

// int4: the same definition with q in [-7, 7], two to a byte (element i of the range in byte
// i / 2, its low half for an even i), for ranges of odd and even length and offset.
std::vector<int8_t> PackedReference(const std::vector<float>& in, int64_t offset,
                                    std::vector<float>& residual) {
  std::vector<int8_t> q;
  Reference(in, offset, residual, q, kInt4Levels);
  const size_t chunks = Int8Chunks(offset, in.size());
  std::vector<int8_t> out(Int4Bytes(offset, in.size()), 0);
  std::copy(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(chunks), out.begin());
  for (size_t i = 0; i < in.size(); ++i) {
    const auto nibble = static_cast<uint8_t>(q[chunks + i] & 0x0f);
    auto& byte = reinterpret_cast<uint8_t&>(out[chunks + i / 2]);
    byte = static_cast<uint8_t>(byte | (i % 2 == 0 ? nibble : nibble << 4));
  }
  return out;
}

std::vector<float> RoundTrip4(const std::vector<float>& in, int64_t offset,
                              float* residual = nullptr) {
  std::vector<int8_t> wire(Int4Bytes(offset, in.size()));
  EncodeInt4(in.data(), in.size(), offset, wire.data(), residual);
  std::vector<float> out(in.size());
  DecodeInt4(wire.data(), in.size(), offset, out.data());
  return out;
}

TEST(Int4CodecTest, GivesTheDefinitionsBitsForAnyLengthAndOffset) {
  EXPECT_EQ(Int4Bytes(100, 300), 4u + 150u);
  EXPECT_EQ(Int4Bytes(0, 1), 2u);
  EXPECT_EQ(Int4Bytes(0, 0), 0u);
  EXPECT_EQ(WireBytes(DType::kInt4, 301, 127), 4u + 151u);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + rng() % 700;
    const auto offset = static_cast<int64_t>(rng() % 300);
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
    std::vector<float> in = GaussianFloats(n, 2000 + trial, scale);
    if (trial % 3 == 0) {  // ties: half steps of the grid
      for (size_t i = 0; i < n; ++i) in[i] = (static_cast<float>(i % 15) - 7.0f + 0.5f) * scale;
    }
    if (trial % 17 == 0) in[n / 2] = std::numeric_limits<float>::infinity();
    std::vector<float> mine = GaussianFloats(n, 6000 + trial, scale / 20), theirs = mine;
    std::vector<float> start = mine;
    const std::vector<int8_t> want = PackedReference(in, offset, theirs);
    std::vector<int8_t> got(Int4Bytes(offset, n), 0x5a);  // whatever the buffer held
    EncodeInt4(in.data(), n, offset, got.data(), mine.data());
    ASSERT_EQ(got, want) << "trial " << trial << ", n " << n << ", offset " << offset;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(mine[i]), std::bit_cast<uint32_t>(theirs[i]))
          << "trial " << trial << ", residual " << i;
    }
    // Decoded: q * 2^e of the reference's q, element by element.
    std::vector<float> out(n);
    DecodeInt4(got.data(), n, offset, out.data());
    std::vector<int8_t> q;
    Reference(in, offset, start, q, kInt4Levels);
    const size_t chunks = Int8Chunks(offset, n);
    for (size_t i = 0, c = 0; i < n; ++i) {
      if (i > 0 && (offset + static_cast<int64_t>(i)) % kInt8Chunk == 0) ++c;
      if (q[c] == kInt8NonFinite) {
        ASSERT_TRUE(std::isnan(out[i])) << i;
      } else {
        ASSERT_EQ(out[i], static_cast<float>(q[chunks + i]) * std::ldexp(1.0f, q[c])) << i;
      }
    }
  }
}

TEST(Int4CodecTest, ErrorWithinOneStepOfEachChunksScaleAndTheGridExact) {
  for (float scale : {1e-30f, 1e-6f, 1.0f, 1e6f, 1e30f}) {
    const std::vector<float> v = GaussianFloats(4095, 2, scale);
    const std::vector<float> out = RoundTrip4(v, 5);
    for (size_t c = 0; c < v.size(); c += kInt8Chunk) {
      const size_t begin = c == 0 ? 0 : c - 5, end = std::min(v.size(), c + kInt8Chunk - 5);
      float m = 0.0f;
      for (size_t i = begin; i < end; ++i) m = std::max(m, std::fabs(v[i]));
      for (size_t i = begin; i < end; ++i) {
        ASSERT_LE(std::fabs(out[i] - v[i]), m / 7.0f) << "scale " << scale << " element " << i;
      }
    }
  }
  std::vector<float> grid;
  for (int q = -7; q <= 7; ++q) grid.push_back(static_cast<float>(q) * 0.125f);
  EXPECT_EQ(RoundTrip4(grid, 3), grid);
  const std::vector<float> v = GaussianFloats(333, 3);
  const std::vector<float> once = RoundTrip4(v, 1);
  EXPECT_EQ(RoundTrip4(once, 1), once);
  // A decoder reads any byte: the nibble 8, never written, is -8 * 2^e.
  const std::vector<int8_t> wire = {-3, static_cast<int8_t>(0x78)};  // e = -3; q = -8, 7
  std::vector<float> two(2);
  DecodeInt4(wire.data(), 2, 0, two.data());
  EXPECT_EQ(two, (std::vector<float>{-1.0f, 0.875f}));
}

TEST(Int4CodecTest, ErrorFeedbackCarriesWhatWasNotSentExactly) {
  CheckErrorFeedback(DType::kInt4, 999, 2e-3f);
}

TEST(Int4CodecTest, DeltaPullsKeepBothCopiesEqualAndFollowTheTarget) {
  const size_t n = 1001;
  const int64_t offset = 77;
  std::vector<float> target = GaussianFloats(n, 7, 0.05f);
  std::vector<float> server(n, 0.0f), reader(n, 0.0f), params(n, 0.0f);
  std::vector<int8_t> wire(Int4Bytes(offset, n));
  for (uint32_t pull = 0; pull < 60; ++pull) {
    if (pull >= 10) {
      const std::vector<float> step = GaussianFloats(n, 300 + pull, 1e-3f);
      for (size_t i = 0; i < n; ++i) target[i] -= step[i];
    }
    EncodeInt4Delta(target.data(), server.data(), server.data(), n, offset, wire.data());
    AddInt4(wire.data(), n, offset, reader.data(), params.data());
    ASSERT_EQ(server, reader) << "pull " << pull;
    ASSERT_EQ(params, reader) << "pull " << pull;
    float worst = 0.0f;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(target[i] - reader[i]));
    // From zeros each pull divides the error by 14 or more: 0.2 / 14^9 is below 1e-10.
    if (pull == 9) EXPECT_LT(worst, 1e-7f) << "a copy from zeros after 10 pulls";
    // A chunk's change (at most ~4.5e-3 a step, plus what waited) within 1/7 of its largest.
    if (pull >= 10) EXPECT_LT(worst, 1e-2f / 7.0f) << "pull " << pull;
  }
  std::vector<int8_t> from_null(wire.size()), from_zeros(wire.size());
  std::vector<float> made(n), in_place(n, 0.0f);
  EncodeInt4Delta(target.data(), nullptr, made.data(), n, offset, from_null.data());
  EncodeInt4Delta(target.data(), in_place.data(), in_place.data(), n, offset, from_zeros.data());
  EXPECT_EQ(from_null, from_zeros);
  EXPECT_EQ(made, in_place);
  std::vector<float> decoded(n), again(n, 0.0f);
  DecodeInt4(from_null.data(), n, offset, decoded.data());
  AddInt4(from_null.data(), n, offset, again.data());
  EXPECT_EQ(decoded, again);
  EXPECT_EQ(decoded, made);
  // EncodeDeltaRange and AddRange dispatch to them.
  std::vector<int8_t> ranged(wire.size());
  std::vector<float> next(n), added(n, 0.0f);
  EncodeDeltaRange(target.data(), nullptr, next.data(), n, offset, DType::kInt4, ranged.data());
  AddRange(ranged.data(), n, offset, DType::kInt4, added.data());
  EXPECT_EQ(ranged, from_null);
  EXPECT_EQ(added, made);
}

}  // namespace
}  // namespace parasync
