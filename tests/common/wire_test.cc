#include "common/wire.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace parasync {
namespace {

ModelRegistration SampleRegistration() {
  ModelRegistration reg;
  reg.variables = {
      {"dense/kernel", {784, 256}, DType::kFloat32, {InitKind::kUniform, 0.0765f}},
      {"dense/bias", {256}, DType::kFloat32, {InitKind::kZeros, 0.0f}},
      {"scale", {}, DType::kFloat32, {InitKind::kConstant, 1.5f}},
  };
  reg.optimizer = {OptimizerKind::kAdam, 0.001f, 0.5f, 0.85f, 0.995f, 1e-6f};
  reg.seed = 0xfeedfacecafebeefULL;
  reg.max_slice_elements = 12345;
  reg.num_shards = 3;
  return reg;
}

Result<Header> RoundTrip(const Header& h) {
  const std::vector<uint8_t> bytes = EncodeHeader(h);
  return DecodeHeader(bytes.data(), bytes.size());
}

TEST(WireTest, HeaderOfAnotherProtocolVersionKeepsOnlyWhatIdentifiesIt) {
  // A peer built from another schema may use field values this build does not know; the
  // version, request id and rank are enough to refuse it by name.
  Header h;
  h.protocol_version = kProtocolVersion + 76;
  h.type = MsgType::kPush;
  h.request_id = 99;
  h.rank = 3;
  h.slices = {{0, 0, 100}};
  Result<Header> d = RoundTrip(h);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->protocol_version, kProtocolVersion + 76);
  EXPECT_EQ(d->request_id, 99u);
  EXPECT_EQ(d->rank, 3);
  EXPECT_TRUE(d->slices.empty());
}

TEST(WireTest, DecodesHeaderAtAnUnalignedAddress) {
  Header h;
  h.type = MsgType::kPull;
  h.request_id = 7;
  h.slices = {{1, 2, 3}};
  const std::vector<uint8_t> bytes = EncodeHeader(h);
  std::vector<uint8_t> shifted(bytes.size() + 1);
  std::copy(bytes.begin(), bytes.end(), shifted.begin() + 1);
  Result<Header> d = DecodeHeader(shifted.data() + 1, bytes.size());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->slices, h.slices);
}

TEST(WireTest, RoundTripKeepsScalarFieldsAndSlices) {
  Header h;
  h.type = MsgType::kPush;
  h.request_id = 0x0123456789abcdefULL;
  h.rank = 5;
  h.dtype = DType::kFloat32;
  h.slices = {{0, 0, 100}, {7, 12, 3}, {0xffffffffu, int64_t{1} << 40, 0}};
  h.batch_examples = 128;
  h.version = int64_t{1} << 50;
  h.incarnation = 0xfedcba9876543210ULL;
  h.seq = (uint64_t{77} << 32) | 5;
  h.replayed = true;
  h.staleness = 9;
  Result<Header> d = RoundTrip(h);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->protocol_version, kProtocolVersion);
  EXPECT_EQ(d->type, MsgType::kPush);
  EXPECT_EQ(d->request_id, h.request_id);
  EXPECT_EQ(d->rank, 5);
  EXPECT_TRUE(d->status.ok());
  EXPECT_EQ(d->dtype, DType::kFloat32);
  EXPECT_EQ(d->slices, h.slices);
  EXPECT_EQ(d->batch_examples, 128);
  EXPECT_EQ(d->version, h.version);
  EXPECT_EQ(d->incarnation, h.incarnation);
  EXPECT_EQ(d->seq, h.seq);
  EXPECT_TRUE(d->replayed);
  EXPECT_EQ(d->staleness, 9);
  EXPECT_FALSE(d->registration.has_value());
  EXPECT_FALSE(d->stats.has_value());
}

