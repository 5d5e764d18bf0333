// RowSnapshot: one embedding-table row as it is persisted — the record EmbeddingTables hands to
// the checkpoint store and takes back on a restart (the row counterpart of SliceSnapshot).
// Plain values; safe to copy between threads.
#pragma once

#include <compare>
#include <cstdint>
#include <vector>

namespace parasync {

struct RowSnapshot {
  uint32_t table = 0;   // index into the registration's tables
  uint64_t id = 0;
  int64_t updates = 0;  // optimizer steps applied to this row (Adam's t)
  std::vector<float> values;              // the table's dim floats
  std::vector<std::vector<float>> slots;  // optimizer slots, each values.size() long
  // When it was last updated, on the clock of the tables' expiry (EmbeddingTables::SetNow:
  // shard versions or Unix seconds); 0: not tracked (no expiry, or a record from before it).
  int64_t touched = 0;
  bool operator==(const RowSnapshot&) const = default;
};

// A row's address; ordered by table, then id (the order snapshots are listed in).
struct RowKey {
  uint32_t table = 0;
  uint64_t id = 0;
  auto operator<=>(const RowKey&) const = default;
};

}  // namespace parasync
