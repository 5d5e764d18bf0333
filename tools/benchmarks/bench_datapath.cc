// parasync-bench: the data-path benchmark (issue 10). One run measures, each figure the median
// of --repeats repeats of about --seconds each:
//
//   memcpy    memcpy bandwidth per tensor size and for 64 MiB;
//   zmq       the raw ZeroMQ ceiling: a bare DEALER (client thread) and ROUTER (server thread)
//             per server over loopback TCP, zero-copy sends in frames of at most 256 KiB (the
//             worker's default slice), a 16-byte request and an 8-byte ack as the only extra
//             bytes; nothing is copied or read on either side; patterns push, pull, push+pull;
//   push, pull, pushpull
//             parasync's path for the same sizes, patterns and concurrency: real Servers
//             (async, SGD) serving in threads and real PsClients (one per client thread),
//             with the ratio to the raw ceiling of the same row measured in the same run;
//   barrier   sync-mode round latency (PushPull: the gradient out, the next step in) for
//             2, 4, 8 workers;
//   apply     ApplyUpdate on a 64 MiB variable for SGD, momentum and Adam, vs memcpy;
//   small     pipelined pulls of 1 KiB slices against one server, vs raw ZeroMQ: 64 in
//             flight per client, which the server queues (a connection's small requests
//             are taken past its count of 3 by their weight, docs/reliability.md);
//   rows      embedding rows (issue 25): rows per second of a Pull of 4096 sorted unique ids'
//             rows then a Push of their gradient rows, for a table of 16 and 64 floats a row,
//             ids drawn Zipf (1.1 over 10M) or uniform over 2^63, real Servers (async,
//             adagrad, max_table_rows 2^20 each), vs a raw pair moving the same bytes.
//
// Everything runs in this process on 127.0.0.1; every server and every client has its own
// ZeroMQ context (one I/O thread each), as separate processes would. A tensor is split
// evenly over the servers and sent to all of them in parallel. Every loop is bounded in
// count and in time, every request in time; any error ends the run (exit 1) before a figure
// is printed. Progress lines (stderr) add what explains a gap: CPU seconds per GB of every
// thread, page faults per MB (fresh message buffers) and how busy the server loops were.
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "common/model_spec.h"
#include "common/process.h"
#include "common/slice_map.h"
#include "common/transport.h"
#include "common/wire.h"
#include "ps/embedding_table.h"
#include "ps/optimizer.h"
#include "ps/ps_metrics.h"
#include "ps/server.h"
#include "tools/benchmarks/stats.h"
#include "worker/ps_client.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace parasync;
using bench::Median;
using bench::Percentile;
constexpr const char* kProgram = "parasync-bench";

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * 1024;
// Per thread and measurement: loops stop at this count even if time is left.
constexpr int64_t kMaxRounds = 1000000;
// A request without a reply for this long fails the run.
constexpr std::chrono::milliseconds kReplyTimeout{20000};
// Raw ZeroMQ sends a server's part of a tensor as frames of at most this many bytes: the
// worker's default slice, so the ceiling is framed as parasync's messages are. (One frame of
// tens of MiB is slower, not faster: the receiver mallocs each message, and above glibc's
// mmap threshold that is fresh pages to fault in and zero every time.)
constexpr int64_t kFrameBytes = kDefaultMaxSliceElements * 4;

const std::vector<std::string> kSections = {"memcpy",  "zmq",   "push",  "pull", "pushpull",
                                            "barrier", "apply", "small", "rows"};

// ---- small helpers --------------------------------------------------------------------------

Clock::duration Dur(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double Since(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

std::string SizeText(int64_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return fmt::format("{} MiB", bytes / kMiB);
  if (bytes >= kKiB && bytes % kKiB == 0) return fmt::format("{} KiB", bytes / kKiB);
  return fmt::format("{} B", bytes);
}

void Progress(const std::string& line) {
  std::fprintf(stderr, "%s: %s\n", kProgram, line.c_str());
  std::fflush(stderr);
}

// Keeps the compiler from dropping a copy nobody reads.
inline void Clobber(const void* p) { __asm__ __volatile__("" : : "r"(p) : "memory"); }

void NoFree(void* /*data*/, void* /*hint*/) {}

// CPU seconds `t` has used so far (0 if it cannot be read).
double ThreadCpuSeconds(std::thread& t) {
  clockid_t id;
  timespec ts{};
  if (!t.joinable() || pthread_getcpuclockid(t.native_handle(), &id) != 0 ||
      clock_gettime(id, &ts) != 0) {
    return 0;
  }
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Page faults so far (fresh pages: malloc'd message buffers the kernel must map and zero).
double ProcessPageFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_minflt);
}

// Context switches of every thread so far, voluntary (a thread blocked: a wake-up to come)
// and involuntary (preempted).
double ProcessContextSwitches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_nvcsw + u.ru_nivcsw);
}

enum class Pattern { kPush, kPull, kPushPull };
constexpr Pattern kPatterns[] = {Pattern::kPush, Pattern::kPull, Pattern::kPushPull};

const char* PatternName(Pattern p) {
  switch (p) {
    case Pattern::kPush: return "push";
    case Pattern::kPull: return "pull";
    case Pattern::kPushPull: return "push+pull";
  }
  return "?";
}

const char* PatternSection(Pattern p) {
  switch (p) {
    case Pattern::kPush: return "push";
    case Pattern::kPull: return "pull";
    case Pattern::kPushPull: return "pushpull";
  }
  return "?";
}

// Payload bytes one round moves for a tensor of `bytes`.
int64_t RoundBytes(Pattern p, int64_t bytes) { return p == Pattern::kPushPull ? 2 * bytes : bytes; }

struct Settings {
  bool json = false;
  bool quick = false;
  int repeats = 5;
  double seconds = 0.25;
  std::vector<std::string> only;
  std::vector<int64_t> sizes;
  std::vector<int> shard_counts = {1, 2};
  std::vector<int> worker_counts = {1, 4};
  std::vector<int> barrier_workers = {2, 4, 8};
  std::vector<int> small_clients = {1, 2};
  std::vector<int64_t> row_dims = {16, 64};  // floats per embedding row (section rows)
  std::vector<int> row_workers = {1};        // client threads of the rows section
  int window = 64;
  int apply_threads = 2;  // as parasync-ps
  int copy_threads = 2;   // as parasync-worker
  DType wire_dtype = DType::kFloat32;  // the parasync clients of the data-path rows
  bool no_ceiling = false;  // parasync's data-path rows without the raw pair beside them
  bool Want(const std::string& section) const {
    return only.empty() || std::find(only.begin(), only.end(), section) != only.end();
  }
};

// ---- results --------------------------------------------------------------------------------

struct Row {
  std::string what;
  std::optional<int64_t> size;
  std::optional<int> shards;
  std::optional<int> workers;
  double median = 0;
  std::optional<double> p99;
  std::string unit;
  std::optional<double> ceiling;
  std::optional<double> ratio;
};

std::string Figure(double v, const std::string& unit) {
  if (unit == "GB/s") return fmt::format("{:.3g}", v);  // 3 significant digits: 0.0432, 1.87
  if (unit == "us") return fmt::format("{:.1f}", v);
  return fmt::format("{:.0f}", v);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

template <typename T>
std::string JsonOr(const std::optional<T>& v) {
  if (!v) return "null";
  if constexpr (std::is_floating_point_v<T>) return fmt::format("{:.6g}", *v);
  return std::to_string(*v);
}

class Report {
 public:
  void Add(Row row) { rows_.push_back(std::move(row)); }
  // A line printed under the table (once).
  void Note(const std::string& line) {
    if (std::find(notes_.begin(), notes_.end(), line) == notes_.end()) notes_.push_back(line);
  }

  void PrintJson() const {
    for (const Row& r : rows_) {
      std::printf("{\"what\":%s,\"size\":%s,\"shards\":%s,\"workers\":%s,\"median\":%s,"
                  "\"p99\":%s,\"unit\":%s,\"ceiling\":%s,\"ratio\":%s}\n",
                  JsonString(r.what).c_str(), JsonOr(r.size).c_str(), JsonOr(r.shards).c_str(),
                  JsonOr(r.workers).c_str(), fmt::format("{:.6g}", r.median).c_str(),
                  JsonOr(r.p99).c_str(), JsonString(r.unit).c_str(), JsonOr(r.ceiling).c_str(),
                  JsonOr(r.ratio).c_str());
    }
  }

  void PrintTable(const std::string& preamble) const {
    std::printf("%s\n", preamble.c_str());
    std::printf("| what | size | shards | workers | median | p99 | unit | ceiling | ratio |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    auto opt_int = [](const std::optional<int>& v) { return v ? std::to_string(*v) : "-"; };
    for (const Row& r : rows_) {
      std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.what.c_str(),
                  r.size ? SizeText(*r.size).c_str() : "-", opt_int(r.shards).c_str(),
                  opt_int(r.workers).c_str(), Figure(r.median, r.unit).c_str(),
                  r.p99 ? Figure(*r.p99, r.unit).c_str() : "-", r.unit.c_str(),
                  r.ceiling ? Figure(*r.ceiling, r.unit).c_str() : "-",
                  r.ratio ? fmt::format("{:.2f}", *r.ratio).c_str() : "-");
    }
    std::printf(
        "\nceiling: the raw ZeroMQ figure of the same pattern, size, shards and workers (for "
        "apply: memcpy of 64 MiB); ratio = median / ceiling. GB/s = 1e9 payload bytes per "
        "second summed over workers (push+pull counts both directions). barrier: median = "
        "p50 of every round of every worker, p99 likewise, each the median over repeats.\n");
    for (const std::string& n : notes_) std::printf("%s\n", n.c_str());
    std::fflush(stdout);
  }

 private:
  std::vector<Row> rows_;
  std::vector<std::string> notes_;
};

// ---- running N threads at once --------------------------------------------------------------

struct LoopResult {
  int64_t rounds = 0;  // summed over threads
  double seconds = 0;  // from the common start to the last thread's end
};

// Runs round(w) on `threads` threads w = 0.., started together, each until `seconds` have
// passed since the start or it has done `max_rounds` rounds (at least one round). The first
// error stops every thread after its current round and is returned.
template <typename RoundFn>
Result<LoopResult> RunParallel(int threads, double seconds, int64_t max_rounds, RoundFn round) {
  const auto n = static_cast<size_t>(threads);
  std::latch ready(threads);
  std::latch go(1);
  Clock::time_point start;
  Clock::time_point deadline;
  std::vector<int64_t> rounds(n, 0);
  std::vector<Clock::time_point> ends(n);
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first;
  {
    std::vector<std::jthread> running;
    for (size_t w = 0; w < n; ++w) {
      running.emplace_back([&, w] {
        ready.count_down();
        go.wait();
        int64_t done = 0;
        while (done < max_rounds && !failed.load()) {
          Status s;
          try {
            s = round(static_cast<int>(w));
          } catch (const std::exception& e) {
            s = Status::Internal(std::string("exception: ") + e.what());
          }
          if (!s.ok()) {
            std::lock_guard<std::mutex> lock(mu);
            if (first.ok()) first = s;
            failed.store(true);
            break;
          }
          ++done;
          if (Clock::now() >= deadline) break;
        }
        rounds[w] = done;
        ends[w] = Clock::now();
      });
    }
    ready.wait();
    start = Clock::now();
    deadline = start + Dur(seconds);
    go.count_down();
  }  // joins
  if (!first.ok()) return first;
  LoopResult r;
  for (size_t w = 0; w < n; ++w) {
    r.rounds += rounds[w];
    r.seconds = std::max(r.seconds, Since(start, ends[w]));
  }
  return r;
}

// ---- raw ZeroMQ -----------------------------------------------------------------------------

// What a raw client asks: reply_bytes of payload (in frames of at most kFrameBytes) after the
// 8-byte ack that echoes `id`.
struct RawRequest {
  uint64_t reply_bytes = 0;
  uint64_t id = 0;
};

void SetCommonOptions(zmq::socket_t& s) {
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::sndhwm, 1000);
  s.set(zmq::sockopt::rcvhwm, 1000);
  s.set(zmq::sockopt::sndtimeo, static_cast<int>(kReplyTimeout.count()));
  s.set(zmq::sockopt::rcvtimeo, static_cast<int>(kReplyTimeout.count()));
}

