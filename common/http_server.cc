#include "common/http_server.h"

#include "common/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <list>
#include <optional>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>

namespace parasync {

namespace {

// Binds `fd` to `address` (its family and IP set) at `port`; errno, or 0 once bound.
int BindAt(int fd, sockaddr_storage address, socklen_t size, int port) {
  const auto net_port = htons(static_cast<uint16_t>(port));
  if (address.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&address)->sin6_port = net_port;
  } else {
    reinterpret_cast<sockaddr_in*>(&address)->sin_port = net_port;
  }
  return bind(fd, reinterpret_cast<const sockaddr*>(&address), size) == 0 ? 0 : errno;
}

using Clock = std::chrono::steady_clock;

// The epoll tags of the two descriptors that are not connections; a connection's tag is its
// id, counting from kFirstConnectionId.
constexpr uint64_t kWakeTag = 0;
constexpr uint64_t kListenTag = 1;
constexpr uint64_t kFirstConnectionId = 2;
// Connections accepted per wake-up before the other connections' events are served.
constexpr int kAcceptBatch = 64;
// How long accepting pauses when the process is out of descriptors and no connection of
// ours can be closed to free one (the listener would otherwise wake the loop at once, again).
constexpr std::chrono::milliseconds kAcceptPause{100};
// After an answer the server reads and drops what the client still sends (the rest of a
// refused head) for this long: closing a socket with unread input resets the connection,
// and a reset can destroy the answer before the client has read it.
constexpr std::chrono::milliseconds kLinger{1000};

// Closes the descriptor it owns.
class OwnedFd {
 public:
  explicit OwnedFd(int fd = -1) : fd_(fd) {}
  OwnedFd(OwnedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&&) = delete;
  ~OwnedFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string_view Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

// A whole HTTP/1.1 answer; the body only when `with_body` (not for HEAD).
std::string AnswerText(const HttpAnswer& answer, bool with_body, std::string_view extra_headers) {
  std::string out = "HTTP/1.1 " + std::to_string(answer.status) + " ";
  out.append(Reason(answer.status));
  out += "\r\nContent-Type: " + answer.content_type +
         "\r\nContent-Length: " + std::to_string(answer.body.size()) +
         "\r\nCache-Control: no-store\r\nConnection: close\r\n";
  out.append(extra_headers);
  out += "\r\n";
  if (with_body) out += answer.body;
  return out;
}

bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

struct RequestLine {
  std::string_view method;
  std::string_view target;
};

// The method and target of "METHOD SP target SP HTTP/1.d" (`line` without its line end);
// nullopt for anything else.
std::optional<RequestLine> ParseRequestLine(std::string_view line) {
  const size_t first = line.find(' ');
  const size_t second = first == std::string_view::npos ? first : line.find(' ', first + 1);
  if (first == 0 || second == std::string_view::npos || second == first + 1) return std::nullopt;
  RequestLine r{line.substr(0, first), line.substr(first + 1, second - first - 1)};
  const std::string_view version = line.substr(second + 1);
  if (!std::all_of(r.method.begin(), r.method.end(), IsTokenChar)) return std::nullopt;
  if (!std::all_of(r.target.begin(), r.target.end(), [](char c) { return c > ' ' && c < 127; })) {
    return std::nullopt;
  }
  if (version.size() != 8 || version.substr(0, 7) != "HTTP/1." ||
      std::isdigit(static_cast<unsigned char>(version[7])) == 0) {
    return std::nullopt;
  }
  return r;
}

// The path of a request target: origin form ("/metrics?x=1") or absolute form
// ("http://host:9100/metrics"), without the query.
std::string_view TargetPath(std::string_view target) {
  if (const size_t scheme = target.find("://");
      scheme != std::string_view::npos && target[0] != '/') {
    const size_t path = target.find('/', scheme + 3);
    target = path == std::string_view::npos ? "/" : target.substr(path);
  }
  return target.substr(0, target.find_first_of("?#"));
}

// The length of the request head at the start of `in` (through the empty line that ends it;
// lines end in CRLF or a bare LF), or npos while it has not ended. Looks for the end from
// `from` on.
size_t HeadLength(std::string_view in, size_t from) {
  for (size_t at = in.find('\n', from); at != std::string_view::npos; at = in.find('\n', at + 1)) {
    if (at + 1 < in.size() && in[at + 1] == '\n') return at + 2;
    if (at + 2 < in.size() && in[at + 1] == '\r' && in[at + 2] == '\n') return at + 3;
  }
  return std::string_view::npos;
}

std::string_view FirstLine(std::string_view in, size_t newline) {
  std::string_view line = in.substr(0, newline);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

}  // namespace

// The server's thread: the listener, the connections and their deadlines. Everything here
// runs on that thread except the constructor, Stop() and the destructor.
class HttpServer::Loop {
 public:
  Loop(OwnedFd listener, OwnedFd epoll, OwnedFd wake, std::map<std::string, HttpHandler> routes,
       HttpServerOptions options)
      : listener_(std::move(listener)),
        epoll_(std::move(epoll)),
        wake_(std::move(wake)),
        routes_(std::move(routes)),
        options_(options) {}
  ~Loop() {
    while (!connections_.empty()) Close(connections_.begin());
  }

