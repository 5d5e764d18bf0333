#include "ps/checkpoint_store.h"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/snapshot.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/options_util.h>
#include <rocksdb/write_batch.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <mutex>
#include <span>
#include <string_view>
#include <system_error>
#include <utility>

#include "common/file_util.h"
#include "common/wire.h"
#include "ps/storage_faults.h"
#include "ps/storage_faults_fs.h"
#include "ps/store_file_system.h"

namespace parasync {

// Integers and floats are stored as the host's raw bytes, so the format is little-endian only on a
// little-endian host.
static_assert(std::endian::native == std::endian::little,
              "the checkpoint format stores raw little-endian bytes");
static_assert(sizeof(float) == 4);

namespace {

namespace fs = std::filesystem;

constexpr char kFormatKey[] = "meta/format";
constexpr char kShardKey[] = "meta/shard";
constexpr char kRegistrationKey[] = "meta/registration";
constexpr char kStateKey[] = "meta/state";
// Prefixes and their exclusive upper bounds ('0' follows '/').
constexpr char kSlicePrefix[] = "slice/";
constexpr char kSliceEnd[] = "slice0";
constexpr char kRankPrefix[] = "rank/";
constexpr char kRankEnd[] = "rank0";
constexpr char kRowPrefix[] = "row/";
constexpr char kRowEnd[] = "row0";

constexpr size_t kCrcBytes = 4;
// int64 updates, uint32 num_slots, uint64 n.
constexpr size_t kSliceHeaderBytes = 8 + 4 + 8;
// RocksDB refuses values of 4 GiB and more; refuse them first, with a clearer message.
constexpr uint64_t kMaxValueBytes = std::numeric_limits<uint32_t>::max() - 64;

// ---- CRC-32C (Castagnoli), slicing-by-8 ---------------------------------------------------------

using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

constexpr CrcTables MakeCrcTables() {
  CrcTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[0][i] = c;
  }
  for (size_t i = 0; i < 256; ++i) {
    for (size_t k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
  }
  return t;
}

constexpr CrcTables kCrcTables = MakeCrcTables();

// Continues a CRC-32C (`crc` = the CRC of what came before, 0 at the start) over [p, p+n).
uint32_t Crc32cExtend(uint32_t crc, const char* p, size_t n) {
  const auto& t = kCrcTables;
  uint32_t c = ~crc;
  while (n >= 8) {
    uint32_t lo = 0;
    uint32_t hi = 0;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  for (; n > 0; --n, ++p) c = t[0][(c ^ static_cast<uint8_t>(*p)) & 0xFFu] ^ (c >> 8);
  return ~c;
}

// The CRC a record carries: over its key, then its payload parts.
uint32_t RecordCrc(std::string_view key, const rocksdb::Slice* parts, size_t num_parts) {
  uint32_t crc = Crc32cExtend(0, key.data(), key.size());
  for (size_t i = 0; i < num_parts; ++i) crc = Crc32cExtend(crc, parts[i].data(), parts[i].size());
  return crc;
}

// ---- Encoding -----------------------------------------------------------------------------------

template <typename T>
void Append(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out->append(buf, sizeof(T));
}

// A small payload plus its CRC, ready for WriteBatch::Put.
std::string SealedValue(std::string_view key, std::string payload) {
  rocksdb::Slice part(payload);
  Append<uint32_t>(&payload, RecordCrc(key, &part, 1));
  return payload;
}

// Appends `n`'s low 4 * digits bits as `digits` lowercase hex digits.
void AppendHex(std::string* out, uint64_t n, int digits) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4) {
    out->push_back(kHex[(n >> shift) & 0xFu]);
  }
}

// The value of `text`, lowercase hex digits only (at most 16); false if it is anything else.
bool ParseHex(std::string_view text, uint64_t* n) {
  uint64_t v = 0;
  for (char ch : text) {
    const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    if (d < 0) return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *n = v;
  return true;
}

std::string HexKey(const char* prefix, uint32_t n) {
  std::string key(prefix);
  AppendHex(&key, n, 8);
  return key;
}

std::string SliceKey(uint32_t id) { return HexKey(kSlicePrefix, id); }
std::string RankKey(int32_t rank) { return HexKey(kRankPrefix, static_cast<uint32_t>(rank)); }

// Parses the 8 hex digits after `prefix` in `key`; false if they are not exactly that.
bool ParseHexKey(std::string_view key, std::string_view prefix, uint32_t* n) {
  if (key.size() != prefix.size() + 8 || key.substr(0, prefix.size()) != prefix) return false;
  uint64_t v = 0;
  if (!ParseHex(key.substr(prefix.size()), &v)) return false;
  *n = static_cast<uint32_t>(v);
  return true;
}

// `s` as a short printable string for error messages.
std::string Printable(std::string_view s) {
  constexpr size_t kMax = 40;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xFu]);
    }
  }
  if (s.size() > kMax) out += "...";
  return out;
}

// ---- Decoding -----------------------------------------------------------------------------------

// Reads fixed-size fields from a record's payload; every Get fails rather than read past it.
class Reader {
 public:
  explicit Reader(std::string_view payload) : rest_(payload) {}

