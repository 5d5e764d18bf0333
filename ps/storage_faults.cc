#include "ps/storage_faults.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string>
#include <utility>

#include "ps/storage_faults_fs.h"

namespace parasync {

namespace {

// Takes one sync from the budget: false when the budget is used up and the sync must fail.
bool TakeSync(std::atomic<int64_t>& left) {
  int64_t n = left.load();
  while (true) {
    if (n < 0) return true;
    if (n == 0) return false;
    if (left.compare_exchange_weak(n, n - 1)) return true;
  }
}

// Takes up to `want` bytes from the budget and returns how many were granted.
uint64_t TakeSpace(std::atomic<int64_t>& left, uint64_t want) {
  int64_t n = left.load();
  while (true) {
    if (n < 0) return want;
    const uint64_t granted = std::min<uint64_t>(want, static_cast<uint64_t>(n));
    if (left.compare_exchange_weak(n, n - static_cast<int64_t>(granted))) return granted;
  }
}

rocksdb::IOStatus InjectedEio(const char* what, const std::string& fname) {
  return rocksdb::IOStatus::IOError(std::string("While ") + what + " file: " + fname,
                                    "Input/output error (injected by StorageFaults)");
}

// As RocksDB's POSIX filesystem reports ENOSPC: NoSpace, retryable.
rocksdb::IOStatus InjectedNoSpace(const std::string& fname) {
  rocksdb::IOStatus s = rocksdb::IOStatus::NoSpace(
      "While appending to file: " + fname, "No space left on device (injected by StorageFaults)");
  s.SetRetryable(true);
  return s;
}

class FaultyWritableFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FaultyWritableFile(std::unique_ptr<rocksdb::FSWritableFile> file, std::string fname,
                     std::shared_ptr<StorageFaults> faults)
      : FSWritableFileOwnerWrapper(std::move(file)),
        fname_(std::move(fname)),
        faults_(std::move(faults)) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
    const uint64_t granted = TakeSpace(faults_->space_left_bytes, data.size());
    if (granted == data.size()) return target()->Append(data, options, dbg);
    // A full disk writes what fits, then fails: the file may end in a torn record.
    if (granted > 0) {
      rocksdb::IOStatus s = target()->Append(rocksdb::Slice(data.data(), granted), options, dbg);
      if (!s.ok()) return s;
    }
    return InjectedNoSpace(fname_);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           const rocksdb::DataVerificationInfo& /*verification_info*/,
                           rocksdb::IODebugContext* dbg) override {
    return Append(data, options, dbg);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     rocksdb::IODebugContext* dbg) override {
    const uint64_t granted = TakeSpace(faults_->space_left_bytes, data.size());
    if (granted == data.size()) return target()->PositionedAppend(data, offset, options, dbg);
    if (granted > 0) {
      rocksdb::IOStatus s = target()->PositionedAppend(rocksdb::Slice(data.data(), granted),
                                                       offset, options, dbg);
      if (!s.ok()) return s;
    }
    return InjectedNoSpace(fname_);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     const rocksdb::DataVerificationInfo& /*verification_info*/,
                                     rocksdb::IODebugContext* dbg) override {
    return PositionedAppend(data, offset, options, dbg);
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
    if (!TakeSync(faults_->syncs_before_eio)) return InjectedEio("syncing", fname_);
    return target()->Sync(options, dbg);
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    if (!TakeSync(faults_->syncs_before_eio)) return InjectedEio("fsyncing", fname_);
    return target()->Fsync(options, dbg);
  }
  rocksdb::IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const rocksdb::IOOptions& options,
                              rocksdb::IODebugContext* dbg) override {
    if (!TakeSync(faults_->syncs_before_eio)) return InjectedEio("range-syncing", fname_);
    return target()->RangeSync(offset, nbytes, options, dbg);
  }

 private:
  const std::string fname_;
  const std::shared_ptr<StorageFaults> faults_;
};

class FaultyDirectory : public rocksdb::FSDirectoryWrapper {
 public:
  FaultyDirectory(std::unique_ptr<rocksdb::FSDirectory> dir, std::string name,
                  std::shared_ptr<StorageFaults> faults)
      : FSDirectoryWrapper(std::move(dir)), name_(std::move(name)), faults_(std::move(faults)) {}

  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    if (!TakeSync(faults_->syncs_before_eio)) return InjectedEio("fsyncing directory", name_);
    return FSDirectoryWrapper::Fsync(options, dbg);
  }
  rocksdb::IOStatus FsyncWithDirOptions(const rocksdb::IOOptions& options,
                                        rocksdb::IODebugContext* dbg,
                                        const rocksdb::DirFsyncOptions& dir_options) override {
    if (!TakeSync(faults_->syncs_before_eio)) return InjectedEio("fsyncing directory", name_);
    return FSDirectoryWrapper::FsyncWithDirOptions(options, dbg, dir_options);
  }

 private:
  const std::string name_;
  const std::shared_ptr<StorageFaults> faults_;
};