  // Makes Run() return soon; from any thread.
  void Stop() {
    const uint64_t one = 1;
    while (write(wake_.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }

  void Run();

  int64_t answered() const { return answered_.load(); }

 private:
  enum class Phase {
    kHead,    // reading the request head
    kAnswer,  // writing the answer
    kLinger,  // answered; dropping what the client still sends until it closes
    kClosed,  // to be closed
  };
  struct Connection {
    uint64_t id = 0;
    int fd = -1;
    Phase phase = Phase::kHead;
    Clock::time_point deadline;
    std::string in;           // the head so far
    size_t scanned = 0;       // where to look for the head's end next
    bool line_ok = false;     // the request line is whole and valid
    std::string out;          // the answer
    size_t sent = 0;          // bytes of `out` written
  };
  using Iterator = std::list<Connection>::iterator;

  int TimeoutMs() const;
  void Accept();
  void Add(int fd);
  void OnEvent(Connection& c, uint32_t events);
  void ReadHead(Connection& c);
  void Route(Connection& c, std::string_view request_line);
  void Answer(Connection& c, const HttpAnswer& answer, bool with_body = true,
              std::string_view extra_headers = {});
  void Write(Connection& c);
  void Drain(Connection& c);
  void Watch(Connection& c, uint32_t events);
  void SetDeadline(Connection& c, std::chrono::milliseconds after);
  bool CloseOldestIdle();
  void Close(Iterator it);
  void ExpireDue(Clock::time_point now);
  void PauseAccepting();

  OwnedFd listener_;
  OwnedFd epoll_;
  OwnedFd wake_;
  const std::map<std::string, HttpHandler> routes_;
  const HttpServerOptions options_;
  std::list<Connection> connections_;  // in the order they were accepted
  std::unordered_map<uint64_t, Iterator> by_id_;
  uint64_t next_id_ = kFirstConnectionId;
  // No connection's deadline is earlier than this (max: none is set).
  Clock::time_point next_deadline_ = Clock::time_point::max();
  std::optional<Clock::time_point> accept_paused_until_;
  std::atomic<int64_t> answered_{0};  // written by the thread, read from any
};

void HttpServer::Loop::Run() {
  epoll_event events[64];
  for (;;) {
    const int n = epoll_wait(epoll_.get(), events, 64, TimeoutMs());
    if (n < 0 && errno != EINTR) return;  // only on a bug of ours (a bad descriptor)
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) return;
      if (tag == kListenTag) {
        Accept();
        continue;
      }
      const auto found = by_id_.find(tag);
      if (found == by_id_.end()) continue;  // closed earlier in this batch
      const Iterator it = found->second;
      OnEvent(*it, events[i].events);
      if (it->phase == Phase::kClosed) Close(it);
    }
    ExpireDue(Clock::now());
  }
}

int HttpServer::Loop::TimeoutMs() const {
  Clock::time_point next = next_deadline_;
  if (accept_paused_until_) next = std::min(next, *accept_paused_until_);
  if (next == Clock::time_point::max()) return -1;
  const auto left = next - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  // Rounded up: waking a moment early would only find nothing due and wait again.
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
}

void HttpServer::Loop::Accept() {
  for (int i = 0; i < kAcceptBatch; ++i) {
    const int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      // At the limit the new client is served and an old idle one gives way.
      if (connections_.size() >= options_.max_connections && !CloseOldestIdle()) {
        Close(connections_.begin());
      }
      Add(fd);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      if (CloseOldestIdle()) continue;  // its descriptor is free now
      PauseAccepting();
    }
    return;  // EAGAIN: no more waiting
  }
}

void HttpServer::Loop::Add(int fd) {
  Connection c;
  c.id = next_id_++;
  c.fd = fd;
  const Iterator it = connections_.insert(connections_.end(), std::move(c));
  by_id_.emplace(it->id, it);
  SetDeadline(*it, options_.head_timeout);
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP;
  event.data.u64 = it->id;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) != 0) Close(it);
}

