// Export and evaluate with real processes: parasync-launch --export writes the model the
// servers hold, and parasync-worker --eval-only reproduces the chief's last evaluation from
// that file exactly; eval-only refuses damaged or mismatched files with one line; and a worker
// killed and restarted with the same rank rejoins an async run.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/model_file.h"
#include "tests/support/process_util.h"
#include "tests/support/test_models.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::ExitCode;
using testing::TempDir;

// What one `parasync-worker --eval-only` run printed, and how it ended.
struct EvalOnlyRun {
  int exit_code = -1;  // -1: did not exit in time
  std::string output;  // stdout and stderr together
};

EvalOnlyRun RunEvalOnly(const TempDir& dir, const std::vector<std::string>& args) {
  static int runs = 0;
  const std::string log = dir.path() + "/eval-only-" + std::to_string(++runs) + ".out";
  std::vector<std::string> argv = {testing::BinDir() + "/parasync-worker", "--eval-only"};
  argv.insert(argv.end(), args.begin(), args.end());
  Child child = Child::Start(argv, log);
  const auto status = child.Wait(120s);
  EvalOnlyRun run;
  if (status) run.exit_code = ExitCode(*status);
  run.output = testing::ReadFile(log);
  return run;
}

int CountLines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

// A model file holding an MLP of `widths` with small deterministic values.
ModelFile MlpModelFile(const std::string& widths) {
  ModelFile model;
  model.variables = testing::MakeModel(widths, {1, 28, 28}).variables();
  for (const VariableSpec& v : model.variables) {
    std::vector<float> values(static_cast<size_t>(v.num_elements()));
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = 0.01f * static_cast<float>(static_cast<int>(i % 7) - 3);
    }
    model.values.push_back(std::move(values));
  }
  return model;
}

