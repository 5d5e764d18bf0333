// What a worker registers with the parameter servers: the model's variables, the optimizer
// the servers apply, the seed and the slicing. Plain values; safe to copy between threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/embedding.h"
#include "common/status.h"
#include "common/variable.h"

namespace parasync {

// Numbers are part of the wire protocol (schema/parasync.fbs): never renumber.
// kAggregate and kDelta leave the optimizer to the workers (parasync.horovod): the server
// keeps a step's averaged gradient (sync) or adds each pushed change (async, ssp).
enum class OptimizerKind : uint8_t {
  kSgd = 0,
  kMomentum = 1,
  kAdam = 2,
  kAdagrad = 3,
  kAggregate = 4,
  kDelta = 5,
};
enum class LrSchedule : uint8_t { kConstant = 0, kCosine = 1 };

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.9f;  // kMomentum
  float beta1 = 0.9f;     // kAdam
  float beta2 = 0.999f;   // kAdam
  float epsilon = 1e-7f;  // kAdam and kAdagrad (TensorFlow's default)
  // kAdagrad: the accumulator's starting value (TensorFlow's and Keras's default). The slot
  // holds the sum of squared gradients since; the update adds this back.
  float initial_accumulator = 0.1f;
  // Divide each update by max(1, staleness), staleness = versions applied between the read
  // and the apply of its gradient (Zhang et al. 2016). For async and ssp.
  bool staleness_aware = false;
  // Learning-rate schedule. Its clock is the number of training examples the shard has
  // applied: the same measure in async, ssp and sync (where a step's examples are every
  // contributor's), and restored with the store, so a restarted server goes on where it
  // was. kCosine is Keras's CosineDecay over `decay_examples`:
  //   lr * (f + (1 - f) * (1 + cos(pi * min(e, decay_examples) / decay_examples)) / 2)
  // with f = final_lr_fraction, then lr * f from decay_examples on.
  LrSchedule schedule = LrSchedule::kConstant;
  int64_t decay_examples = 0;      // kCosine: > 0
  float final_lr_fraction = 0.0f;  // kCosine: in [0, 1]
  bool operator==(const OptimizerSpec&) const = default;
};

// The hyperparameter checks of the optimizers that have some beyond the learning rate: momentum
// in [0, 1); adam's betas in [0, 1) and epsilon > 0.
Status ValidateMomentumHyperparameters(const OptimizerSpec& spec);
Status ValidateAdamHyperparameters(const OptimizerSpec& spec);
// adagrad: initial accumulator >= 0 and finite, epsilon > 0, and not both zero.
Status ValidateAdagradHyperparameters(const OptimizerSpec& spec);
// aggregate and delta: the workers' optimizer owns the learning rate, its schedule and any
// staleness scaling, so the server takes none (learning rate 1, constant, not scaled).
Status ValidateWorkerSideOptimizer(const OptimizerSpec& spec);
// The optimizer runs on the workers (kAggregate, kDelta).
inline bool IsWorkerSide(OptimizerKind kind) {
  return kind == OptimizerKind::kAggregate || kind == OptimizerKind::kDelta;
}

// The most slot arrays any optimizer keeps: a row below with more does not compile, so the
// server may hold slot pointers in std::array<float*, kMaxOptimizerSlots>.
inline constexpr int kMaxOptimizerSlots = 2;

// One optimizer as both sides know it: its name (flags, model files, logs), the slot arrays the
// server keeps for it (each as long as the variable, starting at zero) and the check of its
// hyperparameters (null: none beyond the learning rate).
struct OptimizerKindInfo {
  OptimizerKind kind;
  std::string_view name;
  int slots;
  Status (*validate)(const OptimizerSpec& spec);
};

// Every optimizer, in OptimizerKind order. A new one is: its enum value (here and in
// schema/parasync.fbs, tied by static_assert in common/wire.cc), a row here, its update in the
// server's table (ps/optimizer.cc, which must have as many rows in the same order or it does
// not compile) and its tests.
inline constexpr OptimizerKindInfo kOptimizerKinds[] = {
    {OptimizerKind::kSgd, "sgd", 0, nullptr},
    {OptimizerKind::kMomentum, "momentum", 1, &ValidateMomentumHyperparameters},  // v
    {OptimizerKind::kAdam, "adam", 2, &ValidateAdamHyperparameters},              // m, v
    {OptimizerKind::kAdagrad, "adagrad", 1, &ValidateAdagradHyperparameters},     // sum g^2
    {OptimizerKind::kAggregate, "aggregate", 0, &ValidateWorkerSideOptimizer},     // w = g
    {OptimizerKind::kDelta, "delta", 0, &ValidateWorkerSideOptimizer},             // w += g
};

constexpr bool OptimizerKindsAreWellFormed() {
  for (size_t i = 0; i < std::size(kOptimizerKinds); ++i) {
    if (static_cast<size_t>(kOptimizerKinds[i].kind) != i) return false;
    if (kOptimizerKinds[i].slots < 0 || kOptimizerKinds[i].slots > kMaxOptimizerSlots) return false;
  }
  return true;
}
static_assert(OptimizerKindsAreWellFormed(),
              "kOptimizerKinds: rows in OptimizerKind order, at most kMaxOptimizerSlots slots each");

// The row of `kind`; null for a kind outside the table (never for a validated spec).
const OptimizerKindInfo* FindOptimizerKind(OptimizerKind kind);

// "constant", "cosine" -> schedule; InvalidArgument otherwise.
Result<LrSchedule> ParseLrSchedule(const std::string& name);
std::string_view LrScheduleName(LrSchedule schedule);
// The factor the schedule multiplies the learning rate by once `examples` have been applied
// (1 for kConstant). Precondition: ValidateOptimizer(spec) ok.
float LrScheduleFactor(const OptimizerSpec& spec, int64_t examples);

// "sgd", "momentum", "adam" -> kind; InvalidArgument otherwise.
Result<OptimizerKind> ParseOptimizerKind(const std::string& name);
std::string_view OptimizerKindName(OptimizerKind kind);
// Checks learning rate > 0 and finite, momentum/betas in [0, 1), epsilon > 0, and the
// schedule's horizon and final fraction.
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
  // Embedding tables (common/embedding.h): kept as rows by id, spread over the shards by
  // ShardOfRow, pulled and pushed by id; the optimizer above updates their rows too.
  std::vector<TableSpec> tables;
  bool operator==(const ModelRegistration&) const = default;
};

// Variables valid (none only with a table), tables valid, optimizer valid, max_slice_elements >= 1, num_shards >= 1.
Status ValidateRegistration(const ModelRegistration& reg);

// A one-line human description of the first difference between two registrations, for the
// error a mismatching re-registration gets; empty when they match (the model description
// aside: a server keeps the first one it was given).
std::string DescribeRegistrationMismatch(const ModelRegistration& have,
                                         const ModelRegistration& got);

}  // namespace parasync
