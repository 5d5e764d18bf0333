// The entry points of libparasync_cuda.so (worker/compute/cuda/cuda_module.h).
#include "worker/compute/cuda/cuda_module.h"

#include <cstdio>
#include <utility>
#include <vector>

#include "common/denormals.h"
#include "worker/compute/cuda/cuda_backend.h"
#include "worker/compute/cuda/device_query.h"

extern "C" {

int parasync_cuda_device_count(char* err, size_t err_len) {
  return parasync::cuda::CountDevices(err, err_len);
}

void* parasync_cuda_create_backend(const char* model_json, const int64_t* input, int input_rank,
                                   int64_t id_columns, int64_t sparse_rows, int device, char* err,
                                   size_t err_len) {
  // The thread that creates the backend is the one that runs it: its host-side work (the
  // sparse batch's gather, the loss) stays off denormals' slow path as on the CPU.
  parasync::FlushDenormalsOnThisThread();
  auto spec = parasync::ParseModelSpecJson(model_json, "the model description");
  if (!spec.ok()) {
    std::snprintf(err, err_len, "%s", spec.status().message().c_str());
    return nullptr;
  }
  auto model = parasync::Model::Build(
      *spec, std::vector<int64_t>(input, input + (input_rank > 0 ? input_rank : 0)),
      parasync::ModelInputs{id_columns, sparse_rows});
  if (!model.ok()) {
    std::snprintf(err, err_len, "%s", model.status().message().c_str());
    return nullptr;
  }
  auto backend = parasync::cuda::CreateCudaBackend(*model, device);
  if (!backend.ok()) {
    std::snprintf(err, err_len, "%s", backend.status().message().c_str());
    return nullptr;
  }
  return std::move(backend).value().release();
}

void parasync_cuda_destroy_backend(void* backend) {
  delete static_cast<parasync::ComputeBackend*>(backend);
}

}  // extern "C"