  template <typename T>
  bool Get(T* v) {
    if (rest_.size() < sizeof(T)) return false;
    std::memcpy(v, rest_.data(), sizeof(T));
    rest_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetFloats(size_t n, std::vector<float>* out) {
    if (rest_.size() / sizeof(float) < n) return false;
    out->resize(n);
    if (n > 0) std::memcpy(out->data(), rest_.data(), n * sizeof(float));
    rest_.remove_prefix(n * sizeof(float));
    return true;
  }
  size_t left() const { return rest_.size(); }

 private:
  std::string_view rest_;
};

Status BadRecord(std::string_view key, std::string_view why) {
  return Status::Corruption("checkpoint record " + std::string(key) + " " + std::string(why));
}

// Checks the CRC that ends `value` and returns the payload before it.
Result<std::string_view> Unseal(std::string_view key, std::string_view value) {
  if (value.size() < kCrcBytes) return BadRecord(key, "is shorter than its checksum");
  std::string_view payload = value.substr(0, value.size() - kCrcBytes);
  uint32_t stored = 0;
  std::memcpy(&stored, value.data() + payload.size(), kCrcBytes);
  rocksdb::Slice part(payload.data(), payload.size());
  if (RecordCrc(key, &part, 1) != stored) return BadRecord(key, "fails its CRC-32C check");
  return payload;
}

// ---- RocksDB status and exceptions --------------------------------------------------------------

Status FromRocks(const rocksdb::Status& s, const std::string& context) {
  if (s.ok()) return Status::Ok();
  std::string m = context + ": RocksDB: " + s.ToString();
  if (s.IsCorruption()) return Status::Corruption(std::move(m));
  if (s.IsNotFound()) return Status::NotFound(std::move(m));
  if (s.IsIOError() || s.IsBusy() || s.IsTryAgain() || s.IsTimedOut() || s.IsIncomplete()) {
    return Status::Unavailable(std::move(m));
  }
  if (s.IsNotSupported()) return Status::NotSupported(std::move(m));
  if (s.IsInvalidArgument()) return Status::InvalidArgument(std::move(m));
  if (s.IsAborted()) return Status::Aborted(std::move(m));
  return Status::Internal(std::move(m));
}

// The Status for a write RocksDB refused: Unavailable, naming the cause first, since it is
// what an operator must act on.
Status WriteFailed(const rocksdb::Status& s, const std::string& dir) {
  std::string cause = s.IsNoSpace() ? "no space left on device" : "write failed";
  return Status::Unavailable(cause + ": checkpoint store " + dir + ": RocksDB: " + s.ToString());
}

// Runs `f`, turning any exception (RocksDB's, std::bad_alloc, filesystem) into a Status.
template <typename F>
auto Guarded(const std::string& context, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return Status::Internal(context + ": " + e.what());
  } catch (...) {
    return Status::Internal(context + ": unknown exception");
  }
}

rocksdb::Options StoreOptions() {
  rocksdb::Options options;
  options.paranoid_checks = true;
  options.write_buffer_size = size_t{8} << 20;
  options.compression = rocksdb::kNoCompression;  // float payloads barely compress
  options.keep_log_file_num = 4;                  // RocksDB's LOG files, not the WAL
  // A crash may leave a torn last WAL record: that is dropped (it was never acknowledged in
  // every-update mode, whose writes are synced before the reply). Damage anywhere else in
  // the WAL is corruption and the store is refused — the default point-in-time recovery
  // would instead silently restore an older state.
  options.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  // Bloom filters, in every table file and over the memtable, so that a lookup of a key the
  // store does not have (a tiered table's new id: docs/embeddings.md, Tiers) costs a few hash
  // probes instead of a memtable search and a block read per level: a tiered run's cold reads
  // went from 10.9 to 3.8 us each. 10 bits a key (about 1% false positives). Like the
  // indexes, a table file's filter is held in memory while the file is open, outside the
  // block cache: kept in the cache (bounded), the same run was about 0.7x as fast.
  rocksdb::BlockBasedTableOptions table;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.whole_key_filtering = true;
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  options.memtable_whole_key_filtering = true;
  options.memtable_prefix_bloom_size_ratio = 0.1;
  return options;
}

// ---- Opening ------------------------------------------------------------------------------------

// The info log of the read-only look at a store, which must not create, rename or write the
// LOG file: it keeps only the last warning in memory, because RocksDB names the damaged file
// there and not always in the Status (a bad WAL record: "<file>: dropping N bytes; ...").
class LastWarningLogger : public rocksdb::Logger {
 public:
  LastWarningLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}

  void Logv(const char* /*format*/, va_list /*ap*/) override {}
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < rocksdb::InfoLogLevel::WARN_LEVEL) return;
    char line[512];
    std::vsnprintf(line, sizeof(line), format, ap);
    std::lock_guard<std::mutex> lock(mu_);
    last_warning_ = line;
  }

  std::string last_warning() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_warning_;
  }

 private:
  mutable std::mutex mu_;
  std::string last_warning_;  // guarded by mu_
};

enum class DirState { kEmpty, kDatabase };

// The nearest directory above `dir` that exists (where creating `dir` has to start).
std::string NearestExistingParent(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  while (p.has_parent_path() && p != p.parent_path()) {
    p = p.parent_path();
    if (fs::exists(p, ec)) break;
  }
  return p.string();
}

// Creates `dir` if missing; says whether it is empty or holds a RocksDB database; refuses anything
// else. A path that cannot be used for a reason no retry can fix (PathError) is
// FailedPrecondition, anything else Unavailable.
Result<DirState> InspectDir(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return PathError("cannot use " + dir, ec);
  }
  if (!fs::exists(st)) {
    fs::create_directories(dir, ec);
    // ENOENT with every parent there: a file system that holds no directories of ours (/proc).
    if (ec == std::errc::no_such_file_or_directory) {
      return PathError("cannot create " + dir + " (no directory can be made in " +
                           NearestExistingParent(dir) + ")",
                       ec);
    }
    if (ec) return PathError("cannot create " + dir, ec);
    return DirState::kEmpty;
  }
  if (!fs::is_directory(st)) {
    return Status::FailedPrecondition(dir + " is not a directory; refusing to touch it");
  }
  std::vector<std::string> names;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) return PathError("cannot list " + dir, ec);
  if (names.empty()) return DirState::kEmpty;
  // RocksDB names the live manifest in CURRENT; every database has one.
  if (std::find(names.begin(), names.end(), "CURRENT") != names.end()) {
    return DirState::kDatabase;
  }
  std::sort(names.begin(), names.end());
  return Status::FailedPrecondition(dir + " is not a parasync-ps data directory (found " +
                                    names.front() + "); refusing to touch it");
}

