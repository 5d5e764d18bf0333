#include "worker/model/model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

namespace parasync {

namespace {

using Json = nlohmann::json;

// Bounds that keep every size in int32 for BLAS/oneDNN/cuDNN and every model sane.
constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxExampleSize = int64_t{1} << 26;  // elements of one example's activation
constexpr int kMaxKernel = 1024;
// Ids reach a sparse table as 64-bit row keys, never as floats; 2^62 leaves headroom.
constexpr int64_t kMaxSparseVocab = int64_t{1} << 62;
// The compact rows are indexed by local ids, which travel as float32: exact up to 2^24.
constexpr int64_t kMaxFloatIndex = int64_t{1} << 24;

struct KindName {
  LayerKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {LayerKind::kDense, "dense"},           {LayerKind::kConv2d, "conv2d"},
    {LayerKind::kMaxPool2d, "max_pool2d"},  {LayerKind::kAvgPool2d, "avg_pool2d"},
    {LayerKind::kFlatten, "flatten"},       {LayerKind::kActivation, "activation"},
    {LayerKind::kDropout, "dropout"},       {LayerKind::kEmbedding, "embedding"},
};

std::string Quote(const std::string& s) { return "'" + s + "'"; }

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t p = 1;
  for (int64_t d : shape) p *= d;
  return p;
}

// Output length and padding of a window of `k` at stride `s` over `n` (TensorFlow's rule:
// valid floor((n - k) / s) + 1; same ceil(n / s), padding split with the extra one after).
struct Window {
  int64_t out = 0;
  int pad_begin = 0;
  int pad_end = 0;
};
Window Slide(int64_t n, int k, int s, Padding padding) {
  Window w;
  if (padding == Padding::kValid) {
    w.out = n >= k ? (n - k) / s + 1 : 0;
    return w;
  }
  w.out = (n + s - 1) / s;
  const int64_t total = std::max<int64_t>((w.out - 1) * s + k - n, 0);
  w.pad_begin = static_cast<int>(total / 2);
  w.pad_end = static_cast<int>(total - total / 2);
  return w;
}

// ---- JSON reading -----------------------------------------------------------------------

class LayerReader {
 public:
  LayerReader(const Json& j, std::string where) : j_(j), where_(std::move(where)) {}

  Status CheckKeys(std::initializer_list<const char*> allowed) const {
    for (const auto& [key, value] : j_.items()) {
      bool known = key == "type" || key == "name";
      for (const char* a : allowed) known = known || key == a;
      if (!known) {
        std::string list;
        for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
        return Status::InvalidArgument(where_ + ": unknown key " + Quote(key) +
                                       (list.empty() ? "" : " (this layer takes " + list + ")"));
      }
    }
    return Status::Ok();
  }

  // An integer in [lo, hi]; `fallback` when absent and not required.
  Result<int64_t> Int(const char* key, int64_t lo, int64_t hi, std::optional<int64_t> fallback) const {
    if (!j_.contains(key)) {
      if (fallback) return *fallback;
      return Status::InvalidArgument(where_ + ": needs " + Quote(key));
    }
    const Json& v = j_.at(key);
    if (!v.is_number_integer()) {
      return Status::InvalidArgument(where_ + ": " + Quote(key) + " must be an integer, not " +
                                     v.dump());
    }
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) {
      return Status::InvalidArgument(where_ + ": " + Quote(key) + " " + std::to_string(x) +
                                     " is out of range [" + std::to_string(lo) + ", " +
                                     std::to_string(hi) + "]");
    }
    return x;
  }

  // The value named by the string at `key`, one of `choices`' names; `fallback` when absent
  // (nullopt: required). Maps straight to the value: no string is kept (GCC 12 reported a
  // false -Wmaybe-uninitialized on a std::string moved out of a Result and then compared).
  template <typename E>
  Result<E> Choice(const char* key, std::initializer_list<std::pair<const char*, E>> choices,
                   std::optional<E> fallback) const {
    std::string list;
    for (const auto& c : choices) list += std::string(list.empty() ? "" : ", ") + c.first;
    if (!j_.contains(key)) {
      if (fallback) return *fallback;
      return Status::InvalidArgument(where_ + ": needs " + Quote(key) + " (" + list + ")");
    }
    const Json& v = j_.at(key);
    if (v.is_string()) {
      const std::string& s = v.get_ref<const std::string&>();
      for (const auto& c : choices) {
        if (s == c.first) return c.second;
      }
    }
    return Status::InvalidArgument(where_ + ": " + Quote(key) + " must be one of " + list +
                                   ", not " + v.dump());
  }

