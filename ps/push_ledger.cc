#include "ps/push_ledger.h"

#include <algorithm>
#include <utility>

namespace parasync {

PushLedger::PushLedger(int num_ranks)
    : last_seq_(static_cast<size_t>(num_ranks), 0),
      progress_(static_cast<size_t>(num_ranks)),
      pending_progress_(static_cast<size_t>(num_ranks)) {}

bool PushLedger::AlreadyApplied(int rank, PushSeq seq) const {
  if (seq.none() || !Known(rank)) return false;
  return seq.CoveredBy(PushSeq(last_seq(rank)));
}

bool PushLedger::ReplaysRecordedData(int rank, PushSeq seq, const DataProgress& progress) const {
  if (seq.none() || !Known(rank) || progress.empty()) return false;
  const PushSeq last(last_seq(rank));
  const DataProgress& recorded = this->progress(rank);
  if (last.none() || last.incarnation() == seq.incarnation() || recorded.empty()) return false;
  if (progress.of != recorded.of) return false;  // another data shard: nothing to compare
  return std::pair(progress.epoch, progress.done) <= std::pair(recorded.epoch, recorded.done);
}

void PushLedger::RecordSeq(int rank, PushSeq seq) {
  if (seq.none() || !Known(rank)) return;
  last_seq_[static_cast<size_t>(rank)] = seq.raw();
}

void PushLedger::RecordProgress(int rank, const DataProgress& progress) {
  if (progress.empty() || !Known(rank)) return;
  progress_[static_cast<size_t>(rank)] = progress;
}

void PushLedger::SetPending(int rank, const DataProgress& progress) {
  if (progress.empty() || !Known(rank)) return;
  pending_progress_[static_cast<size_t>(rank)] = progress;
}

std::vector<int> PushLedger::SettlePending() {
  std::vector<int> settled;
  for (size_t r = 0; r < pending_progress_.size(); ++r) {
    if (pending_progress_[r].empty()) continue;
    progress_[r] = std::exchange(pending_progress_[r], DataProgress{});
    settled.push_back(static_cast<int>(r));
  }
  return settled;
}

RankRecord PushLedger::RecordAfter(int rank, uint64_t seq, const DataProgress& progress) const {
  return {rank, seq != 0 ? seq : last_seq(rank), progress.empty() ? this->progress(rank) : progress};
}

std::vector<RankRecord> PushLedger::Records(std::span<const int> ranks) const {
  std::vector<RankRecord> records;
  for (int rank : ranks) {
    if (!Known(rank)) continue;
    if (last_seq(rank) != 0 || !progress(rank).empty()) {
      records.push_back({rank, last_seq(rank), progress(rank)});
    }
  }
  return records;
}

std::vector<RankRecord> PushLedger::AllRecords() const {
  std::vector<int> all(last_seq_.size());
  for (size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
  return Records(all);
}

void PushLedger::Restore(std::span<const RankRecord> records) {
  for (const RankRecord& r : records) {
    if (!Known(r.rank)) continue;
    last_seq_[static_cast<size_t>(r.rank)] = r.last_seq;
    progress_[static_cast<size_t>(r.rank)] = r.progress;
  }
}

void PushLedger::Clear() {
  std::fill(last_seq_.begin(), last_seq_.end(), 0);
  std::fill(progress_.begin(), progress_.end(), DataProgress{});
  std::fill(pending_progress_.begin(), pending_progress_.end(), DataProgress{});
}

}  // namespace parasync
