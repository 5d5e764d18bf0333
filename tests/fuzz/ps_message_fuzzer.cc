// libFuzzer target: raw messages through the parameter server's real receive, validation and
// handling path (Server::ServeOnce, one turn of Server::Run's loop) — see docs/fuzzing.md.
//
// Each input (format: fuzz_input.h) gets a fresh ZeroMQ context and a fresh Server (shard 0 of
// 2, 2 workers, the mode and optimizer its config byte picks), optionally with the small model
// registered first, and a DEALER over inproc that sends the input's messages one by one, each
// frame as given. After each message the server serves exactly one turn and every reply it
// sent is read back and checked. A crash, a leak, a sanitizer report or an abort() below is
// a finding:
//   - every reply decodes with the server's own decoder and speaks kProtocolVersion;
//   - a successful pull reply carries one frame of count * DTypeSize(its dtype) bytes per
//     slice range, then one of count * dim * DTypeSize bytes per row range (of a table the
//     server has); every other reply carries none;
//   - the embedding rows held never exceed the server's row cap (kMaxTableRows here, so
//     that the seeds evict), and a turn that leaves the shard's version where it was changes
//     no row (values, optimizer slots, update counts, which rows are held): a refused or
//     dropped push, a pull, anything else; a refused push adds no accumulated sync row;
//   - the final Stats reply's rows_held is what the shard holds;
//   - unless a Shutdown was accepted, a final Stats request is answered and counts exactly
//     the requests sent (nothing lost, nothing handled twice).
// One resource bound, like -max_len: a Register whose model would be cut into more than
// kMaxSlices slices is not sent. SliceMap::Build sorts and places every slice before the
// model-size check, so such inputs (up to SliceMap::kMaxSlices, 4M slices) took ~90% of the
// fuzzing time while adding no coverage; the slicing limits have unit tests of their own.
// Without PARASYNC_FUZZ this file is linked with replay_main.cc instead of libFuzzer.
#include <pthread.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "common/float_codec.h"
#include "common/slice_map.h"
#include "common/wire.h"
#include "ps/embedding_table.h"
#include "ps/ps_metrics.h"
#include "ps/row_snapshot.h"
#include "ps/server.h"
#include "tests/fuzz/fuzz_input.h"

