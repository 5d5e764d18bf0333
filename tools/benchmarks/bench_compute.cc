// parasync-bench-compute: examples/sec of one worker's compute — ForwardBackward, exactly as
// the trainer calls it (host parameters in, host gradients out, page-locked buffers from the
// backend), no network — for a list of batch sizes on one device. Prints CSV:
//   device,batch,median_examples_per_sec,min,max,repeats,steps_per_repeat
// tools/bench-worker runs it for the CPU and the GPU beside PyTorch and prints the table.
//
// A model whose first layer is a sparse embedding (ctr) is timed as the worker runs it on
// parasync-gen-ctr's data: per batch size, a synthetic batch of K id columns (drawn as the
// generator draws them) and D dense features, its ids deduplicated into compact indices
// (GatherSparseBatch), and the model built with a compact table of SparseRowsNeeded(batch,
// K) rows, the buffer the worker pulls the batch's rows into.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "common/process.h"
#include "tools/benchmarks/stats.h"
#include "tools/zipf_sampler.h"
#include "worker/compute/backend.h"
#include "worker/compute/backend_factory.h"
#include "worker/data/dataset.h"
#include "worker/model/model.h"
#include "worker/sparse_batch.h"

namespace {

using Clock = std::chrono::steady_clock;
using parasync::ComputeBackend;
using parasync::bench::Median;

constexpr const char* kProgram = "parasync-bench-compute";

// parasync-gen-ctr's defaults (tools/gen_ctr_main.cc): the batches a ctr worker trains on.
constexpr int64_t kCtrFields = 8;
constexpr int64_t kCtrDense = 4;
constexpr double kCtrZipf = 1.6;
constexpr int64_t kCtrVocab = 10000000;

struct Options {
  std::string device = "cpu";
  std::string model = "mlp";
  std::string input_text;  // empty: the model's default (1,28,28, or K + D for a sparse one)
  std::string batches_text = "64,128,256,512,1024,2048,4096,8192";
  double seconds = 0.5;
  int repeats = 5;
  int threads = 1;
  bool describe = false;
  int64_t id_columns = -1;  // -1: kCtrFields for a sparse model, else none
  double zipf = kCtrZipf;
  int64_t vocab = kCtrVocab;
};

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

// "1,28,28" -> {1, 28, 28}; empty when malformed.
std::vector<int64_t> ParseShape(const std::string& text) {
  std::vector<int64_t> shape;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long long d = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || d < 1) return {};
    shape.push_back(d);
  }
  return shape;
}

bool IsSparse(const parasync::ModelSpec& spec) {
  return !spec.layers.empty() && spec.layers.front().kind == parasync::LayerKind::kEmbedding &&
         spec.layers.front().sparse;
}

// Uniform doubles in [0, 1) for ZipfSampler, from the top 53 bits.
struct UniformStream {
  std::mt19937_64* gen;
  double Uniform() { return static_cast<double>((*gen)() >> 11) * 0x1.0p-53; }
};

// A synthetic batch of `batch` ctr examples as parasync-gen-ctr draws them (field f's ids
// are f * vocab + a Zipf rank; the generator's per-field permutation of the ranks changes
// which ids repeat, not how often), deterministic per batch size.
parasync::Dataset SyntheticCtrBatch(const Options& o, int64_t ids, int64_t dense, int batch) {
  parasync::Dataset d;
  d.n = batch;
  d.dim = dense;
  d.shape = {dense};
  d.id_columns = ids;
  std::mt19937_64 gen(static_cast<uint64_t>(batch));
  UniformStream stream{&gen};
  std::normal_distribution<float> normal;
  const parasync::ZipfSampler zipf(o.vocab, o.zipf);
  for (int i = 0; i < batch; ++i) {
    for (int64_t f = 0; f < ids; ++f) {
      d.ids.push_back(static_cast<uint64_t>(f * o.vocab + zipf.Sample(stream) - 1));
    }
    for (int64_t j = 0; j < dense; ++j) d.x.push_back(normal(gen));
    d.y.push_back(static_cast<uint8_t>(gen() % 2));
  }
  return d;
}

