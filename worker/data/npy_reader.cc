#include "worker/data/npy_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>

#include "common/file_util.h"

namespace parasync {

// The array bytes are handed out as the file stores them, little-endian; readers memcpy
// elements out, which is only right on a little-endian host.
static_assert(std::endian::native == std::endian::little, "npy_reader assumes little-endian");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
// magic, major and minor version bytes
constexpr size_t kPrefixBytes = kMagicBytes + 2;
// NumPy itself refuses headers over 10000 bytes by default; anything near this is corrupt.
constexpr uint32_t kMaxHeaderBytes = 1u << 20;
// No array we can hold in memory is larger; a shape that says so is corrupt.
constexpr int64_t kMaxDataBytes = int64_t{1} << 40;
// Tuples inside tuples (structured dtypes) nest a little; a header nesting deeper is corrupt.
constexpr int kMaxNesting = 16;

struct DtypeInfo {
  NpyDtype dtype;
  std::string_view descr;  // little-endian form, as np.save writes it
  size_t size;
  bool integer;
};

constexpr DtypeInfo kDtypes[] = {
    {NpyDtype::kInt8, "|i1", 1, true},     {NpyDtype::kUint8, "|u1", 1, true},
    {NpyDtype::kInt16, "<i2", 2, true},    {NpyDtype::kUint16, "<u2", 2, true},
    {NpyDtype::kInt32, "<i4", 4, true},    {NpyDtype::kUint32, "<u4", 4, true},
    {NpyDtype::kInt64, "<i8", 8, true},    {NpyDtype::kUint64, "<u8", 8, true},
    {NpyDtype::kFloat32, "<f4", 4, false}, {NpyDtype::kFloat64, "<f8", 8, false},
};

const DtypeInfo& Info(NpyDtype dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return info;
  }
  std::abort();  // every enumerator has a row
}

// A value of the subset of Python literals that .npy headers use.
struct PyValue {
  enum class Kind { kString, kInt, kBool, kNone, kSequence };
  Kind kind = Kind::kNone;
  std::string str;
  int64_t integer = 0;
  bool boolean = false;
  std::vector<PyValue> items;  // of a tuple or list
};

using PyDict = std::vector<std::pair<std::string, PyValue>>;

// Parses the header dict: string keys; string, int, True/False/None, tuple and list values.
// Hand-written because the header is a Python literal, not JSON (single quotes, tuples,
// trailing commas, "3L" from Python 2).
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  // Parses "{key: value, ...}" followed by nothing but whitespace into *out. On failure
  // returns false and error() says what was expected where.
  bool ParseDict(PyDict* out) {
    SkipSpace();
    if (!Consume('{')) return Fail("expected '{'");
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      std::string key;
      if (!ParseString(&key)) return false;
      SkipSpace();
      if (!Consume(':')) return Fail("expected ':'");
      PyValue value;
      if (!ParseValue(&value, 0)) return false;
      out->emplace_back(std::move(key), std::move(value));
      SkipSpace();
      if (Consume('}')) break;
      if (!Consume(',')) return Fail("expected ',' or '}'");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Fail("unexpected text after the dict");
    return true;
  }

  const std::string& error() const { return error_; }

 private:
  bool ParseValue(PyValue* out, int depth) {
    SkipSpace();
    if (pos_ >= text_.size()) return Fail("expected a value");
    const char c = text_[pos_];
    if (c == '\'' || c == '"') {
      out->kind = PyValue::Kind::kString;
      return ParseString(&out->str);
    }
    if (c == '(' || c == '[') {
      if (depth >= kMaxNesting) return Fail("nesting too deep");
      const char close = c == '(' ? ')' : ']';
      ++pos_;
      out->kind = PyValue::Kind::kSequence;
      while (true) {
        SkipSpace();
        if (Consume(close)) return true;
        PyValue item;
        if (!ParseValue(&item, depth + 1)) return false;
        out->items.push_back(std::move(item));
        SkipSpace();
        if (Consume(close)) return true;
        if (!Consume(',')) return Fail(std::string("expected ',' or '") + close + "'");
      }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      out->kind = PyValue::Kind::kInt;
      return ParseInt(&out->integer);
    }
    for (const auto& [word, kind, boolean] :
         {std::tuple{std::string_view("True"), PyValue::Kind::kBool, true},
          std::tuple{std::string_view("False"), PyValue::Kind::kBool, false},
          std::tuple{std::string_view("None"), PyValue::Kind::kNone, false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        out->kind = kind;
        out->boolean = boolean;
        return true;
      }
    }
    return Fail("expected a value");
  }

  bool ParseString(std::string* out) {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Fail("expected a quoted string");
    }
    const char quote = text_[pos_++];
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) ++pos_;
      out->push_back(text_[pos_++]);
    }
    if (!Consume(quote)) return Fail("unterminated string");
    return true;
  }

  bool ParseInt(int64_t* out) {
    const bool negative = Consume('-');
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') {
      return Fail("expected a digit");
    }
    int64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const int digit = text_[pos_++] - '0';
      if (v > (INT64_MAX - digit) / 10) return Fail("integer too large");
      v = v * 10 + digit;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'L' || text_[pos_] == 'l')) ++pos_;
    *out = negative ? -v : v;
    return true;
  }

  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  bool Fail(const std::string& what) {
    error_ = what + " at offset " + std::to_string(pos_);
    return false;
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::string error_;
};

