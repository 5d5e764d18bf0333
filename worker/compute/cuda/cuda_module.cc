// The entry points of libparasync_cuda.so (worker/compute/cuda/cuda_module.h).
#include "worker/compute/cuda/cuda_module.h"

#include <cstdio>
#include <utility>

#include "worker/compute/cuda/cuda_backend.h"
#include "worker/compute/cuda/device_query.h"

extern "C" {

int parasync_cuda_device_count(char* err, size_t err_len) {
  return parasync::cuda::CountDevices(err, err_len);
}

void* parasync_cuda_create_backend(const int64_t* widths, int num_widths, int device, char* err,
                                   size_t err_len) {
  parasync::MlpSpec spec;
  spec.widths.assign(widths, widths + (num_widths > 0 ? num_widths : 0));
  auto backend = parasync::cuda::CreateCudaBackend(spec, device);
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