TEST(WireTest, RoundTripKeepsAGathersKeyRanksAndAdmissions) {
  Header h;
  h.type = MsgType::kGather;
  h.key = "parasync.elastic.commit";
  h.clock = 12;
  h.ranks = {0, 2};
  h.admitted = {1};
  h.joining = true;
  Result<Header> d = RoundTrip(h);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->key, h.key);
  EXPECT_EQ(d->clock, 12);
  EXPECT_EQ(d->ranks, h.ranks);
  EXPECT_EQ(d->admitted, h.admitted);
  EXPECT_TRUE(d->joining);
  h.joining = false;
  h.admitted.clear();
  Result<Header> plain = RoundTrip(h);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->joining);
  EXPECT_TRUE(plain->admitted.empty());
}

TEST(WireTest, RoundTripKeepsADeltaPullsGenerations) {
  Header h;
  h.type = MsgType::kPull;
  h.dtype = DType::kInt8;
  h.delta_pull = true;
  h.delta_base = 0x8000000000000001ull;  // all 64 bits travel
  h.delta_generation = 42;
  Result<Header> d = RoundTrip(h);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->delta_pull);
  EXPECT_EQ(d->delta_base, h.delta_base);
  EXPECT_EQ(d->delta_generation, 42u);
  Result<Header> plain = RoundTrip(Header{});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->delta_pull);
  EXPECT_EQ(plain->delta_base, 0u);
  EXPECT_EQ(plain->delta_generation, 0u);
}

TEST(WireTest, RoundTripKeepsEveryMessageType) {
  for (int t = 0; t < kNumMsgTypes; ++t) {
    Header h;
    h.type = static_cast<MsgType>(t);
    Result<Header> d = RoundTrip(h);
    ASSERT_TRUE(d.ok()) << t;
    EXPECT_EQ(d->type, h.type);
    EXPECT_NE(MsgTypeName(h.type), "unknown");
  }
}

TEST(WireTest, RoundTripKeepsRegistration) {
  Header h;
  h.type = MsgType::kRegister;
  h.registration = SampleRegistration();
  Result<Header> d = RoundTrip(h);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(d->registration.has_value());
  EXPECT_EQ(*d->registration, SampleRegistration());
}

TEST(WireTest, RoundTripKeepsEveryOptimizerKind) {
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam,
                          OptimizerKind::kAdagrad}) {
    Header h;
    h.type = MsgType::kRegister;
    h.registration = SampleRegistration();
    h.registration->optimizer.kind = k;
    Result<Header> d = RoundTrip(h);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d->registration, *h.registration);
  }
}

TEST(WireTest, RoundTripKeepsTablesAndRowRanges) {
  Header h;
  h.type = MsgType::kPush;
  h.registration = SampleRegistration();
  h.registration->optimizer.kind = OptimizerKind::kAdagrad;
  h.registration->optimizer.initial_accumulator = 0.25f;
  h.registration->tables = {{"ctr/ids", 0, 16, {InitKind::kUniform, 0.05f}},
                            {"fixed", 1000, 4, {InitKind::kConstant, 1.5f}}};
  h.rows = {{0, 4096}, {1, 3}};
  Result<Header> d = RoundTrip(h);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d->registration, *h.registration);
  EXPECT_EQ(d->rows, h.rows);
}

TEST(WireTest, AHeaderWithoutTablesKeepsItsBytes) {
  // Old stores keep their registration as a header frame: the additions must not change the
  // encoding of a registration that has no tables (an adagrad accumulator at its default).
  Header h;
  h.type = MsgType::kRegister;
  h.registration = SampleRegistration();
  const std::vector<uint8_t> before = EncodeHeader(h);
  h.registration->tables.clear();
  h.registration->optimizer.initial_accumulator = 0.1f;
  EXPECT_EQ(EncodeHeader(h), before);
  h.registration->optimizer.initial_accumulator = 0.2f;
  EXPECT_NE(EncodeHeader(h), before);
}

