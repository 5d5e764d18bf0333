// The model file: a whole trained model in one file, written by parasync-export and read by
// parasync-worker --eval-only. Format (docs/model-format.md):
//
//   "PSYNCMDL" | u32 format version (1) | u32 header length H | H bytes of JSON header |
//   zero padding to a multiple of 64 | float32 data of every variable, in header order |
//   u32 CRC-32 (zlib) of every byte before it
//
// All integers and floats little-endian. Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "common/variable.h"

namespace parasync {

struct ModelFile {
  std::vector<VariableSpec> variables;       // name, shape, dtype (initializers not kept)
  std::vector<std::vector<float>> values;    // one array per variable, num_elements() long
  std::string metadata_json = "{}";          // free-form provenance (step, mode, source)
};

// Writes `model` to `path` through a temporary file and a rename, so a reader never sees a
// partial file. InvalidArgument when a value array does not match its variable's size,
// Unavailable on an I/O error.
Status WriteModelFile(const std::string& path, const ModelFile& model);

// Reads a model file. NotFound for a missing file; Corruption (naming the path) for a wrong
// magic, an unknown format version, a truncated file, a header that does not parse or a
// checksum mismatch.
Result<ModelFile> ReadModelFile(const std::string& path);

}  // namespace parasync