// Maps a descr string to a dtype; refuses byte orders and kinds we do not read.
Status ParseDescr(const std::string& path, const std::string& descr, NpyDtype* dtype) {
  std::string_view kind = descr;
  char order = '=';
  if (!kind.empty() && (kind[0] == '<' || kind[0] == '>' || kind[0] == '|' || kind[0] == '=')) {
    order = kind[0];
    kind.remove_prefix(1);
  }
  for (const DtypeInfo& info : kDtypes) {
    if (kind != info.descr.substr(1)) continue;
    if (order == '>' && info.size > 1) {
      return Status::NotSupported("NumPy file " + path + " has big-endian dtype '" + descr +
                                  "'; save it little-endian, e.g. a.astype('" +
                                  std::string(info.descr) + "')");
    }
    *dtype = info.dtype;
    return Status::Ok();
  }
  std::string supported;
  for (const DtypeInfo& info : kDtypes) supported += " " + std::string(info.descr);
  return Status::NotSupported("NumPy file " + path + " has dtype '" + descr +
                              "'; supported:" + supported);
}

// Reads up to n bytes, stopping early only at the end of the file; stores the count in *got.
Status ReadUpTo(int fd, const std::string& path, uint8_t* dst, size_t n, size_t* got) {
  *got = 0;
  while (*got < n) {
    const ssize_t r = ::read(fd, dst + *got, n - *got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::Unavailable("reading NumPy file " + path + ": " + std::strerror(errno));
    }
    if (r == 0) break;
    *got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

Status Truncated(const std::string& path, size_t needed, size_t have) {
  return Status::Corruption("NumPy file " + path + " is truncated: the header needs " +
                            std::to_string(needed) + " bytes, the file has " +
                            std::to_string(have));
}

}  // namespace

size_t NpyItemSize(NpyDtype dtype) { return Info(dtype).size; }

std::string_view NpyDescr(NpyDtype dtype) { return Info(dtype).descr; }

bool NpyIsInteger(NpyDtype dtype) { return Info(dtype).integer; }

std::string NpyShapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  return s + (shape.size() == 1 ? ",)" : ")");
}

int64_t NpyArray::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// Reads the magic, the version and the header text of the open NumPy file `fd`; sets
// *data_start to where the data begins.
Status ReadHeaderText(int fd, const std::string& path, std::string* header, size_t* data_start) {
  // Magic, version, header length: 10 bytes in version 1, 12 in versions 2 and 3.
  uint8_t pre[12];
  size_t got = 0;
  PARASYNC_RETURN_IF_ERROR(ReadUpTo(fd, path, pre, kPrefixBytes, &got));
  if (std::memcmp(pre, kMagic, std::min(got, kMagicBytes)) != 0) {
    char hex[2 * kMagicBytes + 1] = {};
    for (size_t i = 0; i < std::min(got, kMagicBytes); ++i) {
      std::snprintf(hex + 2 * i, 3, "%02x", pre[i]);
    }
    const bool zip = got >= 2 && pre[0] == 'P' && pre[1] == 'K';
    return Status::Corruption("NumPy file " + path + " has bad magic 0x" + hex +
                              " (expected 0x934e554d5059, \"\\x93NUMPY\")" +
                              (zip ? "; it is a zip archive (.npz?): save each array with "
                                     "np.save"
                                   : ""));
  }
  if (got < kPrefixBytes) return Truncated(path, kPrefixBytes + 2, got);
  const int major = pre[kMagicBytes];
  const int minor = pre[kMagicBytes + 1];
  if (major < 1 || major > 3 || minor != 0) {
    return Status::NotSupported("NumPy file " + path + " has format version " +
                                std::to_string(major) + "." + std::to_string(minor) +
                                "; supported: 1.0, 2.0, 3.0");
  }
  const size_t len_bytes = major == 1 ? 2 : 4;
  PARASYNC_RETURN_IF_ERROR(ReadUpTo(fd, path, pre + kPrefixBytes, len_bytes, &got));
  if (got < len_bytes) return Truncated(path, kPrefixBytes + len_bytes, kPrefixBytes + got);
  uint32_t header_len = 0;
  for (size_t i = len_bytes; i > 0; --i) header_len = (header_len << 8) | pre[kPrefixBytes + i - 1];
  if (header_len > kMaxHeaderBytes) {
    return Status::Corruption("NumPy file " + path + " declares a " +
                              std::to_string(header_len) + "-byte header; at most " +
                              std::to_string(kMaxHeaderBytes) + " is plausible");
  }
  *data_start = kPrefixBytes + len_bytes + header_len;
  header->assign(header_len, '\0');
  PARASYNC_RETURN_IF_ERROR(
      ReadUpTo(fd, path, reinterpret_cast<uint8_t*>(header->data()), header_len, &got));
  if (got < header_len) return Truncated(path, *data_start, kPrefixBytes + len_bytes + got);
  return Status::Ok();
}

