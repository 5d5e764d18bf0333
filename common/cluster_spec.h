// ClusterSpec: which processes make up the cluster and which one this is.
//
// Comes from flags and/or the TF_CONFIG environment variable in TensorFlow's format:
//   {"cluster": {"ps": ["h:p", ...], "worker": ["h:p", ...]},
//    "task": {"type": "ps"|"worker", "index": N}}
// TensorFlow's "chief" becomes worker 0 (the chief here) and its "worker" i becomes worker
// i+1. Flags win over TF_CONFIG field by field. Plain values; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace parasync {

struct ClusterSpec {
  std::vector<std::string> ps;       // "host:port" of each parameter-server shard
  std::vector<std::string> workers;  // "host:port" of each worker (rank = index)
  std::string task_type;             // "ps" or "worker"
  int task_index = 0;
};

// What the flags said; unset optionals fall back to TF_CONFIG.
struct ClusterFlags {
  std::optional<std::string> ps_hosts;      // comma-separated
  std::optional<std::string> worker_hosts;  // comma-separated
  std::optional<int> task_index;
};

// Parses a TF_CONFIG JSON text. InvalidArgument with the reason for malformed JSON or
// fields of the wrong type.
Result<ClusterSpec> ParseTfConfig(const std::string& json);

// Merges flags over `tf_config` (the env value, or nullopt when unset) for a process of
// `task_type`. Checks: at least one PS and one worker, every address "host:port" with a
// valid host and a port in 1..65535 (ParseHostPort; for a "ps" task the PS list may hold
// port 0, "any free port": a server binds only its own), no address twice in a list
// (CheckDistinctAddresses), task_index within its role's list, TF_CONFIG's task type (if given)
// equal to `task_type` unless --task-index was given (the flag then names this task).
// InvalidArgument naming the problem otherwise.
Result<ClusterSpec> ResolveClusterSpec(const ClusterFlags& flags,
                                       const std::optional<std::string>& tf_config,
                                       const std::string& task_type);

// ResolveClusterSpec with the TF_CONFIG environment variable of this process.
Result<ClusterSpec> ResolveClusterSpecFromEnvironment(const ClusterFlags& flags,
                                                      const std::string& task_type);

// Splits "a,b,c" (empty items dropped, whitespace trimmed).
std::vector<std::string> SplitHostList(const std::string& text);

}  // namespace parasync
