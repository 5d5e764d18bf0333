#include "common/topk_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "common/int8_codec.h"

namespace parasync {
namespace {

struct ChunkAt {
  size_t at;   // first element of the chunk's part, in the range
  size_t len;  // its elements in the range
};

// Calls fn(chunk, part) for every chunk that n elements from `offset` touch, in order.
template <typename Fn>
void ForEachChunk(int64_t offset, size_t n, Fn&& fn) {
  size_t at = 0;
  while (at < n) {
    const auto in_chunk = static_cast<size_t>((offset + static_cast<int64_t>(at)) % kTopKChunk);
    const size_t len = std::min(n - at, static_cast<size_t>(kTopKChunk) - in_chunk);
    fn(ChunkAt{at, len});
    at += len;
  }
}

size_t Kept(int keep, size_t len) { return std::min(static_cast<size_t>(keep), len); }

// The m indices of v[0, len) of largest magnitude (ties: the lower index), increasing, into
// `index`. For small m a sorted run of the best so far (most elements fail its one compare);
// otherwise the m-th largest magnitude by nth_element, then one pass in order.
void Select(const float* v, size_t len, size_t m, uint8_t* index) {
  if (m == len) {
    for (size_t i = 0; i < len; ++i) index[i] = static_cast<uint8_t>(i);
    return;
  }
  float a[kTopKChunk];
  for (size_t i = 0; i < len; ++i) a[i] = std::fabs(v[i]);
  if (m <= 32) {
    float best[32];
    uint8_t at[32];
    size_t held = 0;
    for (size_t i = 0; i < len; ++i) {
      if (held == m && !(a[i] > best[m - 1])) continue;
      size_t j = held < m ? held++ : m - 1;
      for (; j > 0 && a[i] > best[j - 1]; --j) {
        best[j] = best[j - 1];
        at[j] = at[j - 1];
      }
      best[j] = a[i];
      at[j] = static_cast<uint8_t>(i);
    }
    std::copy(at, at + m, index);
    std::sort(index, index + m);
    return;
  }
  float sorted[kTopKChunk]{};
  std::copy(a, a + len, sorted);
  std::nth_element(sorted, sorted + (m - 1), sorted + len, std::greater<float>());
  const float threshold = sorted[m - 1];
  size_t above = 0;
  for (size_t i = 0; i < len; ++i) above += a[i] > threshold ? 1 : 0;
  size_t ties = m - above;
  size_t k = 0;
  for (size_t i = 0; i < len && k < m; ++i) {
    if (a[i] > threshold || (a[i] == threshold && ties > 0)) {
      if (!(a[i] > threshold)) --ties;
      index[k++] = static_cast<uint8_t>(i);
    }
  }
}

// One chunk's part: v = in (+ residual), its m kept elements into e, index and q (bytes
// [0, 1 + 2m) of `out`), the residual left with what was not sent.
void EncodeChunk(const float* in, size_t len, size_t m, float* residual, int8_t* out) {
  float v[kTopKChunk];
  bool finite = true;
  float largest = 0.0f;
  for (size_t i = 0; i < len; ++i) {
    v[i] = residual != nullptr ? in[i] + residual[i] : in[i];
    finite &= std::isfinite(v[i]);
    largest = std::max(largest, std::fabs(v[i]));
  }
  auto* index = reinterpret_cast<uint8_t*>(out + 1);
  int8_t* q = out + 1 + m;
  if (!finite) {
    out[0] = kInt8NonFinite;
    for (size_t j = 0; j < m; ++j) index[j] = static_cast<uint8_t>(j);
    std::memset(q, 0, m);
    if (residual != nullptr) std::fill(residual, residual + len, 0.0f);
    return;
  }
  const int e = Int8Exponent(largest);
  out[0] = static_cast<int8_t>(e);
  Select(v, len, m, index);
  const float down = std::ldexp(1.0f, -e);
  const float up = std::ldexp(1.0f, e);
  if (residual != nullptr) std::copy(v, v + len, residual);
  for (size_t j = 0; j < m; ++j) {
    const float x = v[index[j]];
    const float r = std::nearbyint(std::clamp(x * down, -127.0f, 127.0f));
    q[j] = static_cast<int8_t>(r);
    if (residual != nullptr) residual[index[j]] = x - r * up;
  }
}

}  // namespace

size_t TopKBytes(int64_t offset, size_t n, int keep) {
  size_t bytes = 0;
  ForEachChunk(offset, n, [&](ChunkAt c) { bytes += 1 + 2 * Kept(keep, c.len); });
  return bytes;
}

void EncodeTopK(const float* in, size_t n, int64_t offset, int keep, void* out,
                float* residual) {
  auto* at = static_cast<int8_t*>(out);
  ForEachChunk(offset, n, [&](ChunkAt c) {
    const size_t m = Kept(keep, c.len);
    EncodeChunk(in + c.at, c.len, m, residual != nullptr ? residual + c.at : nullptr, at);
    at += 1 + 2 * m;
  });
}

bool TopKWellFormed(const void* in, size_t n, int64_t offset, int keep) {
  if (keep < 1 || keep > 255) return false;
  const auto* at = static_cast<const uint8_t*>(in);
  bool ok = true;
  ForEachChunk(offset, n, [&](ChunkAt c) {
    const size_t m = Kept(keep, c.len);
    const uint8_t* index = at + 1;
    for (size_t j = 0; j < m; ++j) {
      ok &= index[j] < c.len && (j == 0 || index[j] > index[j - 1]);
    }
    at += 1 + 2 * m;
  });
  return ok;
}

void DecodeTopK(const void* in, size_t n, int64_t offset, int keep, float* out) {
  if (n == 0) return;
  std::fill(out, out + n, 0.0f);
  const auto* at = static_cast<const int8_t*>(in);
  ForEachChunk(offset, n, [&](ChunkAt c) {
    const size_t m = Kept(keep, c.len);
    const int e = at[0];
    const auto* index = reinterpret_cast<const uint8_t*>(at + 1);
    const int8_t* q = at + 1 + m;
    at += 1 + 2 * m;
    if (e == kInt8NonFinite) {
      std::fill(out + c.at, out + c.at + c.len, std::numeric_limits<float>::quiet_NaN());
      return;
    }
    // An exponent outside the encoder's range comes from a corrupt frame; it decodes to a
    // float like any other (Inf at worst), which the finite check refuses.
    const float up = std::ldexp(1.0f, e);
    for (size_t j = 0; j < m; ++j) {
      if (index[j] < c.len) out[c.at + index[j]] = static_cast<float>(q[j]) * up;
    }
  });
}

std::optional<int> TopKKeepFor(double density) {
  if (!(density > 0.0 && density <= 1.0)) return std::nullopt;
  const double keep = std::round(density * static_cast<double>(kTopKChunk));
  return static_cast<int>(std::clamp(keep, 1.0, 255.0));
}

}  // namespace parasync