// A bare ROUTER in its own thread and context: reads each request (and the pushed payload,
// untouched), answers an ack and, if asked, payload straight from a preallocated buffer.
class RawServer {
 public:
  explicit RawServer(int64_t reply_capacity)
      : reply_(static_cast<size_t>(reply_capacity), 7) {
    SetCommonOptions(socket_);
    socket_.bind("tcp://127.0.0.1:0");
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { Loop(); });
  }
  ~RawServer() { (void)Finish(); }
  RawServer(const RawServer&) = delete;
  RawServer& operator=(const RawServer&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  double CpuSeconds() { return ThreadCpuSeconds(thread_); }

  // Stops the thread; its error, if it had one.
  Status Finish() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return error_;
  }

 private:
  void Loop() {
    try {
      while (!stop_.load()) {
        zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
        for (;;) {
          zmq::message_t identity;
          if (!socket_.recv(identity, zmq::recv_flags::dontwait)) break;
          zmq::message_t head;
          if (!identity.more() || !socket_.recv(head) || head.size() != sizeof(RawRequest)) {
            error_ = Status::Corruption("raw server: malformed request");
            return;
          }
          RawRequest req;
          std::memcpy(&req, head.data(), sizeof(req));
          for (bool more = head.more(); more;) {  // the pushed payload: received, not read
            zmq::message_t part;
            if (!socket_.recv(part)) {
              error_ = Status::Corruption("raw server: truncated request");
              return;
            }
            more = part.more();
          }
          if (req.reply_bytes > reply_.size()) {
            error_ = Status::InvalidArgument("raw server: reply larger than its buffer");
            return;
          }
          zmq::message_t ack(&req.id, sizeof(req.id));
          if (!socket_.send(identity, zmq::send_flags::sndmore) ||
              !socket_.send(ack, req.reply_bytes > 0 ? zmq::send_flags::sndmore
                                                     : zmq::send_flags::none)) {
            error_ = Status::Unavailable("raw server: send timed out");
            return;
          }
          const auto total = static_cast<int64_t>(req.reply_bytes);
          for (int64_t at = 0; at < total; at += kFrameBytes) {
            const int64_t len = std::min(kFrameBytes, total - at);
            zmq::message_t payload(reply_.data() + at, static_cast<size_t>(len), NoFree, nullptr);
            if (!socket_.send(payload, at + len < total ? zmq::send_flags::sndmore
                                                        : zmq::send_flags::none)) {
              error_ = Status::Unavailable("raw server: send timed out");
              return;
            }
          }
        }
      }
    } catch (const zmq::error_t& e) {
      error_ = Status::Internal(std::string("raw server: ") + e.what());
    }
  }

  // Sent borrowed: declared before the context, so it outlives the I/O thread that sends it.
  std::vector<char> reply_;  // read only once the thread runs
  zmq::context_t context_{1};
  zmq::socket_t socket_{context_, zmq::socket_type::router};
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  Status error_;  // written by the thread, read after the join
  std::thread thread_;
};

// One client thread's DEALERs (one per server) in its own context.
class RawClient {
 public:
  explicit RawClient(const std::vector<std::string>& endpoints) {
    for (const std::string& e : endpoints) {
      sockets_.emplace_back(context_, zmq::socket_type::dealer);
      SetCommonOptions(sockets_.back());
      sockets_.back().connect(e);
    }
  }

  // One round of `pattern` for a tensor of `bytes` split evenly over the servers, sent from
  // `payload` without copying; waits for every server's answer.
  Status Round(Pattern pattern, int64_t bytes, const char* payload) {
    const auto n = static_cast<int64_t>(sockets_.size());
    const uint64_t id = next_id_++;
    for (int64_t s = 0; s < n; ++s) {
      const int64_t begin = s * bytes / n;
      const int64_t len = (s + 1) * bytes / n - begin;
      RawRequest req{pattern == Pattern::kPush ? 0 : static_cast<uint64_t>(len), id};
      const bool carry = pattern != Pattern::kPull;
      zmq::message_t head(&req, sizeof(req));
      auto& sock = sockets_[static_cast<size_t>(s)];
      if (!sock.send(head, carry ? zmq::send_flags::sndmore : zmq::send_flags::none)) {
        return Status::Unavailable("raw client: send timed out");
      }
      for (int64_t at = 0; carry && at < len; at += kFrameBytes) {
        const int64_t frame = std::min(kFrameBytes, len - at);
        zmq::message_t body(const_cast<char*>(payload + begin + at), static_cast<size_t>(frame),
                            NoFree, nullptr);
        if (!sock.send(body, at + frame < len ? zmq::send_flags::sndmore
                                              : zmq::send_flags::none)) {
          return Status::Unavailable("raw client: send timed out");
        }
      }
    }
    for (int64_t s = 0; s < n; ++s) {
      const int64_t len = (s + 1) * bytes / n - s * bytes / n;
      PARASYNC_RETURN_IF_ERROR(ReceiveReply(static_cast<size_t>(s), id,
                                            pattern == Pattern::kPush ? 0 : len));
    }
    return Status::Ok();
  }

  // Pipelined small requests to server 0: one request for `reply_bytes`.
  Status SendSmall(int64_t reply_bytes) {
    RawRequest req{static_cast<uint64_t>(reply_bytes), next_id_++};
    zmq::message_t head(&req, sizeof(req));
    if (!sockets_[0].send(head, zmq::send_flags::none)) {
      return Status::Unavailable("raw client: send timed out");
    }
    ++outstanding_;
    return Status::Ok();
  }
  Status ReceiveSmall(int64_t reply_bytes) {
    PARASYNC_RETURN_IF_ERROR(ReceiveReply(0, expected_++, reply_bytes));
    --outstanding_;
    return Status::Ok();
  }
  int outstanding() const { return outstanding_; }

  // One embedding round as raw bytes, `rows` ids split evenly over the servers: to each, its
  // ids (8 bytes a row) asking for dim floats a row back; then to each, its ids and dim
  // floats a row, acked. Sent from `ids` and `values` without copying.
  Status RowsRound(int64_t rows, int64_t dim, const char* ids, const char* values) {
    const auto n = static_cast<int64_t>(sockets_.size());
    const int64_t row_bytes = dim * 4;
    for (bool push : {false, true}) {
      const uint64_t id = next_id_++;
      for (int64_t s = 0; s < n; ++s) {
        const int64_t begin = s * rows / n, count = (s + 1) * rows / n - begin;
        RawRequest req{push ? 0 : static_cast<uint64_t>(count * row_bytes), id};
        zmq::message_t head(&req, sizeof(req));
        zmq::message_t id_frame(const_cast<char*>(ids + begin * 8), static_cast<size_t>(count * 8),
                                NoFree, nullptr);
        auto& sock = sockets_[static_cast<size_t>(s)];
        bool sent = sock.send(head, zmq::send_flags::sndmore) &&
                    sock.send(id_frame, push ? zmq::send_flags::sndmore : zmq::send_flags::none);
        if (sent && push) {
          zmq::message_t body(const_cast<char*>(values + begin * row_bytes),
                              static_cast<size_t>(count * row_bytes), NoFree, nullptr);
          sent = sock.send(body, zmq::send_flags::none).has_value();
        }
        if (!sent) return Status::Unavailable("raw client: send timed out");
      }
      for (int64_t s = 0; s < n; ++s) {
        const int64_t count = (s + 1) * rows / n - s * rows / n;
        PARASYNC_RETURN_IF_ERROR(
            ReceiveReply(static_cast<size_t>(s), id, push ? 0 : count * row_bytes));
      }
    }
    return Status::Ok();
  }

