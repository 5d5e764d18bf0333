// What `parasync-ps --check` and `parasync-worker --check` report, and how: one line per
// fact, so parasync-launch --check can collect them over ssh from every host.
//
//   check version <BuildVersion()>
//   check problem <one line saying what is wrong and where>
//
// A process that finds no problem exits 0, else 1.
#pragma once

#include <string>
#include <vector>

namespace parasync {

// Empty when a TCP socket can bind host:port on this machine now, else why not, e.g.
// "port 5000 on 10.0.0.1 is in use" or "10.0.0.9 is not an address of this machine".
std::string BindProblem(const std::string& host, int port);

// Prints the version line and one line per problem to stdout; returns the exit code.
int ReportCheck(const std::vector<std::string>& problems);

// The prefixes of those lines.
inline constexpr const char* kCheckVersionPrefix = "check version ";
inline constexpr const char* kCheckProblemPrefix = "check problem ";

}  // namespace parasync
