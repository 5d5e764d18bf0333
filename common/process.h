// Process-wide plumbing for our binaries: logging set-up and graceful-shutdown signals.
#pragma once

#include <string>

namespace parasync {

// Set to "1" by a parent that prefixes each line of a child's output with the child's name
// (parasync-launch's "[worker0] "): the child then leaves its own name out.
inline constexpr const char* kLogPrefixedVariable = "PARASYNC_LOG_PREFIXED";

// Sets the default spdlog logger to print "<time> <level> [<role><index>] message" to stderr
// at `level` ("debug", "info", "warn", "error"), without "[<role><index>] " when
// PARASYNC_LOG_PREFIXED=1. Returns false for an unknown level.
bool InitLogging(const std::string& role, int index, const std::string& level);

// Exit status of our binaries for bad flags, a bad cluster spec or missing input.
inline constexpr int kExitBadUsage = 2;

// Prints "<program>: <line>" to stderr and returns `code`, for `return Fail(...)` in main.
int PrintErrorLine(const char* program, const std::string& line, int code);

// Makes SIGINT and SIGTERM set a flag (ShutdownRequested) and ignores SIGPIPE. The two
// signals are blocked in the calling thread, and so in every thread it starts afterwards,
// and taken by one thread of their own (sigwait): a shutdown signal never interrupts the
// code of another thread. (Delivered to any thread, a SIGTERM from the launcher to a
// straggling CNN worker was followed within 0.1-0.4 s by heap corruption in its oneDNN
// calls, "corrupted size vs. prev_size", in 5 of 23 runs; taken this way, in 0 of 13. The
// path was not found: 180,000 signals into the compute alone corrupted nothing.) A handler
// that only sets the flag stays installed for a thread started before this call. Loops see
// the flag at their next bounded wait, not through EINTR.
// Call once from main before starting threads.
void InstallShutdownSignalHandlers();

// True once SIGINT or SIGTERM arrived (or RequestShutdown() was called). Thread-safe.
bool ShutdownRequested();
void RequestShutdown();

// Number of the signal that requested shutdown, 0 if none.
int ShutdownSignal();

// Keeps freed message buffers in the process for reuse. Every request allocates and frees
// buffers of hundreds of KiB (ZeroMQ allocates each received frame); by default glibc serves
// those with mmap, or hands the freed top of a heap back to the kernel, so each request
// page-faults its buffers in again (tools/bench counted 100-370 faults per MB moved). This
// raises glibc's mmap threshold to 32 MiB and its trim threshold to 256 MiB: resident
// memory then stays near its peak instead of shrinking between requests. Call once at
// start-up, before threads.
void KeepFreedMessageBuffers();

}  // namespace parasync
