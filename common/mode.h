// TrainingMode: how parameter servers apply gradients — async, sync (barrier), sync:delayed
// (a barrier over gradients one step old, so that workers overlap the exchange with the next
// gradient) or ssp:K (bounded staleness). Plain value; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace parasync {

struct TrainingMode {
  enum class Kind : uint8_t { kAsync, kSync, kSsp };
  Kind kind = Kind::kAsync;
  int64_t staleness = 0;  // kSsp: K
  // kSync: how many versions older than the step a gradient may have been read from (0:
  // "sync"; 1: "sync:delayed", whose workers compute step t+1's gradient while step t's
  // exchange is on the wire).
  int64_t delay = 0;

  // "async", "sync", "sync:delayed" or "ssp:K" with 0 <= K <= 1000000; InvalidArgument
  // otherwise.
  static Result<TrainingMode> Parse(const std::string& text);
  std::string ToString() const;
  bool operator==(const TrainingMode&) const = default;
};

// OK when `stored_mode`, the mode recorded with the registration in a data directory, is
// `mode`; else InvalidArgument, one line naming both modes and `data_dir` (a server of
// another mode would refuse every worker's Register).
Status CheckStoredMode(const std::string& stored_mode, const TrainingMode& mode,
                       const std::string& data_dir);

}  // namespace parasync
