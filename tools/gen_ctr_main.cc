// parasync-gen-ctr: writes click-through data drawn from a planted logistic model, so a
// trainer's result can be compared with the best any learner can do on the same data.
//
// Each example has one categorical value per field, drawn Zipf over ranks 1..V and mapped to
// a value by a fixed per-field permutation (the frequent values are not the small numbers),
// and D standard normal dense features. The label is Bernoulli(sigmoid(logit)) with
// logit = bias + sum_f w_f(v_f) + u.x. The weights w_f(v) are never stored: each is computed
// from a hash of (seed, field, value) when needed, so V may be huge. Every random draw comes
// from a counter-based generator keyed by (seed, split, example), so the files depend on the
// flags alone, byte for byte.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <numbers>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/auc.h"
#include "common/cli.h"
#include "common/process.h"
#include "common/split_mix.h"
#include "tools/zipf_sampler.h"

namespace {

constexpr const char* kProgram = "parasync-gen-ctr";

// The .npy writer below stores the host's bytes as NumPy's little-endian dtypes.
static_assert(std::endian::native == std::endian::little);

int Fail(const std::string& line, int code) {
  return parasync::PrintErrorLine(kProgram, line, code);
}

// The defaults give a planted test AUC of about 0.77-0.83 (depending on the seed, as the few
// most frequent values carry much of the signal), and leave one pass of the reference
// learner over 10^6 train examples 0.003-0.004 AUC below the planted model: a Zipf exponent
// of 1.6 puts ~98.7% of test occurrences on ids seen 10+ times in train, while V stays 10^7.
struct Options {
  std::string out;
  int64_t train = 1000000;
  int64_t test = 100000;
  int fields = 8;
  int64_t vocab = 10000000;
  double zipf = 1.6;
  double sigma = 0.4;
  double bias = -1.0;
  int dense = 4;
  uint64_t seed = 1;
  std::string id_kind = "offset";
  bool check_learnable = false;
};

// ---- Counter-based randomness ----------------------------------------------------------

// SplitMix64's output function: a bijective 64-bit mix whose outputs pass BigCrush as a
// counter-mode generator.
using parasync::SplitMix64;

uint64_t Hash(uint64_t a, uint64_t b, uint64_t c) {
  return SplitMix64(SplitMix64(SplitMix64(a) ^ b) ^ c);
}

// Domain tags, so the draws for one purpose never reuse another's hashes.
constexpr uint64_t kTagExample = 0x45584d504c45ULL;
constexpr uint64_t kTagWeight = 0x574549474854ULL;
constexpr uint64_t kTagDense = 0x44454e5345ULL;
constexpr uint64_t kTagPermutation = 0x5045524dULL;
constexpr uint64_t kTagHashId = 0x494453ULL;

// Uniform in [0, 1) from the top 53 bits.
double UnitInterval(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// A standard normal from two independent 64-bit values (Box-Muller; the first uniform is
// taken in (0, 1] so its logarithm is finite).
double Normal(uint64_t a, uint64_t b) {
  const double u1 = 1.0 - UnitInterval(a);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * UnitInterval(b));
}

// SplitMix64 as a stream: one per example, started from a hash of its key.
class Stream {
 public:
  explicit Stream(uint64_t key) : state_(key) {}
  uint64_t Next() { return SplitMix64(state_++ * parasync::kSplitMix64Gamma); }
  double Uniform() { return UnitInterval(Next()); }
  double Normal() { return ::Normal(Next(), Next()); }

 private:
  uint64_t state_;
};

// A keyed pseudo-random permutation of [0, n): rounds of xor, odd multiplication and
// xorshift (each a bijection on `bits` bits), cycle-walked until the result falls below n.
class Permutation {
 public:
  Permutation(uint64_t n, uint64_t key) : n_(n) {
    const int bits = n > 1 ? static_cast<int>(std::bit_width(n - 1)) : 0;
    mask_ = bits == 0 ? 0 : (~uint64_t{0} >> (64 - bits));
    shift_ = bits / 2 + 1;
    for (int i = 0; i < 3; ++i) keys_[i] = SplitMix64(key + static_cast<uint64_t>(i));
  }

