// Small file helpers shared by the binaries.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace parasync {

// Writes `bytes` to `path` through "<path>.tmp" and a rename, so a reader (Prometheus'
// file_sd, a tool loading a model) never sees half a file. Unavailable, naming the file and
// the reason, on an I/O error.
Status WriteFileAtomically(const std::string& path, std::string_view bytes);

// Opens `path` read-only (close-on-exec) and returns the descriptor, which the caller closes.
// NotFound "<what> <path> does not exist" when it (or a directory on the way) is missing,
// else Unavailable "cannot open <what> <path>: <reason>". Does not block beyond open(2).
Result<int> OpenForReading(const std::string& path, std::string_view what);

}  // namespace parasync
