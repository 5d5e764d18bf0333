// The CPU compute backend: runs a Model as a chain of CpuLayers (one file per layer family
// beside this one: oneDNN for dense layers (inner product), convolution, pooling and
// activations), then the loss. It is the reference the GPU backend is tested against.
//
// Buffers (compute::BufferPlan): every layer that computes a new array gets an activation
// buffer of its own, kept until the backward pass reads it; activations and dropout run in
// place, flatten is a view. The backward pass ping-pongs between two gradient buffers the
// size of the largest activation. Buffers grow to the largest row count seen and are then reused, so a warmed-up
// instance allocates nothing per call.
//
// Threads: oneDNN's OpenMP threads, sized by SetCpuComputeThreads(). Not thread-safe: one training thread uses an instance.

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/denormals.h"
#include "worker/compute/backend.h"
#include "worker/compute/buffer_plan.h"
#include "worker/compute/checks.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/compute/cpu/cpu_layer.h"
#include "worker/compute/cpu/loss.h"

namespace parasync {

namespace {

// Evaluate runs chunks of at most this many rows, and at most kEvalChunkBytes of
// activations: bounds scratch memory for large evaluation sets and wide models.
constexpr int64_t kEvalChunkRows = 1024;
constexpr int64_t kEvalChunkBytes = int64_t{64} << 20;

class CpuBackend final : public ComputeBackend {
 public:
  explicit CpuBackend(Model model) : model_(std::move(model)) {}

  // Makes the layers, each passed through `wrap` when it is set (cpu_backend.h).
  Status Init(const cpu::LayerWrapper& wrap) {
    const std::vector<LayerOp>& ops = model_.ops();
    const size_t n = ops.size();
    for (size_t i = 0; i < n; ++i) {
      const uint32_t index = static_cast<uint32_t>(i);
      PARASYNC_ASSIGN_OR_RETURN(auto layer, cpu::MakeCpuLayer(ops[i], index, dnn_));
      layers_.push_back(wrap ? wrap(ops[i], index, std::move(layer)) : std::move(layer));
    }
    std::vector<compute::OpMemory> memory;
    for (const auto& layer : layers_) memory.push_back(layer->buffer_use());
    plan_ = compute::BufferPlan::For(model_, memory);
    return Status::Ok();
  }

  std::string name() const override { return "cpu"; }

  Result<float> ForwardBackward(std::span<const float* const> params, const float* x,
                                const uint8_t* labels, int batch, uint64_t seed,
                                std::span<float* const> grads) override {
    PARASYNC_RETURN_IF_ERROR(compute::CheckForwardBackward(model_, params, x, labels, batch, grads));
    Reserve(batch);
    cpu::Pass pass;
    pass.rows = batch;
    pass.training = true;
    pass.seed = seed;
    PARASYNC_RETURN_IF_ERROR(Forward(params, x, pass));
    const size_t n = layers_.size();
    float* dlogits = DeltaBuffer(n);
    const double loss_sum =
        cpu::LossAndGradient(model_.loss(), Act(n, x), labels, batch, model_.outputs(),
                             1.0f / static_cast<float>(batch), dlogits, nullptr);
    for (size_t i = n; i-- > 0;) {
      const LayerOp& op = model_.ops()[i];
      float* dx = plan_.needs_dx[i] ? DeltaBuffer(i) : nullptr;
      if (!plan_.needs_dx[i] && op.num_variables == 0) continue;  // nothing to compute below here
      PARASYNC_RETURN_IF_ERROR(layers_[i]->Backward(
          params.data() + op.first_variable, Act(i, x), Act(i + 1, x), DeltaBuffer(i + 1), dx,
          grads.data() + op.first_variable, pass));
    }
    return static_cast<float>(loss_sum / batch);
  }

  Result<EvalResult> Evaluate(std::span<const float* const> params, const float* x,
                              const uint8_t* labels, int64_t n, float* logits) override {
    PARASYNC_RETURN_IF_ERROR(compute::CheckEvaluate(model_, params, x, labels, n));
    EvalResult result;
    if (n == 0) return result;
    const int64_t by_bytes =
        std::max<int64_t>(1, kEvalChunkBytes / (4 * std::max<int64_t>(plan_.per_example, 1)));
    const int64_t chunk = std::min({n, kEvalChunkRows, by_bytes});
    Reserve(static_cast<int>(chunk));
    const int64_t inputs = model_.input_size();
    for (int64_t start = 0; start < n; start += chunk) {
      const int rows = static_cast<int>(std::min(chunk, n - start));
      const uint8_t* y = labels + start;
      PARASYNC_RETURN_IF_ERROR(compute::CheckLabels(model_, y, rows, start));
      cpu::Pass pass;
      pass.rows = rows;
      pass.first_example = start;
      const float* xs = x + start * inputs;
      PARASYNC_RETURN_IF_ERROR(Forward(params, xs, pass));
      result.loss_sum += cpu::LossAndGradient(model_.loss(), Act(layers_.size(), xs), y, rows,
                                              model_.outputs(), 0.0f, nullptr, &result.correct);
      if (logits != nullptr) {
        std::memcpy(logits + start * model_.outputs(), Act(layers_.size(), xs),
                    static_cast<size_t>(rows * model_.outputs()) * sizeof(float));
      }
      result.count += rows;
    }
    return result;
  }

