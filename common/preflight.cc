#include "common/preflight.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/version.h"

namespace parasync {

std::string BindProblem(const std::string& host, int port) {
  addrinfo hints{};
  // As the server binds (common/transport.cc, ToBindEndpoint): a name's IPv4 address;
  // only an IPv6 literal is checked as IPv6.
  hints.ai_family = host.find(':') != std::string::npos ? AF_INET6 : AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  const bool any = host.empty() || host == "*" || host == "0.0.0.0";
  const int rc = getaddrinfo(any ? nullptr : host.c_str(), port_text.c_str(), &hints, &found);
  if (rc != 0) return "cannot resolve " + host + ": " + gai_strerror(rc);
  std::string problem;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    // As ZeroMQ and civetweb bind: a port in TIME_WAIT is free.
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const int bound = bind(fd, a->ai_addr, a->ai_addrlen);
    const int error = errno;
    close(fd);
    if (bound == 0) {
      freeaddrinfo(found);
      return "";
    }
    if (error == EADDRINUSE) {
      problem = "port " + port_text + " on " + host + " is in use";
    } else if (error == EADDRNOTAVAIL) {
      problem = host + " is not an address of this machine (port " + port_text + ")";
    } else {
      problem = "cannot bind " + host + ":" + port_text + ": " + std::strerror(error);
    }
  }
  freeaddrinfo(found);
  return problem.empty() ? "cannot bind " + host + ":" + port_text : problem;
}

int ReportCheck(const std::vector<std::string>& problems) {
  std::printf("%s%s\n", kCheckVersionPrefix, BuildVersion().c_str());
  for (const std::string& p : problems) std::printf("%s%s\n", kCheckProblemPrefix, p.c_str());
  std::fflush(stdout);
  return problems.empty() ? 0 : 1;
}

}  // namespace parasync
