// parasync-bench-compute: examples/sec of one worker's compute — ForwardBackward, exactly as
// the trainer calls it (host parameters in, host gradients out, page-locked buffers from the
// backend), no network — for a list of batch sizes on one device. Prints CSV:
//   device,batch,median_examples_per_sec,min,max,repeats,steps_per_repeat
// tools/bench-worker runs it for the CPU and the GPU beside PyTorch and prints the table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/process.h"
#include "tools/benchmarks/stats.h"
#include "worker/compute/backend_factory.h"
#include "worker/model/model.h"

namespace {

using Clock = std::chrono::steady_clock;
using parasync::ComputeBackend;
using parasync::bench::Median;

constexpr const char* kProgram = "parasync-bench-compute";

std::vector<int> ParseBatches(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      const int b = std::stoi(item, &used);
      if (used != item.size() || b < 1 || b > (1 << 20)) return {};
      out.push_back(b);
    } catch (const std::exception&) {
      return {};
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Times one worker's compute (forward + backward of the model, host arrays in and out, no "
      "network) for each batch size on one device, and prints CSV: device, batch, median "
      "examples/sec over the repeats, min, max, repeats, steps per repeat."};
  app.footer("Example:\n  parasync-bench-compute --device cuda --batches 64,1024,8192\n"
             "  tools/bench-worker runs it for the CPU and the GPU beside PyTorch.");
  std::string device = "cpu";
  std::string model = "mlp";
  std::string input_text = "1,28,28";
  std::string batches_text = "64,128,256,512,1024,2048,4096,8192";
  double seconds = 0.5;
  int repeats = 5;
  int threads = 1;
  app.add_option("--device", device, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--model", model, "A built-in model (mlp, cnn, lenet5), MLP widths or a model file")
      ->capture_default_str();
  app.add_option("--input", input_text, "The shape of one example: C,H,W or D")
      ->capture_default_str();
  app.add_option("--batches", batches_text, "Comma-separated batch sizes")->capture_default_str();
  app.add_option("--seconds", seconds, "Seconds per repeat and batch size (at least 3 steps)")
      ->check(CLI::Range(0.01, 600.0))
      ->capture_default_str();
  app.add_option("--repeats", repeats, "Timed repeats per batch size; the median is reported")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--threads", threads, "Threads of the CPU backend (OpenBLAS and oneDNN)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  bool describe = false;
  app.add_flag("--describe", describe,
               "Print the model's description (JSON, docs/models.md) and exit: what "
               "tools/benchmarks/torch_model.py builds the same model from");
  CLI11_PARSE(app, argc, argv);

  const std::vector<int> batches = ParseBatches(batches_text);
  if (batches.empty()) {
    return parasync::PrintErrorLine(kProgram, "--batches must be positive integers, "
                                    "comma-separated, not '" + batches_text + "'",
                                    parasync::kExitBadUsage);
  }
  auto spec = parasync::ResolveModelSpec(model);
  if (!spec.ok()) {
    return parasync::PrintErrorLine(kProgram, spec.status().message(), parasync::kExitBadUsage);
  }
  std::vector<int64_t> input;
  {
    std::stringstream in(input_text);
    std::string item;
    while (std::getline(in, item, ',')) {
      char* end = nullptr;
      const long long d = std::strtoll(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || d < 1) {
        return parasync::PrintErrorLine(kProgram, "--input must be C,H,W or D, not '" + input_text + "'",
                                        parasync::kExitBadUsage);
      }
      input.push_back(d);
    }
  }
  auto net = parasync::Model::Build(*spec, input);
  if (!net.ok()) {
    return parasync::PrintErrorLine(kProgram, net.status().message(), parasync::kExitBadUsage);
  }
  if (describe) {
    std::printf("%s\n", parasync::ModelSpecToJson(net->spec()).c_str());
    return 0;
  }
  auto choice = parasync::ParseDevice(device);
  if (!choice.ok() || choice->kind == parasync::DeviceChoice::Kind::kAuto) {
    return parasync::PrintErrorLine(kProgram, "--device must be cpu, cuda or cuda:N",
                                    parasync::kExitBadUsage);
  }
  parasync::SetCpuComputeThreads(threads);
  std::string why;
  auto backend = parasync::CreateBackend(*choice, *net, 0, &why);
  if (!backend.ok()) {
    return parasync::PrintErrorLine(kProgram, backend.status().message(), parasync::kExitBadUsage);
  }
  ComputeBackend& b = **backend;
  std::fprintf(stderr, "parasync-bench-compute: %s, model %s, %d thread(s)\n", b.name().c_str(),
               model.c_str(), threads);

  const std::vector<parasync::VariableSpec>& vars = net->variables();
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int64_t inputs = net->input_size();
  const parasync::LayerOp& first = net->ops().front();
  const bool ids = first.spec.kind == parasync::LayerKind::kEmbedding;
  std::mt19937_64 gen(1);
  std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
  // Page-locked where the backend offers it, as the trainer's buffers are.
  std::vector<std::shared_ptr<void>> blocks;
  auto host_floats = [&](size_t n) {
    blocks.push_back(b.AllocateHost(n * sizeof(float)));
    if (blocks.back() == nullptr) {
      std::fprintf(stderr, "%s: out of host memory\n", kProgram);
      std::exit(1);
    }
    return static_cast<float*>(blocks.back().get());
  };
  std::vector<const float*> params;
  std::vector<float*> grads;
  for (const auto& v : vars) {
    float* p = host_floats(static_cast<size_t>(v.num_elements()));
    for (int64_t k = 0; k < v.num_elements(); ++k) p[k] = uniform(gen);
    params.push_back(p);
    grads.push_back(host_floats(static_cast<size_t>(v.num_elements())));
  }
  float* x = host_floats(static_cast<size_t>(max_batch * inputs));
  for (int64_t k = 0; k < max_batch * inputs; ++k) {
    x[k] = ids ? static_cast<float>(gen() % static_cast<uint64_t>(first.spec.vocab))
               : uniform(gen) + 0.05f;
  }
  auto* y = reinterpret_cast<uint8_t*>(host_floats(static_cast<size_t>(max_batch) / 4 + 1));
  const uint64_t classes =
      net->loss() == parasync::LossKind::kSigmoidCrossEntropy ? 2 : static_cast<uint64_t>(net->outputs());
  for (int i = 0; i < max_batch; ++i) y[i] = static_cast<uint8_t>(gen() % std::min<uint64_t>(classes, 256));

  std::printf("device,batch,median_examples_per_sec,min,max,repeats,steps_per_repeat\n");
  const std::string label = choice->kind == parasync::DeviceChoice::Kind::kCpu ? "cpu" : "cuda";
  for (int batch : batches) {
    auto step = [&]() -> bool {
      auto loss = b.ForwardBackward(params, x, y, batch, /*seed=*/1, grads);
      if (!loss.ok()) {
        parasync::PrintErrorLine(kProgram, loss.status().ToString(), 1);
        return false;
      }
      return true;
    };
    // Warm up (buffers grow, libraries load), then size a repeat to about --seconds.
    const auto w0 = Clock::now();
    int warm = 0;
    while (warm < 3 || std::chrono::duration<double>(Clock::now() - w0).count() < 0.2 * seconds) {
      if (!step()) return 1;
      ++warm;
    }
    const double per_step = std::chrono::duration<double>(Clock::now() - w0).count() / warm;
    const int steps = std::max(3, static_cast<int>(seconds / per_step));
    std::vector<double> rates;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = Clock::now();
      for (int s = 0; s < steps; ++s) {
        if (!step()) return 1;
      }
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      rates.push_back(static_cast<double>(steps) * batch / secs);
    }
    std::printf("%s,%d,%.0f,%.0f,%.0f,%d,%d\n", label.c_str(), batch, Median(rates),
                *std::min_element(rates.begin(), rates.end()),
                *std::max_element(rates.begin(), rates.end()), repeats, steps);
    std::fflush(stdout);
  }
  return 0;
}
