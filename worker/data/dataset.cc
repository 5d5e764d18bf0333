#include "worker/data/dataset.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <type_traits>
#include <utility>

#include "common/variable.h"
#include "worker/data/idx_reader.h"
#include "worker/data/npy_reader.h"

namespace parasync {

namespace {

constexpr float kPixelScale = 1.0f / 255.0f;
// Every integer of at most this magnitude is exactly a float32.
constexpr int64_t kMaxExactFloatInt = int64_t{1} << 24;

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The first of `bases`, each tried gzip-compressed first and then plain, that exists; empty
// if none does.
std::string FindIdx(const std::vector<std::string>& bases) {
  for (const std::string& base : bases) {
    if (FileExists(base + ".gz")) return base + ".gz";
    if (FileExists(base)) return base;
  }
  return "";
}

// Reorders each of the n examples in x from [H, W, C] to [C, H, W]. A loop because it runs
// once per load, on data whose layout only we know.
void HwcToChw(int64_t n, int64_t h, int64_t w, int64_t c, std::vector<float>* x) {
  if (c == 1) return;  // same layout
  const size_t hw = static_cast<size_t>(h * w);
  const size_t channels = static_cast<size_t>(c);
  const size_t dim = hw * channels;
  std::vector<float> example(dim);
  for (size_t e = 0; e < static_cast<size_t>(n); ++e) {
    float* ex = x->data() + e * dim;
    for (size_t p = 0; p < hw; ++p) {
      for (size_t ch = 0; ch < channels; ++ch) example[ch * hw + p] = ex[p * channels + ch];
    }
    std::copy(example.begin(), example.end(), ex);
  }
}

// Calls f(T{}) with T the C++ type of `dtype`'s elements and returns what it returns.
template <typename F>
auto VisitDtype(NpyDtype dtype, F&& f) {
  switch (dtype) {
    case NpyDtype::kInt8: return f(int8_t{});
    case NpyDtype::kUint8: return f(uint8_t{});
    case NpyDtype::kInt16: return f(int16_t{});
    case NpyDtype::kUint16: return f(uint16_t{});
    case NpyDtype::kInt32: return f(int32_t{});
    case NpyDtype::kUint32: return f(uint32_t{});
    case NpyDtype::kInt64: return f(int64_t{});
    case NpyDtype::kUint64: return f(uint64_t{});
    case NpyDtype::kFloat32: return f(float{});
    case NpyDtype::kFloat64: return f(double{});
  }
  std::abort();  // every enumerator has a case
}

// Element i of `a`, whose elements are T. NpyArray holds little-endian bytes, and
// npy_reader.cc refuses to build on a big-endian host.
template <typename T>
T ElementAt(const NpyArray& a, size_t i) {
  T v;
  std::memcpy(&v, a.data.data() + i * sizeof(T), sizeof(T));
  return v;
}

// Converts the elements of `features` (of type T) to float into *x: uint8 scaled to [0, 1],
// others as they are; refuses integers float32 cannot hold exactly.
template <typename T>
Status ConvertFeatures(const std::string& path, const NpyArray& features, int64_t dim,
                       std::vector<float>* x) {
  const size_t count = features.data.size() / sizeof(T);
  x->resize(count);
  for (size_t i = 0; i < count; ++i) {
    const T v = ElementAt<T>(features, i);
    if constexpr (std::is_same_v<T, uint8_t>) {
      (*x)[i] = static_cast<float>(v) * kPixelScale;
    } else {
      if constexpr (std::is_integral_v<T> && sizeof(T) > 2) {
        bool exact = v <= static_cast<T>(kMaxExactFloatInt);
        if constexpr (std::is_signed_v<T>) exact = exact && v >= -static_cast<T>(kMaxExactFloatInt);
        if (!exact) {
          return Status::InvalidArgument(
              "features " + path + ": element " + std::to_string(i) + " (example " +
              std::to_string(i / static_cast<size_t>(dim)) + ") is " + std::to_string(v) +
              "; integer features must be within +-2^24 to be exact in float32");
        }
      }
      (*x)[i] = static_cast<float>(v);
    }
  }
  return Status::Ok();
}

// Copies the integer labels of `labels` (of type T) into *y; refuses values outside uint8.
template <typename T>
Status ConvertLabels(const std::string& path, const NpyArray& labels, std::vector<uint8_t>* y) {
  const size_t count = labels.data.size() / sizeof(T);
  y->resize(count);
  for (size_t i = 0; i < count; ++i) {
    const T v = ElementAt<T>(labels, i);
    bool in_range = true;
    if constexpr (std::is_floating_point_v<T>) {
      in_range = false;  // LoadNpyDataset refuses float labels before; kept total for safety
    } else {
      if constexpr (std::is_signed_v<T>) in_range = v >= 0;
      in_range = in_range && v <= 255;
    }
    if (!in_range) {
      return Status::InvalidArgument("labels " + path + ": example " + std::to_string(i) +
                                     " has label " + std::to_string(v) +
                                     "; labels must be in [0, 255]");
    }
    (*y)[i] = static_cast<uint8_t>(v);
  }
  return Status::Ok();
}

// The labels of `labels` (any integer dtype) into *y; refuses values outside uint8.
Status ConvertLabelsArray(const std::string& path, const NpyArray& labels,
                          std::vector<uint8_t>* y) {
  return VisitDtype(labels.dtype, [&](auto t) { return ConvertLabels<decltype(t)>(path, labels, y); });
}

// Reads a labels file and checks its dtype (integer) and shape ((n,) or (n, 1)).
Result<NpyArray> ReadLabelsArray(const std::string& labels_path) {
  PARASYNC_ASSIGN_OR_RETURN(NpyArray labels, ReadNpyFile(labels_path));
  if (!NpyIsInteger(labels.dtype)) {
    return Status::InvalidArgument("labels " + labels_path + " have dtype " +
                                   std::string(NpyDescr(labels.dtype)) +
                                   "; labels must be integers (e.g. uint8 or int64)");
  }
  if (labels.shape.empty() || labels.shape.size() > 2 ||
      (labels.shape.size() == 2 && labels.shape[1] != 1)) {
    return Status::InvalidArgument("labels " + labels_path + " have shape " +
                                   NpyShapeString(labels.shape) + "; expected (n,) or (n, 1)");
  }
  return labels;
}

// The labels of a labels file, checked as LoadNpyDataset documents.
Result<std::vector<uint8_t>> ReadNpyLabels(const std::string& labels_path) {
  PARASYNC_ASSIGN_OR_RETURN(NpyArray labels, ReadLabelsArray(labels_path));
  std::vector<uint8_t> y;
  PARASYNC_RETURN_IF_ERROR(ConvertLabelsArray(labels_path, labels, &y));
  return y;
}

// Reads the ids file `ids_path` into data->ids and data->id_columns, as LoadDataset
// documents; `labels_path` names the labels in a count mismatch.
Status ReadNpyIds(const std::string& ids_path, const std::string& labels_path, Dataset* data) {
  PARASYNC_ASSIGN_OR_RETURN(NpyArray ids, ReadNpyFile(ids_path));
  if (ids.dtype != NpyDtype::kInt64 && ids.dtype != NpyDtype::kUint64) {
    return Status::InvalidArgument("ids " + ids_path + " have dtype " +
                                   std::string(NpyDescr(ids.dtype)) + "; ids must be int64 or uint64");
  }
  if (ids.shape.empty() || ids.shape.size() > 2 || (ids.shape.size() == 2 && ids.shape[1] < 1)) {
    return Status::InvalidArgument("ids " + ids_path + " have shape " + NpyShapeString(ids.shape) +
                                   "; expected (n,) or (n, K) with K >= 1");
  }
  if (ids.shape[0] != data->n) {
    return Status::Corruption("ids " + ids_path + " have " + std::to_string(ids.shape[0]) +
                              " examples but labels " + labels_path + " have " +
                              std::to_string(data->n));
  }
  data->id_columns = ids.shape.size() == 2 ? ids.shape[1] : 1;
  const size_t count = static_cast<size_t>(ids.NumElements());
  data->ids.resize(count);
  for (size_t i = 0; i < count; ++i) {
    if (ids.dtype == NpyDtype::kUint64) {
      data->ids[i] = ElementAt<uint64_t>(ids, i);
      continue;
    }
    const int64_t v = ElementAt<int64_t>(ids, i);
    if (v < 0) {
      return Status::InvalidArgument(
          "ids " + ids_path + ": example " + std::to_string(i / static_cast<size_t>(data->id_columns)) +
          " has id " + std::to_string(v) + "; int64 ids must be >= 0");
    }
    data->ids[i] = static_cast<uint64_t>(v);
  }
  return Status::Ok();
}

// Where split `split` ("train" or "test") of `data` lives: IDX files or a NumPy pair.
struct DataFiles {
  bool idx = false;
  std::string dir;
  std::string idx_split;  // the IDX file prefix: "train" or "t10k"
  std::string features;   // the .npy paths, when !idx; features empty when ids exist alone
  std::string labels;
  std::string ids;        // empty when there is no ids file
  std::vector<std::string> paths;  // every file the split is read from
};

// Finds the files LoadDataset reads, without reading them. Fails as LoadDataset documents.
Result<DataFiles> FindDataFiles(const std::string& data, const std::string& split) {
  if (split != "train" && split != "test") {
    return Status::InvalidArgument("data set split must be 'train' or 'test', not '" + split +
                                   "'");
  }
  DataFiles files;
  files.dir = data.empty() ? std::string(".") : data;
  files.idx_split = split == "train" ? "train" : "t10k";
  const std::string prefix = files.dir + "/" + files.idx_split;
  const std::string images =
      FindIdx({prefix + "-images-idx3-ubyte", prefix + "-images-idx4-ubyte"});
  const std::string labels = FindIdx({prefix + "-labels-idx1-ubyte"});
  if (!images.empty() && !labels.empty()) {
    files.idx = true;
    files.paths = {images, labels};
    return files;
  }
  files.features = files.dir + "/" + split + "_x.npy";
  files.labels = files.dir + "/" + split + "_y.npy";
  files.ids = files.dir + "/" + split + "_ids.npy";
  if (!FileExists(files.ids)) files.ids.clear();
  // Ids may stand in for the features (a data set of categorical features only).
  if (!FileExists(files.features) && !files.ids.empty()) files.features.clear();
  if ((!files.features.empty() && FileExists(files.features)) || !files.ids.empty()) {
    if (FileExists(files.labels)) {
      for (const std::string* p : {&files.features, &files.labels, &files.ids}) {
        if (!p->empty()) files.paths.push_back(*p);
      }
      return files;
    }
  }
  return Status::NotFound("--dataset " + files.dir + " lacks " + files.idx_split +
                          "-images-idx3-ubyte[.gz] + " + files.idx_split +
                          "-labels-idx1-ubyte[.gz] and " + split + "_x.npy (or " + split +
                          "_ids.npy) + " + split + "_y.npy (either pair will do)");
}

// Uniform in [0, bound), bound > 0, by rejection: the accepted range [threshold, 2^64) has a
// length divisible by bound, so every residue is equally likely.
uint64_t UniformBelow(std::mt19937_64& gen, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  while (true) {
    const uint64_t r = gen();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

Result<Dataset> LoadDataset(const std::string& data, const std::string& split) {
  PARASYNC_ASSIGN_OR_RETURN(DataFiles files, FindDataFiles(data, split));
  if (files.idx) return LoadIdxDataset(files.dir, files.idx_split);
  if (files.ids.empty()) return LoadNpyDataset(files.features, files.labels);
  Dataset d;
  if (files.features.empty()) {
    PARASYNC_ASSIGN_OR_RETURN(d.y, ReadNpyLabels(files.labels));
    d.n = static_cast<int64_t>(d.y.size());
    d.shape = {0};
  } else {
    PARASYNC_ASSIGN_OR_RETURN(d, LoadNpyDataset(files.features, files.labels));
  }
  PARASYNC_RETURN_IF_ERROR(ReadNpyIds(files.ids, files.labels, &d));
  return d;
}

Status CheckDataFilesExist(const std::string& data) {
  std::string missing;
  for (const char* split : {"train", "test"}) {
    Result<DataFiles> files = FindDataFiles(data, split);
    if (!files.ok()) {
      missing += (missing.empty() ? "" : "; ") + files.status().message();
      continue;
    }
    for (const std::string& path : files->paths) {
      if (::access(path.c_str(), R_OK) != 0) {
        return Status::FailedPrecondition("--dataset " + files->dir + ": cannot read " + path +
                                        ": " + std::strerror(errno));
      }
    }
  }
  if (!missing.empty()) return Status::NotFound(missing);
  return Status::Ok();
}

Result<Dataset> LoadIdxDataset(const std::string& dir, const std::string& split) {
  if (split.empty()) return Status::InvalidArgument("empty data set split name");
  const std::string prefix = (dir.empty() ? std::string(".") : dir) + "/" + split;
  const std::string images_path =
      FindIdx({prefix + "-images-idx3-ubyte", prefix + "-images-idx4-ubyte"});
  if (images_path.empty()) {
    return Status::NotFound("neither " + prefix + "-images-idx3-ubyte[.gz] nor " + prefix +
                            "-images-idx4-ubyte[.gz] exists");
  }
  const std::string labels_path = FindIdx({prefix + "-labels-idx1-ubyte"});
  if (labels_path.empty()) {
    return Status::NotFound("neither " + prefix + "-labels-idx1-ubyte.gz nor " + prefix +
                            "-labels-idx1-ubyte exists");
  }
  PARASYNC_ASSIGN_OR_RETURN(IdxTensor images, ReadIdxFile(images_path));
  PARASYNC_ASSIGN_OR_RETURN(IdxTensor labels, ReadIdxFile(labels_path));
  const size_t rank = images.dims.size();
  if (rank != 3 && rank != 4) {
    return Status::Corruption(images_path + ": expected 3 dimensions [n, rows, cols] or 4 " +
                              "[n, H, W, C], found " + std::to_string(rank));
  }
  if (labels.dims.size() != 1) {
    return Status::Corruption(labels_path + ": expected 1 dimension, found " +
                              std::to_string(labels.dims.size()));
  }
  if (images.dims[0] != labels.dims[0]) {
    return Status::Corruption("split " + prefix + " has " + std::to_string(images.dims[0]) +
                              " images but " + std::to_string(labels.dims[0]) + " labels");
  }
  Dataset data;
  data.n = images.dims[0];
  const int64_t h = images.dims[1];
  const int64_t w = images.dims[2];
  const int64_t c = rank == 4 ? images.dims[3] : 1;
  data.dim = c * h * w;
  data.shape = {c, h, w};
  data.x.resize(images.data.size());
  std::transform(images.data.begin(), images.data.end(), data.x.begin(),
                 [](uint8_t p) { return static_cast<float>(p) * kPixelScale; });
  HwcToChw(data.n, h, w, c, &data.x);
  data.y = std::move(labels.data);
  return data;
}

Result<Dataset> LoadNpyDataset(const std::string& features_path, const std::string& labels_path) {
  // Labels first: they are small, and a problem with them is found before the big read.
  PARASYNC_ASSIGN_OR_RETURN(NpyArray labels, ReadLabelsArray(labels_path));
  PARASYNC_ASSIGN_OR_RETURN(NpyArray features, ReadNpyFile(features_path));
  const std::vector<int64_t>& fs = features.shape;
  if (fs.empty() || fs.size() > 4) {
    return Status::InvalidArgument("features " + features_path + " have shape " +
                                   NpyShapeString(fs) +
                                   "; expected (n,), (n, D), (n, H, W) or (n, H, W, C)");
  }
  if (std::find(fs.begin(), fs.end(), 0) != fs.end()) {
    return Status::InvalidArgument("features " + features_path + " have shape " +
                                   NpyShapeString(fs) + "; every dimension must be at least 1");
  }
  if (fs[0] != labels.shape[0]) {
    return Status::Corruption("features " + features_path + " have " + std::to_string(fs[0]) +
                              " examples but labels " + labels_path + " have " +
                              std::to_string(labels.shape[0]));
  }
  Dataset data;
  data.n = fs[0];
  switch (fs.size()) {
    case 1: data.shape = {1}; break;
    case 2: data.shape = {fs[1]}; break;
    case 3: data.shape = {1, fs[1], fs[2]}; break;
    default: data.shape = {fs[3], fs[1], fs[2]}; break;  // channels last in the file
  }
  data.dim = 1;
  for (int64_t d : data.shape) data.dim *= d;
  PARASYNC_RETURN_IF_ERROR(VisitDtype(features.dtype, [&](auto t) {
    return ConvertFeatures<decltype(t)>(features_path, features, data.dim, &data.x);
  }));
  if (fs.size() == 4) HwcToChw(data.n, fs[1], fs[2], fs[3], &data.x);
  PARASYNC_RETURN_IF_ERROR(ConvertLabelsArray(labels_path, labels, &data.y));
  return data;
}

int MaxLabel(const Dataset& data) {
  if (data.y.empty()) return -1;
  return *std::max_element(data.y.begin(), data.y.end());
}

std::vector<int64_t> ShardIndices(int64_t n, int rank, int world) {
  std::vector<int64_t> indices;
  if (n < 0 || world < 1 || rank < 0 || rank >= world) return indices;
  indices.reserve(static_cast<size_t>((n + world - 1) / world));
  for (int64_t i = rank; i < n; i += world) indices.push_back(i);
  return indices;
}

void ShuffleForEpoch(std::vector<int64_t>* indices, uint64_t seed, int rank, int epoch) {
  // SplitMix64 spreads (seed, rank, epoch) over all 64 bits of the engine seed.
  const uint64_t mixed = SplitMix64(SplitMix64(SplitMix64(seed) ^ static_cast<uint32_t>(rank)) ^
                                    static_cast<uint32_t>(epoch));
  std::mt19937_64 gen(mixed);
  std::vector<int64_t>& v = *indices;
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(UniformBelow(gen, i));
    std::swap(v[i - 1], v[j]);
  }
}

std::vector<int64_t> ModelInputShape(const Dataset& data) {
  if (data.id_columns > 0) return {data.id_columns + data.dim};
  return data.shape;
}

void GatherBatch(const Dataset& data, std::span<const int64_t> idx, float* x_out,
                 uint8_t* y_out) {
  const size_t dim = static_cast<size_t>(data.dim);
  for (size_t k = 0; k < idx.size(); ++k) {
    const size_t row = static_cast<size_t>(idx[k]);
    std::copy_n(data.x.data() + row * dim, dim, x_out + k * dim);
    y_out[k] = data.y[row];
  }
}

}  // namespace parasync
