// common/metrics.h and common/process_metrics.h: /healthz and /readyz from a loop's heartbeat,
// the process metrics, and the server that serves them over loopback HTTP.
#include "common/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/text_serializer.h>

#include "common/process_metrics.h"
#include "common/version.h"
#include "tests/support/http_client.h"
#include "tests/support/process_util.h"
#include "tests/support/prometheus_text.h"

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

TEST(ProcessCollectorTest, ReportsThisProcessAsTheClientLibrariesNameIt) {
  const std::string page = prometheus::TextSerializer().Serialize(ProcessCollector().Collect());
  auto value = [&](const std::string& name) {
    return testing::PrometheusValue(page, name).value_or(NAN);
  };
  ASSERT_TRUE(testing::PrometheusValue(page, "process_resident_memory_bytes")) << page;
  EXPECT_GT(value("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(value("process_virtual_memory_bytes"), value("process_resident_memory_bytes"));
  EXPECT_GE(value("process_cpu_seconds_total"), 0);
  // Started within the last hour, not in the future.
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(value("process_start_time_seconds"), now + 1);
  EXPECT_GT(value("process_start_time_seconds"), now - 3600);
  EXPECT_GE(value("process_open_fds"), 3);  // stdin, stdout, stderr
  EXPECT_GE(value("process_max_fds"), value("process_open_fds"));
  const BuildIdentity b = GetBuildIdentity();
  const testing::PrometheusLabels identity = {
      {"protocol", b.protocol}, {"schema", b.schema}, {"version", b.version}};
  const std::vector<testing::PrometheusSample> samples = testing::ParsePrometheusText(page);
  EXPECT_EQ(std::count_if(samples.begin(), samples.end(),
                          [&](const testing::PrometheusSample& s) {
                            return s.name == "parasync_build_info" && s.labels == identity;
                          }),
            1)
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
