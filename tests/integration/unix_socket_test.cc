// A server's unix socket (parasync-ps --ipc, a worker's --ps-ipc) against other users of the
// machine: the socket is made 0600 in a directory of the server's user that no one else may
// write (made 0700 where missing), a directory others may write is refused, a Shutdown over
// the socket is accepted from the server's user or root only (the peer's uid as the kernel
// gave it at connect: SO_PEERCRED), and a worker refuses a socket another user owns. The
// tests that act as another user (uid 65534, "nobody") need root, and skip without it.
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include "common/transport.h"
#include "tests/support/in_child.h"
#include "tests/support/process_util.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::TempDir;

constexpr uid_t kNobody = 65534;

unsigned Mode(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<unsigned>(st.st_mode & 07777) : 0u;
}

// parasync-ps with --ipc `socket` (and a TCP address on port 0), under the file mode mask
// `umask_text`, waited for until it serves.
testing::Serving StartWithUnixSocket(const TempDir& dir, const std::string& socket,
                                     const std::string& umask_text = "022") {
  const std::string command = "umask " + umask_text + " && exec \"$0\" \"$@\"";
  return testing::StartServing({"/bin/sh", "-c", command, testing::BinDir() + "/parasync-ps",
                                "--ps-hosts", "127.0.0.1:0", "--worker-hosts", "127.0.0.1:1",
                                "--task-index", "0", "--ipc", socket},
                               dir.path() + "/ps.log");
}

// A Shutdown sent to shard 0 over the unix socket `socket`: its status.
Status ShutdownOver(const std::string& socket) {
  zmq::context_t ctx;
  PsClientOptions o;
  o.ps_addresses = {"ipc://" + socket};
  o.rank = -1;
  o.request_timeout = 10s;
  auto client = PsClient::Connect(ctx, o);
  if (!client.ok()) return client.status();
  return (*client)->Shutdown(0);
}

TEST(UnixSocketTest, ItIsPrivateToTheServersUserWhoMayStopTheServerThroughIt) {
  TempDir dir;
  // A directory that does not exist yet, and a mask that would leave a socket open to all.
  const std::string socket = dir.path() + "/run/ps0.sock";
  testing::Serving server = StartWithUnixSocket(dir, socket, "000");
  ASSERT_TRUE(server.ready) << server.why;
  EXPECT_EQ(Mode(dir.path() + "/run"), 0700u);
  EXPECT_EQ(Mode(socket), 0600u);
  const Status stopped = ShutdownOver(socket);
  EXPECT_TRUE(stopped.ok()) << stopped.ToString();
  const auto status = server.child.Wait(20s);
  ASSERT_TRUE(status.has_value()) << "the server did not stop:\n" << server.why;
  EXPECT_EQ(ExitCode(*status), 0) << testing::ReadFile(dir.path() + "/ps.log");
  EXPECT_FALSE(std::filesystem::exists(socket)) << "the server left its socket behind";
}

TEST(UnixSocketTest, ADirectoryOtherUsersMayWriteIsRefusedWithOneLine) {
  TempDir dir;
  const std::string shared = dir.path() + "/shared";
  std::filesystem::create_directory(shared);
  std::filesystem::permissions(shared, std::filesystem::perms::all);  // 0777, as /tmp
  const testing::Finished run = testing::RunToExit(
      {testing::BinDir() + "/parasync-ps", "--ps-hosts", "127.0.0.1:0", "--worker-hosts",
       "127.0.0.1:1", "--task-index", "0", "--ipc", shared + "/ps0.sock"},
      dir.path(), 20s);
  EXPECT_EQ(run.exit_code, 2) << run.err;
  ASSERT_EQ(run.ErrLines().size(), 1u) << run.err;
  EXPECT_NE(run.err.find("--ipc " + shared + "/ps0.sock"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("writable by other users"), std::string::npos) << run.err;
  EXPECT_FALSE(std::filesystem::exists(shared + "/ps0.sock"));
}

// Root opens the socket to everyone (as a careless --ipc in a shared place would), so that
// another user can connect at all: its Shutdown is still refused, root's is accepted.
TEST(UnixSocketTest, AShutdownFromAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "acting as another user needs root";
  TempDir dir;
  const std::string socket = dir.path() + "/run/ps0.sock";
  testing::Serving server = StartWithUnixSocket(dir, socket);
  ASSERT_TRUE(server.ready) << server.why;
  ASSERT_EQ(chmod(dir.path().c_str(), 0711), 0);
  ASSERT_EQ(chmod((dir.path() + "/run").c_str(), 0711), 0);
  ASSERT_EQ(chmod(socket.c_str(), 0666), 0);
  // Forked, not re-executed: the child must reach this server. This process has no other
  // thread yet (its ZeroMQ context comes after).
  const int child = testing::RunInChild([&] {
    if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0) return 3;
    const Status s = ShutdownOver(socket);
    std::fprintf(stderr, "uid 65534's shutdown: %s\n", s.ToString().c_str());
    return s.code() == StatusCode::kFailedPrecondition &&
                   s.message().find("uid 65534") != std::string::npos
               ? 0
               : 1;
  });
  EXPECT_TRUE(WIFEXITED(child) && WEXITSTATUS(child) == 0)
      << "uid 65534's shutdown was not refused (wait status " << child << ")";
  EXPECT_FALSE(server.child.Wait(0ms).has_value()) << "another user stopped the server";
  EXPECT_TRUE(ShutdownOver(socket).ok());
  const auto status = server.child.Wait(20s);
  ASSERT_TRUE(status.has_value()) << "root could not stop the server";
  EXPECT_EQ(ExitCode(*status), 0);
}

// A socket (or its directory) that another user could have put there: the worker does not
// connect to it, whoever listens.
TEST(UnixSocketTest, AWorkerRefusesASocketAnotherUserOwns) {
  if (geteuid() != 0) GTEST_SKIP() << "a file of another user needs root";
  TempDir dir;
  const std::string socket = dir.path() + "/run/ps0.sock";
  testing::Serving server = StartWithUnixSocket(dir, socket);
  ASSERT_TRUE(server.ready) << server.why;
  ASSERT_EQ(chown(socket.c_str(), kNobody, kNobody), 0);
  const testing::Finished run = testing::RunToExit(
      {testing::BinDir() + "/parasync-worker", "--ps-hosts", server.ready->address,
       "--worker-hosts", "127.0.0.1:1", "--task-index", "0", "--ps-ipc", "0=" + socket,
       "--data", testing::DataDir(), "--epochs", "1", "--max-steps", "1", "--log-dir",
       dir.path()},
      dir.path(), 60s);
  EXPECT_EQ(run.exit_code, 2) << run.err;
  ASSERT_EQ(run.ErrLines().size(), 1u) << run.err;
  EXPECT_NE(run.err.find("belongs to uid 65534"), std::string::npos) << run.err;
}

TEST(UnixSocketTest, APeerUidIsReadOnlyFromAUnixSocketsPeerAddress) {
  EXPECT_EQ(UnixPeerUid("localhost:1000:1000:4242"), 1000u);
  EXPECT_EQ(UnixPeerUid(":0:0:1"), 0u);
  EXPECT_FALSE(UnixPeerUid("127.0.0.1").has_value());
  EXPECT_FALSE(UnixPeerUid("2001:db8::1:2:3").has_value());
  EXPECT_FALSE(UnixPeerUid("::1").has_value());
  EXPECT_FALSE(UnixPeerUid("").has_value());
  EXPECT_FALSE(UnixPeerUid("localhost:x:0:1").has_value());
}

}  // namespace
}  // namespace parasync
