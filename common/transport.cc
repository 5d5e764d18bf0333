#include "common/transport.h"

#include "common/address.h"
#include "common/ports.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

namespace parasync {

namespace {

Status FromZmq(const zmq::error_t& e, const std::string& what) {
  switch (e.num()) {
    case EADDRINUSE:
    case EADDRNOTAVAIL:
    case EHOSTUNREACH:
    case ETERM:
      return Status::Unavailable(what + ": " + e.what());
    case EINVAL:
    case ENODEV:  // bind to a name that is not an interface or address
    case EPROTONOSUPPORT:
      return Status::InvalidArgument(what + ": " + e.what());
    default:
      return Status::Internal(what + ": " + e.what());
  }
}

void ApplyOptions(zmq::socket_t& s, const SocketOptions& o) {
  s.set(zmq::sockopt::linger, 0);  // closing never waits on unsent messages
  s.set(zmq::sockopt::sndhwm, o.send_high_water_mark);
  s.set(zmq::sockopt::rcvhwm, o.receive_high_water_mark);
  s.set(zmq::sockopt::maxmsgsize, o.max_message_bytes);
  s.set(zmq::sockopt::sndtimeo, static_cast<int>(o.send_timeout.count()));
  if (!o.curve_server_secret_key.empty()) {
    s.set(zmq::sockopt::curve_server, true);
    s.set(zmq::sockopt::curve_secretkey, o.curve_server_secret_key);
    // A domain makes libzmq consult the ZAP handler for every connection.
    s.set(zmq::sockopt::zap_domain, "parasync");
  } else if (!o.curve_server_public_key.empty()) {
    s.set(zmq::sockopt::curve_serverkey, o.curve_server_public_key);
    s.set(zmq::sockopt::curve_publickey, o.curve_public_key);
    s.set(zmq::sockopt::curve_secretkey, o.curve_secret_key);
  }
}

// Makes `s` report `events` to a fresh inproc PAIR, and returns the connected other end
// (before `s` binds or connects, so that no event is missed); null when libzmq refuses.
std::unique_ptr<zmq::socket_t> AttachMonitor(zmq::context_t& context, zmq::socket_t& s,
                                             int events) {
  static std::atomic<uint64_t> next_monitor{0};
  const std::string monitor_endpoint =
      "inproc://parasync-handshake-" + std::to_string(next_monitor++);
  if (zmq_socket_monitor(s.handle(), monitor_endpoint.c_str(), events) != 0) return nullptr;
  auto monitor = std::make_unique<zmq::socket_t>(context, zmq::socket_type::pair);
  monitor->set(zmq::sockopt::linger, 0);
  monitor->connect(monitor_endpoint);
  return monitor;
}

// Why `dir` (stat'ed into `st`) is not private to this process's user: owned by another user
// than this one or root, or writable by its group or others; "" when it is.
std::string NotPrivate(const std::string& dir, const struct stat& st) {
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    return "directory " + dir + " belongs to uid " + std::to_string(st.st_uid) +
           ", not to this user (uid " + std::to_string(geteuid()) + ") or root";
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return "directory " + dir + " (mode " + mode + ") is writable by other users";
  }
  return "";
}

// The directory of the unix socket `path`, made mode 0700 where it does not exist, and
// checked private (NotPrivate) either way. Unavailable saying why otherwise.
Status MakePrivateDirectory(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::Unavailable("cannot make the directory " + dir + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    return Status::Unavailable("cannot read " + dir + ": " + std::strerror(errno));
  }
  if (std::string why = NotPrivate(dir, st); !why.empty()) {
    return Status::InvalidArgument("the unix socket " + path + ": " + why);
  }
  return Status::Ok();
}

// Binds `s` to `endpoint`; a TCP endpoint of any port ("tcp://host:0", or ZeroMQ's
// "tcp://host:*") at a free port below the ephemeral range (common/ports.h). Throws
// zmq::error_t for what is not "in use".
Status BindTcpOrOther(zmq::socket_t& s, const std::string& endpoint) {
  if (!endpoint.starts_with("tcp://") || !(endpoint.ends_with(":0") || endpoint.ends_with(":*"))) {
    s.bind(endpoint);
    return Status::Ok();
  }
  const std::string host = endpoint.substr(0, endpoint.size() - 2);
  auto bound = BindBelowEphemeral([&](int port) -> Result<bool> {
    try {
      s.bind(host + ":" + std::to_string(port));
      return true;
    } catch (const zmq::error_t& e) {
      if (e.num() == EADDRINUSE) return false;
      throw;
    }
  });
  return bound.status();
}

}  // namespace