std::string ShardValue(int shard, int num_shards) {
  std::string payload;
  Append<int32_t>(&payload, static_cast<int32_t>(shard));
  Append<int32_t>(&payload, static_cast<int32_t>(num_shards));
  return SealedValue(kShardKey, std::move(payload));
}

// Checks the meta records of an opened database against this build and this shard. Returns false
// for a database that holds no keys at all (a creation that crashed before its first write), true
// for a store of this shard.
Result<bool> CheckMeta(rocksdb::DB* db, const std::string& dir, int shard, int num_shards) {
  rocksdb::ReadOptions ro;
  std::string value;
  rocksdb::Status s = db->Get(ro, kFormatKey, &value);
  if (s.IsNotFound()) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
    it->SeekToFirst();
    if (!it->status().ok()) return FromRocks(it->status(), dir);
    if (!it->Valid()) return false;
    return Status::FailedPrecondition(dir +
                                      " is not a parasync-ps data directory (found a RocksDB "
                                      "database without " +
                                      kFormatKey + ", first key '" +
                                      Printable(it->key().ToStringView()) +
                                      "'); refusing to touch it");
  }
  if (!s.ok()) return FromRocks(s, dir);
  // Any other format — a later version may not even carry our CRC — is refused by name, not
  // reported as damage.
  if (value != SealedValue(kFormatKey, kCheckpointFormat)) {
    Result<std::string_view> payload = Unseal(kFormatKey, value);
    return Status::FailedPrecondition(dir + " holds a checkpoint store of format '" +
                                      Printable(payload.ok() ? *payload : std::string_view(value)) +
                                      "', this build reads '" + kCheckpointFormat +
                                      "'; refusing to touch it");
  }

  s = db->Get(ro, kShardKey, &value);
  if (s.IsNotFound()) return Status::Corruption(dir + ": checkpoint record meta/shard is missing");
  if (!s.ok()) return FromRocks(s, dir);
  Result<std::string_view> payload = Unseal(kShardKey, value);
  if (!payload.ok()) return payload.status().WithContext(dir);
  Reader r(*payload);
  int32_t have_shard = 0;
  int32_t have_num_shards = 0;
  if (!r.Get(&have_shard) || !r.Get(&have_num_shards) || r.left() != 0) {
    return BadRecord(kShardKey, "has the wrong length").WithContext(dir);
  }
  if (have_shard != shard || have_num_shards != num_shards) {
    return Status::FailedPrecondition(
        dir + " holds the checkpoint of shard " + std::to_string(have_shard) + " of " +
        std::to_string(have_num_shards) + "; refusing to open it as shard " +
        std::to_string(shard) + " of " + std::to_string(num_shards));
  }
  return true;
}

// ---- Records ------------------------------------------------------------------------------------

Status CheckSlice(const SliceSnapshot& slice) {
  for (const std::vector<float>& slot : slice.slots) {
    if (slot.size() != slice.values.size()) {
      return Status::InvalidArgument("slice " + std::to_string(slice.id) + " has a slot of " +
                                     std::to_string(slot.size()) + " elements, not " +
                                     std::to_string(slice.values.size()));
    }
  }
  const uint64_t bytes =
      static_cast<uint64_t>(slice.values.size()) * sizeof(float) * (slice.slots.size() + 1);
  if (bytes > kMaxValueBytes - kSliceHeaderBytes) {
    return Status::InvalidArgument("slice " + std::to_string(slice.id) +
                                   " is too large for one checkpoint record (" +
                                   std::to_string(bytes) + " bytes)");
  }
  return Status::Ok();
}

