// StragglerTracker: which worker rank the barriers of a shard wait for.
//
// The server reports each wait it can pin on one rank: in sync mode, the time a step spent
// waiting for its last gradient after the one before it arrived (the step could complete
// but for that rank); in ssp mode, the time a parked pull waited for the slowest rank that
// blocked it. The tracker keeps an exponentially decayed sum of those seconds per rank
// (half-life `half_life`), names the rank with the largest sum as the straggler, and decides
// when a single wait is worth a log line: above `threshold`, at most once per `log_every`
// per rank (the waits in between are counted, not logged).
//
// Pure state; time is passed in. Not thread-safe: the server loop owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace parasync {

class StragglerTracker {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  struct Options {
    int num_workers = 1;
    double threshold_seconds = 1.0;  // waits above it may be logged; <= 0: never log
    double half_life_seconds = 60.0;
    double log_every_seconds = 10.0;
  };

  // What the caller should do about one wait.
  struct Verdict {
    bool log = false;        // log this wait
    int64_t suppressed = 0;  // waits above the threshold not logged since the last log line
  };

  explicit StragglerTracker(const Options& options);

  // The barrier waited `seconds` for `rank` (ignored unless 0 <= rank < num_workers).
  Verdict Record(int rank, double seconds, TimePoint now);

  // The rank with the largest decayed wait at `now`, or -1 when no wait was recorded (or
  // all have decayed below a millisecond).
  int Straggler(TimePoint now) const;

  // The decayed seconds of `rank` at `now`.
  double DecayedSeconds(int rank, TimePoint now) const;

 private:
  struct PerRank {
    double decayed = 0;       // as of `updated`
    TimePoint updated{};
    bool logged_once = false;
    TimePoint last_log{};
    int64_t suppressed = 0;
  };
  double Decay(const PerRank& r, TimePoint now) const;

  Options options_;
  std::vector<PerRank> ranks_;
};

}  // namespace parasync