std::string ToEndpoint(const std::string& address) {
  if (address.rfind("tcp://", 0) == 0 || address.rfind("ipc://", 0) == 0 ||
      address.rfind("inproc://", 0) == 0) {
    return address;
  }
  return "tcp://" + address;
}

Result<std::string> ToBindEndpoint(const std::string& address) {
  if (address.find("://") != std::string::npos) return address;
  // One parser for every address flag (common/address.h): no address is read loosely.
  PARASYNC_ASSIGN_OR_RETURN(HostPort parsed,
                            ParseHostPort(address, "bind address", PortRule::kZeroAllowed));
  PARASYNC_ASSIGN_OR_RETURN(std::string ip, ResolveBindHost(parsed.host, "bind address"));
  if (ip.find(':') != std::string::npos) ip = "[" + ip + "]";
  return "tcp://" + ip + ":" + std::to_string(parsed.port);
}

Result<std::string> IpcEndpoint(const std::string& path, const std::string& flag, IpcSide side,
                                std::chrono::milliseconds wait_for_directory) {
  // sockaddr_un's sun_path holds 108 bytes, the terminating NUL included.
  constexpr size_t kMaxPath = 107;
  if (path.empty() || path.front() != '/') {
    return Status::InvalidArgument(flag + " takes an absolute path for a unix socket, not '" +
                                   path + "'");
  }
  if (path.size() > kMaxPath) {
    return Status::InvalidArgument(flag + " " + path + " is " + std::to_string(path.size()) +
                                   " bytes; a unix socket's path holds at most " +
                                   std::to_string(kMaxPath));
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  auto refuse = [&](const std::string& why) {
    return Status::InvalidArgument(flag + " " + path + ": " + why +
                                   " (give a path in a directory of your own, mode 0700, e.g. "
                                   "under $XDG_RUNTIME_DIR)");
  };
  struct stat st {};
  const auto deadline = std::chrono::steady_clock::now() + wait_for_directory;
  while (side == IpcSide::kClient && stat(dir.c_str(), &st) != 0 &&
         std::chrono::steady_clock::now() < deadline &&
         std::filesystem::is_directory(std::filesystem::path(dir).parent_path())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (stat(dir.c_str(), &st) != 0) {
    const bool parent_exists =
        side == IpcSide::kServer &&
        std::filesystem::is_directory(std::filesystem::path(dir).parent_path());
    if (!parent_exists) return refuse("no directory " + dir);
    return "ipc://" + path;  // BindAlso makes it, private
  }
  if (std::string why = NotPrivate(dir, st); !why.empty()) return refuse(why);
  if (side == IpcSide::kClient && lstat(path.c_str(), &st) == 0 && st.st_uid != geteuid() &&
      st.st_uid != 0) {
    return refuse("the socket belongs to uid " + std::to_string(st.st_uid) + ", not to this "
                  "user (uid " + std::to_string(geteuid()) + ") or root");
  }
  return "ipc://" + path;
}

std::optional<uint32_t> UnixPeerUid(const std::string& peer_address) {
  in6_addr ip{};
  if (peer_address.empty() || inet_pton(AF_INET, peer_address.c_str(), &ip) == 1 ||
      inet_pton(AF_INET6, peer_address.c_str(), &ip) == 1) {
    return std::nullopt;
  }
  // "<host>:<uid>:<gid>:<pid>": the uid is the third field from the end.
  size_t end = peer_address.size();
  for (int field = 0; field < 2; ++field) {
    end = peer_address.rfind(':', end - 1);
    if (end == std::string::npos || end == 0) return std::nullopt;
  }
  const size_t start = peer_address.rfind(':', end - 1);
  if (start == std::string::npos) return std::nullopt;
  uint32_t uid = 0;
  const char* first = peer_address.data() + start + 1;
  const char* last = peer_address.data() + end;
  auto [ptr, ec] = std::from_chars(first, last, uid);
  if (ec != std::errc() || ptr != last || first == last) return std::nullopt;
  return uid;
}

bool IsLoopbackAddress(const std::string& ip) {
  return ip.rfind("127.", 0) == 0 || ip == "::1" || ip.rfind("::ffff:127.", 0) == 0;
}

Result<std::unique_ptr<Socket>> Socket::Bind(zmq::context_t& context, const std::string& endpoint,
                                             const SocketOptions& options) {
  try {
    zmq::socket_t s(context, zmq::socket_type::router);
    ApplyOptions(s, options);
    // A CURVE server reports every handshake (and the connections around them, for the
    // peer's address) to whoever takes TakeHandshakeMonitor(): refusals before or without
    // the ZAP handler are seen only there.
    std::unique_ptr<zmq::socket_t> monitor;
    if (!options.curve_server_secret_key.empty()) {
      monitor = AttachMonitor(context, s,
                              ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                                  ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                  ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                  ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                  ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    }
    // A ROUTER silently drops replies to vanished peers unless told otherwise; we want that:
    // a worker that died must not block the server.
    PARASYNC_RETURN_IF_ERROR(BindTcpOrOther(s, endpoint));
    std::unique_ptr<Socket> socket(new Socket(std::move(s)));
    socket->monitor_ = std::move(monitor);
    socket->kind_ = Kind::kServer;
    socket->max_frames_ = options.max_frames;
    socket->max_bytes_ = options.max_message_bytes > 0
                             ? static_cast<uint64_t>(options.max_message_bytes) : 0;
    return socket;
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "cannot bind " + endpoint);
  }
}

Status Socket::BindAlso(const std::string& endpoint) {
  constexpr std::string_view kIpc = "ipc://";
  const bool unix_socket = endpoint.starts_with(kIpc);
  const std::string path = unix_socket ? endpoint.substr(kIpc.size()) : "";
  if (unix_socket) PARASYNC_RETURN_IF_ERROR(MakePrivateDirectory(path));
  try {
    // libzmq binds in this thread: under this mask the socket is made 0600, with no moment at
    // which another user could connect.
    const mode_t mask = unix_socket ? umask(077) : 0;
    try {
      socket_.bind(endpoint);
    } catch (...) {
      if (unix_socket) umask(mask);
      throw;
    }
    if (unix_socket) {
      umask(mask);
      if (chmod(path.c_str(), 0600) != 0) {
        return Status::Unavailable("cannot make " + path + " private: " + std::strerror(errno));
      }
    }
    return Status::Ok();
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "cannot bind " + endpoint);
  }
}

Result<std::unique_ptr<Socket>> Socket::Connect(zmq::context_t& context,
                                                const std::string& endpoint,
                                                const SocketOptions& options) {
  try {
    zmq::socket_t s(context, zmq::socket_type::dealer);
    ApplyOptions(s, options);
    // A CURVE client watches its handshakes, so that a refused key is an error at once
    // rather than a server that never answers (set up before connecting: no event missed).
    std::unique_ptr<zmq::socket_t> monitor;
    if (!options.curve_server_public_key.empty()) {
      monitor = AttachMonitor(context, s,
                              ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                  ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                  ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    }
    s.connect(endpoint);
    std::unique_ptr<Socket> socket(new Socket(std::move(s)));
    socket->monitor_ = std::move(monitor);
    socket->kind_ = Kind::kClient;
    socket->max_frames_ = options.max_frames;
    socket->max_bytes_ = options.max_message_bytes > 0
                             ? static_cast<uint64_t>(options.max_message_bytes) : 0;
    return socket;
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "cannot connect to " + endpoint);
  }
}

std::optional<std::string> Socket::HandshakeFailure() {
  while (monitor_ && !handshake_failure_) {
    zmq::message_t event;
    zmq::message_t address;
    try {
      if (!monitor_->recv(event, zmq::recv_flags::dontwait)) break;
      if (event.more()) (void)monitor_->recv(address, zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      break;
    }
    if (event.size() < 6) continue;
    uint16_t id = 0;
    uint32_t value = 0;
    std::memcpy(&id, event.data(), sizeof(id));
    std::memcpy(&value, static_cast<const char*>(event.data()) + 2, sizeof(value));
    if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      failed_handshakes_ = 0;
    } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      // The server's answer: final.
      handshake_failure_ = "the server refused this client's CURVE key (status " +
                           std::to_string(value) +
                           "): its public key is not in the server's --curve-allow";
    } else if (++failed_handshakes_ >= kFailedHandshakesBeforeGivingUp) {
      // One failure can be a connection cut mid-handshake (a server restarting); keys that
      // do not match fail every reconnect (every ~100 ms).
      handshake_failure_ = "the CURVE handshake failed " + std::to_string(failed_handshakes_) +
                           " times in a row (" +
                           std::string(id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                                           ? "protocol error"
                                           : "no detail") +
                           "): check that --curve-server-key is this server's public key and "
                           "that this client's key pair is whole";
    }
  }
  return handshake_failure_;
}