 private:
  Status ReceiveReply(size_t s, uint64_t id, int64_t body_bytes) {
    zmq::message_t ack;
    if (!sockets_[s].recv(ack)) {
      return Status::TimedOut(fmt::format("raw client: no reply within {} ms",
                                          kReplyTimeout.count()));
    }
    uint64_t got = 0;
    if (ack.size() != sizeof(got)) return Status::Corruption("raw client: bad ack");
    std::memcpy(&got, ack.data(), sizeof(got));
    if (got != id) return Status::Corruption("raw client: reply to another request");
    if (body_bytes == 0) {
      if (ack.more()) return Status::Corruption("raw client: unexpected payload");
      return Status::Ok();
    }
    int64_t got_bytes = 0;
    for (bool more = ack.more(); more;) {
      zmq::message_t body;
      if (!sockets_[s].recv(body)) return Status::Corruption("raw client: truncated reply");
      got_bytes += static_cast<int64_t>(body.size());
      more = body.more();
      Clobber(body.data());
    }
    if (got_bytes != body_bytes) {
      return Status::Corruption("raw client: reply payload of the wrong size");
    }
    return Status::Ok();
  }

  zmq::context_t context_{1};
  std::vector<zmq::socket_t> sockets_;  // closed before the context
  uint64_t next_id_ = 1;
  uint64_t expected_ = 1;
  int outstanding_ = 0;
};

// ---- parasync servers and clients -----------------------------------------------------------

// `shards` real Servers, each with its own context, serving in its own thread.
class PsCluster {
 public:
  // `max_table_rows`: each server's ServerOptions::max_table_rows (0: no bound).
  static Result<std::unique_ptr<PsCluster>> Start(int shards, int workers, TrainingMode mode,
                                                  int apply_threads, int64_t max_table_rows = 0) {
    auto cluster = std::unique_ptr<PsCluster>(new PsCluster());
    for (int i = 0; i < shards; ++i) {
      auto node = std::make_unique<Node>();
      node->metrics = std::make_unique<PsMetrics>(i, workers);
      node->context = std::make_unique<zmq::context_t>(1);
      ServerOptions o;
      o.endpoint = "tcp://127.0.0.1:0";
      o.shard_index = i;
      o.num_shards = shards;
      o.num_workers = workers;
      o.mode = mode;
      o.worker_timeout = std::chrono::seconds(60);
      o.barrier_timeout = std::chrono::seconds(10);
      o.straggler_log_seconds = 0;
      o.apply_threads = apply_threads;
      o.max_table_rows = max_table_rows;
      auto server = Server::Create(*node->context, o, node->metrics.get());
      if (!server.ok()) return server.status().WithContext("starting a parasync server");
      node->server = std::move(server).value();
      cluster->addresses_.push_back(node->server->endpoint());
      Node* raw = node.get();
      PsCluster* self = cluster.get();
      node->thread = std::thread([raw, self] {
        raw->result = raw->server->Run([self] { return self->stop_.load(); });
      });
      cluster->nodes_.push_back(std::move(node));
    }
    return cluster;
  }
  ~PsCluster() { (void)Finish(); }
  PsCluster(const PsCluster&) = delete;
  PsCluster& operator=(const PsCluster&) = delete;

  const std::vector<std::string>& addresses() const { return addresses_; }
  // CPU seconds the serving threads have used, summed (the loop: what one core must carry).
  double CpuSeconds() {
    double sum = 0;
    for (auto& n : nodes_) sum += ThreadCpuSeconds(n->thread);
    return sum;
  }

  // Table t's figures summed over the servers. Precondition: Finish() returned (the
  // serving threads own the tables until then).
  EmbeddingTables::TableStats TableStats(uint32_t t) const {
    EmbeddingTables::TableStats sum;
    for (const auto& n : nodes_) {
      const EmbeddingTables::TableStats one = n->server->shard().tables().stats(t);
      sum.rows_held += one.rows_held;
      sum.rows_created += one.rows_created;
      sum.rows_evicted += one.rows_evicted;
      sum.rows_read += one.rows_read;
      sum.rows_updated += one.rows_updated;
    }
    return sum;
  }

  // Stops the servers; the first error a Run() returned.
  Status Finish() {
    stop_.store(true);
    Status first;
    for (auto& n : nodes_) {
      if (n->thread.joinable()) n->thread.join();
      if (first.ok() && !n->result.ok()) first = n->result.WithContext("a parasync server");
    }
    return first;
  }

 private:
  PsCluster() = default;
  struct Node {
    std::unique_ptr<PsMetrics> metrics;       // outlives the server
    std::unique_ptr<zmq::context_t> context;  // outlives the server's socket
    std::unique_ptr<Server> server;
    Status result;  // Run()'s, read after the join
    std::thread thread;
  };
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::string> addresses_;
  std::atomic<bool> stop_{false};
};

// One client thread's PsClient, in its own context.
struct PsWorker {
  std::unique_ptr<zmq::context_t> context;  // declared first: outlives the client
  std::unique_ptr<PsClient> client;
  std::vector<float> params;
};

Result<std::unique_ptr<PsWorker>> ConnectWorker(const std::vector<std::string>& addresses,
                                                int rank, const ModelRegistration& reg,
                                                bool sync, DType wire = DType::kFloat32,
                                                int copy_threads = 1) {
  auto w = std::make_unique<PsWorker>();
  w->context = std::make_unique<zmq::context_t>(1);
  PsClientOptions o;
  o.ps_addresses = addresses;
  o.rank = rank;
  o.request_timeout = kReplyTimeout;
  o.blocking_timeout = std::chrono::seconds(15);
  o.pulls_may_wait = sync;
  o.wire_dtype = wire;
  o.copy_threads = copy_threads;
  // Loopback: a resend only means a slow round; it would add traffic to the measurement.
  o.resend_after = std::chrono::seconds(60);
  o.resend_max = std::chrono::seconds(60);
  auto client = PsClient::Connect(*w->context, o);
  if (!client.ok()) return client.status();
  w->client = std::move(client).value();
  PARASYNC_RETURN_IF_ERROR(w->client->Register(reg, kReplyTimeout));
  int64_t elements = 0;
  for (const VariableSpec& v : reg.variables) elements += v.num_elements();
  w->params.assign(static_cast<size_t>(elements), 0.0f);
  return w;
}

Status PsRound(PsWorker& w, Pattern pattern, const float* grad) {
  if (pattern == Pattern::kPushPull) {
    // What a training step does: the gradient out and the parameters in, one round trip.
    const float* grads[] = {grad};
    float* params[] = {w.params.data()};
    PARASYNC_RETURN_IF_ERROR(w.client->PushPull(grads, 1, params));
    if (w.client->last_push_dropped()) return Status::Internal("an async push was dropped");
    Clobber(w.params.data());
    return Status::Ok();
  }
  if (pattern != Pattern::kPull) {
    const float* grads[] = {grad};
    PARASYNC_RETURN_IF_ERROR(w.client->Push(grads, 1));
    if (w.client->last_push_dropped()) return Status::Internal("an async push was dropped");
  }
  if (pattern != Pattern::kPush) {
    float* params[] = {w.params.data()};
    PARASYNC_RETURN_IF_ERROR(w.client->Pull(params));
    Clobber(w.params.data());
  }
  return Status::Ok();
}

ModelRegistration OneVariable(int64_t elements, int shards, int64_t max_slice_elements,
                              const std::string& mode) {
  ModelRegistration reg;
  reg.variables = {{"w", {elements}, DType::kFloat32, {InitKind::kZeros, 0.0f}}};
  reg.optimizer.kind = OptimizerKind::kSgd;
  reg.optimizer.learning_rate = 1e-6f;
  reg.seed = 1;
  reg.num_shards = shards;
  reg.max_slice_elements = max_slice_elements;
  reg.mode = mode;
  return reg;
}

// ---- sections -------------------------------------------------------------------------------

// memcpy bandwidth, by size; measured once, used by the memcpy rows and as apply's ceiling.
class MemcpyTable {
 public:
  explicit MemcpyTable(const Settings& st) : st_(st) {}

  double GBps(int64_t bytes) {
    if (auto it = cache_.find(bytes); it != cache_.end()) return it->second;
    std::vector<char> src(static_cast<size_t>(bytes), 1);
    std::vector<char> dst(static_cast<size_t>(bytes), 0);
    std::memcpy(dst.data(), src.data(), src.size());  // warm: pages present, caches filled
    const int64_t batch = std::max<int64_t>(1, 4 * kMiB / bytes);
    std::vector<double> rates;
    for (int r = 0; r < st_.repeats; ++r) {
      int64_t copies = 0;
      const auto start = Clock::now();
      const auto deadline = start + Dur(st_.seconds);
      do {
        for (int64_t i = 0; i < batch; ++i) {
          std::memcpy(dst.data(), src.data(), src.size());
          Clobber(dst.data());
        }
        copies += batch;
      } while (Clock::now() < deadline && copies < kMaxRounds * batch);
      rates.push_back(static_cast<double>(copies * bytes) / Since(start, Clock::now()) / 1e9);
    }
    return cache_[bytes] = Median(rates);
  }

 private:
  const Settings& st_;
  std::map<int64_t, double> cache_;
};

Status RunMemcpy(const Settings& st, MemcpyTable& memcpy_table, Report& report) {
  std::vector<int64_t> sizes = st.sizes;
  if (std::find(sizes.begin(), sizes.end(), 64 * kMiB) == sizes.end()) sizes.push_back(64 * kMiB);
  for (int64_t bytes : sizes) {
    const double gbps = memcpy_table.GBps(bytes);
    Progress(fmt::format("memcpy {}: {:.2f} GB/s", SizeText(bytes), gbps));
    report.Add({"memcpy", bytes, std::nullopt, std::nullopt, gbps, std::nullopt, "GB/s",
                std::nullopt, std::nullopt});
  }
  return Status::Ok();
}

