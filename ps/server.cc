#include "ps/server.h"

#include <cstring>
#include <exception>

#include <spdlog/spdlog.h>

namespace parasync {

Result<std::unique_ptr<Server>> Server::Create(zmq::context_t& context,
                                               const ServerOptions& options, PsMetrics* metrics) {
  SocketOptions socket_options;
  socket_options.max_message_bytes = options.max_message_bytes;
  // A reply to a worker that vanished must not stall the loop for long.
  socket_options.send_timeout = std::chrono::milliseconds(1000);
  auto socket = Socket::Bind(context, options.endpoint, socket_options);
  if (!socket.ok()) return socket.status();
  return std::unique_ptr<Server>(new Server(std::move(socket).value(), options, metrics));
}

Server::Server(std::unique_ptr<Socket> socket, const ServerOptions& options, PsMetrics* metrics)
    : socket_(std::move(socket)),
      options_(options),
      metrics_(metrics),
      shard_(options.shard_index, options.num_shards, options.max_model_bytes) {}

Status Server::Run(const std::function<bool()>& should_stop) {
  while (!stop_.load() && !should_stop()) {
    auto received = socket_->Receive(std::chrono::milliseconds(100));
    if (!received.ok()) return received.status();
    if (!received->has_value()) continue;
    bool keep_serving = true;
    try {
      keep_serving = Handle(**received);
    } catch (const std::exception& e) {
      // Out of memory for a reply, or a ZeroMQ error while building one: drop the request,
      // keep serving the others.
      Reject(RejectReason::kMalformed);
      spdlog::error("request dropped: {}", e.what());
    }
    if (!keep_serving) {
      spdlog::info("shutdown requested over the wire");
      break;
    }
  }
  return Status::Ok();
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

namespace {
size_t FramesBytes(const std::vector<zmq::message_t>& frames) {
  size_t n = 0;
  for (const auto& f : frames) n += f.size();
  return n;
}
}  // namespace

bool Server::Handle(Inbound& in) {
  ++requests_;
  Header reply;
  if (!in.header.ok()) {
    Reject(RejectReason::kMalformed);
    if (ShouldLogRejection()) {
      spdlog::warn("rejected a malformed message: {}", in.header.status().message());
    }
    reply.status = in.header.status();
    (void)socket_->Send(&in.identity, reply, {});
    return true;
  }
  const Header& req = *in.header;
  const auto type = static_cast<size_t>(req.type);
  metrics_->requests[type]->Increment();
  metrics_->bytes_received[type]->Increment(static_cast<double>(FramesBytes(in.frames)));
  reply.type = req.type;
  reply.request_id = req.request_id;
  reply.rank = req.rank;
  reply.dtype = req.dtype;

  std::vector<zmq::message_t> out_frames;
  RejectReason reason = RejectReason::kNone;
  bool keep_serving = true;

  if (req.protocol_version != kProtocolVersion) {
    reason = RejectReason::kVersionMismatch;
    reply.status = Status::FailedPrecondition(
        "protocol version mismatch: the sender speaks parasync protocol v" +
        std::to_string(req.protocol_version) + ", this parasync-ps speaks v" +
        std::to_string(kProtocolVersion) + "; run binaries built from the same schema");
  } else {
    switch (req.type) {
      case MsgType::kRegister:
        if (!req.registration) {
          reason = RejectReason::kMalformed;
          reply.status = Status::InvalidArgument("Register without a model");
        } else {
          reply.status = shard_.Register(*req.registration, &reason);
          if (reply.status.ok()) {
            metrics_->registered->Set(1);
            metrics_->elements->Set(static_cast<double>(shard_.num_elements()));
            spdlog::info("model registered by rank {}: {} variables, {} slices / {} elements here",
                         req.rank, req.registration->variables.size(), shard_.num_slices(),
                         shard_.num_elements());
          }
        }
        break;
      case MsgType::kPull:
        if (!in.frames.empty()) {
          reason = RejectReason::kFrameCount;
          reply.status = Status::InvalidArgument("a pull request carries no tensor frames");
          break;
        }
        reply.status = shard_.ValidateRanges(req.slices, req.dtype, std::nullopt, &reason);
        if (reply.status.ok()) {
          std::vector<float*> dst;
          out_frames.reserve(req.slices.size());
          for (const SliceRange& r : req.slices) {
            out_frames.emplace_back(static_cast<size_t>(r.count) * sizeof(float));
            dst.push_back(static_cast<float*>(out_frames.back().data()));
          }
          // zmq allocates message bodies with malloc: suitably aligned for float.
          shard_.Read(req.slices, dst);
          reply.slices = req.slices;
        }
        break;
      case MsgType::kPush: {
        std::vector<size_t> sizes;
        sizes.reserve(in.frames.size());
        for (const auto& f : in.frames) sizes.push_back(f.size());
        reply.status = shard_.ValidateRanges(req.slices, req.dtype,
                                             std::span<const size_t>(sizes), &reason);
        if (!reply.status.ok()) break;
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<const float*> grads;
        std::vector<std::vector<float>> realigned;  // only for frames that are not aligned
        grads.reserve(in.frames.size());
        for (const auto& f : in.frames) {
          if (reinterpret_cast<uintptr_t>(f.data()) % alignof(float) == 0) {
            grads.push_back(static_cast<const float*>(f.data()));
          } else {
            realigned.emplace_back(f.size() / sizeof(float));
            std::memcpy(realigned.back().data(), f.data(), f.size());
            grads.push_back(realigned.back().data());
          }
        }
        reply.status = shard_.Apply(req.slices, grads, req.batch_examples, &reason);
        if (reply.status.ok()) {
          metrics_->apply_seconds->Observe(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          metrics_->version->Set(static_cast<double>(shard_.version()));
          if (req.batch_examples > 0) {
            metrics_->examples->Increment(static_cast<double>(req.batch_examples));
          }
        }
        break;
      }
      case MsgType::kStats: {
        ShardStats s;
        s.shard = options_.shard_index;
        s.version = shard_.version();
        s.examples = shard_.examples();
        s.num_slices = shard_.num_slices();
        s.num_elements = shard_.num_elements();
        s.requests = requests_;
        s.rejected = rejected_;
        s.registered = shard_.registered();
        reply.stats = s;
        break;
      }
      case MsgType::kShutdown:
        if (options_.allow_remote_shutdown || in.peer_address.empty() ||
            IsLoopbackAddress(in.peer_address)) {
          keep_serving = false;
        } else {
          reason = RejectReason::kUnsupported;
          reply.status = Status::FailedPrecondition(
              "shutdown from " + in.peer_address +
              " refused: only loopback peers may stop this server (--allow-remote-shutdown)");
        }
        break;
    }
  }
  reply.version = shard_.version();
  if (!reply.status.ok()) {
    Reject(reason == RejectReason::kNone ? RejectReason::kMalformed : reason);
    if (ShouldLogRejection()) {
      spdlog::warn("rejected {} from rank {} ({}): {}", MsgTypeName(req.type), req.rank,
                   RejectReasonName(reason), reply.status.message());
    }
    out_frames.clear();
    reply.slices.clear();
  }
  metrics_->bytes_sent[type]->Increment(static_cast<double>(FramesBytes(out_frames)));
  if (Status s = socket_->Send(&in.identity, reply, std::move(out_frames)); !s.ok()) {
    spdlog::warn("reply to rank {} not sent: {}", req.rank, s.message());
  }
  return keep_serving;
}

}  // namespace parasync
