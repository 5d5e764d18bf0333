// The FileSystem a CheckpointStore's RocksDB runs on: the given one, except that RocksDB's
// info LOG never reports a failed write. Only ps/ code that talks to RocksDB includes this.
//
// Why: RocksDB 7.8 writes the info LOG through a WritableFileWriter and ignores its errors.
// After one failed write (ENOSPC on a full disk) the writer is marked as having seen an
// error, and the next line logged calls WritableFileWriter::Append on it, which in a build
// with assertions (Debian's librocksdb) fails `assert(sync_without_flush_called_)` in
// WritableFileWriter::AssertFalseAndGetStatusForPrevError (file/writable_file_writer.h:312)
// and aborts the process. The line that trips it is typically ErrorHandler logging the very
// write error that the caller was about to get back as a Status.
#pragma once

#include <rocksdb/file_system.h>

#include <memory>

namespace parasync {

// Returns a FileSystem that forwards everything to `base`, except that the info LOG (the
// file NewLogger opens) swallows its write errors: once a write of it fails, that write and
// every later one is dropped and reported as done, so RocksDB's logger never reaches the
// failed-writer assertion. The data files are not affected: their errors reach RocksDB and
// the caller as before. `base` must be non-null; the result shares it.
std::shared_ptr<rocksdb::FileSystem> NewStoreFileSystem(std::shared_ptr<rocksdb::FileSystem> base);

}  // namespace parasync
