#include "common/model_spec.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace parasync {

const OptimizerKindInfo* FindOptimizerKind(OptimizerKind kind) {
  const auto i = static_cast<size_t>(kind);
  return i < std::size(kOptimizerKinds) ? &kOptimizerKinds[i] : nullptr;
}

Result<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  std::string expected;
  for (size_t i = 0; i < std::size(kOptimizerKinds); ++i) {
    if (kOptimizerKinds[i].name == name) return kOptimizerKinds[i].kind;
    if (i > 0) expected += i + 1 == std::size(kOptimizerKinds) ? " or " : ", ";
    expected += kOptimizerKinds[i].name;
  }
  return Status::InvalidArgument("unknown optimizer '" + name + "' (expected " + expected + ")");
}

std::string_view OptimizerKindName(OptimizerKind kind) {
  const OptimizerKindInfo* info = FindOptimizerKind(kind);
  return info != nullptr ? info->name : "unknown";
}

Result<LrSchedule> ParseLrSchedule(const std::string& name) {
  if (name == "constant") return LrSchedule::kConstant;
  if (name == "cosine") return LrSchedule::kCosine;
  return Status::InvalidArgument("unknown learning-rate schedule '" + name +
                                 "' (expected constant or cosine)");
}

std::string_view LrScheduleName(LrSchedule schedule) {
  switch (schedule) {
    case LrSchedule::kConstant: return "constant";
    case LrSchedule::kCosine: return "cosine";
  }
  return "unknown";
}

float LrScheduleFactor(const OptimizerSpec& spec, int64_t examples) {
  if (spec.schedule != LrSchedule::kCosine) return 1.0f;
  const double progress =
      static_cast<double>(std::clamp<int64_t>(examples, 0, spec.decay_examples)) /
      static_cast<double>(spec.decay_examples);
  const double f = spec.final_lr_fraction;
  return static_cast<float>(f + (1.0 - f) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
}

namespace {
bool InUnitInterval(float x) { return x >= 0.0f && x < 1.0f; }
}  // namespace

Status ValidateMomentumHyperparameters(const OptimizerSpec& s) {
  if (!InUnitInterval(s.momentum)) return Status::InvalidArgument("momentum must be in [0, 1)");
  return Status::Ok();
}

Status ValidateAdamHyperparameters(const OptimizerSpec& s) {
  if (!InUnitInterval(s.beta1) || !InUnitInterval(s.beta2)) {
    return Status::InvalidArgument("adam beta1 and beta2 must be in [0, 1)");
  }
  if (!(s.epsilon > 0.0f)) return Status::InvalidArgument("adam epsilon must be > 0");
  return Status::Ok();
}

Status ValidateAdagradHyperparameters(const OptimizerSpec& s) {
  if (!(s.initial_accumulator >= 0.0f) || !std::isfinite(s.initial_accumulator)) {
    return Status::InvalidArgument("adagrad's initial accumulator must be >= 0 and finite");
  }
  if (!(s.epsilon > 0.0f)) return Status::InvalidArgument("adagrad epsilon must be > 0");
  return Status::Ok();
}

Status ValidateWorkerSideOptimizer(const OptimizerSpec& s) {
  const std::string name(OptimizerKindName(s.kind));
  if (s.learning_rate != 1.0f) {
    return Status::InvalidArgument(name + ": the workers' optimizer owns the learning rate; the "
                                   "servers' must be 1");
  }
  if (s.schedule != LrSchedule::kConstant) {
    return Status::InvalidArgument(name + ": a learning-rate schedule belongs to the workers' "
                                   "optimizer (a torch.optim.lr_scheduler), not the servers");
  }
  if (s.staleness_aware) {
    return Status::InvalidArgument(name + ": staleness-aware scaling needs a server-side "
                                   "optimizer");
  }
  return Status::Ok();
}

Status ValidateOptimizer(const OptimizerSpec& s) {
  if (!(s.learning_rate > 0.0f) || !std::isfinite(s.learning_rate)) {
    return Status::InvalidArgument("learning rate must be a positive finite number");
  }
  const OptimizerKindInfo* info = FindOptimizerKind(s.kind);
  if (info == nullptr) return Status::InvalidArgument("unknown optimizer kind");
  if (info->validate != nullptr) {
    PARASYNC_RETURN_IF_ERROR(info->validate(s));
  }
  switch (s.schedule) {
    case LrSchedule::kConstant: break;
    case LrSchedule::kCosine:
      if (s.decay_examples < 1) {
        return Status::InvalidArgument("a cosine learning-rate schedule needs a horizon of >= 1 "
                                       "examples");
      }
      if (!(s.final_lr_fraction >= 0.0f && s.final_lr_fraction <= 1.0f)) {
        return Status::InvalidArgument("the final learning-rate fraction must be in [0, 1]");
      }
      break;
    default:
      return Status::InvalidArgument("unknown learning-rate schedule");
  }
  return Status::Ok();
}

Status ValidateRegistration(const ModelRegistration& reg) {
  if (!(reg.variables.empty() && !reg.tables.empty())) {
    PARASYNC_RETURN_IF_ERROR(ValidateVariables(reg.variables));
  }
  PARASYNC_RETURN_IF_ERROR(ValidateTables(reg.tables, reg.variables));
  PARASYNC_RETURN_IF_ERROR(ValidateOptimizer(reg.optimizer));
  if (IsWorkerSide(reg.optimizer.kind)) {
    const bool sync = reg.mode.starts_with("sync");
    if (!reg.tables.empty()) {
      return Status::InvalidArgument("embedding tables need a server-side optimizer (sgd, "
                                     "momentum, adam, adagrad), not " +
                                     std::string(OptimizerKindName(reg.optimizer.kind)));
    }
    if (reg.optimizer.kind == OptimizerKind::kAggregate && !sync && !reg.mode.empty()) {
      return Status::InvalidArgument("aggregate is for sync modes; in " + reg.mode +
                                     " the workers push their optimizer's change (delta)");
    }
    if (reg.optimizer.kind == OptimizerKind::kDelta && sync && !reg.mode.empty()) {
      return Status::InvalidArgument("delta is for async and ssp; in " + reg.mode +
                                     " the servers average the gradients (aggregate)");
    }
  }
  if (reg.max_slice_elements < 1) return Status::InvalidArgument("max_slice_elements must be >= 1");
  if (reg.num_shards < 1) return Status::InvalidArgument("num_shards must be >= 1");
  return Status::Ok();
}

namespace {
std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}
}  // namespace

