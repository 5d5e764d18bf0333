#include "ps/server.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <cstdio>
#include <cstring>
#include <exception>
#include <malloc.h>

#include <spdlog/spdlog.h>

#include "common/denormals.h"
#include "ps/optimizer.h"
#include "ps/request_frames.h"
#include "ps/update_rule.h"

// Sanitizers replace malloc: glibc's malloc_trim would only wake arenas that hold nothing
// (and trip glibc's arena accounting at thread exit under ASan).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PARASYNC_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define PARASYNC_SANITIZED 1
#endif
#endif
#ifndef PARASYNC_SANITIZED
#define PARASYNC_SANITIZED 0
#endif

namespace parasync {

namespace {

size_t FramesBytes(const std::vector<zmq::message_t>& frames) {
  size_t n = 0;
  for (const auto& f : frames) n += f.size();
  return n;
}

double SecondsSince(Coordinator::TimePoint since, Coordinator::TimePoint now) {
  return std::chrono::duration<double>(now - since).count();
}

}  // namespace

Result<std::unique_ptr<Server>> Server::Create(zmq::context_t& context,
                                               const ServerOptions& options, PsMetrics* metrics) {
  if (options.num_workers < 1 ||
      metrics->worker_gradients.size() < static_cast<size_t>(options.num_workers)) {
    return Status::InvalidArgument("a server needs at least one worker and metrics for each");
  }
  SocketOptions socket_options;
  socket_options.max_message_bytes = options.max_message_bytes;
  socket_options.receive_high_water_mark = kServerReceiveQueue;
  // A reply to a worker that vanished must not stall the loop for long.
  socket_options.send_timeout = std::chrono::milliseconds(1000);
  socket_options.curve_server_secret_key = options.curve_secret_key;
  auto socket = Socket::Bind(context, options.endpoint, socket_options);
  if (!socket.ok()) return socket.status();
  const std::string endpoint = (*socket)->LastEndpoint();  // before --ipc's bind
  if (!options.local_endpoint.empty()) {
    PARASYNC_RETURN_IF_ERROR((*socket)->BindAlso(options.local_endpoint));
  }
  std::unique_ptr<Server> server(new Server(std::move(socket).value(), options, metrics));
  server->endpoint_ = endpoint;
  server->PublishMemoryBound();
  return server;
}

Server::Server(std::unique_ptr<Socket> socket, const ServerOptions& options, PsMetrics* metrics)
    : socket_(std::move(socket)),
      options_(options),
      metrics_(metrics),
      shard_(options.shard_index, options.num_shards, options.max_model_bytes, options.apply_threads,
             options.max_table_rows),
      coordinator_({options.mode, options.num_workers, options.replicas_to_aggregate,
                    options.worker_timeout},
                   std::chrono::steady_clock::now()),
      parked_(static_cast<size_t>(4 * options.num_workers + 64)),
      gathers_({options.num_workers, options.max_gather_bytes, options.barrier_timeout}),
      inbox_(kServerPeerQueue, kServerPeerCredit, PeerQueueBytes(options.max_message_bytes)),
      replies_(&options_, &shard_, metrics, released_since_trim_),
      deltas_(&shard_, metrics),
      straggler_({options.num_workers, options.straggler_log_seconds}),
      last_idle_(std::chrono::steady_clock::now()),
      ledger_(options.num_workers),
      durability_({options.store, options.every_update, options.checkpoint_every,
                   options.checkpoint_every_versions,
                   AppliesInSteps(options.mode), options.shard_index},
                  metrics, std::chrono::steady_clock::now()) {
  shard_.set_max_message_bytes(options.max_message_bytes);
  shard_.set_table_options({options.shard_index, options.num_shards, options.max_table_rows,
                            options.table_memory_bytes,
                            options.table_demote ? options.store : nullptr,
                            options.table_admit_after, options.table_expire_after,
                            options.table_expire_in_seconds});
  std::random_device rd;
  while (incarnation_ == 0) incarnation_ = (uint64_t{rd()} << 32) | rd();
  deltas_.set_first_generation(incarnation_);
  deltas_.set_capacity(options.max_delta_copies > 0
                           ? static_cast<size_t>(options.max_delta_copies)
                           : static_cast<size_t>(options.num_workers) + 2);
  rule_ = MakeUpdateRule(options.mode, {&shard_, &coordinator_, &ledger_, &durability_, metrics_,
                                        this, incarnation_});
}

Status Server::Restore(const ShardSnapshot& snap) {
  PARASYNC_RETURN_IF_ERROR(shard_.Restore(snap));
  deltas_.Forget();  // the copies' changes were from other values
  ledger_.Restore(snap.ranks);
  durability_.MarkSaved(shard_.version());
  PublishRegistered();
  return Status::Ok();
}

Status Server::SaveSnapshot(bool force) { return durability_.Save(shard_, ledger_, force); }

void Server::DropGradient(const Header& req, Header& reply, bool stale) {
  reply.dropped = true;
  if (stale) {
    ++dropped_stale_;
    metrics_->dropped_stale->Increment();
  }
  if (coordinator_.ValidRank(req.rank)) {
    coordinator_.RecordDropped(req.rank);
    ledger_.RecordSeq(req.rank, PushSeq(req.seq));
    ledger_.RecordProgress(req.rank, req.progress);  // the batch is settled: dropped, not pending
    metrics_->worker_dropped[static_cast<size_t>(req.rank)]->Increment();
  }
}

void Server::OnStoreFailure(const Status& failure, const std::string& what) {
  if (!durability_.LatchFailure(failure, what)) return;
  // Memory goes back to the last durable state: what was applied but not persisted was never
  // acknowledged, and must not be served or counted as applied (seqs included).
  if (auto durable = options_.store->Load(/*with_rows=*/!shard_.tables().tiered());
      durable.ok()) {
    ledger_.Clear();
    if (Status s = Restore(*durable); !s.ok()) {
      spdlog::error("rolling back to the store failed: {}", s.ToString());
    } else {
      spdlog::error("rolled back to the durable version {}", shard_.version());
    }
  } else if (durable.status().code() != StatusCode::kNotFound) {
    spdlog::error("rolling back to the store failed: {}", durable.status().ToString());
  }
  parked_.RemoveIf([&](ParkedPull& p) {
    FailParked(p, Status::Unavailable(*durability_.failure()), RejectReason::kStoreFailed);
    return true;
  });
}

Header Server::ReplyTo(const Header& req) const {
  Header reply;
  reply.type = req.type;
  reply.request_id = req.request_id;
  reply.rank = req.rank;
  reply.version = shard_.version();
  reply.incarnation = incarnation_;
  return reply;
}

void Server::FailParked(ParkedPull& p, const Status& status, RejectReason reason) {
  Header reply = ReplyTo(p.request);
  reply.status = status;
  Reject(reason);
  (void)socket_->Send(&p.identity, reply, {});
}

Status Server::Run(const std::function<bool()>& should_stop) {
  // This loop applies every update that no ParallelFor helper takes (common/denormals.h).
  FlushDenormalsOnThisThread();
  last_idle_ = std::chrono::steady_clock::now();
  while (!stop_.load() && !should_stop()) {
    auto keep_serving = ServeOnce(std::chrono::milliseconds(100));
    if (!keep_serving.ok()) return keep_serving.status();
    if (!*keep_serving) {
      spdlog::info("shutdown requested over the wire");
      break;
    }
  }
  return Status::Ok();
}

Result<bool> Server::ServeOnce(std::chrono::milliseconds timeout) {
  metrics_->loop.Beat();  // /healthz: this loop turns (common/metrics.h)
  PARASYNC_RETURN_IF_ERROR(
      ReadReady(inbox_.empty() ? timeout : std::chrono::milliseconds::zero()));
  std::optional<Inbound> next = inbox_.Next();
  bool keep_serving = true;
  // Every message that arrived has been handled: heartbeats included.
  const bool idle = !next.has_value();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    if (!idle) keep_serving = Handle(*next);
    const auto now = std::chrono::steady_clock::now();
    inbox_.Charge(now - t0);  // its peer's share of the loop's time
    Tick(now, idle);
  } catch (const std::exception& e) {
    // Out of memory for a reply, or a ZeroMQ error while building one: drop the request,
    // keep serving the others.
    Reject(RejectReason::kMalformed);
    spdlog::error("request dropped: {}", e.what());
  }
  inbox_.Charge(std::chrono::steady_clock::now() - t0);  // if Handle threw
  return keep_serving;
}

