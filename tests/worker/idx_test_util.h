// Test helpers for the worker data tests: a scratch directory and IDX file writers.
// Not thread-safe; each test owns its TempDir.
#pragma once

#include <stdlib.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace parasync::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/parasync_test_XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Empty if the directory could not be created.
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The bytes of an unsigned-byte IDX file with `dims` and `data` (data may be shorter or
// longer than the dims promise, to build damaged files).
inline std::vector<uint8_t> IdxBytes(const std::vector<uint32_t>& dims,
                                     const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    out.push_back(static_cast<uint8_t>(d >> 24));
    out.push_back(static_cast<uint8_t>(d >> 16));
    out.push_back(static_cast<uint8_t>(d >> 8));
    out.push_back(static_cast<uint8_t>(d));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Writes `bytes` to `path`, gzip-compressed when `gzip`. Returns false on failure.
inline bool WriteFile(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    if (f == nullptr) return false;
    const int n = bytes.empty() ? 0
                                : gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    const bool ok = gzclose(f) == Z_OK && n == static_cast<int>(bytes.size());
    return ok;
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const size_t n = std::fwrite(bytes.data(), 1, bytes.size(), f);
  return std::fclose(f) == 0 && n == bytes.size();
}

}  // namespace parasync::testing
