// Integration tests of parasync-ps as a real process, driven over ZeroMQ on loopback by the
// real worker-side client (PsClient) and by a raw socket sending hostile messages.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zmq.hpp>

#include "common/wire.h"
#include "tests/support/process_cluster.h"
#include "tests/support/process_util.h"
#include "tests/support/prometheus_text.h"
#include "tests/support/small_model.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::ExitCode;
using testing::ProcessCluster;
using testing::TempDir;

// Two dense layers (the second without a bias), 24,770 floats in slices of up to 5000.
ModelRegistration SmallModel(int shards) {
  std::vector<VariableSpec> variables = testing::DenseLayer("dense0", 300, 70, 0.1f);
  variables.push_back({"dense1/kernel", {70, 10}, DType::kFloat32, {InitKind::kUniform, 0.2f}});
  return testing::SmallModel(std::move(variables), /*max_slice_elements=*/5000, shards,
                             /*seed=*/7, /*learning_rate=*/0.5f);
}

struct ParamBuffers {
  explicit ParamBuffers(const ModelRegistration& reg) {
    for (const auto& v : reg.variables) data.emplace_back(static_cast<size_t>(v.num_elements()));
    for (auto& d : data) ptrs.push_back(d.data());
    for (auto& d : data) cptrs.push_back(d.data());
  }
  std::vector<std::vector<float>> data;
  std::vector<float*> ptrs;
  std::vector<const float*> cptrs;
};

