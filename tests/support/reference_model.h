// A Model's forward pass and loss in double precision, written with plain loops straight
// from each layer's definition and independent of every backend: the reference the CPU
// backend's gradients are checked against (by central finite differences) and a check of
// its forward pass. Slow by design; for small shapes in tests.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/model/model.h"

namespace parasync::testing {

// The mean loss over `batch` examples of `model` with parameters `params` (one array per
// variable) on inputs x [batch, input_size] and labels y. `training` applies dropout with
// the masks compute::DropoutKeeps(seed, ...) draws, as the backends do.
double ReferenceLoss(const Model& model, const std::vector<std::vector<double>>& params,
                     const std::vector<double>& x, const std::vector<uint8_t>& y, int batch,
                     bool training, uint64_t seed);

}  // namespace parasync::testing
