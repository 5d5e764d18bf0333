#include "common/int8_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace parasync {
namespace {

// The smallest exponent in range with m <= 127 * 2^e, for a finite m > 0. m = f * 2^k with
// f in [0.5, 1): 127 * 2^(k-7) = 2^k * 127/128, so e = k - 7 when f <= 127/128, else k - 6.
int ExponentFor(float m) {
  int k = 0;
  const float f = std::frexp(m, &k);
  const int e = f <= 127.0f / 128.0f ? k - 7 : k - 6;
  return std::clamp(e, kInt8MinExponent, kInt8MaxExponent);
}

// One chunk's elements [0, n): v = in (+ residual), quantized into q; returns its exponent.
int8_t EncodeChunk(const float* in, size_t n, int8_t* q, float* residual, float* v) {
  float m = 0.0f;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    v[i] = residual != nullptr ? in[i] + residual[i] : in[i];
    finite &= std::isfinite(v[i]);
    m = std::max(m, std::fabs(v[i]));
  }
  if (!finite) {
    std::memset(q, 0, n);
    if (residual != nullptr) std::fill(residual, residual + n, 0.0f);
    return kInt8NonFinite;
  }
  const int e = m > 0.0f ? ExponentFor(m) : kInt8MinExponent;
  const float down = std::ldexp(1.0f, -e);  // exact: -e is within a float's exponents
  const float up = std::ldexp(1.0f, e);
  for (size_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(std::clamp(v[i] * down, -127.0f, 127.0f));
    q[i] = static_cast<int8_t>(r);
    if (residual != nullptr) residual[i] = v[i] - r * up;
  }
  return static_cast<int8_t>(e);
}

}  // namespace

size_t Int8Chunks(int64_t offset, size_t n) {
  if (n == 0) return 0;
  const int64_t first = offset / kInt8Chunk;
  const int64_t last = (offset + static_cast<int64_t>(n) - 1) / kInt8Chunk;
  return static_cast<size_t>(last - first + 1);
}

void EncodeInt8(const float* in, size_t n, int64_t offset, void* out, float* residual) {
  auto* bytes = static_cast<int8_t*>(out);
  const size_t chunks = Int8Chunks(offset, n);
  int8_t* q = bytes + chunks;
  float v[kInt8Chunk];
  size_t at = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const auto in_chunk = static_cast<size_t>((offset + static_cast<int64_t>(at)) % kInt8Chunk);
    const size_t len = std::min(n - at, static_cast<size_t>(kInt8Chunk) - in_chunk);
    bytes[c] = EncodeChunk(in + at, len, q + at, residual != nullptr ? residual + at : nullptr, v);
    at += len;
  }
}

void DecodeInt8(const void* in, size_t n, int64_t offset, float* out) {
  const auto* bytes = static_cast<const int8_t*>(in);
  const size_t chunks = Int8Chunks(offset, n);
  const int8_t* q = bytes + chunks;
  size_t at = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const auto in_chunk = static_cast<size_t>((offset + static_cast<int64_t>(at)) % kInt8Chunk);
    const size_t len = std::min(n - at, static_cast<size_t>(kInt8Chunk) - in_chunk);
    const int e = bytes[c];
    if (e == kInt8NonFinite) {
      std::fill(out + at, out + at + len, std::numeric_limits<float>::quiet_NaN());
    } else {
      // An exponent outside the encoder's range comes from a corrupt frame; it decodes to a
      // float like any other (Inf at worst), which the finite check refuses.
      const float up = std::ldexp(1.0f, e);
      for (size_t i = at; i < at + len; ++i) out[i] = static_cast<float>(q[i]) * up;
    }
    at += len;
  }
}

}  // namespace parasync
