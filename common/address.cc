#include "common/address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace parasync {

namespace {

Status Bad(std::string_view flag, std::string_view text, const std::string& why) {
  return Status::InvalidArgument(std::string(flag) + " '" + std::string(text) + "' " + why);
}

bool IsIpv4(const std::string& host) {
  in_addr parsed{};
  // glibc's inet_pton takes exactly four decimal octets 0-255 and refuses leading zeros.
  return inet_pton(AF_INET, host.c_str(), &parsed) == 1;
}

std::string Unbracket(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::string(host);
}

std::string Lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// Empty when `host` is an address or a host name (CheckHost), else what is wrong with it,
// quoting it.
std::string HostProblem(std::string_view host) {
  const std::string quoted = "'" + std::string(host) + "'";
  if (host.empty()) return "'' is not a host (it is empty)";
  if (host.find(':') != std::string_view::npos) {
    in6_addr parsed{};
    const std::string bare = Unbracket(host);
    if (inet_pton(AF_INET6, bare.c_str(), &parsed) != 1) {
      return quoted + " is not an IPv6 address";
    }
    return "";
  }
  const std::string text(host);
  in_addr loose{};
  const bool numeric = host.find_first_not_of("0123456789.") == std::string_view::npos;
  if (numeric || inet_aton(text.c_str(), &loose) != 0) {
    // Digits and dots, or a form only inet_aton takes ("10.1", "0x7f.1", "017.0.0.1").
    if (IsIpv4(text)) return "";
    return quoted + " is not an IPv4 address (four decimal numbers 0-255 separated by dots)";
  }
  if (host.size() > 253) return quoted + " is not a host name (longer than 253)";
  std::string_view rest = host;
  if (rest.back() == '.') rest.remove_suffix(1);  // a fully qualified name's root
  while (true) {
    const size_t dot = rest.find('.');
    const std::string_view label = rest.substr(0, dot);
    if (label.empty() || label.size() > 63 || label.front() == '-' ||
        label.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                "0123456789-_") != std::string_view::npos) {
      return quoted +
             " is not a host name or IP address (labels of letters, digits, '-' and '_' "
             "separated by dots)";
    }
    if (dot == std::string_view::npos) break;
    rest.remove_prefix(dot + 1);
  }
  return "";
}

}  // namespace

Status CheckHost(std::string_view host, std::string_view flag) {
  const std::string problem = HostProblem(host);
  if (problem.empty()) return Status::Ok();
  return Status::InvalidArgument(std::string(flag) + " " + problem);
}

Result<HostPort> ParseHostPort(std::string_view text, std::string_view flag, PortRule rule) {
  HostPort out;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find("]:");
    if (close == std::string_view::npos) return Bad(flag, text, "is not [IPv6]:port");
    out.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0) return Bad(flag, text, "is not host:port");
    if (text.substr(0, colon).find(':') != std::string_view::npos) {
      return Bad(flag, text, "is not host:port (write an IPv6 address as [address]:port)");
    }
    out.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  if (out.host.empty()) return Bad(flag, text, "has no host");
  // "*": every interface, for an address to bind.
  if (!(out.host == "*" && rule == PortRule::kZeroAllowed)) {
    if (const std::string problem = HostProblem(out.host); !problem.empty()) {
      return Status::InvalidArgument(std::string(flag) + " '" + std::string(text) + "': " +
                                     problem);
    }
  }
  const int low = rule == PortRule::kNonZero ? 1 : 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), out.port);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || out.port < low ||
      out.port > 65535) {
    return Bad(flag, text,
               "has no valid port (" + std::to_string(low) + "-65535 after the last ':')");
  }
  return out;
}

Result<std::string> ResolveBindHost(std::string_view host, std::string_view flag) {
  if (host == "*") return std::string(host);
  PARASYNC_RETURN_IF_ERROR(CheckHost(host, flag));
  const std::string bare = Unbracket(host);
  in6_addr parsed{};
  if (IsIpv4(bare) || inet_pton(AF_INET6, bare.c_str(), &parsed) == 1) return bare;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(bare.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Bad(flag, host, std::string("does not resolve to an IPv4 address: ") +
                               gai_strerror(rc) + " (give an IP address)");
  }
  char ip[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, ip, sizeof(ip));
  freeaddrinfo(found);
  return std::string(ip);
}

Status CheckDistinctAddresses(const std::vector<std::string>& addresses, std::string_view flag,
                              PortRule rule) {
  std::vector<std::pair<std::string, std::string>> seen;  // (key, as given)
  for (const std::string& address : addresses) {
    PARASYNC_ASSIGN_OR_RETURN(HostPort parsed, ParseHostPort(address, flag, rule));
    if (parsed.port == 0) continue;  // each its own free port
    std::string host = Lower(parsed.host);
    if (host == "localhost" || host == "localhost.") host = "127.0.0.1";
    const std::string key = host + "|" + std::to_string(parsed.port);
    for (const auto& [other_key, other] : seen) {
      if (other_key == key) {
        return Status::InvalidArgument(
            std::string(flag) + " names one address twice: '" + other + "'" +
            (other == address ? "" : " and '" + address + "'") +
            " (each parameter server or worker needs an address of its own)");
      }
    }
    seen.emplace_back(key, address);
  }
  return Status::Ok();
}

}  // namespace parasync