// The header dictionary's three entries, pointing into it.
struct HeaderFields {
  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
};

// Finds descr, fortran_order and shape in `dict` (no other key) and checks their kinds.
Status FindHeaderFields(const std::string& path, const PyDict& dict, HeaderFields* fields) {
  for (const auto& [key, value] : dict) {
    const PyValue** slot = key == "descr"           ? &fields->descr
                           : key == "fortran_order" ? &fields->fortran
                           : key == "shape"         ? &fields->shape
                                                    : nullptr;
    if (slot == nullptr) {
      return Status::Corruption("NumPy file " + path + ": the header has unexpected key '" +
                                key + "'");
    }
    *slot = &value;
  }
  for (const auto& [value, key] : {std::pair{fields->descr, "descr"},
                                   std::pair{fields->fortran, "fortran_order"},
                                   std::pair{fields->shape, "shape"}}) {
    if (value == nullptr) {
      return Status::Corruption("NumPy file " + path + ": the header lacks '" + key + "'");
    }
  }
  if (fields->descr->kind != PyValue::Kind::kString) {
    return Status::NotSupported("NumPy file " + path +
                                " has a structured dtype; only plain numeric arrays are read");
  }
  if (fields->fortran->kind != PyValue::Kind::kBool) {
    return Status::Corruption("NumPy file " + path + ": 'fortran_order' is not True or False");
  }
  if (fields->shape->kind != PyValue::Kind::kSequence) {
    return Status::Corruption("NumPy file " + path + ": 'shape' is not a tuple");
  }
  return Status::Ok();
}

// Sets array->shape from the header's fields and *data_bytes to the size it promises
// (array->dtype set already).
Status TakeShape(const std::string& path, const HeaderFields& fields, NpyArray* array,
                 int64_t* data_bytes) {
  *data_bytes = static_cast<int64_t>(NpyItemSize(array->dtype));
  int non_trivial = 0;
  for (const PyValue& d : fields.shape->items) {
    if (d.kind != PyValue::Kind::kInt || d.integer < 0) {
      return Status::Corruption("NumPy file " + path +
                                ": 'shape' holds something other than sizes >= 0");
    }
    if (d.integer > 0 && *data_bytes > kMaxDataBytes / d.integer) {
      return Status::Corruption("NumPy file " + path + " declares more than " +
                                std::to_string(kMaxDataBytes) + " data bytes");
    }
    *data_bytes *= d.integer;
    if (d.integer > 1) ++non_trivial;
    array->shape.push_back(d.integer);
  }
  // With at most one dimension longer than 1, Fortran and C order lay out the same bytes.
  if (fields.fortran->boolean && non_trivial > 1) {
    return Status::NotSupported("NumPy file " + path + " of shape " +
                                NpyShapeString(array->shape) +
                                " is in Fortran order; save np.ascontiguousarray(a) instead");
  }
  return Status::Ok();
}

}  // namespace

Result<NpyArray> ReadNpyFile(const std::string& path) {
  PARASYNC_ASSIGN_OR_RETURN(const int fd, OpenForReading(path, "NumPy file"));
  FdCloser closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return Status::Unavailable("cannot stat NumPy file " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument("NumPy file " + path + " is not a regular file");
  }
  const size_t file_bytes = static_cast<size_t>(st.st_size);
  std::string header;
  size_t data_start = 0;
  PARASYNC_RETURN_IF_ERROR(ReadHeaderText(fd, path, &header, &data_start));

  PyDict dict;
  HeaderParser parser(header);
  if (!parser.ParseDict(&dict)) {
    return Status::Corruption("NumPy file " + path + ": the header does not parse: " +
                              parser.error());
  }
  HeaderFields fields;
  PARASYNC_RETURN_IF_ERROR(FindHeaderFields(path, dict, &fields));
  NpyArray array;
  PARASYNC_RETURN_IF_ERROR(ParseDescr(path, fields.descr->str, &array.dtype));
  int64_t data_bytes = 0;
  PARASYNC_RETURN_IF_ERROR(TakeShape(path, fields, &array, &data_bytes));
  const size_t expected = static_cast<size_t>(data_bytes);
  const size_t actual = file_bytes >= data_start ? file_bytes - data_start : 0;
  if (actual != expected) {
    return Status::Corruption("NumPy file " + path + ": the header promises " +
                              std::to_string(expected) + " data bytes (shape " +
                              NpyShapeString(array.shape) + " of " + fields.descr->str +
                              "), the file has " + std::to_string(actual));
  }
  array.data.resize(expected);
  size_t got = 0;
  PARASYNC_RETURN_IF_ERROR(ReadUpTo(fd, path, array.data.data(), expected, &got));
  if (got != expected) {  // the file shrank while we read it
    return Status::Corruption("NumPy file " + path + ": the header promises " +
                              std::to_string(expected) + " data bytes, the file has " +
                              std::to_string(got));
  }
  return array;
}

}  // namespace parasync
