#include "common/subprocess.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Reads the pipe to its end (the child closed it by exiting).
std::string Drain(int fd) {
  std::string text;
  char buffer[256];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) text.append(buffer, n);
  close(fd);
  return text;
}

int RunToEnd(const Spawned& child) {
  const std::optional<int> status = WaitForExit(child.pid, 10s);
  EXPECT_TRUE(status.has_value()) << "the child did not end within 10 s";
  if (!status) {
    kill(child.pid, SIGKILL);
    waitpid(child.pid, nullptr, 0);
    return -1;
  }
  return ExitCode(*status);
}

TEST(SpawnTest, StdoutAndStderrShareOnePipeInOrder) {
  SpawnOptions options;
  options.argv = {"sh", "-c", "echo one; echo two >&2; echo three"};
  options.out = options.err = StreamTarget::Pipe();
  Result<Spawned> child = Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  ASSERT_GE(child->output_fd, 0);
  EXPECT_EQ(child->stdin_fd, -1);
  EXPECT_EQ(Drain(child->output_fd), "one\ntwo\nthree\n");
  EXPECT_EQ(RunToEnd(*child), 0);
}

TEST(SpawnTest, FilesAreTruncatedOrAppendedAndStdinCanBeAPipe) {
  TempDir dir;
  { std::ofstream(dir.File("out")) << "old\n"; }
  { std::ofstream(dir.File("err")) << "kept\n"; }
  SpawnOptions options;
  options.argv = {"sh", "-c", "cat; echo to-err >&2; exit 3"};
  options.in = StreamTarget::Pipe();
  options.out = StreamTarget::File(dir.File("out"));
  options.err = StreamTarget::File(dir.File("err"), /*append=*/true);
  Result<Spawned> child = Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  ASSERT_GE(child->stdin_fd, 0);
  const std::string input = "through stdin\n";
  ASSERT_EQ(write(child->stdin_fd, input.data(), input.size()), static_cast<ssize_t>(input.size()));
  close(child->stdin_fd);
  EXPECT_EQ(RunToEnd(*child), 3);
  EXPECT_EQ(Slurp(dir.File("out")), "through stdin\n");
  EXPECT_EQ(Slurp(dir.File("err")), "kept\nto-err\n");
}

TEST(SpawnTest, EnvironmentIsOursLessTheUnsetPlusTheSet) {
  ASSERT_EQ(setenv("PARASYNC_SPAWN_KEPT", "k", 1), 0);
  ASSERT_EQ(setenv("PARASYNC_SPAWN_DROP_A", "a", 1), 0);
  ASSERT_EQ(setenv("PARASYNC_SPAWN_REPLACED", "old", 1), 0);
  SpawnOptions options;
  options.argv = {"sh", "-c", "env | grep '^PARASYNC_SPAWN_' | sort"};
  options.env_unset = {"PARASYNC_SPAWN_DROP_*"};
  options.env_set = {"PARASYNC_SPAWN_REPLACED=new", "PARASYNC_SPAWN_ADDED=1"};
  options.out = StreamTarget::Pipe();
  Result<Spawned> child = Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(Drain(child->output_fd),
            "PARASYNC_SPAWN_ADDED=1\nPARASYNC_SPAWN_KEPT=k\nPARASYNC_SPAWN_REPLACED=new\n");
  EXPECT_EQ(RunToEnd(*child), 0);
}

TEST(SpawnTest, AnUnrunnableCommandSaysSoAndExits127) {
  SpawnOptions options;
  options.argv = {"/nonexistent/parasync-no-such-binary"};
  options.err = StreamTarget::Pipe();
  options.exec_failure_line = "test: cannot execute it";
  Result<Spawned> child = Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(Drain(child->output_fd), "test: cannot execute it\n");
  EXPECT_EQ(RunToEnd(*child), 127);
}

TEST(SpawnTest, AFileThatCannotBeOpenedIsAnErrorBeforeAnyFork) {
  SpawnOptions options;
  options.argv = {"true"};
  options.out = StreamTarget::File("/nonexistent/dir/out");
  Result<Spawned> child = Spawn(options);
  ASSERT_FALSE(child.ok());
  EXPECT_NE(child.status().ToString().find("/nonexistent/dir/out"), std::string::npos)
      << child.status().ToString();
}

// The child starts clean even when the parent blocks or ignores signals (the binaries block
// their shutdown signals in every thread; the launcher ignores SIGPIPE).
TEST(SpawnTest, TheChildStartsWithDefaultSignalsAndNoneBlocked) {
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigset_t previous;
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &previous), 0);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction old_action {};
  ASSERT_EQ(sigaction(SIGTERM, &ignore, &old_action), 0);
  SpawnOptions options;
  options.argv = {"sleep", "30"};
  Result<Spawned> child = Spawn(options);
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  sigaction(SIGTERM, &old_action, nullptr);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  ASSERT_EQ(kill(child->pid, SIGTERM), 0);
  EXPECT_EQ(RunToEnd(*child), 128 + SIGTERM);
}

TEST(SpawnTest, WaitForExitGivesUpAtTheBoundWithoutKilling) {
  SpawnOptions options;
  options.argv = {"sleep", "30"};
  Result<Spawned> child = Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_FALSE(WaitForExit(child->pid, 50ms).has_value());
  EXPECT_EQ(kill(child->pid, 0), 0) << "the child should still run";
  kill(child->pid, SIGKILL);
  EXPECT_EQ(RunToEnd(*child), 128 + SIGKILL);
}

TEST(FindExecutableTest, LooksInPathOnlyForBareNames) {
  EXPECT_EQ(FindExecutable("./relative"), "./relative");
  EXPECT_EQ(FindExecutable("parasync-no-such-binary"), "parasync-no-such-binary");
  const std::string sh = FindExecutable("sh");
  EXPECT_EQ(sh.front(), '/') << sh;
  EXPECT_EQ(access(sh.c_str(), X_OK), 0) << sh;
}

TEST(FindExecutableTest, WithoutPathLooksWhereExecvpWould) {
  const char* saved = std::getenv("PATH");
  const std::string path = saved != nullptr ? saved : "";
  ASSERT_EQ(unsetenv("PATH"), 0);
  const std::string sh = FindExecutable("sh");
  if (saved != nullptr) setenv("PATH", path.c_str(), 1);
  EXPECT_TRUE(sh == "/bin/sh" || sh == "/usr/bin/sh") << sh;
}

}  // namespace
}  // namespace parasync
