#include "deploy/launch/snapshot_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

namespace parasync::launch {

namespace {

constexpr size_t kMaxRequestBytes = 8192;
constexpr int kRequestTimeoutMs = 2000;

std::string HttpResponse(std::string_view status, std::string_view content_type,
                         std::string_view body) {
  std::string out = "HTTP/1.1 ";
  out.append(status);
  out += "\r\nContent-Type: ";
  out.append(content_type);
  out += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  out.append(body);
  return out;
}

void SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client went away: nothing to do
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

Result<std::unique_ptr<SnapshotServer>> SnapshotServer::Start(
    const std::vector<SnapshotEndpoint>& endpoints, std::vector<std::string>* skipped) {
  std::unique_ptr<SnapshotServer> server(new SnapshotServer());
  std::string first_failure;
  for (const SnapshotEndpoint& e : endpoints) {
    const std::string where = e.bind + ":" + std::to_string(e.port);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(e.port));
    if (inet_pton(AF_INET, e.bind.c_str(), &address.sin_addr) != 1) {
      return Status::InvalidArgument("not an IPv4 address: " + e.bind);
    }
    Listener listener;
    listener.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    const int one = 1;
    if (listener.fd >= 0) setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (listener.fd < 0 ||
        bind(listener.fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(listener.fd, 16) != 0) {
      const std::string failure =
          "cannot serve the final metrics on " + where + ": " + std::strerror(errno);
      if (listener.fd >= 0) close(listener.fd);
      listener.fd = -1;
      if (first_failure.empty()) first_failure = failure;
      if (skipped != nullptr) skipped->push_back(failure);
      server->listeners_.push_back(std::move(listener));
      continue;
    }
    sockaddr_in bound{};
    socklen_t length = sizeof(bound);
    getsockname(listener.fd, reinterpret_cast<sockaddr*>(&bound), &length);
    listener.port = ntohs(bound.sin_port);
    listener.response = HttpResponse("200 OK", "text/plain; version=0.0.4; charset=utf-8", e.body);
    server->listeners_.push_back(std::move(listener));
  }
  bool any = false;
  for (const Listener& l : server->listeners_) any |= l.fd >= 0;
  if (!any) {
    return Status::Unavailable(first_failure.empty() ? "no endpoint to serve" : first_failure);
  }
  return server;
}

SnapshotServer::~SnapshotServer() {
  for (const Listener& l : listeners_) {
    if (l.fd >= 0) close(l.fd);
  }
}

std::vector<int> SnapshotServer::ports() const {
  std::vector<int> out;
  for (const Listener& l : listeners_) out.push_back(l.port);
  return out;
}

void SnapshotServer::Answer(const Listener& listener) {
  const int fd = accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    // EAGAIN or a connection reset before accept: nothing to do. Out of descriptors: the
    // listener stays readable, so pause rather than spin.
    if (errno == EMFILE || errno == ENFILE) poll(nullptr, 0, 100);
    return;
  }
  // A client that does not read its answer must not hold the launcher for long.
  timeval send_timeout{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  std::string request;
  char buffer[2048];
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kRequestTimeoutMs);
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd readable{fd, POLLIN, 0};
    if (poll(&readable, 1, static_cast<int>(left.count())) <= 0) break;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    request.append(buffer, static_cast<size_t>(n));
  }
  // "GET /metrics HTTP/1.1" or "GET /metrics?x=y ..."; HEAD is not worth supporting.
  const bool metrics = request.rfind("GET /metrics ", 0) == 0 || request.rfind("GET /metrics?", 0) == 0;
  if (metrics) {
    SendAll(fd, listener.response);
  } else {
    SendAll(fd, HttpResponse("404 Not Found", "text/plain", "only GET /metrics is served\n"));
  }
  close(fd);
}

int64_t SnapshotServer::ServeUntilReadable(int wake_fd) {
  int64_t answered = 0;
  for (;;) {
    std::vector<pollfd> fds;
    fds.push_back({wake_fd, POLLIN, 0});
    for (const Listener& l : listeners_) fds.push_back({l.fd, POLLIN, 0});  // -1: ignored
    const int ready = poll(fds.data(), fds.size(), -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return answered;
    }
    if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) return answered;
    for (size_t i = 1; i < fds.size(); ++i) {
      if ((fds[i].revents & POLLIN) != 0) {
        Answer(listeners_[i - 1]);
        ++answered;
      }
    }
  }
}

Result<std::string> ReadSnapshotFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("no metrics snapshot at " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return Status::Unavailable("cannot read " + path);
  return text.str();
}

}  // namespace parasync::launch