// What the timed repeats of one side (raw pair or parasync) of one data-path row added up to,
// process-wide: every thread's CPU time, page faults and context switches.
struct Tally {
  std::vector<double> rates;  // GB/s of each repeat
  double rounds = 0, gb = 0, seconds = 0, cpu = 0, faults = 0, switches = 0;
  // "0.60 CPU s/GB, 0 faults/MB, 15.2 switches/round"
  std::string Costs() const {
    return fmt::format("{:.2f} CPU s/GB, {:.0f} faults/MB, {:.1f} switches/round", cpu / gb,
                       faults / gb / 1e3, switches / rounds);
  }
};

// Which sides the data-path rows run, by pattern (indexed by Pattern).
struct DataPathSides {
  bool raw[3] = {false, false, false};
  bool ps[3] = {false, false, false};
  bool any_raw = false, any_ps = false;
};

DataPathSides WantedSides(const Settings& st) {
  DataPathSides want;
  for (Pattern p : kPatterns) {
    const auto i = static_cast<size_t>(p);
    want.ps[i] = st.Want(PatternSection(p));
    // The ceiling of every parasync row, unless --no-ceiling leaves parasync alone.
    want.raw[i] = st.Want("zmq") || (want.ps[i] && !st.no_ceiling);
    want.any_raw |= want.raw[i];
    want.any_ps |= want.ps[i];
  }
  return want;
}

// One configuration of the data path: a tensor of `bytes` over `shards` servers from `workers`
// client threads, with the raw pair and parasync set up side by side (either may be empty).
struct DataPathConfig {
  int64_t bytes = 0;
  int shards = 0;
  int workers = 0;
  std::string name;  // "4 KiB, 1 shard(s), 1 worker(s)"
  // Destroyed in the reverse order: parasync's clients, its servers, the raw clients, the
  // raw servers.
  std::vector<std::unique_ptr<RawServer>> raw_servers;
  std::vector<std::unique_ptr<RawClient>> raw_clients;
  std::unique_ptr<PsCluster> cluster;
  std::vector<std::unique_ptr<PsWorker>> ps_workers;

  // Stops both sides; the first error either side's servers had.
  Status Finish() {
    ps_workers.clear();
    if (cluster) PARASYNC_RETURN_IF_ERROR(cluster->Finish());
    raw_clients.clear();
    for (auto& s : raw_servers) PARASYNC_RETURN_IF_ERROR(s->Finish());
    return Status::Ok();
  }
};

// The raw pair of `c`: a RawServer per shard, a RawClient per worker.
void StartRawPairs(DataPathConfig& c) {
  std::vector<std::string> endpoints;
  for (int s = 0; s < c.shards; ++s) {
    c.raw_servers.push_back(std::make_unique<RawServer>(c.bytes / c.shards + 1));
    endpoints.push_back(c.raw_servers.back()->endpoint());
  }
  for (int w = 0; w < c.workers; ++w) {
    c.raw_clients.push_back(std::make_unique<RawClient>(endpoints));
  }
}

// Parasync's side of `c`: real Servers (async, SGD) and a connected, registered PsWorker per
// worker; a note in `report` where the tensor is too small for every shard to hold a slice.
Status StartParasync(const Settings& st, DataPathConfig& c, Report& report) {
  auto started = PsCluster::Start(c.shards, c.workers, TrainingMode{}, st.apply_threads);
  if (!started.ok()) return started.status();
  c.cluster = std::move(started).value();
  const ModelRegistration reg =
      OneVariable(c.bytes / 4, c.shards, kDefaultMaxSliceElements, "async");
  auto map = SliceMap::Build(reg.variables, reg.max_slice_elements, c.shards);
  if (!map.ok()) return map.status();
  for (int s = 0; s < c.shards; ++s) {
    if (map->SlicesOfShard(s).empty()) {
      report.Note(fmt::format(
          "parasync, {}: {} slice(s) for {} shards, so shard {} holds nothing and "
          "every request goes to fewer servers than the raw rows use (slices are not "
          "cut below 4 KiB for balance).", SizeText(c.bytes), map->slices().size(),
          c.shards, s));
    }
  }
  for (int w = 0; w < c.workers; ++w) {
    auto worker = ConnectWorker(c.cluster->addresses(), w, reg, /*sync=*/false, st.wire_dtype,
                                st.copy_threads);
    if (!worker.ok()) return worker.status().WithContext("parasync client " + c.name);
    c.ps_workers.push_back(std::move(worker).value());
  }
  return Status::Ok();
}

// What the timed repeats of one configuration added up to, by pattern: each side's tally
// and the CPU time of parasync's server loops during its repeats.
struct DataPathTallies {
  Tally raw[3], ours[3];
  double loop_cpu[3] = {0, 0, 0};
};

// One timed repeat of `round` on every worker of `c`, added to `t`; `side` names it in an
// error.
template <typename RoundFn>
Status MeasureRepeat(const Settings& st, const DataPathConfig& c, Pattern p, RoundFn round,
                     const char* side, Tally& t) {
  const double cpu0 = ProcessCpuSeconds(), faults0 = ProcessPageFaults();
  const double switches0 = ProcessContextSwitches();
  auto r = RunParallel(c.workers, st.seconds, kMaxRounds, round);
  t.cpu += ProcessCpuSeconds() - cpu0;
  t.faults += ProcessPageFaults() - faults0;
  t.switches += ProcessContextSwitches() - switches0;
  if (!r.ok()) {
    return r.status().WithContext(fmt::format("{} {} {}", side, PatternName(p), c.name));
  }
  const double gb = static_cast<double>(r->rounds * RoundBytes(p, c.bytes)) / 1e9;
  t.rounds += static_cast<double>(r->rounds);
  t.gb += gb;
  t.seconds += r->seconds;
  t.rates.push_back(gb / r->seconds);
  return Status::Ok();
}

// The rows of `c` in `report` (zmq rows when asked for, parasync rows with the ceiling and
// the ratio to it), and the progress line that explains them.
void ReportDataPath(const Settings& st, const DataPathSides& want, const DataPathConfig& c,
                    const DataPathTallies& t, Report& report) {
  std::string line = "data path " + c.name + ":";
  for (Pattern p : kPatterns) {
    const auto i = static_cast<size_t>(p);
    if (!want.raw[i] && !want.ps[i]) continue;
    line += fmt::format(" {}", PatternName(p));
    std::optional<double> ceiling;
    if (want.raw[i]) {
      ceiling = Median(t.raw[i].rates);
      if (st.Want("zmq")) {
        report.Add({std::string("zmq ") + PatternName(p), c.bytes, c.shards, c.workers, *ceiling,
                    std::nullopt, "GB/s", std::nullopt, std::nullopt});
      }
      line += fmt::format(" zmq {:.2f} ({})", *ceiling, t.raw[i].Costs());
    }
    if (!want.ps[i]) {
      line += ";";
      continue;
    }
    const double median = Median(t.ours[i].rates);
    // With a 16-bit wire the figure is still of the float32 tensor moved (what a training
    // step gets done), against the raw pair moving that tensor's bytes.
    const std::string wire = st.wire_dtype == DType::kFloat32
                                 ? ""
                                 : fmt::format(" ({} wire)", DTypeName(st.wire_dtype));
    std::optional<double> ratio;
    if (ceiling) ratio = median / *ceiling;
    report.Add({std::string("parasync ") + PatternName(p) + wire, c.bytes, c.shards, c.workers,
                median, std::nullopt, "GB/s", ceiling, ratio});
    line += fmt::format(" parasync {:.2f} ({}{}, server loop busy {:.0f}%);", median,
                        ratio ? fmt::format("{:.2f}; ", *ratio) : std::string(),
                        t.ours[i].Costs(), 100 * t.loop_cpu[i] / t.ours[i].seconds / c.shards);
  }
  Progress(line + " GB/s");
}

// Raw ZeroMQ and parasync on one configuration: both set up side by side, one untimed round
// of each (connections, first-touch of buffers), then their repeats interleaved, so that
// noise hits both alike. The raw clients send `payload`, parasync's push `grad`.
Status RunDataPathConfig(const Settings& st, const DataPathSides& want, DataPathConfig& c,
                         const std::vector<char>& payload, const std::vector<float>& grad,
                         Report& report) {
  Progress("data path " + c.name + ": setting up");
  if (want.any_raw) StartRawPairs(c);
  if (want.any_ps) PARASYNC_RETURN_IF_ERROR(StartParasync(st, c, report));
  auto raw_round = [&](Pattern p) {
    return [&, p](int w) {
      return c.raw_clients[static_cast<size_t>(w)]->Round(p, c.bytes, payload.data());
    };
  };
  auto ps_round = [&](Pattern p) {
    return [&, p](int w) { return PsRound(*c.ps_workers[static_cast<size_t>(w)], p, grad.data()); };
  };
  for (Pattern p : kPatterns) {
    const auto i = static_cast<size_t>(p);
    if (want.raw[i]) {
      auto r = RunParallel(c.workers, 0, 1, raw_round(p));
      if (!r.ok()) return r.status().WithContext("zmq " + c.name);
    }
    if (want.ps[i]) {
      auto r = RunParallel(c.workers, 0, 1, ps_round(p));
      if (!r.ok()) return r.status().WithContext("parasync " + c.name);
    }
  }
  DataPathTallies t;
  for (int rep = 0; rep < st.repeats; ++rep) {
    for (Pattern p : kPatterns) {
      const auto i = static_cast<size_t>(p);
      if (want.raw[i]) {
        PARASYNC_RETURN_IF_ERROR(MeasureRepeat(st, c, p, raw_round(p), "zmq", t.raw[i]));
      }
      if (want.ps[i]) {
        const double cpu0 = c.cluster->CpuSeconds();
        PARASYNC_RETURN_IF_ERROR(MeasureRepeat(st, c, p, ps_round(p), "parasync", t.ours[i]));
        t.loop_cpu[i] += c.cluster->CpuSeconds() - cpu0;
      }
    }
  }
  ReportDataPath(st, want, c, t, report);
  return c.Finish();
}

