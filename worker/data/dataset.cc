#include "worker/data/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <random>
#include <utility>

#include "worker/data/idx_reader.h"

namespace parasync {

namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Prefers the gzip-compressed file, falls back to the plain one.
Result<IdxTensor> ReadEitherIdx(const std::string& base) {
  const std::string gz = base + ".gz";
  if (FileExists(gz)) return ReadIdxFile(gz);
  if (FileExists(base)) return ReadIdxFile(base);
  return Status::NotFound("neither " + gz + " nor " + base + " exists");
}

// SplitMix64 finaliser: spreads (seed, rank, epoch) over all 64 bits of the engine seed.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
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

Result<Dataset> LoadIdxDataset(const std::string& dir, const std::string& split) {
  if (split.empty()) return Status::InvalidArgument("empty data set split name");
  const std::string prefix = (dir.empty() ? std::string(".") : dir) + "/" + split;
  PARASYNC_ASSIGN_OR_RETURN(IdxTensor images, ReadEitherIdx(prefix + "-images-idx3-ubyte"));
  PARASYNC_ASSIGN_OR_RETURN(IdxTensor labels, ReadEitherIdx(prefix + "-labels-idx1-ubyte"));
  if (images.dims.size() != 3) {
    return Status::Corruption(prefix + "-images-idx3-ubyte: expected 3 dimensions, found " +
                              std::to_string(images.dims.size()));
  }
  if (labels.dims.size() != 1) {
    return Status::Corruption(prefix + "-labels-idx1-ubyte: expected 1 dimension, found " +
                              std::to_string(labels.dims.size()));
  }
  if (images.dims[0] != labels.dims[0]) {
    return Status::Corruption("split " + prefix + " has " + std::to_string(images.dims[0]) +
                              " images but " + std::to_string(labels.dims[0]) + " labels");
  }
  Dataset data;
  data.n = images.dims[0];
  data.dim = images.dims[1] * images.dims[2];
  data.x.resize(images.data.size());
  constexpr float kScale = 1.0f / 255.0f;
  std::transform(images.data.begin(), images.data.end(), data.x.begin(),
                 [](uint8_t p) { return static_cast<float>(p) * kScale; });
  data.y = std::move(labels.data);
  return data;
}

std::vector<int64_t> ShardIndices(int64_t n, int rank, int world) {
  std::vector<int64_t> indices;
  if (n < 0 || world < 1 || rank < 0 || rank >= world) return indices;
  indices.reserve(static_cast<size_t>((n + world - 1) / world));
  for (int64_t i = rank; i < n; i += world) indices.push_back(i);
  return indices;
}

void ShuffleForEpoch(std::vector<int64_t>* indices, uint64_t seed, int rank, int epoch) {
  const uint64_t mixed = Mix(Mix(Mix(seed) ^ static_cast<uint32_t>(rank)) ^
                             static_cast<uint32_t>(epoch));
  std::mt19937_64 gen(mixed);
  std::vector<int64_t>& v = *indices;
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(UniformBelow(gen, i));
    std::swap(v[i - 1], v[j]);
  }
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
