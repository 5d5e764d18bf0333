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

}  // namespace

Result<BoundPorts> BindFreePorts(const std::string& host, int count) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  // Below the ephemeral range, above the well-known and most registered service ports.
  const int high = EphemeralStart() - 1;
  const int low = std::max(1024, std::min(20000, high - 4000));
  thread_local std::mt19937 rng(static_cast<unsigned>(getpid()) ^ std::random_device{}());
  std::uniform_int_distribution<int> pick(low, std::max(low, high));
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
