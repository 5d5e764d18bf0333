// top-k on the wire (--wire-dtype topk:R): the largest elements of every chunk, in int8, with
// error feedback; what is not sent waits in the sender's residual for a later step.
//
// A variable's elements are cut into chunks of kTopKChunk at fixed positions of the variable
// (element i is in chunk i / kTopKChunk), as int8's are (common/int8_codec.h), so a slice's
// edge only ever splits a chunk and any number of servers sees the same selection elsewhere.
// Of each chunk's len elements in a range, m = min(keep, len) are sent: those of largest
// quantized magnitude |q| (below; ties: the lower index; two elements of one |q| send the
// same value, so which one waits in the residual is immaterial). `keep` (1..255, the
// Header's topk_keep) is R * 256 rounded: a tensor of at most `keep` elements goes whole, one
// a little larger nearly so (small tensors stay dense). Each chunk touched costs 1 + 2m
// bytes, in order:
//
//   [ e ][ m indices, strictly increasing, each < len, into the chunk's part of the range ]
//        [ m signed bytes q ]
//
// and element `index` of the chunk is q * 2^e, every other one 0. e is int8's exponent of the
// chunk's largest magnitude (Int8Exponent), q is rounded to nearest, ties to even, so a kept
// element is within 2^(e-1) of what was given. A chunk holding NaN or Inf is sent as
// e = -128 with indices 0..m-1 and decodes to NaN throughout (the finite check and an AMP
// GradScaler still see the step), its residual reset to zero.
//
// Error feedback: with a residual r the sender selects from v = x + r and keeps r = v - sent
// (exact, as int8's: every unsent element whole, every sent one's rounding error), so over
// steps what was sent plus the residual is what was given. Encoding a decoded range again
// gives the same values (its nonzeros are among the m largest; the exponent is the same).
// Selection counts the 128 values |q| takes: a few passes over each chunk, whatever m is.
//
// Density: keep 8 (R = 1/32) sends 17 bytes per 256 elements, 1/60 of float32's.
// Pure functions; thread-safe; any alignment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace parasync {

inline constexpr int64_t kTopKChunk = 256;
inline constexpr int kTopKDefaultKeep = 8;  // "topk" alone: R = 1/32

// Wire bytes of `n` elements from element `offset` of a variable, `keep` (1..255) per chunk.
size_t TopKBytes(int64_t offset, size_t n, int keep);

// Writes in[0, n), elements offset..offset+n of a variable, as TopKBytes(offset, n, keep)
// bytes into `out`. With a `residual` of n floats, selects from in + residual and leaves
// there what was not sent; without one, from `in` itself.
void EncodeTopK(const float* in, size_t n, int64_t offset, int keep, void* out,
                float* residual);
// Whether TopKBytes(offset, n, keep) bytes are a frame EncodeTopK could have written: every
// chunk's indices strictly increasing and inside its part of the range. What a receiver
// checks before it decodes.
bool TopKWellFormed(const void* in, size_t n, int64_t offset, int keep);
// Reads such a frame into `n` floats (the unsent ones 0). An index the check refuses is
// skipped (never written out of range).
void DecodeTopK(const void* in, size_t n, int64_t offset, int keep, float* out);

// `keep` for a density R in (0, 1]: R * kTopKChunk rounded, within [1, 255]; nullopt for an R
// outside (0, 1] or not a number.
std::optional<int> TopKKeepFor(double density);

}  // namespace parasync