void HttpServer::Loop::OnEvent(Connection& c, uint32_t events) {
  switch (c.phase) {
    case Phase::kHead:
      ReadHead(c);
      break;
    case Phase::kAnswer:
      if ((events & (EPOLLERR | EPOLLHUP)) != 0) {
        c.phase = Phase::kClosed;
      } else {
        Write(c);
      }
      break;
    case Phase::kLinger:
      Drain(c);
      break;
    case Phase::kClosed:
      break;
  }
}

void HttpServer::Loop::ReadHead(Connection& c) {
  // One byte over the bound tells a head that is too long.
  const size_t limit = options_.max_head_bytes + 1;
  bool eof = false;
  char buf[4096];
  while (c.in.size() < limit) {
    const ssize_t n = recv(c.fd, buf, std::min(sizeof(buf), limit - c.in.size()), 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      eof = true;
      break;
    } else if (errno != EINTR) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) c.phase = Phase::kClosed;  // reset
      break;
    }
  }
  if (c.phase == Phase::kClosed) return;
  // The request line is checked as soon as it is whole: bytes that are no HTTP get their 400
  // at once rather than after the whole bound or the timeout.
  const size_t newline = c.in.find('\n');
  if (!c.line_ok && newline != std::string::npos) {
    if (!ParseRequestLine(FirstLine(c.in, newline))) {
      Answer(c, {400, "text/plain; charset=utf-8", "not an HTTP/1.x request\n"});
      return;
    }
    c.line_ok = true;
  }
  const size_t head = HeadLength(c.in, c.scanned);
  if (head != std::string::npos && head <= options_.max_head_bytes) {
    Route(c, FirstLine(c.in, newline));
  } else if (c.in.size() > options_.max_head_bytes) {
    Answer(c, {400, "text/plain; charset=utf-8",
               "request head over " + std::to_string(options_.max_head_bytes) + " bytes\n"});
  } else if (eof) {
    c.phase = Phase::kClosed;  // the client gave up before its head was whole
  } else {
    // A terminator may begin in the last two bytes read.
    c.scanned = c.in.size() >= 2 ? c.in.size() - 2 : 0;
  }
}

void HttpServer::Loop::Route(Connection& c, std::string_view request_line) {
  const RequestLine request = *ParseRequestLine(request_line);
  const bool head = request.method == "HEAD";
  if (request.method != "GET" && !head) {
    Answer(c, {405, "text/plain; charset=utf-8", "only GET and HEAD are served\n"}, true,
           "Allow: GET, HEAD\r\n");
    return;
  }
  const auto route = routes_.find(std::string(TargetPath(request.target)));
  if (route == routes_.end()) {
    Answer(c, {404, "text/plain; charset=utf-8", "not found\n"}, !head);
    return;
  }
  Answer(c, route->second(), !head);
}

void HttpServer::Loop::Answer(Connection& c, const HttpAnswer& answer, bool with_body,
                              std::string_view extra_headers) {
  ++answered_;
  c.in = std::string();
  c.out = AnswerText(answer, with_body, extra_headers);
  c.phase = Phase::kAnswer;
  SetDeadline(c, options_.answer_timeout);
  Write(c);
  if (c.phase == Phase::kAnswer) Watch(c, EPOLLOUT);
}

void HttpServer::Loop::Write(Connection& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n >= 0) {
      c.sent += static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return;  // the client reads slowly: EPOLLOUT says when to go on
    } else if (errno != EINTR) {
      c.phase = Phase::kClosed;
      return;
    }
  }
  // All sent: the end of the answer is the end of the stream.
  c.out = std::string();
  shutdown(c.fd, SHUT_WR);
  c.phase = Phase::kLinger;
  SetDeadline(c, std::min(kLinger, options_.answer_timeout));
  Watch(c, EPOLLIN | EPOLLRDHUP);
}

void HttpServer::Loop::Drain(Connection& c) {
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c.phase = Phase::kClosed;
    return;
  }
}

void HttpServer::Loop::Watch(Connection& c, uint32_t events) {
  if (c.phase == Phase::kClosed) return;
  epoll_event event{};
  event.events = events;
  event.data.u64 = c.id;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd, &event) != 0) c.phase = Phase::kClosed;
}

void HttpServer::Loop::SetDeadline(Connection& c, std::chrono::milliseconds after) {
  c.deadline = Clock::now() + after;
  next_deadline_ = std::min(next_deadline_, c.deadline);
}

bool HttpServer::Loop::CloseOldestIdle() {
  for (Iterator it = connections_.begin(); it != connections_.end(); ++it) {
    if (it->phase == Phase::kHead || it->phase == Phase::kLinger) {
      Close(it);
      return true;
    }
  }
  return false;
}

