// parasync-bench-denormals: what denormal floats cost the servers' apply, and what flushing
// them to zero (common/denormals.h) saves. Times one optimizer update (ps/optimizer.h's
// ApplyUpdate, the code a server runs) over a shard-sized array whose slots hold zeros or
// denormals — Adam's moments of weights whose gradient has been zero for a while decay into
// that range — with IEEE denormals and with them flushed, the four cases interleaved in every
// repeat so that machine noise hits all alike. Prints the median per case and the ratios.
//
//   parasync-bench-denormals [--optimizer adam] [--elements 118000] [--repeats 21]
//                            [--applies 20]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/denormals.h"
#include "common/model_spec.h"
#include "ps/optimizer.h"
#include "tools/benchmarks/stats.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string optimizer = "adam";
  int64_t elements = 118000;  // a shard of the quick start's MLP (2 servers)
  int repeats = 21;
  int applies = 20;
};

// The arrays one apply works on, allocated once: every case reuses them, so that no case
// pays for fresh pages.
struct Arrays {
  Arrays(const parasync::OptimizerSpec& spec, int64_t n)
      : w(static_cast<size_t>(n)), g(static_cast<size_t>(n), 0.0f),
        slots(static_cast<size_t>(parasync::NumOptimizerSlots(spec.kind)),
              std::vector<float>(static_cast<size_t>(n))) {
    for (auto& s : slots) slot_ptrs.push_back(s.data());
  }
  std::vector<float> w;
  std::vector<float> g;  // zero: a weight nobody touched this step
  std::vector<std::vector<float>> slots;
  std::vector<float*> slot_ptrs;
};

// The microseconds of one apply (the mean of --applies, after one untimed) of a zero gradient
// to weights whose every slot starts at `slot_value`, the bits set as `flush` says.
double TimeApply(const parasync::OptimizerSpec& spec, const Options& o, Arrays& a,
                 float slot_value, bool flush) {
  std::fill(a.w.begin(), a.w.end(), 0.05f);
  for (auto& s : a.slots) std::fill(s.begin(), s.end(), slot_value);
  if (flush) {
    parasync::FlushDenormalsOnThisThread();
  } else {
    parasync::KeepDenormalsOnThisThread();
  }
  auto apply = [&](int64_t step) {
    parasync::ApplyUpdate(spec, step, a.w.data(), a.w.data(), a.g.data(), a.slot_ptrs,
                          o.elements);
  };
  apply(999);
  const auto start = Clock::now();
  for (int i = 0; i < o.applies; ++i) apply(1000 + i);
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  parasync::KeepDenormalsOnThisThread();
  return us / o.applies;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"parasync-bench-denormals: an optimizer apply over denormal slots against the "
               "same apply over zeros, with IEEE denormals and with them flushed to zero"};
  app.add_option("--optimizer", o.optimizer, "sgd, momentum, adam or adagrad")
      ->capture_default_str();
  app.add_option("--elements", o.elements, "floats per apply (a shard's size)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 28));
  app.add_option("--repeats", o.repeats, "repeats of the four cases, interleaved")
      ->capture_default_str()->check(CLI::Range(1, 10000));
  app.add_option("--applies", o.applies, "applies timed together per case and repeat")
      ->capture_default_str()->check(CLI::Range(1, 10000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto kind = parasync::ParseOptimizerKind(o.optimizer);
  if (!kind.ok()) {
    std::fprintf(stderr, "parasync-bench-denormals: %s\n", kind.status().message().c_str());
    return 2;
  }
  parasync::OptimizerSpec spec;
  spec.kind = *kind;
  spec.learning_rate = 0.001f;
  // Adam's second moment decays by beta2 = 0.999 a step: from 1e-39 it stays denormal for
  // thousands of steps, as it does in a run.
  constexpr float kDenormal = 1e-39f;
  struct Case {
    const char* slots;
    float value;
    const char* arithmetic;
    bool flush;
    std::vector<double> us;
  };
  std::vector<Case> cases = {{"zeros", 0.0f, "IEEE", false, {}},
                             {"denormal", kDenormal, "IEEE", false, {}},
                             {"zeros", 0.0f, "flushed", true, {}},
                             {"denormal", kDenormal, "flushed", true, {}}};
  Arrays arrays(spec, o.elements);
  for (int r = 0; r < o.repeats; ++r) {
    for (Case& c : cases) c.us.push_back(TimeApply(spec, o, arrays, c.value, c.flush));
  }
  std::printf("%s apply of a zero gradient over %lld floats, median of %d repeats x %d applies "
              "(one thread):\n\n| slots | arithmetic | us per apply |\n|---|---|---|\n",
              o.optimizer.c_str(), static_cast<long long>(o.elements), o.repeats, o.applies);
  std::vector<double> median;
  for (const Case& c : cases) {
    median.push_back(parasync::bench::Median(c.us));
    std::printf("| %s | %s | %.1f |\n", c.slots, c.arithmetic, median.back());
  }
  std::printf("\ndenormal / zeros: %.2fx with IEEE denormals, %.2fx flushed; "
              "IEEE / flushed over denormals: %.2fx\n",
              median[1] / median[0], median[3] / median[2], median[1] / median[3]);
  return 0;
}
