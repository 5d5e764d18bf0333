#include "deploy/launch/options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "common/address.h"
#include "common/mode.h"

namespace parasync::launch {
namespace {

constexpr int kMaxProcessesPerRole = 256;

int SumSlots(const std::vector<HostSlots>& slots) {
  int n = 0;
  for (const HostSlots& s : slots) n += s.count;
  return n;
}

// --ps, --workers, --epochs, --mode, --grace-seconds, --finish-timeout and --host, each on
// its own.
Status ValidateBasics(const LaunchOptions& options) {
  if (options.num_ps < 1 || options.num_ps > kMaxProcessesPerRole) {
    return Status::InvalidArgument("--ps must be between 1 and " +
                                   std::to_string(kMaxProcessesPerRole) + ", got " +
                                   std::to_string(options.num_ps));
  }
  if (options.num_workers < 1 || options.num_workers > kMaxProcessesPerRole) {
    return Status::InvalidArgument("--workers must be between 1 and " +
                                   std::to_string(kMaxProcessesPerRole) + ", got " +
                                   std::to_string(options.num_workers));
  }
  if (options.epochs < 1) {
    return Status::InvalidArgument("--epochs must be at least 1, got " +
                                   std::to_string(options.epochs));
  }
  if (!IsValidMode(options.mode)) {
    return Status::InvalidArgument(
        "--mode must be async, sync, sync:delayed or ssp:<staleness>, got '" + options.mode + "'");
  }
  if (!std::isfinite(options.grace_seconds) || options.grace_seconds < 0) {
    return Status::InvalidArgument("--grace-seconds must be a number >= 0");
  }
  if (!std::isfinite(options.finish_timeout) || options.finish_timeout < 0) {
    return Status::InvalidArgument("--finish-timeout must be a number >= 0");
  }
  if (options.host.empty() || options.host.find(':') != std::string::npos ||
      !CheckHost(options.host, "--host").ok()) {
    return Status::InvalidArgument("--host must be a host name or IPv4 address (four octets "
                                   "0-255), got '" + options.host + "'");
  }
  return Status::Ok();
}

// --replicas-to-aggregate: checked here, before anything starts: every PS would refuse it
// after the launch.
Status ValidateReplicas(const LaunchOptions& options) {
  if (!options.replicas_to_aggregate) return Status::Ok();
  int replicas = 0;
  const std::string& text = *options.replicas_to_aggregate;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), replicas);
  if (ec != std::errc() || end != text.data() + text.size() || replicas < 1) {
    return Status::InvalidArgument("--replicas-to-aggregate must be a positive integer, got '" +
                                   text + "'");
  }
  const auto mode = TrainingMode::Parse(options.mode);
  if (mode.ok() && mode->kind != TrainingMode::Kind::kSync) {
    return Status::InvalidArgument("--replicas-to-aggregate applies to --mode sync only, not "
                                   "--mode " + options.mode);
  }
  if (replicas > options.num_workers) {
    return Status::InvalidArgument(
        "--replicas-to-aggregate " + text + " is more than the " +
        std::to_string(options.num_workers) +
        " workers (it may be at most --workers; fewer makes the rest backup workers)");
  }
  return Status::Ok();
}

// The --ps / -H placements: their counts, their host names, --port-base and --ssh-command.
Status ValidatePlacement(const LaunchOptions& options) {
  if (!options.ps_placement.empty() && SumSlots(options.ps_placement) != options.num_ps) {
    return Status::InvalidArgument("role counts: " + std::to_string(options.num_ps) +
                                   " ps asked for, but --ps places " +
                                   std::to_string(SumSlots(options.ps_placement)));
  }
  if (!options.worker_placement.empty() &&
      SumSlots(options.worker_placement) != options.num_workers) {
    return Status::InvalidArgument("role counts: --workers " +
                                   std::to_string(options.num_workers) + ", but -H places " +
                                   std::to_string(SumSlots(options.worker_placement)) +
                                   " workers");
  }
  if (!IsMultiHost(options)) return Status::Ok();
  bool local = false, remote = false;
  for (const auto* placement : {&options.ps_placement, &options.worker_placement}) {
    for (const HostSlots& h : *placement) {
      if (h.host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   "0123456789.-_") != std::string::npos ||
          h.host.front() == '-' || !CheckHost(h.host, "host").ok()) {
        return Status::InvalidArgument("'" + h.host + "' is not a host name or IPv4 address");
      }
      (IsLocalHost(h.host) ? local : remote) = true;
    }
  }
  if (local && remote) {
    return Status::InvalidArgument(
        "localhost cannot be mixed with other hosts (the others would reach themselves): name "
        "this machine as the others see it");
  }
  if (options.port_base < 1024 ||
      options.port_base + kMetricsPortOffset + kMaxProcessesPerRole * 2 > 65535) {
    return Status::InvalidArgument("--port-base must be between 1024 and " +
                                   std::to_string(65535 - kMetricsPortOffset -
                                                  kMaxProcessesPerRole * 2));
  }
  if (SshCommandWords(options).empty()) {
    return Status::InvalidArgument("--ssh-command must not be empty");
  }
  return Status::Ok();
}

