#include "worker/ps_client.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>
#include <cstring>

#include "common/metrics.h"
#include "common/push_seq.h"
#include "worker/request_tracker.h"

namespace parasync {

namespace {

// ZeroMQ's free function for a push frame that points into the caller's gradients: nothing
// to free, one frame less outstanding.
void ReleaseFrame(void* /*data*/, void* hint) {
  static_cast<std::atomic<int64_t>*>(hint)->fetch_sub(1, std::memory_order_release);
}

}  // namespace

Result<std::unique_ptr<Socket>> PsClient::OpenSocket(zmq::context_t& context,
                                                     const PsClientOptions& options, size_t shard) {
  SocketOptions socket_options;
  socket_options.send_timeout = options.request_timeout;
  if (options.curve) {
    socket_options.curve_public_key = options.curve->own.public_key;
    socket_options.curve_secret_key = options.curve->own.secret_key;
    socket_options.curve_server_public_key = options.curve->ServerKey(shard);
  }
  return Socket::Connect(context, ToEndpoint(options.ps_addresses[shard]), socket_options);
}

Result<std::unique_ptr<PsClient>> PsClient::Connect(zmq::context_t& context,
                                                    const PsClientOptions& options) {
  if (options.ps_addresses.empty()) return Status::InvalidArgument("no parameter servers given");
  std::vector<std::unique_ptr<Socket>> sockets;
  for (size_t shard = 0; shard < options.ps_addresses.size(); ++shard) {
    auto s = OpenSocket(context, options, shard);
    if (!s.ok()) return s.status();
    sockets.push_back(std::move(s).value());
  }
  auto client = std::unique_ptr<PsClient>(new PsClient(std::move(sockets), options));
  client->context_ = &context;
  client->unreleased_ = std::make_unique<std::atomic<int64_t>[]>(options.ps_addresses.size());
  client->read_versions_.assign(options.ps_addresses.size(), 0);
  client->next_step_.assign(options.ps_addresses.size(), 0);
  client->incarnation_.assign(options.ps_addresses.size(), 0);
  client->read_incarnation_.assign(options.ps_addresses.size(), 0);
  std::random_device rd;
  while (client->push_incarnation_ == 0) client->push_incarnation_ = rd();
  if (options.local_group) {
    PARASYNC_ASSIGN_OR_RETURN(client->group_, LocalGroup::Open(context, *options.local_group));
  }
  return client;
}

PsClient::~PsClient() {
  sockets_.clear();  // linger 0: ZeroMQ drops what is still queued, releasing its frames
  if (!AwaitFramesReleased(std::chrono::seconds(2))) {
    // A frame still held would call ReleaseFrame on freed counters: keep them.
    spdlog::error("{} push frame(s) not released by ZeroMQ at exit; leaking their counters",
                  Unreleased());
    (void)unreleased_.release();
  }
}

int64_t PsClient::Unreleased() const {
  int64_t n = 0;
  for (size_t s = 0; s < options_.ps_addresses.size(); ++s) {
    n += unreleased_[s].load(std::memory_order_acquire);
  }
  return n;
}

bool PsClient::AwaitFramesReleased(std::chrono::steady_clock::duration limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (int spins = 0; Unreleased() > 0; ++spins) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  return true;
}

Status PsClient::SettlePushFrames(const Status& exchange) {
  const Status released = ReleasePushFrames(exchange.ok());
  if (exchange.ok()) return released;
  if (!released.ok()) spdlog::warn("{}", released.ToString());
  return exchange;  // what went wrong first
}

Status PsClient::ReleasePushFrames(bool answered) {
  // After the servers answered, every frame has been written out (a resent copy may still be
  // on its way: a live connection drains it); after a failure a push may sit in the queue of
  // a server that is gone. Then the sockets that still hold frames are closed, which drops
  // them, every frame is awaited, and only then are those sockets opened again.
  if (AwaitFramesReleased(answered ? options_.request_timeout : std::chrono::milliseconds(100))) {
    return Status::Ok();
  }
  std::vector<size_t> stuck;
  for (size_t shard = 0; shard < sockets_.size(); ++shard) {
    if (unreleased_[shard].load(std::memory_order_acquire) == 0) continue;
    sockets_[shard].reset();
    stuck.push_back(shard);
  }
  spdlog::warn("push frames still queued for {} ps shard(s); reopening those connections",
               stuck.size());
  if (!AwaitFramesReleased(std::chrono::seconds(10))) {
    // Returning now would let the caller reuse memory ZeroMQ may still read.
    spdlog::critical("ZeroMQ kept {} push frame(s) after their sockets were closed",
                     Unreleased());
    std::abort();
  }
  Status result;
  for (size_t shard : stuck) {
    auto s = OpenSocket(*context_, options_, shard);
    if (!s.ok()) {
      // Left null: every later request to this shard fails with Unavailable (Exchange).
      if (result.ok()) {
        result = s.status().WithContext("reopening the connection to ps shard " +
                                        std::to_string(shard));
      }
      continue;
    }
    sockets_[shard] = std::move(s).value();
  }
  return result;
}

std::string PsClient::ShardName(int shard) const {
  return "ps shard " + std::to_string(shard) + " (" +
         options_.ps_addresses[static_cast<size_t>(shard)] + ")";
}

Status PsClient::SendFrames(int shard, Outgoing& request) {
  // The header's incarnation stays what the request was built for: a push computed from
  // (or a pull waiting for) a version of one server process says so, also when resent.
  // Frames are copied so the request can be resent.
  std::vector<zmq::message_t> frames;
  frames.reserve(request.frames.size());
  for (auto& f : request.frames) {
    frames.emplace_back();
    frames.back().copy(f);
  }
  return sockets_[static_cast<size_t>(shard)]->Send(nullptr, request.header, std::move(frames));
}

Status PsClient::SendRequest(RequestTracker& tracker, size_t i, Outgoing& request) {
  tracker.Sent(i, incarnation_[static_cast<size_t>(tracker.shard(i))],
               std::chrono::steady_clock::now());
  return SendFrames(tracker.shard(i), request);
}

Status PsClient::ResendDue(RequestTracker& tracker, std::vector<Outgoing>& requests,
                           std::chrono::steady_clock::time_point now) {
  for (size_t i = 0; i < tracker.size(); ++i) {
    if (tracker.answered(i)) continue;
    const int shard = tracker.shard(i);
    const size_t s = static_cast<size_t>(shard);
    const uint64_t announced = options_.incarnation_of ? options_.incarnation_of(shard) : 0;
    const RequestTracker::Resend why = tracker.ResendDue(i, announced, now);
    if (why == RequestTracker::Resend::kNotDue) continue;
    const bool restarted = why == RequestTracker::Resend::kRestarted;
    if (tracker.FirstComplaint(i)) {
      spdlog::warn("{} {}; sending again (for up to {} s)", ShardName(shard),
                   restarted ? "restarted" : "does not answer",
                   std::chrono::duration_cast<std::chrono::seconds>(tracker.Remaining(now)).count());
    }
    if (restarted) {
      incarnation_[s] = announced;
      ++reconnects_;
      // The new process may hold no model (nothing saved yet): register first (idempotent).
      if (registration_ && requests[i].header.type != MsgType::kRegister) {
        Header reg;
        reg.type = MsgType::kRegister;
        reg.request_id = next_request_id_++;  // its reply is not waited for
        reg.rank = options_.rank;
        reg.registration = registration_;
        (void)sockets_[s]->Send(nullptr, reg, {});
      }
    }
    ++resends_;
    if (Status st = SendRequest(tracker, i, requests[i]); !st.ok()) {
      return st.WithContext(ShardName(shard));
    }
  }
  return Status::Ok();
}

Status PsClient::TakeReplies(RequestTracker& tracker, int shard,
                             std::vector<std::optional<Inbound>>& replies) {
  using Clock = std::chrono::steady_clock;
  // Drain what is queued: replies to abandoned requests (other ids) may be ahead of ours.
  for (;;) {
    auto in = sockets_[static_cast<size_t>(shard)]->Receive(std::chrono::milliseconds(0));
    if (!in.ok()) return in.status();
    if (!in->has_value()) return Status::Ok();
    Inbound& msg = **in;
    if (!msg.header.ok()) {
      return msg.header.status().WithContext(ShardName(shard) + " sent a bad reply");
    }
    const std::optional<size_t> i = tracker.Match(shard, msg.header->request_id);
    // A late reply to an abandoned request may come from a process that has died since (it
    // was queued before the restart): its incarnation is not the shard's now, and taking it
    // would make every next request look sent to a dead process (a storm of resends and
    // re-registrations that fills the new process's queue for this connection).
    if (!i) continue;
    if (msg.header->incarnation != 0) {
      incarnation_[static_cast<size_t>(shard)] = msg.header->incarnation;
    }
    if (!msg.header->status.ok()) return msg.header->status.WithContext(ShardName(shard));
    const auto now = Clock::now();
    if (tracker.complained(*i)) {
      spdlog::info("{} answered again after {:.1f} s", ShardName(shard),
                   std::chrono::duration<double>(tracker.Elapsed(now)).count());
    }
    tracker.Answer(*i, now);
    replies[*i] = std::move(msg);
  }
}

Status PsClient::AwaitReplies(RequestTracker& tracker, std::vector<Outgoing>& requests,
                              bool interruptible, std::vector<std::optional<Inbound>>& replies) {
  using Clock = std::chrono::steady_clock;
  std::vector<Socket*> waiting;
  while (tracker.pending() > 0) {
    if (options_.loop != nullptr) options_.loop->Beat();
    if (interruptible && options_.interrupted && options_.interrupted()) {
      return Status::Aborted("interrupted while waiting for the parameter servers");
    }
    const auto now = Clock::now();
    if (auto overdue = tracker.CheckOverdue(now)) {
      std::string silent;
      for (size_t i : overdue->silent) {
        silent += (silent.empty() ? "" : ", ") + ShardName(tracker.shard(i));
      }
      return Status::TimedOut("no reply from " + silent + " within " +
                              std::to_string(overdue->limit.count()) + " ms");
    }
    PARASYNC_RETURN_IF_ERROR(ResendDue(tracker, requests, now));
    // Every shard with an unanswered request, once (a shard may have several: PushPull).
    const std::vector<int> waiting_shard = tracker.WaitingShards();
    waiting.clear();
    for (int shard : waiting_shard) {
      // A refused CURVE key never gets an answer: say so now instead of waiting it out.
      if (auto refused = sockets_[static_cast<size_t>(shard)]->HandshakeFailure()) {
        return Status::Unavailable(ShardName(shard) + ": " + *refused);
      }
      waiting.push_back(sockets_[static_cast<size_t>(shard)].get());
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(tracker.Remaining(now));
    auto ready = WaitReadable(waiting, std::min(left, std::chrono::milliseconds(100)) +
                                           std::chrono::milliseconds(1));
    if (!ready.ok()) return ready.status();
    for (size_t k = 0; k < waiting.size(); ++k) {
      if ((*ready)[k]) PARASYNC_RETURN_IF_ERROR(TakeReplies(tracker, waiting_shard[k], replies));
    }
  }
  return Status::Ok();
}

Result<std::vector<Inbound>> PsClient::Exchange(
    std::vector<int> shards, std::vector<Outgoing> requests, std::chrono::milliseconds timeout,
    bool interruptible, std::vector<std::chrono::steady_clock::time_point>* answered_at,
    size_t short_count, std::chrono::milliseconds short_timeout) {
  // While a step is open its early pushes' replies are queued on the sockets: another
  // exchange would take them for late replies and drop them.
  if (step_.open && !finishing_step_) {
    return Status::FailedPrecondition("a request while a step is open (between BeginStep and "
                                      "FinishStep)");
  }
  const size_t n = shards.size();
  RequestTracker tracker(std::move(shards),
                         {timeout, short_count, short_timeout, FirstResendAfter(),
                          std::max(options_.resend_max, FirstResendAfter())});
  const auto sending = std::chrono::steady_clock::now();
  for (size_t i = 0; i < n; ++i) {
    if (!sockets_[static_cast<size_t>(tracker.shard(i))]) {
      return Status::Unavailable(ShardName(tracker.shard(i)) +
                                 ": its connection could not be reopened after a failed push");
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (requests[i].sent_at) {  // sent before (GradientReady): only its reply is awaited
      tracker.SetId(i, requests[i].header.request_id);
      tracker.Sent(i, requests[i].sent_to, *requests[i].sent_at);
      continue;
    }
    tracker.SetId(i, next_request_id_++);
    requests[i].header.request_id = tracker.id(i);
    requests[i].header.rank = options_.rank;
    requests[i].header.joining = joining_;
    if (Status st = SendRequest(tracker, i, requests[i]); !st.ok()) {
      return st.WithContext(ShardName(tracker.shard(i)));
    }
  }
  tracker.Start(std::chrono::steady_clock::now());
  std::vector<std::optional<Inbound>> replies(n);
  PARASYNC_RETURN_IF_ERROR(AwaitReplies(tracker, requests, interruptible, replies));
  if (answered_at != nullptr) *answered_at = tracker.answered_at();
  for (size_t i = 0; i < n; ++i) {
    // A push answered after a resend took the resend's wait too: counting it would feed
    // the resend delay on itself (a lost reply doubling it each time).
    if (requests[i].header.type != MsgType::kPush || tracker.complained(i)) continue;
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        tracker.answered_at()[i] - requests[i].sent_at.value_or(sending));
    push_reply_ = std::max(took, push_reply_ * 7 / 8);
  }
  std::vector<Inbound> out;
  out.reserve(n);
  for (auto& r : replies) out.push_back(std::move(*r));
  return out;
}

std::chrono::milliseconds PsClient::FirstResendAfter() const {
  return std::min(std::max(options_.resend_after, 2 * push_reply_),
                  std::max(options_.resend_after, options_.resend_max));
}

Result<std::vector<Inbound>> PsClient::Broadcast(const Header& header,
                                                 std::chrono::milliseconds timeout,
                                                 bool interruptible) {
  std::vector<int> shards;
  std::vector<Outgoing> requests;
  for (int s = 0; s < num_shards(); ++s) {
    shards.push_back(s);
    Outgoing o;
    o.header = header;
    requests.push_back(std::move(o));
  }
  return Exchange(std::move(shards), std::move(requests), timeout, interruptible);
}

std::vector<PsClient::Outgoing> PsClient::RegisterRequests(
    const ModelRegistration& reg, const SliceMap& map,
    std::span<const float* const> initial_values) const {
  std::vector<Outgoing> requests(static_cast<size_t>(num_shards()));
  for (int s = 0; s < num_shards(); ++s) {
    Outgoing& o = requests[static_cast<size_t>(s)];
    o.header.type = MsgType::kRegister;
    o.header.registration = reg;
    if (initial_values.empty()) continue;
    for (uint32_t id : map.SlicesOfShard(s)) {
      const SliceInfo& info = map.slices()[id];
      if (reg.variables[info.var_index].init.kind != InitKind::kProvided) continue;
      o.header.slices.push_back({id, 0, info.length});
      o.frames.emplace_back(initial_values[info.var_index] + info.offset,
                            static_cast<size_t>(info.length) * sizeof(float));
    }
  }
  return requests;
}

Status PsClient::Register(const ModelRegistration& reg, std::chrono::milliseconds timeout,
                          std::span<const float* const> initial_values) {
  using Clock = std::chrono::steady_clock;
  if (reg.num_shards != num_shards()) {
    return Status::InvalidArgument("registration names " + std::to_string(reg.num_shards) +
                                   " shards but " + std::to_string(num_shards()) + " are given");
  }
  if (!initial_values.empty() && initial_values.size() != reg.variables.size()) {
    return Status::InvalidArgument("initial values for " + std::to_string(initial_values.size()) +
                                   " variables, the model has " +
                                   std::to_string(reg.variables.size()));
  }
  PARASYNC_RETURN_IF_ERROR(CheckWireDType(reg));
  auto map = SliceMap::Build(reg.variables, reg.max_slice_elements, reg.num_shards);
  if (!map.ok()) return map.status();
  const bool joins = initial_values.empty() &&
                     std::any_of(reg.variables.begin(), reg.variables.end(), [](const VariableSpec& v) {
                       return v.init.kind == InitKind::kProvided;
                     });
  const auto deadline = Clock::now() + timeout;
  std::vector<int> shards(static_cast<size_t>(num_shards()));
  for (int s = 0; s < num_shards(); ++s) shards[static_cast<size_t>(s)] = s;
  Result<std::vector<Inbound>> replies = Status::Internal("not sent");
  for (bool logged = false;; logged = true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    replies = Exchange(shards, RegisterRequests(reg, *map, initial_values),
                       std::max(left, std::chrono::milliseconds(1)));
    // A model whose values come with rank 0's registration: a server that has not had it
    // answers Unavailable; ask again until it has, within the same timeout.
    if (replies.ok() || !joins || replies.status().code() != StatusCode::kUnavailable ||
        Clock::now() + std::chrono::milliseconds(200) >= deadline) {
      break;
    }
    if (!logged) spdlog::info("waiting for rank 0 to register the model and its initial values");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!replies.ok()) return replies.status();
  registration_ = reg;
  UseModel(reg, std::move(map).value());
  recorded_progress_ = {};
  bool first = true;
  for (int s = 0; s < num_shards(); ++s) {
    if (!SendsTo(s)) continue;  // it never sees a push
    const DataProgress& p = (*replies)[static_cast<size_t>(s)].header->progress;
    const auto position = [](const DataProgress& d) { return std::pair(d.epoch, d.done); };
    if (first || p.empty() || position(p) < position(recorded_progress_)) recorded_progress_ = p;
    if (p.empty()) break;
    first = false;
  }
  return Status::Ok();
}

Status PsClient::Adopt(const ModelRegistration& reg) {
  if (reg.num_shards != num_shards()) {
    return Status::InvalidArgument("the model is registered for " + std::to_string(reg.num_shards) +
                                   " shards but " + std::to_string(num_shards()) + " are given");
  }
  PARASYNC_RETURN_IF_ERROR(CheckWireDType(reg));
  auto map = SliceMap::Build(reg.variables, reg.max_slice_elements, reg.num_shards);
  if (!map.ok()) return map.status();
  UseModel(reg, std::move(map).value());
  return Status::Ok();
}

Status PsClient::CheckWireDType(const ModelRegistration& reg) const {
  const DType d = options_.wire_dtype.dtype;
  if (HasErrorFeedback(d) && !reg.tables.empty()) {
    return Status::InvalidArgument("--wire-dtype " + std::string(DTypeName(d)) +
                                   " does not apply to embedding tables: use bfloat16 or float16");
  }
  if (group_ && !reg.tables.empty()) {
    return Status::InvalidArgument(
        "local aggregation carries dense variables only: this model has embedding tables");
  }
  return Status::Ok();
}

void PsClient::UseModel(const ModelRegistration& reg, SliceMap map) {
  map_ = std::move(map);
  var_sizes_.clear();
  int64_t total = 0;
  for (const VariableSpec& v : reg.variables) {
    var_sizes_.push_back(v.num_elements());
    total += v.num_elements();
  }
  // Room for a whole encoded push (no push is in flight between calls), a run per shard.
  const WireFormat wire = options_.wire_dtype;
  const bool fed_back = HasErrorFeedback(wire.dtype);
  push_residual_.assign(fed_back ? static_cast<size_t>(total) : 0, 0.0f);
  // A worker-side aggregate is pulled as it was pushed; parameters as changes to this
  // client's copy in the push's format (delta pulls), or in bfloat16.
  const bool parameters = fed_back && reg.optimizer.kind != OptimizerKind::kAggregate;
  delta_pulls_ = parameters && options_.delta_pulls;
  pull_dtype_ = !parameters || delta_pulls_ ? wire : DType::kBfloat16;
  pull_follows_push_ = fed_back && pull_dtype_ == wire;
  pull_base_.assign(delta_pulls_ ? static_cast<size_t>(total) : 0, 0.0f);
  pull_generation_.assign(static_cast<size_t>(num_shards()), 0);
  residual_at_.assign(static_cast<size_t>(num_shards()), 0);
  shard_vars_.assign(static_cast<size_t>(num_shards()), {});
  var_shards_.assign(reg.variables.size(), {});
  size_t at = 0;
  for (int s = 0; s < num_shards(); ++s) {
    residual_at_[static_cast<size_t>(s)] = at;
    for (uint32_t id : map_->SlicesOfShard(s)) {
      const SliceInfo& info = map_->slices()[id];
      at += static_cast<size_t>(info.length);
      std::vector<int>& shards = var_shards_[info.var_index];
      if (shards.empty() || shards.back() != s) {
        shards.push_back(s);
        shard_vars_[static_cast<size_t>(s)].push_back(info.var_index);
      }
    }
  }
  SizePushBuffers();
  if (!probe_.configured) {  // the first registration's (a re-registration keeps its course)
    probe_.configured = true;
    // Top-k against int8, and each lossy format against float32: they cost CPU that only a
    // slow enough link pays back. (int4 is not tried against int8: where int4's packing
    // does not pay, int8's encoding did not either, measured.)
    const PsClientOptions::TopKProbe& o = options_.topk_probe;
    probe_.agree = reg.optimizer.kind == OptimizerKind::kAggregate;
    probe_.formats = {wire};
    if (wire.dtype == DType::kTopK) probe_.formats.push_back(DType::kInt8);
    if (o.float32) probe_.formats.push_back(DType::kFloat32);
    probe_.active = o.enabled && fed_back && probe_.formats.size() > 1;
    probe_.periods.assign(probe_.formats.size(), {});
  }
}

void PsClient::SizePushBuffers() {
  const WireFormat wire = options_.wire_dtype;
  narrowed_at_.assign(static_cast<size_t>(num_shards()), 0);
  size_t bytes = 0;
  for (int s = 0; s < num_shards(); ++s) {
    narrowed_at_[static_cast<size_t>(s)] = bytes;
    // float32: the caller's memory, but for a push that folds the residual in (the probe).
    if (wire.dtype == DType::kFloat32 &&
        std::find(fold_residual_.begin(), fold_residual_.end(), true) == fold_residual_.end()) {
      continue;
    }
    for (uint32_t id : map_->SlicesOfShard(s)) {
      const SliceInfo& info = map_->slices()[id];
      bytes += WireBytes(wire, static_cast<size_t>(info.length), info.offset);
    }
  }
  narrowed_.assign(bytes, 0);
}

void PsClient::SetPushFormat(WireFormat format) {
  if (format == options_.wire_dtype) return;
  options_.wire_dtype = format;
  // A delta pull's copy carries over (any format changes it); an aggregate's average is
  // quantized in the step's push format, which every rank switched to alike (the probe).
  if (pull_follows_push_) pull_dtype_ = format;
  // A float32 push sends what the residual held too, once (and zeroes it).
  if (format.dtype == DType::kFloat32 && !push_residual_.empty()) {
    fold_residual_.assign(static_cast<size_t>(num_shards()), true);
  }
  SizePushBuffers();  // no push holds narrowed_ between steps
}

namespace {
// The median of `v` (its upper middle for an even count); 0 for none.
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}
}  // namespace

bool TopKPays(std::vector<double> topk_steps, std::vector<double> int8_steps, double margin) {
  if (topk_steps.empty() || int8_steps.empty()) return true;
  return TopKPays(Median(std::move(topk_steps)), Median(std::move(int8_steps)), margin);
}

Status PsClient::ProbeMedians(int64_t round, std::vector<double>* medians, size_t* ranks) {
  medians->clear();
  for (const std::vector<double>& p : probe_.periods) {
    medians->push_back(p.empty() ? std::numeric_limits<double>::infinity() : Median(p));
  }
  *ranks = 1;
  if (!probe_.agree) return Status::Ok();
  const std::vector<double> mine = *medians;
  const size_t bytes = mine.size() * sizeof(double);
  std::vector<int32_t> who;
  std::vector<zmq::message_t> theirs;
  PARASYNC_RETURN_IF_ERROR(Gather("parasync/probe", round,
                                  {reinterpret_cast<const uint8_t*>(mine.data()), bytes}, &who,
                                  &theirs));
  medians->assign(mine.size(), 0.0);
  *ranks = 0;
  for (const zmq::message_t& m : theirs) {
    if (m.size() != bytes) continue;  // a rank that took no part
    std::vector<double> one(mine.size());
    std::memcpy(one.data(), m.data(), bytes);
    for (size_t f = 0; f < one.size(); ++f) (*medians)[f] += one[f];
    ++*ranks;
  }
  return *ranks > 0 ? Status::Ok() : Status::Unavailable("no rank's medians came back");
}

void PsClient::ConcludeProbe(const std::vector<double>& medians, size_t ranks) {
  probe_.active = false;
  probe_.now = -1;
  const PsClientOptions::TopKProbe& o = options_.topk_probe;
  // The first format at least `margin` faster than every later one, else the last tried.
  const size_t n = medians.size();
  size_t chosen = n - 1;
  for (size_t f = 0; f + 1 < n; ++f) {
    const double later = *std::min_element(medians.begin() + static_cast<std::ptrdiff_t>(f + 1),
                                           medians.end());
    if (TopKPays(medians[f], later, o.margin)) {
      chosen = f;
      break;
    }
  }
  const WireFormat format = probe_.formats[chosen];
  SetPushFormat(format);
  // "a step took 49.7 ms with it, 39.8 ms with int8 and 37.0 ms with float32 (medians of
  // 32, 32 and 16 steps)"; float32 left after its first step: that step's, this rank's.
  std::string took, counts;
  for (size_t f = 0; f < n; ++f) {
    const char* sep = f == 0 ? "" : f + 1 == n ? " and " : ", ";
    const std::string name = f == 0 ? std::string("it") : WireFormatName(probe_.formats[f]);
    const std::vector<double>& p = probe_.periods[f];
    const double first = p.empty() ? 0.0 : p.front();
    took += std::isinf(medians[f])
                ? fmt::format("{}{:.1f} ms with {}", sep, 1e3 * first, name)
                : fmt::format("{}{:.1f} ms with {}", sep,
                              1e3 * medians[f] / static_cast<double>(ranks), name);
    counts += fmt::format("{}{}", sep, p.size());
  }
  const std::string over = ranks > 1 ? fmt::format(", averaged over {} ranks", ranks) : "";
  spdlog::info("{} {} here: a step took {} (medians of {} steps{}); pushing {} from now on{}",
               WireFormatName(probe_.formats[0]), chosen == 0 ? "pays" : "does not pay", took,
               counts, over, WireFormatName(format),
               format.dtype == DType::kFloat32 ? " (compression off)" : "");
}

void PsClient::ProbePushFormat() {
  if (!probe_.active) return;
  const auto now = std::chrono::steady_clock::now();
  if (probe_.now >= 0) {
    probe_.periods[static_cast<size_t>(probe_.now)].push_back(
        std::chrono::duration<double>(now - probe_.last_end).count());
  }
  probe_.last_end = now;
  const PsClientOptions::TopKProbe& o = options_.topk_probe;
  const int64_t next = ++probe_.steps - o.start_after;  // the next step's index in the probe
  if (next < 0) return;
  // The lossy formats' windows in turn, `rounds` times; then float32's one window, left at
  // its first step where that step took over twice the best median so far (a slow link).
  const int64_t window = std::max(1, o.window);
  const auto formats = static_cast<int64_t>(probe_.formats.size());
  const int64_t lossy = o.float32 ? formats - 1 : formats;
  const int64_t rounds_end = window * lossy * std::max(1, o.rounds);
  const int64_t end = o.float32 ? rounds_end + window : rounds_end;
  std::vector<double> medians;
  size_t ranks = 1;
  int64_t round = 1;
  if (next < rounds_end) {
    probe_.now = static_cast<int>((next / window) % lossy);
    SetPushFormat(probe_.formats[static_cast<size_t>(probe_.now)]);
    return;
  }
  if (next == rounds_end && next < end) {
    probe_.now = static_cast<int>(lossy);
    SetPushFormat(DType::kFloat32);
    return;
  }
  if (next == rounds_end + 1 && next < end) {
    if (Status s = ProbeMedians(1, &medians, &ranks); !s.ok()) return FailProbe(s);
    const double best =
        *std::min_element(medians.begin(), medians.begin() + static_cast<std::ptrdiff_t>(lossy));
    if (medians.back() <= 2 * best) return;  // float32 keeps its window
    medians.back() = std::numeric_limits<double>::infinity();
    return ConcludeProbe(medians, ranks);
  }
  if (next < end) return;
  if (o.float32 && window > 1) round = 2;
  if (Status s = ProbeMedians(round, &medians, &ranks); !s.ok()) return FailProbe(s);
  ConcludeProbe(medians, ranks);
}

void PsClient::FailProbe(const Status& why) {
  probe_.active = false;
  probe_.now = -1;
  SetPushFormat(DType::kInt8);
  spdlog::warn("the probe could not hear the other ranks' step times ({}): pushing int8 from "
               "now on",
               why.ToString());
}

bool PsClient::SendsTo(int s) const {
  return !map_->SlicesOfShard(s).empty() || (registration_ && !registration_->tables.empty());
}

int64_t PsClient::TableDim(uint32_t table) const {
  return registration_ && table < registration_->tables.size() ? registration_->tables[table].dim
                                                               : 0;
}

Result<std::vector<PsClient::ShardRows>> PsClient::SplitRows(RowSet rows) const {
  std::vector<ShardRows> split(static_cast<size_t>(num_shards()));
  for (size_t k = 0; k < rows.size(); ++k) {
    const RowsOf& r = rows[k];
    if (TableDim(r.table) == 0) {
      return Status::InvalidArgument("rows of table " + std::to_string(r.table) +
                                     ", which is not registered");
    }
    // Sorted ids stay sorted within each shard's share.
    std::vector<size_t> slot(split.size(), SIZE_MAX);
    for (size_t i = 0; i < r.ids.size(); ++i) {
      if (i > 0 && r.ids[i] <= r.ids[i - 1]) {
        return Status::InvalidArgument("the ids of table " + std::to_string(r.table) +
                                       " are not sorted and unique");
      }
      const auto s = static_cast<size_t>(ShardOfRow(r.table, r.ids[i], num_shards()));
      ShardRows& to = split[s];
      if (slot[s] == SIZE_MAX) {
        slot[s] = to.ranges.size();
        to.ranges.push_back({r.table, 0});
        to.ids.emplace_back();
        to.pos.emplace_back();
        to.of.push_back(k);
      }
      to.ranges[slot[s]].count += 1;
      to.ids[slot[s]].push_back(r.ids[i]);
      to.pos[slot[s]].push_back(static_cast<uint32_t>(i));
    }
  }
  return split;
}

void PsClient::AddPullRequests(const std::vector<int64_t>& min_versions, std::vector<int>* shards,
                               std::vector<Outgoing>* requests,
                               const std::vector<ShardRows>& rows, bool with_slices) const {
  for (int s = 0; s < num_shards(); ++s) {
    if (!SendsTo(s)) continue;
    Outgoing o;
    o.header.type = MsgType::kPull;
    o.header.min_version = min_versions[static_cast<size_t>(s)];
    o.header.incarnation = read_incarnation_[static_cast<size_t>(s)];
    o.header.dtype = pull_dtype_.dtype;  // the format the reply is to carry
    o.header.topk_keep = static_cast<uint8_t>(pull_dtype_.keep);
    // (While the probe tries float32, parameters come whole; the copy waits for the next.)
    o.header.delta_pull = delta_pulls_ && HasErrorFeedback(pull_dtype_.dtype) && with_slices;
    o.header.delta_base = o.header.delta_pull ? pull_generation_[static_cast<size_t>(s)] : 0;
    for (uint32_t id : with_slices ? map_->SlicesOfShard(s) : std::vector<uint32_t>{}) {
      o.header.slices.push_back({id, 0, map_->slices()[id].length});
    }
    const ShardRows& mine = rows[static_cast<size_t>(s)];
    o.header.rows = mine.ranges;
    for (const std::vector<uint64_t>& ids : mine.ids) {
      o.frames.emplace_back(ids.data(), ids.size() * sizeof(uint64_t));
    }
    shards->push_back(s);
    requests->push_back(std::move(o));
  }
}

void PsClient::AddPushRowFrames(const ShardRows& split, RowSet rows, Outgoing& o) const {
  o.header.rows = split.ranges;
  const DType dtype = options_.wire_dtype.dtype;
  for (size_t k = 0; k < split.ranges.size(); ++k) {
    const std::vector<uint64_t>& ids = split.ids[k];
    o.frames.emplace_back(ids.data(), ids.size() * sizeof(uint64_t));
    const RowsOf& from = rows[split.of[k]];
    const auto dim = static_cast<size_t>(TableDim(from.table));
    const size_t row_bytes = dim * DTypeSize(dtype);
    zmq::message_t& values = o.frames.emplace_back(ids.size() * row_bytes);
    auto* at = static_cast<uint8_t*>(values.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      EncodeFloats(from.values + split.pos[k][i] * dim, dim, dtype, at + i * row_bytes);
    }
  }
}

PsClient::Outgoing PsClient::PushRequest(int s, std::span<const float* const> grads,
                                         int64_t batch_examples, int64_t read_version,
                                         uint64_t seq, RowSet rows, const ShardRows& split) {
  const WireFormat dtype = options_.wire_dtype;
  const auto si = static_cast<size_t>(s);
  float* residual = push_residual_.empty() ? nullptr : push_residual_.data() + residual_at_[si];
  // The probe turned compression off: the first float32 push sends what was not sent yet too.
  const bool fold = dtype.dtype == DType::kFloat32 && residual != nullptr &&
                    si < fold_residual_.size() && fold_residual_[si];
  const bool narrow = dtype.dtype != DType::kFloat32 || fold;
  uint8_t* next_narrowed = narrow ? narrowed_.data() + narrowed_at_[si] : nullptr;
  Outgoing o;
  o.header.type = MsgType::kPush;
  o.header.ranks = group_ranks_;  // a local group's leader: the members its push sums
  o.header.batch_examples = batch_examples;
  o.header.seq = seq;
  o.header.progress = progress_;
  // A step's gradient may come from parameters read before the latest pull (BeginStep).
  const ReadPoint* from =
      step_.open && step_.computed_from && read_version == kLastRead ? &*step_.computed_from : nullptr;
  o.header.version = from != nullptr             ? from->versions[si]
                     : read_version == kLastRead ? read_versions_[si]
                                                 : read_version;
  o.header.incarnation = from != nullptr ? from->incarnations[si] : read_incarnation_[si];
  o.header.dtype = dtype.dtype;
  o.header.topk_keep = static_cast<uint8_t>(dtype.keep);
  for (uint32_t id : map_->SlicesOfShard(s)) {
    const SliceInfo& info = map_->slices()[id];
    o.header.slices.push_back({id, 0, info.length});
    // Zero-copy: the frame is the caller's memory (or narrowed_), which Push keeps valid
    // until ZeroMQ released every frame (ReleasePushFrames).
    void* data = const_cast<float*>(grads[info.var_index] + info.offset);
    const auto count = static_cast<size_t>(info.length);
    const size_t bytes = WireBytes(dtype, count, info.offset);
    if (fold) {
      const auto* g = static_cast<const float*>(data);
      for (size_t i = 0; i < count; ++i) {
        const float v = g[i] + residual[i];
        std::memcpy(next_narrowed + i * sizeof(float), &v, sizeof(float));
        residual[i] = 0.0f;
      }
    }
    if (narrow) {
      if (!fold) {
        EncodeRange(static_cast<const float*>(data), count, info.offset, dtype, next_narrowed,
                    residual);
      }
      data = next_narrowed;
      next_narrowed += bytes;
      if (residual != nullptr) residual += count;
    }
    std::atomic<int64_t>* counter = &unreleased_[static_cast<size_t>(s)];
    counter->fetch_add(1, std::memory_order_relaxed);
    o.frames.emplace_back(data, bytes, &ReleaseFrame, counter);
  }
  if (fold) fold_residual_[si] = false;
  AddPushRowFrames(split, rows, o);
  return o;
}

void PsClient::AddPushRequests(std::span<const float* const> grads, int64_t batch_examples,
                               int64_t read_version, std::vector<int>* shards,
                               std::vector<Outgoing>* requests, RowSet rows,
                               const std::vector<ShardRows>& split) {
  // One sequence number per push, the same on every shard: a resend is applied at most once.
  const PushSeq seq(push_incarnation_, static_cast<uint32_t>(++pushes_));
  for (int s = 0; s < num_shards(); ++s) {
    if (!SendsTo(s)) continue;
    requests->push_back(PushRequest(s, grads, batch_examples, read_version, seq.raw(), rows,
                                    split[static_cast<size_t>(s)]));
    shards->push_back(s);
  }
}

Status PsClient::TakePullRows(int shard, Inbound& in, size_t first, RowSet rows,
                              const ShardRows& split) const {
  const DType dtype = in.header->dtype;
  // The frame count is TakePullReplies': `first` slice frames and one per row range.
  if (in.header->rows != split.ranges) {
    return Status::Corruption("ps shard " + std::to_string(shard) +
                              " answered a pull with the wrong rows");
  }
  for (size_t k = 0; k < split.ranges.size(); ++k) {
    const RowsOf& to = rows[split.of[k]];
    const auto dim = static_cast<size_t>(TableDim(to.table));
    const size_t n = split.ids[k].size() * dim;
    const zmq::message_t& frame = in.frames[first + k];
    if (frame.size() != n * DTypeSize(dtype)) {
      return Status::Corruption("ps shard " + std::to_string(shard) + " answered " +
                                std::to_string(frame.size()) + " bytes for " +
                                std::to_string(split.ids[k].size()) + " rows of table " +
                                std::to_string(to.table));
    }
    const size_t row_bytes = dim * DTypeSize(dtype);
    const auto* at = static_cast<const uint8_t*>(frame.data());
    for (size_t i = 0; i < split.ids[k].size(); ++i) {
      DecodeFloats(at + i * row_bytes, dim, dtype, to.values + split.pos[k][i] * dim);
    }
  }
  return Status::Ok();
}

Status PsClient::TakePullReplies(std::span<float* const> params, std::span<const int> shards,
                                 std::span<Inbound> replies, RowSet rows,
                                 const std::vector<ShardRows>& split) {
  // Every reply is checked before any parameter is written, so a bad one changes nothing.
  struct Copy {
    const void* from;
    size_t count;
    int64_t offset;  // in its variable
    WireFormat dtype;
    float* to;
    float* base = nullptr;  // a delta pull's: the copy `from` changes (pull_base_)
    bool from_zeros = false;
  };
  std::vector<Copy> copies;
  copies.reserve(map_->slices().size());
  int64_t elements = 0;
  int64_t lowest = INT64_MAX;
  const std::vector<uint32_t> no_slices;
  for (size_t i = 0; i < replies.size(); ++i) {
    Inbound& in = replies[i];
    // A pull of rows alone (no params) asked for no slices.
    const std::vector<uint32_t>& ids = params.empty() ? no_slices : map_->SlicesOfShard(shards[i]);
    const size_t row_frames = in.header->rows.size();
    if (in.header->slices.size() != ids.size() || in.frames.size() != ids.size() + row_frames) {
      return Status::Corruption("ps shard " + std::to_string(shards[i]) +
                                " answered a pull with the wrong number of slices");
    }
    // The reply carries the dtype asked for (a server that ignores the field: float32).
    const WireFormat dtype = in.header->wire();
    // (A delta pull from zeros comes in int8 whatever was asked: CheckDeltaReply.)
    if (dtype != pull_dtype_ && dtype.dtype != DType::kFloat32 && !in.header->delta_pull) {
      return Status::Corruption("ps shard " + std::to_string(shards[i]) + " answered a " +
                                WireFormatName(pull_dtype_) + " pull in " +
                                WireFormatName(dtype));
    }
    PARASYNC_RETURN_IF_ERROR(CheckDeltaReply(shards[i], *in.header));
    float* base = in.header->delta_pull
                      ? pull_base_.data() + residual_at_[static_cast<size_t>(shards[i])]
                      : nullptr;
    for (size_t k = 0; k < ids.size(); ++k) {
      const SliceInfo& info = map_->slices()[ids[k]];
      const auto count = static_cast<size_t>(info.length);
      if (in.header->slices[k].slice_id != ids[k] ||
          in.frames[k].size() != WireBytes(dtype, count, info.offset) ||
          !WellFormedRange(in.frames[k].data(), count, info.offset, dtype)) {
        return Status::Corruption("ps shard " + std::to_string(shards[i]) +
                                  " answered a pull with a mismatching slice");
      }
      copies.push_back({in.frames[k].data(), count, info.offset, dtype,
                        params[info.var_index] + info.offset, base,
                        base != nullptr && in.header->delta_base == 0});
      if (base != nullptr) base += count;
      elements += info.length;
    }
    lowest = std::min(lowest, in.header->version);
    PARASYNC_RETURN_IF_ERROR(
        TakePullRows(shards[i], in, ids.size(), rows, split[static_cast<size_t>(shards[i])]));
  }
  const bool streaming = elements >= kStreamingCopyElements;
  auto copy = [&](size_t c) {
    if (copies[c].base != nullptr) {
      // A delta pull: the change to this client's copy, then the copy into the parameters.
      float* base = copies[c].base;
      if (copies[c].from_zeros) std::fill(base, base + copies[c].count, 0.0f);
      AddRange(copies[c].from, copies[c].count, copies[c].offset, copies[c].dtype, base,
               copies[c].to);
    } else if (streaming && copies[c].dtype.dtype == DType::kFloat32) {
      CopyFloatsStreaming(static_cast<const float*>(copies[c].from), copies[c].count,
                          copies[c].to);
    } else {
      DecodeRange(copies[c].from, copies[c].count, copies[c].offset, copies[c].dtype,
                  copies[c].to);
    }
  };
  if (copy_threads_ && elements >= kParallelCopyElements) {
    copy_threads_->ForEach(copies.size(), copy);
  } else {
    for (size_t c = 0; c < copies.size(); ++c) copy(c);
  }
  for (size_t i = 0; i < replies.size(); ++i) {
    const auto si = static_cast<size_t>(shards[i]);
    read_versions_[si] = replies[i].header->version;
    read_incarnation_[si] = replies[i].header->incarnation;
    // A plain reply (a server that ignores delta pulls) leaves the copy behind.
    if (!params.empty() && delta_pulls_ && HasErrorFeedback(pull_dtype_.dtype)) {
      pull_generation_[si] =
          replies[i].header->delta_pull ? replies[i].header->delta_generation : 0;
    }
  }
  last_version_ = lowest == INT64_MAX ? 0 : lowest;
  return Status::Ok();
}

Status PsClient::CheckDeltaReply(int shard, const Header& reply) const {
  if (!reply.delta_pull) return Status::Ok();
  const uint64_t held = delta_pulls_ ? pull_generation_[static_cast<size_t>(shard)] : 0;
  const bool format = reply.wire() == pull_dtype_ || reply.dtype == DType::kInt8;
  if (!delta_pulls_ || !format || (reply.delta_base != 0 && reply.delta_base != held) ||
      reply.delta_generation == 0) {
    return Status::Corruption("ps shard " + std::to_string(shard) +
                              " answered with a change to parameters generation " +
                              std::to_string(reply.delta_base) + " in " +
                              std::string(DTypeName(reply.dtype)) + "; this client holds " +
                              (delta_pulls_ ? "generation " + std::to_string(held)
                                            : std::string("no copy")));
  }
  return Status::Ok();
}

void PsClient::TakePushReplies(int64_t read_version, std::span<const int> shards,
                               std::span<const Inbound> replies) {
  int64_t lowest = INT64_MAX;
  last_push_dropped_ = false;
  last_push_staleness_ = -1;
  for (size_t i = 0; i < replies.size(); ++i) {
    const Header& h = *replies[i].header;
    lowest = std::min(lowest, h.version);
    last_push_dropped_ |= h.dropped;
    if (!h.dropped && !h.replayed) last_push_staleness_ = std::max(last_push_staleness_, h.staleness);
    const size_t s = static_cast<size_t>(shards[i]);
    next_step_[s] = read_version == kLastRead ? read_versions_[s] + 1 : read_version + 1;
  }
  last_version_ = lowest == INT64_MAX ? 0 : lowest;
}

std::vector<int64_t> PsClient::PullVersions(int64_t min_version) const {
  if (min_version == kNextStep) return next_step_;
  return std::vector<int64_t>(static_cast<size_t>(num_shards()), min_version);
}

Status PsClient::Pull(std::span<float* const> params, int64_t min_version, RowSet rows) {
  if (!map_) return Status::FailedPrecondition("Pull before Register");
  const bool rows_only = params.empty() && !rows.empty();
  if (params.size() != var_sizes_.size() && !rows_only) {
    return Status::InvalidArgument("wrong number of variables");
  }
  auto split = SplitRows(rows);
  if (!split.ok()) return split.status();
  std::vector<int> shards;
  std::vector<Outgoing> requests;
  AddPullRequests(PullVersions(min_version), &shards, &requests, *split, !rows_only);
  const bool may_wait = options_.pulls_may_wait || min_version != 0;
  auto replies = Exchange(shards, std::move(requests),
                          may_wait ? options_.blocking_timeout : options_.request_timeout);
  if (!replies.ok()) return replies.status();
  return TakePullReplies(params, shards, *replies, rows, *split);
}

Status PsClient::Push(std::span<const float* const> grads, int64_t batch_examples,
                      int64_t read_version, RowSet rows) {
  if (!map_) return Status::FailedPrecondition("Push before Register");
  if (group_) {
    return Status::FailedPrecondition(
        "with local aggregation a gradient goes with its step's pull (PushPull, or BeginStep "
        "... FinishStep): a push alone has no group step to join");
  }
  if (grads.size() != var_sizes_.size()) return Status::InvalidArgument("wrong number of variables");
  auto split = SplitRows(rows);
  if (!split.ok()) return split.status();
  std::vector<int> shards;
  std::vector<Outgoing> requests;
  AddPushRequests(grads, batch_examples, read_version, &shards, &requests, rows, *split);
  auto replies = Exchange(shards, std::move(requests), options_.request_timeout);
  PARASYNC_RETURN_IF_ERROR(SettlePushFrames(replies.status()));
  TakePushReplies(read_version, shards, *replies);
  return Status::Ok();
}

Status PsClient::PushPull(std::span<const float* const> grads, int64_t batch_examples,
                          std::span<float* const> params, int64_t min_version,
                          PushPullTimes* times, RowSet push_rows, RowSet pull_rows,
                          const ReadPoint* computed_from) {
  if (!map_) return Status::FailedPrecondition("PushPull before Register");
  if (grads.size() != var_sizes_.size()) return Status::InvalidArgument("wrong number of variables");
  PARASYNC_RETURN_IF_ERROR(BeginStep(batch_examples, computed_from));
  // Every gradient at once: nothing is sent before FinishStep.
  step_.grads.assign(grads.begin(), grads.end());
  std::fill(step_.missing.begin(), step_.missing.end(), 0);
  return FinishStep(params, min_version, times, push_rows, pull_rows);
}

Status PsClient::BeginStep(int64_t batch_examples, const ReadPoint* computed_from) {
  if (!map_) return Status::FailedPrecondition("a step before Register");
  if (step_.open) return Status::FailedPrecondition("a step began before the last one finished");
  if (computed_from != nullptr &&
      (computed_from->versions.size() != read_versions_.size() ||
       computed_from->incarnations.size() != read_incarnation_.size())) {
    return Status::InvalidArgument("a read point of " +
                                   std::to_string(computed_from->versions.size()) +
                                   " shards for a client of " + std::to_string(num_shards()));
  }
  step_.open = true;
  // One sequence number per push, the same on every shard: a resend is applied at most once.
  step_.seq = PushSeq(push_incarnation_, static_cast<uint32_t>(++pushes_)).raw();
  step_.batch_examples = batch_examples;
  step_.grads.assign(var_sizes_.size(), nullptr);
  step_.missing.assign(static_cast<size_t>(num_shards()), 0);
  for (size_t s = 0; s < shard_vars_.size(); ++s) {
    step_.missing[s] = static_cast<int>(shard_vars_[s].size());
  }
  step_.sent_shards.clear();
  step_.sent.clear();
  step_.computed_from.reset();
  if (computed_from != nullptr) step_.computed_from = *computed_from;
  return Status::Ok();
}

Status PsClient::GradientReady(size_t variable, const float* grad) {
  if (!step_.open) return Status::FailedPrecondition("a gradient outside a step (BeginStep)");
  if (variable >= step_.grads.size() || grad == nullptr) {
    return Status::InvalidArgument("gradient of variable " + std::to_string(variable) + " of " +
                                   std::to_string(step_.grads.size()) +
                                   (grad == nullptr ? " without data" : ""));
  }
  if (step_.grads[variable] != nullptr) {
    return Status::InvalidArgument("the gradient of " + registration_->variables[variable].name +
                                   " was already given in this step");
  }
  step_.grads[variable] = grad;
  // With tables every shard's push carries rows; a group's leader pushes the group's sum.
  const bool tables = (registration_ && !registration_->tables.empty()) || group_ != nullptr;
  for (int s : var_shards_[variable]) {
    if (--step_.missing[static_cast<size_t>(s)] > 0 || tables) continue;
    // Every variable of shard s is ready: its push goes now, and FinishStep awaits its reply.
    Outgoing o = PushRequest(s, step_.grads, step_.batch_examples, kLastRead, step_.seq, {}, {});
    o.header.request_id = next_request_id_++;
    o.header.rank = options_.rank;
    o.header.joining = joining_;
    o.sent_to = incarnation_[static_cast<size_t>(s)];
    o.sent_at = std::chrono::steady_clock::now();
    if (!sockets_[static_cast<size_t>(s)]) {
      return Status::Unavailable(ShardName(s) +
                                 ": its connection could not be reopened after a failed push");
    }
    // Kept (and so awaited, and its frames settled) even if the send failed: FinishStep's
    // exchange sends it again when it is due, as it would any unanswered request.
    if (Status sent = SendFrames(s, o); !sent.ok()) {
      spdlog::warn("{}: a push could not be sent yet ({}); it is sent again when due",
                   ShardName(s), sent.message());
    }
    step_.sent_shards.push_back(s);
    step_.sent.push_back(std::move(o));
  }
  return Status::Ok();
}

void PsClient::SettleSentPushes(const std::vector<int>& shards, std::vector<Outgoing> requests) {
  if (requests.empty()) return;
  finishing_step_ = true;
  auto replies = Exchange(shards, std::move(requests), options_.request_timeout);
  finishing_step_ = false;
  (void)SettlePushFrames(replies.status());
}

Status PsClient::AbandonStep(Status why) {
  if (!step_.open) return why;
  SettleSentPushes(step_.sent_shards, std::move(step_.sent));
  step_.open = false;
  step_.sent.clear();
  return why;
}

Status PsClient::FinishStep(std::span<float* const> params, int64_t min_version,
                            PushPullTimes* times, RowSet push_rows, RowSet pull_rows) {
  Status s;
  if (!group_ || !step_.open) {
    s = ExchangeStep(params, min_version, times, push_rows, pull_rows);
  } else if (!push_rows.empty() || !pull_rows.empty()) {
    return AbandonStep(Status::InvalidArgument(
        "local aggregation carries dense variables only: a step with embedding rows"));
  } else {
    s = GroupStep(params, min_version, times);
  }
  if (s.ok()) ProbePushFormat();
  return s;
}

Status PsClient::GroupStep(std::span<float* const> params, int64_t min_version,
                           PushPullTimes* times) {
  using Clock = std::chrono::steady_clock;
  const auto unmarked = std::find(step_.grads.begin(), step_.grads.end(), nullptr);
  if (unmarked != step_.grads.end() || params.size() != var_sizes_.size()) {
    // ExchangeStep names the problem and closes the step without sending anything.
    return ExchangeStep(params, min_version, times, {}, {});
  }
  if (!group_->leads()) {
    const auto start = Clock::now();
    auto outcome = group_->Exchange(step_.grads, var_sizes_, step_.batch_examples, params,
                                    options_.interrupted);
    if (!outcome.ok() && outcome.status().code() != StatusCode::kAborted) {
      // The leader is gone, left, or never answered: this worker goes on alone.
      spdlog::warn("local group: {}; rank {} exchanges its steps with the servers itself from "
                   "now on", outcome.status().message(), options_.rank);
      group_.reset();
      return ExchangeStep(params, min_version, times, {}, {});
    }
    step_.open = false;
    if (!outcome.ok()) return outcome.status();
    if (outcome->read_versions.size() == read_versions_.size()) {
      read_versions_ = outcome->read_versions;
      read_incarnation_ = outcome->read_incarnations;
    }
    last_version_ = outcome->last_version;
    last_push_dropped_ = outcome->dropped;
    last_push_staleness_ = outcome->staleness;
    if (times != nullptr) {
      const auto done = Clock::now();
      *times = PushPullTimes{};
      times->push_seconds = std::chrono::duration<double>(done - start).count();
      times->first_push_sent = times->last_push_sent = start;
      times->pushes_acked = times->pulled = done;
    }
    return outcome->status;
  }
  auto members = group_->Gather(step_.grads, var_sizes_, group_sum_, &step_.batch_examples,
                                options_.interrupted);
  if (!members.ok()) return AbandonStep(members.status());
  for (size_t v = 0; v < group_sum_.size(); ++v) step_.grads[v] = group_sum_[v].data();
  group_ranks_.assign(members->begin(), members->end());
  const Status status = ExchangeStep(params, min_version, times, {}, {});
  group_ranks_.clear();
  group_->Answer(*members,
                 {status, last_version_, last_push_dropped_, last_push_staleness_,
                  read_versions_, read_incarnation_},
                 params, var_sizes_);
  return status;
}

Status PsClient::ExchangeStep(std::span<float* const> params, int64_t min_version,
                              PushPullTimes* times, RowSet push_rows, RowSet pull_rows) {
  using Clock = std::chrono::steady_clock;
  if (!step_.open) return Status::FailedPrecondition("FinishStep without BeginStep");
  struct Close {
    OpenStep& step;
    ~Close() {
      step.open = false;
      step.sent.clear();
    }
  } close{step_};
  std::vector<int> shards = step_.sent_shards;
  std::vector<Outgoing> requests = std::move(step_.sent);
  const size_t early = requests.size();
  const auto unmarked = std::find(step_.grads.begin(), step_.grads.end(), nullptr);
  Status problem;
  if (unmarked != step_.grads.end()) {
    problem = Status::InvalidArgument(
        "no gradient for " +
        registration_->variables[static_cast<size_t>(unmarked - step_.grads.begin())].name +
        " in this step");
  } else if (params.size() != var_sizes_.size()) {
    problem = Status::InvalidArgument("wrong number of variables");
  }
  auto push_split = SplitRows(push_rows);
  auto pull_split = SplitRows(pull_rows);
  if (problem.ok() && !push_split.ok()) problem = push_split.status();
  if (problem.ok() && !pull_split.ok()) problem = pull_split.status();
  if (!problem.ok()) {
    // Pushes already out are awaited and settled before the error returns: the caller may
    // reuse its gradients' memory then.
    SettleSentPushes(shards, std::move(requests));
    return problem;
  }
  // The pull of the next step waits for the step this push contributes to: the version it
  // was computed from, plus one (what Push would have set).
  std::vector<int64_t> min_versions(read_versions_.size(), min_version);
  if (min_version == kNextStep) {
    for (size_t s = 0; s < min_versions.size(); ++s) min_versions[s] = read_versions_[s] + 1;
  }
  for (int s = 0; s < num_shards(); ++s) {
    if (!SendsTo(s) ||
        std::find(step_.sent_shards.begin(), step_.sent_shards.end(), s) != step_.sent_shards.end()) {
      continue;
    }
    requests.push_back(PushRequest(s, step_.grads, step_.batch_examples, kLastRead, step_.seq,
                                   push_rows, (*push_split)[static_cast<size_t>(s)]));
    shards.push_back(s);
  }
  const size_t num_push = shards.size();
  AddPullRequests(min_versions, &shards, &requests, *pull_split);
  const bool may_wait = options_.pulls_may_wait || min_version != 0;
  const auto start = Clock::now();
  std::optional<Clock::time_point> first_sent, last_sent;
  for (size_t i = 0; i < early; ++i) {
    if (!first_sent) first_sent = requests[i].sent_at;
    last_sent = requests[i].sent_at;
  }
  std::vector<Clock::time_point> answered;
  finishing_step_ = true;
  auto replies = Exchange(shards, std::move(requests),
                          may_wait ? options_.blocking_timeout : options_.request_timeout,
                          /*interruptible=*/true, &answered, num_push, options_.request_timeout);
  finishing_step_ = false;
  PARASYNC_RETURN_IF_ERROR(SettlePushFrames(replies.status()));
  const std::span<const int> all(shards);
  const std::span<Inbound> in(*replies);
  TakePushReplies(kLastRead, all.first(num_push), in.first(num_push));
  if (times != nullptr) {
    // The pushes come first in `answered`, then the pulls.
    const auto last = [&](size_t from, size_t to) {
      Clock::time_point t = start;
      for (size_t i = from; i < to; ++i) t = std::max(t, answered[i]);
      return t;
    };
    const Clock::time_point pushed = last(0, num_push);
    const Clock::time_point done = std::max(pushed, last(num_push, answered.size()));
    times->push_seconds = std::chrono::duration<double>(pushed - start).count();
    times->pull_seconds = std::chrono::duration<double>(done - pushed).count();
    times->first_push_sent = first_sent.value_or(start);
    times->last_push_sent = num_push > early ? start : last_sent.value_or(start);
    times->pushes_acked = pushed;
    times->pulled = done;
    times->early_pushes = static_cast<int>(early);
  }
  return TakePullReplies(params, all.subspan(num_push), in.subspan(num_push), pull_rows,
                         *pull_split);
}

Status PsClient::Leave(std::chrono::milliseconds timeout) {
  if (group_) group_->Close();
  Header h;
  h.type = MsgType::kLeave;
  auto replies = Broadcast(h, timeout, /*interruptible=*/false);
  return replies.ok() ? Status::Ok() : replies.status();
}

Result<std::vector<ShardStats>> PsClient::Stats() {
  Header h;
  h.type = MsgType::kStats;
  auto replies = Broadcast(h, options_.request_timeout);
  if (!replies.ok()) return replies.status();
  std::vector<ShardStats> out;
  for (const Inbound& in : *replies) {
    if (!in.header->stats) return Status::Corruption("stats reply without statistics");
    out.push_back(*in.header->stats);
  }
  return out;
}

Status PsClient::SetWireDType(WireFormat dtype) {
  if (registration_ || !narrowed_.empty()) {
    return Status::FailedPrecondition("the wire dtype is chosen before the model is registered");
  }
  options_.wire_dtype = dtype;
  return Status::Ok();
}

Status PsClient::Gather(const std::string& key, int64_t round, std::span<const uint8_t> payload,
                        std::vector<int32_t>* ranks, std::vector<zmq::message_t>* payloads,
                        std::vector<int32_t>* admitted, int64_t* answered_round) {
  Outgoing o;
  o.header.type = MsgType::kGather;
  o.header.key = key;
  o.header.clock = round;
  o.frames.emplace_back(payload.data(), payload.size());
  std::vector<Outgoing> requests;
  requests.push_back(std::move(o));
  auto replies = Exchange({0}, std::move(requests), options_.blocking_timeout);
  if (!replies.ok()) return replies.status().WithContext("gather '" + key + "'");
  Inbound& in = (*replies)[0];
  if (in.header->ranks.size() != in.frames.size()) {
    return Status::Corruption("gather '" + key + "': a reply of " +
                              std::to_string(in.frames.size()) + " payloads for " +
                              std::to_string(in.header->ranks.size()) + " ranks");
  }
  *ranks = std::move(in.header->ranks);
  *payloads = std::move(in.frames);
  if (admitted != nullptr) *admitted = std::move(in.header->admitted);
  if (answered_round != nullptr) *answered_round = in.header->clock;
  return Status::Ok();
}

Status PsClient::Checkpoint() {
  Header h;
  h.type = MsgType::kCheckpoint;
  auto replies = Broadcast(h, options_.request_timeout);
  return replies.ok() ? Status::Ok() : replies.status();
}

Status PsClient::Shutdown(int shard) {
  if (shard < 0 || shard >= num_shards()) return Status::InvalidArgument("no such shard");
  Outgoing o;
  o.header.type = MsgType::kShutdown;
  std::vector<Outgoing> requests;
  requests.push_back(std::move(o));
  auto replies = Exchange({shard}, std::move(requests), options_.request_timeout);
  return replies.ok() ? Status::Ok() : replies.status();
}

}  // namespace parasync
