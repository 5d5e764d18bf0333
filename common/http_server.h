// HttpServer: a small HTTP/1.x server for a process's own endpoints (/metrics, /healthz,
// /readyz; common/metrics.h). One thread with epoll and non-blocking sockets: it accepts,
// reads a request head, answers GET or HEAD of a known path from a handler and closes the
// connection. An open connection costs a descriptor and its buffers, never a thread, so idle
// or slow clients cannot keep an answer from anyone else; they are bounded in number and in
// time by HttpServerOptions.
//
// What it answers: 200 (or what the handler says) for GET/HEAD of a route; 404 for another
// path; 405 for another method; 400 for a head that is not HTTP/1.x or is longer than
// max_head_bytes. Every answer carries Content-Length and Connection: close (keep-alive is
// not offered: a scrape is one request); a request body is not read. The query string is
// ignored for routing.
//
// Thread safety: Start and the destructor from one thread; port() and answered() from any.
// Handlers run on the server's thread, one at a time, while the connection that asked waits;
// they must not throw.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"

namespace parasync {

// A handler's answer.
struct HttpAnswer {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};
using HttpHandler = std::function<HttpAnswer()>;

struct HttpServerOptions {
  // Open connections at most. A connection accepted at the limit closes the oldest one that
  // is idle (has not sent a whole request head, or has had its whole answer), so a new
  // client is never refused for good; only when every connection is busy writing an answer
  // is the oldest of those closed.
  size_t max_connections = 1024;
  // A request head (request line and header lines) longer than this gets 400.
  size_t max_head_bytes = 16 * 1024;
  // Time from accept to a whole request head; a connection still without one is closed.
  std::chrono::milliseconds head_timeout{5000};
  // Time for the client to read the whole answer; one that does not is closed.
  std::chrono::milliseconds answer_timeout{10000};
};

class HttpServer {
 public:
  // Listens on ip:port (an IPv4 or IPv6 address in numeric form, IPv6 without brackets;
  // "0.0.0.0" or "::" for every address; port 0 picks a free port below the ephemeral range,
  // common/ports.h, see port()) and serves
  // `routes` (path -> handler, e.g. "/metrics") from a thread of its own until destroyed.
  // InvalidArgument for an address that is not numeric or a port out of range; Unavailable
  // when the address cannot be bound (the message says why: "port 9100 on 127.0.0.1 is in
  // use") or the thread cannot be started.
  static Result<std::unique_ptr<HttpServer>> Start(const std::string& ip, int port,
                                                   std::map<std::string, HttpHandler> routes,
                                                   HttpServerOptions options = {});
  // Stops: wakes the thread, waits for it (at most the handler it may be running), closes
  // every connection and the listening socket.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

  // The number of requests answered so far, whatever the status (counted as the answer
  // starts to be written, before the client has read it).
  int64_t answered() const;

 private:
  class Loop;
  HttpServer() = default;

  int port_ = 0;
  std::unique_ptr<Loop> loop_;  // what the thread runs; it owns every descriptor
  std::thread thread_;
};

}  // namespace parasync
