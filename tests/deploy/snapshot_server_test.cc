// deploy/launch/snapshot_server.h: the final metrics served after a run; where metrics bind.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deploy/launch/launcher.h"
#include "deploy/launch/snapshot_server.h"
#include "tests/deploy/launch_test_util.h"
#include "tests/support/http_client.h"

namespace parasync::launch {
namespace {

using namespace launch_test;  // this file's helpers: tests/deploy/launch_test_util.h

TEST(SnapshotServerTest, ServesEachBodyOnItsPortUntilTheWakeFdIsReadable) {
  auto server = SnapshotServer::Start({{"127.0.0.1", 0, "a_metric 1\n"},
                                       {"127.0.0.1", 0, "b_metric 2\n"}});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::vector<int> ports = (*server)->ports();
  ASSERT_EQ(ports.size(), 2u);
  int wake[2];
  ASSERT_EQ(pipe(wake), 0);
  int64_t answered = -1;
  std::thread serving([&] { answered = (*server)->ServeUntilReadable(wake[0]); });
  const std::string a = HttpGet(ports[0], "/metrics");
  const std::string b = HttpGet(ports[1], "/metrics?name[]=x");
  const std::string missing = HttpGet(ports[0], "/");
  ASSERT_EQ(write(wake[1], "x", 1), 1);
  serving.join();
  close(wake[0]);
  close(wake[1]);
  EXPECT_THAT(a, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(a, HasSubstr("Content-Length: 11\r\n"));
  EXPECT_THAT(a, HasSubstr("\r\n\r\na_metric 1\n"));
  EXPECT_THAT(b, HasSubstr("b_metric 2"));
  EXPECT_THAT(missing, HasSubstr("404 Not Found"));
  EXPECT_THAT(missing, Not(HasSubstr("a_metric")));
  EXPECT_EQ(answered, 3);
}

TEST(SnapshotServerTest, APortInUseIsAClearError) {
  auto first = SnapshotServer::Start({{"127.0.0.1", 0, "x 1\n"}});
  ASSERT_TRUE(first.ok());
  auto second = SnapshotServer::Start({{"127.0.0.1", (*first)->ports()[0], "x 1\n"}});
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("cannot serve the final metrics on 127.0.0.1:"));
  EXPECT_FALSE(SnapshotServer::Start({{"not-an-ip", 0, ""}}).ok());
}

// An idle client costs the snapshot server a descriptor, not its attention: with 500
// connections open to one endpoint that never send a byte (fewer than its connection cap, so
// none is closed to make room), GET /metrics still answers 200 within a second. The server
// this replaced took one connection at a time and waited 2 s for each one's request. The
// second is an acceptance bound, not a measurement.
TEST(SnapshotServerTest, AnswersWithinASecondWithFiveHundredIdleConnectionsOpen) {
  constexpr size_t kIdle = 500;
  ASSERT_GE(parasync::testing::RaiseOpenFileLimit(), kIdle + 100)
      << "too few descriptors for the test";
  auto server = SnapshotServer::Start({{"127.0.0.1", 0, "a_metric 1\n"}});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->ports()[0];
  int wake[2];
  ASSERT_EQ(pipe(wake), 0);
  std::thread serving([&] { (*server)->ServeUntilReadable(wake[0]); });
  // Bounded in time too: a server that accepts slowly makes each connect wait.
  const auto opening = std::chrono::steady_clock::now();
  const auto give_up = opening + std::chrono::seconds(10);
  std::vector<parasync::testing::LoopbackConnection> idle;
  while (idle.size() < kIdle && std::chrono::steady_clock::now() < give_up) {
    idle.emplace_back(port);
    if (!idle.back().ok()) break;
  }
  std::printf("opened %zu idle connections in %lld ms\n", idle.size(),
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - opening)
                                         .count()));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string answer = parasync::testing::HttpExchange(
      port, parasync::testing::ScrapeRequest("/metrics"), std::chrono::seconds(1));
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - t0);
  std::printf("GET /metrics with %zu idle connections open: %s in %lld ms\n", idle.size(),
              answer.empty() ? "no answer" : "answered", static_cast<long long>(took.count()));
  EXPECT_TRUE(idle.size() == kIdle && idle.back().ok())
      << "only " << idle.size() << " of " << kIdle << " idle connections could be opened";
  EXPECT_THAT(answer, ::testing::StartsWith("HTTP/1.1 200 OK\r\n"))
      << "GET /metrics was not answered within 1 s with " << idle.size()
      << " idle connections open";
  EXPECT_THAT(answer, HasSubstr("\r\n\r\na_metric 1\n"));
  size_t closed = 0;
  for (parasync::testing::LoopbackConnection& c : idle) {
    closed += c.ClosedByServerWithin(std::chrono::milliseconds(0)) ? 1 : 0;
  }
  EXPECT_EQ(closed, 0u) << "the idle connections were not all open through the scrape";
  ASSERT_EQ(write(wake[1], "x", 1), 1);
  serving.join();
  close(wake[0]);
  close(wake[1]);
}

TEST(MetricsBindTest, LoopbackStaysLoopbackAndNamesListenEverywhere) {
  EXPECT_EQ(MetricsBindFor("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(MetricsBindFor("localhost"), "127.0.0.1");
  EXPECT_EQ(MetricsBindFor("10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(MetricsBindFor("node7.cluster"), "0.0.0.0");
}

}  // namespace
}  // namespace parasync::launch
