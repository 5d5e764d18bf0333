#include "common/ports.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <set>

namespace parasync {
namespace {

// Binds a fresh socket to 127.0.0.1:port; returns errno (0 on success, the socket closed).
int TryBind(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const int rc = bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a));
  const int err = rc == 0 ? 0 : errno;
  close(fd);
  return err;
}

int EphemeralStart() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  range >> low;
  return low;
}

TEST(PortsTest, DistinctPortsBelowTheEphemeralRangeHeldUntilClosed) {
  auto bound = BindFreePorts("127.0.0.1", 20);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  ASSERT_EQ(bound->ports.size(), 20u);
  ASSERT_EQ(bound->fds.size(), 20u);
  EXPECT_EQ(std::set<int>(bound->ports.begin(), bound->ports.end()).size(), 20u);
  for (int port : bound->ports) {
    EXPECT_GE(port, 1024);
    EXPECT_LT(port, EphemeralStart()) << "an outgoing connection could take " << port;
    EXPECT_EQ(TryBind(port), EADDRINUSE) << "port " << port << " is not held";
  }
  for (int fd : bound->fds) close(fd);
  for (int port : bound->ports) EXPECT_EQ(TryBind(port), 0) << "port " << port << " not freed";
}

TEST(PortsTest, PickedLoopbackPortsAreFreeForTheServer) {
  const std::vector<int> ports = PickFreeLoopbackPorts(3);
  ASSERT_EQ(ports.size(), 3u);
  for (int port : ports) EXPECT_EQ(TryBind(port), 0) << port;
  auto none = BindFreePorts("127.0.0.1", 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->ports.empty());
}

TEST(PortsTest, BindBelowEphemeralSkipsPortsInUseAndTriesEachOnce) {
  std::set<int> tried;
  int calls = 0;
  auto bound = BindBelowEphemeral([&](int port) -> Result<bool> {
    EXPECT_TRUE(tried.insert(port).second) << "port " << port << " tried twice";
    return ++calls == 50;  // the first 49 are "in use"
  });
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_EQ(calls, 50);
  EXPECT_TRUE(tried.count(*bound));
  for (int port : tried) {
    EXPECT_GE(port, 1024);
    EXPECT_LT(port, EphemeralStart());
  }
}

TEST(PortsTest, BindBelowEphemeralGivesUpAfterAThousandPortsInUse) {
  int calls = 0;
  auto bound = BindBelowEphemeral([&](int) -> Result<bool> {
    ++calls;
    return false;
  });
  EXPECT_EQ(bound.status().code(), StatusCode::kUnavailable) << bound.status().ToString();
  EXPECT_EQ(calls, 1000);
}

TEST(PortsTest, BindBelowEphemeralStopsAtAnErrorOtherThanInUse) {
  int calls = 0;
  auto bound = BindBelowEphemeral([&](int) -> Result<bool> {
    ++calls;
    return Status::InvalidArgument("not an address of this machine");
  });
  EXPECT_EQ(bound.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace parasync
