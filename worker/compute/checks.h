// The argument checks every compute backend makes, written once so the CPU and CUDA
// backends reject the same inputs with the same messages. Header-only: the CUDA module
// (a separate shared object) compiles it too.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "worker/model/mlp.h"

namespace parasync::compute {

inline constexpr int64_t kMaxWidth = int64_t{1} << 20;
// Labels are uint8.
inline constexpr int64_t kMaxClasses = 256;

// A spec a backend can run: at least two widths, each in [1, kMaxWidth], at most
// kMaxClasses classes.
inline Status ValidateSpec(const MlpSpec& spec) {
  if (spec.widths.size() < 2) {
    return Status::InvalidArgument("MLP needs at least two widths (inputs and classes)");
  }
  for (int64_t w : spec.widths) {
    if (w < 1 || w > kMaxWidth) {
      return Status::InvalidArgument("MLP width " + std::to_string(w) + " is out of range [1, " +
                                     std::to_string(kMaxWidth) + "]");
    }
  }
  if (spec.widths.back() > kMaxClasses) {
    return Status::InvalidArgument("MLP has " + std::to_string(spec.widths.back()) +
                                   " classes; labels are uint8, so at most 256");
  }
  return Status::Ok();
}

// One non-null array per variable of `spec`.
template <typename T>
Status CheckArrays(const MlpSpec& spec, std::span<T* const> arrays, const char* what) {
  const size_t want = 2 * static_cast<size_t>(spec.num_layers());
  if (arrays.size() != want) {
    return Status::InvalidArgument(std::string(what) + ": expected " + std::to_string(want) +
                                   " arrays, got " + std::to_string(arrays.size()));
  }
  for (const T* p : arrays) {
    if (p == nullptr) return Status::InvalidArgument(std::string(what) + ": null array");
  }
  return Status::Ok();
}

// Every label is a class index; `offset` is the first row's index, for the message.
inline Status CheckLabels(const MlpSpec& spec, const uint8_t* labels, int64_t rows,
                          int64_t offset) {
  const int64_t classes = spec.widths.back();
  for (int64_t i = 0; i < rows; ++i) {
    if (labels[i] >= classes) {
      return Status::InvalidArgument("label " + std::to_string(labels[i]) + " of example " +
                                     std::to_string(offset + i) + " is not below " +
                                     std::to_string(classes) + " classes");
    }
  }
  return Status::Ok();
}

// The checks of ForwardBackward's arguments, before any work.
inline Status CheckForwardBackward(const MlpSpec& spec, std::span<const float* const> params,
                                   const float* x, const uint8_t* labels, int batch,
                                   std::span<float* const> grads) {
  PARASYNC_RETURN_IF_ERROR(CheckArrays(spec, params, "params"));
  PARASYNC_RETURN_IF_ERROR(CheckArrays(spec, grads, "grads"));
  if (batch <= 0) {
    return Status::InvalidArgument("batch must be positive, got " + std::to_string(batch));
  }
  if (x == nullptr || labels == nullptr) {
    return Status::InvalidArgument("x and labels must not be null");
  }
  return CheckLabels(spec, labels, batch, 0);
}

// The checks of Evaluate's arguments; labels are checked chunk by chunk as they are used.
inline Status CheckEvaluate(const MlpSpec& spec, std::span<const float* const> params,
                            const float* x, const uint8_t* labels, int64_t n) {
  PARASYNC_RETURN_IF_ERROR(CheckArrays(spec, params, "params"));
  if (n < 0) return Status::InvalidArgument("n must not be negative, got " + std::to_string(n));
  if (n > 0 && (x == nullptr || labels == nullptr)) {
    return Status::InvalidArgument("x and labels must not be null");
  }
  return Status::Ok();
}

}  // namespace parasync::compute
