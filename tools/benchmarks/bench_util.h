// What the process-starting benchmarks (bench_durability.cc, load.cc) share: a child process
// with its output in a log file, started by common/subprocess.h's Spawn. Their ports come from
// common/ports.h.
#pragma once

#include <sys/types.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/subprocess.h"

namespace parasync::bench {

// Starts argv[0] (a path) with stdout and stderr to `log` (emptied first); returns its pid (-1
// if it could not be started; exit status 127 if it could not be executed).
inline pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  std::ofstream(log, std::ios::trunc).close();
  SpawnOptions options;
  options.argv = argv;
  options.in = StreamTarget::Inherit();
  options.out = StreamTarget::File(log, /*append=*/true);
  options.err = StreamTarget::File(log, /*append=*/true);
  Result<Spawned> spawned = ::parasync::Spawn(options);
  return spawned.ok() ? spawned->pid : -1;
}

}  // namespace parasync::bench
