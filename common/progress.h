// DataProgress: where a worker is in its own data, as the servers record it with each rank's
// pushes (common/wire.h, ps/checkpoint_store.h), so that a restarted worker goes on from
// there (worker/trainer.h).
#pragma once

#include <cstdint>

namespace parasync {

// Epoch (1-based; 0: none recorded), examples of that epoch done, and the examples the
// worker's data shard holds per epoch: Keras BackupAndRestore's epoch and step, counted in
// examples so that a changed batch size cannot shift it, with the shard's size so that a
// changed data split is seen.
struct DataProgress {
  int32_t epoch = 0;
  int64_t done = 0;
  int64_t of = 0;
  bool empty() const { return epoch == 0; }
  bool operator==(const DataProgress&) const = default;
};

}  // namespace parasync
