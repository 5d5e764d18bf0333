#include "common/slice_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/model_spec.h"

namespace parasync {
namespace {

VariableSpec VarSpec(std::string name, std::vector<int64_t> shape) {
  VariableSpec v;
  v.name = std::move(name);
  v.shape = std::move(shape);
  return v;
}

// The default worker model: MLP 784-256-128-10, kernels and biases.
std::vector<VariableSpec> MlpVariables() {
  return {VarSpec("dense/kernel", {784, 256}),  VarSpec("dense/bias", {256}),
          VarSpec("dense_1/kernel", {256, 128}), VarSpec("dense_1/bias", {128}),
          VarSpec("dense_2/kernel", {128, 10}),  VarSpec("dense_2/bias", {10})};
}

// ResNet-50's variables (bottleneck v1: 3-4-6-3 blocks, BN gamma/beta, 1000-way fc).
std::vector<VariableSpec> ResNet50Variables() {
  std::vector<VariableSpec> vars;
  auto conv_bn = [&](const std::string& name, int64_t k, int64_t in, int64_t out) {
    vars.push_back(VarSpec(name + "/kernel", {k, k, in, out}));
    vars.push_back(VarSpec(name + "/bn/gamma", {out}));
    vars.push_back(VarSpec(name + "/bn/beta", {out}));
  };
  conv_bn("conv1", 7, 3, 64);
  const int64_t blocks[] = {3, 4, 6, 3};
  const int64_t mids[] = {64, 128, 256, 512};
  int64_t in = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t mid = mids[stage];
    const int64_t out = 4 * mid;
    for (int64_t b = 0; b < blocks[stage]; ++b) {
      const std::string name = "stage" + std::to_string(stage) + "/block" + std::to_string(b);
      if (b == 0) conv_bn(name + "/shortcut", 1, in, out);
      conv_bn(name + "/a", 1, in, mid);
      conv_bn(name + "/b", 3, mid, mid);
      conv_bn(name + "/c", 1, mid, out);
      in = out;
    }
  }
  vars.push_back(VarSpec("fc/kernel", {2048, 1000}));
  vars.push_back(VarSpec("fc/bias", {1000}));
  return vars;
}

// BERT-base: embeddings, 12 transformer layers, pooler.
std::vector<VariableSpec> BertBaseVariables() {
  std::vector<VariableSpec> vars = {
      VarSpec("embeddings/word", {30522, 768}), VarSpec("embeddings/position", {512, 768}),
      VarSpec("embeddings/token_type", {2, 768}), VarSpec("embeddings/ln/gamma", {768}),
      VarSpec("embeddings/ln/beta", {768})};
  for (int l = 0; l < 12; ++l) {
    const std::string p = "layer" + std::to_string(l) + "/";
    for (const char* m : {"query", "key", "value", "attention_output"}) {
      vars.push_back(VarSpec(p + m + "/kernel", {768, 768}));
      vars.push_back(VarSpec(p + m + "/bias", {768}));
    }
    vars.push_back(VarSpec(p + "attention_ln/gamma", {768}));
    vars.push_back(VarSpec(p + "attention_ln/beta", {768}));
    vars.push_back(VarSpec(p + "intermediate/kernel", {768, 3072}));
    vars.push_back(VarSpec(p + "intermediate/bias", {3072}));
    vars.push_back(VarSpec(p + "output/kernel", {3072, 768}));
    vars.push_back(VarSpec(p + "output/bias", {768}));
    vars.push_back(VarSpec(p + "output_ln/gamma", {768}));
    vars.push_back(VarSpec(p + "output_ln/beta", {768}));
  }
  vars.push_back(VarSpec("pooler/kernel", {768, 768}));
  vars.push_back(VarSpec("pooler/bias", {768}));
  return vars;
}

int64_t TotalElements(const std::vector<VariableSpec>& vars) {
  int64_t n = 0;
  for (const VariableSpec& v : vars) n += v.num_elements();
  return n;
}

// Every element of every variable lies in exactly one slice, every slice on exactly one shard,
// and the accessors agree with slices().
void ExpectExactCover(const SliceMap& map, const std::vector<VariableSpec>& vars,
                      int64_t max_slice) {
  const auto& slices = map.slices();
  for (uint32_t id = 0; id < slices.size(); ++id) {
    EXPECT_EQ(slices[id].id, id);
    EXPECT_GE(slices[id].length, 1) << "slice " << id;
    EXPECT_LE(slices[id].length, max_slice) << "slice " << id;
    EXPECT_GE(slices[id].shard, 0);
    EXPECT_LT(slices[id].shard, map.num_shards());
  }
  std::vector<int> seen(slices.size(), 0);
  for (uint32_t v = 0; v < vars.size(); ++v) {
    int64_t next = 0;
    for (uint32_t id : map.SlicesOfVariable(v)) {
      ASSERT_LT(id, slices.size());
      EXPECT_EQ(slices[id].var_index, v);
      EXPECT_EQ(slices[id].offset, next) << vars[v].name << ": slices not contiguous";
      next = slices[id].offset + slices[id].length;
      ++seen[id];
    }
    EXPECT_EQ(next, vars[v].num_elements()) << vars[v].name;
  }
  int64_t total_load = 0;
  for (int s = 0; s < map.num_shards(); ++s) {
    const auto& ids = map.SlicesOfShard(s);
    EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end())) << "shard " << s;
    int64_t load = 0;
    for (uint32_t id : ids) {
      ASSERT_LT(id, slices.size());
      EXPECT_EQ(slices[id].shard, s);
      load += slices[id].length;
      ++seen[id];
    }
    EXPECT_EQ(map.ShardLoad(s), load) << "shard " << s;
    total_load += load;
  }
  // Each slice once through its variable and once through its shard.
  for (uint32_t id = 0; id < seen.size(); ++id) EXPECT_EQ(seen[id], 2) << "slice " << id;
  EXPECT_EQ(total_load, TotalElements(vars));
}