// --kill: an existing process other than the chief, in a local cluster.
Status ValidateFaults(const LaunchOptions& options) {
  for (const Fault& f : options.faults) {
    const int count = f.ps ? options.num_ps : options.num_workers;
    const std::string name = std::string(f.ps ? "ps" : "worker") + std::to_string(f.index);
    if (f.index < 0 || f.index >= count) {
      return Status::InvalidArgument("--kill names " + name + ", but there are " +
                                     std::to_string(count) + (f.ps ? " ps" : " workers"));
    }
    if (!f.ps && f.index == 0) {
      return Status::InvalidArgument(
          "--kill cannot name worker0: the chief evaluates, and its end ends the run");
    }
    if (IsMultiHost(options)) {
      return Status::InvalidArgument("--kill works on a local cluster only (no -H / --ps "
                                     "host placement)");
    }
  }
  return Status::Ok();
}

}  // namespace

bool IsMultiHost(const LaunchOptions& options) {
  return !options.ps_placement.empty() || !options.worker_placement.empty();
}

std::vector<std::string> SshCommandWords(const LaunchOptions& options) {
  std::vector<std::string> words;
  std::istringstream in(options.ssh_command);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

bool IsValidMode(std::string_view mode) {
  // The rule every process applies to its --mode, so a mode they would refuse fails here.
  return TrainingMode::Parse(std::string(mode)).ok();
}

Status ValidateOptions(const LaunchOptions& options) {
  PARASYNC_RETURN_IF_ERROR(ValidateBasics(options));
  PARASYNC_RETURN_IF_ERROR(ValidateReplicas(options));
  if (const auto mode = TrainingMode::Parse(options.mode);
      options.local_aggregation && mode.ok() && mode->kind != TrainingMode::Kind::kSync) {
    return Status::InvalidArgument(
        "--local-aggregation needs --mode sync or sync:delayed, not --mode " + options.mode +
        " (in async and ssp each worker's gradient is its own update)");
  }
  for (const auto& [rank, arg] : options.rank_args) {
    if (rank < 0 || rank >= options.num_workers) {
      return Status::InvalidArgument("--rank-arg names worker " + std::to_string(rank) +
                                     " of " + std::to_string(options.num_workers));
    }
  }
  if (options.worker_command &&
      options.worker_command->find_first_not_of(" \t\n") == std::string::npos) {
    return Status::InvalidArgument(
        "--worker-command must name the program every worker runs, e.g. \"python3 train.py\"; "
        "got an empty command");
  }
  PARASYNC_RETURN_IF_ERROR(ValidatePlacement(options));
  return ValidateFaults(options);
}

Result<Fault> ParseFault(std::string_view text) {
  const auto bad = [&] {
    return Status::InvalidArgument("--kill takes ps:INDEX@SECONDS or worker:INDEX@SECONDS, "
                                   "optionally +RESTART_SECONDS, not '" + std::string(text) + "'");
  };
  Fault f;
  std::string_view rest = text;
  if (rest.rfind("ps:", 0) == 0) {
    f.ps = true;
    rest.remove_prefix(3);
  } else if (rest.rfind("worker:", 0) == 0) {
    rest.remove_prefix(7);
  } else {
    return bad();
  }
  const size_t at = rest.find('@');
  if (at == std::string_view::npos) return bad();
  const std::string_view index = rest.substr(0, at);
  auto [p, ec] = std::from_chars(index.data(), index.data() + index.size(), f.index);
  if (ec != std::errc() || p != index.data() + index.size() || index.empty()) return bad();
  std::string_view times = rest.substr(at + 1);
  const size_t plus = times.find('+');
  auto seconds = [](std::string_view t, double* out) {
    if (t.empty()) return false;
    const std::string copy(t);
    char* end = nullptr;
    *out = std::strtod(copy.c_str(), &end);
    return end == copy.c_str() + copy.size() && std::isfinite(*out) && *out >= 0;
  };
  if (!seconds(times.substr(0, plus), &f.at_seconds)) return bad();
  if (plus != std::string_view::npos) {
    double restart = 0.0;
    if (!seconds(times.substr(plus + 1), &restart)) return bad();
    f.restart_after = restart;
  }
  return f;
}

Result<std::vector<HostSlots>> ParseHostSlots(std::string_view text, std::string_view flag) {
  std::vector<HostSlots> slots;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    HostSlots s;
    const size_t colon = item.rfind(':');
    s.host = std::string(item.substr(0, colon));
    if (colon != std::string_view::npos) {
      const std::string_view count = item.substr(colon + 1);
      auto [p, ec] = std::from_chars(count.data(), count.data() + count.size(), s.count);
      if (ec != std::errc() || p != count.data() + count.size() || count.empty() ||
          s.count < 1) {
        s.host.clear();
      }
    }
    if (s.host.empty() || s.host.find_first_of(" \t\n") != std::string::npos) {
      return Status::InvalidArgument(std::string(flag) + " takes host:count,host:count,..., not '" +
                                     std::string(text) + "'");
    }
    slots.push_back(std::move(s));
    start = comma + 1;
  }
  return slots;
}

bool IsLocalHost(std::string_view host) {
  return host == "localhost" || host == "127.0.0.1" || host == "::1";
}

}  // namespace parasync::launch
