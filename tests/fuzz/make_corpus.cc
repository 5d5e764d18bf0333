// Writes the PS fuzzer's seed corpus (tests/fuzz/corpus) with the real encoder: valid
// Register / Pull / Push / Stats / Heartbeat / Leave exchanges for every mode, with and without
// embedding rows, plus malformed messages of both. Regenerate after a wire change (e.g.
// kProtocolVersion):
//   rm -r tests/fuzz/corpus && build/bin/parasync-fuzz-corpus tests/fuzz/corpus
// `--check DIR` (ctest fuzz_corpus_current) instead verifies that DIR holds exactly these seeds.
// Header frames are compared by what they decode to: the bytes of a registration differ between
// g++ and clang (the encoder builds a table's fields in function-argument order, which C++
// leaves unspecified), its meaning does not.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/cli.h"
#include "common/embedding.h"
#include "common/float_codec.h"
#include "common/process.h"
#include "common/slice_map.h"
#include "common/wire.h"
#include "tests/fuzz/fuzz_input.h"

namespace parasync::fuzz {
namespace {

std::string Frame(const Header& h) {
  std::vector<uint8_t> bytes = EncodeHeader(h);
  return std::string(bytes.begin(), bytes.end());
}

std::string Floats(int64_t count, float value) {
  std::vector<float> v(static_cast<size_t>(count), value);
  for (size_t i = 0; i < v.size(); ++i) v[i] = value * static_cast<float>(1 + i % 7);
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// `count` floats (value, 2 x value, ... 7 x value, repeated) in `dtype`'s wire encoding, the
// first at element `offset` of its variable (int8's and top-k's chunks).
std::string Values(int64_t count, float value, WireFormat dtype, int64_t offset = 0) {
  if (dtype.dtype == DType::kFloat32) return Floats(count, value);
  const std::string f = Floats(count, value);
  std::string out(WireBytes(dtype, static_cast<size_t>(count), offset), '\0');
  EncodeRange(reinterpret_cast<const float*>(f.data()), static_cast<size_t>(count), offset,
              dtype, out.data());
  return out;
}

std::string IdsFrame(const std::vector<uint64_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint64_t));
}

// The first `n` ids at or above `from` that shard `shard` of kNumShards holds in `table`.
std::vector<uint64_t> IdsOn(uint32_t table, int shard, uint64_t from, size_t n) {
  std::vector<uint64_t> ids;
  for (uint64_t id = from; ids.size() < n; ++id) {
    if (ShardOfRow(table, id, kNumShards) == shard) ids.push_back(id);
  }
  return ids;
}

// The ids of one table a request names: a RowRange {table, ids.size()} and its ids frame.
struct Rows {
  uint32_t table = 0;
  std::vector<uint64_t> ids;
};

class Seeds {
 public:
  explicit Seeds(Config config) : config_(config), model_(FuzzModel(config)) {
    auto map = SliceMap::Build(model_.variables, model_.max_slice_elements, kNumShards);
    if (!map.ok()) {
      std::fprintf(stderr, "%s\n", map.status().ToString().c_str());
      std::exit(1);
    }
    for (const SliceInfo& s : map->slices()) offsets_.push_back(s.offset);
    for (uint32_t id : map->SlicesOfShard(0)) {
      here_.push_back({id, 0, map->slices()[id].length});
    }
    for (uint32_t id : map->SlicesOfShard(1)) {
      elsewhere_.push_back({id, 0, map->slices()[id].length});
    }
  }

  const std::vector<SliceRange>& here() const { return here_; }
  const std::vector<SliceRange>& elsewhere() const { return elsewhere_; }

