// ps/embedding_table.h: row initialization, sparse optimizer updates against a dense reference,
// validation, sync averaging, LRU eviction and persistence.
#include "ps/embedding_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/embedding.h"
#include "common/float_codec.h"
#include "common/model_spec.h"
#include "ps/admission.h"
#include "ps/cold_tier.h"
#include "ps/optimizer.h"
#include "ps/row_snapshot.h"
#include "ps/shard.h"

namespace parasync {
namespace {

constexpr uint64_t kSeed = 77;
constexpr int64_t kFixedRows = 1000;

// Table 0: 1000 rows of 4; table 1: unbounded (hashed ids) rows of 3.
std::vector<TableSpec> Tables() {
  return {TableSpec{"items", kFixedRows, 4, Initializer{InitKind::kUniform, 0.05f}},
          TableSpec{"features", 0, 3, Initializer{InitKind::kUniform, 0.1f}}};
}

OptimizerSpec Optimizer(OptimizerKind kind) {
  OptimizerSpec spec;
  spec.kind = kind;
  spec.learning_rate = 0.1f;
  return spec;
}

EmbeddingTables Make(OptimizerKind kind = OptimizerKind::kSgd, int shard = 0, int num_shards = 1,
                     int64_t max_rows = 0) {
  EmbeddingTables t(EmbeddingTables::Options{shard, num_shards, max_rows});
  t.Configure(Tables(), Optimizer(kind), kSeed);
  return t;
}

// `n` gradient rows of `dim` floats in [-1, 1), from `seed`.
std::vector<float> Grads(size_t n, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> g(n * static_cast<size_t>(dim));
  for (float& x : g) x = u(rng);
  return g;
}

// The first `n` ids from `from` on that table `table` routes to `shard` of `num_shards`.
std::vector<uint64_t> IdsOf(uint32_t table, int shard, int num_shards, uint64_t from, size_t n) {
  std::vector<uint64_t> ids;
  for (uint64_t id = from; ids.size() < n; ++id) {
    if (ShardOfRow(table, id, num_shards) == shard) ids.push_back(id);
  }
  return ids;
}

std::vector<float> ReadRows(EmbeddingTables& t, uint32_t table, std::span<const uint64_t> ids) {
  std::vector<float> out(ids.size() * static_cast<size_t>(t.table(table).dim));
  EXPECT_TRUE(t.Read(table, ids, out.data()).ok());
  return out;
}

std::vector<float> InitialRow(uint32_t table, uint64_t id) {
  const TableSpec spec = Tables()[table];
  std::vector<float> out(static_cast<size_t>(spec.dim));
  InitializeRow(spec.init, kSeed, table, id, out.data(), spec.dim);
  return out;
}

TEST(EmbeddingTablesTest, RowsReadTheSameWhateverTheShardCountAndAfterRestore) {
  EmbeddingTables one = Make();
  std::vector<EmbeddingTables> three;
  for (int s = 0; s < 3; ++s) three.push_back(Make(OptimizerKind::kSgd, s, 3));
  for (uint32_t table : {0u, 1u}) {
    for (uint64_t id : {uint64_t{0}, uint64_t{1}, uint64_t{17}, uint64_t{999}}) {
      const std::vector<uint64_t> ids = {table == 1 ? id * 0x9e3779b97f4a7c15ULL : id};
      EmbeddingTables& owner = three[static_cast<size_t>(ShardOfRow(table, ids[0], 3))];
      EXPECT_EQ(ReadRows(owner, table, ids), ReadRows(one, table, ids)) << table << "/" << id;
      EXPECT_EQ(ReadRows(one, table, ids), InitialRow(table, ids[0]));
    }
  }
  EXPECT_EQ(one.rows_held(), 0) << "a read must not create rows";

  const std::vector<uint64_t> ids = {3, 5, 8};
  const std::vector<float> g = Grads(ids.size(), 4, 1);
  ASSERT_TRUE(one.Apply(0, ids, g.data(), Optimizer(OptimizerKind::kSgd)).ok());
  const std::vector<uint64_t> probe = {2, 3, 5, 8, 9};
  const std::vector<float> before = ReadRows(one, 0, probe);
  EmbeddingTables restored = Make();
  ASSERT_TRUE(restored.Restore(one.SnapshotAll()).ok());
  EXPECT_EQ(ReadRows(restored, 0, probe), before);
  EXPECT_EQ(restored.SnapshotAll(), one.SnapshotAll());
  EXPECT_NE(ReadRows(restored, 0, {ids.data(), 1}), InitialRow(0, ids[0])) << "update lost";
}

// A dense reference: every row of table 0 with its slots and its own step count, updated by
// ApplyUpdate for the rows a step touches only.
struct DenseReference {
  explicit DenseReference(OptimizerKind kind) : slots(static_cast<size_t>(NumOptimizerSlots(kind))) {
    for (uint64_t id = 0; id < kFixedRows; ++id) {
      values.push_back(InitialRow(0, id));
      for (auto& s : slots) s.emplace_back(4, 0.0f);
      steps.push_back(0);
    }
  }
  void Apply(std::span<const uint64_t> ids, const float* g, const OptimizerSpec& spec) {
    for (size_t i = 0; i < ids.size(); ++i) {
      std::array<float*, kMaxOptimizerSlots> p{};
      for (size_t k = 0; k < slots.size(); ++k) p[k] = slots[k][ids[i]].data();
      float* w = values[ids[i]].data();
      ApplyUpdate(spec, ++steps[ids[i]], w, w, g + i * 4, std::span(p.data(), slots.size()), 4);
    }
  }
  RowSnapshot Row(uint64_t id) const {
    RowSnapshot r{0, id, steps[id], values[id], {}};
    for (const auto& s : slots) r.slots.push_back(s[id]);
    return r;
  }
  std::vector<std::vector<float>> values;
  std::vector<std::vector<std::vector<float>>> slots;  // [slot][id]
  std::vector<int64_t> steps;
};

class EmbeddingTablesOptimizerTest : public ::testing::TestWithParam<OptimizerKind> {};

TEST_P(EmbeddingTablesOptimizerTest, SparseUpdatesMatchADenseReferenceAndSpareUntouchedRows) {
  const OptimizerSpec spec = Optimizer(GetParam());
  EmbeddingTables tables = Make(GetParam());
  DenseReference ref(GetParam());
  const std::vector<std::vector<uint64_t>> steps = {
      {1, 2, 3, 10}, {2, 3, 40}, {3, 10, 41, 500}, {1, 3}, {2, 999}, {3, 40, 500}};
  for (size_t step = 0; step < steps.size(); ++step) {
    const std::vector<RowSnapshot> before = tables.SnapshotAll();
    const std::vector<float> g = Grads(steps[step].size(), 4, static_cast<uint32_t>(step + 10));
    ASSERT_TRUE(tables.Apply(0, steps[step], g.data(), spec).ok());
    ref.Apply(steps[step], g.data(), spec);
    std::map<uint64_t, RowSnapshot> after;
    for (RowSnapshot& row : tables.SnapshotAll()) after[row.id] = std::move(row);
    for (const RowSnapshot& row : before) {  // rows held but not in this step: bit for bit
      if (std::ranges::find(steps[step], row.id) != steps[step].end()) continue;
      EXPECT_EQ(after[row.id], row) << "untouched row " << row.id << " changed at step " << step;
    }
  }
  const std::vector<RowSnapshot> all = tables.SnapshotAll();
  ASSERT_EQ(all.size(), 8u);  // 1 2 3 10 40 41 500 999: the rows ever updated
  for (const RowSnapshot& row : all) EXPECT_EQ(row, ref.Row(row.id)) << "row " << row.id;
  const std::vector<uint64_t> untouched = {0, 4, 11, 998};
  std::vector<float> want;
  for (uint64_t id : untouched) {
    for (float v : ref.values[id]) want.push_back(v);
  }
  EXPECT_EQ(ReadRows(tables, 0, untouched), want);
  EXPECT_EQ(all[2].updates, 5) << "row 3 was in five steps";
}

INSTANTIATE_TEST_SUITE_P(EmbeddingOptimizers, EmbeddingTablesOptimizerTest,
                         ::testing::Values(OptimizerKind::kSgd, OptimizerKind::kMomentum,
                                           OptimizerKind::kAdam, OptimizerKind::kAdagrad),
                         [](const ::testing::TestParamInfo<OptimizerKind>& p) {
                           return std::string(OptimizerKindName(p.param));
                         });

// Validate's refusals, each with its reason, on shard 1 of 2; none changes a row.
TEST(EmbeddingTablesTest, ValidateRefusesBadRangesWithTheirReasonAndChangesNothing) {
  EmbeddingTables tables = Make(OptimizerKind::kAdam, 1, 2);
  const std::vector<uint64_t> mine = IdsOf(0, 1, 2, 0, 4);
  const std::vector<uint64_t> theirs = IdsOf(0, 0, 2, mine[0] + 1, 1);
  const std::vector<uint64_t> beyond = IdsOf(0, 1, 2, kFixedRows, 1);
  const std::vector<float> g = Grads(mine.size(), 4, 3);
  ASSERT_TRUE(tables.Apply(0, mine, g.data(), Optimizer(OptimizerKind::kAdam)).ok());
  const std::vector<RowSnapshot> before = tables.SnapshotAll();
  const size_t row_bytes = 4 * sizeof(float);
  struct Case {
    std::string what;
    uint32_t table;
    std::vector<uint64_t> ids;
    std::optional<size_t> bytes;
    RejectReason want;
  };
  const std::vector<Case> cases = {
      {"unsorted", 0, {mine[1], mine[0]}, std::nullopt, RejectReason::kOrder},
      {"duplicate", 0, {mine[0], mine[1], mine[1]}, 3 * row_bytes, RejectReason::kOrder},
      {"byte length", 0, {mine[0], mine[1]}, 2 * row_bytes + 1, RejectReason::kByteLength},
      {"other shard", 0, {mine[0], theirs[0]}, std::nullopt, RejectReason::kRange},
      {"beyond rows", 0, {mine[0], beyond[0]}, std::nullopt, RejectReason::kRange},
      {"unknown table", 2, {mine[0]}, std::nullopt, RejectReason::kUnknownSlice},
  };
  for (const Case& c : cases) {
    RejectReason reason = RejectReason::kNone;
    const Status s = tables.Validate(c.table, c.ids, c.bytes, DType::kFloat32, &reason);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.what << ": " << s.ToString();
    EXPECT_EQ(reason, c.want) << c.what << ": " << s.ToString();
    EXPECT_EQ(tables.SnapshotAll(), before) << c.what;
  }
  RejectReason reason = RejectReason::kNone;
  EXPECT_TRUE(tables.Validate(0, mine, mine.size() * 4 * DTypeSize(DType::kBfloat16),
                              DType::kBfloat16, &reason).ok());
  EXPECT_TRUE(tables.Validate(1, IdsOf(1, 1, 2, uint64_t{1} << 62, 3), std::nullopt,
                              DType::kFloat32, &reason).ok())
      << "an unbounded table takes any id of this shard";
}

TEST(EmbeddingTablesTest, AllFiniteRefusesNanAndInf) {
  EmbeddingTables tables = Make();
  const std::vector<uint64_t> ids = {1, 2};
  std::vector<float> g = Grads(ids.size(), 4, 4);
  EXPECT_TRUE(tables.AllFinite(0, ids, g.data()));
  g[7] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(tables.AllFinite(0, ids, g.data()));
  g[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(tables.AllFinite(0, ids, g.data()));
}

// One sync step of SGD: rank 0 pushes rows {1, 2}, rank 1 rows {2, 3}.
std::vector<RowSnapshot> SyncStep(bool rank1_first) {
  EmbeddingTables tables = Make();
  const std::vector<uint64_t> ids0 = {1, 2}, ids1 = {2, 3};
  const std::vector<float> g0 = Grads(2, 4, 5), g1 = Grads(2, 4, 6);
  if (rank1_first) tables.Accumulate(1, 0, ids1, g1.data());
  tables.Accumulate(0, 0, ids0, g0.data());
  if (!rank1_first) tables.Accumulate(1, 0, ids1, g1.data());
  EXPECT_EQ(tables.rows_held(), 0) << "Accumulate must not change rows";
  EXPECT_EQ(tables.accumulated_rows(), 3);
  EXPECT_TRUE(tables.ApplyAccumulated(Optimizer(OptimizerKind::kSgd)).ok());
  EXPECT_EQ(tables.accumulated_rows(), 0);
  return tables.SnapshotAll();
}

TEST(EmbeddingTablesTest, SyncAveragesEachRowOverTheRanksThatPushedIt) {
  const std::vector<RowSnapshot> rows = SyncStep(false);
  EXPECT_EQ(SyncStep(true), rows) << "the order the pushes arrived in changed the step";
  const std::vector<float> g0 = Grads(2, 4, 5), g1 = Grads(2, 4, 6);
  const float lr = Optimizer(OptimizerKind::kSgd).learning_rate;
  ASSERT_EQ(rows.size(), 3u);
  for (int k = 0; k < 4; ++k) {
    const float both = (g0[4 + k] + g1[k]) / 2.0f;  // row 2: rank 0's second, rank 1's first
    EXPECT_EQ(rows[0].values[k], InitialRow(0, 1)[k] - lr * g0[k]) << "row 1 element " << k;
    EXPECT_EQ(rows[1].values[k], InitialRow(0, 2)[k] - lr * both) << "row 2 element " << k;
    EXPECT_EQ(rows[2].values[k], InitialRow(0, 3)[k] - lr * g1[4 + k]) << "row 3 element " << k;
  }
  for (const RowSnapshot& r : rows) EXPECT_EQ(r.updates, 1) << "one step, one update";
}

TEST(EmbeddingTablesTest, SyncStepSumsInRankOrderWhateverTheArrivalOrder) {
  const std::vector<float> scales = {1e8f, 3.3f, -1e8f, 0.7f};  // a sum that depends on order
  std::vector<std::vector<RowSnapshot>> results;
  for (const std::vector<int>& order : {std::vector<int>{0, 1, 2, 3}, std::vector<int>{3, 2, 1, 0},
                                        std::vector<int>{2, 0, 3, 1}}) {
    EmbeddingTables tables = Make();
    const std::vector<uint64_t> ids = {7};
    for (int rank : order) {
      const std::vector<float> g(4, scales[static_cast<size_t>(rank)]);
      tables.Accumulate(rank, 0, ids, g.data());
    }
    ASSERT_TRUE(tables.ApplyAccumulated(Optimizer(OptimizerKind::kSgd)).ok());
    results.push_back(tables.SnapshotAll());
  }
  EXPECT_EQ(results[1], results[0]);
  EXPECT_EQ(results[2], results[0]);
  float in_order = 0.0f, reversed = 0.0f;
  for (float v : scales) in_order += v;
  for (auto v = scales.rbegin(); v != scales.rend(); ++v) reversed += *v;
  EXPECT_NE(in_order, reversed) << "the gradients no longer make the order matter";
}

TEST(EmbeddingTablesTest, DropAccumulatedForgetsTheStep) {
  EmbeddingTables tables = Make();
  const std::vector<uint64_t> ids = {1, 2};
  const std::vector<float> g = Grads(2, 4, 7);
  tables.Accumulate(0, 0, ids, g.data());
  tables.DropAccumulated();
  EXPECT_EQ(tables.accumulated_rows(), 0);
  ASSERT_TRUE(tables.ApplyAccumulated(Optimizer(OptimizerKind::kSgd)).ok());
  EXPECT_EQ(tables.rows_held(), 0);
}

TEST(EmbeddingTablesTest, EvictsTheLeastRecentlyTouchedRowsAndStaysWithinMaxRows) {
  constexpr int64_t kMax = 8;
  EmbeddingTables tables = Make(OptimizerKind::kAdagrad, 0, 1, kMax);
  const OptimizerSpec spec = Optimizer(OptimizerKind::kAdagrad);
  const std::vector<float> g = Grads(1, 3, 8);
  std::vector<RowKey> evicted;
  for (uint64_t id = 0; id < kMax; ++id) {
    ASSERT_TRUE(tables.Apply(1, {&id, 1}, g.data(), spec).ok());
  }
  EXPECT_EQ(tables.TakeDirty(&evicted).size(), static_cast<size_t>(kMax));  // now stored
  const std::vector<uint64_t> kept = {0};  // the oldest, kept warm by reads
  for (uint64_t id = 100; id < 300; ++id) {
    (void)ReadRows(tables, 1, kept);
    ASSERT_TRUE(tables.Apply(1, {&id, 1}, g.data(), spec).ok());
    ASSERT_LE(tables.rows_held(), kMax);
  }
  EXPECT_EQ(tables.rows_held(), kMax);
  EXPECT_EQ(tables.stats(1).rows_evicted, 200);
  EXPECT_EQ(tables.stats(1).rows_created, 200 + kMax);
  EXPECT_EQ(tables.bytes_held(), kMax * EmbeddingTables::BytesPerRow(3, 1));
  std::vector<uint64_t> held;
  for (const RowSnapshot& r : tables.SnapshotAll()) held.push_back(r.id);
  EXPECT_EQ(held, (std::vector<uint64_t>{0, 293, 294, 295, 296, 297, 298, 299}));
  tables.TakeDirty(&evicted);
  std::vector<RowKey> want;  // the stored rows that went: 1..7, not the never-stored 100..292
  for (uint64_t id = 1; id < kMax; ++id) want.push_back(RowKey{1, id});
  EXPECT_EQ(evicted, want);
  const std::vector<uint64_t> gone = {5};
  EXPECT_EQ(ReadRows(tables, 1, gone), InitialRow(1, 5)) << "an evicted row comes back initial";
}

TEST(EmbeddingTablesTest, ReadOfAnOldRowSavesItFromTheNextEviction) {
  EmbeddingTables tables = Make(OptimizerKind::kSgd, 0, 1, 3);
  const std::vector<float> g = Grads(1, 4, 9);
  for (uint64_t id : {1, 2, 3}) {
    ASSERT_TRUE(tables.Apply(0, {&id, 1}, g.data(), Optimizer(OptimizerKind::kSgd)).ok());
  }
  const std::vector<uint64_t> one = {1};
  (void)ReadRows(tables, 0, one);
  const uint64_t next = 4;
  ASSERT_TRUE(tables.Apply(0, {&next, 1}, g.data(), Optimizer(OptimizerKind::kSgd)).ok());
  std::vector<uint64_t> held;
  for (const RowSnapshot& r : tables.SnapshotAll()) held.push_back(r.id);
  EXPECT_EQ(held, (std::vector<uint64_t>{1, 3, 4})) << "row 2 was the least recently touched";
}

TEST(EmbeddingTablesTest, TakeDirtyReturnsExactlyTheRowsChangedSinceTheLastCall) {
  EmbeddingTables tables = Make(OptimizerKind::kMomentum, 0, 1, 4);
  const OptimizerSpec spec = Optimizer(OptimizerKind::kMomentum);
  const std::vector<float> g = Grads(3, 4, 10);
  std::vector<RowKey> evicted;
  const std::vector<uint64_t> first = {1, 2, 3};
  ASSERT_TRUE(tables.Apply(0, first, g.data(), spec).ok());
  std::vector<RowSnapshot> dirty = tables.TakeDirty(&evicted);
  EXPECT_EQ(dirty, tables.SnapshotAll());
  EXPECT_TRUE(evicted.empty());

  const std::vector<uint64_t> second = {2, 5};
  ASSERT_TRUE(tables.Apply(0, second, g.data(), spec).ok());
  (void)ReadRows(tables, 0, first);  // reads change nothing
  dirty = tables.TakeDirty(&evicted);
  ASSERT_EQ(dirty.size(), 2u);
  EXPECT_EQ(dirty[0].id, 2u);
  EXPECT_EQ(dirty[1].id, 5u);
  EXPECT_EQ(dirty[0], tables.SnapshotAll()[1]);
  EXPECT_TRUE(tables.TakeDirty(&evicted).empty());

  // Touched most recently first: 3 2 1 5. Row 6 evicts 5, which comes back (dirty, not
  // evicted) and evicts 1.
  const uint64_t six = 6, five = 5;
  ASSERT_TRUE(tables.Apply(0, {&six, 1}, g.data(), spec).ok());
  ASSERT_TRUE(tables.Apply(0, {&five, 1}, g.data(), spec).ok());
  dirty = tables.TakeDirty(&evicted);
  ASSERT_EQ(dirty.size(), 2u);
  EXPECT_EQ(dirty[0].id, 5u);
  EXPECT_EQ(dirty[0].updates, 1) << "an evicted row starts over";
  EXPECT_EQ(dirty[1].id, 6u);
  EXPECT_EQ(evicted, (std::vector<RowKey>{{0, 1}})) << "row 1 went for row 5";
}

// A stored row evicted, re-created and evicted again before TakeDirty must still be deleted
// from the store; a row never stored needs no deletion.
TEST(EmbeddingTablesTest, TakeDirtyReportsAStoredRowEvictedAgainAfterComingBack) {
  EmbeddingTables tables = Make(OptimizerKind::kSgd, 0, 1, 1);
  const OptimizerSpec spec = Optimizer(OptimizerKind::kSgd);
  const std::vector<float> g = Grads(1, 4, 12);
  const uint64_t one = 1, two = 2;
  std::vector<RowKey> evicted;
  ASSERT_TRUE(tables.Apply(0, {&one, 1}, g.data(), spec).ok());
  ASSERT_EQ(tables.TakeDirty(&evicted).size(), 1u);
  ASSERT_TRUE(tables.Apply(0, {&two, 1}, g.data(), spec).ok());  // evicts stored 1
  ASSERT_TRUE(tables.Apply(0, {&one, 1}, g.data(), spec).ok());  // 1 back, 2 (never stored) goes
  ASSERT_TRUE(tables.Apply(0, {&two, 1}, g.data(), spec).ok());  // 1 goes again
  const std::vector<RowSnapshot> dirty = tables.TakeDirty(&evicted);
  ASSERT_EQ(dirty.size(), 1u);
  EXPECT_EQ(dirty[0].id, 2u);
  EXPECT_EQ(evicted, (std::vector<RowKey>{{0, 1}}));
  EXPECT_EQ(tables.stats(0).rows_evicted, 3);
}

TEST(EmbeddingTablesTest, RestoreRefusesBadSnapshotsAndChangesNothing) {
  EmbeddingTables tables = Make(OptimizerKind::kAdam, 1, 2, 5);
  const std::vector<uint64_t> mine = IdsOf(0, 1, 2, 0, 3);
  const std::vector<float> g = Grads(mine.size(), 4, 11);
  ASSERT_TRUE(tables.Apply(0, mine, g.data(), Optimizer(OptimizerKind::kAdam)).ok());
  const std::vector<RowSnapshot> good = tables.SnapshotAll();
  const auto bad = [&](auto change) {
    std::vector<RowSnapshot> rows = good;
    change(rows);
    return rows;
  };
  std::vector<RowSnapshot> extra;  // three more valid rows: six in all, over max_rows 5
  for (uint64_t id : IdsOf(0, 1, 2, mine.back() + 1, 3)) {
    extra.push_back({0, id, 1, {0, 0, 0, 0}, {{0, 0, 0, 0}, {0, 0, 0, 0}}});
  }
  const std::vector<std::pair<std::string, std::vector<RowSnapshot>>> cases = {
      {"unknown table", bad([](auto& r) { r[0].table = 9; })},
      {"values", bad([](auto& r) { r[0].values.pop_back(); })},
      {"slot count", bad([](auto& r) { r[0].slots.pop_back(); })},
      {"slot size", bad([](auto& r) { r[1].slots[1].push_back(0); })},
      {"other shard", bad([](auto& r) { r[0].id = IdsOf(0, 0, 2, 0, 1)[0]; })},
      {"beyond rows", bad([](auto& r) { r[0].id = IdsOf(0, 1, 2, kFixedRows, 1)[0]; })},
      {"duplicate", bad([](auto& r) { r.push_back(r[0]); })},
      {"negative updates", bad([](auto& r) { r[2].updates = -1; })},
      {"too many", bad([&](auto& r) { r.insert(r.end(), extra.begin(), extra.end()); })},
  };
  for (const auto& [what, rows] : cases) {
    const Status s = tables.Restore(rows);
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << what << ": " << s.ToString();
    EXPECT_EQ(tables.SnapshotAll(), good) << what;
  }
  EmbeddingTables fresh = Make(OptimizerKind::kAdam, 1, 2, 5);
  ASSERT_TRUE(fresh.Restore(good).ok());
  EXPECT_EQ(fresh.SnapshotAll(), good);
  std::vector<RowKey> evicted;
  EXPECT_TRUE(fresh.TakeDirty(&evicted).empty()) << "restored rows are stored, not dirty";
}

// ---- tiered tables: a cold tier, and the admission filter ------------------------------------

// A cold tier in memory that counts its traffic and fails its writes or reads on demand.
class MemoryColdTier : public ColdTier {
 public:
  Status Read(std::span<const RowKey> keys,
              std::vector<std::optional<RowSnapshot>>* out) override {
    if (fail_reads) return Status::Unavailable("injected read failure");
    ++read_calls;
    keys_read += static_cast<int64_t>(keys.size());
    out->clear();
    for (const RowKey& k : keys) {
      auto it = rows.find(k);
      out->push_back(it == rows.end() ? std::nullopt : std::optional<RowSnapshot>(it->second));
    }
    return Status::Ok();
  }
  Status Write(std::span<const RowSnapshot> written) override {
    if (fail_writes) return Status::Unavailable("no space left on device (injected)");
    for (const RowSnapshot& r : written) rows[RowKey{r.table, r.id}] = r;
    writes += static_cast<int64_t>(written.size());
    ++write_calls;
    return Status::Ok();
  }
  Status Scan(std::optional<RowKey> after, size_t limit, std::vector<Stamp>* out,
              bool* at_end) override {
    out->clear();
    auto it = after ? rows.upper_bound(*after) : rows.begin();
    for (; it != rows.end() && out->size() < limit; ++it) {
      out->push_back(Stamp{it->first, it->second.touched});
    }
    *at_end = it == rows.end();
    return Status::Ok();
  }
  // What the store does with a TakeDirty: writes the rows, deletes the evicted.
  void Persist(EmbeddingTables& t) {
    std::vector<RowKey> evicted;
    for (RowSnapshot& r : t.TakeDirty(&evicted)) rows[RowKey{r.table, r.id}] = std::move(r);
    for (const RowKey& k : evicted) rows.erase(k);
  }
  std::map<RowKey, RowSnapshot> rows;
  int64_t writes = 0;       // rows written
  int64_t write_calls = 0;  // Write calls
  int64_t keys_read = 0;    // keys looked up
  int64_t read_calls = 0;   // Read calls
  bool fail_writes = false;
  bool fail_reads = false;
};

// The rows of a tiered table, in memory or in its cold tier (memory's copy where both have
// one), in key order: what SnapshotAll of a table that never evicted gives.
std::vector<RowSnapshot> MemoryAndColdRows(const EmbeddingTables& tiered,
                                           const MemoryColdTier& cold) {
  std::map<RowKey, RowSnapshot> rows = cold.rows;
  for (const RowSnapshot& r : tiered.SnapshotAll()) rows[RowKey{r.table, r.id}] = r;
  std::vector<RowSnapshot> out;
  for (auto& [key, r] : rows) out.push_back(r);
  return out;
}

EmbeddingTables MakeTiered(OptimizerKind kind, int64_t max_rows, ColdTier* cold,
                           int admit_after = 0) {
  EmbeddingTables t(EmbeddingTables::Options{0, 1, max_rows, 0, cold, admit_after});
  t.Configure(Tables(), Optimizer(kind), kSeed);
  return t;
}

// Rows demoted with their optimizer state and promoted again are bitwise what a table that
// never evicted holds after the same pushes, pulls read them in the cold tier, and nothing is
// written for a row that did not change since it was last written.
TEST(EmbeddingTablesTest, DemotedRowsComeBackBitwiseWithTheirOptimizerState) {
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdagrad, OptimizerKind::kSgd}) {
    SCOPED_TRACE(OptimizerKindName(kind));
    MemoryColdTier cold;
    EmbeddingTables tiered = MakeTiered(kind, 4, &cold);
    EmbeddingTables whole = Make(kind);
    const OptimizerSpec spec = Optimizer(kind);
    std::mt19937 rng(5);
    std::uniform_int_distribution<uint64_t> pick(0, 19);  // 20 ids through 4 rows of memory
    for (uint32_t step = 0; step < 300; ++step) {
      std::vector<uint64_t> ids = {pick(rng), pick(rng)};
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      const std::vector<float> g = Grads(ids.size(), 3, step);
      ASSERT_TRUE(tiered.Apply(1, ids, g.data(), spec).ok());
      ASSERT_TRUE(whole.Apply(1, ids, g.data(), spec).ok());
      ASSERT_LE(tiered.rows_held(), 4);
    }
    std::vector<uint64_t> all(20);
    for (uint64_t id = 0; id < 20; ++id) all[id] = id;
    // Pulls: read where each row is (most of them in the cold tier), bitwise.
    EXPECT_EQ(ReadRows(tiered, 1, all), ReadRows(whole, 1, all));
    EXPECT_EQ(tiered.rows_held(), 4) << "a pull brings nothing in";
    // Promote every row (a push of zero gradients changes no SGD value, so compare the state
    // through the snapshots instead): the rows in memory and in the cold tier together are
    // the unevicted table's rows, values, slots and update counts.
    EXPECT_EQ(MemoryAndColdRows(tiered, cold), whole.SnapshotAll());
    const EmbeddingTables::TableStats st = tiered.stats(1);
    EXPECT_EQ(st.rows_created, 20);
    EXPECT_GT(st.rows_promoted, 0);
    EXPECT_EQ(st.rows_held + st.rows_cold, 20);
    EXPECT_EQ(st.rows_evicted, st.rows_promoted + 20 - 4);
    // Only changed rows are written (each write follows an update), and only when a row must
    // go: every write comes with an eviction.
    EXPECT_LE(cold.writes, st.rows_updated);
    EXPECT_LE(cold.write_calls, st.rows_evicted);
  }
}

// The rows of one request that are not held are read from the cold tier in one call: a pull's,
// a push's and a sync step's alike. A row held when the request came and evicted by the
// promotions before its turn is read on its own then. The rows stay bitwise what a table
// that never evicted holds.
TEST(EmbeddingTablesTest, TheColdRowsOfARequestAreReadInOneCall) {
  MemoryColdTier cold;
  EmbeddingTables tiered = MakeTiered(OptimizerKind::kAdam, 8, &cold);
  EmbeddingTables whole = Make(OptimizerKind::kAdam);
  const OptimizerSpec spec = Optimizer(OptimizerKind::kAdam);
  std::vector<uint64_t> all(64);
  for (uint64_t id = 0; id < 64; ++id) {
    all[id] = id;
    const std::vector<float> g = Grads(1, 3, static_cast<uint32_t>(id));
    ASSERT_TRUE(tiered.Apply(1, {&id, 1}, g.data(), spec).ok());
    ASSERT_TRUE(whole.Apply(1, {&id, 1}, g.data(), spec).ok());
  }
  ASSERT_EQ(tiered.rows_held(), 8);  // 56..63; 0..55 in the cold tier
  int64_t calls = cold.read_calls;
  int64_t keys = cold.keys_read;
  EXPECT_EQ(ReadRows(tiered, 1, all), ReadRows(whole, 1, all));
  EXPECT_EQ(cold.read_calls - calls, 1);
  EXPECT_EQ(cold.keys_read - keys, 56);
  // A push of all 64: the 56 not held in one call; the 8 held are evicted by the first
  // promotions and read one by one when their turn comes.
  calls = cold.read_calls;
  keys = cold.keys_read;
  const std::vector<float> g = Grads(64, 3, 99);
  ASSERT_TRUE(tiered.Apply(1, all, g.data(), spec).ok());
  ASSERT_TRUE(whole.Apply(1, all, g.data(), spec).ok());
  EXPECT_EQ(cold.read_calls - calls, 1 + 8);
  EXPECT_EQ(cold.keys_read - keys, 56 + 8);
  EXPECT_EQ(tiered.stats(1).rows_promoted, 64);
  EXPECT_EQ(MemoryAndColdRows(tiered, cold), whole.SnapshotAll());
  // A sync step's rows, from two ranks: the same.
  calls = cold.read_calls;
  for (EmbeddingTables* t : {&tiered, &whole}) {
    t->Accumulate(0, 1, all, g.data());
    t->Accumulate(1, 1, all, Grads(64, 3, 7).data());
    ASSERT_TRUE(t->ApplyAccumulated(spec).ok());
  }
  EXPECT_EQ(cold.read_calls - calls, 1 + 8);
  EXPECT_EQ(MemoryAndColdRows(tiered, cold), whole.SnapshotAll());
}

// Demotions are written in batches: the first eviction of a full table writes the changed
// rows among the kCleanBatch least recently touched in one write, and the evictions after
// it take those rows without writing; a batched row touched again is written again.
TEST(EmbeddingTablesTest, DemotionsAreWrittenInBatches) {
  constexpr int64_t kBatch = static_cast<int64_t>(EmbeddingTables::kCleanBatch);
  MemoryColdTier cold;
  EmbeddingTables tables = MakeTiered(OptimizerKind::kAdagrad, 2 * kBatch, &cold);
  const OptimizerSpec spec = Optimizer(OptimizerKind::kAdagrad);
  const std::vector<float> g = Grads(1, 3, 3);
  uint64_t next = 0;
  auto push = [&](uint64_t id) { ASSERT_TRUE(tables.Apply(1, {&id, 1}, g.data(), spec).ok()); };
  for (int64_t i = 0; i < 2 * kBatch; ++i) push(next++);  // full, every row changed
  EXPECT_EQ(cold.write_calls, 0);
  push(next++);  // ids 0..kBatch-1 written at once, id 0 goes
  EXPECT_EQ(cold.write_calls, 1);
  EXPECT_EQ(cold.writes, kBatch);
  EXPECT_EQ(cold.rows.count(RowKey{1, kBatch - 1}), 1u);
  EXPECT_EQ(cold.rows.count(RowKey{1, kBatch}), 0u);
  push(kBatch - 1);  // written, still in memory: changed again
  for (int64_t i = 1; i < kBatch - 1; ++i) push(next++);  // ids 1..kBatch-2 go, no write
  EXPECT_EQ(cold.write_calls, 1);
  push(next++);  // the tail is id kBatch, changed: the next batch, with kBatch - 1 in it
  EXPECT_EQ(cold.write_calls, 2);
  EXPECT_EQ(tables.stats(1).rows_evicted, kBatch);
  EXPECT_EQ(tables.rows_held(), 2 * kBatch);
  // Whatever went is in the cold tier as it was when it went; what is held is as pushed.
  for (uint64_t id = 0; id + 1 < kBatch; ++id) {
    ASSERT_EQ(cold.rows.count(RowKey{1, id}), 1u) << id;
    EXPECT_EQ(cold.rows.at(RowKey{1, id}).updates, 1) << id;
  }
}

// A row promoted and evicted again without a change is not written again; one changed is.
TEST(EmbeddingTablesTest, OnlyChangedRowsAreWrittenWhenDemoted) {
  MemoryColdTier cold;
  EmbeddingTables tables = MakeTiered(OptimizerKind::kSgd, 1, &cold);
  const OptimizerSpec spec = Optimizer(OptimizerKind::kSgd);
  const std::vector<float> g = Grads(1, 3, 1);
  const uint64_t a = 1, b = 2;
  ASSERT_TRUE(tables.Apply(1, {&a, 1}, g.data(), spec).ok());
  ASSERT_TRUE(tables.Apply(1, {&b, 1}, g.data(), spec).ok());  // demotes a: written
  EXPECT_EQ(cold.writes, 1);
  std::vector<RowKey> evicted;
  (void)tables.TakeDirty(&evicted);  // b stored by a snapshot
  EXPECT_TRUE(evicted.empty()) << "a demoted row is not deleted from the store";
  ASSERT_TRUE(tables.Apply(1, {&a, 1}, g.data(), spec).ok());  // b clean: not written
  EXPECT_EQ(cold.writes, 1);
  ASSERT_TRUE(tables.Apply(1, {&b, 1}, g.data(), spec).ok());  // a changed: written
  EXPECT_EQ(cold.writes, 2);
  EXPECT_EQ(cold.rows.at(RowKey{1, a}).updates, 2);
}

// A failing cold tier: the demotion is refused with its cause, and the row that was to go
// stays in memory as it was (nothing acknowledged is lost); a failing read is refused too.
TEST(EmbeddingTablesTest, AFailedDemotionIsRefusedAndLosesNothing) {
  MemoryColdTier cold;
  EmbeddingTables tables = MakeTiered(OptimizerKind::kAdam, 2, &cold);
  const OptimizerSpec spec = Optimizer(OptimizerKind::kAdam);
  const std::vector<float> g = Grads(1, 3, 2);
  for (uint64_t id : {1, 2}) ASSERT_TRUE(tables.Apply(1, {&id, 1}, g.data(), spec).ok());
  const std::vector<RowSnapshot> before = tables.SnapshotAll();
  cold.fail_writes = true;
  const uint64_t three = 3;
  const Status s = tables.Apply(1, {&three, 1}, g.data(), spec);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("no space left"), std::string::npos) << s.message();
  EXPECT_EQ(tables.SnapshotAll(), before);
  EXPECT_TRUE(cold.rows.empty());
  cold.fail_writes = false;
  ASSERT_TRUE(tables.Apply(1, {&three, 1}, g.data(), spec).ok());
  // Row 1 demoted once the disk took it, written with row 2 (one batch), which stays.
  EXPECT_EQ(cold.rows.size(), 2u);
  EXPECT_EQ(cold.write_calls, 1);
  EXPECT_EQ(tables.rows_held(), 2);
  cold.fail_reads = true;
  const std::vector<uint64_t> one = {1};
  std::vector<float> out(3);
  EXPECT_EQ(tables.Read(1, one, out.data()).code(), StatusCode::kUnavailable);
  EXPECT_EQ(tables.Apply(1, one, g.data(), spec).code(), StatusCode::kUnavailable);
}

