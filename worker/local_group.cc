#include "worker/local_group.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>

#include <spdlog/spdlog.h>

namespace parasync {
namespace {

constexpr uint32_t kMemberMagic = 0x4c47'4d31;  // "LGM1"
constexpr uint32_t kLeaderMagic = 0x4c47'4c31;  // "LGL1"
constexpr auto kPollEvery = std::chrono::milliseconds(100);

struct MemberMessage {
  uint32_t magic = kMemberMagic;
  int32_t rank = -1;
  int32_t pid = 0;
  uint32_t variables = 0;
  int64_t examples = 0;
  uint64_t step = 0;
};

struct LeaderMessage {
  uint32_t magic = kLeaderMagic;
  int32_t pid = 0;
  int32_t code = 0;  // StatusCode
  uint32_t variables = 0;  // parameter frames that follow the fixed ones (0 on error)
  int64_t last_version = 0;
  int64_t staleness = -1;
  uint32_t shards = 0;
  uint8_t dropped = 0;
  uint8_t closed = 0;  // the leader left the group (Close): the member goes on alone
};

// MemberMessage::variables of a member that leaves the group (Close).
constexpr uint32_t kLeaving = 0xffff'ffff;

bool ProcessAlive(int pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

template <typename T>
zmq::message_t Bytes(const T* data, size_t count) {
  if (count == 0) return zmq::message_t();  // an empty vector's data() may be null
  return zmq::message_t(data, count * sizeof(T));
}

template <typename T>
bool ReadStruct(const zmq::message_t& m, T* out) {
  if (m.size() != sizeof(T)) return false;
  std::memcpy(out, m.data(), sizeof(T));
  return true;
}

// Receives one whole multipart message if one arrives within `wait`.
bool ReceiveWithin(zmq::socket_t& socket, std::chrono::milliseconds wait,
                   std::vector<zmq::message_t>& parts) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, wait) <= 0 || (item.revents & ZMQ_POLLIN) == 0) return false;
  parts.clear();
  do {
    zmq::message_t m;
    if (!socket.recv(m, zmq::recv_flags::none)) return false;
    parts.push_back(std::move(m));
  } while (socket.get(zmq::sockopt::rcvmore));
  return true;
}

std::string RankName(int rank) { return "rank " + std::to_string(rank); }

}  // namespace

Result<std::vector<int>> ParseLocalGroupRanks(const std::string& text) {
  std::vector<int> ranks;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    char* end = nullptr;
    errno = 0;
    const long r = item.empty() ? -1 : std::strtol(item.c_str(), &end, 10);
    if (item.empty() || errno != 0 || *end != '\0' || r < 0 || r > (1 << 20)) {
      return Status::InvalidArgument("a local group is a list of ranks such as 0,1; '" + item +
                                     "' in '" + text + "' is not a rank");
    }
    ranks.push_back(static_cast<int>(r));
    at = comma + 1;
  }
  std::sort(ranks.begin(), ranks.end());
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) {
    return Status::InvalidArgument("local group '" + text + "' names a rank twice");
  }
  if (ranks.size() < 2) {
    return Status::InvalidArgument("local group '" + text +
                                   "' has one rank: a group needs at least two");
  }
  return ranks;
}

std::string DefaultLocalGroupEndpoint(const std::vector<std::string>& ps_addresses, int lowest) {
  std::string port = "0";
  if (!ps_addresses.empty()) {
    const std::string& a = ps_addresses.front();
    port = a.substr(a.rfind(':') + 1);
    // An ipc:// or other non-numeric tail: keep the name short and plain.
    if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos) port = "ipc";
  }
  return "ipc:///tmp/parasync-" + std::to_string(::getuid()) + "-group-" + port + "-r" +
         std::to_string(lowest) + ".sock";
}

