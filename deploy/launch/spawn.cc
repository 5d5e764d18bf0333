#include "deploy/launch/spawn.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace parasync {

Result<OutputPipe> StartWithOutputPipe(const std::vector<std::string>& command) {
  if (command.empty()) return Status::InvalidArgument("no command to start");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return Status::Unavailable(std::string("pipe2: ") + std::strerror(errno));
  }
  // Built before fork: the child only calls async-signal-safe functions.
  std::vector<std::string> copy = command;
  std::vector<char*> args;
  for (std::string& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  const std::string failed = "cannot execute " + command[0] + "\n";
  const pid_t pid = fork();
  if (pid == 0) {
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execvp(args[0], args.data());
    [[maybe_unused]] ssize_t n = write(STDERR_FILENO, failed.data(), failed.size());
    _exit(127);
  }
  const int fork_errno = errno;
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return Status::Unavailable(std::string("fork: ") + std::strerror(fork_errno));
  }
  return OutputPipe{pid, fds[0]};
}

}  // namespace parasync
