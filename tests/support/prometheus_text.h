// The Prometheus text exposition format (0.0.4) as the tests read it: a /metrics page (with
// or without its HTTP head) or a metrics-*.prom file, parsed into samples, so that a test asks
// for a series by name and labels instead of matching text. Test-only code; pure functions.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace parasync::testing {

// A sample's labels, name -> value (unescaped).
using PrometheusLabels = std::map<std::string, std::string>;

// One sample line: `name{label="value",...} value [timestamp]`.
struct PrometheusSample {
  std::string name;
  PrometheusLabels labels;
  double value = 0;
};

// The samples of `text`, in their order. An HTTP head (text starting "HTTP/", up to the first
// blank line) is skipped, and so is every line that is not a sample: comments (# HELP,
// # TYPE), blank lines, anything malformed.
std::vector<PrometheusSample> ParsePrometheusText(std::string_view text);

// The value of the first sample in `text` named `name` whose labels include every pair of
// `labels` (it may have others); nullopt when there is none.
std::optional<double> PrometheusValue(std::string_view text, std::string_view name,
                                      const PrometheusLabels& labels = {});

}  // namespace parasync::testing
