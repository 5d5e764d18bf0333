// What the shard tests (shard_test.cc, shard_reject_test.cc, shard_sync_test.cc,
// shard_apply_test.cc) share: a small model, pushes as the server hands them to a shard, and
// views of a shard's slices.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ps/optimizer.h"
#include "ps/shard.h"
#include "tests/support/small_model.h"

namespace parasync::shard_test {

inline bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline constexpr float kLimit = 0.5f;

// A 30-element kernel cut into 8-element slices (8, 8, 7, 7) and a 5-element bias.
inline ModelRegistration SmallModel(int num_shards, OptimizerKind kind = OptimizerKind::kSgd) {
  return testing::SmallModel(testing::DenseLayer("dense", 6, 5, kLimit), /*max_slice_elements=*/8,
                             num_shards, /*seed=*/1234, /*learning_rate=*/0.5f, kind);
}

inline void MustRegister(Shard& shard, const ModelRegistration& reg) {
  RejectReason reason = RejectReason::kNone;
  Status s = shard.Register(reg, &reason);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(reason, RejectReason::kNone);
}

// A push as the server hands it to the shard: ranges, one gradient frame per range (frame
// sizes from the gradients unless overridden), validated and then applied.
struct Push {
  Push(std::vector<SliceRange> r, std::vector<std::vector<float>> g)
      : ranges(std::move(r)), grads(std::move(g)) {}

  std::vector<SliceRange> ranges;
  std::vector<std::vector<float>> grads;
  DType dtype = DType::kFloat32;
  std::optional<std::vector<size_t>> frame_bytes;
  int64_t batch_examples = 8;
};

inline Status DoPush(Shard& shard, const Push& push, RejectReason* reason) {
  std::vector<size_t> sizes;
  if (push.frame_bytes) {
    sizes = *push.frame_bytes;
  } else {
    for (const auto& g : push.grads) sizes.push_back(g.size() * sizeof(float));
  }
  PARASYNC_RETURN_IF_ERROR(
      shard.ValidateRanges(push.ranges, push.dtype, std::span<const size_t>(sizes), reason));
  std::vector<const float*> ptrs;
  for (const auto& g : push.grads) ptrs.push_back(g.data());
  return shard.Apply(push.ranges, ptrs, push.batch_examples, reason);
}

// Gradient of `count` floats: 0.01, 0.02, ... scaled by `scale`.
inline std::vector<float> Ramp(int64_t count, float scale = 1.0f) {
  std::vector<float> g(static_cast<size_t>(count));
  for (size_t i = 0; i < g.size(); ++i) g[i] = scale * 0.01f * static_cast<float>(i + 1);
  return g;
}

// The map of a registered shard.
inline const SliceMap& MapOf(const Shard& shard) {
  if (const SliceMap* map = shard.slice_map()) return *map;
  ADD_FAILURE() << "shard " << shard.shard_index() << " is not registered";
  static const SliceMap kNoSlices;
  return kNoSlices;
}

// Everything a rejected request must leave alone.
struct Snapshot {
  std::vector<std::vector<float>> values;  // by slice id; empty if not held
  int64_t version = 0;
  int64_t examples = 0;
  bool operator==(const Snapshot&) const = default;
};

inline Snapshot Take(const Shard& shard) {
  Snapshot s;
  for (uint32_t id = 0; id < MapOf(shard).slices().size(); ++id) {
    std::span<const float> v = shard.SliceValues(id);
    s.values.emplace_back(v.begin(), v.end());
  }
  s.version = shard.version();
  s.examples = shard.examples();
  return s;
}

// Values of variable `var` assembled from the shards that hold its slices.
inline std::vector<float> AssembleVariable(const std::vector<const Shard*>& shards, uint32_t var) {
  const SliceMap& map = MapOf(*shards[0]);
  std::vector<float> out;
  for (uint32_t id : map.SlicesOfVariable(var)) {
    std::span<const float> v =
        shards[static_cast<size_t>(map.slices()[id].shard)]->SliceValues(id);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Validates `push` as a push and adds it to the shard's current sync step as `rank`'s.
inline Status DoAccumulate(Shard& shard, const Push& push, RejectReason* reason, int rank = 0) {
  std::vector<size_t> sizes;
  for (const auto& g : push.grads) sizes.push_back(g.size() * sizeof(float));
  PARASYNC_RETURN_IF_ERROR(
      shard.ValidateRanges(push.ranges, push.dtype, std::span<const size_t>(sizes), reason));
  std::vector<const float*> ptrs;
  for (const auto& g : push.grads) ptrs.push_back(g.data());
  return shard.Accumulate(push.ranges, ptrs, push.batch_examples, reason, rank);
}

// A gradient for every slice of `shard`, whole: Ramp(length, scale) per slice.
inline Push WholeShardPush(const Shard& shard, float scale) {
  Push p{{}, {}};
  for (uint32_t id : MapOf(shard).SlicesOfShard(shard.shard_index())) {
    const int64_t length = MapOf(shard).slices()[id].length;
    p.ranges.push_back({id, 0, length});
    p.grads.push_back(Ramp(length, scale));
  }
  return p;
}

}  // namespace parasync::shard_test