Status Server::ReadReady(std::chrono::milliseconds timeout) {
  // Enough to take one message of each of many peers in a turn; what is left is read the
  // next turn.
  constexpr int kReadsPerTurn = 256;
  inbox_.BeginRead();
  for (int n = 0; n < kReadsPerTurn; ++n) {
    auto received = socket_->Receive(n == 0 ? timeout : std::chrono::milliseconds::zero());
    if (!received.ok()) return received.status();
    if (!received->has_value()) break;
    Inbound& in = **received;
    const PeerQueues::Taken taken = inbox_.Take(in);
    if (taken.outcome == PeerQueues::Outcome::kFull) RefuseQueueFull(in);
    if (taken.repeat) break;
  }
  return Status::Ok();
}

void Server::RefuseQueueFull(Inbound& in) {
  ++requests_;
  released_since_trim_->fetch_add(static_cast<int64_t>(FramesBytes(in.frames)),
                                  std::memory_order_relaxed);
  Header reply;
  if (in.header.ok()) {
    reply = ReplyTo(*in.header);
  } else if (in.refused_request_id) {
    reply.request_id = *in.refused_request_id;
  }
  reply.incarnation = incarnation_;
  // Refused before it is handled, so it costs the loop a reply, not its work: a peer that
  // pipelines cannot crowd the others out (ps/peer_queues.h).
  reply.status = Status::Unavailable(
      "request refused: this connection's earlier requests still waiting fill its queue (" +
      std::to_string(kServerPeerQueue) + " requests, more only while they weigh " +
      std::to_string(PeerQueueBytes(options_.max_message_bytes)) +
      " bytes at most together); send the next when a reply comes");
  Reject(RejectReason::kQueueFull);
  if (ShouldLogRejection()) {
    spdlog::warn("rejected {} from rank {} ({}): {}",
                 in.header.ok() ? MsgTypeName(in.header->type) : "a message",
                 in.header.ok() ? in.header->rank : -1,
                 RejectReasonName(RejectReason::kQueueFull), reply.status.message());
  }
  (void)socket_->Send(&in.identity, reply, {});
}

