// Network addresses as flags and TF_CONFIG give them, checked in one place before any
// library reads them its own way (civetweb reads "999.1.1.1" as 231.1.1.1, inet_aton reads
// "10.1" as 10.0.0.1 and "0x7f.1" as 127.0.0.1). Every address flag of parasync-ps,
// parasync-worker, parasync-export and parasync-launch goes through these. Pure functions
// (ResolveBindHost asks the resolver); thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace parasync {

// OK for an IPv4 address in dotted-quad form (four decimal octets 0-255, no leading zeros),
// an IPv6 address (with or without brackets), or a host name (dot-separated labels of
// letters, digits, '-' and '_', none starting with '-', at most 63 characters each and 253
// in all; a name of digits and dots only is taken for an IPv4 address). InvalidArgument
// otherwise, one line naming `flag` and the text.
Status CheckHost(std::string_view host, std::string_view flag);

struct HostPort {
  std::string host;  // as given; an IPv6 address without its brackets
  int port = 0;
};

enum class PortRule {
  kNonZero,      // 1-65535: an address to connect to
  kZeroAllowed,  // 0-65535: an address to bind, 0 picking a free port
};

// Splits "host:port" ("[IPv6]:port" for IPv6) and checks the host (CheckHost; "*" too under
// kZeroAllowed) and the port (decimal, in the rule's range). InvalidArgument, one line
// naming `flag` and the text, otherwise.
Result<HostPort> ParseHostPort(std::string_view text, std::string_view flag, PortRule rule);

// The IP address to bind for `host` (an address flag of this process): "*" and IP
// addresses as they are (IPv6 without brackets), a host name resolved to its first IPv4
// address. InvalidArgument naming `flag` for a host CheckHost refuses or a name that does
// not resolve. May block on the resolver.
Result<std::string> ResolveBindHost(std::string_view host, std::string_view flag);

// InvalidArgument naming the first address that appears twice in `addresses` ("host:port",
// checked by ParseHostPort under `rule`; under kZeroAllowed port 0, "any free port", may
// appear any number of times), else OK. Host names compare without regard to case, and
// "localhost" is 127.0.0.1; other names are not resolved (what a name means can differ
// between the machines that read the list, and a lookup at startup can hang), so two
// different names of one machine are not caught.
Status CheckDistinctAddresses(const std::vector<std::string>& addresses, std::string_view flag,
                              PortRule rule = PortRule::kNonZero);

}  // namespace parasync
