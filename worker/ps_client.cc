#include "worker/ps_client.h"

#include <algorithm>
#include <cstring>

namespace parasync {

Result<std::unique_ptr<PsClient>> PsClient::Connect(zmq::context_t& context,
                                                    const PsClientOptions& options) {
  if (options.ps_addresses.empty()) return Status::InvalidArgument("no parameter servers given");
  std::vector<std::unique_ptr<Socket>> sockets;
  SocketOptions socket_options;
  socket_options.send_timeout = options.request_timeout;
  for (const std::string& address : options.ps_addresses) {
    auto s = Socket::Connect(context, ToEndpoint(address), socket_options);
    if (!s.ok()) return s.status();
    sockets.push_back(std::move(s).value());
  }
  auto client = std::unique_ptr<PsClient>(new PsClient(std::move(sockets), options));
  client->read_versions_.assign(options.ps_addresses.size(), 0);
  client->next_step_.assign(options.ps_addresses.size(), 0);
  return client;
}

Result<std::vector<Inbound>> PsClient::Exchange(std::vector<int> shards,
                                                std::vector<Outgoing> requests,
                                                std::chrono::milliseconds timeout,
                                                bool interruptible) {
  const size_t n = shards.size();
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = next_request_id_++;
    requests[i].header.request_id = ids[i];
    requests[i].header.rank = options_.rank;
    Socket& socket = *sockets_[static_cast<size_t>(shards[i])];
    if (Status s = socket.Send(nullptr, requests[i].header, std::move(requests[i].frames));
        !s.ok()) {
      return s.WithContext("ps shard " + std::to_string(shards[i]) + " (" +
                           options_.ps_addresses[static_cast<size_t>(shards[i])] + ")");
    }
  }
  std::vector<std::optional<Inbound>> replies(n);
  size_t pending = n;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<Socket*> waiting;
  std::vector<size_t> waiting_index;
  while (pending > 0) {
    if (interruptible && options_.interrupted && options_.interrupted()) {
      return Status::Aborted("interrupted while waiting for the parameter servers");
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::string silent;
      for (size_t i = 0; i < n; ++i) {
        if (!replies[i]) {
          silent += (silent.empty() ? "" : ", ") + std::to_string(shards[i]) + " (" +
                    options_.ps_addresses[static_cast<size_t>(shards[i])] + ")";
        }
      }
      return Status::TimedOut("no reply from ps shard " + silent + " within " +
                              std::to_string(timeout.count()) + " ms");
    }
    waiting.clear();
    waiting_index.clear();
    for (size_t i = 0; i < n; ++i) {
      if (!replies[i]) {
        waiting.push_back(sockets_[static_cast<size_t>(shards[i])].get());
        waiting_index.push_back(i);
      }
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    auto ready = WaitReadable(waiting, std::min(left, std::chrono::milliseconds(100)) +
                                           std::chrono::milliseconds(1));
    if (!ready.ok()) return ready.status();
    for (size_t k = 0; k < waiting.size(); ++k) {
      if (!(*ready)[k]) continue;
      const size_t i = waiting_index[k];
      auto in = waiting[k]->Receive(std::chrono::milliseconds(0));
      if (!in.ok()) return in.status();
      if (!in->has_value()) continue;
      Inbound& msg = **in;
      const std::string who = "ps shard " + std::to_string(shards[i]);
      if (!msg.header.ok()) return msg.header.status().WithContext(who + " sent a bad reply");
      if (msg.header->request_id != ids[i]) continue;  // a late reply to an abandoned request
      if (!msg.header->status.ok()) return msg.header->status.WithContext(who);
      replies[i] = std::move(msg);
      --pending;
    }
  }
  std::vector<Inbound> out;
  out.reserve(n);
  for (auto& r : replies) out.push_back(std::move(*r));
  return out;
}

Status PsClient::Register(const ModelRegistration& reg, std::chrono::milliseconds timeout) {
  if (reg.num_shards != num_shards()) {
    return Status::InvalidArgument("registration names " + std::to_string(reg.num_shards) +
                                   " shards but " + std::to_string(num_shards()) + " are given");
  }
  auto map = SliceMap::Build(reg.variables, reg.max_slice_elements, reg.num_shards);
  if (!map.ok()) return map.status();
  std::vector<int> shards;
  std::vector<Outgoing> requests;
  for (int s = 0; s < num_shards(); ++s) {
    Outgoing o;
    o.header.type = MsgType::kRegister;
    o.header.registration = reg;
    shards.push_back(s);
    requests.push_back(std::move(o));
  }
  auto replies = Exchange(shards, std::move(requests), timeout);
  if (!replies.ok()) return replies.status();
  registered_clock_ = 0;
  for (const Inbound& in : *replies) registered_clock_ = std::max(registered_clock_, in.header->clock);
  map_ = std::move(map).value();
  var_sizes_.clear();
  for (const VariableSpec& v : reg.variables) var_sizes_.push_back(v.num_elements());
  return Status::Ok();
}

Status PsClient::Adopt(const ModelRegistration& reg) {
  if (reg.num_shards != num_shards()) {
    return Status::InvalidArgument("the model is registered for " + std::to_string(reg.num_shards) +
                                   " shards but " + std::to_string(num_shards()) + " are given");
  }
  auto map = SliceMap::Build(reg.variables, reg.max_slice_elements, reg.num_shards);
  if (!map.ok()) return map.status();
  map_ = std::move(map).value();
  var_sizes_.clear();
  for (const VariableSpec& v : reg.variables) var_sizes_.push_back(v.num_elements());
  return Status::Ok();
}

Status PsClient::Pull(std::span<float* const> params, int64_t min_version) {
  if (!map_) return Status::FailedPrecondition("Pull before Register");
  if (params.size() != var_sizes_.size()) return Status::InvalidArgument("wrong number of variables");
  std::vector<int> shards;
  std::vector<Outgoing> requests;
  for (int s = 0; s < num_shards(); ++s) {
    if (map_->SlicesOfShard(s).empty()) continue;
    Outgoing o;
    o.header.type = MsgType::kPull;
    o.header.min_version = min_version == kNextStep ? next_step_[static_cast<size_t>(s)] : min_version;
    for (uint32_t id : map_->SlicesOfShard(s)) {
      o.header.slices.push_back({id, 0, map_->slices()[id].length});
    }
    shards.push_back(s);
    requests.push_back(std::move(o));
  }
  auto replies = Exchange(shards, std::move(requests), options_.blocking_timeout);
  if (!replies.ok()) return replies.status();
  int64_t lowest = INT64_MAX;
  for (size_t i = 0; i < replies->size(); ++i) {
    Inbound& in = (*replies)[i];
    const std::vector<uint32_t>& ids = map_->SlicesOfShard(shards[i]);
    if (in.header->slices.size() != ids.size() || in.frames.size() != ids.size()) {
      return Status::Corruption("ps shard " + std::to_string(shards[i]) +
                                " answered a pull with the wrong number of slices");
    }
    for (size_t k = 0; k < ids.size(); ++k) {
      const SliceInfo& info = map_->slices()[ids[k]];
      const size_t bytes = static_cast<size_t>(info.length) * sizeof(float);
      if (in.header->slices[k].slice_id != ids[k] || in.frames[k].size() != bytes) {
        return Status::Corruption("ps shard " + std::to_string(shards[i]) +
                                  " answered a pull with a mismatching slice");
      }
      std::memcpy(params[info.var_index] + info.offset, in.frames[k].data(), bytes);
    }
    lowest = std::min(lowest, in.header->version);
    read_versions_[static_cast<size_t>(shards[i])] = in.header->version;
  }
  last_version_ = lowest == INT64_MAX ? 0 : lowest;
  return Status::Ok();
}

Status PsClient::Push(std::span<const float* const> grads, int64_t batch_examples,
                      int64_t read_version) {
  if (!map_) return Status::FailedPrecondition("Push before Register");
  if (grads.size() != var_sizes_.size()) return Status::InvalidArgument("wrong number of variables");
  std::vector<int> shards;
  std::vector<Outgoing> requests;
  for (int s = 0; s < num_shards(); ++s) {
    if (map_->SlicesOfShard(s).empty()) continue;
    Outgoing o;
    o.header.type = MsgType::kPush;
    o.header.batch_examples = batch_examples;
    o.header.version = read_version == kLastRead ? read_versions_[static_cast<size_t>(s)] : read_version;
    for (uint32_t id : map_->SlicesOfShard(s)) {
      const SliceInfo& info = map_->slices()[id];
      o.header.slices.push_back({id, 0, info.length});
      o.frames.emplace_back(grads[info.var_index] + info.offset,
                            static_cast<size_t>(info.length) * sizeof(float));
    }
    shards.push_back(s);
    requests.push_back(std::move(o));
  }
  auto replies = Exchange(shards, std::move(requests), options_.request_timeout);
  if (!replies.ok()) return replies.status();
  int64_t lowest = INT64_MAX;
  last_push_dropped_ = false;
  for (size_t i = 0; i < replies->size(); ++i) {
    const Header& h = *(*replies)[i].header;
    lowest = std::min(lowest, h.version);
    last_push_dropped_ |= h.dropped;
    const size_t s = static_cast<size_t>(shards[i]);
    next_step_[s] = read_version == kLastRead ? read_versions_[s] + 1 : read_version + 1;
  }
  last_version_ = lowest == INT64_MAX ? 0 : lowest;
  return Status::Ok();
}

Status PsClient::Leave(std::chrono::milliseconds timeout) {
  std::vector<int> shards;
  std::vector<Outgoing> requests;
  for (int s = 0; s < num_shards(); ++s) {
    Outgoing o;
    o.header.type = MsgType::kLeave;
    shards.push_back(s);
    requests.push_back(std::move(o));
  }
  auto replies = Exchange(shards, std::move(requests), timeout, /*interruptible=*/false);
  return replies.ok() ? Status::Ok() : replies.status();
}

Result<std::vector<ShardStats>> PsClient::Stats() {
  std::vector<int> shards;
  std::vector<Outgoing> requests;
  for (int s = 0; s < num_shards(); ++s) {
    Outgoing o;
    o.header.type = MsgType::kStats;
    shards.push_back(s);
    requests.push_back(std::move(o));
  }
  auto replies = Exchange(shards, std::move(requests), options_.request_timeout);
  if (!replies.ok()) return replies.status();
  std::vector<ShardStats> out;
  for (const Inbound& in : *replies) {
    if (!in.header->stats) return Status::Corruption("stats reply without statistics");
    out.push_back(*in.header->stats);
  }
  return out;
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
