// The command line of every parasync binary, in one house style: the same help layout
// ("<program>: <purpose>", the details, Usage, the options, then an "Exit status:" paragraph
// and examples), --version everywhere, durations in decimal seconds, old flag names kept as
// hidden aliases, and every parse error as one line on stderr with exit status 2.
//
// Exit status of every binary (the contract orchestrators rely on: systemd's
// RestartPreventExitStatus=2, a Kubernetes podFailurePolicy on exit 2):
//   0   done
//   1   a failure a retry may fix (a peer down, a timeout, a store locked by another process)
//   2   bad flags, configuration, data or state that a retry cannot fix; one line on stderr,
//       "<program>: <what>", names the flag, the port, the path or the two values that disagree
//   130 interrupted (parasync-launch; the servers and workers exit 0 on SIGINT/SIGTERM)
//
// Only main() files include this header (CLI11 is slow to compile). Single-threaded: call
// from main before starting threads.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "common/status.h"

namespace parasync {

// Exit status for a failure a retry may fix (see above); kExitBadUsage (common/process.h) is 2.
inline constexpr int kExitRetryable = 1;

// The exit status of a start-up failure by its status: kExitBadUsage for InvalidArgument and
// FailedPrecondition (the user's to change), kExitRetryable for anything else.
int StartupExitCode(const Status& status);

// What parasync-ps and parasync-worker set up once their flags are valid, before anything
// starts.
struct ServiceProcess {
  std::string role;  // "ps", "worker": the log lines' prefix, with `index`
  int index = 0;
  std::string log_level;
  std::optional<std::string> log_dir;  // created when given
  std::string metrics_bind;
  int metrics_port = 0;  // 0: the system picks one, nothing to check
};

// A metrics port in use is refused naming the flag (a retry would find it taken again),
// logging is set up, the log directory created, the shutdown signals taken by a thread of
// their own and freed message buffers kept (common/process.h). Ok, or the one line to fail
// with, exit status StartupExitCode of it: FailedPrecondition or InvalidArgument for a port
// in use, an unknown log level or a --log-dir that cannot be created for good (PathError,
// common/file_util.h), Unavailable for a --log-dir that may be created later (a full disk).
Status SetUpServiceProcess(const ServiceProcess& process);

// What a binary's --help says about it.
struct ProgramHelp {
  std::string name;     // "parasync-ps": the Usage line and the error prefix
  std::string purpose;  // one sentence, printed as "<name>: <purpose>"
  // Paragraphs after the purpose, separated by blank lines; wrapped to the terminal width
  // used throughout (100 columns).
  std::string details;
  // Extra sentences for the "Exit status:" paragraph, after the shared ones (may be empty).
  std::string exit_status;
  // Example command lines, one a line; a line starting with a space is printed as is (a
  // continuation or a comment), others are indented by two spaces.
  std::string examples;
};

// Makes `app` follow the house style: name and description from `help`, the shared help
// layout (options' help wrapped beside the names), the footer with the exit statuses and the
// examples, --version printing VersionLine(help.name), and last-wins for a repeated option
// (so a launcher's per-rank argument overrides a shared one). Call before adding options.
void SetUpCommandLine(CLI::App& app, const ProgramHelp& help);

// Parses argv. Returns nullopt when main should go on; otherwise the exit status main
// returns at once: 0 after --help or --version (printed to stdout), kExitBadUsage after a
// parse error, printed as one line "<name>: <error> (see --help)" on stderr.
std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv);

// Adds a duration option in decimal seconds ("0.25", "90"), checked to lie in [min, max].
CLI::Option* AddSecondsOption(CLI::App& app, const std::string& name, double& seconds,
                              const std::string& help, double min, double max);

// Adds `alias`, an old name of an option, writing into the same `target` and left out of
// --help: deploy files and scripts that use the old name keep working.
template <typename T>
CLI::Option* AddHiddenAlias(CLI::App& app, const std::string& alias, T& target) {
  return app.add_option(alias, target)->group("");
}

}  // namespace parasync
