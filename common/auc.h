// Quality measures of a binary classifier on held-out data: the area under the ROC curve and
// the mean log-loss. The data generator (tools/gen_ctr_main.cc) reports both for its planted
// model, and a trainer's evaluation compares against them.
//
// Plain functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>

namespace parasync {

// The area under the ROC curve of `scores` against `labels` (nonzero means positive): the
// probability that a random positive scores above a random negative, a tie counting one half.
// Computed from the ranks (the Mann-Whitney statistic, tied scores given their average rank)
// in O(n log n). Returns NaN when the spans differ in length or when only one class (or no
// example) is present, as the measure is then undefined. Scores must not be NaN.
double RocAuc(std::span<const float> scores, std::span<const uint8_t> labels);

// The mean binary cross-entropy -[y log p + (1 - y) log(1 - p)] of `probabilities` against
// `labels` (nonzero means 1), each probability clamped to [1e-7, 1 - 1e-7] so a confident
// mistake costs a finite amount. Returns NaN when the spans differ in length or are empty.
double LogLoss(std::span<const float> probabilities, std::span<const uint8_t> labels);

}  // namespace parasync