  uint64_t Apply(uint64_t x) const {
    do {
      x = ((x ^ keys_[0]) * (keys_[1] | 1)) & mask_;
      x ^= x >> shift_;
      x = (x * (keys_[2] | 1)) & mask_;
      x ^= x >> shift_;
    } while (x >= n_);
    return x;
  }

 private:
  uint64_t n_;
  uint64_t mask_ = 0;
  int shift_ = 1;
  uint64_t keys_[3] = {};
};

// ---- The planted model and the data ----------------------------------------------------

class PlantedModel {
 public:
  explicit PlantedModel(const Options& o)
      : o_(o), zipf_(o.vocab, o.zipf), dense_weights_(static_cast<size_t>(o.dense)) {
    for (int f = 0; f < o.fields; ++f) {
      permutations_.emplace_back(static_cast<uint64_t>(o.vocab),
                                 Hash(o.seed, kTagPermutation, static_cast<uint64_t>(f)));
    }
    const double scale = o.dense > 0 ? 1.0 / std::sqrt(static_cast<double>(o.dense)) : 0.0;
    for (int j = 0; j < o.dense; ++j) {
      const uint64_t h = Hash(o.seed, kTagDense, static_cast<uint64_t>(j));
      dense_weights_[static_cast<size_t>(j)] = scale * Normal(h, SplitMix64(h));
    }
  }

  // A value of field f: a Zipf rank, permuted.
  uint64_t DrawValue(int f, Stream& stream) const {
    return permutations_[static_cast<size_t>(f)].Apply(
        static_cast<uint64_t>(zipf_.Sample(stream) - 1));
  }
  double Weight(int f, uint64_t value) const {
    const uint64_t h = Hash(o_.seed ^ kTagWeight, static_cast<uint64_t>(f), value);
    return o_.sigma * Normal(h, SplitMix64(h));
  }
  // The id written for value v of field f (see --id-kind).
  uint64_t Id(int f, uint64_t value) const {
    if (o_.id_kind == "offset") return static_cast<uint64_t>(f) * uint64_t(o_.vocab) + value;
    return Hash(o_.seed ^ kTagHashId, static_cast<uint64_t>(f), value);
  }
  const std::vector<double>& dense_weights() const { return dense_weights_; }

