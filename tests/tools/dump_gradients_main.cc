// parasync-dump-gradients: one training step of a model on the CPU backend, written out for a
// test on the other side to recompute (tests/tools/torch_parity_test.py builds the same model
// with tools/benchmarks/torch_model.py and compares). For a model and an input shape it
// draws fixed parameters and a fixed batch from --seed, runs ForwardBackward once and writes
// into --out:
//   index.json      the model, input shape, batch, dropout seed, the loss, and per variable
//                   (Model::variables() order) its name, shape and files; per dropout op its
//                   name, rate and mask file
//   v<i>.f32        variable i's values, g<i>.f32 its gradient (float32, little-endian, in
//                   parasync's layout: dense kernels [in, units], conv kernels OIHW)
//   x.f32, y.u8     the batch: [batch, input] floats (ids as floats for an embedding) and labels
//   mask<j>.u8      dropout op j's keep mask [batch, size] (1 kept), as the backend draws it
// Kernels are uniform in their initializer's range, every other variable (biases) uniform in
// [-0.1, 0.1], so that no variable is zero in the forward pass. A model with a sparse
// embedding is built as the worker builds it, with a compact table of SparseRowsNeeded(batch,
// K) rows, and its ids drawn in [0, rows).
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "common/process.h"
#include "worker/compute/backend.h"
#include "worker/compute/dropout_mask.h"
#include "worker/model/model.h"
#include "worker/sparse_batch.h"

namespace {

constexpr const char* kProgram = "parasync-dump-gradients";

struct Options {
  std::string model;
  std::vector<int64_t> input;  // empty: 1,28,28, or K + 4 dense features for a sparse model
  std::string out;
  int batch = 8;
  uint64_t seed = 1;
  int64_t id_columns = 8;  // sparse embedding models only
};

int Fail(const std::string& line) {
  return parasync::PrintErrorLine(kProgram, line, parasync::kExitBadUsage);
}

// Writes `n` elements of `data` to `path`; "" or the line to fail with.
template <typename T>
std::string WriteRaw(const std::string& path, const T* data, size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(T)));
  out.close();
  return out ? "" : "cannot write " + path;
}

// The batch: features uniform in [0, 1), or for an embedding first layer its id columns as
// integers in [0, table rows) and the dense features after them standard normal; labels any
// class the loss takes.
void FillBatch(const parasync::Model& net, int batch, std::mt19937_64& gen,
               std::vector<float>* x, std::vector<uint8_t>* y) {
  const parasync::LayerOp& first = net.ops().front();
  const bool embedding = first.spec.kind == parasync::LayerKind::kEmbedding;
  const int64_t width = net.input_size();
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::normal_distribution<float> normal;
  for (int i = 0; i < batch; ++i) {
    for (int64_t k = 0; k < width; ++k) {
      if (!embedding) {
        x->push_back(uniform(gen));
      } else if (k < first.id_columns) {
        x->push_back(static_cast<float>(gen() % static_cast<uint64_t>(first.table_rows)));
      } else {
        x->push_back(normal(gen));
      }
    }
  }
  const uint64_t classes = net.loss() == parasync::LossKind::kSigmoidCrossEntropy
                               ? 2 : static_cast<uint64_t>(net.outputs());
  for (int i = 0; i < batch; ++i) y->push_back(static_cast<uint8_t>(gen() % classes));
}

