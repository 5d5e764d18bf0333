// What the checkpoint-store tests (checkpoint_store_test.cc, checkpoint_store_fault_test.cc,
// checkpoint_store_damage_test.cc) share: snapshots to store, and the database read directly.
#pragma once

#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ps/checkpoint_store.h"
#include "tests/support/small_model.h"

namespace parasync::checkpoint_store_test {

namespace fs = std::filesystem;

inline bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline ModelRegistration AdamModel(int num_shards) {
  ModelRegistration reg =
      testing::SmallModel(testing::DenseLayer("dense", 6, 5, 0.5f), /*max_slice_elements=*/8,
                          num_shards, /*seed=*/987654321, /*learning_rate=*/0.001f,
                          OptimizerKind::kAdam);
  reg.optimizer.beta1 = 0.8f;
  reg.optimizer.staleness_aware = true;
  // A restored server goes on along its schedule: the schedule is part of what is stored.
  reg.optimizer.schedule = LrSchedule::kCosine;
  reg.optimizer.decay_examples = 600000;
  reg.optimizer.final_lr_fraction = 0.05f;
  reg.mode = "ssp:2";
  return reg;
}

// A slice of `n` elements whose values and two Adam slots are distinct from every other slice's
// (`salt`).
inline SliceSnapshot MakeSlice(uint32_t id, int n, float salt, int64_t updates) {
  SliceSnapshot s;
  s.id = id;
  s.updates = updates;
  for (int i = 0; i < n; ++i) s.values.push_back(salt + 0.25f * static_cast<float>(i));
  s.slots.resize(2);
  for (int i = 0; i < n; ++i) {
    s.slots[0].push_back(-salt - static_cast<float>(i));
    s.slots[1].push_back(salt * 1e-3f + static_cast<float>(i) * 1e-6f);
  }
  return s;
}

inline ShardSnapshot MakeSnapshot() {
  ShardSnapshot snap;
  snap.registration = AdamModel(2);
  snap.version = 41;
  snap.examples = 41 * 32;
  snap.slices = {MakeSlice(1, 8, 1.0f, 17), MakeSlice(3, 7, 3.0f, 5), MakeSlice(5, 5, 5.0f, 0)};
  // Rank 0's record carries its data progress; the others have none (as before 0.2).
  snap.ranks = {{-1, 3, {}}, {0, 40, {3, 120, 600}}, {2, 12345678901ull, {}}};
  return snap;
}

inline std::unique_ptr<CheckpointStore> MustOpen(const std::string& dir, int shard,
                                                 int num_shards) {
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(dir, shard, num_shards);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(*store) : nullptr;
}

inline ShardSnapshot MustLoad(CheckpointStore& store) {
  Result<ShardSnapshot> snap = store.Load();
  EXPECT_TRUE(snap.ok()) << snap.status().ToString();
  return snap.ok() ? std::move(*snap) : ShardSnapshot{};
}

// Runs `fn` on the database in `dir` opened directly, without CheckpointStore.
template <typename F>
inline void WithRawDb(const std::string& dir, bool create, F&& fn) {
  rocksdb::Options options;
  options.create_if_missing = create;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &raw);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::unique_ptr<rocksdb::DB> db(raw);
  fn(db.get());
  ASSERT_TRUE(db->Close().ok());
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Every file under `dir` with its content.
inline std::vector<std::pair<std::string, std::string>> DirContents(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    out.emplace_back(e.path().filename().string(), ReadFile(e.path().string()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// `snap` after the every-update write number `i` of EveryUpdate().
inline void ApplyUpdate(ShardSnapshot* snap, int i) {
  snap->version += 1;
  snap->examples += 32;
  snap->slices[0].values[0] = static_cast<float>(1000 + i);
  snap->slices[0].updates += 1;
}

inline Status EveryUpdate(CheckpointStore& store, ShardSnapshot* snap, int i, bool sync) {
  ShardSnapshot next = *snap;
  ApplyUpdate(&next, i);
  Status s = store.SaveUpdate(next.version, next.examples, {&next.slices[0]}, {}, sync);
  if (s.ok()) *snap = std::move(next);
  return s;
}

}  // namespace parasync::checkpoint_store_test
