#include "worker/heartbeater.h"

#include <spdlog/spdlog.h>

#include "common/transport.h"

namespace parasync {

namespace {
int64_t NowTicks() { return std::chrono::steady_clock::now().time_since_epoch().count(); }
}  // namespace

Result<std::unique_ptr<Heartbeater>> Heartbeater::Start(
    zmq::context_t& context, const std::vector<std::string>& ps_addresses, int rank,
    std::chrono::milliseconds interval, std::optional<CurveClientKeys> curve, bool joining) {
  std::unique_ptr<Heartbeater> h(new Heartbeater());
  h->joining_.store(joining);
  h->context_ = &context;
  h->curve_ = std::move(curve);
  h->num_shards_ = ps_addresses.size();
  h->last_answer_ = std::make_unique<std::atomic<int64_t>[]>(ps_addresses.size());
  h->incarnation_ = std::make_unique<std::atomic<uint64_t>[]>(ps_addresses.size());
  for (size_t i = 0; i < ps_addresses.size(); ++i) h->incarnation_[i].store(0);
  for (size_t i = 0; i < ps_addresses.size(); ++i) h->last_answer_[i].store(NowTicks());
  h->thread_ = std::thread(&Heartbeater::Loop, h.get(), ps_addresses, rank, interval);
  return h;
}

Heartbeater::~Heartbeater() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

std::chrono::milliseconds Heartbeater::LongestSilence() const {
  const int64_t now = NowTicks();
  int64_t longest = 0;
  for (size_t i = 0; i < num_shards_; ++i) longest = std::max(longest, now - last_answer_[i].load());
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::duration(longest));
}

void Heartbeater::Loop(std::vector<std::string> addresses, int rank,
                       std::chrono::milliseconds interval) {
  SocketOptions options;
  options.send_timeout = std::chrono::milliseconds(0);  // never block: drop a beat instead
  options.send_high_water_mark = 4;
  std::vector<std::unique_ptr<Socket>> sockets;
  for (size_t shard = 0; shard < addresses.size(); ++shard) {
    const std::string& a = addresses[shard];
    if (curve_) {
      options.curve_public_key = curve_->own.public_key;
      options.curve_secret_key = curve_->own.secret_key;
      options.curve_server_public_key = curve_->ServerKey(shard);
    }
    auto s = Socket::Connect(*context_, ToEndpoint(a), options);
    if (!s.ok()) {
      spdlog::error("heartbeat socket to {}: {}", a, s.status().message());
      return;
    }
    sockets.push_back(std::move(s).value());
  }
  uint64_t id = 1;
  while (!stop_.load()) {
    for (auto& s : sockets) {
      Header h;
      h.type = MsgType::kHeartbeat;
      h.rank = rank;
      h.joining = joining_.load();
      h.request_id = id++;
      (void)s->Send(nullptr, h, {});  // a full queue just skips this beat
    }
    // Collect answers until the next beat is due (or stop).
    const auto next = std::chrono::steady_clock::now() + interval;
    for (;;) {
      if (stop_.load()) return;
      const auto now = std::chrono::steady_clock::now();
      if (now >= next) break;
      std::vector<Socket*> raw;
      for (auto& s : sockets) raw.push_back(s.get());
      auto wait = std::min(std::chrono::duration_cast<std::chrono::milliseconds>(next - now),
                           std::chrono::milliseconds(50));
      auto ready = WaitReadable(raw, wait + std::chrono::milliseconds(1));
      if (!ready.ok()) return;
      for (size_t i = 0; i < sockets.size(); ++i) {
        if (!(*ready)[i]) continue;
        auto in = sockets[i]->Receive(std::chrono::milliseconds(0));
        if (in.ok() && in->has_value()) {
          last_answer_[i].store(NowTicks());
          if ((**in).header.ok() && (**in).header->incarnation != 0) {
            incarnation_[i].store((**in).header->incarnation);
          }
        }
      }
    }
  }
}

}  // namespace parasync
