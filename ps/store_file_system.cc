#include "ps/store_file_system.h"

#include <atomic>
#include <string>
#include <utility>

namespace parasync {

namespace {

// A file whose write errors are dropped: after the first failure nothing more is written, so
// the LOG ends with whole lines that were written before the disk filled, never a hole.
class InfoLogFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  explicit InfoLogFile(std::unique_ptr<rocksdb::FSWritableFile> file)
      : FSWritableFileOwnerWrapper(std::move(file)) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
    return Swallow([&] { return target()->Append(data, options, dbg); });
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           const rocksdb::DataVerificationInfo& info,
                           rocksdb::IODebugContext* dbg) override {
    return Swallow([&] { return target()->Append(data, options, info, dbg); });
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     rocksdb::IODebugContext* dbg) override {
    return Swallow([&] { return target()->PositionedAppend(data, offset, options, dbg); });
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     const rocksdb::DataVerificationInfo& info,
                                     rocksdb::IODebugContext* dbg) override {
    return Swallow([&] { return target()->PositionedAppend(data, offset, options, info, dbg); });
  }
  rocksdb::IOStatus Truncate(uint64_t size, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
    return Swallow([&] { return target()->Truncate(size, options, dbg); });
  }
  rocksdb::IOStatus Flush(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    return Swallow([&] { return target()->Flush(options, dbg); });
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
    return Swallow([&] { return target()->Sync(options, dbg); });
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    return Swallow([&] { return target()->Fsync(options, dbg); });
  }
  rocksdb::IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const rocksdb::IOOptions& options,
                              rocksdb::IODebugContext* dbg) override {
    return Swallow([&] { return target()->RangeSync(offset, nbytes, options, dbg); });
  }
  rocksdb::IOStatus Close(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    // Always closed, so the descriptor is released; a failure loses only log lines.
    target()->Close(options, dbg).PermitUncheckedError();
    return rocksdb::IOStatus::OK();
  }

 private:
  template <typename F>
  rocksdb::IOStatus Swallow(F&& write) {
    if (!failed_.load()) {
      rocksdb::IOStatus s = write();
      if (!s.ok()) failed_.store(true);
    }
    return rocksdb::IOStatus::OK();
  }

  std::atomic<bool> failed_{false};
};

// Opens every writable file as an InfoLogFile; used only to make the LOG.
class InfoLogFileSystem : public rocksdb::FileSystemWrapper {
 public:
  explicit InfoLogFileSystem(const std::shared_ptr<rocksdb::FileSystem>& base)
      : FileSystemWrapper(base) {}

  static const char* kClassName() { return "ParasyncInfoLogFileSystem"; }
  const char* Name() const override { return kClassName(); }

  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewWritableFile(fname, options, result, dbg);
    if (s.ok()) *result = std::make_unique<InfoLogFile>(std::move(*result));
    return s;
  }
  // FileSystem's own NewLogger: RocksDB's EnvLogger over this->NewWritableFile.
  rocksdb::IOStatus NewLogger(const std::string& fname, const rocksdb::IOOptions& options,
                              std::shared_ptr<rocksdb::Logger>* result,
                              rocksdb::IODebugContext* dbg) override {
    return FileSystem::NewLogger(fname, options, result, dbg);
  }
};

class StoreFileSystem : public rocksdb::FileSystemWrapper {
 public:
  explicit StoreFileSystem(const std::shared_ptr<rocksdb::FileSystem>& base)
      : FileSystemWrapper(base), info_log_fs_(std::make_shared<InfoLogFileSystem>(base)) {}

  static const char* kClassName() { return "ParasyncStoreFileSystem"; }
  const char* Name() const override { return kClassName(); }

  rocksdb::IOStatus NewLogger(const std::string& fname, const rocksdb::IOOptions& options,
                              std::shared_ptr<rocksdb::Logger>* result,
                              rocksdb::IODebugContext* dbg) override {
    return info_log_fs_->NewLogger(fname, options, result, dbg);
  }

 private:
  const std::shared_ptr<InfoLogFileSystem> info_log_fs_;
};

}  // namespace

std::shared_ptr<rocksdb::FileSystem> NewStoreFileSystem(std::shared_ptr<rocksdb::FileSystem> base) {
  return std::make_shared<StoreFileSystem>(std::move(base));
}

}  // namespace parasync
