// Writes the PS fuzzer's seed corpus (tests/fuzz/corpus) with the real encoder: valid
// Register / Pull / Push / Stats / Heartbeat / Leave exchanges for every mode, plus a few
// malformed messages. Regenerate after a wire change (e.g. kProtocolVersion):
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

class Seeds {
 public:
  explicit Seeds(Config config) : config_(config), model_(FuzzModel(config)) {
    auto map = SliceMap::Build(model_.variables, model_.max_slice_elements, kNumShards);
    if (!map.ok()) {
      std::fprintf(stderr, "%s\n", map.status().ToString().c_str());
      std::exit(1);
    }
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
  const std::filesystem::path dir = dir_text;
  std::vector<std::pair<std::string, std::string>> seeds;  // name, bytes
  auto write = [&](const std::string& name, const std::string& data) {
    seeds.emplace_back(name, data);
  };

  // A training exchange of both ranks in every mode, each with another optimizer.
  struct Variant {
    const char* name;
    Config config;
  };
  const Variant variants[] = {
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
  for (const Variant& v : variants) {
    Seeds s(v.config);
    write("train-" + std::string(v.name),
          s.Input({s.Simple(MsgType::kHeartbeat, 0), s.Simple(MsgType::kHeartbeat, 1),
                   s.Pull(0, 0, s.here()), s.Pull(1, 0, s.here()), s.Push(0, 0, s.here()),
                   s.Pull(0, 1, s.here()), s.Push(1, 0, s.here()), s.Pull(1, 1, s.here()),
                   s.Push(0, 1, s.here()), s.Push(0, 1, s.here()), s.Stats(),
                   s.Simple(MsgType::kLeave, 1), s.Push(0, 2, s.here())}));
  }
  {
    // Registration through the fuzzed path: first, idempotent again, then a pull and a push.
    Seeds s(MakeConfig(0, false, OptimizerKind::kMomentum));
    write("register-async", s.Input({s.Register(0), s.Register(1), s.Pull(-1, 0, s.here()),
                                     s.Push(-1, 0, {s.here().front()})}));
    Seeds sync(MakeConfig(1, false, OptimizerKind::kSgd));
    write("register-sync", sync.Input({sync.Register(1), sync.Push(0, 0, sync.here()),
                                       sync.Push(1, 0, sync.here()), sync.Pull(0, 1, sync.here())}));
    write("stats-unregistered", s.Input({s.Stats()}));
    write("heartbeat-unregistered", s.Input({s.Simple(MsgType::kHeartbeat, 0)}));
  }
  {
    Seeds s(MakeConfig(0, true, OptimizerKind::kSgd));
    write("checkpoint-no-store", s.Input({s.Simple(MsgType::kCheckpoint, 0)}));
    write("shutdown", s.Input({s.Simple(MsgType::kShutdown, -1), s.Stats()}));
    // Part of a slice: the range [10, +20) of the first slice held here.
    SliceRange part = s.here().front();
    part.begin = 10;
    part.count = 20;
    write("partial-ranges", s.Input({s.Pull(0, 0, {part}), s.Push(0, 0, {part})}));
  }

  // Malformed: each is refused with an error reply and changes nothing.
  {
    Seeds s(MakeConfig(1, true, OptimizerKind::kSgd));
    const std::vector<SliceRange> here = s.here();
    write("bad-empty-header", s.Input({{std::string()}}));
    write("bad-garbage-header", s.Input({{std::string("\x10\x00\x00\x00garbage-not-a-flatbuffer", 28)}}));
    Message push = s.Push(0, 0, here);
    write("bad-truncated-header", s.Input({{push[0].substr(0, push[0].size() / 2)}}));
    Header old = s.Base(MsgType::kPull, 0);
    old.protocol_version = kProtocolVersion - 1;
    write("bad-protocol-version", s.Input({{Frame(old)}}));
    Message short_frame = s.Push(0, 0, here);
    short_frame[1].pop_back();
    write("bad-frame-length", s.Input({short_frame}));
    Message missing = s.Push(0, 0, here);
    missing.pop_back();
    write("bad-frame-count", s.Input({missing, {s.Pull(0, 0, here)[0], std::string(8, '\0')}}));
    write("bad-nonfinite",
          s.Input({s.Push(0, 0, here, std::numeric_limits<float>::quiet_NaN()),
                   s.Push(1, 0, here, std::numeric_limits<float>::infinity())}));
    std::vector<SliceRange> reversed(here.rbegin(), here.rend());
    write("bad-order", s.Input({s.Pull(0, 0, reversed)}));
    write("bad-unknown-slice",
          s.Input({s.Pull(0, 0, s.elsewhere()), s.Pull(0, 0, {{999, 0, 1}})}));
    SliceRange outside = here.front();
    outside.begin = outside.count - 5;
    write("bad-range", s.Input({s.Pull(0, 0, {outside}), s.Push(0, 0, {outside})}));
    write("bad-rank", s.Input({s.Simple(MsgType::kHeartbeat, 7), s.Push(-1, 0, here),
                               s.Simple(MsgType::kLeave, -5)}));
    write("bad-version", s.Input({s.Push(0, 5, here), s.Push(1, -1, here)}));
    Message batch = s.Push(0, 0, here);
    {
      Header h = s.Base(MsgType::kPush, 0);
      h.slices = here;
      h.batch_examples = -1;
      batch[0] = Frame(h);
    }
    write("bad-batch-examples", s.Input({batch}));
    // Registrations that must be refused: another model than the one registered, an invalid
    // optimizer, the wrong shard count, a model over the size bound.
    ModelRegistration other = FuzzModel(MakeConfig(1, true, OptimizerKind::kSgd));
    other.variables[0].shape = {20, 11};
    Header mismatch = s.Base(MsgType::kRegister, 0);
    mismatch.registration = other;
    write("bad-register-mismatch", s.Input({{Frame(mismatch)}}));
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
    write("bad-registrations", fresh.Input({{Frame(bad_lr)}, {Frame(bad_shards)}, {Frame(too_big)},
                                            {Frame(wrong_mode)}, fresh.Pull(0, 0, fresh.here())}));
  }
  size_t bytes = 0;
  for (const auto& [name, data] : seeds) bytes += data.size();
  if (check) {
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
                   dir.c_str(), stale, files, seeds.size(), dir.c_str(), argv[0], dir.c_str());
      return 1;
    }
    std::printf("%s: all %zu seeds current (%zu bytes)\n", dir.c_str(), seeds.size(), bytes);
    return 0;
  }
  std::filesystem::create_directories(dir);
  for (const auto& [name, data] : seeds) {
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
      return 1;
    }
  }
  std::printf("wrote %zu seeds, %zu bytes, to %s\n", seeds.size(), bytes, dir.c_str());
  return 0;
}
