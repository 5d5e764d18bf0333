// parasync-launch as a library: everything a caller of the launcher needs, in one include.
// The parts live in their own headers:
//   options.h     LaunchOptions, the parsers of --kill and --ps/-H, ValidateOptions
//   plan.h        the plan (which process runs where, with which command line, over ssh for
//                 other hosts), ports, binaries, CURVE keys
//   preflight.h   the checks before a start (LocalPreflight) and --check (ClusterPreflight)
//   supervisor.h  Launcher: starts, supervises and stops the processes
//   report.h      exit codes, the wording of the launcher's lines, cluster.json,
//                 prometheus-targets.json, summary.json and the end-of-run text
#pragma once

#include "deploy/launch/options.h"
#include "deploy/launch/plan.h"
#include "deploy/launch/preflight.h"
#include "deploy/launch/report.h"
#include "deploy/launch/supervisor.h"
