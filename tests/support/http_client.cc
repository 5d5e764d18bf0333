#include "tests/support/http_client.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace parasync::testing {

namespace {

using Clock = std::chrono::steady_clock;

int MillisLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

}  // namespace

LoopbackConnection::LoopbackConnection(int port) {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return;
  timeval tv{5, 0};  // bounds connect() too
  setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd_);
    fd_ = -1;
  }
}

LoopbackConnection::LoopbackConnection(LoopbackConnection&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)) {}

LoopbackConnection::~LoopbackConnection() {
  if (fd_ >= 0) close(fd_);
}

bool LoopbackConnection::Send(std::string_view bytes) {
  while (fd_ >= 0 && !bytes.empty()) {
    const ssize_t n = send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return fd_ >= 0;
}

std::string LoopbackConnection::Read(size_t max_bytes, std::chrono::milliseconds bound,
                                     bool* closed) {
  const Clock::time_point deadline = Clock::now() + bound;
  std::string out;
  if (closed != nullptr) *closed = false;
  while (fd_ >= 0) {
    pollfd p{fd_, POLLIN, 0};
    const int ready = poll(&p, 1, MillisLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;  // the bound passed
    out.resize(max_bytes);
    const ssize_t n = recv(fd_, out.data(), max_bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    out.resize(n > 0 ? static_cast<size_t>(n) : 0);
    if (n <= 0 && closed != nullptr) *closed = true;  // EOF or reset
    break;
  }
  return out;
}

std::string LoopbackConnection::ReadUntilClosed(std::chrono::milliseconds bound, bool* closed) {
  const Clock::time_point deadline = Clock::now() + bound;
  std::string out;
  bool eof = false;
  while (fd_ >= 0 && !eof) {
    const std::string got = Read(65536, std::chrono::milliseconds(MillisLeft(deadline)), &eof);
    if (got.empty() && !eof) break;  // the bound passed
    out += got;
  }
  if (closed != nullptr) *closed = eof;
  return out;
}

bool LoopbackConnection::ClosedByServerWithin(std::chrono::milliseconds bound) {
  bool closed = false;
  ReadUntilClosed(bound, &closed);
  return closed;
}

std::string HttpExchange(int port, std::string_view request, std::chrono::milliseconds bound) {
  const Clock::time_point deadline = Clock::now() + bound;
  LoopbackConnection connection(port);
  if (!connection.ok() || !connection.Send(request)) return "";
  bool closed = false;
  std::string answer =
      connection.ReadUntilClosed(std::chrono::milliseconds(MillisLeft(deadline)), &closed);
  return closed ? answer : "";
}

std::string ScrapeRequest(std::string_view path) {
  std::string request = "GET ";
  request.append(path);
  request +=
      " HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: Prometheus/2.42.0\r\n"
      "Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
      "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n"
      "Accept-Encoding: gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n"
      "Connection: close\r\n\r\n";
  return request;
}

uint64_t RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  return limit.rlim_cur;
}

}  // namespace parasync::testing
