// CheckpointStore: one parameter-server shard's durable state — the registered model, the
// version and example counts, every slice's values and optimizer slots, and the last push
// sequence number of each rank — in a RocksDB database in a directory of its own.
//
// Every write is one RocksDB WriteBatch, so a crash leaves the state before or after a write,
// never a mix. Every stored value carries a CRC-32C over its key and payload, checked on read.
// A directory is only ever used if it is empty, missing, or already holds the store of this
// very shard: anything else is refused, never overwritten.
//
// On-disk format "parasync-ps/1" (integers and floats little-endian; every value ends with a
// 4-byte CRC-32C of key + payload):
//   meta/format        "parasync-ps/1"
//   meta/shard         int32 shard, int32 num_shards
//   meta/registration  the ModelRegistration as a wire Header frame (common/wire.h)
//   meta/state         int64 version, int64 examples
//   slice/<8 hex id>   int64 updates, uint32 num_slots, uint64 n, n floats values,
//                      num_slots * n floats slots
//   rank/<8 hex rank>  uint64 last_seq [, int32 epoch, int64 done, int64 of: the rank's
//                      DataProgress, written since 0.2; a record without it reads as none]
//   row/<8 hex table>/<16 hex id>
//                      int64 updates, uint32 num_slots, uint32 dim, dim floats values,
//                      num_slots * dim floats slots (embedding rows, since 0.3; a store
//                      without tables has none, so older stores read as before)
//                      Tiered tables (--table-memory) keep here also the rows demoted
//                      from memory: row/ is then their cold tier.
//
// A store is verified before anything is written to it: Open() first opens it read-only and
// checks every table block (RocksDB's checksums), every record (ours), the WAL (damage
// anywhere but a torn last record is refused), the shard, the training mode and that no
// other process holds it, so a store refused for any of these keeps its files byte for byte
// as they were (names, sizes, contents and modification times; RocksDB's info LOG included).
//
// Failed writes: a write RocksDB refuses (ENOSPC on a full disk, EIO from an fsync, ...) is
// returned as Unavailable naming the cause, and the store is failed from then on: it keeps the
// first failure, and every later Save or SaveUpdate returns that same status at once without
// touching RocksDB (which has stopped writing anyway). What the caller was told was written is
// in the WAL; the failed write may or may not be there after a restart (see SaveUpdate). A
// full disk never aborts the process: RocksDB's info LOG drops its lines once it cannot write
// them (ps/store_file_system.h says why that matters).
//
// Thread safety: all methods may be called from any thread, also concurrently. Writes are
// applied whole and in some order; Load() reads one consistent point in time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/mode.h"
#include "common/model_spec.h"
#include "common/progress.h"
#include "common/status.h"
#include "ps/cold_tier.h"
#include "ps/row_snapshot.h"

namespace parasync {

struct StorageFaults;  // ps/storage_faults.h

// The name of the on-disk format this build reads and writes.
inline constexpr char kCheckpointFormat[] = "parasync-ps/1";

struct SliceSnapshot {
  uint32_t id = 0;
  int64_t updates = 0;  // optimizer steps applied to the slice (Adam's t)
  std::vector<float> values;
  std::vector<std::vector<float>> slots;  // optimizer slots, each values.size() long
  bool operator==(const SliceSnapshot&) const = default;
};

// The highest push sequence number applied for a rank, so a retried push is not applied
// twice after a restart, and where the rank was in its data with the updates stored, so a
// restarted worker goes on from there.
struct RankRecord {
  int32_t rank = 0;
  uint64_t last_seq = 0;
  DataProgress progress;
  bool operator==(const RankRecord&) const = default;
};

struct ShardSnapshot {
  ModelRegistration registration;
  int64_t version = 0;
  int64_t examples = 0;
  std::vector<SliceSnapshot> slices;  // every slice this shard holds, ascending id
  std::vector<RankRecord> ranks;      // ascending rank, at most one record per rank
  // Embedding rows. Load: every stored row, ascending (table, id). Save: the rows to write
  // (changed since the last save) — rows not named stay as stored, unless replace_rows.
  std::vector<RowSnapshot> rows;
  std::vector<RowKey> deleted_rows;  // Save: rows to remove (evicted since the last save)
  bool replace_rows = false;         // Save: drop every stored row first
  // Load without rows (tiered tables): the rows stored, by table; empty otherwise.
  std::vector<int64_t> stored_row_counts;
  bool operator==(const ShardSnapshot&) const = default;
};

class CheckpointStore : public ColdTier {
 public:
  // Opens the store in `dir` (created if missing or empty) for shard `shard` of `num_shards`
  // and returns it; blocks on disk I/O. Refuses — never touches — a directory that holds
  // anything else:
  //  - files but no parasync store: FailedPrecondition "<dir> is not a parasync-ps data
  //    directory (found <a file name>); refusing to touch it";
  //  - a store of another format, or of another shard index or shard count:
  //    FailedPrecondition naming both;
  //  - with `mode` given, a store whose registration was made in another training mode:
  //    InvalidArgument naming both (CheckStoredMode, common/mode.h);
  //  - a store RocksDB reports corrupt (a table block, the MANIFEST, CURRENT, a WAL record
  //    before the last one, an OPTIONS file RocksDB cannot parse), or with a record that fails
  //    its CRC or length check: Corruption naming the path and the file or key. Nothing in
  //    the directory is written, created or removed then. (Damage RocksDB has no checksum
  //    for is not seen: the info LOG and IDENTITY, which the store does not depend on.)
  //  - a path that cannot be made a directory for a reason no retry fixes (permission, a
  //    read-only file system, a file on the way, a place such as /proc): FailedPrecondition
  //    (common/file_util.h, PathError);
  // InvalidArgument unless 0 <= shard < num_shards; Unavailable on I/O errors, including a
  // store that another process holds open ("in use by process <pid>", found before anything
  // is written; one open in this process is refused by RocksDB, after its info LOG was
  // started) and a disk too full to open it on ("no space left on device: ...", which may
  // have started RocksDB's info LOG and manifest).
  // `faults`, when given, makes every file the store writes go through a filesystem that
  // fails syncs and appends as it says (ps/storage_faults.h); the store shares it. For tests.
  static Result<std::unique_ptr<CheckpointStore>> Open(
      const std::string& dir, int shard, int num_shards,
      std::shared_ptr<StorageFaults> faults = nullptr,
      const std::optional<TrainingMode>& mode = std::nullopt);

