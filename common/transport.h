// Transport: ZeroMQ sockets carrying parasync messages (a Header frame + tensor frames).
//
// The parameter server binds one ROUTER Socket; a worker connects one DEALER Socket per
// shard. This file and transport.cc are the only code that calls cppzmq; its exceptions are
// turned into Status here. A Socket is used by one thread at a time (ZeroMQ's rule); the
// zmq::context_t it is made from must outlive it and may be shared between threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/status.h"
#include "common/wire.h"

namespace parasync {

// One message as received. `header` holds Corruption when the header frame failed to
// decode; the frames are still there so the caller can reply with an error.
struct Inbound {
  zmq::message_t identity;            // ROUTER: the peer's routing id; DEALER: empty
  // ROUTER: libzmq's "Peer-Address": a TCP peer's IP address; for a unix-socket peer
  // "<host>:<uid>:<gid>:<pid>", its credentials when it connected (SO_PEERCRED); "" if unknown.
  std::string peer_address;
  std::optional<uint32_t> peer_uid;   // ROUTER: a unix-socket peer's user id
  Result<Header> header = Status::Internal("no header");
  std::vector<zmq::message_t> frames;  // the tensor frames after the header
  // A message refused unread for its size: its request id, when its header decoded.
  std::optional<uint64_t> refused_request_id;
};

struct SocketOptions {
  int send_high_water_mark = 1000;      // messages queued per peer before sends would block
  int receive_high_water_mark = 1000;
  // A bound on each frame (ZMQ_MAXMSGSIZE) and on a whole message (Receive); -1 = none.
  int64_t max_message_bytes = -1;
  size_t max_frames = 1 << 16;          // frames per message; more -> header is Corruption
  std::chrono::milliseconds send_timeout{10000};  // a send blocked this long fails
  // CURVE (common/curve.h). A server with a secret key requires CURVE from every client and
  // asks the context's ZAP handler whom to admit; a client with keys speaks CURVE to a server
  // with that public key. All Z85; empty: plain text (no authentication).
  std::string curve_server_secret_key;
  std::string curve_public_key;         // client
  std::string curve_secret_key;         // client
  std::string curve_server_public_key;  // client: the server's
};

class Socket {
 public:
  enum class Kind { kServer, kClient };

  // Binds a ROUTER to `endpoint` ("tcp://host:port"; port 0: a free port below the ephemeral
  // range, common/ports.h, LastEndpoint() tells which). Returns Unavailable when the address is
  // in use or cannot be bound, InvalidArgument for a malformed endpoint.
  static Result<std::unique_ptr<Socket>> Bind(zmq::context_t& context, const std::string& endpoint,
                                              const SocketOptions& options = {});
  // A bound socket listens on `endpoint` as well (e.g. "ipc:///run/user/1000/ps0.sock"
  // beside its TCP address). A unix socket (from IpcEndpoint) is made mode 0600, in its
  // directory made mode 0700 if it does not exist. Unavailable when it cannot be bound.
  Status BindAlso(const std::string& endpoint);

  // Creates a DEALER that connects to `endpoint`. The connection is made in the background;
  // messages sent before it is up are queued. Never blocks.
  static Result<std::unique_ptr<Socket>> Connect(zmq::context_t& context,
                                                 const std::string& endpoint,
                                                 const SocketOptions& options = {});

  // Sends header + frames (the frames, and `identity`, are consumed). `identity` routes a
  // ROUTER's reply and must be null for a DEALER. A DEALER returns Unavailable if the message
  // could not be queued within the send timeout; a ROUTER drops replies to vanished peers
  // silently (ZeroMQ's rule), so it returns ok for them.
  Status Send(zmq::message_t* identity, const Header& header,
              std::vector<zmq::message_t> frames);

  // Waits up to `timeout` for one whole message. Returns std::nullopt on timeout or when a
  // signal interrupted the wait; an error only for a broken socket. A message of more than
  // max_frames frames, or of more than max_message_bytes in all (the routing id aside), is
  // read to its end, its frames dropped as they come, and returned with a Corruption header
  // (and, for the latter, refused_request_id). libzmq has held the whole message by then.
  Result<std::optional<Inbound>> Receive(std::chrono::milliseconds timeout);

