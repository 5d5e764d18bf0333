#include "worker/compute/backend_factory.h"

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "worker/compute/cuda/cuda_module.h"

namespace parasync {

Result<DeviceChoice> ParseDevice(const std::string& text) {
  DeviceChoice d;
  if (text == "auto") return d;
  if (text == "cpu") {
    d.kind = DeviceChoice::Kind::kCpu;
    return d;
  }
  if (text == "cuda") {
    d.kind = DeviceChoice::Kind::kCuda;
    return d;
  }
  if (text.rfind("cuda:", 0) == 0) {
    const char* b = text.data() + 5;
    const char* e = text.data() + text.size();
    int gpu = -1;
    auto [p, ec] = std::from_chars(b, e, gpu);
    if (ec == std::errc() && p == e && b != e && gpu >= 0) {
      d.kind = DeviceChoice::Kind::kCuda;
      d.gpu = gpu;
      return d;
    }
  }
  return Status::InvalidArgument("--device must be auto, cpu, cuda or cuda:N, not '" + text + "'");
}

Result<int> PickGpu(const DeviceChoice& device, int local_rank, int count) {
  if (count <= 0) return Status::Unavailable("no GPU");
  if (device.gpu) {
    if (*device.gpu >= count) {
      return Status::InvalidArgument("cuda:" + std::to_string(*device.gpu) +
                                     " requested but only " + std::to_string(count) +
                                     " GPU(s) are present");
    }
    return *device.gpu;
  }
  if (local_rank < 0) {
    return Status::InvalidArgument("--local-rank must not be negative, got " +
                                   std::to_string(local_rank));
  }
  return local_rank % count;
}

Result<int> LocalRankFromEnvironment() {
  const char* text = std::getenv("LOCAL_RANK");
  if (text == nullptr || *text == '\0') return 0;
  const char* end = text + std::strlen(text);
  int rank = -1;
  auto [p, ec] = std::from_chars(text, end, rank);
  if (ec != std::errc() || p != end || rank < 0) {
    return Status::InvalidArgument(std::string("$LOCAL_RANK must be a non-negative integer, not '") +
                                   text + "'");
  }
  return rank;
}

namespace {

// Wraps the module's backend object so it is deleted through the module.
class ModuleBackend final : public ComputeBackend {
 public:
  ModuleBackend(ComputeBackend* impl, decltype(&parasync_cuda_destroy_backend) destroy)
      : impl_(impl), destroy_(destroy) {}
  ~ModuleBackend() override { destroy_(impl_); }
  std::string name() const override { return impl_->name(); }
  std::shared_ptr<void> AllocateHost(size_t bytes) override { return impl_->AllocateHost(bytes); }
  Result<float> ForwardBackward(std::span<const float* const> params, const float* x,
                                const uint8_t* labels, int batch, uint64_t seed,
                                std::span<float* const> grads) override {
    return impl_->ForwardBackward(params, x, labels, batch, seed, grads);
  }
  Result<EvalResult> Evaluate(std::span<const float* const> params, const float* x,
                              const uint8_t* labels, int64_t n, float* logits) override {
    return impl_->Evaluate(params, x, labels, n, logits);
  }

 private:
  ComputeBackend* impl_;
  decltype(&parasync_cuda_destroy_backend) destroy_;
};

std::string ModulePath() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "libparasync_cuda.so";
  // Build tree: bin/ and lib/ side by side; install: the same layout.
  return (exe.parent_path().parent_path() / "lib" / "libparasync_cuda.so").string();
}

Result<std::unique_ptr<ComputeBackend>> CreateCuda(const DeviceChoice& device, const Model& model,
                                                   int local_rank, std::string* picked) {
  const std::string path = ModulePath();
  void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (module == nullptr) {
    const char* e = dlerror();
    return Status::Unavailable("the CUDA backend module is not available (" +
                               std::string(e ? e : path) + "); this build has no CUDA support");
  }
  // The module stays loaded for the life of the process: CUDA runtimes do not unload cleanly.
  auto count_fn = reinterpret_cast<decltype(&parasync_cuda_device_count)>(
      dlsym(module, "parasync_cuda_device_count"));
  auto create_fn = reinterpret_cast<decltype(&parasync_cuda_create_backend)>(
      dlsym(module, "parasync_cuda_create_backend"));
  auto destroy_fn = reinterpret_cast<decltype(&parasync_cuda_destroy_backend)>(
      dlsym(module, "parasync_cuda_destroy_backend"));
  if (!count_fn || !create_fn || !destroy_fn) {
    return Status::Internal(path + " lacks the parasync CUDA module entry points");
  }
  std::array<char, 512> err{};
  const int count = count_fn(err.data(), err.size());
  if (count <= 0) return Status::Unavailable(std::string("no GPU: ") + err.data());
  auto gpu = PickGpu(device, local_rank, count);
  if (!gpu.ok()) return gpu.status();
  if (device.gpu) {
    *picked = "cuda:" + std::to_string(*gpu);
  } else {
    *picked = "local rank " + std::to_string(local_rank) + " of " + std::to_string(count) +
              " GPU(s): cuda:" + std::to_string(*gpu);
    if (local_rank >= count) *picked += ", shared with local rank " + std::to_string(*gpu);
  }
  // The module builds its own Model from the description, the input shape and its inputs.
  const std::string description = ModelSpecToJson(model.spec());
  const std::vector<int64_t>& input = model.input_shape();
  void* impl = create_fn(description.c_str(), input.data(), static_cast<int>(input.size()),
                         model.inputs().id_columns, model.inputs().sparse_rows, *gpu,
                         err.data(), err.size());
  if (impl == nullptr) return Status::NotSupported(err.data());
  return std::unique_ptr<ComputeBackend>(
      new ModuleBackend(static_cast<ComputeBackend*>(impl), destroy_fn));
}

}  // namespace

Result<std::unique_ptr<ComputeBackend>> CreateBackend(const DeviceChoice& device,
                                                      const Model& model, int local_rank,
                                                      std::string* why) {
  std::string picked;
  switch (device.kind) {
    case DeviceChoice::Kind::kCpu:
      *why = "--device cpu";
      return CreateCpuBackend(model);
    case DeviceChoice::Kind::kCuda: {
      auto cuda = CreateCuda(device, model, local_rank, &picked);
      *why = "--device cuda; " + picked;
      if (!cuda.ok()) {
        return Status(cuda.status().code(),
                      "--device cuda: " + cuda.status().message() +
                          "; --device auto or cpu trains on the CPU");
      }
      return cuda;
    }
    case DeviceChoice::Kind::kAuto: {
      auto cuda = CreateCuda(device, model, local_rank, &picked);
      if (cuda.ok()) {
        *why = "--device auto found a GPU; " + picked;
        return cuda;
      }
      *why = "--device auto: " + cuda.status().message() + "; using the CPU";
      return CreateCpuBackend(model);
    }
  }
  return Status::Internal("unknown device kind");
}

}  // namespace parasync