  // Closes the database. Every acknowledged write is already in the WAL, so nothing is lost
  // if closing fails. Precondition: no other call on this store is in progress.
  ~CheckpointStore() override;
  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  // Returns the latest snapshot: slices in ascending id, ranks in ascending rank. NotFound
  // when no Save() ever happened on this store; Corruption naming the key when a record fails
  // its CRC or its length check; FailedPrecondition when the registration was stored by
  // another wire protocol version; Unavailable on I/O errors. Blocks on disk I/O.
  // `with_rows` false (tiered tables, whose rows stay here): no rows, but their count by
  // table in stored_row_counts (each row still checked).
  Result<ShardSnapshot> Load(bool with_rows = true);

  // The cold tier of tiered embedding tables (ps/cold_tier.h): the stored rows. Read: each
  // key's stored row, or none. Write: the rows demoted, in one batch, in the WAL but not
  // synced (every-update durability syncs it with the update that follows; periodic
  // durability keeps them like a snapshot's rows, so a restart may find a demoted row newer
  // than the snapshot around it). Write fails like SaveUpdate, and latches the failure.
  Status Read(std::span<const RowKey> keys,
              std::vector<std::optional<RowSnapshot>>* out) override;
  Status Write(std::span<const RowSnapshot> rows) override;
  // Scan: reads (and checks) each record it lists; a damaged one is Corruption naming it.
  Status Scan(std::optional<RowKey> after, size_t limit, std::vector<Stamp>* out,
              bool* at_end) override;

  // Replaces the stored snapshot by `snap` in one atomic WriteBatch: slices and ranks absent
  // from `snap` are deleted. When `sync`, the WAL is fsynced before returning (durable
  // against power loss); otherwise the write survives a crash of this process only.
  // InvalidArgument (nothing written) when slices are not strictly ascending by id, a slot is
  // not values.size() long, a rank appears twice, or registration.num_shards differs from the
  // store's; Unavailable when the write fails ("no space left on device: <dir>: ..." or
  // "write failed: <dir>: ...") and, without trying, once the store has failed (failure()).
  // Blocks on disk I/O.
  Status Save(const ShardSnapshot& snap, bool sync);

  // Every-update durability: overwrites just `slices` (whole slices; the pointers are only
  // read during the call), version, examples and the records of `ranks`, in one atomic
  // WriteBatch, fsynced when `sync`. Other slices and ranks stay as they are.
  // FailedPrecondition when no Save() happened yet, in this process or an earlier one (the
  // registration is not stored); InvalidArgument (nothing written) for a null pointer or a
  // slot of the wrong length; Unavailable, as Save, when the write fails or the store has
  // failed. A write that failed in its fsync (EIO) reached RocksDB's WAL before the sync, so a
  // restart may show it although the caller was told it failed; one that failed in its append
  // (ENOSPC) is not shown. Blocks on disk I/O.
  // `rows` are written and `deleted_rows` removed in the same batch.
  Status SaveUpdate(int64_t version, int64_t examples,
                    const std::vector<const SliceSnapshot*>& slices,
                    const std::vector<RankRecord>& ranks, bool sync,
                    const std::vector<RowSnapshot>& rows = {},
                    const std::vector<RowKey>& deleted_rows = {});

  // Bytes the store takes on disk now: the sum of the sizes of the files in dir() (SST
  // files, WAL, manifest, logs). Best effort: files that vanish while counting are skipped.
  int64_t ApproximateBytes() const;

  // The directory given to Open().
  const std::string& dir() const { return dir_; }

  // The message of the first write that failed (what every write returns since), or nullopt
  // while every write has succeeded. Does not block on I/O.
  std::optional<std::string> failure() const;

 private:
  struct Rep;  // the RocksDB handle; only checkpoint_store.cc sees RocksDB
  CheckpointStore(std::string dir, int shard, int num_shards, std::unique_ptr<Rep> rep,
                  bool has_registration);

  // The status every write returns once the store has failed; ok while it has not.
  Status LatchedFailure() const;
  // Keeps `failure` as the store's failure unless one is kept already; returns it.
  Status Latch(Status failure);

  const std::string dir_;
  const int shard_;
  const int num_shards_;
  const std::unique_ptr<Rep> rep_;
  std::atomic<bool> has_registration_;  // a Save() happened, now or in an earlier process

  mutable std::mutex failure_mu_;
  std::optional<Status> failure_;  // guarded by failure_mu_; the first failed write
};

}  // namespace parasync
