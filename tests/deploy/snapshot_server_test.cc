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

TEST(MetricsBindTest, LoopbackStaysLoopbackAndNamesListenEverywhere) {
  EXPECT_EQ(MetricsBindFor("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(MetricsBindFor("localhost"), "127.0.0.1");
  EXPECT_EQ(MetricsBindFor("10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(MetricsBindFor("node7.cluster"), "0.0.0.0");
}

}  // namespace
}  // namespace parasync::launch
