// Starting a child process: the one fork/exec of the project. The launcher's processes, its
// preflight probes and the tests' children all start here, so the rules a child must follow
// between fork and exec (only async-signal-safe calls, a clean signal state, not outliving
// its parent when asked) are written once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace parasync {

// Where one of a child's standard streams goes.
struct StreamTarget {
  enum class Kind { kInherit, kNull, kPipe, kFile };
  Kind kind = Kind::kInherit;
  std::string path;     // kFile
  bool append = false;  // kFile: append to it instead of truncating

  static StreamTarget Inherit() { return {}; }
  static StreamTarget Null() { return {Kind::kNull, {}, false}; }
  // stdin: the parent writes to Spawned::stdin_fd. stdout and stderr: the parent reads
  // Spawned::output_fd; when both are kPipe they share that one pipe, in order.
  static StreamTarget Pipe() { return {Kind::kPipe, {}, false}; }
  static StreamTarget File(std::string path, bool append = false) {
    return {Kind::kFile, std::move(path), append};
  }
};

struct SpawnOptions {
  // argv[0] is looked up in PATH unless it holds a '/'.
  std::vector<std::string> argv;
  // The child's environment: ours, less the variables named in env_unset (a name ending in
  // '*' is a prefix), plus env_set ("NAME=value", replacing ours of the same name).
  std::vector<std::string> env_set;
  std::vector<std::string> env_unset;
  StreamTarget in = StreamTarget::Null();
  StreamTarget out = StreamTarget::Inherit();
  StreamTarget err = StreamTarget::Inherit();
  // The signal the child gets when the thread that started it ends (PR_SET_PDEATHSIG); 0 for
  // none. A child started from a short-lived thread gets it when that thread ends.
  int parent_death_signal = 0;
  // The child leads a process group of its own (a terminal's Ctrl-C does not reach it).
  bool new_process_group = false;
  // Written to the child's stderr when exec fails (the child then exits 127); empty for
  // "cannot execute <argv[0]>".
  std::string exec_failure_line;
};

// A started child. The parent owns the descriptors (close-on-exec) and reaps the pid.
struct Spawned {
  pid_t pid = -1;
  int stdin_fd = -1;   // the write end of the child's stdin when `in` was kPipe
  int output_fd = -1;  // the read end of the child's stdout/stderr pipe when one was kPipe
};

// Starts the child. The child starts with every signal at its default and none blocked (also
// those a shell made the parent ignore, such as SIGQUIT for a background job).
// Unavailable when a pipe or the fork fails, NotFound when a kFile cannot be opened; nothing
// is left open then.
Result<Spawned> Spawn(const SpawnOptions& options);

// The path exec would run for `name`: itself if it holds a '/', else the first executable
// regular file of that name in $PATH (/bin:/usr/bin when unset, as execvp), else `name`
// unchanged. Unlike execvp, a file without a #! line is not handed to /bin/sh.
std::string FindExecutable(const std::string& name);

// A wait status as one number: the exit status, or 128 + the signal that ended the process.
int ExitCode(int wait_status);

// Waits up to `timeout` for our child `pid` to end; its wait status, or nullopt while it
// still runs (it is not killed).
std::optional<int> WaitForExit(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace parasync
