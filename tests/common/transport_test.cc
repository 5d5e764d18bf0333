#include "common/transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
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

}  // namespace
}  // namespace parasync