std::unique_ptr<PsClient> Connect(zmq::context_t& ctx, const std::vector<std::string>& addresses) {
  PsClientOptions o;
  o.ps_addresses = addresses;
  o.rank = 0;
  o.request_timeout = 10s;
  auto c = PsClient::Connect(ctx, o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

TEST(PsProcessTest, PullAfterPushSeesTheSgdUpdateOnEveryShard) {
  TempDir dir;
  ProcessCluster cluster(2, 1, "", {}, dir.path(),
                         ProcessCluster::kPsLogDir);
  zmq::context_t ctx;
  auto client = Connect(ctx, cluster.addresses());
  const ModelRegistration reg = SmallModel(2);
  ASSERT_TRUE(client->Register(reg, 20s).ok());
  // The model is spread over both processes.
  ASSERT_FALSE(client->slice_map().SlicesOfShard(0).empty());
  ASSERT_FALSE(client->slice_map().SlicesOfShard(1).empty());

  ParamBuffers before(reg), grad(reg), after(reg);
  ASSERT_TRUE(client->Pull(before.ptrs).ok());
  for (size_t v = 0; v < grad.data.size(); ++v) {
    for (size_t i = 0; i < grad.data[v].size(); ++i) {
      grad.data[v][i] = std::sin(static_cast<float>(i + 31 * v)) * 0.01f;
    }
  }
  ASSERT_TRUE(client->Push(grad.cptrs, 32).ok());
  ASSERT_TRUE(client->Pull(after.ptrs).ok());
  for (size_t v = 0; v < after.data.size(); ++v) {
    for (size_t i = 0; i < after.data[v].size(); ++i) {
      ASSERT_EQ(after.data[v][i], before.data[v][i] - 0.5f * grad.data[v][i])
          << "variable " << v << " element " << i;
    }
  }
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok());
  for (const ShardStats& s : *stats) {
    EXPECT_EQ(s.version, 1);
    EXPECT_EQ(s.examples, 32);
  }
  // Each server told the operator where its metrics are, with the real port.
  EXPECT_NE(cluster.PsLog(0).find("metrics on http://127.0.0.1:" +
                                std::to_string(cluster.metrics_port(0)) + "/metrics"),
            std::string::npos)
      << cluster.PsLog(0);
  // A second worker registering the same model sees the same values.
  auto second = Connect(ctx, cluster.addresses());
  ASSERT_TRUE(second->Register(reg, 20s).ok());
  ParamBuffers again(reg);
  ASSERT_TRUE(second->Pull(again.ptrs).ok());
  EXPECT_EQ(again.data, after.data);
}

TEST(PsProcessTest, HostileMessagesGetErrorRepliesAndChangeNothing) {
  TempDir dir;
  ProcessCluster cluster(1, 1, "", {}, dir.path(),
                         ProcessCluster::kPsLogDir);
  zmq::context_t ctx;
  auto client = Connect(ctx, cluster.addresses());
  const ModelRegistration reg = SmallModel(1);
  ASSERT_TRUE(client->Register(reg, 20s).ok());
  ParamBuffers before(reg);
  ASSERT_TRUE(client->Pull(before.ptrs).ok());

  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::rcvtimeo, 5000);
  raw.connect("tcp://" + cluster.addresses()[0]);
  auto exchange = [&](std::vector<zmq::message_t> parts) -> Result<Header> {
    for (size_t i = 0; i < parts.size(); ++i) {
      raw.send(parts[i], i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    std::vector<zmq::message_t> reply;
    zmq::message_t part;
    do {
      if (!raw.recv(part)) return Status::TimedOut("no reply from the server");
      reply.push_back(std::move(part));
      part = zmq::message_t();
    } while (reply.back().more());
    return DecodeHeader(reply[0].data(), reply[0].size());
  };
  auto header_frame = [](const Header& h) {
    auto bytes = EncodeHeader(h);
    return zmq::message_t(bytes.data(), bytes.size());
  };

  // Garbage that fails the FlatBuffers verifier.
  std::vector<zmq::message_t> garbage;
  garbage.emplace_back(std::string("\x10\x00\x00\x00garbage-garbage-garbage", 27));
  auto r1 = exchange(std::move(garbage));
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_EQ(r1->status.code(), StatusCode::kCorruption) << r1->status.ToString();

  // A push for a slice that does not exist.
  Header push;
  push.type = MsgType::kPush;
  push.request_id = 11;
  push.slices = {{9999, 0, 4}};
  std::vector<zmq::message_t> p2;
  p2.push_back(header_frame(push));
  p2.emplace_back(16);
  auto r2 = exchange(std::move(p2));
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->request_id, 11u);
  EXPECT_EQ(r2->status.code(), StatusCode::kNotFound) << r2->status.ToString();

  // A push whose range is past the end of slice 0.
  push.request_id = 12;
  push.slices = {{0, client->slice_map().slices()[0].length - 2, 4}};
  std::vector<zmq::message_t> p3;
  p3.push_back(header_frame(push));
  p3.emplace_back(16);
  auto r3 = exchange(std::move(p3));
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(r3->status.code(), StatusCode::kInvalidArgument) << r3->status.ToString();

  // A push whose tensor frame is shorter than its range says.
  push.request_id = 13;
  push.slices = {{0, 0, 4}};
  std::vector<zmq::message_t> p4;
  p4.push_back(header_frame(push));
  p4.emplace_back(15);
  auto r4 = exchange(std::move(p4));
  ASSERT_TRUE(r4.ok());
  EXPECT_EQ(r4->status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r4->status.message().find("15 bytes"), std::string::npos) << r4->status.message();

  // A Register whose variable has another shape.
  Header bad_reg;
  bad_reg.type = MsgType::kRegister;
  bad_reg.request_id = 14;
  bad_reg.registration = reg;
  bad_reg.registration->variables[0].shape = {301, 70};
  std::vector<zmq::message_t> p5;
  p5.push_back(header_frame(bad_reg));
  auto r5 = exchange(std::move(p5));
  ASSERT_TRUE(r5.ok());
  EXPECT_EQ(r5->status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r5->status.message().find("dense0/kernel"), std::string::npos) << r5->status.message();

  // A sender built from another schema version: refused, naming both versions.
  Header other;
  other.protocol_version = kProtocolVersion + 41;
  other.type = MsgType::kRegister;
  other.request_id = 15;
  other.registration = reg;
  std::vector<zmq::message_t> p6;
  p6.push_back(header_frame(other));
  auto r6 = exchange(std::move(p6));
  ASSERT_TRUE(r6.ok());
  EXPECT_EQ(r6->status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r6->status.message().find("v" + std::to_string(kProtocolVersion + 41)),
            std::string::npos)
      << r6->status.message();
  EXPECT_NE(r6->status.message().find("v" + std::to_string(kProtocolVersion)), std::string::npos)
      << r6->status.message();

  // A NaN gradient.
  push.request_id = 16;
  push.slices = {{0, 0, 1}};
  std::vector<zmq::message_t> p7;
  p7.push_back(header_frame(push));
  const float nan = std::nanf("");
  p7.emplace_back(&nan, sizeof(nan));
  auto r7 = exchange(std::move(p7));
  ASSERT_TRUE(r7.ok());
  EXPECT_EQ(r7->status.code(), StatusCode::kInvalidArgument);

  // The server still serves, nothing changed, and every refusal was counted.
  ParamBuffers after(reg);
  ASSERT_TRUE(client->Pull(after.ptrs).ok());
  EXPECT_EQ(after.data, before.data);
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)[0].version, 0);
  EXPECT_EQ((*stats)[0].rejected, 7);
  // The live /metrics endpoint tells the operator the same, by reason.
  const std::string metrics = testing::HttpGet(cluster.metrics_port(0), "/metrics");
  EXPECT_NE(metrics.find("200 OK"), std::string::npos) << metrics.substr(0, 200);
  for (const char* reason : {"malformed", "unknown_slice", "range", "byte_length",
                             "register_mismatch", "protocol_version", "non_finite"}) {
    EXPECT_EQ(testing::PrometheusValue(metrics, "parasync_ps_rejected_total",
                                       {{"role", "ps"}, {"shard", "0"}, {"reason", reason}}),
              1)
        << reason << " not counted once in\n" << metrics;
  }
  EXPECT_TRUE(cluster.ps(0).Wait(0ms) == std::nullopt) << "the server died";
}

