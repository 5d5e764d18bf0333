// The entry points of libparasync_cuda.so (worker/compute/cuda/cuda_module.h).
//
// The cuBLAS compute backend itself arrives with issue 6; until then the module reports the
// GPUs it finds and refuses to create a backend with a clear reason, so `--device auto`
// falls back to the CPU and `--device cuda` fails with one line.
#include "worker/compute/cuda/cuda_module.h"

#include <cstdio>

#include "worker/compute/cuda/device_query.h"

extern "C" {

int parasync_cuda_device_count(char* err, size_t err_len) {
  return parasync::cuda::CountDevices(err, err_len);
}

void* parasync_cuda_create_backend(const int64_t* /*widths*/, int /*num_widths*/, int device,
                                   char* err, size_t err_len) {
  char name[256] = "unknown GPU";
  (void)parasync::cuda::DescribeDevice(device, name, sizeof(name));
  std::snprintf(err, err_len,
                "found %s, but this build's CUDA module has no compute backend yet (issue 6); "
                "use --device cpu",
                name);
  return nullptr;
}

void parasync_cuda_destroy_backend(void* /*backend*/) {}

}  // extern "C"