// What --describe prints: the model's description, plus for a sparse model a top-level
// "sparse_input" object (not part of the model-file format; tools/benchmarks/torch_model.py
// reads it) saying how the bench builds its batches.
std::string Describe(const parasync::Model& net, const Options& o) {
  const std::string model = parasync::ModelSpecToJson(net.spec());
  if (!IsSparse(net.spec())) return model;
  nlohmann::json j = nlohmann::json::parse(model);
  j["sparse_input"] = {
      {"id_columns", net.id_columns()},
      {"dense_features", net.input_size() - net.id_columns()},
      {"zipf", o.zipf},
      {"vocab_per_field", o.vocab},
      // The compact table of a batch of B examples has B * compact_rows_per_example rows.
      {"compact_rows_per_example", parasync::SparseRowsNeeded(1, net.id_columns())}};
  return j.dump();
}

// Page-locked host buffers where the backend offers them, as the trainer's are; dropped
// before the backend (ComputeBackend::AllocateHost).
class HostBuffers {
 public:
  explicit HostBuffers(ComputeBackend& b) : b_(b) {}
  float* Floats(size_t n) {
    blocks_.push_back(b_.AllocateHost(n * sizeof(float)));
    if (blocks_.back() == nullptr) {
      std::fprintf(stderr, "%s: out of host memory\n", kProgram);
      std::exit(1);
    }
    return static_cast<float*>(blocks_.back().get());
  }

 private:
  ComputeBackend& b_;
  std::vector<std::shared_ptr<void>> blocks_;
};

// One timed configuration: parameters, gradients, a batch of up to max_batch examples.
struct Arrays {
  std::vector<const float*> params;
  std::vector<float*> grads;
  float* x = nullptr;
  uint8_t* y = nullptr;
};

// Parameters uniform in [-0.05, 0.05], gradient buffers, room for max_batch examples.
Arrays Allocate(const parasync::Model& net, HostBuffers& host, int max_batch,
                std::mt19937_64& gen) {
  std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
  Arrays a;
  for (const auto& v : net.variables()) {
    float* p = host.Floats(static_cast<size_t>(v.num_elements()));
    for (int64_t k = 0; k < v.num_elements(); ++k) p[k] = uniform(gen);
    a.params.push_back(p);
    a.grads.push_back(host.Floats(static_cast<size_t>(v.num_elements())));
  }
  a.x = host.Floats(static_cast<size_t>(max_batch * net.input_size()));
  a.y = reinterpret_cast<uint8_t*>(host.Floats(static_cast<size_t>(max_batch) / 4 + 1));
  return a;
}

// A dense model's inputs: uniform features (or ids of a first non-sparse embedding), labels.
void FillDense(const parasync::Model& net, int max_batch, std::mt19937_64& gen, Arrays* a) {
  const int64_t inputs = net.input_size();
  const parasync::LayerOp& first = net.ops().front();
  const bool ids = first.spec.kind == parasync::LayerKind::kEmbedding;
  std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
  for (int64_t k = 0; k < max_batch * inputs; ++k) {
    a->x[k] = ids ? static_cast<float>(gen() % static_cast<uint64_t>(first.spec.vocab))
                  : uniform(gen) + 0.05f;
  }
  const uint64_t classes = net.loss() == parasync::LossKind::kSigmoidCrossEntropy
                               ? 2 : static_cast<uint64_t>(net.outputs());
  for (int i = 0; i < max_batch; ++i) {
    a->y[i] = static_cast<uint8_t>(gen() % std::min<uint64_t>(classes, 256));
  }
}

