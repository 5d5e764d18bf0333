// Small models for tests, built from the same descriptions users write.
#pragma once

#include <cstdlib>
#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "worker/model/model.h"

namespace parasync::testing {

// The description `text` (a built-in name, MLP widths or JSON text starting with '{'). One
// that does not parse is the test's own mistake: it says why and aborts.
inline ModelSpec MakeSpec(const std::string& text) {
  Result<ModelSpec> spec = !text.empty() && text[0] == '{' ? ParseModelSpecJson(text, "test model")
                                                           : ResolveModelSpec(text);
  if (!spec.ok()) {
    std::cerr << "test model " << text << ": " << spec.status().ToString() << "\n";
    std::abort();
  }
  return std::move(spec).value();
}

// The model `text` (as MakeSpec) bound to inputs of shape `input` (with `inputs`' id columns
// and compact rows). A description that does not build is the test's own mistake: it says
// why and aborts.
inline Model MakeModel(const std::string& text, const std::vector<int64_t>& input,
                       const ModelInputs& inputs = {}) {
  Result<Model> model = Model::Build(MakeSpec(text), input, inputs);
  if (!model.ok()) {
    std::cerr << "test model " << text << ": " << model.status().ToString() << "\n";
    std::abort();
  }
  return std::move(model).value();
}

// A small model exercising one layer (or one edge case of it), for the gradient tests of
// every backend. Layers without variables sit behind one with some, so their input
// gradients are checked too.
struct LayerCase {
  std::string name;  // a test name
  std::string description;
  std::vector<int64_t> input;
  int batch;
  ModelInputs inputs = {};  // id columns and compact rows of an embedding
};

inline std::vector<LayerCase> LayerCases() {
  return {
      {"DenseOddSizesBatchOne", R"({"layers": [{"type": "dense", "units": 4, "activation": "tanh"},
                                               {"type": "dense", "units": 3}]})", {5}, 1},
      {"DenseOddSizesBatchThree", R"({"layers": [{"type": "dense", "units": 4, "activation": "tanh"},
                                                 {"type": "dense", "units": 3}]})", {5}, 3},
      {"Conv2dValidStrideOne", R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 1},
                                              {"type": "conv2d", "filters": 3, "kernel": 3},
                                              {"type": "flatten"}, {"type": "dense", "units": 3}]})",
       {2, 5, 5}, 2},
      // 7 wide, kernel 3, stride 2, same: 4 outputs, one padding column on each side.
      {"Conv2dSameStrideTwo", R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 1},
                                             {"type": "conv2d", "filters": 3, "kernel": 3, "stride": 2,
                                              "padding": "same"},
                                             {"type": "dense", "units": 3}]})", {2, 7, 7}, 1},
      // 7 wide, kernel 4, stride 2, same: 4 outputs, padding 1 before and 2 after.
      {"Conv2dSameUnevenPadding", R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 1},
                                                 {"type": "conv2d", "filters": 3, "kernel": 4, "stride": 2,
                                                  "padding": "same"},
                                                 {"type": "dense", "units": 3}]})", {2, 7, 7}, 1},
      {"Conv2dValidStrideTwoLeavesTheLastRowOut",
       R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 1},
                      {"type": "conv2d", "filters": 2, "kernel": 3, "stride": 2},
                      {"type": "dense", "units": 3}]})", {1, 6, 6}, 3},
      {"MaxPoolValidWithLeftoverThenSame",
       R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 1},
                      {"type": "max_pool2d", "pool": 2},
                      {"type": "max_pool2d", "pool": 3, "stride": 2, "padding": "same"},
                      {"type": "flatten"}, {"type": "dense", "units": 3}]})", {2, 5, 5}, 2},
      {"AvgPoolValidWithLeftoverThenSame",
       R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 1},
                      {"type": "avg_pool2d", "pool": 2},
                      {"type": "avg_pool2d", "pool": 3, "stride": 1, "padding": "same"},
                      {"type": "flatten"}, {"type": "dense", "units": 3}]})", {2, 5, 5}, 2},
      // 7 wide, pool 4, stride 2, same: 4 outputs, padding 1 before and 2 after, left out of
      // each window's mean.
      {"AvgPoolSameUnevenPadding", R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 1},
                                                  {"type": "avg_pool2d", "pool": 4, "stride": 2,
                                                   "padding": "same"},
                                                  {"type": "dense", "units": 3}]})", {2, 7, 7}, 2},
      // 5 wide, pool 2, stride 1, same: 5 outputs, no padding before and 1 after.
      {"AvgPoolSameEvenPoolStrideOne",
       R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 1},
                      {"type": "avg_pool2d", "pool": 2, "stride": 1, "padding": "same"},
                      {"type": "flatten"}, {"type": "dense", "units": 3}]})", {1, 5, 5}, 2},
      // 7 wide, pool 4, stride 2, same: padding 1 before and 2 after, never the maximum.
      {"MaxPoolSameUnevenPadding", R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 1},
                                                  {"type": "max_pool2d", "pool": 4, "stride": 2,
                                                   "padding": "same"},
                                                  {"type": "dense", "units": 3}]})", {2, 7, 7}, 2},
      {"Relu", R"({"layers": [{"type": "dense", "units": 6}, {"type": "activation", "activation": "relu"},
                              {"type": "dense", "units": 3}]})", {4}, 3},
      {"Tanh", R"({"layers": [{"type": "dense", "units": 6}, {"type": "activation", "activation": "tanh"},
                              {"type": "dense", "units": 3}]})", {4}, 3},
      {"Sigmoid", R"({"layers": [{"type": "dense", "units": 6},
                                 {"type": "activation", "activation": "sigmoid"},
                                 {"type": "dense", "units": 3}]})", {4}, 3},
      {"ActivationsFusedIntoConvolutions",
       R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 2, "activation": "sigmoid"},
                      {"type": "conv2d", "filters": 2, "kernel": 2, "activation": "tanh"},
                      {"type": "dense", "units": 3}]})", {1, 4, 4}, 2},
      {"Dropout", R"({"layers": [{"type": "dense", "units": 8}, {"type": "dropout", "rate": 0.5},
                                 {"type": "dense", "units": 3}]})", {4}, 3},
      // Dropout over an activation's output: the activation's backward pass reads that output,
      // so dropout may not overwrite it.
      {"DropoutAfterTanh", R"({"layers": [{"type": "dense", "units": 6, "activation": "tanh"},
                                          {"type": "dropout", "rate": 0.5},
                                          {"type": "dense", "units": 3}]})", {4}, 3},
      {"ReluAfterMaxPool", R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 1},
                                          {"type": "max_pool2d", "pool": 2},
                                          {"type": "activation", "activation": "relu"},
                                          {"type": "dense", "units": 3}]})", {2, 4, 4}, 2},
      {"EmbeddingSum", R"({"layers": [{"type": "embedding", "vocab": 7, "dim": 4},
                                      {"type": "dense", "units": 3}]})", {3}, 4},
      {"EmbeddingMean", R"({"layers": [{"type": "embedding", "vocab": 7, "dim": 4, "combiner": "mean"},
                                       {"type": "dense", "units": 3}]})", {3}, 4},
      // 4 id columns in 2 fields over 9 compact rows, then 2 dense features passed through.
      {"EmbeddingSparseFieldsAndFeatures",
       R"({"layers": [{"type": "embedding", "dim": 3, "sparse": true, "fields": 2},
                      {"type": "dense", "units": 3}]})", {6}, 3, {4, 9}},
      {"EmbeddingSparseMeanFieldPerColumnIdsOnly",
       R"({"layers": [{"type": "embedding", "dim": 2, "sparse": true, "fields": 0, "combiner": "mean"},
                      {"type": "dense", "units": 3}]})", {3}, 4, {3, 12}},
      {"SigmoidCrossEntropy", R"({"layers": [{"type": "dense", "units": 3, "activation": "relu"},
                                             {"type": "dense", "units": 1}],
                                  "loss": "sigmoid_cross_entropy"})", {4}, 5},
  };
}

// Test names in failure messages instead of bytes.
inline void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }

// The built-in models on Fashion-MNIST's shape.
inline std::vector<LayerCase> BuiltinCases() {
  return {{"mlp", "mlp", {1, 28, 28}, 2}, {"cnn", "cnn", {1, 28, 28}, 2},
          {"lenet5", "lenet5", {1, 28, 28}, 2}};
}

}  // namespace parasync::testing
