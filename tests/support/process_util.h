// Helpers for tests that run our real binaries as child processes: start one (on
// common/subprocess.h) with the output in a file, wait for its ready file (the ports it bound)
// or its exit with a bound, read files. Test-only code.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/ready_file.h"
#include "common/subprocess.h"
#include "tests/support/temp_dir.h"

namespace parasync::testing {

// The directory holding parasync-ps, parasync-worker and parasync-launch (PARASYNC_BIN_DIR).
std::string BinDir();
// Fashion-MNIST directory (PARASYNC_DATA_DIR or the Debian package's path).
std::string DataDir();
bool DataAvailable();

// A child process started by the test, through common/subprocess.h's Spawn. The destructor
// kills it (SIGKILL) if still running, so a failing test leaves nothing behind.
class Child {
 public:
  // Starts argv[0] (a path) with argv, stdout+stderr appended to `log_path`, and `env`
  // entries ("K=V") added to the environment.
  static Child Start(const std::vector<std::string>& argv, const std::string& log_path,
                     const std::vector<std::string>& env = {});
  // Starts `options` as given, except for the parent-death signal, which this sets: see
  // Start's definition. If the start fails it says why on stderr and pid() is -1.
  static Child Start(SpawnOptions options);
  Child(Child&& other) noexcept;
  Child& operator=(Child&&) = delete;
  ~Child();

  pid_t pid() const { return pid_; }
  // Waits up to `timeout` for the exit; returns the raw wait status (again on later calls),
  // or nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  void Signal(int sig);

 private:
  explicit Child(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::optional<int> status_;  // once reaped
};

// A server (parasync-ps) a test started and waited for: StartServing.
struct Serving {
  Child child;
  std::optional<ReadyInfo> ready;  // what its ready file said; nullopt: it did not serve
  std::string why;                 // then why, with its log
};

// Starts `argv` (parasync-ps and its flags: its own address on port 0, as a rule) with
// "--ready-file <log_path>.ready" added, its output appended to `log_path`, and waits up to
// 60 s until it serves. ready holds its address and metrics port; nullopt (and why) when it
// exited first or did not serve in time.
Serving StartServing(const std::vector<std::string>& argv, const std::string& log_path,
                     const std::vector<std::string>& env = {});

// Waits up to `timeout` for the ready file `child` was started to write (--ready-file PATH,
// common/ready_file.h): what it says, once written by this child (the pid matches). nullopt
// when the child exited first or the time ran out; then `why` (if given) says which.
std::optional<ReadyInfo> WaitReady(Child& child, const std::string& path,
                                   std::chrono::milliseconds timeout, std::string* why = nullptr);

// Exit code of a wait status; 128+signal when killed by a signal.
using ::parasync::ExitCode;

// What a command that ran to its end left: its exit code (-1 when it had to be killed after
// the timeout) and its stdout and stderr, apart.
struct Finished {
  int exit_code = -1;
  std::string out;
  std::string err;
  // The lines of `err` (without their newlines; a last line without one counts too).
  std::vector<std::string> ErrLines() const;
};

// Runs argv[0] (a path) with argv and `env` entries ("K=V") added to the environment, stdin
// from /dev/null, stdout and stderr into files of `dir`, until it exits or `timeout` passes
// (then SIGKILL). Blocks.
Finished RunToExit(const std::vector<std::string>& argv, const std::string& dir,
                   std::chrono::milliseconds timeout, const std::vector<std::string>& env = {});

// Waits up to `timeout` for `pred` to hold, checking every 20 ms.
bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout);

// Waits for `done` to hold while a running job moves on: `progress` reads a counter that
// changes while it does (a model version, a step count; nullopt when it cannot be read, which
// counts as no change). Gives up once the counter has not changed for `stall`, or at
// `deadline`, whichever comes first, so that a slow machine takes longer but only a stalled
// job fails. Checks every 100 ms. Returns "" when `done` held, or why it gave up ("no
// progress for 30 s at 1234", "the deadline passed at 5678").
std::string WaitWhileProgressing(const std::function<bool()>& done,
                                 const std::function<std::optional<int64_t>()>& progress,
                                 std::chrono::milliseconds stall,
                                 std::chrono::steady_clock::time_point deadline);

// True while a process with this pid exists and is not a zombie (a zombie whose other threads
// are still exiting counts as alive: they hold its files).
bool ProcessAlive(pid_t pid);

// How `pid` ended, while it is a zombie its parent has not reaped yet: its wait status
// (field 52 of /proc/<pid>/stat, as waitpid reports it). nullopt while it runs, once it
// is reaped, or when /proc cannot tell.
std::optional<int> ZombieWaitStatus(pid_t pid);

std::string ReadFile(const std::string& path);
// The non-empty lines of the file at `path` / of `text`, without their newlines.
std::vector<std::string> ReadLines(const std::string& path);
std::vector<std::string> NonEmptyLines(const std::string& text);

// GET http://127.0.0.1:port<path>; returns the whole response (status line, headers, body),
// or "" if the connection failed. Bounded by a 5 s socket timeout.
std::string HttpGet(int port, const std::string& path);

// "a,b,c" for {"a", "b", "c"}: a host list for --ps-hosts / --worker-hosts.
std::string JoinHosts(const std::vector<std::string>& hosts);

}  // namespace parasync::testing
