// The MLP model: its shape and the variables it declares to the parameter servers.
// Plain values and pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/variable.h"

namespace parasync {

// widths = {inputs, hidden..., classes}, e.g. {784, 256, 128, 10}. ReLU after every hidden
// layer, softmax cross-entropy on the last.
struct MlpSpec {
  std::vector<int64_t> widths;

  int num_layers() const { return static_cast<int>(widths.size()) - 1; }
};

// Parses "784-256-128-10" (at least two widths, each in [1, 1<<20]).
Result<MlpSpec> ParseMlpWidths(const std::string& text);

// The variables, layer by layer: "dense<l>/kernel" shape {in, out} (row-major, uniform
// Glorot init: limit sqrt(6 / (in + out))), then "dense<l>/bias" shape {out} (zeros).
// Index 2l is layer l's kernel, 2l+1 its bias.
std::vector<VariableSpec> MlpVariables(const MlpSpec& spec);

}  // namespace parasync