TEST(WireTest, RoundTripKeepsTheLearningRateSchedule) {
  Header h;
  h.type = MsgType::kRegister;
  h.registration = SampleRegistration();
  h.registration->optimizer.schedule = LrSchedule::kCosine;
  h.registration->optimizer.decay_examples = 600000;
  h.registration->optimizer.final_lr_fraction = 0.125f;
  Result<Header> d = RoundTrip(h);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->registration->optimizer.schedule, LrSchedule::kCosine);
  EXPECT_EQ(d->registration->optimizer.decay_examples, 600000);
  EXPECT_EQ(d->registration->optimizer.final_lr_fraction, 0.125f);
  EXPECT_EQ(*d->registration, *h.registration);
}

TEST(WireTest, RoundTripKeepsStats) {
  Header h;
  h.type = MsgType::kStats;
  ShardStats stats;
  stats.shard = 2;
  stats.version = 1000;
  stats.examples = 64000;
  stats.num_slices = 17;
  stats.num_elements = 235146;
  stats.requests = 1003;
  stats.rejected = 3;
  stats.registered = true;
  stats.mode = "ssp:3";
  stats.live_workers = 2;
  stats.dropped_stale = 5;
  stats.max_version_staleness = 6;
  stats.max_clock_staleness = 3;
  stats.blocked_pulls = 8;
  stats.workers_declared_dead = 1;
  stats.workers = {{true, 10, 9, 1}, {false, 4, 4, 0}, {true, 11, 11, 2}};
  h.stats = stats;
  Result<Header> d = RoundTrip(h);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->stats.has_value());
  EXPECT_EQ(d->stats->shard, 2);
  EXPECT_EQ(d->stats->version, 1000);
  EXPECT_EQ(d->stats->examples, 64000);
  EXPECT_EQ(d->stats->num_slices, 17);
  EXPECT_EQ(d->stats->num_elements, 235146);
  EXPECT_EQ(d->stats->requests, 1003);
  EXPECT_EQ(d->stats->rejected, 3);
  EXPECT_TRUE(d->stats->registered);
  EXPECT_EQ(d->stats->mode, "ssp:3");
  EXPECT_EQ(d->stats->live_workers, 2);
  EXPECT_EQ(d->stats->dropped_stale, 5);
  EXPECT_EQ(d->stats->max_version_staleness, 6);
  EXPECT_EQ(d->stats->max_clock_staleness, 3);
  EXPECT_EQ(d->stats->blocked_pulls, 8);
  EXPECT_EQ(d->stats->workers_declared_dead, 1);
  EXPECT_EQ(d->stats->workers, stats.workers);
}

TEST(WireTest, RoundTripKeepsStatusCodeAndMessage) {
  for (int c = 1; c <= static_cast<int>(StatusCode::kFailedPrecondition); ++c) {
    Header h;
    h.status = Status(static_cast<StatusCode>(c), "shard 3: slice 9 out of range");
    Result<Header> d = RoundTrip(h);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->status.code(), h.status.code());
    EXPECT_EQ(d->status.message(), h.status.message());
  }
}

TEST(WireTest, RoundTripOfDefaultHeaderKeepsDefaults) {
  Result<Header> d = RoundTrip(Header{});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->protocol_version, kProtocolVersion);
  EXPECT_EQ(d->rank, -1);
  EXPECT_TRUE(d->status.ok());
  EXPECT_TRUE(d->slices.empty());
}

void ExpectCorruption(const Header& h, const std::string& what) {
  Result<Header> d = RoundTrip(h);
  ASSERT_FALSE(d.ok()) << what << " was accepted";
  EXPECT_EQ(d.status().code(), StatusCode::kCorruption) << what;
}