  // A JSON boolean; `fallback` when absent.
  Result<bool> Bool(const char* key, bool fallback) const {
    if (!j_.contains(key)) return fallback;
    if (!j_.at(key).is_boolean()) {
      return Status::InvalidArgument(where_ + ": " + Quote(key) + " must be true or false, not " +
                                     j_.at(key).dump());
    }
    return j_.at(key).get<bool>();
  }

  Result<double> Number(const char* key, double lo, double hi_exclusive) const {
    if (!j_.contains(key) || !j_.at(key).is_number()) {
      return Status::InvalidArgument(where_ + ": needs a number " + Quote(key));
    }
    const double x = j_.at(key).get<double>();
    if (!(x >= lo && x < hi_exclusive)) {
      return Status::InvalidArgument(where_ + ": " + Quote(key) + " " + j_.at(key).dump() +
                                     " is out of range [" + Json(lo).dump() + ", " +
                                     Json(hi_exclusive).dump() + ")");
    }
    return x;
  }

 private:
  const Json& j_;
  std::string where_;
};

// The layer's "type" and "name" into *layer.
Status ParseLayerKindAndName(const Json& j, const std::string& where, LayerSpec* layer) {
  if (!j.contains("type") || !j.at("type").is_string()) {
    return Status::InvalidArgument(where + ": needs \"type\"");
  }
  const std::string type = j.at("type").get<std::string>();
  bool found = false;
  for (const KindName& k : kKinds) {
    if (type == k.name) {
      layer->kind = k.kind;
      found = true;
    }
  }
  if (!found) {
    std::string list;
    for (const KindName& k : kKinds) list += std::string(list.empty() ? "" : ", ") + k.name;
    return Status::InvalidArgument(where + ": unknown layer type " + Quote(type) + " (known: " +
                                   list + ")");
  }
  if (j.contains("name")) {
    if (!j.at("name").is_string() || j.at("name").get<std::string>().empty()) {
      return Status::InvalidArgument(where + ": \"name\" must be a non-empty string");
    }
    layer->name = j.at("name").get<std::string>();
    if (layer->name.find('/') != std::string::npos) {
      return Status::InvalidArgument(where + ": a layer name may not contain '/'");
    }
  }
  return Status::Ok();
}

// The fields of an embedding layer, read by `r`, into *layer.
Status ParseEmbeddingFields(const LayerReader& r, LayerSpec* layer) {
  PARASYNC_RETURN_IF_ERROR(r.CheckKeys({"vocab", "dim", "combiner", "sparse", "fields"}));
  PARASYNC_ASSIGN_OR_RETURN(layer->sparse, r.Bool("sparse", false));
  if (layer->sparse) {
    // A sparse table's ids are row keys on the servers, never floats; 0: any uint64 id.
    PARASYNC_ASSIGN_OR_RETURN(layer->vocab, r.Int("vocab", 0, kMaxSparseVocab, 0));
  } else {
    // Ids travel as float32 features, exact up to 2^24.
    PARASYNC_ASSIGN_OR_RETURN(layer->vocab, r.Int("vocab", 1, kMaxFloatIndex, std::nullopt));
  }
  PARASYNC_ASSIGN_OR_RETURN(layer->units, r.Int("dim", 1, 65536, std::nullopt));
  PARASYNC_ASSIGN_OR_RETURN(
      layer->combiner, r.Choice<Combiner>("combiner",
                                          {{"sum", Combiner::kSum}, {"mean", Combiner::kMean}},
                                          Combiner::kSum));
  PARASYNC_ASSIGN_OR_RETURN(layer->fields, r.Int("fields", 0, kMaxDim, 1));
  return Status::Ok();
}

