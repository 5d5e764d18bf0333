// The training data as the worker holds it: a labelled image set in memory, how it is split
// among worker ranks, and the per-epoch order in which a rank visits its share.
//
// Dataset is a plain value. The functions are pure (deterministic in their arguments) and
// thread-safe; they share no state.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace parasync {

// n examples of dim features each, features scaled to [0, 1].
struct Dataset {
  int64_t n = 0;
  int64_t dim = 0;
  std::vector<float> x;    // n * dim, row-major, pixel / 255
  std::vector<uint8_t> y;  // n labels
};

// Loads the split `split` (e.g. "train" or "t10k") of an MNIST-style data set from `dir`:
// "<split>-images-idx3-ubyte[.gz]" ([n, rows, cols] bytes) and "<split>-labels-idx1-ubyte[.gz]"
// ([n] bytes), each taken gzip-compressed if that file exists and plain otherwise. On
// success dim = rows * cols. Fails with NotFound if either file is missing, Corruption if a
// file is damaged (see ReadIdxFile), has the wrong number of dimensions, or the image and
// label counts differ; InvalidArgument for an empty split name. Labels are not range-checked
// here; the compute backend rejects ones outside its classes. Blocks on file I/O.
Result<Dataset> LoadIdxDataset(const std::string& dir, const std::string& split);

// The example indices rank `rank` of `world` owns: every i in [0, n) with i % world == rank,
// ascending. Shards of different ranks are disjoint, together cover [0, n), and differ in
// size by at most one. Shard before shuffling, so membership never changes between epochs.
// Returns an empty vector for bad arguments (n < 0, world < 1, rank outside [0, world)).
std::vector<int64_t> ShardIndices(int64_t n, int rank, int world);

// Permutes *indices in place into the visiting order for `epoch`: a Fisher-Yates shuffle
// driven by std::mt19937_64 seeded from (seed, rank, epoch), with its own uniform draw, so
// the order is the same on every platform and standard library for the same arguments and
// input, and differs between epochs. `indices` is not owned and must not be null.
void ShuffleForEpoch(std::vector<int64_t>* indices, uint64_t seed, int rank, int epoch);

// Copies the examples named by `idx` into x_out (idx.size() * data.dim floats) and y_out
// (idx.size() labels), in that order. Precondition: every index is in [0, data.n) and the
// outputs are large enough; the caller owns the outputs.
void GatherBatch(const Dataset& data, std::span<const int64_t> idx, float* x_out,
                 uint8_t* y_out);

}  // namespace parasync