namespace parasync::fuzz {
namespace {

constexpr char kEndpoint[] = "inproc://parasync-ps-fuzz";
// The message is already queued when the server is asked to serve it; this only bounds a hang.
constexpr std::chrono::milliseconds kServeTimeout{10000};
// A registration is a remote request: the real parasync-ps bounds it by its memory; the
// fuzzer bounds it much lower so that no input can allocate much.
constexpr int64_t kMaxModelBytes = int64_t{16} << 20;

constexpr int64_t kMaxSlices = 4096;

// The server's row cap (--max-table-rows): below the distinct rows the seeds push, so that
// creating a row evicts another.
constexpr int64_t kMaxTableRows = 8;

// True for a Register that would build a map of more than kMaxSlices slices (see above).
bool TooManySlices(const Message& message) {
  if (message.empty()) return false;
  Result<Header> h = DecodeHeader(message[0].data(), message[0].size());
  if (!h.ok() || h->type != MsgType::kRegister || !h->registration) return false;
  const ModelRegistration& reg = *h->registration;
  if (!ValidateVariables(reg.variables).ok() || reg.max_slice_elements < 1) return false;
  int64_t total = 0;
  for (const VariableSpec& v : reg.variables) total += v.num_elements();
  const int64_t bound = SliceMap::EffectiveSliceBound(total, reg.max_slice_elements, kNumShards);
  int64_t slices = 0;
  for (const VariableSpec& v : reg.variables) slices += (v.num_elements() + bound - 1) / bound;
  return slices > kMaxSlices;
}

[[noreturn]] void Violated(const std::string& what) {
  std::fprintf(stderr, "ps_message_fuzzer: invariant violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// libFuzzer's -timeout runs on SIGALRM. Taken by this thread inside a ZeroMQ call, it makes
// the call fail with EINTR: the server's turn comes back idle with the message still queued,
// or its reply is not sent — what parasync-ps only meets when SIGTERM or SIGINT stops it
// anyway, and not what is fuzzed here. So an input runs with SIGALRM blocked in this thread
// and in the ZeroMQ threads it starts (they inherit the mask); the signal goes to libFuzzer's
// own RSS thread or waits for the end of the input, so -timeout still works.
class AlarmBlocked {
 public:
  AlarmBlocked() {
    sigset_t alarm;
    sigemptyset(&alarm);
    sigaddset(&alarm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alarm, &old_);
  }
  ~AlarmBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  AlarmBlocked(const AlarmBlocked&) = delete;
  AlarmBlocked& operator=(const AlarmBlocked&) = delete;

 private:
  sigset_t old_;
};

PsMetrics& Metrics() {
  // One registry for the process (metrics only count); never destroyed, so never a leak.
  static PsMetrics* metrics = new PsMetrics(0, kNumWorkers);
  return *metrics;
}

void SendFrames(zmq::socket_t& dealer, const Message& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    zmq::message_t part(frames[i].data(), frames[i].size());
    const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    if (!dealer.send(part, flags)) Violated("the DEALER could not queue a message");
  }
}

// Reads and checks every reply waiting on `dealer`; `tables` are the server's (for the width
// of a pull reply's rows).
std::vector<Header> DrainReplies(zmq::socket_t& dealer, const Shard& shard) {
  const EmbeddingTables& tables = shard.tables();
  std::vector<Header> replies;
  for (;;) {
    zmq::message_t head;
    if (!dealer.recv(head, zmq::recv_flags::dontwait)) return replies;
    std::vector<zmq::message_t> tensors;
    bool more = head.more();
    while (more) {
      zmq::message_t part;
      if (!dealer.recv(part, zmq::recv_flags::none)) Violated("a reply ended mid-message");
      more = part.more();
      tensors.push_back(std::move(part));
    }
    Result<Header> h = DecodeHeader(head.data(), head.size());
    if (!h.ok()) Violated("a reply fails the server's own decoder: " + h.status().message());
    if (h->protocol_version != kProtocolVersion) Violated("a reply of another protocol version");
    if (h->type == MsgType::kPull && h->status.ok()) {
      if (tensors.size() != h->slices.size() + h->rows.size()) {
        Violated("a pull reply has " + std::to_string(tensors.size()) + " tensor frames for " +
                 std::to_string(h->slices.size()) + " slice ranges and " +
                 std::to_string(h->rows.size()) + " row ranges");
      }
      // A pull may ask for 16-bit, int8 or top-k values (--wire-dtype); the reply says which
      // it carries (int8's and top-k's lengths depend on where the range sits in its
      // variable).
      const SliceMap* map = shard.slice_map();
      for (size_t i = 0; i < h->slices.size(); ++i) {
        const SliceRange& r = h->slices[i];
        if (map == nullptr || r.slice_id >= map->slices().size()) {
          Violated("a pull reply names a slice the server has no map for");
        }
        const int64_t offset = map->slices()[r.slice_id].offset + r.begin;
        if (tensors[i].size() != WireBytes(h->wire(), static_cast<size_t>(r.count), offset)) {
          Violated("a pull reply's tensor frame has the wrong length");
        }
      }
      for (size_t k = 0; k < h->rows.size(); ++k) {
        const RowRange& r = h->rows[k];
        if (r.table >= static_cast<uint32_t>(tables.num_tables()) || r.count < 0) {
          Violated("a pull reply names a row range the server has no table for");
        }
        const size_t want = static_cast<size_t>(r.count) *
                            static_cast<size_t>(tables.table(r.table).dim) * DTypeSize(h->dtype);
        if (tensors[h->slices.size() + k].size() != want) {
          Violated("a pull reply's values frame has the wrong length");
        }
      }
    } else if (!tensors.empty()) {
      Violated("a reply that is no successful pull carries tensor frames");
    }
    replies.push_back(std::move(h).value());
  }
}

std::string HeaderFrame(const Header& h) {
  std::vector<uint8_t> bytes = EncodeHeader(h);
  return std::string(bytes.begin(), bytes.end());
}

// The server an input meets: shard 0 of kNumShards in `config`'s mode, on kEndpoint.
ServerOptions FuzzServerOptions(const Config& config) {
  ServerOptions options;
  options.endpoint = kEndpoint;
  options.shard_index = 0;
  options.num_shards = kNumShards;
  options.num_workers = kNumWorkers;
  options.mode = config.mode;
  options.replicas_to_aggregate = config.replicas_to_aggregate;
  // Timeouts are either out of reach of any input or zero (every turn expires them), so
  // that an input does the same every time it runs.
  options.worker_timeout = config.zero_worker_timeout ? std::chrono::milliseconds(0)
                                                      : std::chrono::hours(1);
  options.barrier_timeout = config.zero_barrier_timeout ? std::chrono::milliseconds(0)
                                                        : std::chrono::hours(1);
  options.max_model_bytes = kMaxModelBytes;
  // The memory limits in force, tight: inputs reach 16 KiB (-max_len), so messages past the
  // whole-message bound are refused; the unread-reply cap is the smallest there is (one
  // shard's values), and the harness drains every reply, so honest pulls still pass it.
  options.max_message_bytes = 8192;
  options.max_unread_reply_bytes = 1;
  options.drop_push_reply_every = config.drop_push_replies ? 2 : 0;
  options.max_table_rows = kMaxTableRows;
  return options;
}

// Checks the reply to the harness's final Stats request (request id UINT64_MAX) among
// `replies`: every one of the `sent` requests counted, no more rejected than sent, and the
// rows held as `tables` holds them.
void CheckFinalStats(const std::vector<Header>& replies, int64_t sent,
                     const EmbeddingTables& tables) {
  const Header* reply = nullptr;
  for (const Header& r : replies) {
    if (r.request_id == UINT64_MAX && r.type == MsgType::kStats) reply = &r;
  }
  if (reply == nullptr || !reply->status.ok() || !reply->stats) Violated("no Stats reply");
  if (reply->stats->requests != sent) {
    Violated("the server counted " + std::to_string(reply->stats->requests) + " requests of " +
             std::to_string(sent) + " sent");
  }
  if (reply->stats->rejected > sent) Violated("more rejections than requests");
  if (reply->stats->rows_held != tables.rows_held()) {
    Violated("the Stats reply says " + std::to_string(reply->stats->rows_held) +
             " rows held, the shard holds " + std::to_string(tables.rows_held()));
  }
}

void RunInput(const uint8_t* data, size_t size) {
  const AlarmBlocked alarm_blocked;  // first in, last out: covers every ZeroMQ call
  const Input input = Parse(data, size);
  const Config config = Config::FromByte(input.config);

  // io_threads 0: inproc only. Per input, so that its sockets are gone when it returns.
  zmq::context_t context(0);
  const ServerOptions options = FuzzServerOptions(config);
  auto created = Server::Create(context, options, &Metrics());
  if (!created.ok()) Violated("Server::Create: " + created.status().ToString());
  std::unique_ptr<Server> server = std::move(created).value();

  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(kEndpoint);

  int64_t sent = 0;
  const Shard& shard = server->shard();
  const EmbeddingTables& tables = shard.tables();
  // Sends one message and lets the server serve one turn. False after an accepted Shutdown.
  auto exchange = [&](const Message& frames, std::vector<Header>* replies) {
    const int64_t version = shard.version();
    const int64_t accumulated = tables.accumulated_rows();
    // Copied only when there is something to compare (at most kMaxTableRows rows).
    std::vector<RowSnapshot> rows_before;
    if (tables.rows_held() > 0) rows_before = tables.SnapshotAll();
    SendFrames(dealer, frames);
    ++sent;
    Result<bool> served = server->ServeOnce(kServeTimeout);
    if (!served.ok()) Violated("the server's socket broke: " + served.status().ToString());
    std::vector<Header> got = DrainReplies(dealer, shard);
    if (tables.rows_held() > kMaxTableRows || tables.rows_held() > tables.capacity()) {
      Violated("the server holds " + std::to_string(tables.rows_held()) +
               " embedding rows, more than its cap of " + std::to_string(kMaxTableRows));
    }
    if (shard.version() == version) {
      if (tables.rows_held() != static_cast<int64_t>(rows_before.size()) ||
          (!rows_before.empty() && tables.SnapshotAll() != rows_before)) {
        Violated("a turn that applied no update changed embedding rows");
      }
      for (const Header& r : got) {
        if (r.type == MsgType::kPush && !r.status.ok() &&
            tables.accumulated_rows() > accumulated) {
          Violated("a refused push added accumulated sync rows");
        }
      }
    }
    if (replies != nullptr) *replies = std::move(got);
    return *served;
  };

  if (config.preregister) {
    Header reg;
    reg.type = MsgType::kRegister;
    reg.rank = 0;
    reg.request_id = 1;
    reg.registration = FuzzModel(config);
    std::vector<Header> replies;
    exchange({HeaderFrame(reg)}, &replies);
    if (replies.size() != 1 || !replies[0].status.ok()) Violated("the harness's Register failed");
  }
  for (const Message& message : input.messages) {
    if (TooManySlices(message)) continue;
    if (!exchange(message, nullptr)) return;  // an accepted Shutdown: parasync-ps exits here
  }
  Header stats;
  stats.type = MsgType::kStats;
  stats.rank = -1;
  stats.request_id = UINT64_MAX;
  std::vector<Header> replies;
  if (!exchange({HeaderFrame(stats)}, &replies)) Violated("a Stats request stopped the server");
  CheckFinalStats(replies, sent, tables);
}

}  // namespace
}  // namespace parasync::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Rejections are logged (rate-limited per server, but every input has a fresh server):
  // silence them unless asked, e.g. to read what a reproducer does.
  if (std::getenv("PARASYNC_FUZZ_LOG") == nullptr) spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  parasync::fuzz::RunInput(data, size);
  return 0;
}
