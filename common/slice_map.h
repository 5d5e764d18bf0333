// SliceMap: how variables are cut into slices and which parameter-server shard holds each.
//
// Every process computes the same map from the same (variables, max_slice_elements,
// num_shards): workers to know where to pull and push, servers to know what they own.
// Immutable once built; safe to share between threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/variable.h"

namespace parasync {

struct SliceInfo {
  uint32_t id = 0;         // index in SliceMap::slices()
  uint32_t var_index = 0;  // index of the variable it belongs to
  int64_t offset = 0;      // first element within the flattened variable
  int64_t length = 0;      // number of elements
  int32_t shard = 0;       // the shard that holds it
};

class SliceMap {
 public:
  // Slices are not cut smaller than this for balance's sake (4 KiB of float32): below it,
  // per-slice overhead outweighs imbalance.
  static constexpr int64_t kMinSliceElements = 1024;
  // A map never holds more slices than this; Build refuses before allocating.
  static constexpr int64_t kMaxSlices = int64_t{1} << 22;

  // min(max_slice_elements, max(kMinSliceElements, ceil(total / (4 * num_shards)))).
  static int64_t EffectiveSliceBound(int64_t total_elements, int64_t max_slice_elements,
                                     int num_shards);

  // Cuts each variable into near-equal contiguous slices of at most EffectiveSliceBound()
  // elements, then places slices largest first on the least-loaded shard (ties: lowest shard
  // index; slices of equal size keep declaration order). Greedy placement keeps every shard
  // within one slice of the mean, and the bound keeps a slice at most a quarter of the mean,
  // so the largest shard holds at most 1.25x the mean (for models of at least
  // 4 * kMinSliceElements * num_shards elements). Returns InvalidArgument for an empty or
  // invalid variable list, num_shards outside [1, 65536], max_slice_elements < 1, or more
  // than kMaxSlices slices.
  static Result<SliceMap> Build(const std::vector<VariableSpec>& variables,
                                int64_t max_slice_elements, int num_shards);

  const std::vector<SliceInfo>& slices() const { return slices_; }
  int num_shards() const { return num_shards_; }
  // Ids of the slices on `shard`, ascending. Precondition: 0 <= shard < num_shards().
  const std::vector<uint32_t>& SlicesOfShard(int shard) const { return by_shard_[shard]; }
  // Ids of the slices of variable `var_index`, in element order.
  const std::vector<uint32_t>& SlicesOfVariable(uint32_t var_index) const {
    return by_variable_[var_index];
  }
  // Elements held by `shard`.
  int64_t ShardLoad(int shard) const { return load_[shard]; }

 private:
  std::vector<SliceInfo> slices_;
  std::vector<std::vector<uint32_t>> by_shard_;
  std::vector<std::vector<uint32_t>> by_variable_;
  std::vector<int64_t> load_;
  int num_shards_ = 0;
};

}  // namespace parasync
