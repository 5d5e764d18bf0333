// IDX files: the tensor format of MNIST and Fashion-MNIST. A big-endian header (two zero
// bytes, a type code, the number of dimensions, then one uint32 per dimension) followed by
// the elements, row-major. Only unsigned-byte tensors (type code 0x08) are supported, which
// covers images (magic 0x00000803, [n, rows, cols], or 0x00000804, [n, H, W, C] with channels
// last) and labels (0x00000801, [n]). The reader takes any number of dimensions; callers
// check the number they expect.
//
// Files may be gzip-compressed or not; the reader detects which. Plain functions and values;
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace parasync {

// An unsigned-byte tensor read from an IDX file.
struct IdxTensor {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}; at least one dimension
  std::vector<uint8_t> data;  // product(dims) bytes, row-major
};

// Reads the IDX file at `path`, gzip-compressed or not. On success returns its dimensions
// and bytes. Fails with NotFound (naming the path) if the file does not exist; with
// Corruption (naming the path, and for a size mismatch the expected and actual byte counts)
// if the magic is wrong, the type is not unsigned byte, a dimension is zero, the header or
// the data is shorter than promised, bytes follow the data, or the gzip stream is damaged;
// with Unavailable if the file exists but cannot be opened or read. Blocks on file I/O.
Result<IdxTensor> ReadIdxFile(const std::string& path);

}  // namespace parasync