class FaultInjectingFileSystem : public rocksdb::FileSystemWrapper {
 public:
  FaultInjectingFileSystem(std::shared_ptr<rocksdb::FileSystem> base,
                           std::shared_ptr<StorageFaults> faults)
      : FileSystemWrapper(base), faults_(std::move(faults)) {}

  static const char* kClassName() { return "ParasyncFaultInjectingFileSystem"; }
  const char* Name() const override { return kClassName(); }

  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    return Wrap(fname, target()->NewWritableFile(fname, options, result, dbg), result);
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& fname,
                                       const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override {
    return Wrap(fname, target()->ReopenWritableFile(fname, options, result, dbg), result);
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& fname, const std::string& old_fname,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override {
    return Wrap(fname, target()->ReuseWritableFile(fname, old_fname, options, result, dbg),
                result);
  }
  rocksdb::IOStatus NewDirectory(const std::string& name, const rocksdb::IOOptions& options,
                                 std::unique_ptr<rocksdb::FSDirectory>* result,
                                 rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewDirectory(name, options, result, dbg);
    if (s.ok()) *result = std::make_unique<FaultyDirectory>(std::move(*result), name, faults_);
    return s;
  }
  // RocksDB's info LOG is written through a FileSystem of its own choosing unless the
  // FileSystem in use makes it: FileSystem's own NewLogger opens the file with this->
  // NewWritableFile, so the LOG fills the disk and fails as every other file does.
  rocksdb::IOStatus NewLogger(const std::string& fname, const rocksdb::IOOptions& options,
                              std::shared_ptr<rocksdb::Logger>* result,
                              rocksdb::IODebugContext* dbg) override {
    return FileSystem::NewLogger(fname, options, result, dbg);
  }
  rocksdb::IOStatus GetFreeSpace(const std::string& path, const rocksdb::IOOptions& options,
                                 uint64_t* diskfree, rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->GetFreeSpace(path, options, diskfree, dbg);
    const int64_t left = faults_->space_left_bytes.load();
    if (s.ok() && left >= 0) *diskfree = std::min(*diskfree, static_cast<uint64_t>(left));
    return s;
  }

 private:
  rocksdb::IOStatus Wrap(const std::string& fname, rocksdb::IOStatus s,
                         std::unique_ptr<rocksdb::FSWritableFile>* result) {
    if (s.ok()) *result = std::make_unique<FaultyWritableFile>(std::move(*result), fname, faults_);
    return s;
  }

  const std::shared_ptr<StorageFaults> faults_;
};

}  // namespace

std::shared_ptr<rocksdb::FileSystem> NewFaultInjectingFileSystem(
    std::shared_ptr<rocksdb::FileSystem> base, std::shared_ptr<StorageFaults> faults) {
  return std::make_shared<FaultInjectingFileSystem>(std::move(base), std::move(faults));
}

Result<std::shared_ptr<StorageFaults>> ParseStorageFaults(std::string_view spec) {
  auto faults = std::make_shared<StorageFaults>();
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    const std::string_view part = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    const size_t eq = part.find('=');
    const std::string_view name = part.substr(0, eq);
    std::atomic<int64_t>* field = nullptr;
    if (name == "syncs_before_eio") field = &faults->syncs_before_eio;
    if (name == "space_left_bytes") field = &faults->space_left_bytes;
    int64_t n = 0;
    const std::string_view number =
        eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1);
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), n);
    if (field == nullptr || number.empty() || ec != std::errc() ||
        end != number.data() + number.size() || n < -1) {
      return Status::InvalidArgument(
          "storage fault '" + std::string(part) +
          "' is not syncs_before_eio=N or space_left_bytes=N with an integer N >= -1");
    }
    field->store(n);
  }
  return faults;
}

Result<std::shared_ptr<StorageFaults>> StorageFaultsFromEnvironment() {
  const char* spec = std::getenv(kStorageFaultsVariable);
  if (spec == nullptr || *spec == '\0') return std::shared_ptr<StorageFaults>();
  Result<std::shared_ptr<StorageFaults>> faults = ParseStorageFaults(spec);
  if (!faults.ok()) return faults.status().WithContext(kStorageFaultsVariable);
  return faults;
}

}  // namespace parasync