// Adds the record of `slice` to `batch` without copying its floats first: RocksDB gathers the parts
// straight into the batch. Precondition: CheckSlice(slice) ok.
rocksdb::Status PutSlice(const SliceSnapshot& slice, rocksdb::WriteBatch* batch) {
  const std::string key = SliceKey(slice.id);
  std::string header;
  Append<int64_t>(&header, slice.updates);
  Append<uint32_t>(&header, static_cast<uint32_t>(slice.slots.size()));
  Append<uint64_t>(&header, static_cast<uint64_t>(slice.values.size()));
  auto floats = [](const std::vector<float>& v) {
    return rocksdb::Slice(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  std::vector<rocksdb::Slice> parts;
  parts.reserve(slice.slots.size() + 3);
  parts.emplace_back(header);
  parts.push_back(floats(slice.values));
  for (const std::vector<float>& slot : slice.slots) parts.push_back(floats(slot));
  std::string crc;
  Append<uint32_t>(&crc, RecordCrc(key, parts.data(), parts.size()));
  parts.emplace_back(crc);
  rocksdb::Slice key_slice(key);
  return batch->Put(rocksdb::SliceParts(&key_slice, 1),
                    rocksdb::SliceParts(parts.data(), static_cast<int>(parts.size())));
}

Result<SliceSnapshot> DecodeSlice(std::string_view key, std::string_view value) {
  SliceSnapshot slice;
  if (!ParseHexKey(key, kSlicePrefix, &slice.id)) return BadRecord(key, "has a malformed key");
  PARASYNC_ASSIGN_OR_RETURN(std::string_view payload, Unseal(key, value));
  Reader r(payload);
  uint32_t num_slots = 0;
  uint64_t n = 0;
  if (!r.Get(&slice.updates) || !r.Get(&num_slots) || !r.Get(&n)) {
    return BadRecord(key, "is truncated");
  }
  // Exact length before any allocation, so a damaged count cannot ask for huge vectors.
  const uint64_t floats = r.left() / sizeof(float);
  if (r.left() % sizeof(float) != 0 || floats % (uint64_t{num_slots} + 1) != 0 ||
      floats / (uint64_t{num_slots} + 1) != n) {
    return BadRecord(key, "has the wrong length for " + std::to_string(n) + " elements and " +
                              std::to_string(num_slots) + " slots");
  }
  r.GetFloats(n, &slice.values);
  slice.slots.resize(num_slots);
  for (std::vector<float>& slot : slice.slots) r.GetFloats(n, &slot);
  return slice;
}

// "row/" + the table in 8 hex digits + "/" + the id in 16.
std::string RowKeyString(uint32_t table, uint64_t id) {
  std::string key(kRowPrefix);
  AppendHex(&key, table, 8);
  key.push_back('/');
  AppendHex(&key, id, 16);
  return key;
}

bool ParseRowKey(std::string_view key, RowKey* out) {
  constexpr size_t kPrefix = sizeof(kRowPrefix) - 1;
  constexpr size_t kLength = kPrefix + 8 + 1 + 16;
  if (key.size() != kLength || key.substr(0, kPrefix) != kRowPrefix || key[kPrefix + 8] != '/') {
    return false;
  }
  uint64_t table = 0;
  uint64_t id = 0;
  if (!ParseHex(key.substr(kPrefix, 8), &table) || !ParseHex(key.substr(kLength - 16), &id)) {
    return false;
  }
  *out = {static_cast<uint32_t>(table), id};
  return true;
}

Status CheckRow(const RowSnapshot& row) {
  for (const std::vector<float>& slot : row.slots) {
    if (slot.size() != row.values.size()) {
      return Status::InvalidArgument("row " + std::to_string(row.id) + " of table " +
                                     std::to_string(row.table) + " has a slot of the wrong size");
    }
  }
  return Status::Ok();
}

std::string RowValue(const RowSnapshot& row) {
  std::string payload;
  Append<int64_t>(&payload, row.updates);
  Append<uint32_t>(&payload, static_cast<uint32_t>(row.slots.size()));
  Append<uint32_t>(&payload, static_cast<uint32_t>(row.values.size()));
  auto floats = [&](const std::vector<float>& v) {
    payload.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  floats(row.values);
  for (const std::vector<float>& slot : row.slots) floats(slot);
  // Only rows of tables that expire carry the stamp: without expiry the record is as before.
  if (row.touched != 0) Append<int64_t>(&payload, row.touched);
  return SealedValue(RowKeyString(row.table, row.id), std::move(payload));
}

// A row record opened and checked (key, CRC, header, length, stamp): its header, its
// floats still to read from `floats`, and its expiry stamp (0: none).
struct RowRecord {
  RowKey key;
  int64_t updates = 0;
  uint32_t num_slots = 0;
  uint32_t dim = 0;
  int64_t touched = 0;
  std::string_view floats;  // (num_slots + 1) * dim floats
};

Result<RowRecord> OpenRow(std::string_view key, std::string_view value) {
  RowRecord rec;
  if (!ParseRowKey(key, &rec.key)) return BadRecord(key, "has a malformed key");
  PARASYNC_ASSIGN_OR_RETURN(std::string_view payload, Unseal(key, value));
  Reader r(payload);
  if (!r.Get(&rec.updates) || !r.Get(&rec.num_slots) || !r.Get(&rec.dim)) {
    return BadRecord(key, "is truncated");
  }
  const uint64_t floats = (uint64_t{rec.num_slots} + 1) * rec.dim * sizeof(float);
  const size_t header = payload.size() - r.left();
  if (r.left() != floats && r.left() != floats + sizeof(int64_t)) {
    return BadRecord(key, "has the wrong length for " + std::to_string(rec.dim) +
                              " columns and " + std::to_string(rec.num_slots) + " slots");
  }
  rec.floats = payload.substr(header, floats);
  // Only rows of tables that expire carry the stamp, after the floats.
  if (r.left() > floats) {
    std::memcpy(&rec.touched, payload.data() + header + floats, sizeof(int64_t));
    if (rec.touched == 0) return BadRecord(key, "has a zero expiry stamp");
  }
  return rec;
}

Result<RowSnapshot> DecodeRow(std::string_view key, std::string_view value) {
  PARASYNC_ASSIGN_OR_RETURN(const RowRecord rec, OpenRow(key, value));
  RowSnapshot row;
  row.table = rec.key.table;
  row.id = rec.key.id;
  row.updates = rec.updates;
  row.touched = rec.touched;
  Reader r(rec.floats);
  r.GetFloats(rec.dim, &row.values);
  row.slots.resize(rec.num_slots);
  for (std::vector<float>& slot : row.slots) r.GetFloats(rec.dim, &slot);
  return row;
}

// Adds the puts of `rows` and the deletes of `deleted` to `batch`.
Status PutRows(std::span<const RowSnapshot> rows, std::span<const RowKey> deleted,
               rocksdb::WriteBatch* batch, const std::string& dir) {
  for (const RowKey& k : deleted) {
    PARASYNC_RETURN_IF_ERROR(FromRocks(batch->Delete(RowKeyString(k.table, k.id)), dir));
  }
  for (const RowSnapshot& row : rows) {
    PARASYNC_RETURN_IF_ERROR(FromRocks(batch->Put(RowKeyString(row.table, row.id), RowValue(row)), dir));
  }
  return Status::Ok();
}

// Reads every stored row into *rows, or, with `counts` given, only counts them by table (each
// still checked).
Status ReadRows(rocksdb::DB* db, rocksdb::ReadOptions ro, std::vector<RowSnapshot>* rows,
                std::vector<int64_t>* counts = nullptr) {
  const rocksdb::Slice row_end(kRowEnd);
  ro.iterate_upper_bound = &row_end;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
  for (it->Seek(kRowPrefix); it->Valid(); it->Next()) {
    Result<RowSnapshot> row = DecodeRow(it->key().ToStringView(), it->value().ToStringView());
    if (!row.ok()) return row.status();
    if (counts == nullptr) {
      rows->push_back(std::move(*row));
      continue;
    }
    if (counts->size() <= row->table) counts->resize(row->table + 1, 0);
    ++(*counts)[row->table];
  }
  return FromRocks(it->status(), "");
}

std::string StateValue(int64_t version, int64_t examples) {
  std::string payload;
  Append<int64_t>(&payload, version);
  Append<int64_t>(&payload, examples);
  return SealedValue(kStateKey, std::move(payload));
}

std::string RankValue(const RankRecord& rank) {
  std::string payload;
  Append<uint64_t>(&payload, rank.last_seq);
  if (!rank.progress.empty()) {
    Append<int32_t>(&payload, rank.progress.epoch);
    Append<int64_t>(&payload, rank.progress.done);
    Append<int64_t>(&payload, rank.progress.of);
  }
  return SealedValue(RankKey(rank.rank), std::move(payload));
}

std::string RegistrationValue(const ModelRegistration& reg) {
  Header header;
  header.type = MsgType::kRegister;
  header.registration = reg;
  const std::vector<uint8_t> bytes = EncodeHeader(header);
  return SealedValue(kRegistrationKey,
                     std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

Result<ModelRegistration> DecodeRegistration(std::string_view value) {
  PARASYNC_ASSIGN_OR_RETURN(std::string_view payload, Unseal(kRegistrationKey, value));
  Result<Header> header = DecodeHeader(payload.data(), payload.size());
  if (!header.ok()) return BadRecord(kRegistrationKey, header.status().message());
  if (header->protocol_version != kProtocolVersion) {
    return Status::FailedPrecondition(
        "the checkpoint's registration was written by wire protocol " +
        std::to_string(header->protocol_version) + ", this build speaks " +
        std::to_string(kProtocolVersion));
  }
  if (!header->registration) return BadRecord(kRegistrationKey, "holds no registration");
  return std::move(*header->registration);
}

// Reads the snapshot stored in `db` as Load() does, checking every record.
Result<ShardSnapshot> ReadSnapshot(rocksdb::DB* db, const std::string& dir, bool with_rows = true) {
  // One snapshot for every read, so a concurrent Save is seen whole or not at all.
  rocksdb::ManagedSnapshot snapshot(db);
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot.snapshot();
  ro.fill_cache = false;  // read once at start-up

  ShardSnapshot snap;
  std::string value;
  rocksdb::Status s = db->Get(ro, kRegistrationKey, &value);
  if (s.IsNotFound()) return Status::NotFound("no checkpoint was ever saved in " + dir);
  PARASYNC_RETURN_IF_ERROR(FromRocks(s, dir));
  Result<ModelRegistration> reg = DecodeRegistration(value);
  if (!reg.ok()) return reg.status().WithContext(dir);
  snap.registration = std::move(*reg);

  s = db->Get(ro, kStateKey, &value);
  if (s.IsNotFound()) return BadRecord(kStateKey, "is missing").WithContext(dir);
  PARASYNC_RETURN_IF_ERROR(FromRocks(s, dir));
  Result<std::string_view> state = Unseal(kStateKey, value);
  if (!state.ok()) return state.status().WithContext(dir);
  Reader r(*state);
  if (!r.Get(&snap.version) || !r.Get(&snap.examples) || r.left() != 0) {
    return BadRecord(kStateKey, "has the wrong length").WithContext(dir);
  }

  // Keys are fixed-width lowercase hex, so byte order is ascending id.
  const rocksdb::Slice slice_end(kSliceEnd);
  ro.iterate_upper_bound = &slice_end;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
  for (it->Seek(kSlicePrefix); it->Valid(); it->Next()) {
    Result<SliceSnapshot> slice =
        DecodeSlice(it->key().ToStringView(), it->value().ToStringView());
    if (!slice.ok()) return slice.status().WithContext(dir);
    snap.slices.push_back(std::move(*slice));
  }
  PARASYNC_RETURN_IF_ERROR(FromRocks(it->status(), dir));

  const rocksdb::Slice rank_end(kRankEnd);
  ro.iterate_upper_bound = &rank_end;
  it.reset(db->NewIterator(ro));
  for (it->Seek(kRankPrefix); it->Valid(); it->Next()) {
    const std::string_view key = it->key().ToStringView();
    RankRecord rank;
    uint32_t bits = 0;
    if (!ParseHexKey(key, kRankPrefix, &bits))
      return BadRecord(key, "has a malformed key").WithContext(dir);
    rank.rank = static_cast<int32_t>(bits);
    Result<std::string_view> payload = Unseal(key, it->value().ToStringView());
    if (!payload.ok()) return payload.status().WithContext(dir);
    Reader rr(*payload);
    // Without its DataProgress (stored before 0.2, or none recorded): only last_seq.
    const bool with_progress = rr.left() > sizeof(uint64_t);
    if (!rr.Get(&rank.last_seq) ||
        (with_progress && (!rr.Get(&rank.progress.epoch) || !rr.Get(&rank.progress.done) ||
                           !rr.Get(&rank.progress.of))) ||
        rr.left() != 0) {
      return BadRecord(key, "has the wrong length").WithContext(dir);
    }
    snap.ranks.push_back(rank);
  }
  PARASYNC_RETURN_IF_ERROR(FromRocks(it->status(), dir));
  // Key order puts negative ranks last.
  std::sort(snap.ranks.begin(), snap.ranks.end(),
            [](const RankRecord& a, const RankRecord& b) { return a.rank < b.rank; });
  PARASYNC_RETURN_IF_ERROR(
      ReadRows(db, ro, &snap.rows, with_rows ? nullptr : &snap.stored_row_counts).WithContext(dir));
  if (!with_rows) snap.stored_row_counts.resize(snap.registration.tables.size(), 0);
  return snap;
}

// A database opened for this shard, and whether it holds a registration.
struct OpenedDb {
  std::unique_ptr<rocksdb::Env> env;  // the fault-injecting one, or null for the default
  std::unique_ptr<rocksdb::DB> db;    // declared after env: closed before it goes
  bool has_registration = false;
};

// Checks, on the store opened read-only, everything that the writable open and Load() rely on:
// every block of every table file against RocksDB's checksums, every record against ours,
// that its registration was made in `mode` (when given), and that RocksDB can parse its
// OPTIONS file. Corruption naming the path and the damaged file or record; FailedPrecondition
// for a registration of another wire protocol version; InvalidArgument for another mode.
Status VerifyStore(rocksdb::DB* db, rocksdb::Env* env, const std::string& dir,
                   const std::optional<TrainingMode>& mode) {
  PARASYNC_RETURN_IF_ERROR(FromRocks(db->VerifyChecksum(), dir));
  Result<ShardSnapshot> snap = ReadSnapshot(db, dir);
  if (!snap.ok() && snap.status().code() != StatusCode::kNotFound) return snap.status();
  if (snap.ok() && mode) {
    PARASYNC_RETURN_IF_ERROR(CheckStoredMode(snap->registration.mode, *mode, dir));
  }
  // RocksDB never reads the OPTIONS file back (our options come from code), and the writable
  // open replaces it; a file it cannot parse is still a sign of damage not to write over. A
  // flip it can still parse is harmless and cannot be seen: the file has no checksum.
  std::string options_file;
  rocksdb::Status s = rocksdb::GetLatestOptionsFileName(dir, env, &options_file);
  if (s.IsNotFound()) return Status::Ok();
  PARASYNC_RETURN_IF_ERROR(FromRocks(s, dir));
  rocksdb::ConfigOptions config;
  config.env = env;
  config.ignore_unknown_options = false;
  rocksdb::DBOptions db_options;
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  const std::string path = dir + "/" + options_file;
  s = rocksdb::LoadOptionsFromFile(config, path, &db_options, &families);
  if (!s.ok()) return Status::Corruption(path + " is damaged: RocksDB: " + s.ToString());
  return Status::Ok();
}

// Unavailable when another process holds the store's LOCK (a running server), found by asking,
// not by taking it: RocksDB's writable open starts a new info LOG (renaming the holder's)
// before it tries the lock. Ok when nobody does, or there is no LOCK file yet.
Status CheckNotLockedElsewhere(const std::string& dir) {
  const std::string path = dir + "/LOCK";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Ok();  // none yet; or unreadable, which the open will report
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;  // the whole file, as RocksDB locks it
  const int got = ::fcntl(fd, F_GETLK, &probe);
  ::close(fd);
  if (got != 0 || probe.l_type == F_UNLCK) return Status::Ok();
  return Status::Unavailable(dir + " is in use by process " + std::to_string(probe.l_pid) +
                             " (it holds " + path + ")");
}

// CheckpointStore::Open without its argument checks and exception guard.
Result<OpenedDb> OpenDb(const std::string& dir, int shard, int num_shards,
                        std::shared_ptr<StorageFaults> faults,
                        const std::optional<TrainingMode>& mode) {
  PARASYNC_ASSIGN_OR_RETURN(const DirState state, InspectDir(dir));
  OpenedDb opened;
  std::shared_ptr<rocksdb::FileSystem> file_system = rocksdb::FileSystem::Default();
  if (faults) file_system = NewFaultInjectingFileSystem(file_system, std::move(faults));
  opened.env = rocksdb::NewCompositeEnv(NewStoreFileSystem(std::move(file_system)));
  rocksdb::Options options = StoreOptions();
  options.env = opened.env.get();
  bool fresh = state == DirState::kEmpty;
  if (!fresh) {
    // A store a running server holds is not read at all (it may change meanwhile).
    PARASYNC_RETURN_IF_ERROR(CheckNotLockedElsewhere(dir));
    // Look read-only first and verify everything: opening for writing may rewrite the
    // manifest, flush the WAL and replace the OPTIONS file, which must not happen to a
    // directory we then refuse. Read-only RocksDB writes nothing but its LOG: it gets none.
    rocksdb::Options ro_options = options;
    const auto logger = std::make_shared<LastWarningLogger>();
    ro_options.info_log = logger;
    rocksdb::DB* raw = nullptr;
    rocksdb::Status s = rocksdb::DB::OpenForReadOnly(ro_options, dir, &raw);
    std::unique_ptr<rocksdb::DB> ro(raw);
    if (s.IsInvalidArgument() || s.IsNotSupported()) {
      return Status::FailedPrecondition(dir + " is not a parasync-ps data directory (RocksDB: " +
                                        s.ToString() + "); refusing to touch it");
    }
    if (s.IsCorruption()) {
      const std::string warning = logger->last_warning();
      return Status::Corruption(dir + ": RocksDB: " + s.ToString() +
                                (warning.empty() ? "" : " (" + warning + ")"));
    }
    // CURRENT or the MANIFEST names a file that is not there: the store is damaged.
    if (s.IsPathNotFound()) {
      return Status::Corruption(dir + ": a file the store needs is missing: RocksDB: " +
                                s.ToString());
    }
    if (!s.ok()) return FromRocks(s, dir);
    PARASYNC_ASSIGN_OR_RETURN(const bool has_meta, CheckMeta(ro.get(), dir, shard, num_shards));
    PARASYNC_RETURN_IF_ERROR(VerifyStore(ro.get(), opened.env.get(), dir, mode));
    fresh = !has_meta;
    (void)ro->Close();
  }

  // Only now, with the directory known to be empty, may RocksDB create files in it.
  options.create_if_missing = state == DirState::kEmpty;
  options.error_if_exists = state == DirState::kEmpty;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &raw);
  opened.db.reset(raw);
  if (s.IsNoSpace()) return WriteFailed(s, dir);
  PARASYNC_RETURN_IF_ERROR(FromRocks(s, dir));
  rocksdb::DB* db = opened.db.get();

  if (fresh) {
    rocksdb::WriteBatch batch;
    PARASYNC_RETURN_IF_ERROR(
        FromRocks(batch.Put(kFormatKey, SealedValue(kFormatKey, kCheckpointFormat)), dir));
    PARASYNC_RETURN_IF_ERROR(FromRocks(batch.Put(kShardKey, ShardValue(shard, num_shards)), dir));
    rocksdb::WriteOptions wo;
    wo.sync = true;
    s = db->Write(wo, &batch);
    if (!s.ok()) return WriteFailed(s, dir);
  } else {
    // Again under the lock the writable open holds, in case the store changed in between.
    PARASYNC_ASSIGN_OR_RETURN(const bool has_meta, CheckMeta(db, dir, shard, num_shards));
    if (!has_meta) return Status::Corruption(dir + ": checkpoint meta records vanished");
  }

  std::string value;
  s = db->Get(rocksdb::ReadOptions(), kRegistrationKey, &value);
  if (!s.ok() && !s.IsNotFound()) return FromRocks(s, dir);
  opened.has_registration = s.ok();
  return opened;
}

}  // namespace

struct CheckpointStore::Rep {
  std::unique_ptr<rocksdb::Env> env;  // outlives db
  std::unique_ptr<rocksdb::DB> db;
};

CheckpointStore::CheckpointStore(std::string dir, int shard, int num_shards,
                                 std::unique_ptr<Rep> rep, bool has_registration)
    : dir_(std::move(dir)),
      shard_(shard),
      num_shards_(num_shards),
      rep_(std::move(rep)),
      has_registration_(has_registration) {}

CheckpointStore::~CheckpointStore() {
  // Every write is already in the WAL; flushing it into table files as well means a cleanly
  // stopped store no longer depends on its WAL. A failed flush or close loses nothing that
  // was acknowledged. A failed store is not asked to write again.
  if (!failure().has_value()) (void)rep_->db->Flush(rocksdb::FlushOptions());
  (void)rep_->db->Close();
}

std::optional<std::string> CheckpointStore::failure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  if (!failure_) return std::nullopt;
  return failure_->message();
}

Status CheckpointStore::LatchedFailure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_.value_or(Status::Ok());
}

Status CheckpointStore::Latch(Status failure) {
  std::lock_guard<std::mutex> lock(failure_mu_);
  if (!failure_) failure_ = std::move(failure);
  return *failure_;
}

Result<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(
    const std::string& dir, int shard, int num_shards, std::shared_ptr<StorageFaults> faults,
    const std::optional<TrainingMode>& mode) {
  if (dir.empty()) return Status::InvalidArgument("checkpoint directory is empty");
  if (num_shards < 1 || shard < 0 || shard >= num_shards) {
    return Status::InvalidArgument("shard " + std::to_string(shard) + " of " +
                                   std::to_string(num_shards) + " does not exist");
  }
  PARASYNC_ASSIGN_OR_RETURN(OpenedDb opened, Guarded("opening checkpoint store " + dir, [&] {
                              return OpenDb(dir, shard, num_shards, std::move(faults), mode);
                            }));
  auto rep = std::make_unique<Rep>();
  rep->env = std::move(opened.env);
  rep->db = std::move(opened.db);
  return std::unique_ptr<CheckpointStore>(
      new CheckpointStore(dir, shard, num_shards, std::move(rep), opened.has_registration));
}

Result<ShardSnapshot> CheckpointStore::Load(bool with_rows) {
  return Guarded("loading checkpoint from " + dir_, [&]() -> Result<ShardSnapshot> {
    return ReadSnapshot(rep_->db.get(), dir_, with_rows);
  });
}

Status CheckpointStore::Read(std::span<const RowKey> keys,
                             std::vector<std::optional<RowSnapshot>>* out) {
  out->assign(keys.size(), std::nullopt);
  // One MultiGet for the lot: it looks the keys up level by level, each table file's filter
  // and index once for all the keys it may hold, instead of a whole Get per key.
  std::vector<std::string> names;
  names.reserve(keys.size());
  for (const RowKey& k : keys) names.push_back(RowKeyString(k.table, k.id));
  std::vector<rocksdb::Slice> slices(names.begin(), names.end());
  std::vector<rocksdb::PinnableSlice> values(keys.size());
  std::vector<rocksdb::Status> statuses(keys.size());
  rep_->db->MultiGet(rocksdb::ReadOptions(), rep_->db->DefaultColumnFamily(), keys.size(),
                     slices.data(), values.data(), statuses.data());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (statuses[i].IsNotFound()) continue;
    PARASYNC_RETURN_IF_ERROR(FromRocks(statuses[i], dir_));
    Result<RowSnapshot> row = DecodeRow(names[i], values[i].ToStringView());
    if (!row.ok()) return row.status().WithContext(dir_);
    (*out)[i] = std::move(*row);
  }
  return Status::Ok();
}