// The largest shard holds at most 1.25x the mean load.
void ExpectBalanced(const std::vector<VariableSpec>& vars, int64_t max_slice, int shards) {
  SCOPED_TRACE("max_slice_elements " + std::to_string(max_slice) + ", " +
               std::to_string(shards) + " shards");
  Result<SliceMap> map = SliceMap::Build(vars, max_slice, shards);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  ExpectExactCover(*map, vars, max_slice);
  const double mean = static_cast<double>(TotalElements(vars)) / shards;
  std::string loads;
  int64_t max_load = 0;
  for (int s = 0; s < shards; ++s) {
    max_load = std::max(max_load, map->ShardLoad(s));
    loads += " " + std::to_string(map->ShardLoad(s));
  }
  EXPECT_LE(static_cast<double>(max_load), 1.25 * mean)
      << "loads:" << loads << " (mean " << mean << ", max/mean "
      << static_cast<double>(max_load) / mean << ")";
}

void ExpectSameMap(const SliceMap& a, const SliceMap& b) {
  ASSERT_EQ(a.slices().size(), b.slices().size());
  ASSERT_EQ(a.num_shards(), b.num_shards());
  for (size_t i = 0; i < a.slices().size(); ++i) {
    const SliceInfo& x = a.slices()[i];
    const SliceInfo& y = b.slices()[i];
    EXPECT_EQ(x.id, y.id);
    EXPECT_EQ(x.var_index, y.var_index);
    EXPECT_EQ(x.offset, y.offset);
    EXPECT_EQ(x.length, y.length);
    EXPECT_EQ(x.shard, y.shard) << "slice " << i;
  }
  for (int s = 0; s < a.num_shards(); ++s) {
    EXPECT_EQ(a.SlicesOfShard(s), b.SlicesOfShard(s));
    EXPECT_EQ(a.ShardLoad(s), b.ShardLoad(s));
  }
}

TEST(SliceMapTest, BuildIsDeterministic) {
  const std::vector<VariableSpec> vars = ResNet50Variables();
  Result<SliceMap> a = SliceMap::Build(vars, 65536, 4);
  // Another, unrelated build in between must not influence the next one.
  ASSERT_TRUE(SliceMap::Build(BertBaseVariables(), 1000, 3).ok());
  const std::vector<VariableSpec> copy = vars;
  Result<SliceMap> b = SliceMap::Build(copy, 65536, 4);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  ExpectSameMap(*a, *b);
}

TEST(SliceMapTest, SmallVariableIsOneSliceOnShardZero) {
  Result<SliceMap> map = SliceMap::Build({VarSpec("w", {10})}, 64, 3);
  ASSERT_TRUE(map.ok());
  ASSERT_EQ(map->slices().size(), 1u);
  EXPECT_EQ(map->slices()[0].length, 10);
  EXPECT_EQ(map->slices()[0].shard, 0);
  EXPECT_EQ(map->ShardLoad(0), 10);
  EXPECT_EQ(map->ShardLoad(1), 0);
  EXPECT_TRUE(map->SlicesOfShard(2).empty());
}

TEST(SliceMapTest, CutsVariableIntoNearEqualSlicesNoLargerThanMax) {
  // 10 elements, max 4 -> 3 slices of 4, 3, 3.
  Result<SliceMap> map = SliceMap::Build({VarSpec("w", {10})}, 4, 2);
  ASSERT_TRUE(map.ok());
  ASSERT_EQ(map->SlicesOfVariable(0).size(), 3u);
  std::vector<int64_t> lengths;
  for (uint32_t id : map->SlicesOfVariable(0)) lengths.push_back(map->slices()[id].length);
  EXPECT_EQ(lengths, (std::vector<int64_t>{4, 3, 3}));
}