// Raw ZeroMQ and parasync, for every size, shard count and worker count.
Status RunDataPath(const Settings& st, Report& report) {
  const DataPathSides want = WantedSides(st);
  if (!want.any_raw && !want.any_ps) return Status::Ok();
  const int64_t max_bytes = *std::max_element(st.sizes.begin(), st.sizes.end());
  const std::vector<char> payload(static_cast<size_t>(max_bytes), 1);  // raw clients send this
  const std::vector<float> grad(static_cast<size_t>(max_bytes) / sizeof(float), 1e-3f);
  for (int64_t bytes : st.sizes) {
    for (int shards : st.shard_counts) {
      for (int workers : st.worker_counts) {
        DataPathConfig c;
        c.bytes = bytes;
        c.shards = shards;
        c.workers = workers;
        c.name = fmt::format("{}, {} shard(s), {} worker(s)", SizeText(bytes), shards, workers);
        PARASYNC_RETURN_IF_ERROR(RunDataPathConfig(st, want, c, payload, grad, report));
      }
    }
  }
  return Status::Ok();
}

// Sync barrier: every worker pushes, then pulls the next step; the latency of each round.
Status RunBarrier(const Settings& st, Report& report) {
  constexpr int64_t kElements = 16;
  auto sync = TrainingMode::Parse("sync");
  if (!sync.ok()) return sync.status();
  const std::vector<float> grad(kElements, 1e-3f);
  for (int workers : st.barrier_workers) {
    Progress(fmt::format("sync barrier, {} workers", workers));
    auto started = PsCluster::Start(1, workers, *sync, st.apply_threads);
    if (!started.ok()) return started.status();
    std::unique_ptr<PsCluster> cluster = std::move(started).value();
    const ModelRegistration reg = OneVariable(kElements, 1, kDefaultMaxSliceElements, "sync");
    std::vector<std::unique_ptr<PsWorker>> ps_workers;
    for (int w = 0; w < workers; ++w) {
      auto worker = ConnectWorker(cluster->addresses(), w, reg, /*sync=*/true);
      if (!worker.ok()) return worker.status().WithContext("barrier client");
      float* params[] = {(*worker)->params.data()};
      PARASYNC_RETURN_IF_ERROR((*worker)->client->Pull(params));  // the version to start from
      ps_workers.push_back(std::move(worker).value());
    }
    std::vector<std::vector<double>> latency_us(static_cast<size_t>(workers));
    auto round = [&](int w) -> Status {
      PsWorker& pw = *ps_workers[static_cast<size_t>(w)];
      const float* grads[] = {grad.data()};
      float* params[] = {pw.params.data()};
      const auto t0 = Clock::now();
      // A training step of sync mode: the gradient of step t out, the model of step t+1 in.
      PARASYNC_RETURN_IF_ERROR(pw.client->PushPull(grads, 1, params, PsClient::kNextStep));
      if (pw.client->last_push_dropped()) return Status::Internal("a sync push was dropped");
      latency_us[static_cast<size_t>(w)].push_back(Since(t0, Clock::now()) * 1e6);
      return Status::Ok();
    };
    // Every worker must take the same number of rounds (one that stopped early would hold
    // the others at the barrier), so rounds are counted, not timed: the warm-up calibrates
    // the count to about --seconds per repeat. The time bound only catches a wedged run.
    constexpr int64_t kWarmup = 30;
    constexpr double kTimeBound = 60;
    auto warm = RunParallel(workers, kTimeBound, kWarmup, round);
    if (!warm.ok()) return warm.status().WithContext(fmt::format("barrier, {} workers", workers));
    const double per_round = warm->seconds / static_cast<double>(kWarmup);
    const auto rounds = std::clamp<int64_t>(static_cast<int64_t>(st.seconds / per_round), 50, 20000);
    std::vector<double> p50s, p99s;
    for (int rep = 0; rep < st.repeats; ++rep) {
      for (auto& v : latency_us) {
        v.clear();
        v.reserve(static_cast<size_t>(rounds));
      }
      auto r = RunParallel(workers, kTimeBound, rounds, round);
      if (!r.ok()) return r.status().WithContext(fmt::format("barrier, {} workers", workers));
      if (r->rounds != rounds * workers) {
        return Status::Internal("barrier: workers took different numbers of rounds");
      }
      std::vector<double> all;
      for (const auto& v : latency_us) all.insert(all.end(), v.begin(), v.end());
      p50s.push_back(Percentile(all, 0.50));
      p99s.push_back(Percentile(all, 0.99));
    }
    ps_workers.clear();
    PARASYNC_RETURN_IF_ERROR(cluster->Finish());
    const double p50 = Median(p50s), p99 = Median(p99s);
    Progress(fmt::format("sync barrier, {} workers: p50 {:.1f} us, p99 {:.1f} us ({} rounds per "
                         "worker per repeat)", workers, p50, p99, rounds));
    report.Add({"sync barrier round (push + pull next step)", kElements * 4, 1, workers, p50, p99,
                "us", std::nullopt, std::nullopt});
  }
  return Status::Ok();
}

// The server's optimizer on one 64 MiB variable, called directly.
Status RunApply(const Settings& st, MemcpyTable& memcpy_table, Report& report) {
  constexpr int64_t kBytes = 64 * kMiB;
  constexpr int64_t kElements = kBytes / 4;
  const double ceiling = memcpy_table.GBps(kBytes);
  std::vector<float> w(kElements, 0.5f), g(kElements, 1e-3f), m(kElements, 0.0f),
      v(kElements, 0.0f);
  float* slots[] = {m.data(), v.data()};
  struct Kind {
    const char* name;
    OptimizerSpec spec;
  };
  std::vector<Kind> kinds(3);
  kinds[0] = {"apply sgd", {}};
  kinds[0].spec.kind = OptimizerKind::kSgd;
  kinds[0].spec.learning_rate = 0.01f;
  kinds[1] = {"apply momentum", {}};
  kinds[1].spec.kind = OptimizerKind::kMomentum;
  kinds[1].spec.learning_rate = 0.01f;
  kinds[1].spec.momentum = 0.9f;
  kinds[2] = {"apply adam", {}};
  kinds[2].spec.kind = OptimizerKind::kAdam;
  kinds[2].spec.learning_rate = 0.001f;
  kinds[2].spec.beta1 = 0.9f;
  kinds[2].spec.beta2 = 0.999f;
  kinds[2].spec.epsilon = 1e-7f;
  for (const Kind& k : kinds) {
    if (Status s = ValidateOptimizer(k.spec); !s.ok()) return s;
    int64_t step = 1;
    ApplyUpdate(k.spec, step++, w.data(), w.data(), g.data(), slots, kElements);  // warm-up
    std::vector<double> rates;
    for (int rep = 0; rep < st.repeats; ++rep) {
      int64_t calls = 0;
      const auto start = Clock::now();
      const auto deadline = start + Dur(st.seconds);
      do {
        ApplyUpdate(k.spec, step++, w.data(), w.data(), g.data(), slots, kElements);
        Clobber(w.data());
        ++calls;
      } while (Clock::now() < deadline && calls < kMaxRounds);
      rates.push_back(static_cast<double>(calls * kBytes) / Since(start, Clock::now()) / 1e9);
    }
    if (!std::isfinite(w[0]) || !std::isfinite(w[kElements - 1])) {
      return Status::Internal(std::string(k.name) + " produced a non-finite value");
    }
    const double gbps = Median(rates);
    Progress(fmt::format("{} on 64 MiB: {:.2f} GB/s ({:.2f} of memcpy)", k.name, gbps,
                         gbps / ceiling));
    report.Add({k.name, kBytes, std::nullopt, std::nullopt, gbps, std::nullopt, "GB/s", ceiling,
                gbps / ceiling});
  }
  return Status::Ok();
}

constexpr int64_t kSmallSliceElements = 256;  // 1 KiB of float32
constexpr int64_t kSmallSlices = 1024;
constexpr int64_t kSmallBytes = kSmallSliceElements * 4;

// A raw parasync::Socket DEALER sending Pull requests for one 1 KiB slice each.
class PsSmallClient {
 public:
  static Result<std::unique_ptr<PsSmallClient>> Connect(const std::string& endpoint, int rank) {
    auto c = std::unique_ptr<PsSmallClient>(new PsSmallClient());
    c->rank_ = rank;
    c->context_ = std::make_unique<zmq::context_t>(1);
    SocketOptions o;
    o.send_timeout = kReplyTimeout;
    auto socket = Socket::Connect(*c->context_, endpoint, o);
    if (!socket.ok()) return socket.status();
    c->socket_ = std::move(socket).value();
    return c;
  }

  Status Send() {
    Header h;
    h.type = MsgType::kPull;
    h.request_id = next_id_;
    h.rank = rank_;
    h.slices = {SliceRange{static_cast<uint32_t>(next_id_ % kSmallSlices), 0, kSmallSliceElements}};
    ++next_id_;
    ++outstanding_;
    return socket_->Send(nullptr, h, {});
  }

  Status Receive() {
    auto in = socket_->Receive(kReplyTimeout);
    if (!in.ok()) return in.status();
    if (!in->has_value()) {
      return Status::TimedOut(fmt::format("no pull reply within {} ms", kReplyTimeout.count()));
    }
    const Inbound& msg = **in;
    if (!msg.header.ok()) return msg.header.status().WithContext("a bad pull reply");
    if (!msg.header->status.ok()) return msg.header->status.WithContext("a pull was refused");
    if (msg.header->request_id != expected_) {
      return Status::Corruption("a pull reply out of order or to another request");
    }
    if (msg.frames.size() != 1 || msg.frames[0].size() != static_cast<size_t>(kSmallBytes)) {
      return Status::Corruption("a pull reply without exactly one 1 KiB slice");
    }
    ++expected_;
    --outstanding_;
    return Status::Ok();
  }
  int outstanding() const { return outstanding_; }