// The fields of a layer of kind layer->kind, read by `r`, into *layer.
Status ParseLayerFields(const LayerReader& r, LayerSpec* layer) {
  auto activation = [&](bool required) -> Status {
    PARASYNC_ASSIGN_OR_RETURN(
        layer->activation,
        r.Choice<Activation>("activation",
                             {{"relu", Activation::kRelu},
                              {"tanh", Activation::kTanh},
                              {"sigmoid", Activation::kSigmoid},
                              {"linear", Activation::kNone}},
                             required ? std::nullopt : std::optional(Activation::kNone)));
    return Status::Ok();
  };
  auto padding = [&]() -> Status {
    PARASYNC_ASSIGN_OR_RETURN(
        layer->padding,
        r.Choice<Padding>("padding", {{"valid", Padding::kValid}, {"same", Padding::kSame}},
                          Padding::kValid));
    return Status::Ok();
  };
  switch (layer->kind) {
    case LayerKind::kDense: {
      PARASYNC_RETURN_IF_ERROR(r.CheckKeys({"units", "activation"}));
      PARASYNC_ASSIGN_OR_RETURN(layer->units, r.Int("units", 1, kMaxDim, std::nullopt));
      PARASYNC_RETURN_IF_ERROR(activation(false));
      break;
    }
    case LayerKind::kConv2d: {
      PARASYNC_RETURN_IF_ERROR(r.CheckKeys({"filters", "kernel", "stride", "padding", "activation"}));
      PARASYNC_ASSIGN_OR_RETURN(layer->units, r.Int("filters", 1, 65536, std::nullopt));
      PARASYNC_ASSIGN_OR_RETURN(int64_t k, r.Int("kernel", 1, kMaxKernel, std::nullopt));
      PARASYNC_ASSIGN_OR_RETURN(int64_t s, r.Int("stride", 1, kMaxKernel, 1));
      layer->kernel = static_cast<int>(k);
      layer->stride = static_cast<int>(s);
      PARASYNC_RETURN_IF_ERROR(padding());
      PARASYNC_RETURN_IF_ERROR(activation(false));
      break;
    }
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d: {
      PARASYNC_RETURN_IF_ERROR(r.CheckKeys({"pool", "stride", "padding"}));
      PARASYNC_ASSIGN_OR_RETURN(int64_t k, r.Int("pool", 1, kMaxKernel, 2));
      PARASYNC_ASSIGN_OR_RETURN(int64_t s, r.Int("stride", 1, kMaxKernel, k));
      layer->kernel = static_cast<int>(k);
      layer->stride = static_cast<int>(s);
      PARASYNC_RETURN_IF_ERROR(padding());
      break;
    }
    case LayerKind::kFlatten:
      PARASYNC_RETURN_IF_ERROR(r.CheckKeys({}));
      break;
    case LayerKind::kActivation:
      PARASYNC_RETURN_IF_ERROR(r.CheckKeys({"activation"}));
      PARASYNC_RETURN_IF_ERROR(activation(true));
      break;
    case LayerKind::kDropout: {
      PARASYNC_RETURN_IF_ERROR(r.CheckKeys({"rate"}));
      PARASYNC_ASSIGN_OR_RETURN(double rate, r.Number("rate", 0.0, 1.0));
      layer->rate = static_cast<float>(rate);
      break;
    }
    case LayerKind::kEmbedding:
      PARASYNC_RETURN_IF_ERROR(ParseEmbeddingFields(r, layer));
      break;
  }
  return Status::Ok();
}

Result<LayerSpec> ParseLayer(const Json& j, const std::string& where) {
  if (!j.is_object()) return Status::InvalidArgument(where + ": a layer is a JSON object");
  LayerSpec layer;
  PARASYNC_RETURN_IF_ERROR(ParseLayerKindAndName(j, where, &layer));
  PARASYNC_RETURN_IF_ERROR(ParseLayerFields(LayerReader(j, where), &layer));
  return layer;
}

// Names every unnamed layer "<type><k>", k counting the layers of that type, and checks
// names are unique.
Status NameLayers(std::vector<LayerSpec>* layers, const std::string& source) {
  std::map<LayerKind, int> count;
  std::set<std::string> seen;
  for (LayerSpec& l : *layers) {
    const int k = count[l.kind]++;
    if (l.name.empty()) l.name = std::string(LayerKindName(l.kind)) + std::to_string(k);
    if (!seen.insert(l.name).second) {
      return Status::InvalidArgument(source + ": two layers are named " + Quote(l.name));
    }
  }
  return Status::Ok();
}