  // The bound endpoint with the actual port (useful after binding port 0).
  std::string LastEndpoint() const;

  // A CURVE client whose handshake the server refused (its allow-list does not hold this
  // client's key: at once), or that failed 10 times in a row without a success between (the
  // keys do not match; a single failure may be a server restarting): why; nullopt otherwise,
  // and always for sockets without CURVE. Never blocks.
  std::optional<std::string> HandshakeFailure();

  // A CURVE server's handshake monitor: the other end of an inproc PAIR that gets libzmq's
  // monitor events (ZMQ_EVENT_ACCEPTED, _DISCONNECTED, _HANDSHAKE_SUCCEEDED and
  // _HANDSHAKE_FAILED_*) from before the bind on. The caller owns it, may use it from one
  // other thread, and must close it before the context. Null for other sockets and on
  // later calls.
  std::unique_ptr<zmq::socket_t> TakeHandshakeMonitor() {
    return kind_ == Kind::kServer ? std::move(monitor_) : nullptr;
  }

  zmq::socket_t& raw() { return socket_; }

 private:
  explicit Socket(zmq::socket_t socket) : socket_(std::move(socket)) {}
  zmq::socket_t socket_;
  std::unique_ptr<zmq::socket_t> monitor_;  // CURVE: handshake events of socket_
  std::optional<std::string> handshake_failure_;
  int failed_handshakes_ = 0;  // in a row, without the server's verdict
  static constexpr int kFailedHandshakesBeforeGivingUp = 10;
  Kind kind_ = Kind::kClient;
  size_t max_frames_ = 1 << 16;
  uint64_t max_bytes_ = 0;  // a whole message's bytes, routing id aside; 0: no bound
};

// Waits until at least one of `sockets` has a message or `timeout` passes. Returns, for each
// socket, whether it is readable (all false on timeout or signal).
Result<std::vector<bool>> WaitReadable(std::span<Socket* const> sockets,
                                       std::chrono::milliseconds timeout);

// "tcp://host:port" for "host:port"; a value already starting with "tcp://", "ipc://" or
// "inproc://" is returned as is.
std::string ToEndpoint(const std::string& address);

// The endpoint to bind for "host:port" (port 0: a free one). ZeroMQ binds interfaces and IP
// addresses, not host names, so a name is resolved to its first IPv4 address ("*" and IP
// literals are kept). InvalidArgument for an address ParseHostPort refuses or a name that
// does not resolve.
Result<std::string> ToBindEndpoint(const std::string& address);

// Who may use a unix socket: the server that binds it, or a client that connects to it.
enum class IpcSide { kServer, kClient };

// "ipc://PATH" for a unix socket PATH: absolute, at most 107 bytes (the kernel's bound), in a
// directory private to this process's user — owned by it (or by root) and writable by no one
// else — so that no other user can take the path first, or stand in for the server after a
// restart. A server's directory may not exist yet (Socket::BindAlso makes it, mode 0700; its
// parent must exist); a client's must, and a socket already there must be owned by this user
// (or root). A client waits up to `wait_for_directory` for a directory whose parent exists
// to appear (a launcher that starts servers and workers on other hosts at once: the server
// makes it when it binds), then checks it. InvalidArgument naming `flag`, the path and why
// otherwise.
Result<std::string> IpcEndpoint(const std::string& path, const std::string& flag, IpcSide side,
                                std::chrono::milliseconds wait_for_directory = {});

// The user id of a unix-socket peer, from its Peer-Address ("<host>:<uid>:<gid>:<pid>", as
// libzmq writes it); nullopt for an IP address, "" or anything else.
std::optional<uint32_t> UnixPeerUid(const std::string& peer_address);

// True for 127.0.0.0/8, ::1 and IPv4-mapped loopback.
bool IsLoopbackAddress(const std::string& ip);

}  // namespace parasync
