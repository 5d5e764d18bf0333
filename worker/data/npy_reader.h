// NumPy .npy files, as np.save writes them: the magic "\x93NUMPY", a format version (1.0,
// 2.0 or 3.0), a little-endian header length, a header that is a Python dict literal
// ({'descr': '<f4', 'fortran_order': False, 'shape': (60000, 784), }), then the elements.
// Only plain numeric dtypes in little-endian (or single-byte) order and C order are read;
// structured, object, string, big-endian and Fortran-order arrays are refused. Specification:
// https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
//
// Plain functions and values; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace parasync {

// The element types ReadNpyFile accepts.
enum class NpyDtype : uint8_t {
  kInt8,     // '|i1'
  kUint8,    // '|u1'
  kInt16,    // '<i2'
  kUint16,   // '<u2'
  kInt32,    // '<i4'
  kUint32,   // '<u4'
  kInt64,    // '<i8'
  kUint64,   // '<u8'
  kFloat32,  // '<f4'
  kFloat64,  // '<f8'
};

// The size in bytes of one element of `dtype`.
size_t NpyItemSize(NpyDtype dtype);

// NumPy's little-endian descr of `dtype`, e.g. "<f4" or "|u1", for messages.
std::string_view NpyDescr(NpyDtype dtype);

// True for the integer dtypes, false for float32 and float64.
bool NpyIsInteger(NpyDtype dtype);

// `shape` as Python prints a tuple, e.g. "(60000, 784)", "(10,)" or "()", for messages.
std::string NpyShapeString(const std::vector<int64_t>& shape);

// An array read from a .npy file. The bytes are kept as the file has them (little-endian,
// C order); read element i of type T with std::memcpy from data.data() + i * sizeof(T) on a
// little-endian host.
struct NpyArray {
  NpyDtype dtype = NpyDtype::kUint8;
  std::vector<int64_t> shape;  // empty for a 0-d array; a dimension may be zero
  std::vector<uint8_t> data;   // NumElements() * NpyItemSize(dtype) bytes

  // The product of shape (1 for a 0-d array).
  int64_t NumElements() const;
};

// Reads the .npy file at `path`. On success returns its dtype, shape and bytes. Fails with
// NotFound (naming the path) if the file does not exist; Corruption (one line naming the
// path) if the magic is wrong, the header is truncated, does not parse or lacks one of
// 'descr', 'fortran_order' and 'shape', or the data is shorter or longer than the shape
// promises (the message gives expected and actual bytes); NotSupported for a format version
// other than 1, 2 or 3, a dtype outside NpyDtype, a big-endian dtype, or a Fortran-order
// array of more than one non-trivial dimension; InvalidArgument if `path` is not a regular
// file; Unavailable if it cannot be opened or read. Blocks on file I/O.
Result<NpyArray> ReadNpyFile(const std::string& path);

}  // namespace parasync
