#include "common/slice_map.h"

#include <algorithm>
#include <numeric>

namespace parasync {

int64_t SliceMap::EffectiveSliceBound(int64_t total_elements, int64_t max_slice_elements,
                                      int num_shards) {
  const int64_t parts = 4 * int64_t{num_shards};
  const int64_t quarter_share = (total_elements + parts - 1) / parts;
  return std::min(max_slice_elements, std::max(kMinSliceElements, quarter_share));
}

Result<SliceMap> SliceMap::Build(const std::vector<VariableSpec>& variables,
                                 int64_t max_slice_elements, int num_shards) {
  PARASYNC_RETURN_IF_ERROR(ValidateVariables(variables));
  if (num_shards < 1 || num_shards > 65536) {
    return Status::InvalidArgument("num_shards must be in [1, 65536]");
  }
  if (max_slice_elements < 1) return Status::InvalidArgument("max_slice_elements must be >= 1");

  SliceMap map;
  map.num_shards_ = num_shards;
  map.by_shard_.resize(static_cast<size_t>(num_shards));
  map.by_variable_.resize(variables.size());
  map.load_.assign(static_cast<size_t>(num_shards), 0);

  int64_t total = 0;
  for (const VariableSpec& v : variables) total += v.num_elements();
  const int64_t bound = EffectiveSliceBound(total, max_slice_elements, num_shards);
  int64_t num_slices = 0;
  for (const VariableSpec& v : variables) num_slices += (v.num_elements() + bound - 1) / bound;
  if (num_slices > kMaxSlices) {
    return Status::InvalidArgument("the model would be cut into " + std::to_string(num_slices) +
                                   " slices, more than " + std::to_string(kMaxSlices) +
                                   "; raise max_slice_elements");
  }
  map.slices_.reserve(static_cast<size_t>(num_slices));
  for (uint32_t v = 0; v < variables.size(); ++v) {
    const int64_t n = variables[v].num_elements();
    const int64_t pieces = (n + bound - 1) / bound;
    // Near-equal pieces: the first (n % pieces) get one element more.
    const int64_t base = n / pieces;
    const int64_t extra = n % pieces;
    int64_t offset = 0;
    for (int64_t p = 0; p < pieces; ++p) {
      SliceInfo s;
      s.id = static_cast<uint32_t>(map.slices_.size());
      s.var_index = v;
      s.offset = offset;
      s.length = base + (p < extra ? 1 : 0);
      offset += s.length;
      map.by_variable_[v].push_back(s.id);
      map.slices_.push_back(s);
    }
  }

  std::vector<uint32_t> order(map.slices_.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return map.slices_[a].length > map.slices_[b].length;
  });
  for (uint32_t id : order) {
    auto lightest = std::min_element(map.load_.begin(), map.load_.end());
    const int shard = static_cast<int>(lightest - map.load_.begin());
    map.slices_[id].shard = shard;
    *lightest += map.slices_[id].length;
  }
  for (const SliceInfo& s : map.slices_) map.by_shard_[static_cast<size_t>(s.shard)].push_back(s.id);
  return map;
}

}  // namespace parasync
