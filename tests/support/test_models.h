// Small models for tests, built from the same descriptions users write.
#pragma once

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "worker/model/model.h"

namespace parasync::testing {

// The model `text` (a built-in name, MLP widths or JSON text starting with '{') bound to
// inputs of shape `input`. A description that does not build is the test's own mistake:
// it says why and aborts.
inline Model MakeModel(const std::string& text, const std::vector<int64_t>& input) {
  Result<ModelSpec> spec = !text.empty() && text[0] == '{' ? ParseModelSpecJson(text, "test model")
                                                           : ResolveModelSpec(text);
  Result<Model> model = spec.ok() ? Model::Build(*spec, input) : Result<Model>(spec.status());
  if (!model.ok()) {
    std::cerr << "test model " << text << ": " << model.status().ToString() << "\n";
    std::abort();
  }
  return std::move(model).value();
}

}  // namespace parasync::testing