  Header Base(MsgType type, int rank) {
    Header h;
    h.type = type;
    h.rank = rank;
    h.request_id = ++request_id_;
    return h;
  }
  Message Register(int rank) {
    Header h = Base(MsgType::kRegister, rank);
    h.registration = model_;
    return {Frame(h)};
  }
  Message Pull(int rank, int64_t min_version, std::vector<SliceRange> ranges) {
    Header h = Base(MsgType::kPull, rank);
    h.slices = std::move(ranges);
    h.min_version = min_version;
    return {Frame(h)};
  }
  Message Push(int rank, int64_t version, std::vector<SliceRange> ranges, float value = 0.01f) {
    Header h = Base(MsgType::kPush, rank);
    h.slices = std::move(ranges);
    h.version = version;
    h.batch_examples = 32;
    h.seq = (uint64_t{0x5eed} << 32) | static_cast<uint64_t>(++seq_);
    Message m{Frame(h)};
    for (const SliceRange& r : h.slices) m.push_back(Floats(r.count, value));
    return m;
  }
  // A pull of slice ranges and rows: an ids frame per row range.
  Message PullRows(int rank, int64_t min_version, std::vector<SliceRange> ranges,
                   const std::vector<Rows>& rows, WireFormat dtype = DType::kFloat32) {
    Header h = Base(MsgType::kPull, rank);
    h.slices = std::move(ranges);
    h.min_version = min_version;
    h.dtype = dtype.dtype;
    h.topk_keep = static_cast<uint8_t>(dtype.keep);
    for (const Rows& r : rows) h.rows.push_back({r.table, static_cast<int64_t>(r.ids.size())});
    Message m{Frame(h)};
    for (const Rows& r : rows) m.push_back(IdsFrame(r.ids));
    return m;
  }
  // A push of slice ranges and rows, every value in `dtype`: the slices' frames, then an ids
  // frame and a values frame (ids x dim) per row range.
  Message PushRows(int rank, int64_t version, std::vector<SliceRange> ranges,
                   const std::vector<Rows>& rows, float value = 0.01f,
                   WireFormat dtype = DType::kFloat32) {
    Header h = Base(MsgType::kPush, rank);
    h.slices = std::move(ranges);
    h.version = version;
    h.batch_examples = 32;
    h.dtype = dtype.dtype;
    h.topk_keep = static_cast<uint8_t>(dtype.keep);
    h.seq = (uint64_t{0x5eed} << 32) | static_cast<uint64_t>(++seq_);
    for (const Rows& r : rows) h.rows.push_back({r.table, static_cast<int64_t>(r.ids.size())});
    Message m{Frame(h)};
    for (const SliceRange& r : h.slices) {
      const int64_t offset = r.slice_id < offsets_.size() ? offsets_[r.slice_id] + r.begin : 0;
      m.push_back(Values(r.count, value, dtype, offset));
    }
    for (const Rows& r : rows) {
      m.push_back(IdsFrame(r.ids));
      m.push_back(Values(static_cast<int64_t>(r.ids.size()) * Dim(r.table), value, dtype));
    }
    return m;
  }
  // A table's row width (1 for a table the model does not have).
  int64_t Dim(uint32_t table) const {
    return table < model_.tables.size() ? model_.tables[table].dim : 1;
  }
  Message Simple(MsgType type, int rank) { return {Frame(Base(type, rank))}; }
  Message Stats() { return Simple(MsgType::kStats, -1); }

  std::string Input(std::vector<Message> messages) const {
    fuzz::Input in;
    in.config = config_.ToByte();
    in.messages = std::move(messages);
    return Serialize(in);
  }