// Times ForwardBackward on `batch` examples and prints its CSV row; false on failure.
bool TimeBatch(ComputeBackend& b, const Arrays& a, int batch, const Options& o,
               const std::string& label) {
  std::vector<float*> grads = a.grads;
  auto step = [&]() -> bool {
    auto loss = b.ForwardBackward(a.params, a.x, a.y, batch, /*seed=*/1, grads);
    if (!loss.ok()) {
      parasync::PrintErrorLine(kProgram, loss.status().ToString(), 1);
      return false;
    }
    return true;
  };
  // Warm up (buffers grow, libraries load), then size a repeat to about --seconds.
  const auto w0 = Clock::now();
  int warm = 0;
  while (warm < 3 || std::chrono::duration<double>(Clock::now() - w0).count() < 0.2 * o.seconds) {
    if (!step()) return false;
    ++warm;
  }
  const double per_step = std::chrono::duration<double>(Clock::now() - w0).count() / warm;
  const int steps = std::max(3, static_cast<int>(o.seconds / per_step));
  std::vector<double> rates;
  for (int r = 0; r < o.repeats; ++r) {
    const auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) {
      if (!step()) return false;
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    rates.push_back(static_cast<double>(steps) * batch / secs);
  }
  std::printf("%s,%d,%.0f,%.0f,%.0f,%d,%d\n", label.c_str(), batch, Median(rates),
              *std::min_element(rates.begin(), rates.end()),
              *std::max_element(rates.begin(), rates.end()), o.repeats, steps);
  std::fflush(stdout);
  return true;
}

int Fail(const std::string& line) {
  return parasync::PrintErrorLine(kProgram, line, parasync::kExitBadUsage);
}

parasync::Result<std::unique_ptr<ComputeBackend>> Backend(const parasync::DeviceChoice& choice,
                                                          const parasync::Model& net,
                                                          const Options& o) {
  std::string why;
  auto backend = parasync::CreateBackend(choice, net, 0, &why);
  static bool header = false;
  if (backend.ok() && !header) {
    header = true;
    std::printf("device,batch,median_examples_per_sec,min,max,repeats,steps_per_repeat\n");
    std::fprintf(stderr, "%s: %s, model %s, %d thread(s)\n", kProgram,
                 (*backend)->name().c_str(), o.model.c_str(), o.threads);
  }
  return backend;
}

// Every batch size of a dense model on one backend; 0, or the exit status.
int RunDense(const parasync::Model& net, const parasync::DeviceChoice& choice,
             const std::vector<int>& batches, const Options& o, const std::string& label) {
  auto backend = Backend(choice, net, o);
  if (!backend.ok()) return Fail(backend.status().message());
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  std::mt19937_64 gen(1);
  HostBuffers host(**backend);
  Arrays a = Allocate(net, host, max_batch, gen);
  FillDense(net, max_batch, gen, &a);
  for (int batch : batches) {
    if (!TimeBatch(**backend, a, batch, o, label)) return 1;
  }
  return 0;
}

