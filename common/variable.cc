#include "common/variable.h"

#include <set>

namespace parasync {

int64_t VariableSpec::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Status ValidateVariables(const std::vector<VariableSpec>& vars) {
  if (vars.empty()) return Status::InvalidArgument("no variables declared");
  std::set<std::string> names;
  int64_t total = 0;
  for (const VariableSpec& v : vars) {
    if (v.name.empty()) return Status::InvalidArgument("a variable has an empty name");
    if (!names.insert(v.name).second) {
      return Status::InvalidArgument("variable '" + v.name + "' declared twice");
    }
    int64_t n = 1;
    for (int64_t d : v.shape) {
      if (d <= 0) return Status::InvalidArgument("variable '" + v.name + "' has a dimension <= 0");
      if (n > kMaxModelElements / d) {
        return Status::InvalidArgument("variable '" + v.name + "' is too large");
      }
      n *= d;
    }
    if (n > kMaxModelElements - total) {
      return Status::InvalidArgument("the model has more than 2^40 elements");
    }
    total += n;
    if (v.dtype != DType::kFloat32) {
      return Status::InvalidArgument("variable '" + v.name + "' has dtype " +
                                     std::to_string(static_cast<int>(v.dtype)) +
                                     ": variables are float32 (16-bit types are for the wire, "
                                     "parasync-worker --wire-dtype)");
    }
  }
  return Status::Ok();
}

void FillInitialized(const Initializer& init, uint64_t stream, uint64_t first, float* out,
                     int64_t count) {
  switch (init.kind) {
    case InitKind::kZeros:
    case InitKind::kProvided:  // the values come with the registration: zeros until then
      for (int64_t i = 0; i < count; ++i) out[i] = 0.0f;
      return;
    case InitKind::kConstant:
      for (int64_t i = 0; i < count; ++i) out[i] = init.value;
      return;
    case InitKind::kUniform:
      for (int64_t i = 0; i < count; ++i) {
        const uint64_t r = SplitMix64(stream + first + static_cast<uint64_t>(i));
        // 24 random bits -> [0, 1).
        const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
        out[i] = (2.0f * u - 1.0f) * init.value;
      }
      return;
  }
}

void InitializeElements(const Initializer& init, uint64_t seed, uint32_t var_index,
                        int64_t offset, float* out, int64_t count) {
  FillInitialized(init, SplitMix64(seed ^ SplitMix64(var_index + 1)),
                  static_cast<uint64_t>(offset), out, count);
}

}  // namespace parasync