std::string DescribeRegistrationMismatch(const ModelRegistration& have,
                                         const ModelRegistration& got) {
  if (have.num_shards != got.num_shards) {
    return "num_shards " + std::to_string(got.num_shards) + " != registered " +
           std::to_string(have.num_shards);
  }
  if (have.variables.size() != got.variables.size()) {
    return std::to_string(got.variables.size()) + " variables != registered " +
           std::to_string(have.variables.size());
  }
  for (size_t i = 0; i < have.variables.size(); ++i) {
    const VariableSpec& a = have.variables[i];
    const VariableSpec& b = got.variables[i];
    if (a.name != b.name) return "variable " + std::to_string(i) + " is '" + b.name + "', registered '" + a.name + "'";
    if (a.shape != b.shape) {
      return "shape mismatch for '" + a.name + "': " + ShapeString(b.shape) + " != registered " +
             ShapeString(a.shape);
    }
    if (a.dtype != b.dtype) return "dtype mismatch for '" + a.name + "'";
    if (!(a.init == b.init)) return "initializer mismatch for '" + a.name + "'";
  }
  if (std::string t = DescribeTablesMismatch(have.tables, got.tables); !t.empty()) return t;
  if (have.mode != got.mode) {
    return "mode " + got.mode + " != registered " + have.mode;
  }
  if (!(have.optimizer == got.optimizer)) return "optimizer settings differ from the registered ones";
  if (have.seed != got.seed) return "seed differs from the registered one";
  if (have.max_slice_elements != got.max_slice_elements) return "max_slice_elements differs";
  return "";
}

}  // namespace parasync
