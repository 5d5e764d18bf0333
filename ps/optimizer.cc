#include "ps/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace parasync {

namespace {

// One optimizer's loop, written once for both cases so that each instance may promise the
// compiler no aliasing among its arrays; when kInPlace, `in` is unused and the weights are
// read from `out`.
template <bool kInPlace>
void Sgd(const OptimizerSpec& spec, int64_t /*step*/, const float* __restrict in,
         float* __restrict out, const float* __restrict g, std::span<float* const> /*slots*/,
         int64_t n) {
  auto w = [&](int64_t i) { return kInPlace ? out[i] : in[i]; };
  const float lr = spec.learning_rate;
  for (int64_t i = 0; i < n; ++i) out[i] = w(i) - lr * g[i];
}

template <bool kInPlace>
void Momentum(const OptimizerSpec& spec, int64_t /*step*/, const float* __restrict in,
              float* __restrict out, const float* __restrict g, std::span<float* const> slots,
              int64_t n) {
  auto w = [&](int64_t i) { return kInPlace ? out[i] : in[i]; };
  const float lr = spec.learning_rate;
  float* __restrict v = slots[0];
  const float mu = spec.momentum;
  for (int64_t i = 0; i < n; ++i) {
    v[i] = mu * v[i] + g[i];
    out[i] = w(i) - lr * v[i];
  }
}

template <bool kInPlace>
void Adam(const OptimizerSpec& spec, int64_t step, const float* __restrict in,
          float* __restrict out, const float* __restrict g, std::span<float* const> slots,
          int64_t n) {
  auto w = [&](int64_t i) { return kInPlace ? out[i] : in[i]; };
  const float lr = spec.learning_rate;
  float* __restrict m = slots[0];
  float* __restrict v = slots[1];
  const float b1 = spec.beta1;
  const float b2 = spec.beta2;
  const double t = static_cast<double>(step);
  const float lr_t = static_cast<float>(lr * std::sqrt(1.0 - std::pow(double{b2}, t)) /
                                        (1.0 - std::pow(double{b1}, t)));
  const float eps = spec.epsilon;
  for (int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    out[i] = w(i) - lr_t * m[i] / (std::sqrt(v[i]) + eps);
  }
}

// The accumulator slot holds the sum of squared gradients; the initial value is added back
// in the update, so slots start at zero like every other optimizer's.
template <bool kInPlace>
void Adagrad(const OptimizerSpec& spec, int64_t /*step*/, const float* __restrict in,
             float* __restrict out, const float* __restrict g, std::span<float* const> slots,
             int64_t n) {
  auto w = [&](int64_t i) { return kInPlace ? out[i] : in[i]; };
  const float lr = spec.learning_rate;
  const float init = spec.initial_accumulator;
  const float eps = spec.epsilon;
  float* __restrict acc = slots[0];
  for (int64_t i = 0; i < n; ++i) {
    acc[i] += g[i] * g[i];
    out[i] = w(i) - lr * g[i] / (std::sqrt(acc[i] + init) + eps);
  }
}

// The workers apply their own optimizer: the server keeps the step's averaged gradient for
// them to read ...
template <bool kInPlace>
void Aggregate(const OptimizerSpec& /*spec*/, int64_t /*step*/, const float* /*in*/,
               float* __restrict out, const float* __restrict g,
               std::span<float* const> /*slots*/, int64_t n) {
  std::copy(g, g + n, out);
}

// ... or adds the change a worker's optimizer made to its copy (async, ssp).
template <bool kInPlace>
void Delta(const OptimizerSpec& /*spec*/, int64_t /*step*/, const float* __restrict in,
           float* __restrict out, const float* __restrict g, std::span<float* const> /*slots*/,
           int64_t n) {
  auto w = [&](int64_t i) { return kInPlace ? out[i] : in[i]; };
  for (int64_t i = 0; i < n; ++i) out[i] = w(i) + g[i];
}

// Every optimizer's update, row for row as kOptimizerKinds (common/model_spec.h) lists them.
constexpr OptimizerDef kOptimizers[] = {
    {OptimizerKind::kSgd, &Sgd<true>, &Sgd<false>},
    {OptimizerKind::kMomentum, &Momentum<true>, &Momentum<false>},
    {OptimizerKind::kAdam, &Adam<true>, &Adam<false>},
    {OptimizerKind::kAdagrad, &Adagrad<true>, &Adagrad<false>},
    {OptimizerKind::kAggregate, &Aggregate<true>, &Aggregate<false>},
    {OptimizerKind::kDelta, &Delta<true>, &Delta<false>},
};

constexpr bool TableMatchesTheKinds() {
  if (std::size(kOptimizers) != std::size(kOptimizerKinds)) return false;
  for (size_t i = 0; i < std::size(kOptimizers); ++i) {
    if (kOptimizers[i].kind != kOptimizerKinds[i].kind) return false;
  }
  return true;
}
static_assert(TableMatchesTheKinds(),
              "kOptimizers: one row per kOptimizerKinds row, in the same order");

}  // namespace