// A table of Tables() expiring after `expire_after`, with `cold` as its cold tier (or none)
// and at most `max_rows` in memory (0: no bound).
EmbeddingTables MakeExpiring(OptimizerKind kind, int64_t expire_after, int64_t max_rows = 0,
                             ColdTier* cold = nullptr) {
  EmbeddingTables::Options options{0, 1, max_rows, 0, cold, 0};
  options.expire_after = expire_after;
  EmbeddingTables t(options);
  t.Configure(Tables(), Optimizer(kind), kSeed);
  return t;
}

// One push of `id` to table 1 at `now`, after the expiry a push does first.
void PushAt(EmbeddingTables& t, int64_t now, uint64_t id, const std::vector<float>& g,
            const OptimizerSpec& spec) {
  t.SetNow(now);
  ASSERT_TRUE(t.Expire().ok());
  ASSERT_TRUE(t.Apply(1, {&id, 1}, g.data(), spec).ok());
}

// Expiry in memory: a row nothing updated for more than expire_after versions is deleted (it
// reads as its initial value again, and one the store may hold is listed for deletion); a row
// updated meanwhile stays; a deleted row's slab entry is reused and the count holds.
TEST(EmbeddingTablesTest, RowsNotUpdatedForLongerThanTheExpiryAreDeleted) {
  EmbeddingTables tables = MakeExpiring(OptimizerKind::kAdagrad, 10);
  EmbeddingTables fresh = Make(OptimizerKind::kAdagrad);
  const OptimizerSpec spec = Optimizer(OptimizerKind::kAdagrad);
  const std::vector<float> g = Grads(1, 3, 4);
  auto push_at = [&](int64_t now, uint64_t id) { PushAt(tables, now, id, g, spec); };
  for (uint64_t id = 0; id < 5; ++id) push_at(1, id);  // ids 0-4 at 1
  std::vector<RowKey> evicted;
  (void)tables.TakeDirty(&evicted);  // stored: their deletion must reach the store
  push_at(8, 2);   // id 2 again at 8
  push_at(11, 9);  // cutoff 1: nothing is older than that
  EXPECT_EQ(tables.rows_held(), 6);
  EXPECT_EQ(tables.stats(1).rows_expired, 0);
  push_at(12, 9);  // cutoff 2: ids 0, 1, 3, 4 (updated at 1) go; 2 (8) and 9 (12) stay
  EXPECT_EQ(tables.rows_held(), 2);
  EXPECT_EQ(tables.stats(1).rows_expired, 4);
  const std::vector<uint64_t> gone = {0, 1, 3, 4};
  EXPECT_EQ(ReadRows(tables, 1, gone), ReadRows(fresh, 1, gone)) << "initial values again";
  const std::vector<RowSnapshot> dirty = tables.TakeDirty(&evicted);
  EXPECT_EQ(evicted, (std::vector<RowKey>{{1, 0}, {1, 1}, {1, 3}, {1, 4}}));
  for (const RowSnapshot& r : dirty) EXPECT_NE(r.touched, 0) << "a stamp is stored";
  // Entries reused, the bound kept: 40 more ids, 3 at a time expiring.
  for (uint64_t id = 100; id < 140; ++id) push_at(13 + static_cast<int64_t>(id), id);
  EXPECT_LE(tables.rows_held(), 12);
  EXPECT_EQ(tables.SnapshotAll().size(), static_cast<size_t>(tables.rows_held()));
}

