// The model a worker trains: a list of layers (a model description) bound to the shape of
// its input. The description comes from a JSON model file, a built-in name (mlp, cnn,
// lenet5, ctr) or MLP widths ("784-256-128-10"); docs/models.md gives the format.
//
// A Model owns its layers' shapes and the variables they declare ("<layer>/<param>"); the
// compute backends implement layers, not models, and the parameter servers only ever see the
// variables. Activations are per example, without the batch: an image is [C, H, W] (stored
// in that order, NCHW for a batch), anything else is flat [D].
//
// Plain values and pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/embedding.h"
#include "common/status.h"
#include "common/variable.h"

namespace parasync {

enum class LayerKind : uint8_t {
  kDense,       // y = x W + b over the flattened input; kernel [in, units], bias [units]
  kConv2d,      // cross-correlation; kernel [filters, channels, k, k] (OIHW), bias [filters]
  kMaxPool2d,
  kAvgPool2d,   // padding excluded from the average (as TensorFlow's `same`)
  kFlatten,
  kActivation,  // elementwise relu, tanh or sigmoid
  kDropout,     // training only: zero with probability rate, scale the rest by 1/(1-rate)
  kEmbedding,   // a bag of integer ids per example -> the sum or mean of their rows
};
enum class Activation : uint8_t { kNone, kRelu, kTanh, kSigmoid };
enum class Padding : uint8_t { kValid, kSame };
enum class Combiner : uint8_t { kSum, kMean };
enum class LossKind : uint8_t {
  kSoftmaxCrossEntropy,  // class labels in [0, outputs)
  kSigmoidCrossEntropy,  // 0/1 labels, one output
};

std::string_view LayerKindName(LayerKind kind);  // the model file's "type"
std::string_view ActivationName(Activation a);
std::string_view LossKindName(LossKind loss);

// One layer as the description gives it. Fields a kind does not use keep their defaults.
struct LayerSpec {
  LayerKind kind = LayerKind::kDense;
  std::string name;  // unique; the parser names layers "<type><k>" unless the file does
  int64_t units = 0;                          // dense units, conv2d filters, embedding dim
  int kernel = 0;                             // conv2d kernel, pool size (square)
  int stride = 1;                             // conv2d and pools
  Padding padding = Padding::kValid;          // conv2d and pools
  Activation activation = Activation::kNone;  // after dense/conv2d; an activation layer's own
  float rate = 0;                             // dropout, in [0, 1)
  int64_t vocab = 0;                          // embedding: ids in [0, vocab); sparse: 0 = any
  Combiner combiner = Combiner::kSum;         // embedding
  // Embedding: the table lives row-sparse on the parameter servers (Model::sparse_tables());
  // the backend sees only a compact table of the batch's rows, indexed by local ids.
  bool sparse = false;
  // Embedding: the bags the id columns split into (each K/fields ids); 0 = one per column.
  int64_t fields = 1;
  bool operator==(const LayerSpec&) const = default;
};

// A model description: what a model file holds.
struct ModelSpec {
  std::string name;
  // Optional: the input shape the model was made for. A one-element shape [D] accepts any
  // input of D elements (MLP widths give one); otherwise the data's shape must equal it.
  std::vector<int64_t> input;
  std::vector<LayerSpec> layers;
  LossKind loss = LossKind::kSoftmaxCrossEntropy;
  bool operator==(const ModelSpec&) const = default;
};

// The names --model accepts besides widths and files.
std::vector<std::string> BuiltinModelNames();

// --model TEXT: a built-in name, MLP widths ("784-256-128-10": flat input of 784, ReLU after
// every hidden layer), or the path of a JSON model file. InvalidArgument with one line
// naming the problem (and the file's path) otherwise; NotFound when TEXT is none of those.
Result<ModelSpec> ResolveModelSpec(const std::string& text);

// Parses a model description from JSON text; `source` names it in errors. Unknown keys,
// unknown types and out-of-range values are InvalidArgument.
Result<ModelSpec> ParseModelSpecJson(const std::string& json_text, const std::string& source);

// The description as JSON text (every layer named), which ParseModelSpecJson reads back to
// an equal ModelSpec.
std::string ModelSpecToJson(const ModelSpec& spec);

// What the data gives a model besides its input shape. The input [K + D] holds K id columns
// first, then D dense features.
struct ModelInputs {
  int64_t id_columns = 0;   // K; 0: no id columns (a non-sparse embedding reads the whole input)
  int64_t sparse_rows = 0;  // rows of a sparse table's compact buffer (SparseRowsNeeded)
};

// An embedding table the parameter servers keep row-sparse: variable `variable` of
// Model::variables() is the compact buffer [sparse_rows, dim] the backend computes with; the
// servers hold the table `spec` (rows = vocab, 0 unbounded) row by row.
struct SparseTable {
  int variable = 0;
  TableSpec spec;
};

// A layer as a backend runs it. Dense and conv2d layers with an activation become two ops:
// the layer, then an activation op named "<layer>/<activation>".
struct LayerOp {
  LayerSpec spec;
  std::vector<int64_t> in;   // per-example input shape
  std::vector<int64_t> out;  // per-example output shape
  int first_variable = 0;    // index of this op's first variable in Model::variables()
  int num_variables = 0;     // dense, conv2d: kernel then bias; embedding: table; else 0
  // conv2d and pools: padding above/left and below/right (TensorFlow's split for `same`).
  int pad_begin = 0;
  int pad_end = 0;
  // Embedding: ids are the first id_columns inputs (spec.fields bags, resolved >= 1), the
  // rest dense features copied to the output after the fields' rows. Ids index a table
  // buffer of table_rows rows: vocab, or a sparse table's compact rows.
  int64_t id_columns = 0;
  int64_t table_rows = 0;
  int64_t in_size() const;   // product of `in`
  int64_t out_size() const;  // product of `out`
};

class Model {
 public:
  // Binds `spec` to examples of shape `input` ([C, H, W] or [D]). InvalidArgument with one
  // line naming the layer and both shapes when the model does not fit its input (a conv
  // larger than its input, an image layer after a flat one, an embedding not first, ...),
  // or when the spec is invalid. `inputs` says how many of the input's leading elements are
  // id columns (an embedding's ids; a sparse embedding needs them) and the compact rows of a
  // sparse table.
  static Result<Model> Build(const ModelSpec& spec, const std::vector<int64_t>& input,
                             const ModelInputs& inputs = {});