Status Socket::Send(zmq::message_t* identity, const Header& header,
                    std::vector<zmq::message_t> frames) {
  try {
    if (kind_ == Kind::kServer) {
      if (identity == nullptr) return Status::Internal("server reply without a routing id");
      if (!socket_.send(*identity, zmq::send_flags::sndmore)) {
        return Status::Unavailable("send timed out (routing id)");
      }
    }
    std::vector<uint8_t> encoded = EncodeHeader(header);
    zmq::message_t head(encoded.data(), encoded.size());
    auto more = frames.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore;
    if (!socket_.send(head, more)) return Status::Unavailable("send timed out: peer not reachable");
    for (size_t i = 0; i < frames.size(); ++i) {
      auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      if (!socket_.send(frames[i], flags)) return Status::Unavailable("send timed out (payload)");
    }
    return Status::Ok();
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "send failed");
  }
}

namespace {

// One message's frames as read, within the bounds; what was dropped, and why.
struct ReadFrames {
  std::vector<zmq::message_t> parts;  // a ROUTER's routing id first
  uint64_t bytes = 0;
  bool too_many = false;
  bool too_big = false;
  std::optional<uint64_t> refused_request;
};

// Reads the message whose first frame is `part` (the rest of it is already queued) into
// *in, keeping at most `limit` frames and, once its frames pass `max_bytes` (0: no bound),
// none but the routing id. False if a frame cannot be received. May throw zmq::error_t.
//
// ZMQ_MAXMSGSIZE bounds each frame; the whole message is checked here: once its frames pass
// max_bytes it is refused, and its frames are dropped as they are read (the routing id is
// kept to reply, and the request id read from the header). This bounds what the caller
// holds, not what libzmq held: it delivers a multipart message only once all of it has
// arrived (docs/reliability.md).
bool ReadMessage(zmq::socket_t& socket, zmq::message_t part, bool server, size_t limit,
                 uint64_t max_bytes, ReadFrames* in) {
  in->parts.reserve(std::min<size_t>(limit, 8));
  for (;;) {  // `part` holds the next frame
    const bool more = part.more();
    const bool routing_id = server && in->parts.empty() && !in->too_big;
    if (!routing_id) in->bytes += part.size();
    if (!routing_id && max_bytes > 0 && in->bytes > max_bytes && !in->too_big) {
      in->too_big = true;
      const size_t header_at = server ? 1 : 0;
      if (in->parts.size() > header_at) {
        auto header = DecodeHeader(in->parts[header_at].data(), in->parts[header_at].size());
        if (header.ok()) in->refused_request = header->request_id;
      }
      in->parts.resize(header_at);  // gives the kept frames back now
    }
    if (in->too_big) {
      if (routing_id) in->parts.push_back(std::move(part));
    } else if (in->parts.size() < limit) {
      in->parts.push_back(std::move(part));
    } else {
      in->too_many = true;  // read the rest of the message, keep none of it
    }
    if (!more) return true;
    part = zmq::message_t();
    if (!socket.recv(part, zmq::recv_flags::none)) return false;
  }
}

}  // namespace

