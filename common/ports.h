// Ports for servers on this machine: what a listening socket given port 0 binds, and free
// ports for the few callers that must know a port before its server starts.
//
// A port the kernel picks for a bind to port 0 comes from its ephemeral range
// (net.ipv4.ip_local_port_range, 32768-60999 by default) — the range outgoing connections
// take their source ports from. A server restarted on such a port can find it taken by an
// outgoing connection made meanwhile (a worker reconnecting to that very port can even be
// connected to itself: TCP's simultaneous open), and fail with "Address already in use" for
// as long as that connection lives. So parasync's listeners given port 0 bind a port picked
// at random below that range (BindBelowEphemeral): the bind itself is the reservation, so
// two servers starting side by side never collide, and the port stays safe to bind again.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace parasync {

// Binds a listener at a free port below the ephemeral range, the choice of port 0:
// `try_bind(port)` binds the caller's socket to `port` and returns true, false when the port
// is in use (EADDRINUSE), or an error for anything else, which ends the search. Ports are
// tried at random, each at most once, up to 1,000 of them. Returns the port bound;
// Unavailable when none was free; the error `try_bind` returned. Where the range below the
// ephemeral one is too small to pick from (under 1,000 ports), tries only port 0, the
// kernel's pick, and returns 0: the caller reads the port from its socket. Thread-safe.
Result<int> BindBelowEphemeral(const std::function<Result<bool>(int port)>& try_bind);

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
