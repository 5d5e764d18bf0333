// ColdTier: where a server's embedding rows go when its memory budget (--table-memory) is
// full: the least recently touched row is demoted here with its optimizer state and update
// count instead of being forgotten, and read back when its id comes again
// (ps/embedding_table.h). The server's is its CheckpointStore (ps/checkpoint_store.h);
// tests use an in-memory one.
//
// A row handed to Write is the newest value of that row until it is promoted and changed
// again; Read returns the newest value written for each key, or what the tier held before
// (the store's checkpointed rows), or nothing for a row it never had.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "ps/row_snapshot.h"

namespace parasync {

class ColdTier {
 public:
  virtual ~ColdTier() = default;
  // (*out)[i] is the row of keys[i] (in any order), or nullopt when the tier has none: a
  // request's rows not in memory come in one call, for the tier to look up together.
  // Corruption naming the key for a damaged record, Unavailable for an I/O error; *out is
  // unspecified then.
  virtual Status Read(std::span<const RowKey> keys,
                      std::vector<std::optional<RowSnapshot>>* out) = 0;
  // Writes `rows` (demoted rows changed since they were last written) in one write, whole or
  // not at all. Unavailable naming the cause when the write fails (a full disk).
  virtual Status Write(std::span<const RowSnapshot> rows) = 0;
  // For expiry: sets *out to the keys and `touched` stamps of up to `limit` rows after
  // `after` in (table, id) order (all from the first with `after` empty), and *at_end when
  // there are no more after them. Errors as Read's.
  struct Stamp {
    RowKey key;
    int64_t touched = 0;
  };
  virtual Status Scan(std::optional<RowKey> after, size_t limit, std::vector<Stamp>* out,
                      bool* at_end) = 0;
};

}  // namespace parasync