Status CheckpointStore::Scan(std::optional<RowKey> after, size_t limit, std::vector<Stamp>* out,
                             bool* at_end) {
  out->clear();
  *at_end = false;
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;  // a sweep passes over rows once: keep the cache for the hot ones
  const rocksdb::Slice row_end(kRowEnd);
  ro.iterate_upper_bound = &row_end;
  std::unique_ptr<rocksdb::Iterator> it(rep_->db->NewIterator(ro));
  const std::string start = after ? RowKeyString(after->table, after->id) : kRowPrefix;
  it->Seek(start);
  if (after && it->Valid() && it->key().ToStringView() == start) it->Next();
  for (; it->Valid() && out->size() < limit; it->Next()) {
    // The stamp only (an expiry sweep reads many rows): the floats are checked, not copied.
    Result<RowRecord> rec = OpenRow(it->key().ToStringView(), it->value().ToStringView());
    if (!rec.ok()) return rec.status().WithContext(dir_);
    out->push_back(Stamp{rec->key, rec->touched});
  }
  PARASYNC_RETURN_IF_ERROR(FromRocks(it->status(), dir_));
  *at_end = !it->Valid();
  return Status::Ok();
}

Status CheckpointStore::Write(std::span<const RowSnapshot> rows) {
  PARASYNC_RETURN_IF_ERROR(LatchedFailure());
  for (const RowSnapshot& row : rows) PARASYNC_RETURN_IF_ERROR(CheckRow(row));
  rocksdb::WriteBatch batch;
  PARASYNC_RETURN_IF_ERROR(
      PutRows(rows, {}, &batch, dir_));
  const rocksdb::Status s = rep_->db->Write(rocksdb::WriteOptions(), &batch);
  if (!s.ok()) return Latch(WriteFailed(s, dir_));
  return Status::Ok();
}

