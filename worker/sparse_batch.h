// One training batch for a model with a sparse embedding table (Model::sparse_tables()): the
// batch's ids deduplicated into a sorted list, and its examples with every id replaced by its
// index in that list. The worker pulls the rows of that list into the table's compact buffer
// [SparseRowsNeeded(...), dim] (row r holds the table's row unique_ids[r]), the backend
// computes with the local indices, and the first unique_ids.size() gradient rows are the
// gradients of those rows (repeated ids already summed).
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "worker/data/dataset.h"

namespace parasync {

struct SparseBatch {
  std::vector<uint64_t> unique_ids;  // the batch's distinct ids, ascending
};

// Fills x_out (idx.size() * (data.id_columns + data.dim) floats) with, for each example
// named by `idx` in order, its data.id_columns ids as their indices in the returned
// unique_ids (floats, exact: the indices are below 2^24), then its data.dim features; and
// y_out (idx.size() labels) with its labels. Returns the batch's distinct ids. Precondition:
// every index is in [0, data.n), idx.size() * data.id_columns <= 2^24, and the outputs are
// large enough; the caller owns them.
SparseBatch GatherSparseBatch(const Dataset& data, std::span<const int64_t> idx, float* x_out,
                              uint8_t* y_out);

// The compact table rows a batch of `batch` examples with `id_columns` ids each may need
// (every id distinct): the ModelInputs::sparse_rows to build the model with.
int64_t SparseRowsNeeded(int64_t batch, int64_t id_columns);

}  // namespace parasync
