#include "common/transport.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace parasync {
namespace {

using namespace std::chrono_literals;

TEST(TransportTest, BindEndpointResolvesHostNamesToAnAddress) {
  // ZeroMQ cannot bind "localhost"; it must become an IP address.
  Result<std::string> e = ToBindEndpoint("localhost:5000");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(*e, "tcp://127.0.0.1:5000");
  EXPECT_EQ(*ToBindEndpoint("10.1.2.3:7"), "tcp://10.1.2.3:7");
  EXPECT_EQ(*ToBindEndpoint("*:7"), "tcp://*:7");
  EXPECT_EQ(*ToBindEndpoint("tcp://0.0.0.0:9"), "tcp://0.0.0.0:9");
}

TEST(TransportTest, BindEndpointOfUnresolvableOrMalformedAddressIsInvalidArgument) {
  EXPECT_EQ(ToBindEndpoint("no-such-host.invalid:5000").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ToBindEndpoint("5000").status().code(), StatusCode::kInvalidArgument);
}

TEST(TransportTest, LoopbackAddressesAreRecognised) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackAddress("127.3.4.5"));
  EXPECT_TRUE(IsLoopbackAddress("::1"));
  EXPECT_TRUE(IsLoopbackAddress("::ffff:127.0.0.1"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackAddress("1270.0.0.1x"));
  EXPECT_FALSE(IsLoopbackAddress(""));
}

TEST(TransportTest, ServerSeesPeerAddressAndRepliesReachTheClient) {
  zmq::context_t ctx;
  auto server = Socket::Bind(ctx, "tcp://127.0.0.1:*");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = Socket::Connect(ctx, (*server)->LastEndpoint());
  ASSERT_TRUE(client.ok());
  Header h;
  h.type = MsgType::kStats;
  h.request_id = 42;
  ASSERT_TRUE((*client)->Send(nullptr, h, {}).ok());
  auto in = (*server)->Receive(5s);
  ASSERT_TRUE(in.ok() && in->has_value());
  Inbound& msg = **in;
  ASSERT_TRUE(msg.header.ok());
  EXPECT_EQ(msg.header->request_id, 42u);
  EXPECT_EQ(msg.peer_address, "127.0.0.1");
  Header reply;
  reply.request_id = 42;
  reply.status = Status::NotFound("nothing here");
  ASSERT_TRUE((*server)->Send(&msg.identity, reply, {}).ok());
  auto back = (*client)->Receive(5s);
  ASSERT_TRUE(back.ok() && back->has_value());
  ASSERT_TRUE((**back).header.ok());
  EXPECT_EQ((**back).header->status.code(), StatusCode::kNotFound);
  EXPECT_EQ((**back).header->status.message(), "nothing here");
}

TEST(TransportTest, MessageWithTooManyFramesIsCorruptionAndTheNextOneStillArrives) {
  zmq::context_t ctx;
  SocketOptions options;
  options.max_frames = 4;
  auto server = Socket::Bind(ctx, "tcp://127.0.0.1:*", options);
  ASSERT_TRUE(server.ok());
  auto client = Socket::Connect(ctx, (*server)->LastEndpoint());
  ASSERT_TRUE(client.ok());
  Header h;
  h.type = MsgType::kPush;
  std::vector<zmq::message_t> frames;
  for (int i = 0; i < 10; ++i) frames.emplace_back(4);
  ASSERT_TRUE((*client)->Send(nullptr, h, std::move(frames)).ok());
  std::vector<zmq::message_t> ok_frames;
  for (int i = 0; i < 4; ++i) ok_frames.emplace_back(4);
  ASSERT_TRUE((*client)->Send(nullptr, h, std::move(ok_frames)).ok());

  auto first = (*server)->Receive(5s);
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ((**first).header.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE((**first).frames.empty());
  auto second = (*server)->Receive(5s);
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_TRUE((**second).header.ok());
  EXPECT_EQ((**second).frames.size(), 4u);
}

TEST(TransportTest, BindingAnAddressInUseIsUnavailable) {
  zmq::context_t ctx;
  auto first = Socket::Bind(ctx, "tcp://127.0.0.1:*");
  ASSERT_TRUE(first.ok());
  auto second = Socket::Bind(ctx, (*first)->LastEndpoint());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
}

// The kernel's own pick for port 0 is a port of its ephemeral range, where outgoing
// connections take theirs: one made while a server is down can hold its port when it comes
// back (common/ports.h). Port 0 and ZeroMQ's "*" bind below that range instead.
TEST(TransportTest, PortZeroBindsDistinctFreePortsBelowTheEphemeralRange) {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int ephemeral_start = 32768;
  range >> ephemeral_start;
  zmq::context_t ctx;
  std::vector<std::unique_ptr<Socket>> sockets;
  std::vector<int> ports;
  for (const char* endpoint : {"tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "tcp://127.0.0.1:*"}) {
    auto bound = Socket::Bind(ctx, endpoint);
    ASSERT_TRUE(bound.ok()) << bound.status().ToString();
    const std::string last = (*bound)->LastEndpoint();
    const int port = std::stoi(last.substr(last.rfind(':') + 1));
    EXPECT_GT(port, 1023) << last;
    EXPECT_LT(port, ephemeral_start) << last;
    for (int other : ports) EXPECT_NE(port, other);
    ports.push_back(port);
    sockets.push_back(std::move(bound).value());
  }
}

}  // namespace
}  // namespace parasync

namespace parasync {
namespace {

// A worker started beside its server on another host (parasync-launch over ssh starts both
// at once) may look for the socket's directory before the server made it: it waits for it,
// up to the bound, then checks it as always.
TEST(TransportTest, AClientWaitsForTheSocketsDirectoryWithinItsBound) {
  char pattern[] = "/tmp/parasync-transport-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string parent = pattern;
  const std::string dir = parent + "/run";
  const std::string path = dir + "/ps0.sock";
  Result<std::string> now = IpcEndpoint(path, "--ps-ipc", IpcSide::kClient);
  ASSERT_FALSE(now.ok());
  EXPECT_NE(now.status().message().find("no directory " + dir), std::string::npos);
  const auto start = std::chrono::steady_clock::now();
  Result<std::string> still = IpcEndpoint(path, "--ps-ipc", IpcSide::kClient,
                                          std::chrono::milliseconds(200));
  EXPECT_FALSE(still.ok());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));

  std::thread maker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  });
  Result<std::string> waited = IpcEndpoint(path, "--ps-ipc", IpcSide::kClient,
                                           std::chrono::milliseconds(10000));
  maker.join();
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(*waited, "ipc://" + path);
  // A directory that appears but is not private is refused as before.
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  EXPECT_FALSE(IpcEndpoint(path, "--ps-ipc", IpcSide::kClient, std::chrono::milliseconds(100)).ok());
  std::filesystem::remove_all(parent);
}

}  // namespace
}  // namespace parasync