Status CheckpointStore::Save(const ShardSnapshot& snap, bool sync) {
  PARASYNC_RETURN_IF_ERROR(LatchedFailure());
  if (snap.registration.num_shards != num_shards_) {
    return Status::InvalidArgument("registration for " +
                                   std::to_string(snap.registration.num_shards) +
                                   " shards saved in the store of shard " + std::to_string(shard_) +
                                   " of " + std::to_string(num_shards_));
  }
  for (size_t i = 0; i < snap.slices.size(); ++i) {
    if (i > 0 && snap.slices[i].id <= snap.slices[i - 1].id) {
      return Status::InvalidArgument("slice ids are not strictly ascending at slice " +
                                     std::to_string(snap.slices[i].id));
    }
    PARASYNC_RETURN_IF_ERROR(CheckSlice(snap.slices[i]));
  }
  for (const RowSnapshot& row : snap.rows) PARASYNC_RETURN_IF_ERROR(CheckRow(row));
  std::vector<int32_t> ranks;
  for (const RankRecord& rank : snap.ranks) ranks.push_back(rank.rank);
  std::sort(ranks.begin(), ranks.end());
  if (auto twice = std::adjacent_find(ranks.begin(), ranks.end()); twice != ranks.end()) {
    return Status::InvalidArgument("rank " + std::to_string(*twice) +
                                   " appears twice in the snapshot");
  }

  return Guarded("saving checkpoint to " + dir_, [&]() -> Status {
    // Everything in one batch: a crash leaves the old snapshot or the new one.
    rocksdb::WriteBatch batch;
    auto put = [&](const std::string& key, const std::string& value) {
      return FromRocks(batch.Put(key, value), dir_);
    };
    PARASYNC_RETURN_IF_ERROR(put(kRegistrationKey, RegistrationValue(snap.registration)));
    PARASYNC_RETURN_IF_ERROR(put(kStateKey, StateValue(snap.version, snap.examples)));
    // Range tombstones drop every old slice and rank without reading them; the puts after them in
    // the batch get later sequence numbers and so survive them.
    PARASYNC_RETURN_IF_ERROR(FromRocks(batch.DeleteRange(kSlicePrefix, kSliceEnd), dir_));
    PARASYNC_RETURN_IF_ERROR(FromRocks(batch.DeleteRange(kRankPrefix, kRankEnd), dir_));
    for (const SliceSnapshot& slice : snap.slices) {
      PARASYNC_RETURN_IF_ERROR(FromRocks(PutSlice(slice, &batch), dir_));
    }
    for (const RankRecord& rank : snap.ranks) {
      PARASYNC_RETURN_IF_ERROR(put(RankKey(rank.rank), RankValue(rank)));
    }
    if (snap.replace_rows) {
      PARASYNC_RETURN_IF_ERROR(FromRocks(batch.DeleteRange(kRowPrefix, kRowEnd), dir_));
    }
    PARASYNC_RETURN_IF_ERROR(PutRows(snap.rows, snap.deleted_rows, &batch, dir_));
    rocksdb::WriteOptions wo;
    wo.sync = sync;
    const rocksdb::Status s = rep_->db->Write(wo, &batch);
    if (!s.ok()) return Latch(WriteFailed(s, dir_));
    has_registration_.store(true);
    return Status::Ok();
  });
}

