#include "worker/model/mlp.h"

#include <charconv>
#include <cmath>
#include <string_view>
#include <system_error>

namespace parasync {

namespace {
constexpr int64_t kMaxWidth = int64_t{1} << 20;
}  // namespace

Result<MlpSpec> ParseMlpWidths(const std::string& text) {
  MlpSpec spec;
  std::string_view rest(text);
  while (true) {
    const size_t dash = rest.find('-');
    const std::string_view field = rest.substr(0, dash);
    if (field.empty()) {
      return Status::InvalidArgument("MLP widths '" + text +
                                     "': empty width (expected e.g. 784-256-128-10)");
    }
    int64_t width = 0;
    const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), width);
    if (ec == std::errc::result_out_of_range) {
      return Status::InvalidArgument("MLP widths '" + text + "': width '" + std::string(field) +
                                     "' is out of range [1, " + std::to_string(kMaxWidth) + "]");
    }
    if (ec != std::errc() || end != field.data() + field.size()) {
      return Status::InvalidArgument("MLP widths '" + text + "': '" + std::string(field) +
                                     "' is not a decimal integer");
    }
    if (width < 1 || width > kMaxWidth) {
      return Status::InvalidArgument("MLP widths '" + text + "': width " +
                                     std::to_string(width) + " is out of range [1, " +
                                     std::to_string(kMaxWidth) + "]");
    }
    spec.widths.push_back(width);
    if (dash == std::string_view::npos) break;
    rest.remove_prefix(dash + 1);
  }
  if (spec.widths.size() < 2) {
    return Status::InvalidArgument("MLP widths '" + text +
                                   "': need at least two widths (inputs and classes)");
  }
  return spec;
}

std::vector<VariableSpec> MlpVariables(const MlpSpec& spec) {
  std::vector<VariableSpec> vars;
  const int layers = spec.num_layers();
  if (layers <= 0) return vars;
  vars.reserve(2 * static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    const int64_t in = spec.widths[l];
    const int64_t out = spec.widths[l + 1];
    const std::string prefix = "dense" + std::to_string(l);

    VariableSpec kernel;
    kernel.name = prefix + "/kernel";
    kernel.shape = {in, out};
    kernel.init.kind = InitKind::kUniform;
    kernel.init.value = static_cast<float>(std::sqrt(6.0 / static_cast<double>(in + out)));
    vars.push_back(std::move(kernel));

    VariableSpec bias;
    bias.name = prefix + "/bias";
    bias.shape = {out};
    bias.init.kind = InitKind::kZeros;
    vars.push_back(std::move(bias));
  }
  return vars;
}

}  // namespace parasync