bool Server::ShouldLogRejection() const {
  // A flood of bad messages must not flood the log: the first 20 are logged, then every
  // 1000th; the counter has them all.
  if (rejected_ == 21) spdlog::warn("further rejections are logged every 1000th (all are counted)");
  return rejected_ <= 20 || rejected_ % 1000 == 0;
}

void Server::Reject(RejectReason reason) {
  ++rejected_;
  metrics_->rejected[static_cast<size_t>(reason)]->Increment();
}

void Server::MaybeTrimMemory(TimePoint now) {
  // glibc keeps freed memory of its arenas (ZeroMQ's I/O thread allocates received messages
  // in one of its own) for reuse: a flood, or the replies of a peer that left, would stay
  // resident. After 64 MiB came and went, it is given back.
  // Messages dropped unread (too large) are not counted: a trim every 30 s when idle
  // covers them.
  const bool churned = released_since_trim_->load(std::memory_order_relaxed) >= (int64_t{64} << 20);
  if (now - last_trim_ < (churned ? std::chrono::seconds(2) : std::chrono::seconds(30))) return;
  last_trim_ = now;
  released_since_trim_->store(0, std::memory_order_relaxed);
#if !PARASYNC_SANITIZED
  malloc_trim(0);  // under a sanitizer its allocator holds the memory; glibc's has none
#endif
}

void Server::SendPull(zmq::message_t& identity, const Header& req,
                      const std::vector<std::vector<uint64_t>>& row_ids) {
  const PullReplies::ByteCounter peer = replies_.PeerCounter(identity);
  if (replies_.AnsweringAlready(identity, req)) {
    metrics_->resent_pulls_in_flight->Increment();
    return;
  }
  if (RefuseUnreadPull(identity, req, *peer)) return;
  Header reply = ReplyTo(req);
  reply.dtype = req.dtype;
  reply.topk_keep = req.topk_keep;
  reply.slices = req.slices;
  reply.rows = req.rows;
  std::vector<zmq::message_t> frames;
  if (req.delta_pull) {
    frames = replies_.DeltaFrames(req, peer, deltas_, &reply);
  } else if (auto built = replies_.Frames(req, row_ids, peer); built.ok()) {
    frames = std::move(built).value();
  } else {
    reply = ReplyTo(req);
    reply.status = Status::Unavailable("reading embedding rows from the store failed: " +
                                       built.status().message());
    Reject(RejectReason::kStoreFailed);
    spdlog::error("pull of rank {}: {}", req.rank, reply.status.message());
  }
  if (coordinator_.ValidRank(req.rank)) coordinator_.RecordRead(req.rank);
  metrics_->bytes_sent[static_cast<size_t>(MsgType::kPull)]->Increment(
      static_cast<double>(FramesBytes(frames)));
  if (reply.status.ok()) replies_.Answered(identity, req.request_id);
  if (Status s = socket_->Send(&identity, reply, std::move(frames)); !s.ok()) {
    spdlog::warn("pull reply to rank {} not sent: {}", req.rank, s.message());
  }
}

bool Server::RefuseUnreadPull(zmq::message_t& identity, const Header& req,
                              const std::atomic<int64_t>& peer) {
  const std::optional<std::string> refused = replies_.Refusal(req, peer);
  if (!refused) return false;
  Header refusal = ReplyTo(req);
  refusal.status = Status::Unavailable(*refused);
  Reject(RejectReason::kUnreadReplies);
  if (ShouldLogRejection()) {
    spdlog::warn("rejected pull from rank {} ({}): {}", req.rank,
                 RejectReasonName(RejectReason::kUnreadReplies), refusal.status.message());
  }
  (void)socket_->Send(&identity, refusal, {});
  return true;
}

