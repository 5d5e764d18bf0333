#include "ps/durability.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace parasync {

Durability::Durability(const Options& options, PsMetrics* metrics, TimePoint now)
    : options_(options), metrics_(metrics), last_save_time_(now) {}

Status Durability::Save(Shard& shard, const PushLedger& ledger, bool force) {
  if (options_.store == nullptr || !shard.registered()) return Status::Ok();
  if (!force && shard.version() == last_saved_version_) return Status::Ok();
  const auto t0 = std::chrono::steady_clock::now();
  ShardSnapshot snap = shard.Snapshot();
  snap.ranks = ledger.AllRecords();
  // Embedding rows: only those changed since the last write (the store keeps the rest); the
  // first snapshot of a store replaces whatever rows it had.
  shard.TakeRowChanges(&snap);
  snap.replace_rows = last_saved_version_ < 0;
  PARASYNC_RETURN_IF_ERROR(options_.store->Save(snap, /*sync=*/true));
  const auto t1 = std::chrono::steady_clock::now();
  last_saved_version_ = shard.version();
  last_save_time_ = t1;
  metrics_->checkpoint_seconds->Observe(std::chrono::duration<double>(t1 - t0).count());
  metrics_->last_checkpoint_time->SetToCurrentTime();
  spdlog::debug("snapshot of version {} saved in {:.3f} s", shard.version(),
                std::chrono::duration<double>(t1 - t0).count());
  return Status::Ok();
}

bool Durability::SnapshotDue(int64_t version, TimePoint now) const {
  bool due = false;
  if (options_.checkpoint_every_versions > 0) {
    due = options_.sync ? version % options_.checkpoint_every_versions == 0
                        : version - std::max<int64_t>(0, last_saved_version_) >=
                              options_.checkpoint_every_versions;
  }
  if (options_.checkpoint_every.count() > 0 && now - last_save_time_ >= options_.checkpoint_every) {
    due = true;
  }
  return due;
}

void Durability::MaybeSave(Shard& shard, const PushLedger& ledger, TimePoint now) {
  if (options_.store == nullptr || options_.every_update || !shard.registered()) return;
  if (shard.version() == last_saved_version_ || !SnapshotDue(shard.version(), now)) return;
  if (Status s = Save(shard, ledger, /*force=*/false); !s.ok()) {
    metrics_->checkpoint_failures->Increment();
    spdlog::error("snapshot failed: {}", s.ToString());
    last_save_time_ = now;  // retry at the next interval, not at every message
  }
}

Status Durability::SaveUpdate(Shard& shard, std::span<const SliceRange> ranges,
                              std::vector<RankRecord> ranks) {
  std::vector<SliceSnapshot> slices;
  const SliceMap* map = shard.slice_map();
  if (map == nullptr) return Status::FailedPrecondition("nothing registered to persist");
  if (ranges.empty()) {
    for (uint32_t id : map->SlicesOfShard(options_.shard_index)) {
      slices.push_back(shard.SnapshotOfSlice(id));
    }
  } else {
    for (const SliceRange& r : ranges) slices.push_back(shard.SnapshotOfSlice(r.slice_id));
  }
  std::vector<const SliceSnapshot*> ptrs;
  for (const SliceSnapshot& s : slices) ptrs.push_back(&s);
  ShardSnapshot rows;  // the embedding rows this update changed (and evicted)
  shard.TakeRowChanges(&rows);
  const auto t0 = std::chrono::steady_clock::now();
  PARASYNC_RETURN_IF_ERROR(options_.store->SaveUpdate(shard.version(), shard.examples(), ptrs,
                                                      ranks, /*sync=*/true, rows.rows,
                                                      rows.deleted_rows));
  metrics_->checkpoint_seconds->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  metrics_->last_checkpoint_time->SetToCurrentTime();
  last_saved_version_ = shard.version();
  return Status::Ok();
}

bool Durability::LatchFailure(const Status& failure, const std::string& what) {
  metrics_->checkpoint_failures->Increment();
  if (failure_) return false;
  failure_ = "ps shard " + std::to_string(options_.shard_index) + ": the store in " +
             options_.store->dir() + " failed a durable write (" + what + ": " +
             failure.message() +
             "); no push is acknowledged any more: fix or free the disk, then restart "
             "this server";
  metrics_->store_failed->Set(1);
  spdlog::error("{}", *failure_);
  return true;
}

}  // namespace parasync