 private:
  Config config_;
  ModelRegistration model_;
  std::vector<SliceRange> here_, elsewhere_;
  std::vector<int64_t> offsets_;  // by slice id: its first element in its variable
  uint64_t request_id_ = 0;
  int64_t seq_ = 0;
};

// True when seed files `a` and `b` mean the same: the same config and frames, header frames
// equal or decoding to headers that encode alike.
bool SameSeed(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const Input x = Parse(reinterpret_cast<const uint8_t*>(a.data()), a.size());
  const Input y = Parse(reinterpret_cast<const uint8_t*>(b.data()), b.size());
  if (x.config != y.config || x.messages.size() != y.messages.size()) return false;
  for (size_t m = 0; m < x.messages.size(); ++m) {
    if (x.messages[m].size() != y.messages[m].size()) return false;
    for (size_t f = 0; f < x.messages[m].size(); ++f) {
      const std::string& fa = x.messages[m][f];
      const std::string& fb = y.messages[m][f];
      if (fa == fb) continue;
      if (f != 0) return false;
      auto ha = DecodeHeader(fa.data(), fa.size());
      auto hb = DecodeHeader(fb.data(), fb.size());
      if (!ha.ok() || !hb.ok() || EncodeHeader(*ha) != EncodeHeader(*hb)) return false;
    }
  }
  return true;
}

Config MakeConfig(int mode_bits, bool preregister, OptimizerKind optimizer,
                  bool staleness_aware = false, bool drop = false, bool zero_barrier = false,
                  bool zero_worker = false) {
  Config c = Config::FromByte(static_cast<uint8_t>(mode_bits));
  c.preregister = preregister;
  c.optimizer = optimizer;
  c.staleness_aware = staleness_aware;
  c.drop_push_replies = drop;
  c.zero_barrier_timeout = zero_barrier;
  c.zero_worker_timeout = zero_worker;
  return c;
}

// The seed files, (name, bytes), in the order they are listed.
using SeedFiles = std::vector<std::pair<std::string, std::string>>;

// One of the training configurations every mode runs in.
struct Variant {
  const char* name;
  Config config;
};

// A configuration per mode, each with another optimizer, and the timeouts at zero.
std::vector<Variant> TrainingVariants() {
  return {
      {"async-sgd", MakeConfig(0, true, OptimizerKind::kSgd)},
      {"sync-momentum", MakeConfig(1, true, OptimizerKind::kMomentum)},
      {"ssp1-adam", MakeConfig(2, true, OptimizerKind::kAdam)},
      {"sync-r1-adam-staleness", MakeConfig(3, true, OptimizerKind::kAdam, true)},
      {"async-adam-drop-replies", MakeConfig(0, true, OptimizerKind::kAdam, false, true)},
      // Parked pulls time out at once; every rank is declared dead after each turn.
      {"sync-barrier-timeout", MakeConfig(1, true, OptimizerKind::kSgd, false, false, true)},
      {"ssp1-workers-expire", MakeConfig(2, true, OptimizerKind::kMomentum, false, false, false,
                                         true)},
      {"sync-r1-both-timeouts", MakeConfig(3, true, OptimizerKind::kAdam, false, false, true,
                                           true)},
  };
}

// The rows the training seeds pull and push, all on this shard: rank 0's and rank 1's overlap,
// so a sync step averages some rows over two ranks and others over one; together they are
// more rows than the harness's row cap, so creating rows evicts others.
struct TrainingRows {
  Rows fixed0, hashed0;            // rank 0's, of table 0 and of the hashed table 1
  std::vector<Rows> rows0, rows1;  // rank 0's and rank 1's, both tables
  Rows other_shard;                // of table 0, one of its ids held by shard 1 (malformed)
};

TrainingRows MakeTrainingRows() {
  TrainingRows r;
  r.fixed0 = {0, IdsOn(0, 0, 0, 5)};
  r.hashed0 = {1, IdsOn(1, 0, uint64_t{1} << 40, 3)};
  Rows fixed1{0, {r.fixed0.ids[2], r.fixed0.ids[3], r.fixed0.ids[4]}};
  for (uint64_t id : IdsOn(0, 0, 600, 2)) fixed1.ids.push_back(id);
  Rows hashed1{1, {r.hashed0.ids[1]}};
  for (uint64_t id : IdsOn(1, 0, UINT64_MAX - 64, 1)) hashed1.ids.push_back(id);
  r.rows0 = {r.fixed0, r.hashed0};
  r.rows1 = {fixed1, hashed1};
  r.other_shard = {0, {r.fixed0.ids[0], IdsOn(0, 1, r.fixed0.ids[0], 1)[0]}};
  return r;
}

// A training exchange of both ranks in every mode.
void AddTraining(SeedFiles& seeds) {
  for (const Variant& v : TrainingVariants()) {
    Seeds s(v.config);
    seeds.emplace_back(
        "train-" + std::string(v.name),
        s.Input({s.Simple(MsgType::kHeartbeat, 0), s.Simple(MsgType::kHeartbeat, 1),
                 s.Pull(0, 0, s.here()), s.Pull(1, 0, s.here()), s.Push(0, 0, s.here()),
                 s.Pull(0, 1, s.here()), s.Push(1, 0, s.here()), s.Pull(1, 1, s.here()),
                 s.Push(0, 1, s.here()), s.Push(0, 1, s.here()), s.Stats(),
                 s.Simple(MsgType::kLeave, 1), s.Push(0, 2, s.here())}));
  }
}

// A local group's pushes (worker/local_group.h: Header.ranks names the members whose
// gradients the push sums): in sync rank 0's push for itself and rank 1, then rank 1's own
// (a duplicate of its rank), one naming the sender and one naming a rank twice (refused);
// in async every such push is refused.
void AddGroupPushes(SeedFiles& seeds) {
  const auto with_ranks = [](Message m, std::vector<int32_t> ranks) {
    Header h = DecodeHeader(m[0].data(), m[0].size()).value();
    h.ranks = std::move(ranks);
    m[0] = Frame(h);
    return m;
  };
  for (int mode_bits : {1, 0}) {
    Seeds s(MakeConfig(mode_bits, true, OptimizerKind::kSgd));
    seeds.emplace_back(
        std::string("group-push-") + (mode_bits == 1 ? "sync" : "async"),
        s.Input({s.Pull(0, 0, s.here()), with_ranks(s.Push(0, 0, s.here()), {1}),
                 s.Push(1, 0, s.here()), with_ranks(s.Push(0, 1, s.here()), {0}),
                 with_ranks(s.Push(0, 1, s.here()), {1, 1}), s.Pull(1, 1, s.here()),
                 s.Stats()}));
  }
}

// The same exchange with embedding rows, in every mode: both ranks pull and push rows of both
// tables, with slices and without.
void AddRowTraining(const TrainingRows& r, SeedFiles& seeds) {
  for (const Variant& v : TrainingVariants()) {
    Seeds s(v.config);
    seeds.emplace_back(
        "rows-train-" + std::string(v.name),
        s.Input({s.Simple(MsgType::kHeartbeat, 0), s.Simple(MsgType::kHeartbeat, 1),
                 s.PullRows(0, 0, s.here(), r.rows0), s.PullRows(1, 0, s.here(), r.rows1),
                 s.PushRows(0, 0, s.here(), r.rows0), s.PullRows(0, 1, s.here(), r.rows0),
                 s.PushRows(1, 0, s.here(), r.rows1, -0.02f), s.PullRows(1, 1, {}, r.rows1),
                 s.PushRows(0, 1, {}, {r.hashed0}), s.PushRows(0, 1, s.here(), r.rows0),
                 s.PullRows(0, 2, {}, {r.fixed0}, DType::kBfloat16), s.Stats(),
                 s.Simple(MsgType::kLeave, 1), s.PushRows(0, 2, s.here(), r.rows1)}));
  }
}

// 16-bit rows both ways, and pulls of rows nobody pushed.
void AddRowEncodings(const TrainingRows& r, SeedFiles& seeds) {
  Seeds s(MakeConfig(0, true, OptimizerKind::kAdam));
  // bfloat16 and float16 pushes (values frames of 2-byte values) and pulls (their replies'
  // values frames are too).
  seeds.emplace_back("rows-sixteen-bit",
                     s.Input({s.PushRows(0, 0, {}, r.rows0, 0.01f, DType::kBfloat16),
                              s.PushRows(1, 1, s.here(), r.rows1, 0.03f, DType::kFloat16),
                              s.PullRows(0, 1, s.here(), r.rows0, DType::kFloat16),
                              s.PullRows(1, 1, {}, r.rows1, DType::kBfloat16)}));
  // int8 slices both ways (a byte per element, one per 128-element chunk), a frame short of
  // one chunk's exponent, and int8 rows (refused: rows never travel in int8).
  Message short_int8 = s.PushRows(0, 1, s.here(), {}, 0.02f, DType::kInt8);
  short_int8[1].pop_back();
  seeds.emplace_back("int8-slices",
                     s.Input({s.PushRows(0, 0, s.here(), {}, 0.01f, DType::kInt8),
                              s.PullRows(0, 1, s.here(), {}, DType::kInt8), short_int8,
                              s.PushRows(1, 1, s.here(), r.rows1, 0.03f, DType::kInt8),
                              s.PullRows(1, 1, {}, r.rows1, DType::kInt8)}));
  // int4 slices both ways (two elements a byte, an exponent per chunk), a frame a byte short,
  // int4 rows (refused), and int4 delta pulls from zeros and from a generation.
  Message short_int4 = s.PushRows(0, 1, s.here(), {}, 0.02f, DType::kInt4);
  short_int4[1].pop_back();
  Message int4_delta = s.PullRows(1, 1, s.here(), {}, DType::kInt4);
  {
    Header h = DecodeHeader(int4_delta[0].data(), int4_delta[0].size()).value();
    h.delta_pull = true;
    int4_delta[0] = Frame(h);
  }
  seeds.emplace_back("int4-slices",
                     s.Input({s.PushRows(0, 0, s.here(), {}, 0.01f, DType::kInt4),
                              s.PullRows(0, 1, s.here(), {}, DType::kInt4), short_int4,
                              int4_delta, int4_delta,
                              s.PushRows(1, 1, s.here(), r.rows1, 0.03f, DType::kInt4)}));
  // top-k slices both ways (4 of each 256-element chunk by index, in int8), a frame whose
  // first two indices are swapped and one whose keep is 0 (both refused), and top-k rows
  // (refused: rows never travel in top-k).
  const WireFormat topk(DType::kTopK, 4);
  Message swapped = s.PushRows(0, 1, s.here(), {}, 0.02f, topk);
  std::swap(swapped[1][1], swapped[1][2]);
  Message keep0 = s.PushRows(0, 1, s.here(), {}, 0.02f, topk);
  Header keep0_header = DecodeHeader(keep0[0].data(), keep0[0].size()).value();
  keep0_header.topk_keep = 0;
  keep0[0] = Frame(keep0_header);
  seeds.emplace_back("topk-slices",
                     s.Input({s.PushRows(0, 0, s.here(), {}, 0.01f, topk),
                              s.PullRows(0, 1, s.here(), {}, topk), swapped, keep0,
                              s.PushRows(1, 1, s.here(), r.rows1, 0.03f, topk),
                              s.PullRows(1, 1, {}, r.rows1, topk)}));
  // int8 delta pulls (ps/delta_pulls.h): from zeros, then naming a generation (unknown to the
  // server: answered from zeros), and refused ones: in float32, of a part of the shard, with
  // rows.
  const auto delta = [](Message m, uint64_t base) {
    Header h = DecodeHeader(m[0].data(), m[0].size()).value();
    h.delta_pull = true;
    h.delta_base = base;
    m[0] = Frame(h);
    return m;
  };
  const std::vector<SliceRange> part(s.here().begin(), s.here().begin() + 1);
  seeds.emplace_back(
      "delta-pulls",
      s.Input({s.PushRows(0, 0, s.here(), {}, 0.01f, DType::kInt8),
               delta(s.PullRows(0, 1, s.here(), {}, DType::kInt8), 0),
               delta(s.PullRows(1, 1, s.here(), {}, DType::kInt8), 3),
               delta(s.PullRows(0, 1, s.here(), {}), 0),
               delta(s.PullRows(0, 1, part, {}, DType::kInt8), 0),
               delta(s.PullRows(1, 1, s.here(), r.rows1, DType::kInt8), 0)}));
  // Ids nobody pushed read as their initial value and create nothing; an empty ids frame.
  seeds.emplace_back("rows-pull-unseen",
                     s.Input({s.PullRows(0, 0, {}, {{0, IdsOn(0, 0, 900, 40)}, {1, {}}}),
                              s.PullRows(1, 0, {}, {{1, IdsOn(1, 0, 0, 64)}})}));
}

// Registration through the fuzzed path: first, idempotent again, then a pull and a push; and
// requests before any registration.
void AddRegistrations(SeedFiles& seeds) {
  Seeds s(MakeConfig(0, false, OptimizerKind::kMomentum));
  seeds.emplace_back("register-async",
                     s.Input({s.Register(0), s.Register(1), s.Pull(-1, 0, s.here()),
                              s.Push(-1, 0, {s.here().front()})}));
  Seeds sync(MakeConfig(1, false, OptimizerKind::kSgd));
  seeds.emplace_back("register-sync",
                     sync.Input({sync.Register(1), sync.Push(0, 0, sync.here()),
                                 sync.Push(1, 0, sync.here()), sync.Pull(0, 1, sync.here())}));
  seeds.emplace_back("stats-unregistered", s.Input({s.Stats()}));
  seeds.emplace_back("heartbeat-unregistered", s.Input({s.Simple(MsgType::kHeartbeat, 0)}));
}

// Checkpoint without a store, shutdown, and requests for part of a slice.
void AddControl(SeedFiles& seeds) {
  Seeds s(MakeConfig(0, true, OptimizerKind::kSgd));
  seeds.emplace_back("checkpoint-no-store", s.Input({s.Simple(MsgType::kCheckpoint, 0)}));
  seeds.emplace_back("shutdown", s.Input({s.Simple(MsgType::kShutdown, -1), s.Stats()}));
  // Part of a slice: the range [10, +20) of the first slice held here.
  SliceRange part = s.here().front();
  part.begin = 10;
  part.count = 20;
  seeds.emplace_back("partial-ranges", s.Input({s.Pull(0, 0, {part}), s.Push(0, 0, {part})}));
}

// Malformed messages of slices, each refused with an error reply that changes nothing.
void AddMalformedMessages(Seeds& s, SeedFiles& seeds) {
  const std::vector<SliceRange> here = s.here();
  seeds.emplace_back("bad-empty-header", s.Input({{std::string()}}));
  seeds.emplace_back("bad-garbage-header",
                     s.Input({{std::string("\x10\x00\x00\x00garbage-not-a-flatbuffer", 28)}}));
  Message push = s.Push(0, 0, here);
  seeds.emplace_back("bad-truncated-header", s.Input({{push[0].substr(0, push[0].size() / 2)}}));
  Header old = s.Base(MsgType::kPull, 0);
  old.protocol_version = kProtocolVersion - 1;
  seeds.emplace_back("bad-protocol-version", s.Input({{Frame(old)}}));
  Message short_frame = s.Push(0, 0, here);
  short_frame[1].pop_back();
  seeds.emplace_back("bad-frame-length", s.Input({short_frame}));
  Message missing = s.Push(0, 0, here);
  missing.pop_back();
  seeds.emplace_back("bad-frame-count",
                     s.Input({missing, {s.Pull(0, 0, here)[0], std::string(8, '\0')}}));
  seeds.emplace_back("bad-nonfinite",
                     s.Input({s.Push(0, 0, here, std::numeric_limits<float>::quiet_NaN()),
                              s.Push(1, 0, here, std::numeric_limits<float>::infinity())}));
  std::vector<SliceRange> reversed(here.rbegin(), here.rend());
  seeds.emplace_back("bad-order", s.Input({s.Pull(0, 0, reversed)}));
  seeds.emplace_back("bad-unknown-slice",
                     s.Input({s.Pull(0, 0, s.elsewhere()), s.Pull(0, 0, {{999, 0, 1}})}));
  SliceRange outside = here.front();
  outside.begin = outside.count - 5;
  seeds.emplace_back("bad-range", s.Input({s.Pull(0, 0, {outside}), s.Push(0, 0, {outside})}));
  seeds.emplace_back("bad-rank", s.Input({s.Simple(MsgType::kHeartbeat, 7), s.Push(-1, 0, here),
                                          s.Simple(MsgType::kLeave, -5)}));
  seeds.emplace_back("bad-version", s.Input({s.Push(0, 5, here), s.Push(1, -1, here)}));
  Message batch = s.Push(0, 0, here);
  Header h = s.Base(MsgType::kPush, 0);
  h.slices = here;
  h.batch_examples = -1;
  batch[0] = Frame(h);
  seeds.emplace_back("bad-batch-examples", s.Input({batch}));
}

// Registrations that must be refused: another model than the one registered (through `s`,
// registered), then, unregistered, an invalid optimizer, the wrong shard count, a model over
// the size bound, another mode.
void AddBadRegistrations(Seeds& s, SeedFiles& seeds) {
  ModelRegistration other = FuzzModel(MakeConfig(1, true, OptimizerKind::kSgd));
  other.variables[0].shape = {20, 11};
  Header mismatch = s.Base(MsgType::kRegister, 0);
  mismatch.registration = other;
  seeds.emplace_back("bad-register-mismatch", s.Input({{Frame(mismatch)}}));
  Seeds fresh(MakeConfig(0, false, OptimizerKind::kSgd));
  ModelRegistration bad = FuzzModel(MakeConfig(0, false, OptimizerKind::kSgd));
  bad.optimizer.learning_rate = -1;
  Header bad_lr = fresh.Base(MsgType::kRegister, 0);
  bad_lr.registration = bad;
  bad = FuzzModel(MakeConfig(0, false, OptimizerKind::kSgd));
  bad.num_shards = 3;
  Header bad_shards = fresh.Base(MsgType::kRegister, 0);
  bad_shards.registration = bad;
  bad = FuzzModel(MakeConfig(0, false, OptimizerKind::kAdam));
  bad.variables[0].shape = {1 << 20, 1 << 10};
  Header too_big = fresh.Base(MsgType::kRegister, 0);
  too_big.registration = bad;
  bad = FuzzModel(MakeConfig(0, false, OptimizerKind::kSgd));
  bad.mode = "sync";
  Header wrong_mode = fresh.Base(MsgType::kRegister, 0);
  wrong_mode.registration = bad;
  seeds.emplace_back("bad-registrations",
                     fresh.Input({{Frame(bad_lr)}, {Frame(bad_shards)}, {Frame(too_big)},
                                  {Frame(wrong_mode)}, fresh.Pull(0, 0, fresh.here())}));
}

// Malformed rows, async: each is refused and changes no row. Each file starts with a push that
// created rows, so that a refusal has rows to leave alone, and ends with a valid pull.
void AddMalformedRows(const TrainingRows& r, SeedFiles& seeds) {
  Seeds s(MakeConfig(0, true, OptimizerKind::kMomentum));
  const Rows& fixed0 = r.fixed0;
  const Rows& hashed0 = r.hashed0;
  const std::vector<Rows> ok{fixed0, hashed0};
  // `make_bad` builds the bad messages after the valid push, so that their seq numbers
  // follow its own (an earlier one would be taken for a replay, not checked).
  auto seed = [&](const std::string& name, auto make_bad) {
    std::vector<Message> messages{s.PushRows(0, 0, {}, ok)};
    for (Message& m : make_bad()) messages.push_back(std::move(m));
    messages.push_back(s.PullRows(0, 0, {}, ok));
    seeds.emplace_back(name, s.Input(std::move(messages)));
  };
  const Rows unsorted{0, {fixed0.ids[3], fixed0.ids[1], fixed0.ids[2]}};
  const Rows twice{1, {hashed0.ids[0], hashed0.ids[0]}};
  seed("bad-rows-order", [&] {
    return std::vector<Message>{s.PushRows(0, 0, {}, {unsorted}), s.PullRows(0, 0, {}, {twice}),
                                s.PushRows(0, 0, {}, {hashed0, fixed0})};
  });
  seed("bad-rows-shard", [&] {
    return std::vector<Message>{s.PushRows(0, 0, {}, {r.other_shard}),
                                s.PullRows(0, 0, {}, {{1, IdsOn(1, 1, 0, 1)}})};
  });
  const Rows past_end{0, {fixed0.ids[0], IdsOn(0, 0, kFixedTableRows, 1)[0]}};
  seed("bad-rows-range", [&] {
    return std::vector<Message>{s.PushRows(0, 0, {}, {past_end}),
                                s.PullRows(0, 0, {}, {{0, IdsOn(0, 0, UINT64_MAX - 64, 1)}})};
  });
  seed("bad-rows-values-length", [&] {
    Message short_values = s.PushRows(0, 0, {}, ok);
    short_values[2].resize(short_values[2].size() - 4);
    Message long_values = s.PushRows(0, 0, {}, ok);
    long_values[4] += std::string(4, '\0');
    // bfloat16 in the header, float32 values in the frame.
    Message wide = s.PushRows(0, 0, {}, ok, 0.01f, DType::kBfloat16);
    wide[2] = Floats(static_cast<int64_t>(fixed0.ids.size()) * kFixedTableDim, 0.01f);
    return std::vector<Message>{short_values, long_values, wide};
  });
  seed("bad-rows-frame-count", [&] {
    Message no_values = s.PushRows(0, 0, {}, ok);
    no_values.pop_back();
    Message extra = s.PushRows(0, 0, {}, ok);
    extra.push_back(std::string(8, '\0'));
    Message no_slice = s.PushRows(0, 0, {s.here().front()}, ok);
    no_slice.erase(no_slice.begin() + 1);
    Message no_ids = s.PullRows(0, 0, {}, ok);
    no_ids.pop_back();
    Message two_ids = s.PullRows(0, 0, {}, {fixed0});
    two_ids.push_back(IdsFrame(fixed0.ids));
    return std::vector<Message>{no_values, extra, no_slice, no_ids, two_ids};
  });
  seed("bad-rows-ids-length", [&] {
    Message odd = s.PushRows(0, 0, {}, ok);
    odd[1].pop_back();
    Message pull_odd = s.PullRows(0, 0, {}, {hashed0});
    pull_odd[1] += std::string(4, '\0');
    // The range says 5 ids, the frame holds 4.
    Message miscounted = s.PullRows(0, 0, {}, {fixed0});
    miscounted[1].resize(miscounted[1].size() - sizeof(uint64_t));
    return std::vector<Message>{odd, pull_odd, miscounted};
  });
  seed("bad-rows-unknown-table", [&] {
    return std::vector<Message>{s.PushRows(0, 0, {}, {{2, {1, 2}}}),
                                s.PullRows(0, 0, {}, {fixed0, {UINT32_MAX, {7}}})};
  });
  seed("bad-rows-nonfinite", [&] {
    return std::vector<Message>{
        s.PushRows(0, 0, {}, ok, std::numeric_limits<float>::quiet_NaN()),
        s.PushRows(1, 0, s.here(), {hashed0}, std::numeric_limits<float>::infinity(),
                   DType::kBfloat16)};
  });
}

// Sync: rank 1's refused pushes (NaN rows; an id of shard 1) add nothing to the step rank 0's
// rows wait in; its valid push then completes it.
void AddMalformedSyncRows(const TrainingRows& r, SeedFiles& seeds) {
  Seeds sync(MakeConfig(1, true, OptimizerKind::kAdam));
  Message first = sync.PushRows(0, 0, sync.here(), r.rows0);
  Message nan =
      sync.PushRows(1, 0, sync.here(), r.rows1, std::numeric_limits<float>::quiet_NaN());
  Message elsewhere = sync.PushRows(1, 0, sync.here(), {r.other_shard});
  Message second = sync.PushRows(1, 0, sync.here(), r.rows1);
  seeds.emplace_back("bad-rows-sync",
                     sync.Input({first, nan, elsewhere, second, sync.PullRows(0, 1, {}, r.rows0)}));
}

// Rows before any registration (no table is known); then registrations with tables that must
// be refused: a table of width 0, two tables of one name, a table named like a variable; then
// the model, then one that differs from it in a table's width, and a pull of its rows.
void AddBadTables(const TrainingRows& r, SeedFiles& seeds) {
  Seeds fresh(MakeConfig(0, false, OptimizerKind::kSgd));
  const std::vector<Rows> ok{r.fixed0, r.hashed0};
  seeds.emplace_back("bad-rows-unregistered",
                     fresh.Input({fresh.PullRows(0, 0, {}, ok), fresh.PushRows(0, 0, {}, ok)}));
  auto with_tables = [&](std::vector<TableSpec> tables) {
    Header h = fresh.Base(MsgType::kRegister, 0);
    h.registration = FuzzModel(MakeConfig(0, false, OptimizerKind::kSgd));
    h.registration->tables = std::move(tables);
    return Message{Frame(h)};
  };
  const std::vector<TableSpec> good = FuzzModel(MakeConfig(0, false, OptimizerKind::kSgd)).tables;
  std::vector<TableSpec> zero_dim = good, same_name = good, like_variable = good, wider = good;
  zero_dim[0].dim = 0;
  same_name[1].name = same_name[0].name;
  like_variable[1].name = "dense/bias";
  wider[1].dim += 1;
  seeds.emplace_back(
      "bad-register-tables",
      fresh.Input({with_tables(zero_dim), with_tables(same_name), with_tables(like_variable),
                   with_tables(good), with_tables(wider), with_tables({}),
                   fresh.PullRows(0, 0, {}, ok)}));
}

// Every seed file, in order.
SeedFiles AllSeeds() {
  SeedFiles seeds;
  const TrainingRows rows = MakeTrainingRows();
  AddTraining(seeds);
  AddGroupPushes(seeds);
  AddRowTraining(rows, seeds);
  AddRowEncodings(rows, seeds);
  AddRegistrations(seeds);
  AddControl(seeds);
  Seeds malformed(MakeConfig(1, true, OptimizerKind::kSgd));
  AddMalformedMessages(malformed, seeds);
  AddBadRegistrations(malformed, seeds);
  AddMalformedRows(rows, seeds);
  AddMalformedSyncRows(rows, seeds);
  AddBadTables(rows, seeds);
  return seeds;
}

size_t TotalBytes(const SeedFiles& seeds) {
  size_t bytes = 0;
  for (const auto& [name, data] : seeds) bytes += data.size();
  return bytes;
}

// --check: 0 when `dir` holds exactly `seeds` (each the same in meaning: SameSeed), else 1
// with every stale or missing seed named and how to regenerate (`program` is argv[0]).
int CheckCorpus(const std::filesystem::path& dir, const SeedFiles& seeds, const char* program) {
  int stale = 0;
  size_t files = 0;
  for (auto it = std::filesystem::directory_iterator(dir);
       it != std::filesystem::directory_iterator(); ++it) {
    files += 1;
  }
  for (const auto& [name, data] : seeds) {
    std::ifstream in(dir / name, std::ios::binary);
    std::ostringstream have;
    have << in.rdbuf();
    if (!in.is_open() || !SameSeed(have.str(), data)) {
      std::fprintf(stderr, "stale or missing seed: %s\n", (dir / name).c_str());
      ++stale;
    }
  }
  if (stale > 0 || files != seeds.size()) {
    std::fprintf(stderr,
                 "%s is not what this generator writes (%d stale, %zu files for %zu seeds); "
                 "regenerate it: rm -r %s && %s %s\n",
                 dir.c_str(), stale, files, seeds.size(), dir.c_str(), program, dir.c_str());
    return 1;
  }
  std::printf("%s: all %zu seeds current (%zu bytes)\n", dir.c_str(), seeds.size(),
              TotalBytes(seeds));
  return 0;
}

// Writes `seeds` into `dir` (created if missing): 0, or 1 when a file cannot be written.
int WriteCorpus(const std::filesystem::path& dir, const SeedFiles& seeds) {
  std::filesystem::create_directories(dir);
  for (const auto& [name, data] : seeds) {
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
      return 1;
    }
  }
  std::printf("wrote %zu seeds, %zu bytes, to %s\n", seeds.size(), TotalBytes(seeds),
              dir.c_str());
  return 0;
}

}  // namespace
}  // namespace parasync::fuzz