LayerSpec Dense(int64_t units, Activation a) {
  LayerSpec l;
  l.kind = LayerKind::kDense;
  l.units = units;
  l.activation = a;
  return l;
}
LayerSpec Conv(int64_t filters, int kernel, Padding p, Activation a) {
  LayerSpec l;
  l.kind = LayerKind::kConv2d;
  l.units = filters;
  l.kernel = kernel;
  l.padding = p;
  l.activation = a;
  return l;
}
LayerSpec Pool(LayerKind kind, int size) {
  LayerSpec l;
  l.kind = kind;
  l.kernel = size;
  l.stride = size;
  return l;
}
LayerSpec Flatten() {
  LayerSpec l;
  l.kind = LayerKind::kFlatten;
  return l;
}
// A sparse embedding of unbounded vocabulary, one field per id column, summed.
LayerSpec SparseEmbedding(int64_t dim) {
  LayerSpec l;
  l.kind = LayerKind::kEmbedding;
  l.units = dim;
  l.sparse = true;
  l.fields = 0;
  return l;
}

Result<ModelSpec> Builtin(const std::string& name) {
  ModelSpec m;
  m.name = name;
  if (name == "mlp") {
    m.layers = {Flatten(), Dense(256, Activation::kRelu), Dense(128, Activation::kRelu),
                Dense(10, Activation::kNone)};
  } else if (name == "cnn") {
    // The Keras MNIST CNN: Conv2D(32, 3, relu) -> Flatten -> Dense(128, relu) -> Dense(10).
    m.layers = {Conv(32, 3, Padding::kValid, Activation::kRelu), Flatten(),
                Dense(128, Activation::kRelu), Dense(10, Activation::kNone)};
  } else if (name == "lenet5") {
    // LeCun et al. 1998 on 28x28 inputs: the first convolution pads to keep 28x28.
    m.layers = {Conv(6, 5, Padding::kSame, Activation::kTanh),
                Pool(LayerKind::kAvgPool2d, 2),
                Conv(16, 5, Padding::kValid, Activation::kTanh),
                Pool(LayerKind::kAvgPool2d, 2),
                Flatten(),
                Dense(120, Activation::kTanh),
                Dense(84, Activation::kTanh),
                Dense(10, Activation::kNone)};
  } else if (name == "ctr") {
    // Click-through rate: each id column's row, concatenated with the dense features, into
    // a small MLP with one logit.
    m.layers = {SparseEmbedding(16), Dense(64, Activation::kRelu), Dense(32, Activation::kRelu),
                Dense(1, Activation::kNone)};
    m.loss = LossKind::kSigmoidCrossEntropy;
  } else {
    return Status::NotFound("no built-in model " + Quote(name));
  }
  PARASYNC_RETURN_IF_ERROR(NameLayers(&m.layers, name));
  return m;
}

// "784-256-128-10" -> widths; nullopt when the text is not of that form at all.
std::optional<Result<std::vector<int64_t>>> ParseWidths(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789-") != std::string::npos ||
      text.find('-') == std::string::npos) {
    return std::nullopt;
  }
  std::vector<int64_t> widths;
  std::string_view rest(text);
  while (true) {
    const size_t dash = rest.find('-');
    const std::string_view field = rest.substr(0, dash);
    int64_t w = 0;
    const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), w);
    if (field.empty() || ec != std::errc() || end != field.data() + field.size() || w < 1 ||
        w > kMaxDim) {
      return Result<std::vector<int64_t>>(Status::InvalidArgument(
          "MLP widths " + Quote(text) + ": " + Quote(std::string(field)) +
          " is not a width in [1, " + std::to_string(kMaxDim) + "] (expected e.g. 784-256-128-10)"));
    }
    widths.push_back(w);
    if (dash == std::string_view::npos) break;
    rest.remove_prefix(dash + 1);
  }
  return Result<std::vector<int64_t>>(std::move(widths));
}

void AddVariable(std::vector<VariableSpec>* vars, const std::string& name,
                 std::vector<int64_t> shape, InitKind kind, float value) {
  VariableSpec v;
  v.name = name;
  v.shape = std::move(shape);
  v.init.kind = kind;
  v.init.value = value;
  vars->push_back(std::move(v));
}

}  // namespace

