#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string_view>
#include <thread>

extern char** environ;

namespace parasync {
namespace {

bool Unset(std::string_view entry, const std::vector<std::string>& names) {
  const std::string_view name = entry.substr(0, entry.find('='));
  for (const std::string& unset : names) {
    const bool prefix = !unset.empty() && unset.back() == '*';
    if (prefix ? name.starts_with(std::string_view(unset).substr(0, unset.size() - 1))
               : name == unset) {
      return true;
    }
  }
  return false;
}

std::vector<std::string> ChildEnvironment(const SpawnOptions& options) {
  std::vector<std::string> unset = options.env_unset;
  for (const std::string& entry : options.env_set) unset.push_back(entry.substr(0, entry.find('=')));
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (!Unset(*entry, unset)) environment.emplace_back(*entry);
  }
  environment.insert(environment.end(), options.env_set.begin(), options.env_set.end());
  return environment;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// The descriptors the child's stdin, stdout and stderr become, and the parent's ends of the
// pipes. Every descriptor is close-on-exec; the parent closes the child's side after fork.
struct Streams {
  int child[3] = {-1, -1, -1};
  int stdin_write = -1;
  int output_read = -1;

  void CloseChildSide() {
    if (child[2] == child[1]) child[2] = -1;  // stderr shares stdout's pipe
    for (int& fd : child) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  }
  void CloseAll() {
    CloseChildSide();
    if (stdin_write >= 0) close(stdin_write);
    if (output_read >= 0) close(output_read);
    stdin_write = output_read = -1;
  }
};

// A descriptor above stdin, stdout and stderr, so that installing one of the child's three
// cannot overwrite another (a parent started with one of them closed opens files there).
int AboveStdio(int fd) {
  if (fd < 0 || fd > STDERR_FILENO) return fd;
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  const int error = errno;
  close(fd);
  errno = error;
  return moved;
}

Status OpenStream(const StreamTarget& target, int index, Streams& streams) {
  int& fd = streams.child[index];
  switch (target.kind) {
    case StreamTarget::Kind::kInherit:
      return Status::Ok();
    case StreamTarget::Kind::kNull:
    case StreamTarget::Kind::kFile: {
      const std::string path = target.kind == StreamTarget::Kind::kNull ? "/dev/null" : target.path;
      const int flags = index == 0 ? O_RDONLY
                                   : O_WRONLY | O_CREAT | (target.append ? O_APPEND : O_TRUNC);
      fd = AboveStdio(open(path.c_str(), flags | O_CLOEXEC, 0644));
      if (fd < 0) return Status::NotFound(path + ": " + std::strerror(errno));
      return Status::Ok();
    }
    case StreamTarget::Kind::kPipe: {
      if (index == STDERR_FILENO && streams.output_read >= 0) {
        fd = streams.child[STDOUT_FILENO];  // one pipe for both, in order
        return Status::Ok();
      }
      int fds[2];
      if (pipe2(fds, O_CLOEXEC) != 0) {
        return Status::Unavailable(std::string("pipe2: ") + std::strerror(errno));
      }
      const int reader = AboveStdio(fds[0]);
      const int writer = AboveStdio(fds[1]);
      if (reader < 0 || writer < 0) {
        const int error = errno;
        if (reader >= 0) close(reader);
        if (writer >= 0) close(writer);
        return Status::Unavailable(std::string("pipe: ") + std::strerror(error));
      }
      fd = index == STDIN_FILENO ? reader : writer;
      (index == STDIN_FILENO ? streams.stdin_write : streams.output_read) =
          index == STDIN_FILENO ? writer : reader;
      return Status::Ok();
    }
  }
  return Status::Internal("unknown stream target");
}

// Makes `fd` the child's descriptor `target`, open across exec.
void Install(int fd, int target) {
  if (fd >= 0) dup2(fd, target);  // fd > 2 (AboveStdio): the copy is open across exec
}

// After fork, in the child: async-signal-safe calls only.
[[noreturn]] void RunChild(const SpawnOptions& options, const Streams& streams, pid_t parent,
                           const char* executable, char* const* argv, char* const* envp,
                           const std::string& failure_line) {
  for (int signal_number = 1; signal_number < NSIG; ++signal_number) {
    if (signal_number != SIGKILL && signal_number != SIGSTOP) signal(signal_number, SIG_DFL);
  }
  if (options.parent_death_signal != 0) {
    prctl(PR_SET_PDEATHSIG, options.parent_death_signal);
    if (getppid() != parent) _exit(127);
  }
  if (options.new_process_group) setpgid(0, 0);
  for (int index = 0; index < 3; ++index) Install(streams.child[index], index);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(executable, argv, envp);
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, failure_line.data(), failure_line.size());
  _exit(127);
}

}  // namespace

std::string FindExecutable(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return name;
  // execvp's default when PATH is unset.
  const char* path = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "/bin:/usr/bin";
  std::istringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    struct stat info {};
    if (stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
        access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return name;
}

Result<Spawned> Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return Status::InvalidArgument("no command to start");
  // Everything the child needs is built before fork.
  std::vector<std::string> args = options.argv;
  std::vector<std::string> environment = ChildEnvironment(options);
  const std::vector<char*> argv = Pointers(args);
  const std::vector<char*> envp = Pointers(environment);
  const std::string executable = FindExecutable(args[0]);
  const std::string failure_line = options.exec_failure_line.empty()
                                       ? "cannot execute " + args[0] + "\n"
                                       : options.exec_failure_line + "\n";
  Streams streams;
  const StreamTarget* targets[3] = {&options.in, &options.out, &options.err};
  for (int index = 0; index < 3; ++index) {
    if (Status opened = OpenStream(*targets[index], index, streams); !opened.ok()) {
      streams.CloseAll();
      return opened;
    }
  }
  // No handler of ours may run in the child before it resets them.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &previous);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    RunChild(options, streams, parent, executable.c_str(), argv.data(), envp.data(), failure_line);
  }
  const int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  streams.CloseChildSide();
  if (pid < 0) {
    streams.CloseAll();
    return Status::Unavailable(std::string("fork: ") + std::strerror(fork_errno));
  }
  return Spawned{pid, streams.stdin_write, streams.output_read};
}

int ExitCode(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

std::optional<int> WaitForExit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t reaped = waitpid(pid, &status, WNOHANG);
    if (reaped == pid) return status;
    if (reaped < 0 && errno != EINTR) return std::nullopt;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace parasync
