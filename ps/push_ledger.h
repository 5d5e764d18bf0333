// PushLedger: what the server remembers of each worker rank's pushes — the last push it
// applied (so a resend is replayed, not applied twice) and where the rank is in its data with
// the updates applied here (told to a restarted worker at Register). In sync mode a
// contribution's position waits as pending until its step is applied.
//
// Not thread-safe: owned by the Server's loop.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/push_seq.h"
#include "common/wire.h"
#include "ps/checkpoint_store.h"

namespace parasync {

class PushLedger {
 public:
  explicit PushLedger(int num_ranks);

  // True if `seq` from `rank` was applied already (a resend). False for seq 0 and for a rank
  // outside the cluster.
  bool AlreadyApplied(int rank, PushSeq seq) const;
  // True if a push from a new process of `rank` (an incarnation other than the last applied
  // seq's) carries a position in the same data shard at or before the one recorded here: its
  // examples were applied here by the process before. A restarted worker resumes from the
  // least position over the shards, and a SIGKILL between the shards' replies can leave this
  // one a push ahead; acknowledging that push without applying it again keeps every example
  // applied once. Only for async and SSP: a sync step waits for the rank's contribution.
  bool ReplaysRecordedData(int rank, PushSeq seq, const DataProgress& progress) const;
  // Records `seq` as the last applied from `rank` (nothing for seq 0 or an unknown rank).
  void RecordSeq(int rank, PushSeq seq);
  // Records where `rank` is once its push counts (nothing for an empty one or an unknown rank).
  void RecordProgress(int rank, const DataProgress& progress);
  // Sync: `rank`'s position waits until its step is applied (nothing for an empty one).
  void SetPending(int rank, const DataProgress& progress);
  // Sync: the step was applied — the pending positions count now. Returns their ranks.
  std::vector<int> SettlePending();

  uint64_t last_seq(int rank) const { return last_seq_[static_cast<size_t>(rank)]; }
  const DataProgress& progress(int rank) const { return progress_[static_cast<size_t>(rank)]; }
  // The record a push from `rank` with `seq` and `progress` would leave (what an every-update
  // write stores before the push is acknowledged).
  RankRecord RecordAfter(int rank, uint64_t seq, const DataProgress& progress) const;
  // The records of `ranks` that hold anything, for the store; unknown ranks are skipped.
  std::vector<RankRecord> Records(std::span<const int> ranks) const;
  // The records of every rank that holds anything.
  std::vector<RankRecord> AllRecords() const;
  // Takes the records of a restored snapshot (unknown ranks are skipped).
  void Restore(std::span<const RankRecord> records);
  // Forgets everything (before a rollback to the store).
  void Clear();

 private:
  bool Known(int rank) const { return rank >= 0 && static_cast<size_t>(rank) < last_seq_.size(); }

  std::vector<uint64_t> last_seq_;
  std::vector<DataProgress> progress_;
  std::vector<DataProgress> pending_progress_;
};

}  // namespace parasync