 private:
  const Options& o_;
  parasync::ZipfSampler zipf_;
  std::vector<Permutation> permutations_;
  std::vector<double> dense_weights_;
};

struct Split {
  int64_t n = 0;
  std::vector<uint64_t> ids;  // n * fields
  std::vector<float> x;       // n * dense
  std::vector<uint8_t> y;     // n
  std::vector<float> logit;   // n, the planted model's
};

double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

Split Generate(const Options& o, const PlantedModel& model, int64_t n, uint64_t split_tag) {
  Split s;
  s.n = n;
  const auto un = static_cast<size_t>(n);
  s.ids.resize(un * static_cast<size_t>(o.fields));
  s.x.resize(un * static_cast<size_t>(o.dense));
  s.y.resize(un);
  s.logit.resize(un);
  for (size_t i = 0; i < un; ++i) {
    Stream stream(Hash(o.seed ^ kTagExample, split_tag, i));
    double logit = o.bias;
    for (int f = 0; f < o.fields; ++f) {
      const uint64_t value = model.DrawValue(f, stream);
      s.ids[i * static_cast<size_t>(o.fields) + static_cast<size_t>(f)] = model.Id(f, value);
      logit += model.Weight(f, value);
    }
    for (size_t j = 0; j < static_cast<size_t>(o.dense); ++j) {
      const double v = stream.Normal();
      s.x[i * static_cast<size_t>(o.dense) + j] = static_cast<float>(v);
      logit += model.dense_weights()[j] * v;
    }
    s.logit[i] = static_cast<float>(logit);
    s.y[i] = stream.Uniform() < Sigmoid(logit) ? 1 : 0;
  }
  return s;
}

// ---- .npy output ------------------------------------------------------------------------

// Writes a version 1.0 .npy file: magic, version, header length, then a dict header padded
// with spaces and a newline so the data starts at a multiple of 64 bytes (as NumPy itself
// aligns it), then the C-order little-endian elements. Returns "" or the one line to fail
// with.
std::string WriteNpy(const std::string& path, const char* descr, const std::vector<int64_t>& shape,
                     const void* data, size_t bytes) {
  std::string dims;  // "3, 4" for (3, 4), but "3," for (3,)
  for (size_t k = 0; k < shape.size(); ++k) dims += (k > 0 ? ", " : "") + std::to_string(shape[k]);
  if (shape.size() == 1) dims += ",";
  std::string header = std::string("{'descr': '") + descr +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t prefix = 10;  // magic (6) + version (2) + header length (2)
  header.append(63 - (prefix + header.size()) % 64, ' ');
  header += '\n';
  const auto header_len = static_cast<uint16_t>(header.size());
  std::string file = "\x93NUMPY\x01";
  file += '\0';
  file += static_cast<char>(header_len & 0xff);
  file += static_cast<char>(header_len >> 8);
  file += header;
  FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr) return "cannot create " + path;
  bool ok = std::fwrite(file.data(), 1, file.size(), out) == file.size();
  ok = ok && (bytes == 0 || std::fwrite(data, 1, bytes, out) == bytes);
  ok = (std::fclose(out) == 0) && ok;
  return ok ? "" : "cannot write " + path + " (disk full?)";
}

std::string WriteSplit(const Options& o, const std::string& name, const Split& s) {
  const std::string base = o.out + "/" + name;
  const char* id_descr = o.id_kind == "offset" ? "<i8" : "<u8";
  std::string err = WriteNpy(base + "_ids.npy", id_descr, {s.n, o.fields}, s.ids.data(),
                             s.ids.size() * sizeof(uint64_t));
  if (err.empty()) {
    err = WriteNpy(base + "_x.npy", "<f4", {s.n, o.dense}, s.x.data(), s.x.size() * sizeof(float));
  }
  if (err.empty()) err = WriteNpy(base + "_y.npy", "|u1", {s.n}, s.y.data(), s.y.size());
  return err;
}

// ---- Reports ------------------------------------------------------------------------------

