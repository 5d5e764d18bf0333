// What the server tests (server_test.cc, server_shards_test.cc, server_modes_test.cc) share:
// a small model and its gradients, a raw DEALER peer, a client, and two shards with a client
// registered on them. The servers themselves are tests/support/in_process_server.h.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/wire.h"
#include "ps/server.h"
#include "ps/shard.h"
#include "tests/support/in_process_server.h"
#include "tests/support/small_model.h"
#include "worker/ps_client.h"

namespace parasync::server_test {

using testing::InProcessServer;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

inline constexpr milliseconds kWait{5000};  // bound on every wait
inline constexpr float kLearningRate = 0.5f;

inline bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A 20x10 kernel in four 50-element slices and a 10-element bias, trained with SGD.
inline ModelRegistration SmallModel(int num_shards) {
  return testing::SmallModel(
      testing::DenseLayer("dense", 20, 10, 0.1f, {InitKind::kConstant, 0.25f}),
      /*max_slice_elements=*/50, num_shards, /*seed=*/99, kLearningRate);
}

inline std::vector<std::vector<float>> InitialValues(const ModelRegistration& reg) {
  std::vector<std::vector<float>> out;
  for (uint32_t v = 0; v < reg.variables.size(); ++v) {
    std::vector<float> values(static_cast<size_t>(reg.variables[v].num_elements()));
    InitializeElements(reg.variables[v].init, reg.seed, v, 0, values.data(),
                       static_cast<int64_t>(values.size()));
    out.push_back(std::move(values));
  }
  return out;
}

inline std::vector<std::vector<float>> Gradients(const ModelRegistration& reg) {
  std::vector<std::vector<float>> out;
  for (const VariableSpec& v : reg.variables) {
    std::vector<float> g(static_cast<size_t>(v.num_elements()));
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
    out.push_back(std::move(g));
  }
  return out;
}

template <typename T>
std::vector<T*> Pointers(std::vector<std::vector<float>>& arrays) {
  std::vector<T*> out;
  for (auto& a : arrays) out.push_back(a.data());
  return out;
}

// A raw DEALER that sends whatever bytes it is given, with bounded sends and receives.
class RawPeer {
 public:
  RawPeer(zmq::context_t& context, const std::string& endpoint)
      : socket_(context, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::rcvtimeo, static_cast<int>(kWait.count()));
    socket_.set(zmq::sockopt::sndtimeo, static_cast<int>(kWait.count()));
    socket_.connect(endpoint);
  }

  void Send(const std::vector<std::vector<uint8_t>>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      zmq::message_t m(frames[i].data(), frames[i].size());
      ASSERT_TRUE(socket_.send(m, flags).has_value()) << "send timed out";
    }
  }

  void SendHeader(const Header& h, std::vector<std::vector<uint8_t>> tensors = {}) {
    std::vector<std::vector<uint8_t>> frames;
    frames.reserve(tensors.size() + 1);
    frames.push_back(EncodeHeader(h));
    for (std::vector<uint8_t>& t : tensors) frames.push_back(std::move(t));
    Send(frames);
  }

  // The reply's decoded header (TimedOut if none came); *frames gets the tensor frames.
  Result<Header> Receive(std::vector<std::vector<uint8_t>>* frames = nullptr) {
    std::vector<zmq::message_t> parts;
    for (;;) {
      zmq::message_t part;
      if (!socket_.recv(part, zmq::recv_flags::none)) return Status::TimedOut("no reply");
      const bool more = part.more();
      parts.push_back(std::move(part));
      if (!more) break;
    }
    if (frames != nullptr) {
      frames->clear();
      for (size_t i = 1; i < parts.size(); ++i) {
        const auto* p = static_cast<const uint8_t*>(parts[i].data());
        frames->emplace_back(p, p + parts[i].size());
      }
    }
    return DecodeHeader(parts[0].data(), parts[0].size());
  }

 private:
  zmq::socket_t socket_;
};

inline std::vector<uint8_t> FloatBytes(const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(float));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

inline std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng() & 0xff);
  return out;
}

inline std::unique_ptr<PsClient> ConnectClient(zmq::context_t& context,
                                               const std::vector<std::string>& addresses,
                                               int copy_threads,
                                               WireFormat wire = DType::kFloat32) {
  PsClientOptions options;
  options.ps_addresses = addresses;
  options.request_timeout = kWait;
  options.copy_threads = copy_threads;
  options.wire_dtype = wire;
  auto client = PsClient::Connect(context, options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(client).value() : nullptr;
}

// Two shards and one client (rank -1, one copy thread) that registered `reg_` on them.
class TwoShardsTest : public ::testing::Test {
 protected:
  explicit TwoShardsTest(ModelRegistration reg) : reg_(std::move(reg)) {}

  void SetUp() override {
    ASSERT_TRUE(s0_.started() && s1_.started());
    client_ = ConnectClient(context_, {s0_.endpoint(), s1_.endpoint()}, 1);
    ASSERT_NE(client_, nullptr);
    ASSERT_TRUE(client_->Register(reg_, kWait).ok());
  }

  zmq::context_t context_;  // declared first: outlives every socket
  InProcessServer s0_{context_, 0, 2};
  InProcessServer s1_{context_, 1, 2};
  const ModelRegistration reg_;
  std::unique_ptr<PsClient> client_;
};

}  // namespace parasync::server_test