TEST(PsProcessTest, SigtermAndShutdownMessageStopTheServerWithExitZero) {
  TempDir dir;
  ProcessCluster cluster(2, 1, "", {}, dir.path(),
                         ProcessCluster::kPsLogDir);
  zmq::context_t ctx;
  auto client = Connect(ctx, cluster.addresses());
  ASSERT_TRUE(client->Register(SmallModel(2), 20s).ok());

  cluster.ps(0).Signal(SIGTERM);
  auto s0 = cluster.ps(0).Wait(10s);
  ASSERT_TRUE(s0.has_value()) << "parasync-ps ignored SIGTERM";
  EXPECT_EQ(ExitCode(*s0), 0) << cluster.PsLog(0);

  ASSERT_TRUE(client->Shutdown(1).ok());
  auto s1 = cluster.ps(1).Wait(10s);
  ASSERT_TRUE(s1.has_value()) << "parasync-ps ignored Shutdown";
  EXPECT_EQ(ExitCode(*s1), 0) << cluster.PsLog(1);
  // Each wrote its metrics snapshot at exit.
  for (const char* name : {"metrics-ps0.prom", "metrics-ps1.prom"}) {
    EXPECT_NE(testing::ReadFile(dir.path() + "/" + name).find("parasync_ps_requests_total"),
              std::string::npos)
        << name;
  }
}

// Runs a binary that must refuse its configuration at startup: returns its exit code (-1
// if it did not exit within 10 s) and its output lines.
std::pair<int, std::vector<std::string>> RunRefused(const std::vector<std::string>& argv,
                                                    const TempDir& dir) {
  static int runs = 0;
  const std::string log = dir.path() + "/refused" + std::to_string(runs++) + ".log";
  Child child = Child::Start(argv, log);
  const auto status = child.Wait(10s);
  return {status ? ExitCode(*status) : -1, testing::ReadLines(log)};
}

