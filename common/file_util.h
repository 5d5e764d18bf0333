// Small file helpers shared by the binaries.
#pragma once

#include <string>
#include <string_view>
#include <system_error>

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

// The Status of a filesystem call on a path the user named that failed with `ec`, as
// "<message>: <reason>". FailedPrecondition (exit status 2: the path or its permissions must
// change) when no retry can help: permission denied (EACCES, EPERM), a read-only file system
// (EROFS), a component that is not a directory (ENOTDIR) or is a file (EEXIST), no such
// parent, or a place where no directory can be made, such as /proc (ENOENT), a name too long
// (ENAMETOOLONG), a symlink loop (ELOOP), an invalid name (EINVAL). Unavailable (exit status
// 1) for anything else — a full disk or quota (ENOSPC, EDQUOT), an I/O error, too many open
// files, no memory — which may pass.
Status PathError(const std::string& message, const std::error_code& ec);

}  // namespace parasync