const OptimizerDef* FindOptimizer(OptimizerKind kind) {
  const auto i = static_cast<size_t>(kind);
  return i < std::size(kOptimizers) ? &kOptimizers[i] : nullptr;
}

int NumOptimizerSlots(OptimizerKind kind) {
  const OptimizerKindInfo* info = FindOptimizerKind(kind);
  return info != nullptr ? info->slots : 0;
}

void ApplyUpdate(const OptimizerSpec& spec, int64_t step, const float* w_in, float* w_out,
                 const float* g, std::span<float* const> slots, int64_t n) {
  const OptimizerDef* o = FindOptimizer(spec.kind);
  if (o == nullptr) return;
  if (w_in == w_out) {
    o->update_in_place(spec, step, nullptr, w_out, g, slots, n);
  } else {
    o->update_out_of_place(spec, step, w_in, w_out, g, slots, n);
  }
}

// On the bits (an exponent of all ones), so that the loop vectorizes (std::isfinite does not,
// at -O2): one pass at memory speed over the gradient.
bool IsAllFinite(const float* g, int64_t n) {
  uint32_t worst = 0;
  for (int64_t k = 0; k < n; ++k) {
    uint32_t bits;
    std::memcpy(&bits, g + k, sizeof(bits));
    worst = std::max(worst, bits & 0x7f800000u);
  }
  return worst != 0x7f800000u;
}

bool ApplySgdIfFinite(float lr, const float* __restrict w_in, float* __restrict w_out,
                      const float* __restrict g, int64_t n) {
  // The check is on the bits (an exponent of all ones), so the loop vectorizes.
  uint32_t worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, g + i, sizeof(bits));
    worst = std::max(worst, bits & 0x7f800000u);
    w_out[i] = w_in[i] - lr * g[i];
  }
  return worst != 0x7f800000u;
}

bool ApplySgdIfFiniteStreaming(float lr, const float* w_in, float* w_out, const float* g,
                               int64_t n) {
#if defined(__SSE2__)
  // A scalar head up to w_out's 16-byte boundary, four floats at a time, a scalar tail. The
  // vector step computes w - lr * g with a separate multiply and subtract, as the scalar
  // loop does (no FMA), so the results are the same bits.
  int64_t head = 0;
  while (head < n && reinterpret_cast<uintptr_t>(w_out + head) % 16 != 0) ++head;
  const int64_t body_end = head + (n - head) / 4 * 4;
  bool finite = ApplySgdIfFinite(lr, w_in, w_out, g, head);
  const __m128 rate = _mm_set1_ps(lr);
  const __m128i exponent = _mm_set1_epi32(0x7f800000);
  __m128i non_finite = _mm_setzero_si128();
  for (int64_t i = head; i < body_end; i += 4) {
    const __m128 grad = _mm_loadu_ps(g + i);
    non_finite = _mm_or_si128(
        non_finite,
        _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(grad), exponent), exponent));
    _mm_stream_ps(w_out + i, _mm_sub_ps(_mm_loadu_ps(w_in + i), _mm_mul_ps(rate, grad)));
  }
  _mm_sfence();
  finite = _mm_movemask_epi8(non_finite) == 0 && finite;
  return ApplySgdIfFinite(lr, w_in + body_end, w_out + body_end, g + body_end,
                          n - body_end) && finite;
#else
  return ApplySgdIfFinite(lr, w_in, w_out, g, n);
#endif
}

}  // namespace parasync
