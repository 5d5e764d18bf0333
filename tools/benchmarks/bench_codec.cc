// parasync-bench-codec: what narrowing gradients to float16 or bfloat16 and widening them
// back costs (common/float_codec.h, --wire-dtype and hvd.Compression.fp16/bf16: workers and
// servers run it on every push and pull). Times the array forms (EncodeFloats and
// DecodeFloats: 8 elements at a time where the CPU has AVX2 and F16C) against the scalar
// functions called per element (what the arrays ran before) and a memcpy of the float32
// array, interleaved in every repeat so that machine noise hits all alike. Prints the median
// milliseconds per case.
//
//   parasync-bench-codec [--elements 2770634] [--repeats 21]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/float_codec.h"
#include "common/int8_codec.h"
#include "tools/benchmarks/stats.h"

namespace {

using parasync::DType;

struct Case {
  std::string name;
  std::function<void()> run;
  std::vector<double> ms;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t elements = 2770634;  // the Keras CNN's parameters
  int repeats = 21;
  CLI::App app{"parasync-bench-codec: float16/bfloat16 narrowing and widening, the array "
               "forms against the scalar functions per element"};
  app.add_option("--elements", elements, "floats per conversion (default: the Keras CNN's)")
      ->check(CLI::Range(int64_t{8}, int64_t{1} << 30));
  app.add_option("--repeats", repeats, "repeats of every case; the median is printed")
      ->check(CLI::Range(1, 1000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "parasync-bench-codec: %s\n", e.what());
    return 2;
  }
  const auto n = static_cast<size_t>(elements);
  std::vector<float> in(n), back(n), residual(n, 0.0f);
  std::vector<uint16_t> wire(n);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(i % 1000) * 1e-4f - 0.05f;
  // top-k's selection depends on the order of the values (a rising run makes every element
  // enter the running best): a gradient-like, unordered input for it.
  std::vector<float> noisy(n);
  uint32_t state = 12345;
  for (float& x : noisy) {
    state = state * 1664525u + 1013904223u;
    x = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.1f;
  }
  auto topk = [&](int keep) {
    return [&, keep] {
      parasync::EncodeRange(noisy.data(), n, 0, parasync::WireFormat(DType::kTopK, keep),
                            wire.data(), residual.data());
    };
  };
  std::vector<float> base(in), next(n);  // a reader's copy and the one a delta pull makes
  std::vector<Case> cases = {
      {"float16 narrow, scalar per element",
       [&] { for (size_t i = 0; i < n; ++i) wire[i] = parasync::FloatToHalf(in[i]); }, {}},
      {"float16 narrow, array (EncodeFloats)",
       [&] { parasync::EncodeFloats(in.data(), n, DType::kFloat16, wire.data()); }, {}},
      {"float16 widen, scalar per element",
       [&] { for (size_t i = 0; i < n; ++i) back[i] = parasync::HalfToFloat(wire[i]); }, {}},
      {"float16 widen, array (DecodeFloats)",
       [&] { parasync::DecodeFloats(wire.data(), n, DType::kFloat16, back.data()); }, {}},
      {"bfloat16 narrow, scalar per element",
       [&] { for (size_t i = 0; i < n; ++i) wire[i] = parasync::FloatToBfloat16(in[i]); }, {}},
      {"bfloat16 narrow, array (EncodeFloats)",
       [&] { parasync::EncodeFloats(in.data(), n, DType::kBfloat16, wire.data()); }, {}},
      {"bfloat16 widen, array (DecodeFloats)",
       [&] { parasync::DecodeFloats(wire.data(), n, DType::kBfloat16, back.data()); }, {}},
      {"int8 encode, error feedback (EncodeRange)",
       [&] { parasync::EncodeRange(in.data(), n, 0, DType::kInt8, wire.data(), residual.data()); },
       {}},
      {"int8 decode (DecodeRange)",
       [&] { parasync::DecodeRange(wire.data(), n, 0, DType::kInt8, back.data()); }, {}},
      {"int8 delta pull: server's encode and copy (EncodeInt8Delta)",
       [&] { parasync::EncodeInt8Delta(in.data(), base.data(), next.data(), n, 0, wire.data()); }, {}},
      {"int8 delta pull: reader's add to its copy and parameters (AddInt8)",
       [&] { parasync::AddInt8(wire.data(), n, 0, base.data(), back.data()); }, {}},
      {"int4 encode, error feedback (EncodeRange)",
       [&] { parasync::EncodeRange(in.data(), n, 0, DType::kInt4, wire.data(), residual.data()); },
       {}},
      {"int4 decode (DecodeRange)",
       [&] { parasync::DecodeRange(wire.data(), n, 0, DType::kInt4, back.data()); }, {}},
      {"int4 delta pull: server's encode and copy (EncodeInt4Delta)",
       [&] { parasync::EncodeInt4Delta(in.data(), base.data(), next.data(), n, 0, wire.data()); }, {}},
      {"int4 delta pull: reader's add to its copy and parameters (AddInt4)",
       [&] { parasync::AddInt4(wire.data(), n, 0, base.data(), back.data()); }, {}},
      {"topk:1/32 encode (8 of 256), error feedback", topk(8), {}},
      {"topk:1/8 encode (32 of 256), error feedback", topk(32), {}},
      {"topk:1/4 encode (64 of 256), error feedback", topk(64), {}},
      {"topk:1/8 decode",
       [&] {
         parasync::DecodeRange(wire.data(), n, 0, parasync::WireFormat(DType::kTopK, 32),
                               back.data());
       },
       {}},
      {"float32 memcpy", [&] { std::memcpy(back.data(), in.data(), n * sizeof(float)); }, {}}};
  for (int r = 0; r < repeats; ++r) {
    for (Case& c : cases) {
      const auto start = std::chrono::steady_clock::now();
      c.run();
      c.ms.push_back(std::chrono::duration<double, std::milli>(
                         std::chrono::steady_clock::now() - start).count());
    }
  }
  std::printf("%lld floats, median of %d repeats; array forms vectorized here: %s\n",
              static_cast<long long>(elements), repeats,
              parasync::FloatCodecIsVectorized() ? "yes (AVX2, F16C)" : "no (scalar)");
  std::printf("| case | ms |\n|---|---|\n");
  for (const Case& c : cases) {
    std::printf("| %s | %.2f |\n", c.name.c_str(), parasync::bench::Median(c.ms));
  }
  return 0;
}
