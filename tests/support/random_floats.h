// Gradient-like inputs for the codec tests: `n` floats from a normal distribution of standard
// deviation `scale`, the same for the same seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace parasync::testing {

inline std::vector<float> GaussianFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace parasync::testing
