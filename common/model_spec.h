// What a worker registers with the parameter servers: the model's variables, the optimizer
// the servers apply, the seed and the slicing. Plain values; safe to copy between threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/variable.h"

namespace parasync {

// Numbers are part of the wire protocol (schema/parasync.fbs): never renumber.
enum class OptimizerKind : uint8_t { kSgd = 0, kMomentum = 1, kAdam = 2 };

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.9f;  // kMomentum
  float beta1 = 0.9f;     // kAdam
  float beta2 = 0.999f;   // kAdam
  float epsilon = 1e-7f;  // kAdam (TensorFlow's default)
  // Divide each update by max(1, staleness), staleness = versions applied between the read
  // and the apply of its gradient (Zhang et al. 2016). For async and ssp.
  bool staleness_aware = false;
  bool operator==(const OptimizerSpec&) const = default;
};

// "sgd", "momentum", "adam" -> kind; InvalidArgument otherwise.
Result<OptimizerKind> ParseOptimizerKind(const std::string& name);
std::string_view OptimizerKindName(OptimizerKind kind);
// Checks learning rate > 0 and finite, momentum/betas in [0, 1), epsilon > 0.
Status ValidateOptimizer(const OptimizerSpec& spec);

// Slices hold at most this many elements by default (256 KiB of float32).
inline constexpr int64_t kDefaultMaxSliceElements = 64 * 1024;

struct ModelRegistration {
  std::vector<VariableSpec> variables;
  OptimizerSpec optimizer;
  uint64_t seed = 0;
  int64_t max_slice_elements = kDefaultMaxSliceElements;
  int32_t num_shards = 1;
  std::string mode = "async";  // must equal the servers' --mode
  // The model description (JSON) the variables came from, for exports; opaque to the
  // servers and not compared between registrations (DescribeRegistrationMismatch).
  std::string model;
  bool operator==(const ModelRegistration&) const = default;
};

// Variables valid, optimizer valid, max_slice_elements >= 1, num_shards >= 1.
Status ValidateRegistration(const ModelRegistration& reg);

// A one-line human description of the first difference between two registrations, for the
// error a mismatching re-registration gets; empty when they match (the model description
// aside: a server keeps the first one it was given).
std::string DescribeRegistrationMismatch(const ModelRegistration& have,
                                         const ModelRegistration& got);

}  // namespace parasync
