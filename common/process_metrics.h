// The metrics every parasync process exports besides its own: the process_* family that
// Prometheus' client libraries export (CPU time, memory, start time, file descriptors, under
// the same names, so existing dashboards and alerts work) and parasync_build_info. prometheus-
// cpp has no process collector; this one reads /proc/self at scrape time. MetricsServer
// (common/metrics.h) serves it beside each process's registry.
#pragma once

#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

namespace parasync {

// Collect() returns, from /proc/self and getrlimit at the time of the call:
//   process_cpu_seconds_total       counter, user + system CPU seconds
//   process_resident_memory_bytes   gauge
//   process_virtual_memory_bytes    gauge
//   process_start_time_seconds      gauge, unix seconds
//   process_open_fds                gauge
//   process_max_fds                 gauge, the soft RLIMIT_NOFILE
//   parasync_build_info{version, protocol, schema}  gauge, always 1 (common/version.h)
// A figure that cannot be read (no /proc) is left out rather than reported as 0.
// Thread-safe: Collect() keeps no state between calls.
class ProcessCollector : public prometheus::Collectable {
 public:
  ProcessCollector();
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  double start_time_seconds_ = -1;  // read once: it does not change; < 0 when unknown
};

}  // namespace parasync
