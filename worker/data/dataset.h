// The training data as the worker holds it: a labelled data set in memory (read from IDX or
// NumPy .npy files), how it is split among worker ranks, and the per-epoch order in which a
// rank visits its share. docs/data.md describes the files for users.
//
// Dataset is a plain value. The functions are pure (deterministic in their arguments and the
// files they read) and thread-safe; they share no state.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace parasync {

// Where the worker (and parasync-launch's preflight) looks for the data set when --dataset
// is not given: Debian's dataset-fashion-mnist package.
inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// n examples of dim features each, optionally id_columns integer ids each (categorical
// features, e.g. hashed, for an embedding), and one label per example.
struct Dataset {
  int64_t n = 0;
  int64_t dim = 0;             // 0 when the data set has ids only
  std::vector<int64_t> shape;  // of one example: [C, H, W] for images, else [dim]; product dim
  std::vector<float> x;        // n * dim, row-major; images channel-first (CHW), pixel / 255
  std::vector<uint8_t> y;      // n labels
  std::vector<uint64_t> ids;   // n * id_columns, row-major
  int64_t id_columns = 0;
};

// Loads split `split` of the data set in directory `data` (empty means "."), the one entry
// point the worker uses. `split` is "train" or "test". Looks first for IDX files (see
// LoadIdxDataset; prefix "train" for the train split, "t10k" for the test split), then for
// NumPy files "<split>_x.npy" and "<split>_y.npy" (see LoadNpyDataset). On success returns
// the data set of whichever pair exists. Beside the NumPy files, "<split>_ids.npy", when it
// exists, holds the ids: int64 (each >= 0) or uint64, shape (n,) (one column) or (n, K);
// with it "<split>_x.npy" may be absent (then dim 0, shape [0]). Ids of another dtype or
// shape, or a negative id, are InvalidArgument (one line naming the file, and for a value
// the example and the value); an example count differing from the labels' is Corruption
// naming both files. Fails with InvalidArgument for another split name;
// NotFound, one line naming both pairs looked for, when neither pair exists; otherwise as the
// loader of the pair found. Blocks on file I/O.
Result<Dataset> LoadDataset(const std::string& data, const std::string& split);

// Returns Ok if LoadDataset would find a pair of files for both the "train" and the "test"
// split of `data` and this process may read them, without reading them; else NotFound with
// the one line LoadDataset would give (both splits' lines joined by "; " when both lack
// files), or FailedPrecondition naming a file that cannot be read. For preflight checks.
[[nodiscard]] Status CheckDataFilesExist(const std::string& data);

// Loads split `split` (e.g. "train" or "t10k") of an MNIST-style data set from `dir`: images
// from "<split>-images-idx3-ubyte[.gz]" or, if that is absent, "<split>-images-idx4-ubyte[.gz]",
// and labels from "<split>-labels-idx1-ubyte[.gz]", each taken gzip-compressed if that file
// exists and plain otherwise. Images are [n, rows, cols] (shape [1, rows, cols]) or
// [n, H, W, C], channels last in the file (shape [C, H, W], transposed to CHW in x); the
// header decides, not the file name. Pixels are scaled by 1/255. Fails with NotFound if no
// images file or no labels file exists; Corruption if a file is damaged (see ReadIdxFile),
// images do not have 3 or 4 dimensions or labels 1, or the image and label counts differ;
// InvalidArgument for an empty split name. Labels are not range-checked here; the compute
// backend rejects ones outside its classes. Blocks on file I/O.
Result<Dataset> LoadIdxDataset(const std::string& dir, const std::string& split);

// Loads a data set from two .npy files (see ReadNpyFile for what fails to read). Features
// [n] give shape [1]; [n, D] give [D]; [n, H, W] give [1, H, W]; [n, H, W, C] are channels
// last and become [C, H, W], transposed to CHW in x. uint8 features are pixels, scaled by
// 1/255; every other dtype is taken as it is (float64 rounded to float32), and integers must
// be at most 2^24 in magnitude so float32 holds them exactly. Labels have an integer dtype,
// shape [n] or [n, 1], and values in [0, 255]. Fails with InvalidArgument (one line naming
// the file, and for a bad value the element or example and the value) for features of 0 or
// more than 4 dimensions or with a zero-sized dimension, an integer feature out of range,
// float labels, labels of another shape, or a label outside [0, 255]; Corruption naming both
// files when their example counts differ. Blocks on file I/O.
Result<Dataset> LoadNpyDataset(const std::string& features_path, const std::string& labels_path);

// The largest label in `data`, or -1 when it has none.
int MaxLabel(const Dataset& data);

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

// The input shape a model of `data` is built for: [id_columns + dim] when the data has ids
// (the ids first, then the features, flat), else data.shape.
std::vector<int64_t> ModelInputShape(const Dataset& data);

// Copies the examples named by `idx` into x_out (idx.size() * data.dim floats) and y_out
// (idx.size() labels), in that order. Precondition: every index is in [0, data.n) and the
// outputs are large enough; the caller owns the outputs.
void GatherBatch(const Dataset& data, std::span<const int64_t> idx, float* x_out,
                 uint8_t* y_out);

}  // namespace parasync
