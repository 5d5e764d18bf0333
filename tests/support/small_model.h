// Small model registrations for the parameter-server tests: the variables a test names, and the
// optimizer, seed, slicing and shard count that make up a registration, set in one place.
// Each test keeps its own shapes and numbers (its assertions depend on them); this is how they
// become a ModelRegistration.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/model_spec.h"
#include "common/variable.h"

namespace parasync::testing {

// `variables` over `num_shards` shards, cut into slices of at most `max_slice_elements`,
// initialized from `seed` and trained with `kind` at `learning_rate` (the optimizer's other
// settings at their defaults; mode async). Tests adjust what else they need on the result.
inline ModelRegistration SmallModel(std::vector<VariableSpec> variables,
                                    int64_t max_slice_elements, int num_shards, uint64_t seed,
                                    float learning_rate,
                                    OptimizerKind kind = OptimizerKind::kSgd) {
  ModelRegistration reg;
  reg.variables = std::move(variables);
  reg.optimizer.kind = kind;
  reg.optimizer.learning_rate = learning_rate;
  reg.seed = seed;
  reg.max_slice_elements = max_slice_elements;
  reg.num_shards = num_shards;
  return reg;
}

// One dense layer's variables: "<name>/kernel" {inputs, units}, uniform in [-limit, limit], and
// "<name>/bias" {units}, initialized by `bias`.
inline std::vector<VariableSpec> DenseLayer(const std::string& name, int64_t inputs,
                                            int64_t units, float limit,
                                            Initializer bias = {InitKind::kZeros, 0.0f}) {
  return {{name + "/kernel", {inputs, units}, DType::kFloat32, {InitKind::kUniform, limit}},
          {name + "/bias", {units}, DType::kFloat32, bias}};
}

}  // namespace parasync::testing
