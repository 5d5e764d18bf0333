// What the stores in this directory hold, spelled out (see README.md): the snapshot
// tests/ps/old_store_test.cc and tests/integration/old_store_process_test.cc expect to read back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "ps/checkpoint_store.h"

#ifndef PARASYNC_TESTDATA_DIR
#error "PARASYNC_TESTDATA_DIR must name tests/ps/testdata"
#endif

namespace parasync::testing {

// What the stored snapshot holds, spelled out: shard 1 of 3, a momentum optimizer (one slot),
// its three slices, rank records with and without data progress.
inline ShardSnapshot OldSnapshot() {
  ShardSnapshot snap;
  ModelRegistration& reg = snap.registration;
  reg.variables = {{"conv/kernel", {3, 3, 1, 8}, DType::kFloat32, {InitKind::kUniform, 0.25f}},
                   {"conv/bias", {8}, DType::kFloat32, {InitKind::kZeros, 0.0f}},
                   {"dense/kernel", {8, 3}, DType::kFloat32, {InitKind::kUniform, 0.25f}},
                   {"dense/bias", {3}, DType::kFloat32, {InitKind::kZeros, 0.0f}}};
  reg.optimizer.kind = OptimizerKind::kMomentum;
  reg.optimizer.learning_rate = 0.05f;
  reg.optimizer.momentum = 0.5f;
  reg.seed = 20261124;
  reg.max_slice_elements = 16;
  reg.num_shards = 3;
  reg.mode = "sync";
  reg.model = R"({"layers":["conv"]})";
  snap.version = 977;
  snap.examples = 977 * 64;
  // Shard 1's slices in the model's slice map (a server checks that they are): the second of
  // conv/kernel's five, and dense/kernel's two.
  for (const auto& [id, n] : {std::pair<uint32_t, int>{1, 15}, {6, 12}, {7, 12}}) {
    SliceSnapshot slice;
    slice.id = id;
    slice.updates = 100 + id;
    slice.slots.resize(1);
    for (int i = 0; i < n; ++i) {
      slice.values.push_back(static_cast<float>(id) - 0.125f * static_cast<float>(i));
      slice.slots[0].push_back(1e-3f * static_cast<float>(i * (id + 1)));
    }
    snap.slices.push_back(std::move(slice));
  }
  snap.ranks = {{0, 4294967296ull + 17, {5, 640, 1000}}, {1, 33, {}}, {3, 4294967296ull * 2, {6, 0, 1000}}};
  return snap;
}

// Expects the store in `dir` (shard 1 of 3) to hold OldSnapshot(), field by field.
inline void ExpectHoldsOldSnapshot(const std::string& dir) {
  Result<std::unique_ptr<CheckpointStore>> opened = CheckpointStore::Open(dir, 1, 3);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Result<ShardSnapshot> loaded = (*opened)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const ShardSnapshot expected = OldSnapshot();
  EXPECT_EQ(loaded->registration, expected.registration);
  EXPECT_EQ(loaded->version, expected.version);
  EXPECT_EQ(loaded->examples, expected.examples);
  EXPECT_EQ(loaded->slices, expected.slices);
  EXPECT_EQ(loaded->ranks, expected.ranks);
}

// The test-name suffix of a stored directory: "Closed" for store-0.2, "Killed" for the one a
// killed process left (store-0.2-wal).
inline std::string StoreCaseName(const ::testing::TestParamInfo<std::string>& param) {
  return param.param == "store-0.2" ? "Closed" : "Killed";
}

}  // namespace parasync::testing
