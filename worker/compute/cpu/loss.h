// The CPU backend's losses (loss.cc). Pure functions; thread-safe.
#pragma once

#include <cstdint>

#include "worker/model/model.h"

namespace parasync::cpu {

// Returns the summed loss of `rows` examples with logits z [rows, outputs]. When dz is not
// null, writes dLoss/dz times grad_scale into it (1/batch: the gradient of the mean). When
// correct is not null, adds the rows predicted right. Labels must fit (compute::CheckLabels).
double LossAndGradient(LossKind loss, const float* z, const uint8_t* labels, int rows,
                       int64_t outputs, float grad_scale, float* dz, int64_t* correct);

}  // namespace parasync::cpu