TEST(SliceMapTest, ScalarVariableGetsOneSlice) {
  Result<SliceMap> map = SliceMap::Build({VarSpec("step", {}), VarSpec("w", {5})}, 2, 2);
  ASSERT_TRUE(map.ok());
  ExpectExactCover(*map, {VarSpec("step", {}), VarSpec("w", {5})}, 2);
  ASSERT_EQ(map->SlicesOfVariable(0).size(), 1u);
  EXPECT_EQ(map->slices()[map->SlicesOfVariable(0)[0]].length, 1);
}

TEST(SliceMapTest, MaxSliceOfOneCoversEveryElement) {
  const std::vector<VariableSpec> vars = {VarSpec("a", {3, 2}), VarSpec("b", {5})};
  Result<SliceMap> map = SliceMap::Build(vars, 1, 4);
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(map->slices().size(), 11u);
  ExpectExactCover(*map, vars, 1);
}

TEST(SliceMapTest, RandomVariableListsAreCoveredExactlyAndWithinOneSliceOfMean) {
  std::mt19937_64 rng(20240611);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<VariableSpec> vars;
    const int nvars = std::uniform_int_distribution<int>(1, 12)(rng);
    for (int v = 0; v < nvars; ++v) {
      std::vector<int64_t> shape;
      const int rank = std::uniform_int_distribution<int>(0, 3)(rng);
      for (int d = 0; d < rank; ++d) shape.push_back(std::uniform_int_distribution<int64_t>(1, 40)(rng));
      vars.push_back(VarSpec("v" + std::to_string(v), shape));
    }
    const int64_t max_slice = std::uniform_int_distribution<int64_t>(1, 3000)(rng);
    const int shards = std::uniform_int_distribution<int>(1, 9)(rng);
    SCOPED_TRACE("trial " + std::to_string(trial));
    Result<SliceMap> map = SliceMap::Build(vars, max_slice, shards);
    ASSERT_TRUE(map.ok()) << map.status().ToString();
    ExpectExactCover(*map, vars, max_slice);
    // The documented greedy guarantee: largest shard within max_slice_elements of the mean.
    const double mean = static_cast<double>(TotalElements(vars)) / shards;
    for (int s = 0; s < shards; ++s) {
      EXPECT_LE(static_cast<double>(map->ShardLoad(s)), mean + static_cast<double>(max_slice));
    }
  }
}

TEST(SliceMapTest, DefaultMlpIsBalancedOnTwoShards) {
  ExpectBalanced(MlpVariables(), kDefaultMaxSliceElements, 2);
}

TEST(SliceMapTest, DefaultMlpIsBalancedOnThreeShards) {
  ExpectBalanced(MlpVariables(), kDefaultMaxSliceElements, 3);
}

TEST(SliceMapTest, DefaultMlpIsBalancedOnFourShards) {
  ExpectBalanced(MlpVariables(), kDefaultMaxSliceElements, 4);
}

TEST(SliceMapTest, ResNet50IsBalancedOnTwoToEightShards) {
  const std::vector<VariableSpec> vars = ResNet50Variables();
  ASSERT_EQ(vars.size(), 161u);  // 53 conv+BN triples, fc kernel and bias
  for (int64_t max_slice : {int64_t{64} * 1024, int64_t{256} * 1024}) {
    for (int shards : {2, 4, 8}) ExpectBalanced(vars, max_slice, shards);
  }
}

TEST(SliceMapTest, BertBaseIsBalancedOnTwoToEightShards) {
  const std::vector<VariableSpec> vars = BertBaseVariables();
  for (int64_t max_slice : {int64_t{64} * 1024, int64_t{256} * 1024}) {
    for (int shards : {2, 4, 8}) ExpectBalanced(vars, max_slice, shards);
  }
}

TEST(SliceMapTest, BuildRejectsZeroShards) {
  Result<SliceMap> map = SliceMap::Build(MlpVariables(), 1024, 0);
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(map.status().code(), StatusCode::kInvalidArgument);
}

TEST(SliceMapTest, BuildRejectsZeroMaxSlice) {
  Result<SliceMap> map = SliceMap::Build(MlpVariables(), 0, 2);
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(map.status().code(), StatusCode::kInvalidArgument);
}

TEST(SliceMapTest, BuildRejectsTooManySlicesBeforeAllocatingThem) {
  // 2^30 elements in slices of one element: a hostile Register must not make the server
  // build a table of a billion slices.
  Result<SliceMap> map = SliceMap::Build({VarSpec("huge", {1 << 15, 1 << 15})}, 1, 1);
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(map.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(map.status().message().find("slices"), std::string::npos) << map.status().message();
}

TEST(SliceMapTest, BuildRejectsTooManyShards) {
  EXPECT_FALSE(SliceMap::Build(MlpVariables(), 65536, 65537).ok());
}

TEST(SliceMapTest, BuildRejectsEmptyVariableList) {
  Result<SliceMap> map = SliceMap::Build({}, 1024, 2);
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(map.status().code(), StatusCode::kInvalidArgument);
}

TEST(SliceMapTest, BuildRejectsInvalidVariable) {
  Result<SliceMap> map = SliceMap::Build({VarSpec("w", {3, 0})}, 1024, 2);
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(map.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace parasync