TEST(PsStartupTest, StoreRegisteredInAnotherModeIsRefusedWithExitTwoAndOneLine) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  auto ps = [&](const std::string& mode) {
    return std::vector<std::string>{testing::BinDir() + "/parasync-ps", "--ps-hosts",
                                    "127.0.0.1:0", "--worker-hosts", "127.0.0.1:1",
                                    "--task-index", "0", "--mode", mode, "--data-dir", data,
                                    "--durability", "every-update"};
  };
  {
    // A sync store: registered by a sync worker, stopped cleanly.
    testing::Serving serving = testing::StartServing(ps("sync"), dir.path() + "/sync.log");
    ASSERT_TRUE(serving.ready) << serving.why;
    Child& sync = serving.child;
    zmq::context_t ctx(1);
    auto client = Connect(ctx, {serving.ready->address});
    ModelRegistration reg = SmallModel(1);
    reg.mode = "sync";
    ASSERT_TRUE(client->Register(reg, 10s).ok()) << testing::ReadFile(dir.path() + "/sync.log");
    client.reset();
    sync.Signal(SIGTERM);
    auto s = sync.Wait(20s);
    ASSERT_TRUE(s.has_value() && ExitCode(*s) == 0) << testing::ReadFile(dir.path() + "/sync.log");
  }
  std::vector<std::string> refused = ps("async");
  const std::string ready_file = dir.path() + "/async.ready";
  refused.insert(refused.end(), {"--ready-file", ready_file});
  const auto [code, lines] = RunRefused(refused, dir);
  EXPECT_EQ(code, 2) << ::testing::PrintToString(lines);
  ASSERT_EQ(lines.size(), 1u) << ::testing::PrintToString(lines);
  EXPECT_EQ(lines[0], "parasync-ps: --state-dir " + data +
                          " holds a model registered in mode sync, but this server runs --mode "
                          "async: start it with --mode sync, or give a new --state-dir");
  EXPECT_FALSE(std::filesystem::exists(ready_file)) << "the refused server served";
}

TEST(PsStartupTest, AddressFlagsAreCheckedAsAddressesWithExitTwoAndOneLine) {
  TempDir dir;
  // Every case is refused before anything binds: these ports are never bound.
  const std::string port = "5000";
  const std::string ps_address = "127.0.0.1:" + port, worker_address = "127.0.0.1:5001";
  struct Case {
    const char* binary;
    std::vector<std::string> flags;
    std::string named;  // what the line must quote
  };
  const std::vector<Case> cases = {
      // civetweb read this as 231.1.1.1.
      {"parasync-ps", {"--metrics-bind", "999.1.1.1", "--metrics-port", "5002"},
       "--metrics-bind '999.1.1.1'"},
      {"parasync-ps", {"--bind", "999.1.1.1:" + port}, "'999.1.1.1'"},
      {"parasync-ps", {"--bind", "127.0.0.1:70000"}, "'127.0.0.1:70000'"},
      {"parasync-ps", {"--ps-hosts", ps_address + "," + ps_address},
       "--ps-hosts names one address twice: '" + ps_address + "'"},
      {"parasync-ps", {"--ps-hosts", "256.0.0.1:5000"}, "'256.0.0.1'"},
      {"parasync-worker", {"--metrics-bind", "999.1.1.1"}, "--metrics-bind '999.1.1.1'"},
      {"parasync-worker", {"--ps-hosts", ps_address + "," + ps_address},
       "--ps-hosts names one address twice: '" + ps_address + "'"},
      {"parasync-export", {"--ps-hosts", ps_address + "," + ps_address, "--out",
                           dir.path() + "/m.psm"},
       "--ps-hosts names one address twice: '" + ps_address + "'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {testing::BinDir() + "/" + c.binary, "--ps-hosts",
                                     ps_address, "--worker-hosts", worker_address,
                                     "--task-index", "0"};
    if (std::string(c.binary) == "parasync-export") argv.resize(1);  // its own flags only
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());  // the last --ps-hosts wins
    const auto [code, lines] = RunRefused(argv, dir);
    EXPECT_EQ(code, 2) << c.binary << " " << c.flags[1] << ": " << ::testing::PrintToString(lines);
    ASSERT_EQ(lines.size(), 1u) << c.binary << " " << c.flags[1] << ": "
                                << ::testing::PrintToString(lines);
    EXPECT_NE(lines[0].find(c.named), std::string::npos) << lines[0];
  }
}

TEST(PsProcessTest, RequestTimesOutWithAClearErrorWhenNoServerAnswers) {
  zmq::context_t ctx;
  PsClientOptions o;
  o.ps_addresses = {"127.0.0.1:1"};  // privileged: no test's server listens there
  o.request_timeout = 300ms;
  auto client = PsClient::Connect(ctx, o);
  ASSERT_TRUE(client.ok());
  Status s = (*client)->Register(SmallModel(1), 300ms);
  EXPECT_EQ(s.code(), StatusCode::kTimedOut);
  EXPECT_NE(s.message().find(o.ps_addresses[0]), std::string::npos) << s.message();
}

}  // namespace
}  // namespace parasync
