#include "common/file_util.h"

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace parasync {

Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::Unavailable("cannot write " + tmp);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) return Status::Unavailable("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::Unavailable("cannot rename " + tmp + " to " + path + ": " +
                               std::strerror(errno));
  }
  return Status::Ok();
}

Result<int> OpenForReading(const std::string& path, std::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) return fd;
  const int err = errno;
  if (err == ENOENT || err == ENOTDIR) {
    return Status::NotFound(std::string(what) + " " + path + " does not exist");
  }
  return Status::Unavailable("cannot open " + std::string(what) + " " + path + ": " +
                             std::strerror(err));
}

Status PathError(const std::string& message, const std::error_code& ec) {
  std::string m = message + ": " + ec.message();
  if (ec.category() == std::generic_category() || ec.category() == std::system_category()) {
    switch (ec.value()) {
      case EACCES:
      case EPERM:
      case EROFS:
      case ENOTDIR:
      case EEXIST:
      case ENOENT:
      case ENAMETOOLONG:
      case ELOOP:
      case EINVAL:
        return Status::FailedPrecondition(std::move(m));
      default:
        break;
    }
  }
  return Status::Unavailable(std::move(m));
}

}  // namespace parasync