 private:
  PsSmallClient() = default;
  std::unique_ptr<zmq::context_t> context_;  // outlives the socket
  std::unique_ptr<Socket> socket_;
  int rank_ = 0;
  uint64_t next_id_ = 1;
  uint64_t expected_ = 1;
  int outstanding_ = 0;
};

// Replies per second with `window` requests in flight per client. `send(w)` and `receive(w)`
// act on client w; every window is filled before and drained after the timed part. `rounds`
// counts the replies received in the timed part.
template <typename SendFn, typename ReceiveFn, typename OutstandingFn>
Result<LoopResult> PipelinedRate(int clients, int window, double seconds, SendFn send,
                             ReceiveFn receive, OutstandingFn outstanding) {
  for (int w = 0; w < clients; ++w) {
    while (outstanding(w) < window) PARASYNC_RETURN_IF_ERROR(send(w));
  }
  auto r = RunParallel(clients, seconds, kMaxRounds, [&](int w) -> Status {
    PARASYNC_RETURN_IF_ERROR(receive(w));
    return send(w);
  });
  if (!r.ok()) return r.status();
  for (int w = 0; w < clients; ++w) {
    while (outstanding(w) > 0) PARASYNC_RETURN_IF_ERROR(receive(w));
  }
  return *r;
}

Status RunSmall(const Settings& st, Report& report) {
  for (int clients : st.small_clients) {
    const std::string config = fmt::format("1 KiB pulls, 1 server, {} client(s), window {}",
                                           clients, st.window);
    Progress(config + ": setting up");
    // Raw ceiling.
    auto raw_server = std::make_unique<RawServer>(kSmallBytes);
    std::vector<std::unique_ptr<RawClient>> raw;
    for (int w = 0; w < clients; ++w) {
      raw.push_back(std::make_unique<RawClient>(std::vector<std::string>{raw_server->endpoint()}));
    }
    // parasync: a model of 1024 slices of 256 floats on one server.
    auto started = PsCluster::Start(1, clients, TrainingMode{}, st.apply_threads);
    if (!started.ok()) return started.status();
    std::unique_ptr<PsCluster> cluster = std::move(started).value();
    const ModelRegistration reg =
        OneVariable(kSmallSlices * kSmallSliceElements, 1, kSmallSliceElements, "async");
    auto map = SliceMap::Build(reg.variables, reg.max_slice_elements, 1);
    if (!map.ok()) return map.status();
    if (map->slices().size() != static_cast<size_t>(kSmallSlices) ||
        std::any_of(map->slices().begin(), map->slices().end(),
                    [](const SliceInfo& s) { return s.length != kSmallSliceElements; })) {
      return Status::Internal("small: the model is not cut into 1024 slices of 256 floats");
    }
    {
      auto registrar = ConnectWorker(cluster->addresses(), -1, reg, /*sync=*/false);
      if (!registrar.ok()) return registrar.status().WithContext("small: registering");
    }
    std::vector<std::unique_ptr<PsSmallClient>> ours;
    for (int w = 0; w < clients; ++w) {
      auto c = PsSmallClient::Connect(cluster->addresses()[0], w);
      if (!c.ok()) return c.status();
      ours.push_back(std::move(c).value());
    }
    auto raw_rate = [&](double seconds) {
      return PipelinedRate(
          clients, st.window, seconds,
          [&](int w) { return raw[static_cast<size_t>(w)]->SendSmall(kSmallBytes); },
          [&](int w) { return raw[static_cast<size_t>(w)]->ReceiveSmall(kSmallBytes); },
          [&](int w) { return raw[static_cast<size_t>(w)]->outstanding(); });
    };
    auto ps_rate = [&](double seconds) {
      return PipelinedRate(
          clients, st.window, seconds, [&](int w) { return ours[static_cast<size_t>(w)]->Send(); },
          [&](int w) { return ours[static_cast<size_t>(w)]->Receive(); },
          [&](int w) { return ours[static_cast<size_t>(w)]->outstanding(); });
    };
    if (auto r = raw_rate(0.05); !r.ok()) return r.status().WithContext("zmq " + config);
    if (auto r = ps_rate(0.05); !r.ok()) return r.status().WithContext("parasync " + config);
    std::vector<double> raw_rates, ps_rates;
    double server_cpu = 0, process_cpu = 0, requests = 0;  // parasync's, over the repeats
    double raw_cpu = 0, raw_requests = 0;
    for (int rep = 0; rep < st.repeats; ++rep) {
      const double raw0 = ProcessCpuSeconds();
      auto a = raw_rate(st.seconds);
      if (!a.ok()) return a.status().WithContext("zmq " + config);
      raw_cpu += ProcessCpuSeconds() - raw0;
      raw_requests += static_cast<double>(a->rounds + clients * st.window);
      raw_rates.push_back(static_cast<double>(a->rounds) / a->seconds);
      const double server0 = cluster->CpuSeconds(), process0 = ProcessCpuSeconds();
      auto b = ps_rate(st.seconds);
      if (!b.ok()) return b.status().WithContext("parasync " + config);
      server_cpu += cluster->CpuSeconds() - server0;
      process_cpu += ProcessCpuSeconds() - process0;
      requests += static_cast<double>(b->rounds + clients * st.window);  // + filled, drained
      ps_rates.push_back(static_cast<double>(b->rounds) / b->seconds);
    }
    ours.clear();
    PARASYNC_RETURN_IF_ERROR(cluster->Finish());
    raw.clear();
    PARASYNC_RETURN_IF_ERROR(raw_server->Finish());
    const double ceiling = Median(raw_rates), rate = Median(ps_rates);
    Progress(fmt::format("{}: zmq {:.0f} req/s, parasync {:.0f} req/s ({:.2f}); CPU per "
                         "request (all threads): zmq {:.1f} us, parasync {:.1f} us of which its "
                         "server loop {:.1f} us",
                         config, ceiling, rate, rate / ceiling, 1e6 * raw_cpu / raw_requests,
                         1e6 * process_cpu / requests, 1e6 * server_cpu / requests));
    report.Add({"zmq small pull (1 KiB reply, pipelined)", kSmallBytes, 1, clients, ceiling,
                std::nullopt, "req/s", std::nullopt, std::nullopt});
    report.Add({"parasync small pull (1 KiB slice, pipelined)", kSmallBytes, 1, clients, rate,
                std::nullopt, "req/s", ceiling, rate / ceiling});
  }
  return Status::Ok();
}

// ---- embedding rows (issue 25) --------------------------------------------------------------

// Ids per request, and where the Zipf ids come from.
constexpr int64_t kRowIds = 4096;
constexpr double kZipfExponent = 1.1;
constexpr double kZipfVocabulary = 10'000'000;
// Batches of ids drawn before a row is measured; rounds take them in turn.
constexpr int kRowBatches = 64;
// Each server's max_table_rows: no Zipf run comes near it (it touches at most kRowBatches x
// kRowIds distinct ids); a uniform run creates kRowIds rows a round and evicts beyond it.
constexpr int64_t kRowsPerServer = int64_t{1} << 20;
// Uniform batches are reused shifted by the number of passes over the pool, so every round
// has ids no earlier round had: consecutive ids of a batch are drawn further apart than this.
constexpr uint64_t kMinUniformGap = uint64_t{1} << 32;

enum class IdDraw { kZipf, kUniform };
const char* IdDrawName(IdDraw d) { return d == IdDraw::kZipf ? "zipf" : "uniform"; }

// kRowIds distinct ids, sorted. Zipf: the rank, less one, of the continuous power law x^-1.1
// on [1, vocabulary + 1) by its inverse CDF, repeats rejected until kRowIds are distinct.
// Uniform: over [0, 2^63), drawn again until consecutive ids are kMinUniformGap apart.
std::vector<uint64_t> DrawIds(IdDraw draw, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double a = 1.0 - kZipfExponent, top = std::pow(kZipfVocabulary + 1, a) - 1;
  for (;;) {
    std::unordered_set<uint64_t> ids;
    ids.reserve(2 * kRowIds);
    while (static_cast<int64_t>(ids.size()) < kRowIds) {
      ids.insert(draw == IdDraw::kZipf
                     ? static_cast<uint64_t>(std::pow(1 + unit(rng) * top, 1 / a)) - 1
                     : rng() >> 1);
    }
    std::vector<uint64_t> sorted(ids.begin(), ids.end());
    std::sort(sorted.begin(), sorted.end());
    bool spread = true;
    for (size_t i = 1; draw == IdDraw::kUniform && i < sorted.size(); ++i) {
      spread = spread && sorted[i] - sorted[i - 1] > kMinUniformGap;
    }
    if (spread) return sorted;
  }
}

// The ids of round k (over all client threads) into `out`: Zipf batches are reused as they
// are (a hot id stays hot); uniform ones shifted by the pass, so each round's ids are new.
void RoundIds(IdDraw draw, const std::vector<std::vector<uint64_t>>& pool, int64_t k,
              std::vector<uint64_t>& out) {
  const auto& batch = pool[static_cast<size_t>(k % static_cast<int64_t>(pool.size()))];
  const uint64_t shift =
      draw == IdDraw::kZipf ? 0 : static_cast<uint64_t>(k / static_cast<int64_t>(pool.size()));
  out.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) out[i] = batch[i] + shift;
}

// A small dense variable beside one unbounded table of `dim` floats, adagrad, async.
ModelRegistration RowsModel(int64_t dim, int shards) {
  ModelRegistration reg = OneVariable(16, shards, kDefaultMaxSliceElements, "async");
  reg.optimizer.kind = OptimizerKind::kAdagrad;
  reg.optimizer.learning_rate = 1e-3f;
  reg.tables = {{"emb", 0, dim, {InitKind::kUniform, 0.05f}}};
  return reg;
}

// One client thread's parasync side of the rows rows: its client and buffers.
struct RowsWorker {
  std::unique_ptr<PsWorker> ps;
  std::vector<uint64_t> ids;
  std::vector<float> values, grads, dense_grad;
  int64_t rounds = 0;
};

