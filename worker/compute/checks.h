// The argument checks every compute backend makes, written once so the CPU and CUDA
// backends reject the same inputs with the same messages. Header-only: the CUDA module
// (a separate shared object) compiles it too.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "worker/compute/dropout_mask.h"
#include "worker/model/model.h"

namespace parasync::compute {

// One non-null array per variable of `model`.
template <typename T>
Status CheckArrays(const Model& model, std::span<T* const> arrays, const char* what) {
  const size_t want = model.variables().size();
  if (arrays.size() != want) {
    return Status::InvalidArgument(std::string(what) + ": expected " + std::to_string(want) +
                                   " arrays, got " + std::to_string(arrays.size()));
  }
  for (const T* p : arrays) {
    if (p == nullptr) return Status::InvalidArgument(std::string(what) + ": null array");
  }
  return Status::Ok();
}

// Every label fits the loss; `offset` is the first row's index, for the message.
inline Status CheckLabels(const Model& model, const uint8_t* labels, int64_t rows,
                          int64_t offset) {
  const int64_t limit = model.loss() == LossKind::kSigmoidCrossEntropy ? 2 : model.outputs();
  for (int64_t i = 0; i < rows; ++i) {
    if (labels[i] >= limit) {
      return Status::InvalidArgument("label " + std::to_string(labels[i]) + " of example " +
                                     std::to_string(offset + i) + " is not below " +
                                     std::to_string(limit) +
                                     (limit == 2 ? " (0/1 labels)" : " classes"));
    }
  }
  return Status::Ok();
}

// The checks of ForwardBackward's arguments, before any work.
inline Status CheckForwardBackward(const Model& model, std::span<const float* const> params,
                                   const float* x, const uint8_t* labels, int batch,
                                   std::span<float* const> grads) {
  PARASYNC_RETURN_IF_ERROR(CheckArrays(model, params, "params"));
  PARASYNC_RETURN_IF_ERROR(CheckArrays(model, grads, "grads"));
  if (batch <= 0) {
    return Status::InvalidArgument("batch must be positive, got " + std::to_string(batch));
  }
  if (x == nullptr || labels == nullptr) {
    return Status::InvalidArgument("x and labels must not be null");
  }
  return CheckLabels(model, labels, batch, 0);
}

// The checks of Evaluate's arguments; labels are checked chunk by chunk as they are used.
inline Status CheckEvaluate(const Model& model, std::span<const float* const> params,
                            const float* x, const uint8_t* labels, int64_t n) {
  PARASYNC_RETURN_IF_ERROR(CheckArrays(model, params, "params"));
  if (n < 0) return Status::InvalidArgument("n must not be negative, got " + std::to_string(n));
  if (n > 0 && (x == nullptr || labels == nullptr)) {
    return Status::InvalidArgument("x and labels must not be null");
  }
  return Status::Ok();
}

// Embedding ids travel as float features, the first op.id_columns of each of `rows`
// examples: each must be an integer in [0, op.table_rows) (a sparse table's local ids).
inline Status CheckIds(const LayerOp& op, const float* x, int64_t rows, int64_t first_example) {
  const int64_t width = op.in_size();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t k = 0; k < op.id_columns; ++k) {
      const float id = x[i * width + k];
      if (!(id >= 0.0f) || id >= static_cast<float>(op.table_rows) ||
          id != static_cast<float>(static_cast<int64_t>(id))) {
        return Status::InvalidArgument("layer '" + op.spec.name + "': id " + std::to_string(id) +
                                       " of example " + std::to_string(first_example + i) +
                                       " is not an integer in [0, " +
                                       std::to_string(op.table_rows) + ")");
      }
    }
  }
  return Status::Ok();
}

}  // namespace parasync::compute
