#include "worker/data/idx_reader.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "common/file_util.h"

namespace parasync {

namespace {

constexpr uint8_t kTypeUnsignedByte = 0x08;
// Bytes requested per gzread call; also how far the buffer grows ahead of the data read so
// far, so a header that promises far more than the file holds is not allocated up front.
constexpr size_t kChunkBytes = size_t{16} << 20;
constexpr unsigned kGzBufferBytes = 1u << 18;
// No IDX file we can hold in memory is larger; a header that says so is corrupt.
constexpr int64_t kMaxElements = int64_t{1} << 36;

struct GzFileCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFilePtr = std::unique_ptr<gzFile_s, GzFileCloser>;

// Reads up to `n` bytes into `dst`, stopping early only at the end of the file; stores the
// count in *got. gzread reads plain files as they are and inflates gzip ones.
Status ReadUpTo(gzFile f, const std::string& path, uint8_t* dst, size_t n, size_t* got) {
  *got = 0;
  while (*got < n) {
    const unsigned want = static_cast<unsigned>(std::min(n - *got, kChunkBytes));
    const int r = gzread(f, dst + *got, want);
    if (r < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      if (errnum == Z_ERRNO) {
        return Status::Unavailable("reading IDX file " + path + ": " + std::strerror(errno));
      }
      return Status::Corruption("IDX file " + path + ": damaged gzip stream after " +
                                std::to_string(*got) + " bytes: " + msg);
    }
    if (r == 0) break;
    *got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

}  // namespace

Result<IdxTensor> ReadIdxFile(const std::string& path) {
  PARASYNC_ASSIGN_OR_RETURN(const int fd, OpenForReading(path, "IDX file"));
  GzFilePtr file(gzdopen(fd, "rb"));
  if (file == nullptr) {
    ::close(fd);
    return Status::Unavailable("cannot open IDX file " + path + " for reading");
  }
  gzbuffer(file.get(), kGzBufferBytes);

  uint8_t magic[4];
  size_t got = 0;
  PARASYNC_RETURN_IF_ERROR(ReadUpTo(file.get(), path, magic, sizeof(magic), &got));
  if (got < sizeof(magic)) {
    return Status::Corruption("IDX file " + path + " is truncated: the header needs 4 bytes, " +
                              "the file has " + std::to_string(got));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%02x%02x%02x%02x", magic[0], magic[1], magic[2],
                  magic[3]);
    return Status::Corruption("IDX file " + path + " has bad magic " + hex +
                              " (expected 0x0000TTNN: type TT, NN dimensions)");
  }
  if (magic[2] != kTypeUnsignedByte) {
    return Status::Corruption("IDX file " + path + " has element type code " +
                              std::to_string(magic[2]) + "; only 8 (unsigned byte) is supported");
  }
  const size_t ndims = magic[3];
  if (ndims == 0) return Status::Corruption("IDX file " + path + " declares zero dimensions");

  uint8_t dim_bytes[4 * 255];
  PARASYNC_RETURN_IF_ERROR(ReadUpTo(file.get(), path, dim_bytes, 4 * ndims, &got));
  if (got < 4 * ndims) {
    return Status::Corruption("IDX file " + path + " is truncated: the header needs " +
                              std::to_string(4 + 4 * ndims) + " bytes, the file has " +
                              std::to_string(4 + got));
  }
  IdxTensor tensor;
  tensor.dims.resize(ndims);
  int64_t elements = 1;
  for (size_t d = 0; d < ndims; ++d) {
    const uint8_t* b = dim_bytes + 4 * d;
    const int64_t dim = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) |
                        int64_t{b[3]};
    if (dim == 0) {
      return Status::Corruption("IDX file " + path + " has dimension " + std::to_string(d) +
                                " of size zero");
    }
    if (elements > kMaxElements / dim) {
      return Status::Corruption("IDX file " + path + " declares more than " +
                                std::to_string(kMaxElements) + " elements");
    }
    elements *= dim;
    tensor.dims[d] = dim;
  }

  // Grow the buffer as data arrives rather than trusting the header's size up front.
  const size_t expected = static_cast<size_t>(elements);
  size_t have = 0;
  while (have < expected) {
    const size_t step = std::min(expected - have, kChunkBytes);
    tensor.data.resize(have + step);
    PARASYNC_RETURN_IF_ERROR(ReadUpTo(file.get(), path, tensor.data.data() + have, step, &got));
    have += got;
    if (got < step) break;
  }
  if (have < expected) {
    return Status::Corruption("IDX file " + path + " is truncated: the header promises " +
                              std::to_string(expected) + " data bytes, the file has " +
                              std::to_string(have));
  }
  uint8_t extra = 0;
  PARASYNC_RETURN_IF_ERROR(ReadUpTo(file.get(), path, &extra, 1, &got));
  if (got != 0) {
    return Status::Corruption("IDX file " + path + " has bytes after the " +
                              std::to_string(expected) + " data bytes its header promises");
  }
  return tensor;
}

}  // namespace parasync