TEST(WireTest, DecodeRejectsOutOfRangeEnumsAsCorruption) {
  Header h;
  h.type = static_cast<MsgType>(kNumMsgTypes);
  ExpectCorruption(h, "message type " + std::to_string(kNumMsgTypes));
  h = Header{};
  h.type = static_cast<MsgType>(200);
  ExpectCorruption(h, "message type 200");
  h = Header{};
  h.status = Status(static_cast<StatusCode>(10), "x");
  ExpectCorruption(h, "status code 10");
  h = Header{};
  h.dtype = static_cast<DType>(7);
  ExpectCorruption(h, "header dtype 7");
  h = Header{};
  h.registration = SampleRegistration();
  h.registration->variables[1].dtype = static_cast<DType>(9);
  ExpectCorruption(h, "variable dtype 9");
  h = Header{};
  h.registration = SampleRegistration();
  h.registration->variables[0].init.kind = static_cast<InitKind>(4);
  ExpectCorruption(h, "init kind 4");
  h = Header{};
  h.registration = SampleRegistration();
  h.registration->optimizer.kind = static_cast<OptimizerKind>(std::size(kOptimizerKinds));
  ExpectCorruption(h, "optimizer kind past the last");
  h = Header{};
  h.registration = SampleRegistration();
  h.registration->optimizer.schedule = static_cast<LrSchedule>(2);
  ExpectCorruption(h, "learning-rate schedule 2");
}

Header FullHeader() {
  Header h;
  h.type = MsgType::kRegister;
  h.request_id = 99;
  h.rank = 1;
  h.status = Status::Aborted("stopping");
  h.slices = {{1, 2, 3}, {4, 5, 6}};
  h.registration = SampleRegistration();
  h.stats = ShardStats{};
  h.stats->shard = 1;
  h.stats->version = 2;
  h.stats->registered = true;
  return h;
}

TEST(WireTest, DecodeOfEveryTruncationIsCorruptionOrTheSameHeader) {
  const std::vector<uint8_t> bytes = EncodeHeader(FullHeader());
  ASSERT_GT(bytes.size(), 100u);
  int corrupt = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    // A fresh copy of exactly n bytes, so a read past the end is visible to sanitizers.
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    Result<Header> d = DecodeHeader(prefix.data(), prefix.size());
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), StatusCode::kCorruption) << n;
      ++corrupt;
      continue;
    }
    // Only trailing alignment padding may be cut off; what decodes is the whole header.
    EXPECT_EQ(d->request_id, 99u) << n;
    ASSERT_TRUE(d->registration.has_value()) << n;
    EXPECT_EQ(*d->registration, SampleRegistration()) << n;
  }
  EXPECT_GE(corrupt, static_cast<int>(bytes.size()) - 8);
}

TEST(WireTest, DecodeOfEmptyAndNullBufferIsCorruption) {
  Result<Header> d = DecodeHeader(nullptr, 0);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kCorruption);
}

TEST(WireTest, DecodeOfRandomBytesReturnsCorruptionOrAValue) {
  std::mt19937 rng(12345);
  int corrupt = 0;
  for (int i = 0; i < 2000; ++i) {
    const size_t size = std::uniform_int_distribution<size_t>(0, 512)(rng);
    std::vector<uint8_t> bytes(size);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng() & 0xff);
    Result<Header> d = DecodeHeader(bytes.data(), bytes.size());
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), StatusCode::kCorruption) << "input " << i;
      ++corrupt;
    }
  }
  // Random bytes nearly never form a verifiable FlatBuffer.
  EXPECT_GT(corrupt, 1900);
}

TEST(WireTest, DecodeOfBitFlippedHeadersReturnsCorruptionOrAValue) {
  const std::vector<uint8_t> good = EncodeHeader(FullHeader());
  std::mt19937 rng(777);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> bytes = good;
    const int flips = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int f = 0; f < flips; ++f) {
      const size_t at = std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng);
      bytes[at] = static_cast<uint8_t>(bytes[at] ^ (1u << (rng() % 8)));
    }
    Result<Header> d = DecodeHeader(bytes.data(), bytes.size());
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), StatusCode::kCorruption) << "input " << i;
    }
  }
}

}  // namespace
}  // namespace parasync
