// What a directory holds, file by file — name, size, modification time and a hash of the
// content — to prove that a refused store was left byte for byte as it was: no file written,
// created, removed, renamed or touched. Test-only code.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace parasync::testing {

struct FileImage {
  int64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t hash = 0;  // FNV-1a 64 of the content
  bool operator==(const FileImage&) const = default;
};

// The files directly in `dir`, by name, and the directory itself as "." (its mtime moves when
// an entry is created, removed or renamed, even if it was put back). Empty for a directory
// that cannot be read.
inline std::map<std::string, FileImage> DirImage(const std::string& dir) {
  std::map<std::string, FileImage> image;
  auto add = [&](const std::string& name, const std::filesystem::path& path) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return;
    FileImage& f = image[name];
    f.size = static_cast<int64_t>(st.st_size);
    f.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    if (!S_ISREG(st.st_mode)) return;
    std::ifstream in(path, std::ios::binary);
    uint64_t h = 14695981039346656037ull;
    for (char buffer[65536]; in.read(buffer, sizeof(buffer)) || in.gcount() > 0;) {
      for (std::streamsize i = 0; i < in.gcount(); ++i) {
        h = (h ^ static_cast<unsigned char>(buffer[i])) * 1099511628211ull;
      }
    }
    f.hash = h;
  };
  std::error_code ec;
  add(".", dir);
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    add(entry.path().filename().string(), entry.path());
  }
  return image;
}

// The names whose image differs between `before` and `after` (added, removed or changed), for
// a failure message; empty when they are the same.
inline std::string DirChanges(const std::map<std::string, FileImage>& before,
                              const std::map<std::string, FileImage>& after) {
  std::string changes;
  auto note = [&](const std::string& name, const char* what) {
    changes += (changes.empty() ? "" : ", ") + name + " " + what;
  };
  for (const auto& [name, image] : before) {
    auto it = after.find(name);
    if (it == after.end()) {
      note(name, "removed");
    } else if (!(it->second == image)) {
      note(name, it->second.hash != image.hash || it->second.size != image.size
                     ? "rewritten"
                     : "touched (mtime)");
    }
  }
  for (const auto& [name, image] : after) {
    if (!before.contains(name)) note(name, "created");
  }
  return changes;
}

}  // namespace parasync::testing