// Expiry in the cold tier: a demoted row older than the expiry reads as absent (and is listed
// for deletion) when its id comes back, and the sweep finds the ones that never come back;
// rows stored before expiry was on (no stamp) are left alone.
TEST(EmbeddingTablesTest, ExpiredColdRowsAreDeletedWhenReadOrSwept) {
  MemoryColdTier cold;
  EmbeddingTables tables = MakeExpiring(OptimizerKind::kSgd, 5, 2, &cold);
  EmbeddingTables fresh = Make(OptimizerKind::kSgd);
  const OptimizerSpec spec = Optimizer(OptimizerKind::kSgd);
  const std::vector<float> g = Grads(1, 3, 5);
  auto push_at = [&](int64_t now, uint64_t id) { PushAt(tables, now, id, g, spec); };
  RowSnapshot legacy{1, 50, 3, {1, 2, 3}, {}};  // stored before expiry: touched 0
  cold.rows[RowKey{1, 50}] = legacy;
  for (uint64_t id = 0; id < 6; ++id) push_at(static_cast<int64_t>(id) + 1, id);
  // 2 rows in memory (ids 4, 5); ids 0-3 demoted with stamps 1-4.
  ASSERT_EQ(cold.rows.count(RowKey{1, 0}), 1u);
  EXPECT_EQ(cold.rows.at(RowKey{1, 0}).touched, 1);
  tables.SetNow(7);  // cutoff 2: id 0 (1) expired, id 1 (2) not yet
  const std::vector<uint64_t> zero_one = {0, 1};
  std::vector<float> got = ReadRows(tables, 1, zero_one);
  const std::vector<float> initial = ReadRows(fresh, 1, zero_one);
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 3),
            std::vector<float>(initial.begin(), initial.begin() + 3))
      << "an expired cold row reads as its initial value";
  EXPECT_NE(std::vector<float>(got.begin() + 3, got.end()),
            std::vector<float>(initial.begin() + 3, initial.end()))
      << "a cold row within the expiry reads as demoted";
  EXPECT_EQ(tables.stats(1).rows_expired, 1);
  // The sweep, at 20 (cutoff 15): ids 1-3 in the store and 4, 5 in memory are all older.
  tables.SetNow(20);
  ASSERT_TRUE(tables.Expire().ok());
  EXPECT_EQ(tables.rows_held(), 0);
  EXPECT_EQ(tables.stats(1).rows_expired, 6);
  EXPECT_EQ(tables.stats(1).rows_cold, 0) << "of the 6 rows it made (not the one put there)";
  cold.Persist(tables);
  EXPECT_EQ(cold.rows.size(), 1u);
  EXPECT_EQ(cold.rows.count(RowKey{1, 50}), 1u) << "a row stored before expiry was on stays";
}