Result<std::optional<Inbound>> Socket::Receive(std::chrono::milliseconds timeout) {
  try {
    // Under load a message is usually queued already: take it without the poll (one system
    // call per message saved); poll only when there is none.
    zmq::message_t part;
    if (!socket_.recv(part, zmq::recv_flags::dontwait)) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, timeout) == 0) return std::optional<Inbound>();
      if (!socket_.recv(part, zmq::recv_flags::dontwait)) return std::optional<Inbound>();
    }
    const bool server = kind_ == Kind::kServer;
    ReadFrames read;
    // A ROUTER's message has the routing id in front of the header and tensor frames.
    if (!ReadMessage(socket_, std::move(part), server, max_frames_ + (server ? 2 : 1),
                     max_bytes_, &read)) {
      return std::optional<Inbound>();
    }
    std::vector<zmq::message_t>& parts = read.parts;
    Inbound in;
    size_t next = 0;
    if (server) in.identity = std::move(parts[next++]);
    if (read.too_big) {
      in.header = Status::Corruption("message of " + std::to_string(read.bytes) +
                                     " bytes; the limit is " + std::to_string(max_bytes_) +
                                     " (--max-message-bytes)");
      in.refused_request_id = read.refused_request;
      return std::optional<Inbound>(std::move(in));
    }
    if (read.too_many) {
      in.header = Status::Corruption("message has more than " + std::to_string(max_frames_) +
                                     " tensor frames");
      return std::optional<Inbound>(std::move(in));
    }
    if (next >= parts.size()) {
      in.header = Status::Corruption("message without a header frame");
    } else {
      if (server) {
        try {
          in.peer_address = parts[next].gets("Peer-Address");
          in.peer_uid = UnixPeerUid(in.peer_address);
        } catch (const zmq::error_t&) {
          // inproc peers have no address
        }
      }
      in.header = DecodeHeader(parts[next].data(), parts[next].size());
      ++next;
    }
    for (; next < parts.size(); ++next) in.frames.push_back(std::move(parts[next]));
    return std::optional<Inbound>(std::move(in));
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return std::optional<Inbound>();
    return FromZmq(e, "receive failed");
  }
}

std::string Socket::LastEndpoint() const {
  try {
    return socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t&) {
    return "";
  }
}

Result<std::vector<bool>> WaitReadable(std::span<Socket* const> sockets,
                                       std::chrono::milliseconds timeout) {
  std::vector<zmq::pollitem_t> items;
  items.reserve(sockets.size());
  for (Socket* s : sockets) items.push_back({s->raw().handle(), 0, ZMQ_POLLIN, 0});
  std::vector<bool> ready(sockets.size(), false);
  try {
    if (zmq::poll(items.data(), items.size(), timeout) == 0) return ready;
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return ready;
    return FromZmq(e, "poll failed");
  }
  for (size_t i = 0; i < items.size(); ++i) ready[i] = (items[i].revents & ZMQ_POLLIN) != 0;
  return ready;
}

}  // namespace parasync