Status CheckpointStore::SaveUpdate(int64_t version, int64_t examples,
                                   const std::vector<const SliceSnapshot*>& slices,
                                   const std::vector<RankRecord>& ranks, bool sync,
                                   const std::vector<RowSnapshot>& rows,
                                   const std::vector<RowKey>& deleted_rows) {
  PARASYNC_RETURN_IF_ERROR(LatchedFailure());
  if (!has_registration_.load()) {
    return Status::FailedPrecondition("no snapshot was saved in " + dir_ +
                                      " yet; SaveUpdate needs a Save first");
  }
  for (const SliceSnapshot* slice : slices) {
    if (slice == nullptr) return Status::InvalidArgument("null slice in SaveUpdate");
    PARASYNC_RETURN_IF_ERROR(CheckSlice(*slice));
  }
  for (const RowSnapshot& row : rows) PARASYNC_RETURN_IF_ERROR(CheckRow(row));
  return Guarded("saving update to " + dir_, [&]() -> Status {
    rocksdb::WriteBatch batch;
    PARASYNC_RETURN_IF_ERROR(FromRocks(batch.Put(kStateKey, StateValue(version, examples)), dir_));
    for (const SliceSnapshot* slice : slices) {
      PARASYNC_RETURN_IF_ERROR(FromRocks(PutSlice(*slice, &batch), dir_));
    }
    for (const RankRecord& rank : ranks) {
      PARASYNC_RETURN_IF_ERROR(FromRocks(batch.Put(RankKey(rank.rank), RankValue(rank)), dir_));
    }
    PARASYNC_RETURN_IF_ERROR(PutRows(rows, deleted_rows, &batch, dir_));
    rocksdb::WriteOptions wo;
    wo.sync = sync;
    const rocksdb::Status s = rep_->db->Write(wo, &batch);
    if (!s.ok()) return Latch(WriteFailed(s, dir_));
    return Status::Ok();
  });
}

int64_t CheckpointStore::ApproximateBytes() const {
  std::error_code ec;
  int64_t total = 0;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    const uintmax_t size = it->is_regular_file(size_ec) ? it->file_size(size_ec) : 0;
    if (!size_ec) total += static_cast<int64_t>(size);
  }
  return total;
}

}  // namespace parasync
