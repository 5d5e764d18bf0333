#include "worker/sparse_batch.h"

#include <algorithm>

namespace parasync {

SparseBatch GatherSparseBatch(const Dataset& data, std::span<const int64_t> idx, float* x_out,
                              uint8_t* y_out) {
  const size_t ids = static_cast<size_t>(data.id_columns);
  const size_t dim = static_cast<size_t>(data.dim);
  const size_t width = ids + dim;
  SparseBatch batch;
  std::vector<uint64_t>& unique = batch.unique_ids;
  unique.reserve(idx.size() * ids);
  for (int64_t row : idx) {
    const uint64_t* first = data.ids.data() + static_cast<size_t>(row) * ids;
    unique.insert(unique.end(), first, first + ids);
  }
  // Sorting beats a hash map at batch sizes, and gives the servers sorted keys.
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  for (size_t k = 0; k < idx.size(); ++k) {
    const size_t row = static_cast<size_t>(idx[k]);
    const uint64_t* example_ids = data.ids.data() + row * ids;
    float* out = x_out + k * width;
    for (size_t c = 0; c < ids; ++c) {
      const auto at = std::lower_bound(unique.begin(), unique.end(), example_ids[c]);
      out[c] = static_cast<float>(at - unique.begin());
    }
    std::copy_n(data.x.data() + row * dim, dim, out + ids);
    y_out[k] = data.y[row];
  }
  return batch;
}

int64_t SparseRowsNeeded(int64_t batch, int64_t id_columns) { return batch * id_columns; }

}  // namespace parasync
