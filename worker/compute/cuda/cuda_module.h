// The C ABI of libparasync_cuda.so, the dlopen()-ed CUDA backend module. Plain C types only,
// so the module and the worker agree without sharing C++ symbols.
#pragma once

#include <cstddef>
#include <cstdint>

// The module is built with hidden visibility; these are its only exported symbols.
#define PARASYNC_CUDA_EXPORT __attribute__((visibility("default")))

extern "C" {

// Number of usable CUDA devices; 0 when there is no GPU or no driver. Writes the reason for
// 0 into err (NUL-terminated, at most err_len bytes).
PARASYNC_CUDA_EXPORT int parasync_cuda_device_count(char* err, size_t err_len);

// Creates a parasync::ComputeBackend* (as void*) on device `device` for the model whose
// description is `model_json` (ModelSpecToJson, worker/model/model.h) bound to examples of
// shape input[0..input_rank) with ModelInputs{id_columns, sparse_rows}, or returns nullptr
// and writes the reason into err. The caller owns the result and deletes it through
// parasync_cuda_destroy_backend.
PARASYNC_CUDA_EXPORT void* parasync_cuda_create_backend(const char* model_json,
                                                        const int64_t* input, int input_rank,
                                                        int64_t id_columns, int64_t sparse_rows,
                                                        int device, char* err, size_t err_len);
PARASYNC_CUDA_EXPORT void parasync_cuda_destroy_backend(void* backend);

}  // extern "C"