int main(int argc, char** argv) {
  using namespace parasync;
  using namespace parasync::fuzz;
  // A developer tool beside the real binaries in bin/ (ctest and docs/fuzzing.md run it from
  // there), so it answers --help and --version as they do and never takes a flag for a
  // directory.
  CLI::App app;
  SetUpCommandLine(
      app, {.name = "parasync-fuzz-corpus",
            .purpose = "writes the PS fuzzer's seed corpus with the real encoder (a developer "
                       "tool; docs/fuzzing.md).",
            .details = "Valid Register / Pull / Push / Stats / Heartbeat / Leave exchanges for "
                       "every mode, plus a few malformed messages. Regenerate after a wire "
                       "change; with --check, verify that DIR holds exactly these seeds (ctest "
                       "fuzz_corpus_current).",
            .exit_status = "With --check, 1 when DIR's seeds are not current.",
            .examples = "rm -r tests/fuzz/corpus && build/bin/parasync-fuzz-corpus "
                        "tests/fuzz/corpus\n"
                        "build/bin/parasync-fuzz-corpus --check tests/fuzz/corpus"});
  bool check = false;
  std::string dir_text;
  app.add_flag("--check", check, "Verify DIR instead of writing it");
  app.add_option("dir", dir_text, "The corpus directory")->required()->type_name("DIR");
  if (auto done = ParseCommandLine(app, argc, argv)) return *done;
  if (dir_text.starts_with("-")) {
    return PrintErrorLine("parasync-fuzz-corpus",
                          "DIR '" + dir_text + "' looks like a flag; write ./" + dir_text +
                              " for a directory of that name",
                          kExitBadUsage);
  }
  const SeedFiles seeds = AllSeeds();
  return check ? CheckCorpus(dir_text, seeds, argv[0]) : WriteCorpus(dir_text, seeds);
}
