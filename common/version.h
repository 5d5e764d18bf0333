// What a parasync build is: its release, wire protocol and schema. Every binary prints it
// for --version and --check, and parasync-launch --check compares it across hosts: processes
// of one cluster must agree on all three.
#pragma once

#include <string>

namespace parasync {

// "0.1.0 protocol 3 schema 1a2b3c4d5e6f": the project version, the wire protocol version
// (common/wire.h) and the first 12 hex digits of schema/parasync.fbs's SHA-256.
std::string BuildVersion();

// The three parts of BuildVersion(), e.g. {"0.1.0", "3", "1a2b3c4d5e6f"}: the labels of the
// parasync_build_info metric (common/process_metrics.h).
struct BuildIdentity {
  std::string version;
  std::string protocol;
  std::string schema;
};
BuildIdentity GetBuildIdentity();

// "<program> <BuildVersion()>".
std::string VersionLine(const std::string& program);

}  // namespace parasync