TEST(ExportTest, ExportThenEvalOnlyReproducesTheChiefsLastAccuracyExactly) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  const std::string model = dir.path() + "/model.psm";
  const std::string out = dir.path() + "/launch.out";
  // One worker: nothing is pushed after the chief's last evaluation, so the servers still hold
  // the parameters it evaluated when the launcher exports them.
  Child launch = Child::Start(
      {testing::BinDir() + "/parasync-launch", "--ps", "2", "--workers", "1", "--mode", "async",
       "--epochs", "1", "--max-steps", "200", "--log-dir", dir.path() + "/run", "--data",
       testing::DataDir(), "--export", model},
      out);
  const auto status = launch.Wait(240s);
  ASSERT_TRUE(status.has_value()) << "the launcher did not finish:\n" << testing::ReadFile(out);
  const std::string printed = testing::ReadFile(out);
  ASSERT_EQ(ExitCode(*status), 0) << printed;
  EXPECT_NE(printed.find("[export] parasync-export: wrote " + model), std::string::npos)
      << printed;
  // The launcher's line: "[launch HH:MM:SS.mmm] model: ..." (the [export] lines differ).
  EXPECT_NE(printed.find("] model: " + model + " (evaluate it"), std::string::npos) << printed;

  const auto last =
      nlohmann::json::parse(testing::ReadLines(dir.path() + "/run/eval.jsonl").back());
  ASSERT_EQ(last["epoch"], 1);
  const double chief_accuracy = last["test_accuracy"].get<double>();
  const double chief_loss = last["test_loss"].get<double>();

  const EvalOnlyRun run = RunEvalOnly(dir, {"--model-file", model, "--data", testing::DataDir()});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<std::string> lines;
  std::istringstream printed_lines(run.output);
  for (std::string line; std::getline(printed_lines, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 2u) << run.output;
  EXPECT_EQ(lines[0].rfind("eval-only: test accuracy ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("on 10000 examples (model " + model + ")"), std::string::npos)
      << lines[0];
  const auto result = nlohmann::json::parse(lines[1], nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(result.is_object()) << lines[1];
  EXPECT_EQ(result["examples"], 10000);
  // Identical parameters, data and code: the same numbers, to the last bit.
  EXPECT_EQ(result["test_accuracy"].get<double>(), chief_accuracy) << lines[1];
  EXPECT_EQ(result["test_loss"].get<double>(), chief_loss) << lines[1];
  EXPECT_GE(chief_accuracy, 0.6) << "200 steps should be far above chance: the check is weak";

  // The spelling `--eval-only --model FILE` evaluates the same file.
  const EvalOnlyRun alias = RunEvalOnly(dir, {"--model", model, "--data", testing::DataDir()});
  ASSERT_EQ(alias.exit_code, 0) << alias.output;
  EXPECT_EQ(alias.output, run.output);
}

TEST(ExportTest, EvalOnlyRefusesACorruptOrMismatchedModelFile) {
  TempDir dir;
  const std::string good = dir.path() + "/good.psm";
  ASSERT_TRUE(WriteModelFile(good, MlpModelFile("784-256-128-10")).ok());
  const std::string data = testing::DataDir();

  // --model given explicitly and different from the file: refused, naming both.
  EvalOnlyRun run =
      RunEvalOnly(dir, {"--model-file", good, "--model", "784-100-10", "--data", data});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_EQ(CountLines(run.output), 1) << run.output;
  EXPECT_NE(run.output.find("784-100-10"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("784-256-128-10"), std::string::npos) << run.output;
  // The same variables computed otherwise (tanh instead of ReLU): refused too.
  const std::string tanh_mlp = dir.path() + "/tanh.json";
  std::ofstream(tanh_mlp) << R"({"layers": [{"type": "dense", "units": 256, "activation": "tanh"},
      {"type": "dense", "units": 128, "activation": "relu"}, {"type": "dense", "units": 10}]})";
  run = RunEvalOnly(dir, {"--model-file", good, "--model", tanh_mlp, "--data", data});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("does not match"), std::string::npos) << run.output;

  // One flipped byte in the data: the checksum catches it.
  const std::string corrupt = dir.path() + "/corrupt.psm";
  std::filesystem::copy_file(good, corrupt);
  {
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = std::filesystem::file_size(corrupt);
    f.seekg(static_cast<std::streamoff>(size / 2));
    char byte = 0;
    f.get(byte);
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.put(static_cast<char>(byte ^ 0x40));
    ASSERT_TRUE(f.good());
  }
  run = RunEvalOnly(dir, {"--model-file", corrupt, "--data", data});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_EQ(CountLines(run.output), 1) << run.output;
  EXPECT_NE(run.output.find(corrupt + " is not a valid parasync model file"), std::string::npos)
      << run.output;

  // A missing file, and eval-only without a file.
  run = RunEvalOnly(dir, {"--model-file", dir.path() + "/missing.psm", "--data", data});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_EQ(CountLines(run.output), 1) << run.output;
  EXPECT_NE(run.output.find("missing.psm"), std::string::npos) << run.output;
  run = RunEvalOnly(dir, {"--data", data});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--model-file"), std::string::npos) << run.output;

  // Layers that do not chain: the second kernel takes 16 inputs from a layer of 32.
  ModelFile broken = MlpModelFile("784-32-10");
  broken.variables[2].shape = {16, 10};
  broken.values[2].resize(160);
  const std::string unchained = dir.path() + "/unchained.psm";
  ASSERT_TRUE(WriteModelFile(unchained, broken).ok());
  run = RunEvalOnly(dir, {"--model-file", unchained, "--data", data});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_EQ(CountLines(run.output), 1) << run.output;
  EXPECT_NE(run.output.find("dense1/kernel has shape [16, 10], the model needs [32, 10]"),
            std::string::npos)
      << run.output;

  // A variable an MLP does not have.
  ModelFile extra = MlpModelFile("784-32-10");
  VariableSpec scale;
  scale.name = "dense1/scale";
  scale.shape = {10};
  extra.variables.push_back(scale);
  extra.values.emplace_back(10, 1.0f);
  const std::string with_extra = dir.path() + "/extra.psm";
  ASSERT_TRUE(WriteModelFile(with_extra, extra).ok());
  run = RunEvalOnly(dir, {"--model-file", with_extra, "--data", data});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("dense1/scale"), std::string::npos) << run.output;

  // The refusals were about the files: the good one, with the matching --model, evaluates.
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  run = RunEvalOnly(dir, {"--model-file", good, "--model", "784-256-128-10", "--data", data});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("eval-only: test accuracy"), std::string::npos) << run.output;
}

