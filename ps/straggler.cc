#include "ps/straggler.h"

#include <cmath>

namespace parasync {

StragglerTracker::StragglerTracker(const Options& options)
    : options_(options),
      ranks_(static_cast<size_t>(options.num_workers > 0 ? options.num_workers : 0)) {}

double StragglerTracker::Decay(const PerRank& r, TimePoint now) const {
  if (r.decayed == 0) return 0;
  const double age = std::chrono::duration<double>(now - r.updated).count();
  if (age <= 0 || options_.half_life_seconds <= 0) return r.decayed;
  return r.decayed * std::exp2(-age / options_.half_life_seconds);
}

StragglerTracker::Verdict StragglerTracker::Record(int rank, double seconds, TimePoint now) {
  Verdict verdict;
  if (rank < 0 || static_cast<size_t>(rank) >= ranks_.size() || !(seconds >= 0)) return verdict;
  PerRank& r = ranks_[static_cast<size_t>(rank)];
  r.decayed = Decay(r, now) + seconds;
  r.updated = now;
  if (options_.threshold_seconds <= 0 || seconds < options_.threshold_seconds) return verdict;
  const bool quiet_long_enough =
      !r.logged_once ||
      std::chrono::duration<double>(now - r.last_log).count() >= options_.log_every_seconds;
  if (!quiet_long_enough) {
    ++r.suppressed;
    return verdict;
  }
  verdict.log = true;
  verdict.suppressed = r.suppressed;
  r.suppressed = 0;
  r.logged_once = true;
  r.last_log = now;
  return verdict;
}

double StragglerTracker::DecayedSeconds(int rank, TimePoint now) const {
  if (rank < 0 || static_cast<size_t>(rank) >= ranks_.size()) return 0;
  return Decay(ranks_[static_cast<size_t>(rank)], now);
}

int StragglerTracker::Straggler(TimePoint now) const {
  int best = -1;
  double best_seconds = 1e-3;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const double s = Decay(ranks_[i], now);
    if (s > best_seconds) {
      best = static_cast<int>(i);
      best_seconds = s;
    }
  }
  return best;
}

}  // namespace parasync