void Server::HandlePush(const Header& req, std::vector<zmq::message_t>& in_frames,
                        Header& reply, RejectReason* reason) {
  reply.status = CheckPush(req, in_frames, shard_, reason);
  if (!reply.status.ok()) return;
  if (!req.ranks.empty()) {
    reply.status = CheckGroupPush(req, coordinator_.num_workers(), coordinator_.mode(), reason);
    if (!reply.status.ok()) return;
  }
  if (coordinator_.ValidRank(req.rank) && ledger_.AlreadyApplied(req.rank, PushSeq(req.seq))) {
    reply.replayed = true;  // a resend of a push applied (and, every-update, durable) before
    return;
  }
  if (rule_->AcknowledgesRecordedData() && coordinator_.ValidRank(req.rank) &&
      ledger_.ReplaysRecordedData(req.rank, PushSeq(req.seq), req.progress)) {
    spdlog::info("rank {} restarted: its push of epoch {}, examples up to {} of {}, was applied "
                 "here before: acknowledged, not applied again",
                 req.rank, req.progress.epoch, req.progress.done, req.progress.of);
    reply.replayed = true;
    return;
  }
  if (durability_.failure()) {
    *reason = RejectReason::kStoreFailed;
    reply.status = Status::Unavailable(*durability_.failure());
    return;
  }
  PushRows rows;
  reply.status = ReadPushRowIds(req, in_frames, shard_, &rows.ids, reason);
  if (!reply.status.ok()) return;
  const UpdateRule::Admission admission = rule_->Admit(req);
  if (!AnswerRefusedGradient(req, admission.verdict, reply, reason)) return;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> realigned;  // only for frames that are not aligned
  const std::vector<const float*> grads =
      gradients_.Read(req, *shard_.slice_map(), in_frames, realigned, &rows.grads);
  const int64_t staleness = shard_.version() - admission.read_version;
  reply.status = rule_->Take({req, grads, rows.request(req), staleness}, reason);
  if (!reply.status.ok()) return;
  for (const RowRange& r : req.rows) {
    if (r.table < metrics_->tables.size()) {
      metrics_->tables[r.table].rows_pushed->Increment(static_cast<double>(r.count));
    }
  }
  OnGradientTaken(req, staleness, t0);
  reply.staleness = staleness;
  // The step this gradient completed could not be made durable: the shard is rolled back
  // and the gradient lost, so the push is refused as an async one whose write failed is.
  if (!rule_->MaybeCompleteStep()) {
    *reason = RejectReason::kStoreFailed;
    reply.status = Status::Unavailable(*durability_.failure());
  }
}

bool Server::AnswerRefusedGradient(const Header& req, UpdateRule::Verdict verdict,
                                   Header& reply, RejectReason* reason) {
  switch (verdict) {
    case UpdateRule::Verdict::kTake:
      return true;
    case UpdateRule::Verdict::kStale:
      DropGradient(req, reply, /*stale=*/true);
      return false;
    case UpdateRule::Verdict::kDuplicate:
      DropGradient(req, reply, /*stale=*/false);
      metrics_->rejected[static_cast<size_t>(RejectReason::kDuplicate)]->Increment();
      return false;
    case UpdateRule::Verdict::kBadVersion:
      *reason = RejectReason::kBadVersion;
      reply.status = Status::InvalidArgument("gradient computed from version " +
                                             std::to_string(req.version) +
                                             " but the shard is at " +
                                             std::to_string(shard_.version()));
      return false;
    case UpdateRule::Verdict::kFuture:
      *reason = RejectReason::kBadVersion;
      reply.status = Status::InvalidArgument("gradient from a future step");
      return false;
  }
  return false;
}

void Server::OnGradientTaken(const Header& req, int64_t staleness, TimePoint t0) {
  metrics_->apply_seconds->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  metrics_->staleness->Observe(static_cast<double>(staleness));
  max_version_staleness_ = std::max(max_version_staleness_, staleness);
  if (coordinator_.ValidRank(req.rank)) {
    const int64_t clock_staleness = coordinator_.RecordGradient(req.rank);
    max_clock_staleness_ = std::max(max_clock_staleness_, clock_staleness);
    metrics_->worker_gradients[static_cast<size_t>(req.rank)]->Increment();
  }
}

void Server::PublishMemoryBound() {
  const ModelRegistration* reg = shard_.registration();
  const MemoryBound bound = MemoryBoundFor(options_, reg, shard_.num_elements());
  metrics_->memory_bound_bytes->Set(static_cast<double>(bound.fixed));
  metrics_->memory_bound_per_connection_bytes->Set(static_cast<double>(bound.per_connection));
  spdlog::info("memory bound {}: {}", reg ? "for this model" : "before a model registers",
               bound.Describe());
}

void Server::PublishRegistered() {
  PublishMemoryBound();
  metrics_->PublishTables(shard_.tables(), options_.max_table_rows);  // series before rows move
  metrics_->registered->Set(1);
  metrics_->elements->Set(static_cast<double>(shard_.num_elements()));
  PublishProgress();
}

void Server::PublishProgress() {
  metrics_->version->Set(static_cast<double>(shard_.version()));
  if (const ModelRegistration* reg = shard_.registration()) {
    metrics_->learning_rate->Set(static_cast<double>(
        reg->optimizer.learning_rate * LrScheduleFactor(reg->optimizer, shard_.examples())));
  }
}

