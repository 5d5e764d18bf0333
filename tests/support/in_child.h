// Running a piece of the test in a forked child (no exec): for what must not touch the test
// binary's own process state (namespaces, signal masks, a disk that fills up). Starting another
// program is process_util.h's Child, on common/subprocess.h; this is only for running our code.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include <gtest/gtest.h>

namespace parasync::testing {

// Runs `fn` in a forked copy of this process, which exits with what `fn` returns; blocks until
// it has. Returns the child's wait status, or -1 if the fork failed. `fn` runs in the forking
// thread's copy only: it may not wait on locks other threads held at the fork.
inline int RunInChild(const std::function<int()>& fn) {
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) _exit(fn());
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

// Expects `scenario` (a callable returning "" when it held, else what went wrong) to hold when
// run in a child made by a threadsafe death test; the child's message shows on failure.
#define EXPECT_IN_CHILD(scenario)                                                          \
  do {                                                                                     \
    GTEST_FLAG_SET(death_test_style, "threadsafe");                                        \
    EXPECT_EXIT(                                                                           \
        {                                                                                  \
          const std::string child_failed = (scenario)();                                   \
          std::fprintf(stderr, "%s\n",                                                     \
                       child_failed.empty() ? "scenario held" : child_failed.c_str());     \
          std::fflush(stderr);                                                             \
          std::_Exit(child_failed.empty() ? 0 : 1);                                        \
        },                                                                                 \
        ::testing::ExitedWithCode(0), "scenario held");                                    \
  } while (0)

}  // namespace parasync::testing