// One round: Pull of the dense variable and the batch's rows, then Push of their gradients.
Status PsRowsRound(RowsWorker& w, IdDraw draw, const std::vector<std::vector<uint64_t>>& pool,
                   int index, int workers) {
  RoundIds(draw, pool, w.rounds++ * workers + index, w.ids);
  float* params[] = {w.ps->params.data()};
  const RowsOf pull{0, w.ids, w.values.data()};
  PARASYNC_RETURN_IF_ERROR(w.ps->client->Pull(params, 0, RowSet(&pull, 1)));
  Clobber(w.values.data());
  const float* grads[] = {w.dense_grad.data()};
  const RowsOf push{0, w.ids, w.grads.data()};
  PARASYNC_RETURN_IF_ERROR(w.ps->client->Push(grads, 1, PsClient::kLastRead, RowSet(&push, 1)));
  if (w.ps->client->last_push_dropped()) return Status::Internal("an async push was dropped");
  return Status::Ok();
}

// Rows held over every server, read through `client`.
Result<int64_t> RowsHeld(PsClient& client) {
  auto stats = client.Stats();
  if (!stats.ok()) return stats.status();
  int64_t held = 0;
  for (const ShardStats& s : *stats) held += s.rows_held;
  return held;
}

// Connects `workers` clients with the rows model, and checks that a pull alone creates no row.
Result<std::vector<RowsWorker>> ConnectRowsWorkers(const PsCluster& cluster, int64_t dim,
                                                   int workers) {
  const ModelRegistration reg = RowsModel(dim, static_cast<int>(cluster.addresses().size()));
  std::vector<RowsWorker> out(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    RowsWorker& rw = out[static_cast<size_t>(w)];
    auto ps = ConnectWorker(cluster.addresses(), w, reg, /*sync=*/false);
    if (!ps.ok()) return ps.status();
    rw.ps = std::move(ps).value();
    rw.values.assign(static_cast<size_t>(kRowIds * dim), 0.0f);
    rw.grads.assign(static_cast<size_t>(kRowIds * dim), 1e-3f);
    rw.dense_grad.assign(16, 1e-3f);
  }
  std::vector<uint64_t> ids(static_cast<size_t>(kRowIds));
  for (int64_t i = 0; i < kRowIds; ++i) ids[static_cast<size_t>(i)] = static_cast<uint64_t>(i);
  float* params[] = {out[0].ps->params.data()};
  const RowsOf pull{0, ids, out[0].values.data()};
  PARASYNC_RETURN_IF_ERROR(out[0].ps->client->Pull(params, 0, RowSet(&pull, 1)));
  auto held = RowsHeld(*out[0].ps->client);
  if (!held.ok()) return held.status();
  if (*held != 0) return Status::Internal(fmt::format("a pull alone created {} rows", *held));
  return out;
}

// What one side of a rows row added up to over its repeats.
struct RowsTally {
  std::vector<double> rates;  // rows/s of each repeat
  double rounds = 0, seconds = 0, cpu = 0, loop_cpu = 0;
  // CPU microseconds per 1000 rows (a row pulled and pushed), all threads.
  double CpuPerKRow() const { return 1e6 * cpu / (rounds * kRowIds / 1000); }
};

// One timed repeat of `round` on `workers` threads, added to `t`.
template <typename RoundFn>
Status MeasureRows(const Settings& st, int workers, RoundFn round, RowsTally& t) {
  const double cpu0 = ProcessCpuSeconds();
  auto r = RunParallel(workers, st.seconds, kMaxRounds, round);
  if (!r.ok()) return r.status();
  t.cpu += ProcessCpuSeconds() - cpu0;
  t.rounds += static_cast<double>(r->rounds);
  t.seconds += r->seconds;
  t.rates.push_back(static_cast<double>(r->rounds * kRowIds) / r->seconds);
  return Status::Ok();
}

// The report's row and the progress line for one rows row; `table`: the servers' figures at
// the end (rows are created by pushes only, so a uniform run holds its pushed rows up to
// kRowsPerServer a server and evicts the rest).
void ReportRowsRow(const std::string& config, int64_t dim, int shards, int workers,
                   const RowsTally& raw, const RowsTally& ps,
                   const EmbeddingTables::TableStats& table, Report& report) {
  const double median = Median(ps.rates);
  std::optional<double> ceiling, ratio;  // none with --no-ceiling
  if (!raw.rates.empty()) ceiling = Median(raw.rates), ratio = median / *ceiling;
  const std::string what = config.substr(0, config.find(','));
  report.Add({"parasync " + what + " pull+push", kRowIds * dim * 4, shards, workers, median,
              std::nullopt, "rows/s", ceiling, ratio});
  const std::string zmq = ceiling ? fmt::format(" zmq {:.0f} rows/s ({:.1f} CPU us/1k rows),",
                                                *ceiling, raw.CpuPerKRow())
                                  : "";
  Progress(fmt::format(
      "{}:{} parasync {:.0f} rows/s ({}{:.1f} CPU us/1k rows, server loops busy {:.0f}%); "
      "servers at the end: {} rows held, {} created, {} evicted, {} read, {} updated",
      config, zmq, median, ratio ? fmt::format("{:.2f}; ", *ratio) : "", ps.CpuPerKRow(),
      100 * ps.loop_cpu / ps.seconds / shards, table.rows_held, table.rows_created,
      table.rows_evicted, table.rows_read, table.rows_updated));
  if (table.rows_evicted > 0) {
    report.Note(fmt::format(
        "rows: each server holds at most {} rows (max_table_rows); the uniform rows create "
        "{} new rows a round, so once that many are held each new row evicts the least "
        "recently touched one (the progress lines count them).",
        kRowsPerServer, kRowIds));
  }
}

// One rows row: parasync (`shards` servers, `workers` clients, table of `dim`) and the raw
// pair moving the same bytes, their repeats interleaved.
Status RunRowsRow(const Settings& st, IdDraw draw, const std::vector<std::vector<uint64_t>>& pool,
                  int64_t dim, int shards, int workers, Report& report) {
  const std::string config = fmt::format("rows {}, D = {}, {} server(s), {} client(s)",
                                         IdDrawName(draw), dim, shards, workers);
  Progress(config + ": setting up");
  std::vector<std::unique_ptr<RawServer>> raw_servers;
  std::vector<std::string> raw_endpoints;
  for (int s = 0; s < shards; ++s) {
    raw_servers.push_back(std::make_unique<RawServer>(kRowIds * dim * 4 / shards + 1));
    raw_endpoints.push_back(raw_servers.back()->endpoint());
  }
  std::vector<std::unique_ptr<RawClient>> raw_clients;
  for (int w = 0; w < workers; ++w) raw_clients.push_back(std::make_unique<RawClient>(raw_endpoints));
  const std::vector<float> raw_values(static_cast<size_t>(kRowIds * dim), 1e-3f);
  auto started = PsCluster::Start(shards, workers, TrainingMode{}, st.apply_threads,
                                  kRowsPerServer);
  if (!started.ok()) return started.status();
  std::unique_ptr<PsCluster> cluster = std::move(started).value();
  auto connected = ConnectRowsWorkers(*cluster, dim, workers);
  if (!connected.ok()) return connected.status().WithContext("parasync " + config);
  std::vector<RowsWorker> ours = std::move(connected).value();
  auto raw_round = [&](int w) {
    return raw_clients[static_cast<size_t>(w)]->RowsRound(
        kRowIds, dim, reinterpret_cast<const char*>(pool[0].data()),
        reinterpret_cast<const char*>(raw_values.data()));
  };
  auto ps_round = [&](int w) {
    return PsRowsRound(ours[static_cast<size_t>(w)], draw, pool, w, workers);
  };
  RowsTally raw, ps;
  for (int rep = -1; rep < st.repeats; ++rep) {  // -1: one untimed round each, a warm-up
    auto raw_status = st.no_ceiling ? Status::Ok()
                      : rep < 0     ? RunParallel(workers, 0, 1, raw_round).status()
                                    : MeasureRows(st, workers, raw_round, raw);
    if (!raw_status.ok()) return raw_status.WithContext("zmq " + config);
    const double loop0 = cluster->CpuSeconds();
    auto ps_status = rep < 0 ? RunParallel(workers, 0, 1, ps_round).status()
                             : MeasureRows(st, workers, ps_round, ps);
    if (!ps_status.ok()) return ps_status.WithContext("parasync " + config);
    if (rep >= 0) ps.loop_cpu += cluster->CpuSeconds() - loop0;
  }
  ours.clear();
  PARASYNC_RETURN_IF_ERROR(cluster->Finish());
  raw_clients.clear();
  for (auto& s : raw_servers) PARASYNC_RETURN_IF_ERROR(s->Finish());
  ReportRowsRow(config, dim, shards, workers, raw, ps, cluster->TableStats(0), report);
  return Status::Ok();
}

// Every rows row: both id draws, each table width, server count and client count.
Status RunRows(const Settings& st, Report& report) {
  std::mt19937_64 rng(25);
  for (IdDraw draw : {IdDraw::kZipf, IdDraw::kUniform}) {
    std::vector<std::vector<uint64_t>> pool;
    for (int b = 0; b < kRowBatches; ++b) pool.push_back(DrawIds(draw, rng));
    for (int64_t dim : st.row_dims) {
      for (int shards : st.shard_counts) {
        for (int workers : st.row_workers) {
          PARASYNC_RETURN_IF_ERROR(RunRowsRow(st, draw, pool, dim, shards, workers, report));
        }
      }
    }
  }
  report.Note(fmt::format(
      "rows: a round is a Pull of {} sorted unique ids' rows (and a 16-float dense variable), "
      "then a Push of their gradient rows (async, adagrad); rows/s = {} x rounds / seconds, "
      "summed over clients; size = one pull's row values ({} x dim x 4 B). Ceiling: a raw "
      "DEALER/ROUTER pair moving the same bytes a round (ids out, values back; ids and values "
      "out, an 8-byte ack back). zipf: exponent {} over {:.0f} ids; uniform: over 2^63, new "
      "ids every round.",
      kRowIds, kRowIds, kRowIds, kZipfExponent, kZipfVocabulary));
  return Status::Ok();
}

