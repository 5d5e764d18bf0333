// What parasync-launch checks before it starts any process, in two forms:
//  - LocalPreflight, before every start: the problems on this machine that would make a
//    planned process exit with status 2 at once (data set missing or unreadable, a port in
//    use, a --state-dir holding something else or another run's store), so that the
//    launcher can say each in one line and start nothing;
//  - ClusterPreflight, parasync-launch --check: every planned process's own --check, where
//    it would run (over ssh for other hosts).
// A --worker-command worker is never run by either: its data set only has to be a
// directory (when --dataset is given), and its metrics port and host are checked as far as
// the launcher can without our binary.
// Not thread-safe: both start and wait for child processes (common/subprocess.h).
#pragma once

#include <string>
#include <vector>

#include "deploy/launch/options.h"
#include "deploy/launch/plan.h"

namespace parasync::launch {

// Returns one line per problem, each naming the flag and the path or port, empty when all is
// clear. `options` as given to Launcher::Create, `plan` its plan. Blocks while a parasync-ps
// --check inspects an existing store (it reads the whole store, bounded by 60 s).
std::vector<std::string> LocalPreflight(const LaunchOptions& options, const LaunchPlan& plan);

// Runs every planned process's command with --check (over ssh for remote hosts, all at once,
// at most `timeout_seconds` in all) and returns one line per problem: a host that cannot be
// reached, a port in use or an address not on its host, missing data, or a binary whose
// version, protocol or schema differs from this launcher's. Empty: all clear. The ports the
// plan names must not be held by this process (they are the processes' to bind).
// A --worker-command worker is checked without running it: here, its --dataset directory and
// its metrics port (when it has a fixed one); on another host, over ssh, that the host
// answers and the --dataset directory is there (not its ports, nor the command, its version
// or the data's format).
std::vector<std::string> ClusterPreflight(const LaunchOptions& options, const LaunchPlan& plan,
                                          double timeout_seconds);

// The value of the last `--flag VALUE` or `--flag=VALUE` in `argv` for any of `names`
// (what the process will use, since our binaries take the last), or `fallback`.
std::string LastFlagValue(const std::vector<std::string>& argv,
                          const std::vector<std::string>& names, const std::string& fallback);

}  // namespace parasync::launch
