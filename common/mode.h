// TrainingMode: how parameter servers apply gradients — async, sync (barrier) or ssp:K
// (bounded staleness). Plain value; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace parasync {

struct TrainingMode {
  enum class Kind : uint8_t { kAsync, kSync, kSsp };
  Kind kind = Kind::kAsync;
  int64_t staleness = 0;  // kSsp: K

  // "async", "sync" or "ssp:K" with 0 <= K <= 1000000; InvalidArgument otherwise.
  static Result<TrainingMode> Parse(const std::string& text);
  std::string ToString() const;
  bool operator==(const TrainingMode&) const = default;
};

}  // namespace parasync
