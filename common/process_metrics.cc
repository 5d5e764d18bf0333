#include "common/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <ctime>
#include <filesystem>
#include <limits>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include "common/version.h"

namespace parasync {
namespace {

// The fields of /proc/self/stat after the command name, which is in parentheses and may hold
// blanks: fields[0] is the state (field 3 of proc(5)), so field n of proc(5) is fields[n - 3].
std::vector<std::string> StatFields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return {};
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream rest(line.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string f; rest >> f;) fields.push_back(f);
  return fields;
}

// Field n (1-based, as proc(5) numbers them) of /proc/self/stat, or -1.
double StatField(const std::vector<std::string>& fields, size_t n) {
  if (n < 3 || n - 3 >= fields.size()) return -1;
  try {
    return std::stod(fields[n - 3]);
  } catch (const std::exception&) {
    return -1;
  }
}

// The system's boot time in unix seconds (btime of /proc/stat), or -1.
double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double btime = -1;
      in >> btime;
      return in ? btime : -1;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return -1;
}

prometheus::MetricFamily Single(const std::string& name, const std::string& help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily family{name, help, type, {}};
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

}  // namespace

ProcessCollector::ProcessCollector() {
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double boot = BootTimeSeconds();
  const double start_ticks = StatField(StatFields(), 22);  // starttime, ticks after boot
  if (ticks > 0 && boot >= 0 && start_ticks >= 0) start_time_seconds_ = boot + start_ticks / ticks;
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const std::vector<std::string> stat = StatFields();
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  const double utime = StatField(stat, 14), stime = StatField(stat, 15);
  if (ticks > 0 && utime >= 0 && stime >= 0) {
    out.push_back(Single("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                         MetricType::Counter, (utime + stime) / ticks));
  }
  if (const double vsize = StatField(stat, 23); vsize >= 0) {
    out.push_back(Single("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                         MetricType::Gauge, vsize));
  }
  if (const double rss = StatField(stat, 24); rss >= 0 && page > 0) {
    out.push_back(Single("process_resident_memory_bytes", "Resident memory size in bytes.",
                         MetricType::Gauge, rss * page));
  }
  if (start_time_seconds_ >= 0) {
    out.push_back(Single("process_start_time_seconds",
                         "Start time of the process since unix epoch in seconds.", MetricType::Gauge,
                         start_time_seconds_));
  }
  std::error_code ec;
  std::filesystem::directory_iterator fds("/proc/self/fd", ec);
  if (!ec) {
    // The iterator's own descriptor is among them, as in the Go and Python clients.
    double open = 0;
    for (auto it = fds; it != std::filesystem::directory_iterator(); it.increment(ec)) {
      if (ec) break;
      ++open;
    }
    if (!ec) {
      out.push_back(Single("process_open_fds", "Number of open file descriptors.", MetricType::Gauge,
                           open));
    }
  }
  if (rlimit limit{}; getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    out.push_back(Single("process_max_fds", "Maximum number of open file descriptors.",
                         MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  const BuildIdentity build = GetBuildIdentity();
  prometheus::MetricFamily info{"parasync_build_info",
                                "Always 1; the labels say which build this process runs: release "
                                "version, wire protocol and schema hash (common/version.h)",
                                MetricType::Gauge,
                                {}};
  prometheus::ClientMetric metric;
  metric.label = {{"protocol", build.protocol}, {"schema", build.schema}, {"version", build.version}};
  metric.gauge.value = 1;
  info.metric.push_back(metric);
  out.push_back(std::move(info));
  return out;
}

}  // namespace parasync
