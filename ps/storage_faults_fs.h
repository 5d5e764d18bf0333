// The RocksDB side of StorageFaults (ps/storage_faults.h): a FileSystem that forwards to
// another and fails its syncs and appends as the StorageFaults say. Only ps/ code that talks
// to RocksDB includes this header.
#pragma once

#include <rocksdb/file_system.h>

#include <memory>

#include "ps/storage_faults.h"

namespace parasync {

// Returns a FileSystem that does what `base` does, except that
//  - Sync, Fsync and RangeSync of a writable file and Fsync of a directory fail with an
//    IOError (EIO) once faults->syncs_before_eio is used up (each success counts it down);
//  - Append and PositionedAppend write only the bytes faults->space_left_bytes still allows
//    (counting it down) and fail with NoSpace (ENOSPC) when the data did not fit;
//  - GetFreeSpace reports at most faults->space_left_bytes;
//  - RocksDB's info LOG is one of the files written through it, as on a real disk.
// Files opened for reading are `base`'s own. Both arguments must be non-null; the result
// shares them. Thread-safe as `base` is.
std::shared_ptr<rocksdb::FileSystem> NewFaultInjectingFileSystem(
    std::shared_ptr<rocksdb::FileSystem> base, std::shared_ptr<StorageFaults> faults);

}  // namespace parasync