Status RunAll(const Settings& st, Report& report) {
  MemcpyTable memcpy_table(st);
  if (st.Want("memcpy")) PARASYNC_RETURN_IF_ERROR(RunMemcpy(st, memcpy_table, report));
  PARASYNC_RETURN_IF_ERROR(RunDataPath(st, report));
  if (st.Want("barrier")) PARASYNC_RETURN_IF_ERROR(RunBarrier(st, report));
  if (st.Want("apply")) PARASYNC_RETURN_IF_ERROR(RunApply(st, memcpy_table, report));
  if (st.Want("small")) PARASYNC_RETURN_IF_ERROR(RunSmall(st, report));
  if (st.Want("rows")) PARASYNC_RETURN_IF_ERROR(RunRows(st, report));
  return Status::Ok();
}

std::string CpuName() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

// The command line: the settings, and what goes into them once parsed.
struct Flags {
  Settings st;
  std::string wire_dtype = "float32";
  std::vector<int64_t> sizes;
  CLI::Option* seconds = nullptr;  // --seconds, to tell whether it was given
};

// --json and --quick: how the run is printed and how long it takes.
void AddOutputFlags(CLI::App& app, Flags& f) {
  app.add_flag("--json", f.st.json,
               "Print one JSON object per row per line ({\"what\", \"size\" (bytes), \"shards\", "
               "\"workers\", \"median\", \"p99\", \"unit\", \"ceiling\", \"ratio\"}; null where "
               "not applicable) instead of the markdown table");
  app.add_flag("--quick", f.st.quick,
               "Sizes 4 KiB, 1 MiB and 64 MiB only and 0.1 s per measurement unless --seconds "
               "is given: the whole run in under 2 minutes on 2 cores");
}

// What runs on each side of the data path: the servers' and clients' threads, the wire,
// the shard, worker and row counts, and whether the raw pair runs beside parasync.
void AddSideFlags(CLI::App& app, Flags& f) {
  app.add_option("--apply-threads", f.st.apply_threads,
                 "The servers' --apply-threads (threads applying a push of >= 1 MiB)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--copy-threads", f.st.copy_threads,
                 "The parasync clients' --copy-threads (threads copying a pull reply of >= 1 MiB "
                 "into the parameters)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--wire-dtype", f.wire_dtype,
                 "The dtype the parasync clients of the push, pull and push+pull rows send and "
                 "receive (float32, bfloat16, float16); their GB/s stay of the float32 tensor, "
                 "the raw ceiling moves that tensor's bytes")
      ->capture_default_str();
  app.add_option("--shards", f.st.shard_counts,
                 "Comma-separated server counts for the push, pull and push+pull rows")
      ->delimiter(',')
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  app.add_option("--workers", f.st.worker_counts,
                 "Comma-separated client counts (threads, each with its own context) for the "
                 "push, pull and push+pull rows")
      ->delimiter(',')
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--row-dims", f.st.row_dims,
                 "Comma-separated embedding row widths (floats per row) for the rows section")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, kMaxTableDim))
      ->capture_default_str();
  app.add_option("--row-workers", f.st.row_workers,
                 "Comma-separated client counts (threads, each with its own context) for the "
                 "rows section")
      ->delimiter(',')
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_flag("--no-ceiling", f.st.no_ceiling,
               "Run parasync's push, pull, push+pull and rows rows without the raw ZeroMQ pair "
               "beside them (no ceiling, no ratio): to profile parasync alone, e.g. under perf; "
               "--only zmq runs the raw pair alone");
}

// How often and how long each figure is measured, which sections run, and the sizes.
void AddRepeatFlags(CLI::App& app, Flags& f) {
  app.add_option("--repeats", f.st.repeats, "Repeats per figure; the median is reported")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  f.seconds =
      app.add_option("--seconds", f.st.seconds,
                     "Seconds per measurement (one repeat of one row; a round that takes longer "
                     "is still completed) [default: 0.25, --quick 0.1]")
          ->check(CLI::Range(0.01, 600.0));
  app.add_option("--only", f.st.only, "Comma-separated sections to run (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(kSections));
  app.add_option("--sizes", f.sizes,
                 "Comma-separated tensor sizes in bytes for memcpy and the data path, each a "
                 "multiple of 1024 up to 1 GiB [default: 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB; "
                 "--quick: 4 KiB, 1 MiB, 64 MiB]")
      ->delimiter(',')
      ->check(CLI::Range(kKiB, 1024 * kMiB))
      ->check(CLI::Validator(
          [](std::string& v) {
            try {
              return std::stoll(v) % kKiB == 0 ? std::string() : "not a multiple of 1024";
            } catch (const std::exception&) {
              return std::string("not a number");
            }
          },
          "MULTIPLE OF 1024"));
}

// Parses argv into `f`. Returns nullopt when the run should go on; otherwise the exit status
// to return at once: 0 after --help, 2 after a bad flag (said in one line on stderr).
std::optional<int> ParseFlags(CLI::App& app, int argc, char** argv, Flags& f) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "%s: %s (see --help)\n", kProgram, e.what());
    return 2;
  }
  if (auto wire = ParseDType(f.wire_dtype)) {
    f.st.wire_dtype = *wire;
  } else {
    std::fprintf(stderr, "%s: --wire-dtype must be float32, bfloat16 or float16, not '%s'\n",
                 kProgram, f.wire_dtype.c_str());
    return 2;
  }
  if (f.st.quick) {
    f.st.sizes = {4 * kKiB, 1 * kMiB, 64 * kMiB};
    if (f.seconds->count() == 0) f.st.seconds = 0.1;
  } else {
    f.st.sizes = {4 * kKiB, 64 * kKiB, 1 * kMiB, 16 * kMiB, 64 * kMiB};
  }
  if (!f.sizes.empty()) f.st.sizes = f.sizes;
  return std::nullopt;
}

// The figures on stdout: one JSON object a row, or a markdown table under a preamble naming
// the date, the CPU, `command` and how the figures were taken.
void PrintFigures(const Settings& st, const Report& report, const std::string& command,
                  double elapsed) {
  if (st.json) {
    report.PrintJson();
    return;
  }
  char date[32] = {};
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%MZ", &utc);
  const std::string preamble = fmt::format(
      "date: {}; CPU: {} ({} cores); command: {}\n"
      "median of {} repeats of ~{} s each; loopback TCP; every server and client has its own "
      "ZeroMQ context; run took {:.0f} s\n",
      date, CpuName(), std::thread::hardware_concurrency(), command, st.repeats, st.seconds,
      elapsed);
  report.PrintTable(preamble);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "parasync-bench: the data path, measured in one run against its ceilings. Rows: memcpy "
      "bandwidth; the raw ZeroMQ ceiling (bare DEALER/ROUTER over loopback TCP, zero-copy, "
      "frames of at most 256 KiB like parasync's default slices) and "
      "parasync's real Server + PsClient for push, pull and push+pull of one tensor (4 KiB .. "
      "64 MiB, split over 1 or 2 servers, 1 or 4 client threads), as GB/s and as a ratio to "
      "that ceiling; sync barrier round latency (p50/p99, 2/4/8 workers); the server's "
      "optimizer apply bandwidth vs memcpy; pipelined 1 KiB pulls per second vs raw ZeroMQ; "
      "embedding rows per second (pull + push of 4096 ids) vs raw ZeroMQ moving the same bytes. "
      "Each figure is the median of --repeats repeats. The table goes to stdout, progress to "
      "stderr."};
  app.footer(
      "Sections (for --only): memcpy, zmq (the raw ceilings alone), push, pull, pushpull "
      "(each also measures its raw ceiling), barrier, apply, small, rows (with its raw "
      "ceiling).\n"
      "Examples:\n"
      "  tools/bench                      full run (about 3.5 minutes on 2 cores)\n"
      "  tools/bench --quick              4 KiB, 1 MiB and 64 MiB only, 0.1 s repeats (< 2 min)\n"
      "  tools/bench --only pull,small --seconds 1\n"
      "  tools/bench --only zmq,push --sizes 4096,16777216\n"
      "  tools/bench --only rows --row-workers 1,2\n"
      "  tools/bench --quick --json       one JSON object per row\n"
      "  perf record -g tools/bench --only pushpull --no-ceiling --sizes 1048576 --shards 2 "
      "--workers 4\n"
      "                                   parasync's side of one row alone, for a profile\n"
      "Exit status: 0 with figures printed, 1 when anything failed (no figures printed), 2 for "
      "bad flags.");
  Flags flags;
  AddOutputFlags(app, flags);
  AddSideFlags(app, flags);
  AddRepeatFlags(app, flags);
  if (auto done = ParseFlags(app, argc, argv, flags)) return *done;
  const Settings& st = flags.st;
  // As parasync-ps and parasync-worker do at start-up; the raw rows run in this process too,
  // so the ceilings get the same allocator.
  parasync::KeepFreedMessageBuffers();
  // The servers log warnings (a rejected request, a resend); info lines would drown progress.
  spdlog::set_level(spdlog::level::warn);

  std::string command = "parasync-bench";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  const auto start = Clock::now();
  Report report;
  Status status;
  try {
    status = RunAll(st, report);
  } catch (const std::exception& e) {
    status = Status::Internal(std::string("exception: ") + e.what());
  }
  if (!status.ok()) {
    std::fprintf(stderr, "%s: error: %s\n%s: the run failed; no figures printed\n", kProgram,
                 status.ToString().c_str(), kProgram);
    return 1;
  }
  const double elapsed = Since(start, Clock::now());
  PrintFigures(st, report, command, elapsed);
  Progress(fmt::format("done in {:.0f} s", elapsed));
  return 0;
}