// After a restart the rows stay in the cold tier (the store they were restored from) and are
// promoted as their ids come; the statistics count them.
TEST(EmbeddingTablesTest, TieredRestoreLeavesTheRowsInTheColdTier) {
  MemoryColdTier cold;
  const OptimizerSpec spec = Optimizer(OptimizerKind::kAdagrad);
  std::vector<RowSnapshot> all;
  {
    EmbeddingTables tables = MakeTiered(OptimizerKind::kAdagrad, 3, &cold);
    for (uint64_t id = 0; id < 10; ++id) {
      const std::vector<float> g = Grads(1, 3, static_cast<uint32_t>(id));
      ASSERT_TRUE(tables.Apply(1, {&id, 1}, g.data(), spec).ok());
    }
    std::vector<RowKey> evicted;
    for (const RowSnapshot& r : tables.TakeDirty(&evicted)) cold.rows[RowKey{r.table, r.id}] = r;
    for (const auto& [key, r] : cold.rows) all.push_back(r);
  }
  ASSERT_EQ(all.size(), 10u);
  EmbeddingTables again = MakeTiered(OptimizerKind::kAdagrad, 3, &cold);
  const std::vector<int64_t> counts = {0, 10};
  ASSERT_TRUE(again.Restore({}, counts).ok());
  EXPECT_EQ(again.rows_held(), 0);
  EXPECT_EQ(again.stats(1).rows_cold, 10);
  std::vector<uint64_t> ids(10);
  for (uint64_t id = 0; id < 10; ++id) ids[id] = id;
  std::vector<float> want;
  for (const RowSnapshot& r : all) want.insert(want.end(), r.values.begin(), r.values.end());
  EXPECT_EQ(ReadRows(again, 1, ids), want);
  const std::vector<float> g = Grads(1, 3, 99);
  const uint64_t seven = 7;
  ASSERT_TRUE(again.Apply(1, {&seven, 1}, g.data(), spec).ok());
  EXPECT_EQ(again.stats(1).rows_promoted, 1);
  EXPECT_EQ(again.stats(1).rows_created, 0);
  EXPECT_EQ(again.SnapshotAll()[0].updates, 2) << "promoted with its update count";
  EXPECT_EQ(again.stats(1).rows_cold, 9);
}