std::string_view LayerKindName(LayerKind kind) {
  for (const KindName& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "?";
}

std::string_view ActivationName(Activation a) {
  switch (a) {
    case Activation::kNone: return "linear";
    case Activation::kRelu: return "relu";
    case Activation::kTanh: return "tanh";
    case Activation::kSigmoid: return "sigmoid";
  }
  return "?";
}

std::string_view LossKindName(LossKind loss) {
  return loss == LossKind::kSigmoidCrossEntropy ? "sigmoid_cross_entropy"
                                                 : "softmax_cross_entropy";
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<std::string> BuiltinModelNames() { return {"mlp", "cnn", "lenet5", "ctr"}; }

Result<ModelSpec> ParseModelSpecJson(const std::string& json_text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::parse_error& e) {
    return Status::InvalidArgument(source + ": not JSON: " + e.what());
  }
  if (!j.is_object()) return Status::InvalidArgument(source + ": a model is a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (key != "name" && key != "input" && key != "layers" && key != "loss") {
      return Status::InvalidArgument(source + ": unknown key " + Quote(key) +
                                     " (a model has name, input, layers and loss)");
    }
  }
  ModelSpec m;
  if (j.contains("name")) {
    if (!j.at("name").is_string()) return Status::InvalidArgument(source + ": \"name\" must be a string");
    m.name = j.at("name").get<std::string>();
  }
  if (j.contains("input")) {
    const Json& in = j.at("input");
    bool ok = in.is_array() && (in.size() == 1 || in.size() == 3);
    if (ok) {
      for (const Json& d : in) {
        ok = ok && d.is_number_integer() && d.get<int64_t>() >= 1 && d.get<int64_t>() <= kMaxDim;
        if (ok) m.input.push_back(d.get<int64_t>());
      }
    }
    if (!ok) {
      return Status::InvalidArgument(source + ": \"input\" must be [D] or [C, H, W] of positive "
                                     "integers, not " + in.dump());
    }
  }
  if (!j.contains("layers") || !j.at("layers").is_array() || j.at("layers").empty()) {
    return Status::InvalidArgument(source + ": needs a non-empty \"layers\" list");
  }
  int index = 0;
  for (const Json& l : j.at("layers")) {
    PARASYNC_ASSIGN_OR_RETURN(
        LayerSpec layer, ParseLayer(l, source + ": layer " + std::to_string(index)));
    m.layers.push_back(std::move(layer));
    ++index;
  }
  const std::string loss = j.value("loss", std::string("softmax_cross_entropy"));
  if (j.contains("loss") && !j.at("loss").is_string()) {
    return Status::InvalidArgument(source + ": \"loss\" must be a string");
  }
  if (loss == "softmax_cross_entropy") {
    m.loss = LossKind::kSoftmaxCrossEntropy;
  } else if (loss == "sigmoid_cross_entropy") {
    m.loss = LossKind::kSigmoidCrossEntropy;
  } else {
    return Status::InvalidArgument(source + ": unknown loss " + Quote(loss) +
                                   " (softmax_cross_entropy or sigmoid_cross_entropy)");
  }
  PARASYNC_RETURN_IF_ERROR(NameLayers(&m.layers, source));
  return m;
}

std::string ModelSpecToJson(const ModelSpec& spec) {
  Json layers = Json::array();
  for (const LayerSpec& l : spec.layers) {
    Json j = {{"type", std::string(LayerKindName(l.kind))}, {"name", l.name}};
    const std::string padding = l.padding == Padding::kSame ? "same" : "valid";
    switch (l.kind) {
      case LayerKind::kDense:
        j["units"] = l.units;
        j["activation"] = std::string(ActivationName(l.activation));
        break;
      case LayerKind::kConv2d:
        j["filters"] = l.units;
        j["kernel"] = l.kernel;
        j["stride"] = l.stride;
        j["padding"] = padding;
        j["activation"] = std::string(ActivationName(l.activation));
        break;
      case LayerKind::kMaxPool2d:
      case LayerKind::kAvgPool2d:
        j["pool"] = l.kernel;
        j["stride"] = l.stride;
        j["padding"] = padding;
        break;
      case LayerKind::kFlatten:
        break;
      case LayerKind::kActivation:
        j["activation"] = std::string(ActivationName(l.activation));
        break;
      case LayerKind::kDropout:
        j["rate"] = l.rate;
        break;
      case LayerKind::kEmbedding:
        j["vocab"] = l.vocab;
        j["dim"] = l.units;
        j["combiner"] = l.combiner == Combiner::kMean ? "mean" : "sum";
        // Only when not the default, so the JSON of existing models stays as it was.
        if (l.sparse) j["sparse"] = true;
        if (l.fields != 1) j["fields"] = l.fields;
        break;
    }
    layers.push_back(std::move(j));
  }
  Json m = {{"name", spec.name}, {"layers", std::move(layers)},
            {"loss", std::string(LossKindName(spec.loss))}};
  if (!spec.input.empty()) m["input"] = spec.input;
  return m.dump();
}

