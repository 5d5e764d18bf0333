// SplitMix64, the one mix behind every counter-based draw in parasync: variables' initial
// values (common/variable.h), embedding rows and their shards (common/embedding.h), the
// dataset's shuffle seed, dropout masks on every backend (worker/compute/dropout_mask.h) and
// parasync-gen-ctr's data. Header-only, C++17 and callable on a CUDA device, so that the
// kernels draw the same masks as the CPU. Pure functions; safe from any thread.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PARASYNC_HOST_DEVICE __host__ __device__
#else
#define PARASYNC_HOST_DEVICE
#endif

namespace parasync {

// SplitMix64's increment (2^64 / the golden ratio): the stream's i-th state is i times this.
inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ULL;

// SplitMix64's finalizer: spreads its argument over all 64 bits, a bijection (a counter-based
// generator: SplitMix64(stream + i) needs no state from i - 1).
PARASYNC_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  x += kSplitMix64Gamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace parasync
