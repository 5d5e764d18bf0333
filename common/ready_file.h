// The ready file: how a process started with port 0 tells whoever started it which ports it
// bound. parasync-ps and parasync-worker write one (--ready-file PATH) once they serve; the
// launcher, the tests and the tools that start them wait for it instead of picking ports in
// advance, so that any number of clusters can start side by side on one machine.
//
// The file is one JSON object, written whole (a temporary file and a rename), e.g.
//   {"role": "ps", "task_index": 1, "pid": 4242, "address": "127.0.0.1:24117",
//    "metrics_port": 23090}
// "address" is the host:port the server's socket bound (empty for a worker, which binds none);
// "metrics_port" the port of its /metrics. Plain functions; thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "common/status.h"

namespace parasync {

struct ReadyInfo {
  std::string role;  // "ps" or "worker"
  int task_index = 0;
  pid_t pid = 0;
  std::string address;  // host:port bound ("[v6]:port" for IPv6); "" for a worker
  int metrics_port = 0;
};

// Writes `info` to `path` atomically. Unavailable (naming the file) on an I/O error.
Status WriteReadyFile(const std::string& path, const ReadyInfo& info);

// Removes a ready file an earlier process left at `path`, so that a waiter never takes it for
// this one's (the pid tells them apart too). Ok when there was none. Unavailable when it
// exists and cannot be removed.
Status RemoveStaleReadyFile(const std::string& path);

// Reads the ready file at `path`. NotFound while it does not exist; Corruption when it is not
// a ready file (the reason named).
Result<ReadyInfo> ReadReadyFile(const std::string& path);

// Waits up to `timeout` for process `pid` (a child of this process, or any process) to write
// its ready file at `path`, polling every 20 ms: what it says. Unavailable when the process
// exited first (a child is not reaped: its parent's waitpid still sees how it ended) or the
// time ran out, the message saying which; Corruption for a file that is not a ready file.
// A file left by another process (another pid) counts as not yet written. Blocks.
Result<ReadyInfo> WaitForReadyFile(const std::string& path, pid_t pid,
                                   std::chrono::milliseconds timeout);

// "host:port" for a bound ZeroMQ endpoint ("tcp://host:port"); other endpoints as they are.
std::string AddressOfEndpoint(const std::string& endpoint);

}  // namespace parasync
