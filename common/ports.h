// Ports for servers about to be started on this machine (the launcher, tests, benchmarks).
//
// A port the kernel picks for a bind to port 0 comes from its ephemeral range
// (net.ipv4.ip_local_port_range, 32768-60999 by default) — the range outgoing connections
// take their source ports from. Between choosing such a port and the server's bind, any
// outgoing connection on the machine (a worker's ZeroMQ connect, another test) may take it,
// and the server then fails with "Address already in use". These ports are picked at random
// below that range instead, each checked free by binding it.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace parasync {

struct BoundPorts {
  std::vector<int> ports;
  std::vector<int> fds;  // bound, not listening; closing one frees its port for the server
};

// Binds `count` distinct free ports on `host` (an IPv4 address; anything else means
// 127.0.0.1), chosen at random below the ephemeral range, and keeps them bound until the
// caller closes the fds. Unavailable when not enough free ports turn up in 10,000 tries.
Result<BoundPorts> BindFreePorts(const std::string& host, int count);

// For tests and tools: `count` such ports on 127.0.0.1, already freed again for the servers
// to bind. Aborts with the reason when there are not enough.
std::vector<int> PickFreeLoopbackPorts(int count);

}  // namespace parasync
