#include "worker/compute/cuda/device_query.h"

#include <cuda_runtime.h>

#include <cstdio>

namespace parasync::cuda {

int CountDevices(char* err, size_t err_len) {
  int count = 0;
  // Any failure means "no GPU": without a driver this returns cudaErrorInsufficientDriver,
  // elsewhere cudaErrorNoDevice.
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    std::snprintf(err, err_len, "%s (%s)", cudaGetErrorString(rc), cudaGetErrorName(rc));
    return 0;
  }
  if (count == 0) std::snprintf(err, err_len, "no CUDA device found");
  return count;
}

bool DescribeDevice(int device, char* out, size_t out_len) {
  cudaDeviceProp prop{};
  cudaError_t rc = cudaGetDeviceProperties(&prop, device);
  if (rc != cudaSuccess) {
    std::snprintf(out, out_len, "%s", cudaGetErrorString(rc));
    return false;
  }
  std::snprintf(out, out_len, "%s (sm_%d%d)", prop.name, prop.major, prop.minor);
  return true;
}

}  // namespace parasync::cuda
