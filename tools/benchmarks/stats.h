// The summary statistics every benchmark quotes (README: "medians and ratios taken side by
// side in one run").
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace parasync::bench {

// The median: the middle value, or the mean of the two middle ones for an even count; NaN
// for none.
inline double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Nearest rank: the smallest value with at least q of the values at or below it; NaN for none.
inline double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

}  // namespace parasync::bench