// A sparse model: per batch size its synthetic batch, the model with that batch's compact
// table, a backend for it; 0, or the exit status.
int RunSparse(const parasync::ModelSpec& spec, const std::vector<int64_t>& input,
              const parasync::DeviceChoice& choice, const std::vector<int>& batches,
              const Options& o, const std::string& label) {
  const int64_t ids = o.id_columns;
  for (int batch : batches) {
    const parasync::ModelInputs inputs{ids, parasync::SparseRowsNeeded(batch, ids)};
    auto net = parasync::Model::Build(spec, input, inputs);
    if (!net.ok()) return Fail(net.status().message());
    auto backend = Backend(choice, *net, o);
    if (!backend.ok()) return Fail(backend.status().message());
    std::mt19937_64 gen(1);
    HostBuffers host(**backend);
    Arrays a = Allocate(*net, host, batch, gen);
    const parasync::Dataset data = SyntheticCtrBatch(o, ids, net->input_size() - ids, batch);
    std::vector<int64_t> idx(static_cast<size_t>(batch));
    std::iota(idx.begin(), idx.end(), 0);
    const parasync::SparseBatch rows = parasync::GatherSparseBatch(data, idx, a.x, a.y);
    std::fprintf(stderr, "%s: batch %d: %lld ids, %zu unique rows in a compact table of %lld\n",
                 kProgram, batch, static_cast<long long>(batch * ids), rows.unique_ids.size(),
                 static_cast<long long>(inputs.sparse_rows));
    if (!TimeBatch(**backend, a, batch, o, label)) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Times one worker's compute (forward + backward of the model, host arrays in and out, no "
      "network) for each batch size on one device, and prints CSV: device, batch, median "
      "examples/sec over the repeats, min, max, repeats, steps per repeat."};
  app.footer("Example:\n  parasync-bench-compute --device cuda --batches 64,1024,8192\n"
             "  parasync-bench-compute --model ctr --batches 256,4096   (8 ids + 4 dense)\n"
             "  tools/bench-worker runs it for the CPU and the GPU beside PyTorch.");
  Options o;
  app.add_option("--device", o.device, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--model", o.model,
                 "A built-in model (mlp, cnn, lenet5, ctr), MLP widths or a model file")
      ->capture_default_str();
  app.add_option("--input", o.input_text,
                 "The shape of one example: C,H,W or D (default 1,28,28; for a model with a "
                 "sparse embedding, K id columns + D dense features, default 8 + 4 = 12)");
  app.add_option("--batches", o.batches_text, "Comma-separated batch sizes")->capture_default_str();
  app.add_option("--seconds", o.seconds, "Seconds per repeat and batch size (at least 3 steps)")
      ->check(CLI::Range(0.01, 600.0))
      ->capture_default_str();
  app.add_option("--repeats", o.repeats, "Timed repeats per batch size; the median is reported")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--threads", o.threads, "Threads of the CPU backend (oneDNN's OpenMP threads)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--id-columns", o.id_columns,
                 "Sparse embedding models: K, the id columns leading --input (default 8, as "
                 "parasync-gen-ctr writes)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--zipf", o.zipf, "Sparse embedding models: Zipf exponent of the ids (> 1)")
      ->check(CLI::Range(1.0001, 100.0))
      ->capture_default_str();
  app.add_option("--vocab", o.vocab, "Sparse embedding models: values per id column")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_flag("--describe", o.describe,
               "Print the model's description (JSON, docs/models.md; for a sparse embedding "
               "model with a \"sparse_input\" object) and exit: what "
               "tools/benchmarks/torch_model.py builds the same model from");
  app.name(kProgram);
  // A bad flag is one line and status 2, as everywhere (common/cli.h).
  if (auto done = parasync::ParseCommandLine(app, argc, argv)) return *done;

  const std::vector<int> batches = ParseBatches(o.batches_text);
  if (batches.empty()) {
    return Fail("--batches must be positive integers, comma-separated, not '" + o.batches_text +
                "'");
  }
  auto spec = parasync::ResolveModelSpec(o.model);
  if (!spec.ok()) return Fail(spec.status().message());
  const bool sparse = IsSparse(*spec);
  if (!sparse && o.id_columns >= 0) {
    return Fail("--id-columns is for a model whose first layer is a sparse embedding (ctr)");
  }
  if (sparse && o.id_columns < 0) o.id_columns = kCtrFields;
  if (o.input_text.empty()) {
    o.input_text = sparse ? std::to_string(o.id_columns + kCtrDense) : "1,28,28";
  }
  const std::vector<int64_t> input = ParseShape(o.input_text);
  if (input.empty()) return Fail("--input must be C,H,W or D, not '" + o.input_text + "'");
  // A sparse model checked here with the largest batch's compact table; RunSparse builds it
  // per batch size.
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  parasync::ModelInputs inputs;
  if (sparse) inputs = {o.id_columns, parasync::SparseRowsNeeded(max_batch, o.id_columns)};
  auto net = parasync::Model::Build(*spec, input, inputs);
  if (!net.ok()) return Fail(net.status().message());
  if (o.describe) {
    std::printf("%s\n", Describe(*net, o).c_str());
    return 0;
  }
  auto choice = parasync::ParseDevice(o.device);
  if (!choice.ok() || choice->kind == parasync::DeviceChoice::Kind::kAuto) {
    return Fail("--device must be cpu, cuda or cuda:N");
  }
  parasync::SetCpuComputeThreads(o.threads);
  const std::string label = choice->kind == parasync::DeviceChoice::Kind::kCpu ? "cpu" : "cuda";
  // What it ran with, in the form tools/bench-worker collects from both sides.
  if (label == "cpu") {
    std::fprintf(stderr, "%s: ran with: %s\n", kProgram, parasync::DescribeCpuCompute().c_str());
  }
  return sparse ? RunSparse(*spec, input, *choice, batches, o, label)
                : RunDense(*net, *choice, batches, o, label);
}
