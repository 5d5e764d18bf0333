// The dropout mask every backend draws (header-only, C++17: the CUDA kernels include it).
#pragma once

#include <cstdint>

#include "common/split_mix.h"

namespace parasync::compute {

// The seed of one training step's dropout masks: different for every run seed, rank and
// step, the same when all three are.
inline uint64_t StepSeed(uint64_t run_seed, int rank, int64_t step) {
  const uint64_t rank_bits = static_cast<uint64_t>(static_cast<uint32_t>(rank)) << 32;
  return SplitMix64(SplitMix64(run_seed ^ rank_bits) ^ static_cast<uint64_t>(step));
}

// The dropout mask, the same on every backend: element `index` of the layer whose op index
// is `op` is kept with probability 1 - rate, from a counter-based hash of (seed, op, index),
// so no state or order of computation matters.
PARASYNC_HOST_DEVICE inline bool DropoutKeeps(uint64_t seed, uint32_t op, uint64_t index,
                                              float rate) {
  const uint64_t x =
      SplitMix64(seed ^ (static_cast<uint64_t>(op) << 40) ^ (index * kSplitMix64Gamma));
  // The top 24 bits as a uniform in [0, 1).
  const float u = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
  return u >= rate;
}

}  // namespace parasync::compute
