// common/metrics.h and common/process_metrics.h: /healthz and /readyz from a loop's heartbeat,
// the process metrics, and the server that serves them over loopback HTTP.
#include "common/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <map>
#include <string>
#include <thread>

#include <prometheus/counter.h>
#include <prometheus/text_serializer.h>

#include "common/process_metrics.h"
#include "common/version.h"
#include "tests/support/http_client.h"
#include "tests/support/process_util.h"

namespace parasync {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(HealthzTest, OkBeforeTheFirstBeatButNotReady) {
  LoopHeartbeat loop;
  EXPECT_EQ(Healthz(loop, milliseconds(100)).status, 200);
  const HealthAnswer ready = Readyz(loop, milliseconds(100));
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, "not ready: the main loop has not started yet\n");
}

TEST(HealthzTest, OkAndReadyWhileTheLoopBeatsWithinTheBound) {
  LoopHeartbeat loop;
  loop.Beat();
  EXPECT_EQ(Healthz(loop, milliseconds(5000)).status, 200);
  EXPECT_EQ(Healthz(loop, milliseconds(5000)).body, "ok\n");
  EXPECT_EQ(Readyz(loop, milliseconds(5000)).status, 200);
}

TEST(HealthzTest, StaleLoopIs503WithOneLineNamingTheAge) {
  LoopHeartbeat loop;
  loop.Beat();
  std::this_thread::sleep_for(milliseconds(250));
  for (const HealthAnswer& a : {Healthz(loop, milliseconds(200)), Readyz(loop, milliseconds(200))}) {
    EXPECT_EQ(a.status, 503);
    // At least 0.25 s ago; how much more depends on the scheduler.
    EXPECT_THAT(a.body, StartsWith("unhealthy: the main loop last turned "));
    EXPECT_THAT(a.body, HasSubstr(" s ago (bound 0.2 s)\n"));
    EXPECT_EQ(a.body.find('\n'), a.body.size() - 1) << "one line: " << a.body;
  }
  loop.Beat();
  EXPECT_EQ(Healthz(loop, milliseconds(200)).status, 200);
}

// name -> value of the unlabelled samples (and of parasync_build_info) in a text page.
std::map<std::string, double> Samples(const std::string& page) {
  std::map<std::string, double> out;
  size_t start = 0;
  while (start < page.size()) {
    size_t end = page.find('\n', start);
    if (end == std::string::npos) end = page.size();
    const std::string line = page.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST(ProcessCollectorTest, ReportsThisProcessAsTheClientLibrariesNameIt) {
  const std::string page = prometheus::TextSerializer().Serialize(ProcessCollector().Collect());
  const auto s = Samples(page);
  ASSERT_EQ(s.count("process_resident_memory_bytes"), 1u) << page;
  EXPECT_GT(s.at("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(s.at("process_virtual_memory_bytes"), s.at("process_resident_memory_bytes"));
  EXPECT_GE(s.at("process_cpu_seconds_total"), 0);
  // Started within the last hour, not in the future.
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(s.at("process_start_time_seconds"), now + 1);
  EXPECT_GT(s.at("process_start_time_seconds"), now - 3600);
  EXPECT_GE(s.at("process_open_fds"), 3);  // stdin, stdout, stderr
  EXPECT_GE(s.at("process_max_fds"), s.at("process_open_fds"));
  const BuildIdentity b = GetBuildIdentity();
  EXPECT_EQ(s.count("parasync_build_info{protocol=\"" + b.protocol + "\",schema=\"" + b.schema +
                    "\",version=\"" + b.version + "\"}"),
            1u)
      << page;
}

TEST(MetricsServerTest, ServesTheRegistryProcessMetricsAndTheLoopsHealth) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("parasync_test_things_total").Help("Things").Register(*registry).Add({}).Increment(3);
  LoopHeartbeat loop;
  auto server = MetricsServer::Start("127.0.0.1", 0, registry, {.loop = &loop, .stale_after = milliseconds(300)});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();

  const std::string metrics = testing::HttpGet(port, "/metrics");
  EXPECT_THAT(metrics, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(metrics, HasSubstr("\nparasync_test_things_total 3\n"));
  EXPECT_THAT(metrics, HasSubstr("\nprocess_resident_memory_bytes "));
  EXPECT_THAT(metrics, HasSubstr("\nparasync_build_info{"));

  // Starting: alive, not ready.
  EXPECT_THAT(testing::HttpGet(port, "/healthz"), StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(testing::HttpGet(port, "/readyz"), StartsWith("HTTP/1.1 503 "));
  loop.Beat();
  const std::string ok = testing::HttpGet(port, "/healthz");
  EXPECT_THAT(ok, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(ok, ::testing::EndsWith("\r\n\r\nok\n"));
  EXPECT_THAT(testing::HttpGet(port, "/readyz"), StartsWith("HTTP/1.1 200 OK\r\n"));
  std::this_thread::sleep_for(milliseconds(400));
  const std::string stale = testing::HttpGet(port, "/healthz");
  EXPECT_THAT(stale, StartsWith("HTTP/1.1 503 Service Unavailable\r\n"));
  EXPECT_THAT(stale, HasSubstr("unhealthy: the main loop last turned"));
  EXPECT_THAT(testing::HttpGet(port, "/other"), HasSubstr(" 404 Not Found\r\n"));
}

TEST(MetricsServerTest, WithoutALoopHealthzIsNotServed) {
  auto server = MetricsServer::Start("127.0.0.1", 0, std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_THAT(testing::HttpGet((*server)->port(), "/healthz"), HasSubstr(" 404 Not Found\r\n"));
  EXPECT_THAT(testing::HttpGet((*server)->port(), "/metrics"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

// The bounds of options.http reach the server: a client silent past the head timeout is closed.
TEST(MetricsServerTest, ClosesAClientSilentPastTheHeadTimeout) {
  auto server = MetricsServer::Start("127.0.0.1", 0, std::make_shared<prometheus::Registry>(),
                                     {.http = {.head_timeout = milliseconds(200)}});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  testing::LoopbackConnection silent((*server)->port());
  EXPECT_TRUE(silent.ClosedByServerWithin(milliseconds(5000)));
  EXPECT_THAT(testing::HttpGet((*server)->port(), "/metrics"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

// As the binaries keep theirs: serving until the process exits.
TEST(MetricsServerTest, KeptUntilExitStillServes) {
  auto server = MetricsServer::Start("127.0.0.1", 0, std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();
  MetricsServer::KeepUntilExit(std::move(server).value());
  EXPECT_THAT(testing::HttpGet(port, "/metrics"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

}  // namespace
}  // namespace parasync
