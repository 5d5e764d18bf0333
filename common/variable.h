// Model variables as both sides see them: what a worker declares in Register and what a
// parameter server creates. Plain values; safe to copy between threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/split_mix.h"
#include "common/status.h"

namespace parasync {

// Numbers are part of the wire protocol (schema/parasync.fbs): never renumber. Variables are
// float32; the 16-bit types, int8 and top-k exist only on the wire (common/float_codec.h,
// common/int8_codec.h, common/topk_codec.h, --wire-dtype).
enum class DType : uint8_t { kFloat32 = 0, kBfloat16 = 1, kFloat16 = 2, kInt8 = 3, kTopK = 4, kInt4 = 5 };

// How a tensor travels: its wire dtype and, for top-k, the elements sent per chunk of 256
// (1..255; 0 for the other dtypes). A plain DType converts to one.
struct WireFormat {
  DType dtype = DType::kFloat32;
  int keep = 0;
  WireFormat() = default;
  WireFormat(DType d, int k = 0) : dtype(d), keep(k) {}  // NOLINT: a DType is a format
  bool operator==(const WireFormat&) const = default;
};

enum class InitKind : uint8_t {
  kZeros = 0,
  kConstant = 1,  // every element = value
  kUniform = 2,   // uniform in [-value, value), from the registration seed
  // The creating registration carries the values (a client's own initialization, e.g. a
  // PyTorch module's): rank 0 sends them as frames after its Register header, and a
  // registration without them only joins a model already created (a server answers it
  // Unavailable until then). Dense variables only: a table's rows are never all sent.
  kProvided = 3,
};

struct Initializer {
  InitKind kind = InitKind::kZeros;
  float value = 0.0f;
  bool operator==(const Initializer&) const = default;
};

struct VariableSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  Initializer init;

  // Product of the shape; 1 for a scalar (empty shape).
  int64_t num_elements() const;
  bool operator==(const VariableSpec&) const = default;
};

// Largest model, in elements, that any process accepts (4 TiB of float32).
inline constexpr int64_t kMaxModelElements = int64_t{1} << 40;

// Checks names are non-empty and unique, dims positive, and every variable and the whole
// list at most kMaxModelElements elements (computed without overflow).
Status ValidateVariables(const std::vector<VariableSpec>& vars);

// Fills `out` (the elements [offset, offset+out.size()) of variable `var_index`) with the
// initial values for `init`. Deterministic in (seed, var_index, element index) alone, so a
// variable's initial value does not depend on how it is sliced or sharded.
void InitializeElements(const Initializer& init, uint64_t seed, uint32_t var_index,
                        int64_t offset, float* out, int64_t count);

// Fills out[0, count) with `init`'s values; kUniform draws element i from
// SplitMix64(stream + first + i) (24 bits, scaled to [-value, value)). InitializeElements and
// common/embedding.h's InitializeRow differ only in their stream and first element.
void FillInitialized(const Initializer& init, uint64_t stream, uint64_t first, float* out,
                     int64_t count);

}  // namespace parasync
