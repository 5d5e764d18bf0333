// Device discovery for the CUDA module, compiled by nvcc. C++17 (nvcc's dialect here).
#pragma once

#include <cstddef>

namespace parasync::cuda {

// Number of CUDA devices, or 0 with the runtime's reason in err (NUL-terminated).
int CountDevices(char* err, size_t err_len);

// Writes device `device`'s name and compute capability into out; false with err on failure.
bool DescribeDevice(int device, char* out, size_t out_len);

}  // namespace parasync::cuda
