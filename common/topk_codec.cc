#include "common/topk_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
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

// Eight magnitudes at a time (each at most 127): a byte's top bit after adding 128 - t is
// set exactly when it is at least t, and no sum carries into the next byte.
uint64_t AtLeastBits(const uint8_t* magnitude, int t) {
  uint64_t word = 0;
  std::memcpy(&word, magnitude, 8);
  return (word + static_cast<uint64_t>(0x80 - t) * 0x0101010101010101ull) & 0x8080808080808080ull;
}

// One chunk's part: v = in (+ residual), its m kept elements into e, index and q (bytes
// [0, 1 + 2m) of `out`), the residual left with what was not sent.
//
// The m sent are those of largest quantized magnitude |q| = round(|v| / 2^e) (ties: the lower
// index), found by counting the 128 values |q| can take: what an element sends is its q, so
// two of one |q| send the same and either may wait in the residual. int8's quantization of
// the chunk, a pass to count, one over the counts and one over the candidates only.
void EncodeChunk(const float* in, size_t len, size_t m, float* residual, int8_t* out) {
  float v[kTopKChunk];
  int8_t quantized[kTopKChunk];
  const int8_t e = QuantizeInt8Chunk(in, len, quantized, residual, v);
  out[0] = e;
  auto* index = reinterpret_cast<uint8_t*>(out + 1);
  int8_t* q = out + 1 + m;
  if (e == kInt8NonFinite) {  // q and the residual are 0
    for (size_t j = 0; j < m; ++j) index[j] = static_cast<uint8_t>(j);
    std::memset(q, 0, m);
    return;
  }
  uint8_t magnitude[kTopKChunk];
  for (size_t i = 0; i < len; ++i) {
    magnitude[i] = static_cast<uint8_t>(quantized[i] < 0 ? -quantized[i] : quantized[i]);
  }
  // The largest magnitude t that at least m elements reach, and how many of t itself go.
  uint16_t count[128] = {};
  for (size_t i = 0; i < len; ++i) ++count[magnitude[i]];
  size_t above = 0;
  int t = 127;
  for (; t > 0 && above + count[t] < m; --t) above += count[t];
  size_t ties = m - above;
  const auto threshold = static_cast<uint8_t>(t);
  // Only the candidates (AtLeastBits) are looked at, in index order, until m are taken.
  size_t k = 0;
  auto consider = [&](size_t i) {
    if (magnitude[i] > threshold || (magnitude[i] == threshold && ties > 0)) {
      if (magnitude[i] == threshold) --ties;
      index[k] = static_cast<uint8_t>(i);
      q[k++] = quantized[i];
    }
  };
  size_t i = 0;
  for (; i + 8 <= len && k < m; i += 8) {
    for (uint64_t hit = AtLeastBits(magnitude + i, t); hit != 0 && k < m; hit &= hit - 1) {
      consider(i + static_cast<size_t>(std::countr_zero(hit) / 8));
    }
  }
  for (; i < len && k < m; ++i) {
    if (magnitude[i] >= threshold) consider(i);
  }
  if (residual == nullptr) return;
  // QuantizeInt8Chunk left v - q 2^e everywhere; what was not sent keeps all of v.
  const float up = std::ldexp(1.0f, e);
  std::copy(v, v + len, residual);
  for (size_t j = 0; j < m; ++j) residual[index[j]] = v[index[j]] - static_cast<float>(q[j]) * up;
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
