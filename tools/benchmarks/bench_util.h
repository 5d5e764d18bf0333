// What the process-starting benchmarks (bench_durability.cc, load.cc) share: a child process
// with its output in a log file. Their ports come from common/ports.h.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace parasync::bench {

// Starts argv[0] (a path) with stdout and stderr to `log`; returns its pid (-1 if fork
// failed; exit status 127 if it could not be executed).
inline pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (FILE* f = std::freopen(log.c_str(), "w", stdout)) (void)f;
    dup2(STDOUT_FILENO, STDERR_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

}  // namespace parasync::bench