void HttpServer::Loop::Close(Iterator it) {
  close(it->fd);  // also takes it out of the epoll set (no other descriptor refers to it)
  by_id_.erase(it->id);
  connections_.erase(it);
}

void HttpServer::Loop::ExpireDue(Clock::time_point now) {
  if (accept_paused_until_ && now >= *accept_paused_until_) {
    accept_paused_until_.reset();
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = kListenTag;
    epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &event);
  }
  if (now < next_deadline_) return;
  next_deadline_ = Clock::time_point::max();
  for (Iterator it = connections_.begin(); it != connections_.end();) {
    const Iterator next = std::next(it);
    if (it->deadline <= now) {
      Close(it);  // a head never finished, an answer not read, a client that does not close
    } else {
      next_deadline_ = std::min(next_deadline_, it->deadline);
    }
    it = next;
  }
}

void HttpServer::Loop::PauseAccepting() {
  epoll_event event{};
  event.data.u64 = kListenTag;
  epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &event);
  accept_paused_until_ = Clock::now() + kAcceptPause;
}

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& ip, int port,
                                                      std::map<std::string, HttpHandler> routes,
                                                      HttpServerOptions options) {
  if (port < 0 || port > 65535) {
    return Status::InvalidArgument("port out of range: " + std::to_string(port));
  }
  sockaddr_storage address{};
  socklen_t address_size = 0;
  if (auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
      inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    address_size = sizeof(sockaddr_in);
  } else if (auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
             inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    address_size = sizeof(sockaddr_in6);
  } else {
    return Status::InvalidArgument("not a numeric IP address: '" + ip + "'");
  }
  const std::string where = ip + " port " + std::to_string(port);
  OwnedFd listener(socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) {
    return Status::Unavailable("cannot open a socket for " + where + ": " + std::strerror(errno));
  }
  // As ZeroMQ binds: a port whose last connections are in TIME_WAIT is free.
  const int one = 1;
  setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // An IPv6 address means IPv6 only ("::" does not take the IPv4 port too).
  if (address.ss_family == AF_INET6) {
    setsockopt(listener.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  }
  // Port 0: a free one below the ephemeral range (common/ports.h), as the servers' sockets.
  int error = 0;
  if (port != 0) {
    error = BindAt(listener.get(), address, address_size, port);
  } else {
    auto bound = BindBelowEphemeral([&](int p) -> Result<bool> {
      error = BindAt(listener.get(), address, address_size, p);
      if (error == EADDRINUSE) return false;
      if (error != 0) return Status::Unavailable(std::strerror(error));
      return true;
    });
    if (!bound.ok() && error == EADDRINUSE) {
      return Status::Unavailable("no free port on " + ip + ": " + bound.status().message());
    }
  }
  if (error != 0) {
    if (error == EADDRINUSE) {
      return Status::Unavailable("port " + std::to_string(port) + " on " + ip + " is in use");
    }
    if (error == EADDRNOTAVAIL) {
      return Status::Unavailable(ip + " is not an address of this machine (port " +
                                 std::to_string(port) + ")");
    }
    return Status::Unavailable("cannot bind " + where + ": " + std::strerror(error));
  }
  if (listen(listener.get(), SOMAXCONN) != 0) {
    return Status::Unavailable("cannot listen on " + where + ": " + std::strerror(errno));
  }
  sockaddr_storage bound{};
  socklen_t bound_size = sizeof(bound);
  getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &bound_size);
  const int bound_port = ntohs(bound.ss_family == AF_INET6
                                   ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                   : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);

  OwnedFd epoll(epoll_create1(EPOLL_CLOEXEC));
  OwnedFd wake(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (epoll.get() < 0 || wake.get() < 0) {
    return Status::Unavailable("cannot serve " + where + ": " + std::strerror(errno));
  }
  for (const auto& [fd, tag] : {std::pair{listener.get(), kListenTag}, {wake.get(), kWakeTag}}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = tag;
    if (epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
      return Status::Unavailable("cannot serve " + where + ": " + std::strerror(errno));
    }
  }

  options.max_connections = std::max<size_t>(options.max_connections, 1);
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->port_ = bound_port;
  server->loop_ = std::make_unique<Loop>(std::move(listener), std::move(epoll), std::move(wake),
                                         std::move(routes), options);
  try {
    server->thread_ = std::thread([loop = server->loop_.get()] { loop->Run(); });
  } catch (const std::system_error& e) {
    return Status::Unavailable("cannot start the thread serving " + where + ": " + e.what());
  }
  return server;
}

int64_t HttpServer::answered() const { return loop_->answered(); }

HttpServer::~HttpServer() {
  if (thread_.joinable()) {
    loop_->Stop();
    thread_.join();
  }
}

}  // namespace parasync
