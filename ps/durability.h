// Durability: a server's writes to its CheckpointStore — full snapshots (at registration, on
// request, at exit, and periodically by time or by versions) and, with every-update
// durability, one synced write per applied update — and the latch that stops the server
// acknowledging anything once such a write failed. It reads the Shard and the PushLedger,
// never changes them (but for taking the Shard's record of changed embedding rows, which a
// write consumes): rolling memory back to the store after a failure is the Server's part.
//
// Not thread-safe: owned by the Server's loop. Without a store every call is a no-op.
#pragma once

#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "ps/checkpoint_store.h"
#include "ps/ps_metrics.h"
#include "ps/push_ledger.h"
#include "ps/shard.h"

namespace parasync {

class Durability {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  struct Options {
    CheckpointStore* store = nullptr;  // not owned; null: nothing is persisted
    bool every_update = false;
    std::chrono::milliseconds checkpoint_every{0};  // 0: no time trigger
    int64_t checkpoint_every_versions = 0;          // 0: no versions trigger
    bool sync = false;  // sync mode: the versions trigger fires at multiples of it
    int shard_index = 0;
  };

  // `metrics` must outlive this object.
  Durability(const Options& options, PsMetrics* metrics, TimePoint now);

  bool has_store() const { return options_.store != nullptr; }
  bool every_update() const { return has_store() && options_.every_update; }

  // Writes a full snapshot of `shard` and the records of `ledger` (WAL synced) if there is a
  // store, something is registered and the version moved since the last one (`force`: even
  // if not). Returns the store's error.
  Status Save(Shard& shard, const PushLedger& ledger, bool force);
  // Periodic durability: writes a snapshot when one is due at `now`; a failure is counted
  // and logged, and tried again at the next interval.
  void MaybeSave(Shard& shard, const PushLedger& ledger, TimePoint now);
  // Every-update durability: writes the slices of `ranges` (all of the shard's when empty)
  // and the embedding rows changed since the last write, with the shard's version and
  // examples and the records of `ranks`, in one synced write.
  // Returns the store's error (FailedPrecondition before a registration).
  Status SaveUpdate(Shard& shard, std::span<const SliceRange> ranges,
                    std::vector<RankRecord> ranks);
  // The store holds `version` (restored from it, or rolled back to it).
  void MarkSaved(int64_t version) { last_saved_version_ = version; }

  // A durable write failed: counted; the first time also latched (failure() is set for good,
  // the store_failed gauge reads 1, the line is logged). Returns true the first time.
  bool LatchFailure(const Status& failure, const std::string& what);
  // Why the store failed, once it has (until restart): no push is acknowledged any more.
  const std::optional<std::string>& failure() const { return failure_; }

 private:
  bool SnapshotDue(int64_t version, TimePoint now) const;

  Options options_;
  PsMetrics* metrics_;
  std::optional<std::string> failure_;
  int64_t last_saved_version_ = -1;
  TimePoint last_save_time_;
};

}  // namespace parasync