Result<LocalGroupOptions> LocalGroupFor(const std::string& ranks, const std::string& endpoint,
                                        int rank, int num_workers, const TrainingMode& mode,
                                        const std::vector<std::string>& ps_addresses) {
  PARASYNC_ASSIGN_OR_RETURN(std::vector<int> parsed, ParseLocalGroupRanks(ranks));
  if (std::find(parsed.begin(), parsed.end(), rank) == parsed.end()) {
    return Status::InvalidArgument("'" + ranks + "' does not include this worker's rank " +
                                   std::to_string(rank));
  }
  if (parsed.back() >= num_workers) {
    return Status::InvalidArgument("rank " + std::to_string(parsed.back()) + " in '" + ranks +
                                   "' is not one of the " + std::to_string(num_workers) +
                                   " workers");
  }
  if (mode.kind != TrainingMode::Kind::kSync) {
    return Status::InvalidArgument(
        "local aggregation needs a sync mode (sync or sync:delayed), not " + mode.ToString() +
        ": in async and ssp each worker's gradient is its own update");
  }
  LocalGroupOptions o;
  o.ranks = std::move(parsed);
  o.rank = rank;
  o.endpoint = endpoint.empty() ? DefaultLocalGroupEndpoint(ps_addresses, o.ranks.front()) : endpoint;
  return o;
}

