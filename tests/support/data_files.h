// Test helpers for data files: IDX and NumPy .npy writers (and the scratch directory they
// go in, tests/support/temp_dir.h).
#pragma once

#include <stdlib.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "tests/support/temp_dir.h"

namespace parasync::testing {

// The bytes of an unsigned-byte IDX file with `dims` and `data` (data may be shorter or
// longer than the dims promise, to build damaged files).
inline std::vector<uint8_t> IdxBytes(const std::vector<uint32_t>& dims,
                                     const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    out.push_back(static_cast<uint8_t>(d >> 24));
    out.push_back(static_cast<uint8_t>(d >> 16));
    out.push_back(static_cast<uint8_t>(d >> 8));
    out.push_back(static_cast<uint8_t>(d));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// The little-endian bytes of `values` (the tests run on little-endian hosts only, as the
// readers do).
template <typename T>
std::vector<uint8_t> LeBytes(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// The bytes of a .npy file of format version `major`.0 whose header is the dict literal
// `dict`, padded with spaces and a newline to a multiple of 64 bytes as np.save does,
// followed by `data` (which may disagree with the header, to build damaged files).
inline std::vector<uint8_t> NpyBytesWithHeader(const std::string& dict,
                                               const std::vector<uint8_t>& data,
                                               int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  for (size_t i = 0; i < prefix - 8; ++i) {
    out.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  }
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// The bytes of a .npy file as np.save writes an array of dtype `descr` (e.g. "<f4") and
// `shape` holding `data`.
inline std::vector<uint8_t> NpyBytes(const std::string& descr, const std::vector<int64_t>& shape,
                                     const std::vector<uint8_t>& data, int major = 1,
                                     bool fortran_order = false) {
  std::string tuple = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    tuple += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  tuple += shape.size() == 1 ? ",)" : ")";
  return NpyBytesWithHeader("{'descr': '" + descr + "', 'fortran_order': " +
                                (fortran_order ? "True" : "False") + ", 'shape': " + tuple +
                                ", }",
                            data, major);
}

// Writes `bytes` to `path`, gzip-compressed when `gzip`. Returns false on failure.
inline bool WriteFile(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    if (f == nullptr) return false;
    const int n = bytes.empty() ? 0
                                : gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    const bool ok = gzclose(f) == Z_OK && n == static_cast<int>(bytes.size());
    return ok;
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const size_t n = std::fwrite(bytes.data(), 1, bytes.size(), f);
  return std::fclose(f) == 0 && n == bytes.size();
}

// A classification split as NumPy files <dir>/<split>_x.npy (n x 12 float32, uniform in
// [-1, 1]) and <split>_y.npy (int64 labels 0..2), labelled by a fixed linear rule: the class
// whose row of W scores highest. Separable by a dense layer, and nothing else in the features
// tells the classes apart, so only a data path that keeps every example's features with its
// own label can learn it. The rule is the same for every split; `seed` draws the examples.
inline constexpr int kLinearFeatures = 12;
inline constexpr int kLinearClasses = 3;
inline bool WriteLinearSplit(const std::string& dir, const std::string& split, int n,
                             uint64_t seed) {
  constexpr int kF = kLinearFeatures;
  std::mt19937_64 rule_gen(1);  // one rule for every split
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> w(kLinearClasses * kF);
  for (float& v : w) v = u(rule_gen);
  std::mt19937_64 gen(seed);
  std::vector<float> x(static_cast<size_t>(n) * kF);
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    float best = -INFINITY;
    for (size_t f = 0; f < kF; ++f) x[i * kF + f] = u(gen);
    for (int c = 0; c < kLinearClasses; ++c) {
      float score = 0;
      for (size_t f = 0; f < kF; ++f) score += w[static_cast<size_t>(c) * kF + f] * x[i * kF + f];
      if (score > best) {
        best = score;
        y[i] = c;
      }
    }
  }
  return WriteFile(dir + "/" + split + "_x.npy", NpyBytes("<f4", {n, kF}, LeBytes(x)), false) &&
         WriteFile(dir + "/" + split + "_y.npy", NpyBytes("<i8", {n}, LeBytes(y)), false);
}

}  // namespace parasync::testing