void Server::RecordStragglerWait(int rank, double seconds, TimePoint now, const char* what) {
  if (!coordinator_.ValidRank(rank)) return;
  metrics_->waited_for_seconds[static_cast<size_t>(rank)]->Increment(seconds);
  const StragglerTracker::Verdict verdict = straggler_.Record(rank, seconds, now);
  if (!verdict.log) return;
  if (verdict.suppressed > 0) {
    spdlog::warn("straggler: waited {:.2f} s for rank {} ({}, version {}); {} more such "
                 "waits for it since the last report",
                 seconds, rank, what, shard_.version(), verdict.suppressed);
  } else {
    spdlog::warn("straggler: waited {:.2f} s for rank {} ({}, version {})", seconds, rank, what,
                 shard_.version());
  }
}

void Server::UpdateGauges(TimePoint now) {
  // Tick runs after every message; gauges a scrape reads need not move faster than 10 Hz.
  if (now - gauges_updated_ < std::chrono::milliseconds(100)) return;
  gauges_updated_ = now;
  metrics_->parked_pulls->Set(static_cast<double>(parked_.size()));
  metrics_->unread_reply_bytes->Set(
      static_cast<double>(replies_.unread()));
  replies_.ForgetIdlePeers();
  metrics_->oldest_parked_pull_seconds->Set(parked_.OldestSeconds(now));
  metrics_->SetStraggler(straggler_.Straggler(now));
  metrics_->PublishTables(shard_.tables(), options_.max_table_rows);
  // Walking the store's directory costs a few syscalls per file: every 5 s is plenty.
  if (options_.store != nullptr && now - store_size_updated_ >= std::chrono::seconds(5)) {
    store_size_updated_ = now;
    metrics_->store_disk_bytes->Set(static_cast<double>(options_.store->ApproximateBytes()));
  }
}

void Server::ServeParked(TimePoint now) {
  parked_.RemoveIf([&](ParkedPull& p) {
    if (!rule_->CanServe(p.request)) return false;
    metrics_->barrier_wait_seconds->Observe(SecondsSince(p.since, now));
    if (p.waited_for >= 0) {
      RecordStragglerWait(p.waited_for, SecondsSince(p.since, now), now,
                          "a pull held by the ssp bound");
    }
    SendPull(p.identity, p.request, p.row_ids);
    return true;
  });
}

void Server::FailExpiredParked(TimePoint now) {
  // Whatever still waits past the barrier timeout fails, naming what it waited for.
  parked_.RemoveIf([&](ParkedPull& p) {
    if (now - p.since <= options_.barrier_timeout) return false;
    char waited[32];
    std::snprintf(waited, sizeof(waited), "%.1f", SecondsSince(p.since, now));
    const Status timed_out = Status::TimedOut("pull by rank " + std::to_string(p.request.rank) +
                                              " waited " + waited + " s for " +
                                              rule_->DescribeWait(p.request));
    spdlog::error("{}", timed_out.message());
    FailParked(p, timed_out, RejectReason::kBarrierTimeout);
    return true;
  });
}

void Server::Tick(TimePoint now, bool idle) {
  if (idle) MaybeTrimMemory(now);
  // Collectives run before the model is registered too (broadcast_parameters).
  SendGatherReplies(gathers_.Tick(now, [this](int r) { return GatherExpects(r); }));
  if (!shard_.registered()) return;
  if (idle) last_idle_ = now;
  // Silence is judged only once the queue is drained (a heartbeat may be waiting behind
  // large pushes) — unless the loop has not been idle for a whole timeout, when waiting
  // for a drain could postpone a death forever.
  const bool can_judge = idle || now - last_idle_ > options_.worker_timeout;
  for (int rank : can_judge ? coordinator_.ExpireSilent(now) : std::vector<int>{}) {
    metrics_->workers_declared_dead->Increment();
    spdlog::warn("worker {} declared dead: silent for more than {:.1f} s; {} live worker(s) left",
                 rank, std::chrono::duration<double>(options_.worker_timeout).count(),
                 coordinator_.live_count());
  }
  metrics_->live_workers->Set(coordinator_.live_count());
  // A step completed here has no push to answer: a failed write fails its parked pulls.
  (void)rule_->MaybeCompleteStep();
  durability_.MaybeSave(shard_, ledger_, now);
  ServeParked(now);
  UpdateGauges(now);
  FailExpiredParked(now);
}

ShardStats Server::Stats() const {
  ShardStats s;
  s.shard = options_.shard_index;
  s.version = shard_.version();
  s.examples = shard_.examples();
  s.num_slices = shard_.num_slices();
  s.num_elements = shard_.num_elements();
  s.requests = requests_;
  s.rejected = rejected_;
  s.registered = shard_.registered();
  s.mode = options_.mode.ToString();
  s.live_workers = coordinator_.live_count();
  s.dropped_stale = dropped_stale_;
  s.max_version_staleness = max_version_staleness_;
  s.max_clock_staleness = max_clock_staleness_;
  s.blocked_pulls = blocked_pulls_;
  s.workers_declared_dead = coordinator_.declared_dead();
  if (shard_.registration()) s.registration = *shard_.registration();
  s.rows_held = shard_.tables().rows_held();
  for (const Coordinator::Worker& w : coordinator_.workers()) {
    s.workers.push_back({w.state == Coordinator::Worker::State::kLive, w.clock, w.gradients,
                         w.dropped});
  }
  return s;
}

