// A user's own data and model, end to end: NumPy files written as np.save writes them and a
// JSON model file, trained by the real parasync-launch, parasync-ps and parasync-worker
// over loopback; and the one-line refusals of data and models that do not fit.
#include <chrono>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/process_util.h"
#include "tests/support/data_files.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::ExitCode;
using testing::TempDir;


void WriteLinearSplit(const std::string& dir, const std::string& split, int n, uint64_t seed) {
  ASSERT_TRUE(testing::WriteLinearSplit(dir, split, n, seed));
}

struct Outcome {
  int exit_code = -1;
  std::string output;
};

// Runs `argv` to its end (at most 240 s), its output in `out`.
Outcome RunToEnd(const std::vector<std::string>& argv, const std::string& out) {
  std::remove(out.c_str());
  Child child = Child::Start(argv, out);
  auto status = child.Wait(240s);
  Outcome run;
  run.output = testing::ReadFile(out);
  if (status) run.exit_code = ExitCode(*status);
  return run;
}

Outcome Launch(const TempDir& dir, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::BinDir() + "/parasync-launch", "--ps", "2",
                                   "--workers", "2", "--grace-seconds", "10"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunToEnd(argv, dir.path() + "/launch.out");
}

TEST(OwnDataTest, NumpyFilesAndAModelFileTrainThroughTheLauncher) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  std::filesystem::create_directories(data);
  WriteLinearSplit(data, "train", 4000, 2);
  WriteLinearSplit(data, "test", 1000, 3);
  const std::string model = dir.path() + "/linear.json";
  std::ofstream(model) << R"({"name": "linear-probe", "input": [12],
    "layers": [{"type": "dense", "units": 32, "activation": "relu"},
               {"type": "dense", "units": 3}]})";

  Outcome run = Launch(dir, {"--mode", "async", "--epochs", "4", "--data", data, "--model", model,
                         "--batch-size", "32", "--lr", "0.01", "--log-dir", dir.path() + "/run"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("model linear-probe: input [12]"), std::string::npos) << run.output;
  const auto lines = testing::ReadLines(dir.path() + "/run/eval.jsonl");
  ASSERT_GE(lines.size(), 2u) << run.output;
  const auto last = nlohmann::json::parse(lines.back());
  // Chance is about a third; a data path that mixed up examples and labels could not get
  // near this on held-out data.
  EXPECT_GE(last["test_accuracy"].get<double>(), 0.9) << lines.back();
}

TEST(OwnDataTest, DataAndModelsThatDoNotFitAreOneLineAndExitCode2) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  std::filesystem::create_directories(data);
  WriteLinearSplit(data, "train", 200, 2);
  WriteLinearSplit(data, "test", 50, 3);
  auto worker = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {testing::BinDir() + "/parasync-worker", "--ps-hosts",
                                     "127.0.0.1:1", "--worker-hosts", "127.0.0.1:2",
                                     "--task-index", "0", "--data", data,
                                     "--log-dir", dir.path() + "/w"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunToEnd(argv, dir.path() + "/worker.out");
  };
  auto expect_refused = [](const Outcome& run, const std::string& says) {
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
    EXPECT_NE(run.output.find(says), std::string::npos) << run.output;
  };
  // Three classes in the labels, two outputs in the model.
  const std::string two = dir.path() + "/two.json";
  std::ofstream(two) << R"({"layers": [{"type": "dense", "units": 2}]})";
  expect_refused(worker({"--model", two}),
                 "the labels have 3 classes but the last layer 'dense0' has 2 outputs [2]");
  // A convolution on flat features.
  expect_refused(worker({"--model", "cnn"}),
                 "layer 'conv2d0' (conv2d) needs an image input [C, H, W], but its input is [12]");
  // A model made for other inputs.
  expect_refused(worker({"--model", "784-10"}),
                 "expects inputs of shape [784] but the data's examples are [12]");
  // A truncated features file.
  const std::string features = data + "/train_x.npy";
  std::string bytes = testing::ReadFile(features);
  std::ofstream(features, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 7);
  expect_refused(worker({"--model", "12-3"}), "train_x.npy");
}

}  // namespace
}  // namespace parasync