Result<ModelSpec> ResolveModelSpec(const std::string& text) {
  for (const std::string& name : BuiltinModelNames()) {
    if (text == name) return Builtin(name);
  }
  if (auto widths = ParseWidths(text)) {
    if (!widths->ok()) return widths->status();
    const std::vector<int64_t>& w = **widths;
    ModelSpec m;
    m.name = text;
    m.input = {w.front()};
    for (size_t i = 1; i < w.size(); ++i) {
      m.layers.push_back(Dense(w[i], i + 1 < w.size() ? Activation::kRelu : Activation::kNone));
    }
    PARASYNC_RETURN_IF_ERROR(NameLayers(&m.layers, text));
    return m;
  }
  std::ifstream in(text, std::ios::binary);
  if (!in) {
    std::string names;
    for (const std::string& n : BuiltinModelNames()) names += (names.empty() ? "" : ", ") + n;
    return Status::NotFound("--model " + Quote(text) + " is not a built-in model (" + names +
                            "), not MLP widths (e.g. 784-256-128-10), and no readable file");
  }
  std::stringstream text_in;
  text_in << in.rdbuf();
  return ParseModelSpecJson(text_in.str(), text);
}

int64_t LayerOp::in_size() const { return Product(in); }
int64_t LayerOp::out_size() const { return Product(out); }

