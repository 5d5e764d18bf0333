#include "common/mode.h"

#include <charconv>

namespace parasync {

Result<TrainingMode> TrainingMode::Parse(const std::string& text) {
  TrainingMode m;
  if (text == "async") return m;
  if (text == "sync" || text == "sync:delayed") {
    m.kind = Kind::kSync;
    m.delay = text == "sync" ? 0 : 1;
    return m;
  }
  if (text.rfind("ssp:", 0) == 0) {
    const char* b = text.data() + 4;
    const char* e = text.data() + text.size();
    auto [p, ec] = std::from_chars(b, e, m.staleness);
    if (ec == std::errc() && p == e && b != e && m.staleness >= 0 && m.staleness <= 1000000) {
      m.kind = Kind::kSsp;
      return m;
    }
  }
  return Status::InvalidArgument(
      "mode must be async, sync, sync:delayed or ssp:K (K a staleness bound >= 0), not '" +
      text + "'");
}

std::string TrainingMode::ToString() const {
  switch (kind) {
    case Kind::kAsync: return "async";
    case Kind::kSync: return delay > 0 ? "sync:delayed" : "sync";
    case Kind::kSsp: return "ssp:" + std::to_string(staleness);
  }
  return "unknown";
}

Status CheckStoredMode(const std::string& stored_mode, const TrainingMode& mode,
                       const std::string& data_dir) {
  const auto stored = TrainingMode::Parse(stored_mode);
  if (stored.ok() && *stored == mode) return Status::Ok();
  return Status::InvalidArgument("--state-dir " + data_dir + " holds a model registered in mode " +
                                 stored_mode + ", but this server runs --mode " +
                                 mode.ToString() + ": start it with --mode " + stored_mode +
                                 ", or give a new --state-dir");
}

}  // namespace parasync
