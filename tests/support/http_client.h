// Raw HTTP over loopback TCP, for tests of a metrics port as an attacker or a slow client
// would use it: connections that stay open without a word, requests sent as bytes, answers
// read with a bound. Test-only code.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace parasync::testing {

// A TCP connection to 127.0.0.1:port, closed with the object. Not thread-safe.
class LoopbackConnection {
 public:
  // Connects, waiting at most 5 s; ok() says whether it did.
  explicit LoopbackConnection(int port);
  LoopbackConnection(LoopbackConnection&& other) noexcept;
  LoopbackConnection& operator=(LoopbackConnection&&) = delete;
  ~LoopbackConnection();

  bool ok() const { return fd_ >= 0; }

  // Sends all of `bytes`; false if the server closed the connection first.
  bool Send(std::string_view bytes);

  // Reads at most `max_bytes`: returns as soon as some arrived, the server closed the
  // connection (*closed, when given, is set then) or `bound` passed.
  std::string Read(size_t max_bytes, std::chrono::milliseconds bound, bool* closed = nullptr);

  // Reads until the server closes the connection (EOF or reset) or `bound` passes. Returns
  // what arrived; *closed (when given) says whether the server closed it within the bound.
  std::string ReadUntilClosed(std::chrono::milliseconds bound, bool* closed = nullptr);

  // True once the server has closed the connection within `bound` (0: has it already);
  // whatever it sent before is read and dropped.
  bool ClosedByServerWithin(std::chrono::milliseconds bound);

 private:
  int fd_ = -1;
};

// Sends `request` on a new connection to 127.0.0.1:port and returns the whole answer if the
// server sent it and closed the connection within `bound` (counted from the connect), else
// "" (which no HTTP answer is).
std::string HttpExchange(int port, std::string_view request, std::chrono::milliseconds bound);

// "GET <path> HTTP/1.1" with the headers Prometheus's scraper sends (Host, Accept,
// User-Agent) and Connection: close.
std::string ScrapeRequest(std::string_view path);

// Raises this process's soft RLIMIT_NOFILE to its hard limit (children started afterwards
// inherit it). Returns the soft limit now.
uint64_t RaiseOpenFileLimit();

}  // namespace parasync::testing
