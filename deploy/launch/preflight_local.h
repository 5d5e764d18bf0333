// What parasync-launch checks on this machine before it starts any process: the problems
// that would make a planned process exit with status 2 at once (data set missing or
// unreadable, a port in use, a --state-dir holding something else or another run's store),
// so that the launcher can say each in one line and start nothing.
//
// Multi-host runs check the other hosts with parasync-launch --check (Launcher::Preflight);
// these checks cover the processes planned for this machine only. Not thread-safe (it may
// start and wait for parasync-ps --check processes).
#pragma once

#include <string>
#include <vector>

#include "deploy/launch/launcher.h"

namespace parasync::launch {

// Returns one line per problem, each naming the flag and the path or port, empty when all is
// clear. `options` as given to Launcher::Create, `plan` its plan. Blocks while a parasync-ps
// --check inspects an existing store (it reads the whole store, bounded by 60 s).
std::vector<std::string> LocalPreflight(const LaunchOptions& options, const LaunchPlan& plan);

// The value of the last `--flag VALUE` or `--flag=VALUE` in `argv` for any of `names`
// (what the process will use, since our binaries take the last), or `fallback`.
std::string LastFlagValue(const std::vector<std::string>& argv,
                          const std::vector<std::string>& names, const std::string& fallback);

}  // namespace parasync::launch