TEST(WorkerRestartTest, RestartedWorkerRejoinsAnAsyncRunAndTrainingContinues) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  const std::string workers = testing::JoinHosts({"127.0.0.1:1", "127.0.0.1:2"});
  auto log = [&](const std::string& name) { return dir.path() + "/" + name + ".log"; };
  testing::Serving serving = testing::StartServing(
      {testing::BinDir() + "/parasync-ps", "--ps-hosts", "127.0.0.1:0", "--worker-hosts",
       workers, "--task-index", "0", "--mode", "async"},
      log("ps0"));
  ASSERT_TRUE(serving.ready) << serving.why;
  const std::string ps = serving.ready->address;
  std::vector<std::unique_ptr<Child>> worker(2);
  int incarnation = 0;
  auto start_worker = [&](int rank) {
    worker[static_cast<size_t>(rank)].reset();  // reaps a previous incarnation
    worker[static_cast<size_t>(rank)] = std::make_unique<Child>(Child::Start(
        {testing::BinDir() + "/parasync-worker", "--ps-hosts", ps, "--worker-hosts", workers,
         "--task-index", std::to_string(rank), "--mode", "async", "--data", testing::DataDir(),
         "--log-dir", dir.path(), "--heartbeat-interval", "0.2", "--model", "784-32-10",
         "--batch-size", "16", "--max-steps", "100000", "--epochs", "100", "--step-delay-ms",
         "5"},
        log("worker" + std::to_string(rank) + "-" + std::to_string(++incarnation))));
  };
  auto dump = [&] {
    std::string out;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      if (entry.path().extension() != ".log") continue;
      out += "--- " + entry.path().filename().string() + "\n" +
             testing::ReadFile(entry.path().string());
    }
    return out;
  };
  start_worker(0);
  start_worker(1);

  zmq::context_t ctx;
  PsClientOptions options;
  options.ps_addresses = {ps};
  options.rank = -1;  // a tool: reads, takes no part in training
  options.request_timeout = 10s;
  auto client = PsClient::Connect(ctx, options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto stats = [&] {
    auto s = (*client)->Stats();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? (*s)[0] : ShardStats{};
  };
  auto gradients_of = [&](int rank) -> int64_t {
    const ShardStats s = stats();
    return s.workers.size() > static_cast<size_t>(rank)
               ? s.workers[static_cast<size_t>(rank)].gradients
               : -1;
  };
  ASSERT_TRUE(testing::WaitFor([&] { return gradients_of(1) >= 20 && gradients_of(0) >= 20; }, 60s))
      << dump();

  worker[1]->Signal(SIGKILL);
  ASSERT_TRUE(worker[1]->Wait(5s).has_value());
  const int64_t version_at_kill = stats().version;
  const int64_t gradients_at_kill = gradients_of(1);
  // The chief alone keeps training.
  ASSERT_TRUE(testing::WaitFor([&] { return stats().version >= version_at_kill + 20; }, 30s))
      << "training stopped with worker 1 dead\n" << dump();

  start_worker(1);  // a replacement with the same rank
  ASSERT_TRUE(testing::WaitFor([&] { return gradients_of(1) >= gradients_at_kill + 20; }, 60s))
      << "the restarted worker does not contribute\n" << dump();
  const int64_t version_after_rejoin = stats().version;
  ASSERT_TRUE(testing::WaitFor([&] { return stats().version >= version_after_rejoin + 20; }, 30s))
      << "training stopped after the restart\n" << dump();
  EXPECT_TRUE(stats().workers[1].live);
  EXPECT_EQ(stats().mode, "async");

  for (auto& w : worker) w->Signal(SIGTERM);
  for (auto& w : worker) {
    const auto status = w->Wait(30s);
    ASSERT_TRUE(status.has_value()) << dump();
    EXPECT_EQ(ExitCode(*status), 0) << dump();
  }
}

}  // namespace
}  // namespace parasync