  const ModelSpec& spec() const { return spec_; }
  const std::vector<int64_t>& input_shape() const { return input_; }
  int64_t input_size() const;  // elements per example
  const std::vector<LayerOp>& ops() const { return ops_; }
  // Every buffer the backend computes with, sparse tables' compact buffers included.
  const std::vector<VariableSpec>& variables() const { return variables_; }
  // The tables kept row-sparse on the servers, in variables() order.
  const std::vector<SparseTable>& sparse_tables() const { return sparse_tables_; }
  // variables() without the sparse tables: what a worker registers as slices.
  std::vector<VariableSpec> dense_variables() const;
  // What Build was given besides the input shape (e.g. to build the model again elsewhere).
  const ModelInputs& inputs() const { return inputs_; }
  // K of the input [K + D] (ModelInputs::id_columns).
  int64_t id_columns() const { return inputs_.id_columns; }
  int64_t outputs() const;  // logits per example
  LossKind loss() const { return spec_.loss; }
  int64_t num_parameters() const;

  // InvalidArgument when labels up to `max_label` do not fit the loss: softmax needs
  // max_label < outputs(), sigmoid labels 0 or 1.
  Status CheckLabelsFit(int max_label) const;

  // One line per op: name, type, output shape, parameters (for logs and --help output).
  std::string Summary() const;

 private:
  ModelSpec spec_;
  std::vector<int64_t> input_;
  std::vector<LayerOp> ops_;
  std::vector<VariableSpec> variables_;
  std::vector<SparseTable> sparse_tables_;
  ModelInputs inputs_;
};

// "[1, 28, 28]".
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace parasync
