#include "common/auc.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace parasync {

double RocAuc(std::span<const float> scores, std::span<const uint8_t> labels) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  const size_t n = scores.size();
  if (labels.size() != n) return kNaN;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Sum of the 1-based ranks of the positives; a tied group [begin, end) shares the average
  // of its ranks, (begin + 1 + end) / 2, which is what gives a tie half credit.
  double positive_rank_sum = 0;
  uint64_t positives = 0;
  for (size_t begin = 0; begin < n;) {
    size_t end = begin + 1;
    while (end < n && scores[order[end]] == scores[order[begin]]) ++end;
    uint64_t group_positives = 0;
    for (size_t i = begin; i < end; ++i) group_positives += labels[order[i]] != 0 ? 1 : 0;
    positive_rank_sum += static_cast<double>(group_positives) *
                         (static_cast<double>(begin + 1 + end) / 2.0);
    positives += group_positives;
    begin = end;
  }
  const uint64_t negatives = n - positives;
  if (positives == 0 || negatives == 0) return kNaN;
  const double p = static_cast<double>(positives);
  return (positive_rank_sum - p * (p + 1) / 2) / (p * static_cast<double>(negatives));
}

double LogLoss(std::span<const float> probabilities, std::span<const uint8_t> labels) {
  const size_t n = probabilities.size();
  if (labels.size() != n || n == 0) return std::numeric_limits<double>::quiet_NaN();
  constexpr double kEpsilon = 1e-7;
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    const double p = std::clamp(static_cast<double>(probabilities[i]), kEpsilon, 1 - kEpsilon);
    total -= labels[i] != 0 ? std::log(p) : std::log1p(-p);
  }
  return total / static_cast<double>(n);
}

}  // namespace parasync
