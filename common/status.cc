#include "common/status.h"

#include <cstdio>
#include <cstdlib>

namespace parasync {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kTimedOut: return "TimedOut";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kNotSupported: return "NotSupported";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

void AbortOnOkStatusInResult() {
  std::fputs("parasync: Result constructed from an ok Status (programmer bug)\n", stderr);
  std::abort();
}

}  // namespace parasync