bool Server::Handle(Inbound& in) {
  ++requests_;
  if (!in.header.ok()) {
    ReplyMalformed(in);
    return true;
  }
  const Header& req = *in.header;
  const auto now = std::chrono::steady_clock::now();
  Header reply = ReplyTo(req);  // version and incarnation are set again as it is sent
  reply.dtype = req.dtype;
  RejectReason reason = RejectReason::kNone;
  bool keep_serving = true;
  reply.status = Admit(in, now, &reason);
  if (reply.status.ok()) {
    switch (req.type) {
      case MsgType::kRegister:
        HandleRegister(req, in.frames, now, reply, &reason);
        break;
      case MsgType::kPull:
        if (HandlePull(in, now, reply, &reason)) return true;  // answered or parked
        break;
      case MsgType::kPush:
        HandlePush(req, in.frames, reply, &reason);
        break;
      case MsgType::kStats:
        reply.stats = Stats();
        break;
      case MsgType::kHeartbeat:
        break;
      case MsgType::kLeave:
        HandleLeave(req);
        break;
      case MsgType::kCheckpoint:
        HandleCheckpoint(req, reply, &reason);
        break;
      case MsgType::kShutdown:
        keep_serving = HandleShutdown(in, reply, &reason);
        break;
      case MsgType::kGather:
        HandleGather(in, now);
        return true;  // answered now or when the round completes
    }
  }
  SendReply(in, reply, reason, now);
  return keep_serving;
}

void Server::ReplyMalformed(Inbound& in) {
  Reject(RejectReason::kMalformed);
  if (ShouldLogRejection()) {
    spdlog::warn("rejected a malformed message: {}", in.header.status().message());
  }
  Header reply;
  reply.status = in.header.status();
  // A message refused for its size still answers its request, so the sender sees why.
  if (in.refused_request_id) reply.request_id = *in.refused_request_id;
  (void)socket_->Send(&in.identity, reply, {});
}

Status Server::Admit(const Inbound& in, TimePoint now, RejectReason* reason) {
  const Header& req = *in.header;
  // Rank -1 is a tool (an evaluator, an exporter, a test): it may register, pull and read
  // stats, and push in async mode, but it takes no part in barriers or staleness.
  const bool ranked = coordinator_.ValidRank(req.rank);
  const bool tool = req.rank == -1;
  const bool needs_rank = req.type == MsgType::kHeartbeat || req.type == MsgType::kLeave ||
                          req.type == MsgType::kGather ||
                          (!rule_->TakesToolPushes() && req.type == MsgType::kPush);
  const bool bad_rank = !ranked && (!tool || needs_rank);
  if (req.protocol_version != kProtocolVersion) {
    *reason = RejectReason::kVersionMismatch;
    return Status::FailedPrecondition(
        "protocol version mismatch: the sender speaks parasync protocol v" +
        std::to_string(req.protocol_version) + ", this parasync-ps speaks v" +
        std::to_string(kProtocolVersion) + "; run binaries built from the same schema");
  }
  if (bad_rank && req.type != MsgType::kStats && req.type != MsgType::kShutdown) {
    *reason = RejectReason::kBadRank;
    return Status::InvalidArgument(
        "rank " + std::to_string(req.rank) + " is not a worker of this cluster (it has " +
        std::to_string(coordinator_.num_workers()) + ")");
  }
  const auto type = static_cast<size_t>(req.type);
  const size_t bytes = FramesBytes(in.frames);
  metrics_->requests[type]->Increment();
  metrics_->bytes_received[type]->Increment(static_cast<double>(bytes));
  released_since_trim_->fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  // A restarted worker not yet admitted back (joining) is not live for its requests, and its
  // previous process is gone: nothing waits for that one any longer (the next Tick completes
  // a step that waited only for it).
  if (ranked && req.joining && coordinator_.DeclareDead(req.rank)) {
    metrics_->workers_declared_dead->Increment();
    spdlog::warn("worker {} restarted: its previous process is declared dead; {} live "
                 "worker(s) left", req.rank, coordinator_.live_count());
  }
  if (ranked && req.type != MsgType::kStats && req.type != MsgType::kShutdown &&
      req.type != MsgType::kLeave && !req.joining &&
      coordinator_.Touch(req.rank, now, req.type == MsgType::kHeartbeat)) {
    spdlog::info("worker {} rejoined at clock {} (shard version {})", req.rank,
                 coordinator_.workers()[static_cast<size_t>(req.rank)].clock, shard_.version());
  }
  return Status::Ok();
}

