// Starting a process whose output the launcher reads: the one fork/exec of the preflight
// probes (the launcher's --check over ssh, the local preflight's parasync-ps --check).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace parasync {

// A started process and the read end of the pipe its stdout and stderr go to.
struct OutputPipe {
  pid_t pid = -1;
  int fd = -1;  // close-on-exec; the caller reads and closes it, and reaps pid
};

// Starts `command` (command[0] is looked up in PATH unless it holds a '/') with stdin from
// /dev/null and stdout + stderr into one pipe. A command that cannot be executed prints
// "cannot execute <command[0]>" into the pipe and exits 127. Unavailable when the pipe or
// the fork fails (nothing is left open then).
Result<OutputPipe> StartWithOutputPipe(const std::vector<std::string>& command);

}  // namespace parasync
