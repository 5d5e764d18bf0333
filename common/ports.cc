#include "common/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

namespace parasync {

namespace {

// The first port of the kernel's ephemeral range (32768 when it cannot be read).
int EphemeralStart() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  int high = 0;
  if (range >> low >> high && low > 0) return low;
  return 32768;
}

// The ports below the ephemeral range, above the well-known and most registered service ports.
struct PortRange {
  int low;
  int high;
};
PortRange BelowEphemeral() {
  const int high = EphemeralStart() - 1;
  return {std::max(1024, std::min(20000, high - 4000)), high};
}

std::mt19937& Rng() {
  thread_local std::mt19937 rng(static_cast<unsigned>(getpid()) ^ std::random_device{}());
  return rng;
}

}  // namespace

Result<int> BindBelowEphemeral(const std::function<Result<bool>(int port)>& try_bind) {
  constexpr int kTries = 1000;
  const PortRange range = BelowEphemeral();
  if (range.high - range.low + 1 < kTries) {
    PARASYNC_ASSIGN_OR_RETURN(const bool bound, try_bind(0));
    if (!bound) return Status::Unavailable("no free port (the kernel found none)");
    return 0;
  }
  std::uniform_int_distribution<int> pick(range.low, range.high);
  std::vector<int> tried;
  while (static_cast<int>(tried.size()) < kTries) {
    const int port = pick(Rng());
    if (std::find(tried.begin(), tried.end(), port) != tried.end()) continue;
    tried.push_back(port);
    PARASYNC_ASSIGN_OR_RETURN(const bool bound, try_bind(port));
    if (bound) return port;
  }
  return Status::Unavailable("no free port among " + std::to_string(kTries) + " tried in " +
                             std::to_string(range.low) + "-" + std::to_string(range.high));
}

Result<BoundPorts> BindFreePorts(const std::string& host, int count) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  const auto [low, high] = BelowEphemeral();
  std::uniform_int_distribution<int> pick(low, std::max(low, high));
  std::mt19937& rng = Rng();
  BoundPorts out;
  auto fail = [&](const std::string& why) {
    for (int fd : out.fds) close(fd);
    return Status::Unavailable(why);
  };
  for (int tries = 0; static_cast<int>(out.ports.size()) < count && tries < 10000; ++tries) {
    const int port = pick(rng);
    if (std::find(out.ports.begin(), out.ports.end(), port) != out.ports.end()) continue;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail(std::string("socket: ") + std::strerror(errno));
    // No SO_REUSEADDR: while the fd is held nobody else can bind the port.
    address.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
      close(fd);
      continue;
    }
    out.ports.push_back(port);
    out.fds.push_back(fd);
  }
  if (static_cast<int>(out.ports.size()) < count) {
    return fail("found only " + std::to_string(out.ports.size()) + " of " +
                std::to_string(count) + " free ports in " + std::to_string(low) + "-" +
                std::to_string(high) + " on " + host);
  }
  return out;
}

std::vector<int> PickFreeLoopbackPorts(int count) {
  auto bound = BindFreePorts("127.0.0.1", count);
  if (!bound.ok()) {
    std::fprintf(stderr, "PickFreeLoopbackPorts: %s\n", bound.status().ToString().c_str());
    std::abort();
  }
  for (int fd : bound->fds) close(fd);
  return bound->ports;
}

}  // namespace parasync