void Server::SendReply(Inbound& in, Header& reply, RejectReason reason, TimePoint now) {
  const Header& req = *in.header;
  reply.version = shard_.version();
  reply.incarnation = incarnation_;
  if (!reply.status.ok()) {
    Reject(reason == RejectReason::kNone ? RejectReason::kMalformed : reason);
    if (ShouldLogRejection()) {
      spdlog::warn("rejected {} from rank {} ({}): {}", MsgTypeName(req.type), req.rank,
                   RejectReasonName(reason), reply.status.message());
    }
  }
  if (req.type == MsgType::kPush && reply.status.ok() && !reply.replayed &&
      options_.drop_push_reply_every > 0 &&
      ++pushes_handled_ % options_.drop_push_reply_every == 0) {
    spdlog::warn("fault injection: the reply to push {} of rank {} is dropped",
                 PushSeq(req.seq).counter(), req.rank);
    return;
  }
  if (Status s = socket_->Send(&in.identity, reply, {}); !s.ok()) {
    spdlog::warn("reply to rank {} not sent: {}", req.rank, s.message());
  }
  // A push or a departure may have completed a step or let an ssp straggler's peers on.
  if (req.type == MsgType::kPush || req.type == MsgType::kLeave) ServeParked(now);
}

void Server::HandleRegister(const Header& req, const std::vector<zmq::message_t>& in_frames,
                            TimePoint now, Header& reply, RejectReason* reason) {
  if (!req.registration) {
    *reason = RejectReason::kMalformed;
    reply.status = Status::InvalidArgument("Register without a model");
    return;
  }
  std::vector<std::span<const uint8_t>> value_bytes;
  reply.status = ReadRegisterValues(req, in_frames, &value_bytes, reason);
  if (!reply.status.ok()) return;
  if (req.registration->mode != options_.mode.ToString()) {
    *reason = RejectReason::kRegisterMismatch;
    reply.status = Status::FailedPrecondition(
        "the worker trains with --mode " + req.registration->mode + " but ps shard " +
        std::to_string(options_.shard_index) + " runs --mode " + options_.mode.ToString());
    return;
  }
  const bool first = !shard_.registered();
  reply.status = shard_.Register(*req.registration, reason, {req.slices, value_bytes});
  if (reply.status.ok() && first) SaveRegisteredModel(reply, reason);
  if (reply.status.ok() && first) OnFirstRegistration(req, now);
  if (coordinator_.ValidRank(req.rank)) {
    reply.clock = coordinator_.workers()[static_cast<size_t>(req.rank)].clock;
    reply.progress = ledger_.progress(req.rank);
  }
}

void Server::SaveRegisteredModel(Header& reply, RejectReason* reason) {
  if (options_.store == nullptr) return;
  // The model is on disk before anyone trains on it: a restart restores it, and
  // every-update writes have a snapshot to update.
  if (Status s = SaveSnapshot(/*force=*/true); !s.ok() && durability_.every_update()) {
    OnStoreFailure(s, "the registered model");
    *reason = RejectReason::kStoreFailed;
    reply.status = Status::Unavailable(*durability_.failure());
  } else if (!s.ok()) {
    metrics_->checkpoint_failures->Increment();
    spdlog::error("could not save the registered model: {}", s.ToString());
  }
}

void Server::OnFirstRegistration(const Header& req, TimePoint now) {
  PublishRegistered();
  coordinator_.RestartSilenceClocks(now);
  const OptimizerSpec& opt = req.registration->optimizer;
  spdlog::info("model registered by rank {}: {} variables, {} slices / {} elements "
               "here; {} at learning rate {}{}",
               req.rank, req.registration->variables.size(), shard_.num_slices(),
               shard_.num_elements(), OptimizerKindName(opt.kind), opt.learning_rate,
               opt.schedule == LrSchedule::kCosine
                   ? fmt::format(", cosine decay to {} x over {} examples",
                                 opt.final_lr_fraction, opt.decay_examples)
                   : std::string());
}

bool Server::HandlePull(Inbound& in, TimePoint now, Header& reply, RejectReason* reason) {
  const Header& req = *in.header;
  std::vector<std::vector<uint64_t>> row_ids;
  reply.status = ReadPull(req, in.frames, shard_, &row_ids, reason);
  if (reply.status.ok() && req.delta_pull) reply.status = deltas_.Check(req, reason);
  if (!reply.status.ok()) return false;
  if (const int64_t bytes = replies_.RowReplyBytes(req); bytes > options_.max_message_bytes) {
    // What the unread-reply caps assume (UnreadBasis), and what a worker could receive.
    *reason = RejectReason::kRange;
    reply.status = Status::InvalidArgument(
        "a reply with these rows would take " + std::to_string(bytes) +
        " bytes, more than this server's --max-message-bytes (" +
        std::to_string(options_.max_message_bytes) + "): pull fewer rows at a time");
    return false;
  }
  if (rule_->CanServe(req)) {
    SendPull(in.identity, req, row_ids);
    return true;
  }
  if (durability_.failure()) {
    // It waits for a step that cannot be made durable: it would wait forever.
    *reason = RejectReason::kStoreFailed;
    reply.status = Status::Unavailable(*durability_.failure());
    return false;
  }
  // A worker waits on one pull per shard at a time (ParkedPulls); pulls of tools are bounded.
  const int waited_for = rule_->Blocker(req.rank);
  switch (parked_.Park(in.identity, *in.header, now, coordinator_.ValidRank(req.rank),
                       waited_for, std::move(row_ids))) {
    case ParkedPulls::Outcome::kRefused:
      *reason = RejectReason::kUnsupported;
      reply.status = Status::Unavailable("too many pulls are waiting on this server");
      return false;
    case ParkedPulls::Outcome::kNew:
      ++blocked_pulls_;
      metrics_->blocked_pulls->Increment();
      return true;
    case ParkedPulls::Outcome::kResent:
      return true;
  }
  return true;
}