void ReportPlanted(const Split& test) {
  std::vector<float> p(test.logit.size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(Sigmoid(test.logit[i]));
  std::printf(
      "planted model on test: log-loss %.4f AUC %.4f (the best any learner can do on this "
      "data)\n",
      parasync::LogLoss(p, test.y), parasync::RocAuc(test.logit, test.y));
}

// How much of the id space the train split shows: distinct ids per field, and the share of
// test id occurrences a learner has seen often enough (10 times) to have a weight for.
void ReportCoverage(const Options& o, const Split& train, const Split& test) {
  std::vector<std::unordered_map<uint64_t, uint32_t>> counts(static_cast<size_t>(o.fields));
  const auto fields = static_cast<size_t>(o.fields);
  for (size_t k = 0; k < train.ids.size(); ++k) ++counts[k % fields][train.ids[k]];
  std::string per_field;
  size_t total = 0;
  for (const auto& c : counts) {
    per_field += (per_field.empty() ? "" : " ") + std::to_string(c.size());
    total += c.size();
  }
  size_t well_seen = 0;
  for (size_t k = 0; k < test.ids.size(); ++k) {
    const auto& c = counts[k % fields];
    auto it = c.find(test.ids[k]);
    if (it != c.end() && it->second >= 10) ++well_seen;
  }
  double clicks = 0;
  for (uint8_t y : train.y) clicks += y;
  std::printf(
      "train %lld test %lld, fields %d, vocab %lld, dense %d, train click rate %.4f; distinct "
      "ids seen in train per field %s (total %zu); test id occurrences seen >= 10 times in "
      "train %.2f%%\n",
      static_cast<long long>(train.n), static_cast<long long>(test.n), o.fields,
      static_cast<long long>(o.vocab), o.dense, clicks / static_cast<double>(train.n),
      per_field.c_str(), total,
      100.0 * static_cast<double>(well_seen) / static_cast<double>(test.ids.size()));
}

// ---- The reference learner (--check-learnable) ----------------------------------------

// One pass of logistic regression with a weight per id, the dense weights and a bias, each
// with its own Adagrad step: the simplest learner a trainer should match, showing that the
// data's signal can be learned from the train split at all.
class ReferenceLearner {
 public:
  ReferenceLearner(int fields, int dense)
      : fields_(static_cast<size_t>(fields)), dense_(static_cast<size_t>(dense) + 1) {}

  double Logit(const Split& s, size_t i) const {
    double z = dense_.w.back();  // the bias
    for (size_t f = 0; f < fields_; ++f) {
      auto it = ids_.find(s.ids[i * fields_ + f]);
      if (it != ids_.end()) z += it->second.w;
    }
    const size_t d = dense_.w.size() - 1;
    for (size_t j = 0; j < d; ++j) z += dense_.w[j] * s.x[i * d + j];
    return z;
  }

  void Train(const Split& s) {
    const size_t d = dense_.w.size() - 1;
    for (size_t i = 0; i < static_cast<size_t>(s.n); ++i) {
      const double g = Sigmoid(Logit(s, i)) - s.y[i];
      for (size_t f = 0; f < fields_; ++f) {
        Param& p = ids_[s.ids[i * fields_ + f]];
        Step(p.w, p.g2, g);
      }
      for (size_t j = 0; j < d; ++j) Step(dense_.w[j], dense_.g2[j], g * s.x[i * d + j]);
      Step(dense_.w[d], dense_.g2[d], g);
    }
  }

 private:
  static constexpr double kRate = 0.1;
  struct Param {
    double w = 0;
    double g2 = 0;
  };
  struct Dense {
    explicit Dense(size_t n) : w(n, 0.0), g2(n, 0.0) {}
    std::vector<double> w;
    std::vector<double> g2;
  };
  static void Step(double& w, double& g2, double g) {
    g2 += g * g;
    w -= kRate * g / std::sqrt(g2 + 1e-8);
  }

  size_t fields_;
  Dense dense_;
  std::unordered_map<uint64_t, Param> ids_;
};

void ReportLearner(const Options& o, const Split& train, const Split& test) {
  ReferenceLearner learner(o.fields, o.dense);
  learner.Train(train);
  std::vector<float> z(static_cast<size_t>(test.n));
  std::vector<float> p(z.size());
  for (size_t i = 0; i < z.size(); ++i) {
    z[i] = static_cast<float>(learner.Logit(test, i));
    p[i] = static_cast<float>(Sigmoid(z[i]));
  }
  const double auc = parasync::RocAuc(z, test.y);
  std::printf(
      "reference learner (one pass, per-id logistic regression, Adagrad lr 0.1) on test: "
      "log-loss %.4f AUC %.4f (%.4f below planted)\n",
      parasync::LogLoss(p, test.y), auc, parasync::RocAuc(test.logit, test.y) - auc);
}

// ---- main -----------------------------------------------------------------------------------

void AddFlags(CLI::App& app, Options& o) {
  app.add_option("--out", o.out, "Directory for the .npy files (created if missing)")
      ->required()
      ->type_name("DIR");
  app.add_option("--train", o.train, "Train examples")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, INT64_MAX));
  app.add_option("--test", o.test, "Test examples")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, INT64_MAX));
  app.add_option("--fields", o.fields, "Categorical fields per example")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--vocab", o.vocab, "Values per field (V)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, INT64_MAX));
  app.add_option("--zipf", o.zipf,
                 "Zipf exponent of the values' frequencies (> 0; at 1 and below a long tail: "
                 "with a large --vocab most values are seen once or never, and the distinct "
                 "ids run to tens of millions; docs/embeddings.md)")
      ->capture_default_str();
  app.add_option("--sigma", o.sigma, "Standard deviation of the planted per-value weights")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--bias", o.bias, "Planted bias (the logit's constant)")->capture_default_str();
  app.add_option("--dense", o.dense, "Dense standard normal float features (D)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  app.add_option("--seed", o.seed, "Seed of the planted model and of the draws")
      ->capture_default_str();
  app.add_option("--id-kind", o.id_kind,
                 "offset: id = field * V + value, all in [0, fields * V), int64; hash: a 64-bit "
                 "mix of (seed, field, value), stored as uint64 (for unbounded tables)")
      ->capture_default_str()
      ->check(CLI::IsMember({"offset", "hash"}));
  app.add_flag("--check-learnable", o.check_learnable,
               "Also fit the reference learner on train and print its test log-loss and AUC");
}

// The flags CLI11 cannot check alone; "" or the one line to fail with.
std::string Validate(const Options& o) {
  if (!(o.zipf > 0.0) || !std::isfinite(o.zipf)) {
    char value[32];
    std::snprintf(value, sizeof value, "%g", o.zipf);
    return std::string("--zipf must be a number above 0, not ") + value;
  }
  if (o.id_kind == "offset" && o.vocab > INT64_MAX / o.fields) {
    return "--fields * --vocab must fit in int64 for --id-kind offset (use --id-kind hash)";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace parasync;
  CLI::App app;
  SetUpCommandLine(
      app,
      {.name = kProgram,
       .purpose = "writes click-through data drawn from a planted logistic model as NumPy "
                  "files, and reports how well the planted model itself scores on the test "
                  "split.",
       .details = "Files in --out: train_ids.npy (int64 [n, fields]; uint64 with --id-kind "
                  "hash), train_x.npy (float32 [n, dense]), train_y.npy (uint8 [n], 0 or 1), "
                  "and the same for test_. Values of each field are Zipf distributed; their "
                  "planted weights are Normal(0, sigma), computed from a hash of (seed, "
                  "field, value); the label is Bernoulli(sigmoid(bias + sum of the weights + "
                  "u.x)). The same flags give the same bytes.",
       .exit_status = "Bad flags, or an --out that cannot be made or written, are status 2.",
       .examples = "parasync-gen-ctr --out data/ctr\n"
                   "parasync-gen-ctr --out /tmp/ctr --train 2000 --test 500 --vocab 1000 "
                   "--fields 3 --check-learnable"});
  Options o;
  AddFlags(app, o);
  if (auto done = ParseCommandLine(app, argc, argv)) return *done;
  if (std::string err = Validate(o); !err.empty()) return Fail(err, kExitBadUsage);
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return Fail("cannot create --out " + o.out + ": " + ec.message(), kExitBadUsage);

  const auto start = std::chrono::steady_clock::now();
  const PlantedModel model(o);
  const Split train = Generate(o, model, o.train, 1);
  const Split test = Generate(o, model, o.test, 2);
  for (const auto& [name, split] : {std::pair{"train", &train}, std::pair{"test", &test}}) {
    if (std::string err = WriteSplit(o, name, *split); !err.empty()) {
      return Fail(err, kExitBadUsage);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ReportPlanted(test);
  ReportCoverage(o, train, test);
  std::printf("wrote %s in %.1f s\n", o.out.c_str(), seconds);
  if (o.check_learnable) ReportLearner(o, train, test);
  return 0;
}