int Dump(const parasync::Model& net, const Options& o) {
  auto backend = parasync::CreateCpuBackend(net);
  if (!backend.ok()) return Fail(backend.status().message());
  std::mt19937_64 gen(o.seed);
  const auto& vars = net.variables();
  std::vector<std::vector<float>> params(vars.size()), grads(vars.size());
  std::vector<const float*> param_ptrs;
  std::vector<float*> grad_ptrs;
  for (size_t v = 0; v < vars.size(); ++v) {
    const float limit = vars[v].init.kind == parasync::InitKind::kUniform ? vars[v].init.value
                                                                         : 0.1f;
    std::uniform_real_distribution<float> uniform(-limit, limit);
    for (int64_t k = 0; k < vars[v].num_elements(); ++k) params[v].push_back(uniform(gen));
    grads[v].assign(static_cast<size_t>(vars[v].num_elements()), 0.0f);
    param_ptrs.push_back(params[v].data());
    grad_ptrs.push_back(grads[v].data());
  }
  std::vector<float> x;
  std::vector<uint8_t> y;
  FillBatch(net, o.batch, gen, &x, &y);
  const uint64_t dropout_seed = gen();
  auto loss = (*backend)->ForwardBackward(param_ptrs, x.data(), y.data(), o.batch, dropout_seed,
                                          grad_ptrs);
  if (!loss.ok()) return parasync::PrintErrorLine(kProgram, loss.status().ToString(), 1);

  nlohmann::json index = {{"model", o.model},         {"input", o.input},
                          {"batch", o.batch},         {"dropout_seed", dropout_seed},
                          {"loss", *loss},            {"x", "x.f32"},
                          {"y", "y.u8"},              {"variables", nlohmann::json::array()},
                          {"dropout", nlohmann::json::array()}};
  std::string err = WriteRaw(o.out + "/x.f32", x.data(), x.size());
  if (err.empty()) err = WriteRaw(o.out + "/y.u8", y.data(), y.size());
  for (size_t v = 0; v < vars.size() && err.empty(); ++v) {
    const std::string p = "v" + std::to_string(v) + ".f32", g = "g" + std::to_string(v) + ".f32";
    index["variables"].push_back(
        {{"name", vars[v].name}, {"shape", vars[v].shape}, {"values", p}, {"gradient", g}});
    err = WriteRaw(o.out + "/" + p, params[v].data(), params[v].size());
    if (err.empty()) err = WriteRaw(o.out + "/" + g, grads[v].data(), grads[v].size());
  }
  // The masks the backend's dropout layers drew (worker/compute/dropout_mask.h): element k of
  // the [batch, size] activation of op i is kept when DropoutKeeps(seed, i, k, rate).
  const auto& ops = net.ops();
  for (size_t i = 0; i < ops.size() && err.empty(); ++i) {
    if (ops[i].spec.kind != parasync::LayerKind::kDropout) continue;
    const size_t n = static_cast<size_t>(o.batch) * static_cast<size_t>(ops[i].out_size());
    std::vector<uint8_t> mask(n);
    for (size_t k = 0; k < n; ++k) {
      mask[k] = parasync::compute::DropoutKeeps(dropout_seed, static_cast<uint32_t>(i), k,
                                                ops[i].spec.rate) ? 1 : 0;
    }
    const std::string m = "mask" + std::to_string(index["dropout"].size()) + ".u8";
    index["dropout"].push_back({{"name", ops[i].spec.name}, {"rate", ops[i].spec.rate},
                                {"shape", {o.batch, ops[i].out_size()}}, {"mask", m}});
    err = WriteRaw(o.out + "/" + m, mask.data(), mask.size());
  }
  if (err.empty()) {
    std::ofstream out(o.out + "/index.json");
    out << index.dump(1) << "\n";
    out.close();
    if (!out) err = "cannot write " + o.out + "/index.json";
  }
  if (!err.empty()) return Fail(err);
  std::printf("%s: %s on %s, batch %d: loss %.9g, %zu variables, %zu dropout masks\n", kProgram,
              o.model.c_str(), parasync::ShapeString(o.input).c_str(), o.batch, *loss, vars.size(),
              index["dropout"].size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Runs one ForwardBackward of a model on the CPU backend with fixed parameters and a fixed "
      "batch, and writes the parameters, the batch, the dropout masks, the loss and every "
      "variable's gradient to a directory (raw little-endian arrays and index.json)."};
  app.footer("Example:\n  parasync-dump-gradients --model lenet5 --input 3,16,24 --out /tmp/g\n"
             "  tests/tools/torch_parity_test.py compares them with PyTorch.");
  Options o;
  app.add_option("--model", o.model, "A built-in model, MLP widths or a model file")->required();
  app.add_option("--input", o.input,
                 "One example's shape: C,H,W or D (default 1,28,28; a sparse embedding model's "
                 "K + 4)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--out", o.out, "An existing directory to write into")->required();
  app.add_option("--batch", o.batch, "Examples in the batch")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Draws the parameters, the batch and the dropout seed")
      ->capture_default_str();
  app.add_option("--id-columns", o.id_columns, "Sparse embedding models: K id columns")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.name(kProgram);
  if (auto done = parasync::ParseCommandLine(app, argc, argv)) return *done;

  auto spec = parasync::ResolveModelSpec(o.model);
  if (!spec.ok()) return Fail(spec.status().message());
  const bool sparse = spec->layers.front().kind == parasync::LayerKind::kEmbedding &&
                      spec->layers.front().sparse;
  if (o.input.empty()) {
    o.input = sparse ? std::vector<int64_t>{o.id_columns + 4} : std::vector<int64_t>{1, 28, 28};
  }
  parasync::ModelInputs inputs;
  if (sparse) inputs = {o.id_columns, parasync::SparseRowsNeeded(o.batch, o.id_columns)};
  auto net = parasync::Model::Build(*spec, o.input, inputs);
  if (!net.ok()) return Fail(net.status().message());
  parasync::SetCpuComputeThreads(1);
  return Dump(*net, o);
}