 private:
  Status Forward(std::span<const float* const> params, const float* x, const cpu::Pass& pass) {
    for (size_t i = 0; i < layers_.size(); ++i) {
      PARASYNC_RETURN_IF_ERROR(layers_[i]->Forward(params.data() + model_.ops()[i].first_variable,
                                                   Act(i, x), Act(i + 1, x), pass));
    }
    return Status::Ok();
  }

  // The input of op j (the output of op j-1); the caller's x for j = 0 or a view of it.
  float* Act(size_t j, const float* x) {
    return plan_.act[j] < 0 ? const_cast<float*>(x)
                            : buffers_[static_cast<size_t>(plan_.act[j])].data();
  }
  float* DeltaBuffer(size_t j) { return deltas_[static_cast<size_t>(plan_.delta[j])].data(); }

  // Grows the buffers to hold `rows` examples; never shrinks them.
  void Reserve(int rows) {
    if (rows <= capacity_) return;
    capacity_ = rows;
    buffers_.resize(plan_.act_elements.size());
    for (size_t b = 0; b < buffers_.size(); ++b) {
      buffers_[b].resize(static_cast<size_t>(rows) * static_cast<size_t>(plan_.act_elements[b]));
    }
    for (std::vector<float>& d : deltas_) {
      d.resize(static_cast<size_t>(rows) * static_cast<size_t>(plan_.delta_elements));
    }
  }

  const Model model_;
  cpu::OneDnn dnn_;
  std::vector<std::unique_ptr<cpu::CpuLayer>> layers_;
  compute::BufferPlan plan_;
  int capacity_ = 0;
  std::vector<std::vector<float>> buffers_;
  std::vector<float> deltas_[2];
};

}  // namespace

Result<std::unique_ptr<ComputeBackend>> CreateCpuBackend(const Model& model) {
  return cpu::CreateCpuBackendWrappingLayers(model, nullptr);
}

Result<std::unique_ptr<ComputeBackend>> cpu::CreateCpuBackendWrappingLayers(
    const Model& model, const LayerWrapper& wrap) {
  auto backend = std::make_unique<CpuBackend>(model);
  PARASYNC_RETURN_IF_ERROR(backend->Init(wrap));
  return std::unique_ptr<ComputeBackend>(std::move(backend));
}

void SetCpuComputeThreads(int threads) {
  omp_set_num_threads(threads);
  // OpenMP keeps its team's threads for the process, so setting the bits once on each, from
  // inside a region of the team's size, covers every later oneDNN primitive and loop.
  FlushDenormalsOnThisThread();
#pragma omp parallel num_threads(threads)
  FlushDenormalsOnThisThread();
}

bool CpuComputeThreadsFlushDenormals() {
  bool all = DenormalsFlushedOnThisThread();
#pragma omp parallel reduction(&& : all)
  all = all && DenormalsFlushedOnThisThread();
  return all;
}

std::string DescribeCpuCompute() {
  const dnnl_version_t* v = dnnl_version();
  const char* runtime = v->cpu_runtime == DNNL_RUNTIME_OMP        ? "OpenMP"
                        : v->cpu_runtime == DNNL_RUNTIME_TBB      ? "TBB"
                        : v->cpu_runtime == DNNL_RUNTIME_SEQ      ? "sequential"
                        : v->cpu_runtime == DNNL_RUNTIME_THREADPOOL ? "threadpool"
                                                                  : "unknown";
  const char* isa = "baseline";
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: isa = "SSE4.1"; break;
    case dnnl_cpu_isa_avx: isa = "AVX"; break;
    case dnnl_cpu_isa_avx2: isa = "AVX2"; break;
    case dnnl_cpu_isa_avx2_vnni: isa = "AVX2-VNNI"; break;
    case dnnl_cpu_isa_avx512_mic: isa = "AVX-512 MIC"; break;
    case dnnl_cpu_isa_avx512_mic_4ops: isa = "AVX-512 MIC 4OPS"; break;
    case dnnl_cpu_isa_avx512_core: isa = "AVX-512"; break;
    case dnnl_cpu_isa_avx512_core_vnni: isa = "AVX-512 VNNI"; break;
    case dnnl_cpu_isa_avx512_core_bf16: isa = "AVX-512 BF16"; break;
    case dnnl_cpu_isa_avx512_core_amx: isa = "AVX-512 AMX"; break;
    default: break;
  }
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " (" + runtime + " runtime, " + isa + " kernels), " +
         std::to_string(omp_get_max_threads()) + " thread(s), denormals " +
         (CpuComputeThreadsFlushDenormals() ? "flushed to zero" : "kept");
}

}  // namespace parasync
