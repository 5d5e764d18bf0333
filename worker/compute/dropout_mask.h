// The dropout mask every backend draws (header-only, C++17: the CUDA kernels include it).
#pragma once

#include <cstdint>

namespace parasync::compute {

#if defined(__CUDACC__)
#define PARASYNC_HOST_DEVICE __host__ __device__
#else
#define PARASYNC_HOST_DEVICE
#endif

// SplitMix64's finaliser: spreads its argument over all 64 bits.
PARASYNC_HOST_DEVICE inline uint64_t MixBits(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The seed of one training step's dropout masks: different for every run seed, rank and
// step, the same when all three are.
inline uint64_t StepSeed(uint64_t run_seed, int rank, int64_t step) {
  return MixBits(MixBits(run_seed ^ (static_cast<uint64_t>(static_cast<uint32_t>(rank)) << 32)) ^
                 static_cast<uint64_t>(step));
}

// The dropout mask, the same on every backend: element `index` of the layer whose op index
// is `op` is kept with probability 1 - rate, from a counter-based hash of (seed, op, index),
// so no state or order of computation matters.
PARASYNC_HOST_DEVICE inline bool DropoutKeeps(uint64_t seed, uint32_t op, uint64_t index,
                                              float rate) {
  const uint64_t x =
      MixBits(seed ^ (static_cast<uint64_t>(op) << 40) ^ (index * 0x9e3779b97f4a7c15ULL));
  // The top 24 bits as a uniform in [0, 1).
  const float u = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
  return u >= rate;
}

}  // namespace parasync::compute
