// StorageFaults: failures injected under a CheckpointStore at the filesystem layer, so tests
// (and parasync-ps started with PARASYNC_STORAGE_FAULTS) can see what a dying disk or a full
// one does to the parameter server. The store's RocksDB then runs on a wrapped FileSystem
// whose syncs and appends fail exactly as the real ones do (EIO, ENOSPC); nothing above the
// filesystem is told that the failures are made up.
//
// Thread safety: the fields are atomics; a test may change them at any time, also while the
// store writes, and the change applies to the next sync or append. One StorageFaults may be
// shared by several stores: they then draw on the same budgets.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>

#include "common/status.h"

namespace parasync {

struct StorageFaults {
  // Syncs (Sync, Fsync or RangeSync of any file of the store, and fsyncs of its directory)
  // that still succeed; after them every sync fails with an IOError (EIO), as on a disk that
  // lost the data it had cached. -1: never fail.
  std::atomic<int64_t> syncs_before_eio{-1};
  // Bytes that appends may still write; an append that does not fit writes what fits and
  // fails with NoSpace (ENOSPC), as on a full disk, and so does every append after it.
  // -1: unlimited.
  std::atomic<int64_t> space_left_bytes{-1};
};

// Parses "syncs_before_eio=N", "space_left_bytes=N" or both separated by a comma (the format
// of PARASYNC_STORAGE_FAULTS) into a new StorageFaults. InvalidArgument naming the part that
// is not one of these, or whose N is not an integer >= -1.
Result<std::shared_ptr<StorageFaults>> ParseStorageFaults(std::string_view spec);

// The environment variable through which a process-level test injects faults into
// parasync-ps's store.
inline constexpr char kStorageFaultsVariable[] = "PARASYNC_STORAGE_FAULTS";

// The faults PARASYNC_STORAGE_FAULTS asks for, parsed as ParseStorageFaults does; null when
// it is unset or empty. InvalidArgument, naming the variable, when it does not parse.
Result<std::shared_ptr<StorageFaults>> StorageFaultsFromEnvironment();

}  // namespace parasync
