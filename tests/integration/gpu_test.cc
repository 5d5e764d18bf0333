// The worker's GPU path end to end: `--device cuda` without a GPU is one clear error, and a
// local cluster whose workers compute on the GPU trains Fashion-MNIST as the CPU one does.
// Labelled gpu; each test skips, saying why, where it cannot apply.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/process_util.h"
#include "tests/support/prometheus_text.h"
#include "tests/support/test_models.h"
#include "worker/compute/backend_factory.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::ExitCode;
using testing::TempDir;

// Empty when this machine can run the CUDA backend, else why not. Only "no GPU / no CUDA
// module" (Unavailable) is a reason; any other failure to create the backend, or any
// reason at all under PARASYNC_REQUIRE_GPU, fails the calling test.
std::string NoGpuReason() {
  DeviceChoice cuda;
  cuda.kind = DeviceChoice::Kind::kCuda;
  std::string why;
  auto backend = CreateBackend(cuda, testing::MakeModel("4-3", {4}), 0, &why);
  if (backend.ok()) return "";
  EXPECT_EQ(backend.status().code(), StatusCode::kUnavailable) << backend.status().ToString();
  EXPECT_EQ(std::getenv("PARASYNC_REQUIRE_GPU"), nullptr)
      << "PARASYNC_REQUIRE_GPU is set, but: " << backend.status().ToString();
  return backend.status().message();
}

TEST(WorkerDeviceTest, CudaWithoutAGpuIsOneClearLineAndExitCode2) {
  if (NoGpuReason().empty()) GTEST_SKIP() << "a GPU is present";
  for (const char* device : {"--device=cuda", "--device=cuda:1"}) {
    TempDir dir;
    const std::string out = dir.path() + "/out";
    Child child = Child::Start({testing::BinDir() + "/parasync-worker",
                                "--ps-hosts=127.0.0.1:1", "--worker-hosts=127.0.0.1:3",
                                "--log-dir", dir.path(), "--data", testing::DataDir(), device},
                               out);
    auto status = child.Wait(60s);
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(ExitCode(*status), 2) << testing::ReadFile(out);
    auto lines = testing::ReadLines(out);
    ASSERT_EQ(lines.size(), 1u) << testing::ReadFile(out);
    EXPECT_NE(lines[0].find("--device cuda: "), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find("--device auto or cpu"), std::string::npos) << lines[0];
  }
}

TEST(WorkerDeviceTest, AGpuThatDoesNotExistIsOneClearLineAndExitCode2) {
  const std::string no_gpu = NoGpuReason();
  if (!no_gpu.empty()) GTEST_SKIP() << "no CUDA backend on this machine: " << no_gpu;
  TempDir dir;
  const std::string out = dir.path() + "/out";
  Child child = Child::Start({testing::BinDir() + "/parasync-worker", "--ps-hosts=127.0.0.1:1",
                              "--worker-hosts=127.0.0.1:3", "--log-dir", dir.path(), "--data",
                              testing::DataDir(), "--device=cuda:64"},
                             out);
  auto status = child.Wait(60s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(ExitCode(*status), 2) << testing::ReadFile(out);
  auto lines = testing::ReadLines(out);
  ASSERT_EQ(lines.size(), 1u) << testing::ReadFile(out);
  EXPECT_NE(lines[0].find("cuda:64 requested but only"), std::string::npos) << lines[0];
}

// While `launch` runs: `worker`'s metrics port from the launcher's cluster.json, then its
// /healthz (200) and a /metrics page counting trained examples, each polled within a bound.
// A worker on the GPU has cuBLAS and cuDNN loaded beside the metrics server's thread (the
// civetweb threads it replaced had stacks too small for cuBLAS's thread-local data:
// docs/dependencies.md). Empty when all was seen, else what was not.
std::string ScrapeWhileTraining(Child& launch, const std::string& run_dir, const std::string& worker) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  auto running = [&] {
    return std::chrono::steady_clock::now() < deadline && testing::ProcessAlive(launch.pid());
  };
  int port = 0;
  while (port == 0 && running()) {
    const std::string text = testing::ReadFile(run_dir + "/cluster.json");
    const auto cluster = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (cluster.is_object() && cluster.contains("processes")) {
      for (const auto& p : cluster["processes"]) {
        // The port it bound: null until its ready file has said.
        const auto bound = p.find("metrics_port");
        if (p.value("name", "") == worker && bound != p.end() && bound->is_number_integer()) {
          port = bound->get<int>();
        }
      }
    }
    if (port == 0) std::this_thread::sleep_for(50ms);
  }
  if (port == 0) return "no metrics_port of " + worker + " in cluster.json while the run lasted";
  std::string health;
  while (health.find(" 200 OK\r\n") == std::string::npos && running()) {
    health = testing::HttpGet(port, "/healthz");
    if (health.find(" 200 OK\r\n") == std::string::npos) std::this_thread::sleep_for(50ms);
  }
  if (health.find(" 200 OK\r\n") == std::string::npos) {
    return worker + " /healthz never answered 200 while the run lasted; last answer: " + health;
  }
  std::string page;
  while (running()) {
    page = testing::HttpGet(port, "/metrics");
    if (testing::PrometheusValue(page, "parasync_worker_examples_total").value_or(0) > 0) return "";
    std::this_thread::sleep_for(50ms);
  }
  return worker + " /metrics never counted a trained example while the run lasted; last page:\n" +
         page.substr(0, 2000);
}

TEST(GpuClusterTest, TwoGpuWorkersTrainFashionMnistPast085) {
  const std::string no_gpu = NoGpuReason();
  if (!no_gpu.empty()) GTEST_SKIP() << "no CUDA backend on this machine: " << no_gpu;
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed at " << testing::DataDir();
  TempDir dir;
  const std::string out = dir.path() + "/launch.out";
  // The settings of README command 1 (tools/run-local-cluster.sh), on the GPU.
  Child launch = Child::Start(
      {testing::BinDir() + "/parasync-launch", "--ps", "2", "--workers", "2", "--mode", "async",
       "--epochs", "5", "--log-dir", dir.path() + "/run", "--data", testing::DataDir(),
       "--worker-arg=--device=cuda"},
      out);
  const std::string scraped = ScrapeWhileTraining(launch, dir.path() + "/run", "worker1");
  auto status = launch.Wait(280s);
  ASSERT_TRUE(status.has_value()) << "the launcher did not finish in 280 s:\n"
                                  << testing::ReadFile(out);
  const std::string printed = testing::ReadFile(out);
  ASSERT_EQ(ExitCode(*status), 0) << printed;
  EXPECT_EQ(scraped, "");
  // Each worker said where it computes: its own GPU where there are two.
  for (const char* worker : {"worker0", "worker1"}) {
    const std::string log = testing::ReadFile(dir.path() + "/run/" + worker + ".log");
    EXPECT_NE(log.find("compute on cuda:"), std::string::npos) << worker << ":\n" << log;
  }
  auto lines = testing::ReadLines(dir.path() + "/run/eval.jsonl");
  ASSERT_GE(lines.size(), 2u) << printed;
  const auto last = nlohmann::json::parse(lines.back());
  EXPECT_EQ(last["epoch"], 5) << lines.back();
  EXPECT_GE(last["test_accuracy"].get<double>(), 0.85) << lines.back();
  std::cout << "GPU cluster: test accuracy " << last["test_accuracy"].get<double>()
            << " after epoch 5 (" << last["wall_s"].get<double>() << " s)\n";
}

}  // namespace
}  // namespace parasync