bool Server::GatherExpects(int rank) const {
  return coordinator_.workers()[static_cast<size_t>(rank)].state ==
         Coordinator::Worker::State::kLive;
}

void Server::HandleGather(Inbound& in, TimePoint now) {
  const Header& req = *in.header;
  if (in.frames.size() != 1) {
    Reject(RejectReason::kFrameCount);
    Header reply = ReplyTo(req);
    reply.status = Status::InvalidArgument("a gather carries exactly one payload frame");
    (void)socket_->Send(&in.identity, reply, {});
    return;
  }
  SendGatherReplies(gathers_.Offer(in.identity, req, std::move(in.frames[0]), now,
                                   [this](int r) { return GatherExpects(r); }));
}

void Server::SendGatherReplies(std::vector<GatherBoard::Reply> replies) {
  const TimePoint now = std::chrono::steady_clock::now();
  for (GatherBoard::Reply& r : replies) {
    for (int32_t joiner : r.admitted) {
      if (coordinator_.Touch(joiner, now)) {
        spdlog::info("worker {} admitted back at round {} of gather '{}'", joiner,
                     r.request.clock, r.request.key);
      }
    }
    Header reply = ReplyTo(r.request);
    reply.status = r.status;
    reply.ranks = std::move(r.ranks);
    reply.admitted = std::move(r.admitted);
    reply.key = r.request.key;
    reply.clock = r.request.clock;
    if (!r.status.ok()) {
      Reject(r.status.code() == StatusCode::kTimedOut ? RejectReason::kBarrierTimeout
                                                      : RejectReason::kUnsupported);
      spdlog::warn("gather '{}' of rank {}: {}", r.request.key, r.request.rank,
                   r.status.message());
    }
    const size_t type = static_cast<size_t>(MsgType::kGather);
    metrics_->bytes_sent[type]->Increment(static_cast<double>(FramesBytes(r.frames)));
    if (Status st = socket_->Send(&r.identity, reply, std::move(r.frames)); !st.ok()) {
      spdlog::warn("gather reply to rank {} not sent: {}", r.request.rank, st.message());
    }
  }
}

void Server::HandleLeave(const Header& req) {
  coordinator_.Leave(req.rank);
  spdlog::info("worker {} left (done); {} live worker(s)", req.rank, coordinator_.live_count());
  // The collectives stop waiting for it too.
  SendGatherReplies(gathers_.Tick(std::chrono::steady_clock::now(),
                                  [this](int r) { return GatherExpects(r); }));
  // The step may complete without it; a failed write fails the step's parked pulls, and the
  // Leave itself is done either way.
  (void)rule_->MaybeCompleteStep();
}

void Server::HandleCheckpoint(const Header& req, Header& reply, RejectReason* reason) {
  if (options_.store == nullptr) {
    *reason = RejectReason::kUnsupported;
    reply.status = Status::FailedPrecondition(
        "ps shard " + std::to_string(options_.shard_index) +
        " keeps no checkpoints (start it with --data-dir)");
    return;
  }
  reply.status = SaveSnapshot(/*force=*/true);
  if (!reply.status.ok() && durability_.every_update()) {
    OnStoreFailure(reply.status, "a checkpoint requested by rank " + std::to_string(req.rank));
  }
  if (reply.status.ok()) {
    spdlog::info("checkpoint of version {} written on request of rank {}", shard_.version(),
                 req.rank);
  }
}

bool Server::HandleShutdown(const Inbound& in, Header& reply, RejectReason* reason) {
  if (options_.allow_remote_shutdown) return false;
  if (in.peer_uid) {
    // Over the unix socket (--ipc): this server's user, or root.
    if (*in.peer_uid == geteuid() || *in.peer_uid == 0) return false;
    *reason = RejectReason::kUnsupported;
    reply.status = Status::FailedPrecondition(
        "shutdown from uid " + std::to_string(*in.peer_uid) +
        " over the unix socket refused: only this server's user (uid " +
        std::to_string(geteuid()) + ") or root may stop it (--allow-remote-shutdown)");
    return true;
  }
  // In the process (inproc), or over loopback TCP: any user of this machine (docs/security.md).
  if (in.peer_address.empty() || IsLoopbackAddress(in.peer_address)) return false;
  *reason = RejectReason::kUnsupported;
  reply.status = Status::FailedPrecondition(
      "shutdown from " + in.peer_address +
      " refused: only loopback peers may stop this server (--allow-remote-shutdown)");
  return true;
}

}  // namespace parasync
