// The dropout mask every backend draws (header-only, C++17: the CUDA kernels include it).
#pragma once

#include <cstdint>

namespace parasync::compute {

// The dropout mask, the same on every backend: element `index` of the layer whose op index
// is `op` is kept with probability 1 - rate, from a counter-based hash of (seed, op, index),
// so no state or order of computation matters.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline bool DropoutKeeps(uint64_t seed, uint32_t op, uint64_t index, float rate) {
  uint64_t x = seed ^ (static_cast<uint64_t>(op) << 40) ^ (index * 0x9e3779b97f4a7c15ULL);
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  // The top 24 bits as a uniform in [0, 1).
  const float u = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
  return u >= rate;
}

}  // namespace parasync::compute