Result<std::unique_ptr<LocalGroup>> LocalGroup::Open(zmq::context_t& context,
                                                     const LocalGroupOptions& options) {
  if (options.ranks.size() < 2 || !std::is_sorted(options.ranks.begin(), options.ranks.end()) ||
      std::find(options.ranks.begin(), options.ranks.end(), options.rank) == options.ranks.end()) {
    return Status::InvalidArgument("rank " + std::to_string(options.rank) +
                                   " is not in its local group, or the group has fewer than "
                                   "two ranks");
  }
  if (options.endpoint.empty()) return Status::InvalidArgument("a local group needs an endpoint");
  const bool leader = options.rank == options.ranks.front();
  try {
    zmq::socket_t socket(context, leader ? zmq::socket_type::router : zmq::socket_type::dealer);
    // The leader's last answer may still be queued when training ends: closing waits for it
    // (a member gone by then does not hold the exit up longer than this). A member's
    // message is worth nothing once it stops waiting for the answer.
    socket.set(zmq::sockopt::linger, leader ? 2000 : 0);
    std::string bound_path;
    if (leader) {
      socket.set(zmq::sockopt::router_mandatory, 0);
      if (options.endpoint.rfind("ipc://", 0) == 0) {
        // A socket file left by a run that crashed would refuse the bind.
        bound_path = options.endpoint.substr(6);
        struct stat st {};
        if (::lstat(bound_path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
          ::unlink(bound_path.c_str());
        }
      }
      socket.bind(options.endpoint);
    } else {
      const int32_t id = options.rank;
      socket.set(zmq::sockopt::routing_id, zmq::const_buffer(&id, sizeof(id)));
      socket.connect(options.endpoint);
    }
    auto group = std::unique_ptr<LocalGroup>(new LocalGroup(options, std::move(socket)));
    group->bound_path_ = bound_path;
    group->member_pid_.assign(options.ranks.size(), 0);
    return group;
  } catch (const zmq::error_t& e) {
    return Status::Unavailable("local group " + options.endpoint + ": " + e.what());
  }
}

void LocalGroup::Close() {
  if (closed_) return;
  closed_ = true;
  try {
    if (!leads()) {
      MemberMessage m;
      m.rank = options_.rank;
      m.pid = static_cast<int32_t>(::getpid());
      m.variables = kLeaving;
      zmq::message_t head = Bytes(&m, 1);
      (void)socket_.send(head, zmq::send_flags::dontwait);
      return;
    }
    for (size_t i = 1; i < options_.ranks.size(); ++i) {
      if (!dropped_.contains(options_.ranks[i])) SendClosed(options_.ranks[i], "");
    }
  } catch (const zmq::error_t& e) {
    spdlog::warn("local group: leaving it: {}", e.what());
  }
}

LocalGroup::~LocalGroup() {
  Close();
  socket_.close();
  if (!bound_path_.empty()) ::unlink(bound_path_.c_str());
}

void LocalGroup::Refuse(int rank, const std::string& why) {
  spdlog::warn("local group: {} dropped: {}", RankName(rank), why);
  dropped_.insert(rank);
  SendClosed(rank, "dropped this worker from the group: " + why);
}

void LocalGroup::SendClosed(int rank, const std::string& why) {
  LeaderMessage h;
  h.pid = static_cast<int32_t>(::getpid());
  h.closed = 1;
  const int32_t id = rank;
  std::vector<zmq::message_t> parts;
  parts.push_back(Bytes(&id, 1));
  parts.push_back(Bytes(&h, 1));
  parts.emplace_back(why.data(), why.size());
  parts.emplace_back();
  parts.emplace_back();
  try {
    for (size_t k = 0; k < parts.size(); ++k) {
      (void)socket_.send(parts[k], k + 1 < parts.size() ? zmq::send_flags::sndmore
                                                        : zmq::send_flags::none);
    }
  } catch (const zmq::error_t& e) {
    spdlog::warn("local group: telling {} the group is closed to it: {}", RankName(rank),
                 e.what());
  }
}

std::optional<LocalGroup::Taken> LocalGroup::TakeMemberMessage(
    std::vector<zmq::message_t>& parts, std::span<const int64_t> sizes, std::set<int>& waiting) {
  // [routing id, MemberMessage, one frame per variable]
  MemberMessage m;
  int32_t id = -1;
  if (!parts.empty() && parts[0].size() == sizeof(id)) std::memcpy(&id, parts[0].data(), sizeof(id));
  if (parts.size() < 2 || !ReadStruct(parts[1], &m) || m.magic != kMemberMagic || m.rank != id) {
    spdlog::warn("local group: a message that is not a member's gradient was dropped");
    return std::nullopt;
  }
  if (m.variables == kLeaving) {
    if (waiting.erase(m.rank) > 0 || !dropped_.contains(m.rank)) {
      spdlog::info("local group: {} left the group", RankName(m.rank));
    }
    dropped_.insert(m.rank);
    return std::nullopt;
  }
  if (!waiting.contains(m.rank)) {
    const bool member = std::find(options_.ranks.begin() + 1, options_.ranks.end(), m.rank) !=
                        options_.ranks.end();
    Refuse(m.rank, member && !dropped_.contains(m.rank)
                       ? "a second gradient in one step"
                       : "not a member of this group (or given up on before)");
    return std::nullopt;
  }
  member_pid_[IndexOf(m.rank)] = m.pid;
  bool fits = m.variables == sizes.size() && parts.size() == 2 + sizes.size() &&
              m.examples >= 0 && m.examples <= (int64_t{1} << 31);
  for (size_t v = 0; fits && v < sizes.size(); ++v) {
    fits = parts[2 + v].size() == static_cast<size_t>(sizes[v]) * sizeof(float);
  }
  waiting.erase(m.rank);
  if (!fits) {
    Refuse(m.rank, "its gradient does not fit the model (" + std::to_string(m.variables) +
                       " variables in " + std::to_string(parts.size() - 2) + " frames)");
    return std::nullopt;
  }
  return Taken{m.rank, m.examples};
}

void LocalGroup::GiveUpOnSilent(std::set<int>& waiting, Clock::time_point start) {
  for (auto it = waiting.begin(); it != waiting.end();) {
    const int pid = member_pid_[IndexOf(*it)];
    const bool gone = pid != 0 && !ProcessAlive(pid);
    const bool silent = pid == 0 && Clock::now() - start > options_.timeout;
    if (!gone && !silent) {
      ++it;
      continue;
    }
    spdlog::warn("local group: {} {}; the group goes on without it", RankName(*it),
                 gone ? "exited (pid " + std::to_string(pid) + " is gone)"
                      : "sent no gradient within " +
                            std::to_string(options_.timeout.count() / 1000) + " s");
    dropped_.insert(*it);
    it = waiting.erase(it);
  }
}

size_t LocalGroup::IndexOf(int rank) const {
  return static_cast<size_t>(std::find(options_.ranks.begin(), options_.ranks.end(), rank) -
                             options_.ranks.begin());
}

Result<std::vector<int>> LocalGroup::Gather(std::span<const float* const> own,
                                            std::span<const int64_t> sizes,
                                            std::vector<std::vector<float>>& sum,
                                            int64_t* examples,
                                            const std::function<bool()>& interrupted) {
  // Each member's message, kept until all are in, so the sum is in rank order.
  std::map<int, std::pair<Taken, std::vector<zmq::message_t>>> received;
  std::set<int> waiting;
  for (size_t i = 1; i < options_.ranks.size(); ++i) {
    if (!dropped_.contains(options_.ranks[i])) waiting.insert(options_.ranks[i]);
  }
  const Clock::time_point start = Clock::now();
  std::vector<zmq::message_t> parts;
  while (!waiting.empty()) {
    if (interrupted && interrupted()) return Status::Aborted("interrupted");
    if (!ReceiveWithin(socket_, kPollEvery, parts)) {
      // Nothing arrived: give up on members whose process is gone, or not heard from in time.
      GiveUpOnSilent(waiting, start);
      continue;
    }
    const std::optional<Taken> m = TakeMemberMessage(parts, sizes, waiting);
    if (!m) continue;
    received[m->rank] = {*m, std::move(parts)};
    parts.clear();
  }
  sum.resize(sizes.size());
  std::vector<int> ranks;
  for (size_t v = 0; v < sizes.size(); ++v) {
    sum[v].assign(own[v], own[v] + sizes[v]);
  }
  std::vector<float> realigned;
  for (auto& [rank, taken] : received) {
    const auto& [m, message] = taken;
    *examples += m.examples;
    ranks.push_back(rank);
    for (size_t v = 0; v < sizes.size(); ++v) {
      // ZeroMQ may hand a received frame at any byte offset: one not aligned for floats is
      // copied first.
      const auto* g = static_cast<const float*>(message[2 + v].data());
      if (reinterpret_cast<uintptr_t>(g) % alignof(float) != 0) {
        realigned.resize(static_cast<size_t>(sizes[v]));
        std::memcpy(realigned.data(), message[2 + v].data(), message[2 + v].size());
        g = realigned.data();
      }
      float* s = sum[v].data();
      for (int64_t i = 0; i < sizes[v]; ++i) s[i] += g[i];
    }
  }
  return ranks;
}

void LocalGroup::Answer(std::span<const int> ranks, const Outcome& outcome,
                        std::span<float* const> params, std::span<const int64_t> sizes) {
  LeaderMessage h;
  h.pid = static_cast<int32_t>(::getpid());
  h.code = static_cast<int32_t>(outcome.status.code());
  h.variables = outcome.status.ok() ? static_cast<uint32_t>(params.size()) : 0;
  h.last_version = outcome.last_version;
  h.staleness = outcome.staleness;
  h.shards = static_cast<uint32_t>(outcome.read_versions.size());
  h.dropped = outcome.dropped ? 1 : 0;
  for (int rank : ranks) {
    std::vector<zmq::message_t> parts;
    const int32_t id = rank;
    parts.push_back(Bytes(&id, 1));
    parts.push_back(Bytes(&h, 1));
    parts.emplace_back(outcome.status.message().data(), outcome.status.message().size());
    parts.push_back(Bytes(outcome.read_versions.data(), outcome.read_versions.size()));
    parts.push_back(Bytes(outcome.read_incarnations.data(), outcome.read_incarnations.size()));
    for (size_t v = 0; v < h.variables; ++v) {
      parts.push_back(Bytes(params[v], static_cast<size_t>(sizes[v])));
    }
    try {
      for (size_t i = 0; i < parts.size(); ++i) {
        socket_.send(parts[i], i + 1 < parts.size() ? zmq::send_flags::sndmore
                                                    : zmq::send_flags::none);
      }
    } catch (const zmq::error_t& e) {
      spdlog::warn("local group: the answer to {} could not be sent: {}", RankName(rank),
                   e.what());
    }
  }
}

Result<LocalGroup::Outcome> LocalGroup::Exchange(std::span<const float* const> grads,
                                                 std::span<const int64_t> sizes,
                                                 int64_t examples,
                                                 std::span<float* const> params,
                                                 const std::function<bool()>& interrupted) {
  MemberMessage m;
  m.rank = options_.rank;
  m.pid = static_cast<int32_t>(::getpid());
  m.variables = static_cast<uint32_t>(sizes.size());
  m.examples = examples;
  m.step = ++steps_;
  const std::string leader = "the local group's leader (rank " +
                             std::to_string(options_.ranks.front()) + ", " + options_.endpoint + ")";
  try {
    zmq::message_t head = Bytes(&m, 1);
    socket_.send(head, zmq::send_flags::sndmore);
    for (size_t v = 0; v < sizes.size(); ++v) {
      zmq::message_t g = Bytes(grads[v], static_cast<size_t>(sizes[v]));
      socket_.send(g, v + 1 < sizes.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  } catch (const zmq::error_t& e) {
    return Status::Unavailable("sending to " + leader + ": " + e.what());
  }
  const Clock::time_point start = Clock::now();
  std::vector<zmq::message_t> parts;
  while (!ReceiveWithin(socket_, kPollEvery, parts)) {
    if (interrupted && interrupted()) return Status::Aborted("interrupted");
    if (leader_pid_ != 0 && !ProcessAlive(leader_pid_)) {
      return Status::Unavailable(leader + " exited (pid " + std::to_string(leader_pid_) +
                                 " is gone) during step " + std::to_string(m.step));
    }
    if (leader_pid_ == 0 && Clock::now() - start > options_.timeout) {
      return Status::TimedOut(leader + " did not answer the first step within " +
                              std::to_string(options_.timeout.count() / 1000) + " s");
    }
  }
  LeaderMessage h;
  if (parts.size() < 4 || !ReadStruct(parts[0], &h) || h.magic != kLeaderMagic ||
      parts[2].size() != h.shards * sizeof(int64_t) || parts[3].size() != h.shards * sizeof(uint64_t) ||
      parts.size() != 4 + h.variables || (h.variables != 0 && h.variables != sizes.size())) {
    return Status::Corruption(leader + " sent an answer that is not one");
  }
  leader_pid_ = h.pid;
  if (h.closed != 0) {
    const std::string why(static_cast<const char*>(parts[1].data()), parts[1].size());
    return Status::Unavailable(leader + " " +
                               (why.empty() ? "left the group (its training ended)" : why));
  }
  Outcome out;
  out.status = Status(static_cast<StatusCode>(h.code),
                      std::string(static_cast<const char*>(parts[1].data()), parts[1].size()));
  out.last_version = h.last_version;
  out.staleness = h.staleness;
  out.dropped = h.dropped != 0;
  out.read_versions.resize(h.shards);
  out.read_incarnations.resize(h.shards);
  if (h.shards > 0) {  // memcpy's pointers must not be null, even for no bytes
    std::memcpy(out.read_versions.data(), parts[2].data(), parts[2].size());
    std::memcpy(out.read_incarnations.data(), parts[3].data(), parts[3].size());
  }
  if (!out.status.ok()) return out;
  if (h.variables != sizes.size()) return Status::Corruption(leader + " answered without parameters");
  for (size_t v = 0; v < sizes.size(); ++v) {
    if (parts[4 + v].size() != static_cast<size_t>(sizes[v]) * sizeof(float)) {
      return Status::Corruption(leader + " sent parameters that do not fit the model");
    }
    if (sizes[v] > 0) std::memcpy(params[v], parts[4 + v].data(), parts[4 + v].size());
  }
  return out;
}

}  // namespace parasync
