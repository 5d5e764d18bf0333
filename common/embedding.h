// Embedding tables: variables kept as rows by id (row-sparse) instead of as slices. A worker
// pulls and pushes only the rows its batch touches; each server keeps the rows whose id hashes
// to it (ShardOfRow), created on first update with a value that depends on (seed, table, id)
// alone (InitializeRow), so every shard count and every restart agree on a row nobody has
// updated. A table has a fixed row count (ids in [0, rows)) or none (any 64-bit id, e.g. a
// hashed feature value): no process ever holds a whole unbounded table.
//
// Plain values and pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/variable.h"

namespace parasync {

struct TableSpec {
  std::string name;
  int64_t rows = 0;  // ids in [0, rows); 0: unbounded (any uint64 id)
  int64_t dim = 0;   // floats per row
  Initializer init;
  bool operator==(const TableSpec&) const = default;
};

// Widest row a table may have (64 KiB of float32 per row).
inline constexpr int64_t kMaxTableDim = 16384;

// Names non-empty and unique (also against `variables`' names), dim in [1, kMaxTableDim],
// rows >= 0 (0: unbounded).
Status ValidateTables(const std::vector<TableSpec>& tables,
                      const std::vector<VariableSpec>& variables);

// The shard that holds row `id` of table `table` (0 <= result < num_shards): a 64-bit mix of
// both, so consecutive ids and the heavy hitters of a Zipf stream spread evenly.
// Precondition: num_shards >= 1.
int ShardOfRow(uint32_t table, uint64_t id, int num_shards);

// Fills out[0..dim) with row `id`'s initial value: deterministic in (init, seed, table, id).
void InitializeRow(const Initializer& init, uint64_t seed, uint32_t table, uint64_t id,
                   float* out, int64_t dim);

// A one-line description of the first difference between two table lists; empty if equal.
std::string DescribeTablesMismatch(const std::vector<TableSpec>& have,
                                   const std::vector<TableSpec>& got);

}  // namespace parasync