// Admission: an id gets a row at its k-th push; the pushes before are dropped and counted,
// and its pulls read the initial value. Known counts: id i is pushed i times.
TEST(EmbeddingTablesTest, AdmissionDropsExactlyTheIdsUnderTheThreshold) {
  constexpr int kAdmitAfter = 4;
  EmbeddingTables tables = MakeTiered(OptimizerKind::kSgd, 0, nullptr, kAdmitAfter);
  const OptimizerSpec spec = Optimizer(OptimizerKind::kSgd);
  const std::vector<float> g = Grads(1, 3, 3);
  int64_t dropped = 0;
  for (uint64_t id = 1; id <= 8; ++id) {
    for (uint64_t k = 0; k < id; ++k) ASSERT_TRUE(tables.Apply(1, {&id, 1}, g.data(), spec).ok());
    dropped += static_cast<int64_t>(std::min<uint64_t>(id, kAdmitAfter - 1));
  }
  std::vector<uint64_t> held;
  for (const RowSnapshot& r : tables.SnapshotAll()) {
    held.push_back(r.id);
    EXPECT_EQ(r.updates, static_cast<int64_t>(r.id) - (kAdmitAfter - 1)) << r.id;
  }
  EXPECT_EQ(held, (std::vector<uint64_t>{4, 5, 6, 7, 8}));
  EXPECT_EQ(tables.stats(1).rows_refused, dropped);
  const std::vector<uint64_t> three = {3};
  EXPECT_EQ(ReadRows(tables, 1, three), InitialRow(1, 3));
  // Off (0 or 1): every id at its first push.
  EmbeddingTables open = MakeTiered(OptimizerKind::kSgd, 0, nullptr, 1);
  const uint64_t one = 1;
  ASSERT_TRUE(open.Apply(1, {&one, 1}, g.data(), spec).ok());
  EXPECT_EQ(open.rows_held(), 1);
}

TEST(AdmissionFilterTest, CountsAreNeverUnderTheTruthAndExactWhenFew) {
  AdmissionFilter filter(1000, 16);
  std::map<uint64_t, int> truth;
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint64_t> pick(0, 999);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t id = pick(rng);
    ++truth[id];
    (void)filter.CountAndAdmit(RowKey{0, id});
  }
  int exact = 0;
  for (const auto& [id, n] : truth) {
    const int est = filter.Estimate(RowKey{0, id});
    EXPECT_GE(est, n) << id;
    exact += est == n ? 1 : 0;
  }
  EXPECT_EQ(exact, static_cast<int>(truth.size())) << "1000 ids in 4 x 65536 counters";
  EXPECT_EQ(filter.Estimate(RowKey{1, 5}), 0) << "another table's id is counted apart";
  EXPECT_EQ(AdmissionFilter(0).bytes(), 0) << "off: no memory";
  EXPECT_EQ(AdmissionFilter::BytesFor(0), 0);
  EXPECT_EQ(AdmissionFilter::BytesFor(5), AdmissionFilter(5).bytes());
}

}  // namespace
}  // namespace parasync