namespace {

// Whether `input` is a shape the model `spec` (called `model` in errors) can take.
Status CheckInputShape(const ModelSpec& spec, const std::vector<int64_t>& input,
                       const std::string& model) {
  if (input.empty() || input.size() == 2 || input.size() > 3 ||
      std::any_of(input.begin(), input.end(), [](int64_t d) { return d < 1 || d > kMaxDim; })) {
    return Status::InvalidArgument(model + ": the input shape " + ShapeString(input) +
                                   " is not [D] or [C, H, W]");
  }
  if (!spec.input.empty()) {
    const bool flat_match = spec.input.size() == 1 && spec.input[0] == Product(input);
    if (spec.input != input && !flat_match) {
      return Status::InvalidArgument(model + " expects inputs of shape " +
                                     ShapeString(spec.input) + " but the data's examples are " +
                                     ShapeString(input));
    }
  }
  if (spec.layers.empty()) return Status::InvalidArgument(model + " has no layers");
  return Status::Ok();
}

// A conv2d or pooling layer `l` (called `who`) on inputs of `shape`: its output shape and
// padding in *op, its variables appended to *vars.
Status PlanWindowLayer(const LayerSpec& l, const std::string& who,
                       const std::vector<int64_t>& shape, LayerOp* op,
                       std::vector<VariableSpec>* vars) {
  if (shape.size() != 3) {
    return Status::InvalidArgument(who + " needs an image input [C, H, W], but its input is " +
                                   ShapeString(shape));
  }
  const Window h = Slide(shape[1], l.kernel, l.stride, l.padding);
  const Window w = Slide(shape[2], l.kernel, l.stride, l.padding);
  if (h.out < 1 || w.out < 1) {
    return Status::InvalidArgument(who + ": its " + std::to_string(l.kernel) + "x" +
                                   std::to_string(l.kernel) + " window is larger than its input " +
                                   ShapeString(shape) + " (use padding same or a smaller window)");
  }
  op->pad_begin = h.pad_begin;
  op->pad_end = h.pad_end;
  // Square windows on a square image pad alike on both axes; on others they may not.
  if (w.pad_begin != h.pad_begin || w.pad_end != h.pad_end) {
    return Status::NotSupported(who + ": `same` padding of a " + ShapeString(shape) +
                                " input would differ between height and width");
  }
  const int64_t channels = l.kind == LayerKind::kConv2d ? l.units : shape[0];
  op->out = {channels, h.out, w.out};
  if (l.kind == LayerKind::kConv2d) {
    const int64_t k2 = int64_t{l.kernel} * l.kernel;
    AddVariable(vars, l.name + "/kernel", {l.units, shape[0], l.kernel, l.kernel},
                InitKind::kUniform,
                static_cast<float>(std::sqrt(6.0 / static_cast<double>((shape[0] + l.units) * k2))));
    AddVariable(vars, l.name + "/bias", {l.units}, InitKind::kZeros, 0);
  }
  return Status::Ok();
}

// An embedding `l` (called `who`), the first layer, on inputs of `shape`: its id columns,
// fields, table rows and output shape in *op, its table appended to *vars.
Status PlanEmbedding(const LayerSpec& l, const std::string& who, const std::vector<int64_t>& shape,
                     const ModelInputs& inputs, LayerOp* op, std::vector<VariableSpec>* vars) {
  if (l.sparse && inputs.id_columns < 1) {
    return Status::InvalidArgument(who + " is sparse and needs id columns in the data "
                                   "(<split>_ids.npy), but the data has none");
  }
  const int64_t ids = inputs.id_columns > 0 ? inputs.id_columns : shape[0];
  if (ids > shape[0]) {
    return Status::InvalidArgument(who + ": " + std::to_string(ids) +
                                   " id columns do not fit its input " + ShapeString(shape));
  }
  const int64_t fields = l.fields == 0 ? ids : l.fields;
  if (ids % fields != 0) {
    return Status::InvalidArgument(who + ": its " + std::to_string(fields) +
                                   " fields do not divide the " + std::to_string(ids) +
                                   " id columns");
  }
  if (l.sparse && (inputs.sparse_rows < 1 || inputs.sparse_rows > kMaxFloatIndex)) {
    return Status::InvalidArgument(who + ": a sparse table needs between 1 and 2^24 compact "
                                   "rows, got " + std::to_string(inputs.sparse_rows));
  }
  op->spec.fields = fields;
  op->id_columns = ids;
  op->table_rows = l.sparse ? inputs.sparse_rows : l.vocab;
  op->out = {fields * l.units + (shape[0] - ids)};
  // Keras's default: uniform in [-0.05, 0.05].
  AddVariable(vars, l.name + "/table", {op->table_rows, l.units}, InitKind::kUniform, 0.05f);
  return Status::Ok();
}

// Layer `index` of a model, `l`, on inputs of `shape`: its output shape (and padding) in
// *op, its variables appended to *vars.
Status PlanLayer(size_t index, const LayerSpec& l, const std::vector<int64_t>& shape,
                 const ModelInputs& inputs, LayerOp* op, std::vector<VariableSpec>* vars) {
  const std::string who = "layer " + Quote(l.name) + " (" + std::string(LayerKindName(l.kind)) + ")";
  switch (l.kind) {
    case LayerKind::kDense: {
      const int64_t in = Product(shape);
      op->out = {l.units};
      AddVariable(vars, l.name + "/kernel", {in, l.units}, InitKind::kUniform,
                  static_cast<float>(std::sqrt(6.0 / static_cast<double>(in + l.units))));
      AddVariable(vars, l.name + "/bias", {l.units}, InitKind::kZeros, 0);
      break;
    }
    case LayerKind::kConv2d:
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d:
      PARASYNC_RETURN_IF_ERROR(PlanWindowLayer(l, who, shape, op, vars));
      break;
    case LayerKind::kFlatten:
      op->out = {Product(shape)};
      break;
    case LayerKind::kActivation:
    case LayerKind::kDropout:
      op->out = shape;
      break;
    case LayerKind::kEmbedding:
      if (index != 0 || shape.size() != 1) {
        return Status::InvalidArgument(who + " must be the first layer, on flat inputs of ids "
                                       "(its input is " + ShapeString(shape) + ")");
      }
      PARASYNC_RETURN_IF_ERROR(PlanEmbedding(l, who, shape, inputs, op, vars));
      break;
  }
  if (Product(op->out) > kMaxExampleSize) {
    return Status::InvalidArgument(who + ": its output " + ShapeString(op->out) +
                                   " is larger than " + std::to_string(kMaxExampleSize) +
                                   " elements per example");
  }
  return Status::Ok();
}

}  // namespace

