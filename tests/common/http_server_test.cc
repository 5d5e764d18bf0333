// common/http_server.h over loopback TCP: what it answers, what it refuses, and how it bounds
// clients that send half a request, do not read their answer, or just hold a connection.
#include "common/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/http_client.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;
using testing::HttpExchange;
using testing::LoopbackConnection;

// Bounds for a client that does everything right: far above any answer's time.
constexpr auto kBound = 5s;

std::map<std::string, HttpHandler> Routes() {
  return {{"/hello", [] { return HttpAnswer{200, "text/plain; charset=utf-8", "hello\n"}; }},
          {"/down", [] { return HttpAnswer{503, "text/plain; charset=utf-8", "down\n"}; }}};
}

std::unique_ptr<HttpServer> Serve(HttpServerOptions options = {},
                                  std::map<std::string, HttpHandler> routes = Routes()) {
  auto server = HttpServer::Start("127.0.0.1", 0, std::move(routes), options);
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(server).value() : nullptr;
}

std::string Get(int port, const std::string& path) {
  return HttpExchange(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n", kBound);
}

// Port 0: a free port below the kernel's ephemeral range (common/ports.h), as the servers'
// sockets bind.
TEST(HttpServerTest, PortZeroServesOnAFreePortBelowTheEphemeralRange) {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int ephemeral_start = 32768;
  range >> ephemeral_start;
  auto first = Serve();
  auto second = Serve();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  for (const auto* server : {first.get(), second.get()}) {
    EXPECT_GT(server->port(), 1023);
    EXPECT_LT(server->port(), ephemeral_start);
    EXPECT_THAT(Get(server->port(), "/hello"), EndsWith("\r\n\r\nhello\n"));
  }
  EXPECT_NE(first->port(), second->port());
}

TEST(HttpServerTest, AnswersARouteWithItsLengthAndClosesTheConnection) {
  auto server = Serve();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Get(server->port(), "/hello"),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 6\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\nhello\n");
  // The handler's status; the query is not part of the path; HTTP/1.0, bare LF line ends and
  // the headers Prometheus sends (keep-alive included) are all fine.
  EXPECT_THAT(Get(server->port(), "/down"), StartsWith("HTTP/1.1 503 Service Unavailable\r\n"));
  EXPECT_THAT(Get(server->port(), "/hello?x=1"), EndsWith("\r\n\r\nhello\n"));
  EXPECT_THAT(HttpExchange(server->port(), "GET /hello HTTP/1.0\n\n", kBound),
              EndsWith("\r\n\r\nhello\n"));
  EXPECT_THAT(HttpExchange(server->port(), testing::ScrapeRequest("/hello"), kBound),
              EndsWith("\r\n\r\nhello\n"));
  EXPECT_THAT(HttpExchange(server->port(),
                           "GET /hello HTTP/1.1\r\nConnection: keep-alive\r\n\r\n", kBound),
              EndsWith("\r\n\r\nhello\n"));
  // HEAD: the same headers, no body.
  EXPECT_THAT(
      HttpExchange(server->port(), "HEAD /hello HTTP/1.1\r\n\r\n", kBound),
      EndsWith("Content-Length: 6\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"));
}

TEST(HttpServerTest, AHeadSentByteByByteIsAnswered) {
  auto server = Serve();
  ASSERT_NE(server, nullptr);
  LoopbackConnection c(server->port());
  for (char byte : std::string("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")) {
    ASSERT_TRUE(c.Send(std::string(1, byte)));
  }
  bool closed = false;
  EXPECT_THAT(c.ReadUntilClosed(kBound, &closed), EndsWith("\r\n\r\nhello\n"));
  EXPECT_TRUE(closed);
}

TEST(HttpServerTest, UnknownPathIs404AndOtherMethodsAre405) {
  auto server = Serve();
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(Get(server->port(), "/nope"), StartsWith("HTTP/1.1 404 Not Found\r\n"));
  EXPECT_THAT(Get(server->port(), "/hello/"), StartsWith("HTTP/1.1 404 Not Found\r\n"));
  for (const char* method : {"POST", "PUT", "DELETE", "OPTIONS"}) {
    const std::string answer =
        HttpExchange(server->port(), std::string(method) + " /hello HTTP/1.1\r\n\r\n", kBound);
    EXPECT_THAT(answer, StartsWith("HTTP/1.1 405 Method Not Allowed\r\n")) << method;
    EXPECT_THAT(answer, HasSubstr("\r\nAllow: GET, HEAD\r\n")) << method;
  }
}

// A head timeout of a minute: the 400 comes from the check, not from a timeout.
TEST(HttpServerTest, WhatIsNotAnHttp1RequestLineIs400AtOnce) {
  auto server = Serve({.head_timeout = 60s});
  ASSERT_NE(server, nullptr);
  std::string garbage;
  for (int i = 0; i < 2560; ++i) garbage.push_back(static_cast<char>(i % 256));
  for (const std::string& request :
       {garbage, std::string("GET /hello HTTP/2.0\r\n\r\n"), std::string("GET /hello\r\n\r\n"),
        std::string("GET  /hello HTTP/1.1\r\n\r\n"), std::string("G(T /hello HTTP/1.1\r\n\r\n"),
        std::string("\r\n\r\n"), std::string("GET /hel lo HTTP/1.1\r\n")}) {
    // Without the empty line that ends a head: the request line alone is enough to refuse.
    EXPECT_THAT(HttpExchange(server->port(), request, kBound),
                StartsWith("HTTP/1.1 400 Bad Request\r\n"))
        << request.substr(0, 40);
  }
}

TEST(HttpServerTest, AHeadOverTheBoundIs400AndOneAtTheBoundIsAnswered) {
  constexpr size_t kMax = 1024;
  auto server = Serve({.max_head_bytes = kMax});
  ASSERT_NE(server, nullptr);
  // "GET /hello HTTP/1.1\r\nX: <pad>\r\n\r\n" of exactly `size` bytes.
  auto head = [](size_t size) {
    const std::string frame = "GET /hello HTTP/1.1\r\nX: \r\n\r\n";
    return "GET /hello HTTP/1.1\r\nX: " + std::string(size - frame.size(), 'a') + "\r\n\r\n";
  };
  EXPECT_THAT(HttpExchange(server->port(), head(kMax), kBound), EndsWith("\r\n\r\nhello\n"));
  EXPECT_THAT(HttpExchange(server->port(), head(kMax + 1), kBound),
              StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  // A client still sending when the answer comes gets it whole, and the connection closed.
  const std::string answer = HttpExchange(server->port(), head(1 << 20), kBound);
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_THAT(answer, EndsWith("\r\n\r\nrequest head over 1024 bytes\n"));
}

TEST(HttpServerTest, HalfAHeadThenSilenceIsClosedAfterTheHeadTimeout) {
  auto server = Serve({.head_timeout = 300ms});
  ASSERT_NE(server, nullptr);
  LoopbackConnection silent(server->port());
  LoopbackConnection half(server->port());
  ASSERT_TRUE(half.Send("GET /hello HTTP/1.1\r\nHost: x\r\n"));
  // Open before the timeout, closed (without an answer) after it.
  EXPECT_FALSE(silent.ClosedByServerWithin(100ms));
  bool closed = false;
  EXPECT_THAT(half.ReadUntilClosed(kBound, &closed), IsEmpty());
  EXPECT_TRUE(closed);
  EXPECT_TRUE(silent.ClosedByServerWithin(kBound));
  // The server still serves.
  EXPECT_THAT(Get(server->port(), "/hello"), EndsWith("\r\n\r\nhello\n"));
}

TEST(HttpServerTest, AnAnswerNotReadIsCutOffAfterTheAnswerTimeout) {
  // Far more than the socket buffers of both ends hold.
  const std::string big(32 << 20, 'x');
  auto server = Serve({.answer_timeout = 300ms},
                      {{"/big", [&big] { return HttpAnswer{200, "text/plain", big}; }}});
  ASSERT_NE(server, nullptr);
  LoopbackConnection reader(server->port());
  ASSERT_TRUE(reader.Send("GET /big HTTP/1.1\r\n\r\n"));
  // A reader of 256 KiB every 50 ms would need 6.4 s for it all; the server gives up after
  // 0.3 s, and what it had handed to the kernel by then arrives before the end of the stream.
  bool closed = false;
  std::string got;
  for (const auto t0 = std::chrono::steady_clock::now();
       !closed && std::chrono::steady_clock::now() - t0 < kBound;) {
    got += reader.Read(256 << 10, kBound, &closed);
    std::this_thread::sleep_for(50ms);  // the slow reader under test, not a wait for a result
  }
  EXPECT_TRUE(closed) << "still open after " << got.size() << " bytes";
  EXPECT_THAT(got, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_LT(got.size(), big.size()) << "the whole answer arrived: nothing was cut off";
}

TEST(HttpServerTest, AtTheConnectionCapTheOldestIdleConnectionMakesRoom) {
  auto server = Serve({.max_connections = 4});
  ASSERT_NE(server, nullptr);
  std::vector<LoopbackConnection> idle;
  for (int i = 0; i < 4; ++i) {
    idle.emplace_back(server->port());
    ASSERT_TRUE(idle.back().ok());
  }
  // The fifth is served; the first gives way, the others stay.
  EXPECT_THAT(Get(server->port(), "/hello"), EndsWith("\r\n\r\nhello\n"));
  EXPECT_TRUE(idle[0].ClosedByServerWithin(kBound));
  for (int i = 1; i < 4; ++i) EXPECT_FALSE(idle[i].ClosedByServerWithin(0ms)) << i;
  // Never refused for good: at the cap again, each new client is served and the oldest idle
  // one gives way.
  std::vector<LoopbackConnection> later;
  for (int i = 1; i < 4; ++i) {
    later.emplace_back(server->port());
    EXPECT_THAT(Get(server->port(), "/hello"), EndsWith("\r\n\r\nhello\n")) << i;
    EXPECT_TRUE(idle[i].ClosedByServerWithin(kBound)) << i;
  }
  for (LoopbackConnection& c : later) EXPECT_FALSE(c.ClosedByServerWithin(0ms));
}

TEST(HttpServerTest, StopsPromptlyAndClosesItsConnections) {
  auto server = Serve();
  ASSERT_NE(server, nullptr);
  std::vector<LoopbackConnection> idle;
  for (int i = 0; i < 8; ++i) idle.emplace_back(server->port());
  ASSERT_THAT(Get(server->port(), "/hello"), EndsWith("\r\n\r\nhello\n"));  // all accepted
  const auto t0 = std::chrono::steady_clock::now();
  server.reset();
  // civetweb took up to 2 s (its listener polled in 2 s quanta).
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  for (LoopbackConnection& c : idle) EXPECT_TRUE(c.ClosedByServerWithin(0ms));
}

TEST(HttpServerTest, RefusesWhatItCannotBind) {
  auto first = Serve();
  ASSERT_NE(first, nullptr);
  auto taken = HttpServer::Start("127.0.0.1", first->port(), Routes());
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(taken.status().message(),
            "port " + std::to_string(first->port()) + " on 127.0.0.1 is in use");
  for (const char* ip : {"localhost", "[::1]", "999.1.1.1", ""}) {
    auto refused = HttpServer::Start(ip, 0, Routes());
    ASSERT_FALSE(refused.ok()) << ip;
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << ip;
  }
  EXPECT_EQ(HttpServer::Start("127.0.0.1", 65536, Routes()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(HttpServerTest, ServesIpv6) {
  auto server = HttpServer::Start("::1", 0, Routes());
  if (!server.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << server.status().ToString();
  EXPECT_GT((*server)->port(), 0);
}

}  // namespace
}  // namespace parasync