Result<Model> Model::Build(const ModelSpec& spec, const std::vector<int64_t>& input,
                           const ModelInputs& inputs) {
  Model m;
  m.spec_ = spec;
  m.input_ = input;
  m.inputs_ = inputs;
  const std::string model = spec.name.empty() ? "the model" : "model " + Quote(spec.name);
  PARASYNC_RETURN_IF_ERROR(CheckInputShape(spec, input, model));
  // Ids as features of another layer would be meaningless numbers (and inexact as floats).
  if (inputs.id_columns > 0 && spec.layers.front().kind != LayerKind::kEmbedding) {
    return Status::InvalidArgument(model + ": the data has " + std::to_string(inputs.id_columns) +
                                   " id columns but the first layer is not an embedding");
  }
  std::vector<int64_t> shape = input;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& l = spec.layers[i];
    LayerOp op;
    op.spec = l;
    op.spec.activation = l.kind == LayerKind::kActivation ? l.activation : Activation::kNone;
    op.in = shape;
    op.first_variable = static_cast<int>(m.variables_.size());
    PARASYNC_RETURN_IF_ERROR(PlanLayer(i, l, shape, inputs, &op, &m.variables_));
    op.num_variables = static_cast<int>(m.variables_.size()) - op.first_variable;
    if (l.kind == LayerKind::kEmbedding && l.sparse) {
      const VariableSpec& table = m.variables_[static_cast<size_t>(op.first_variable)];
      m.sparse_tables_.push_back({op.first_variable, {table.name, l.vocab, l.units, table.init}});
    }
    shape = op.out;
    const Activation fused = l.kind == LayerKind::kDense || l.kind == LayerKind::kConv2d
                                 ? l.activation
                                 : Activation::kNone;
    m.ops_.push_back(std::move(op));
    if (fused != Activation::kNone) {
      LayerOp act;
      act.spec.kind = LayerKind::kActivation;
      act.spec.name = l.name + "/" + std::string(ActivationName(fused));
      act.spec.activation = fused;
      act.in = shape;
      act.out = shape;
      act.first_variable = static_cast<int>(m.variables_.size());
      m.ops_.push_back(std::move(act));
    }
  }
  if (shape.size() != 1) {
    return Status::InvalidArgument(model + ": the last layer's output " + ShapeString(shape) +
                                   " is not flat; end with a dense layer");
  }
  if (spec.loss == LossKind::kSigmoidCrossEntropy && shape[0] != 1) {
    return Status::InvalidArgument(model + ": sigmoid_cross_entropy needs one output, the last "
                                   "layer has " + std::to_string(shape[0]));
  }
  PARASYNC_RETURN_IF_ERROR(ValidateVariables(m.variables_));
  return m;
}

int64_t Model::input_size() const { return Product(input_); }

std::vector<VariableSpec> Model::dense_variables() const {
  std::vector<VariableSpec> dense;
  for (size_t v = 0; v < variables_.size(); ++v) {
    const bool sparse = std::any_of(sparse_tables_.begin(), sparse_tables_.end(),
                                    [&](const SparseTable& t) { return t.variable == static_cast<int>(v); });
    if (!sparse) dense.push_back(variables_[v]);
  }
  return dense;
}
int64_t Model::outputs() const { return ops_.back().out_size(); }

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (const VariableSpec& v : variables_) n += v.num_elements();
  return n;
}

Status Model::CheckLabelsFit(int max_label) const {
  if (loss() == LossKind::kSigmoidCrossEntropy) {
    if (max_label > 1) {
      return Status::InvalidArgument("the labels go up to " + std::to_string(max_label) +
                                     " but sigmoid_cross_entropy takes 0/1 labels");
    }
    return Status::Ok();
  }
  if (max_label >= outputs()) {
    return Status::InvalidArgument(
        "the labels have " + std::to_string(max_label + 1) + " classes but the last layer " +
        Quote(ops_.back().spec.name) + " has " + std::to_string(outputs()) + " outputs " +
        ShapeString(ops_.back().out));
  }
  return Status::Ok();
}

std::string Model::Summary() const {
  std::string s = "model " + (spec_.name.empty() ? std::string("(unnamed)") : spec_.name) +
                  ": input " + ShapeString(input_) + ", " + std::to_string(num_parameters()) +
                  " parameters in " + std::to_string(variables_.size()) + " variables, loss " +
                  std::string(LossKindName(loss()));
  for (const LayerOp& op : ops_) {
    int64_t params = 0;
    for (int v = 0; v < op.num_variables; ++v) params += variables_[op.first_variable + v].num_elements();
    s += "\n  " + op.spec.name + " (" + std::string(LayerKindName(op.spec.kind)) + ") -> " +
         ShapeString(op.out) + (params > 0 ? ", " + std::to_string(params) + " parameters" : "");
  }
  return s;
}

}  // namespace parasync
