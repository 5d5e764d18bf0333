// int8 and int4 on the wire (--wire-dtype int8, int4): a quarter or an eighth of float32's
// bytes, with error feedback.
//
// A variable's elements are cut into chunks of kInt8Chunk at fixed positions of the variable
// (element i is in chunk i / kInt8Chunk), wherever the servers' slices begin: the same
// values quantize the same way for any number of servers but in a chunk that a slice's edge
// cuts (each side is quantized alone). Each chunk that a range touches costs one exponent
// byte e, then every element one signed byte q, and the value sent is q * 2^e:
//
//   [ e of each chunk touched, in order ][ q of each element, in order ]
//
// e is the smallest in [kInt8MinExponent, kInt8MaxExponent] with max|v| <= 127 * 2^e over
// the chunk's elements in the range; q = v / 2^e rounded to nearest, ties to even, clamped
// to [-127, 127]. The scale being a power of two, q * 2^e is exact, and encoding a decoded
// range again gives the same bytes. A chunk holding NaN or Inf is sent as e = -128 and
// decodes to NaN throughout, so the server's finite check and an AMP GradScaler still see
// the bad step. Every element of a chunk is then within 2^(e-1) of what was given, which is
// less than 1/127 of the chunk's largest magnitude (the scale being a power of two, up to
// twice what max/127 would be: about 7 bits of precision instead of 8, for exact and
// idempotent decoding and one byte of scale instead of four).
//
// Error feedback: with a residual r, the sender quantizes v = x + r and keeps r = v - sent
// (exact: v and what was sent are within a factor of two, or what was sent is zero), so
// what was not sent this time is added to the next: over steps, the sum of what was sent
// plus the residual is the sum of what was given. A non-finite chunk's residual is reset
// to zero (its step is skipped; the residual must not carry NaN into every later one).
// int4 (--wire-dtype int4): the same chunks, exponents and error feedback with q in [-7, 7]
// (e the smallest with max|v| <= 7 * 2^e), two elements a byte, so an eighth of float32's
// bytes and every element within 2^(e-1) < 1/7 of its chunk's largest magnitude; the
// residual carries the rest to the next step, as int8's does:
//
//   [ e of each chunk touched, in order ][ q of element 2j | q of element 2j+1 << 4, ... ]
//
// (element i of the range in byte i / 2, its low four bits for an even i, two's
// complement; a range of odd length ends in a high half of 0). A decoder reads any byte;
// -8, which the encoder never writes, decodes to -8 * 2^e.
//
// Pure functions; thread-safe; any alignment.
#pragma once

#include <cstddef>
#include <cstdint>

namespace parasync {

inline constexpr int64_t kInt8Chunk = 128;
inline constexpr int kInt8MinExponent = -110;  // 2^-110 * q stays a normal float
inline constexpr int kInt8MaxExponent = 121;   // 127 * 2^121 is still finite
inline constexpr int8_t kInt8NonFinite = -128;
inline constexpr int kInt8Levels = 127;
inline constexpr int kInt4Levels = 7;

// The smallest exponent e in [kInt8MinExponent, kInt8MaxExponent] with m <= 127 * 2^e, for
// the largest magnitude m of a chunk (kInt8MinExponent when m is 0). common/topk_codec.h
// scales its kept values the same way.
int Int8Exponent(float m);
// The same for q in [-levels, levels], levels = 2^b - 1 (int8: 127, int4: 7).
int QuantizedExponent(float m, int levels);

// One chunk's elements [0, n) (a chunk or a part of one, any n), as EncodeInt8 sends them:
// v[i] = in[i] (+ residual[i]), q[i] = v[i] / 2^e rounded, and with a residual, residual[i] =
// v[i] - q[i] 2^e; returns e, or kInt8NonFinite when some v is NaN or Inf (q and the
// residual then 0). What common/topk_codec.h sends a part of.
int8_t QuantizeInt8Chunk(const float* in, size_t n, int8_t* q, float* residual, float* v);
// The same with q in [-levels, levels] (int4: kInt4Levels).
int8_t QuantizeChunk(const float* in, size_t n, int levels, int8_t* q, float* residual,
                     float* v);

// Chunks touched by `n` elements from element `offset` of a variable (0 when n is 0).
size_t Int8Chunks(int64_t offset, size_t n);
// Wire bytes of that range: Int8Chunks(offset, n) + n.
inline size_t Int8Bytes(int64_t offset, size_t n) { return Int8Chunks(offset, n) + n; }

// Writes `in[0, n)`, elements offset..offset+n of a variable, as Int8Bytes(offset, n) bytes
// into `out`. With a `residual` of n floats, quantizes in + residual and leaves there what
// was not sent (above); without one, quantizes `in` itself.
void EncodeInt8(const float* in, size_t n, int64_t offset, void* out, float* residual);
// Reads Int8Bytes(offset, n) bytes written by EncodeInt8 into `n` floats.
void DecodeInt8(const void* in, size_t n, int64_t offset, float* out);

// Delta pulls (ps/delta_pulls.h): a reader holds a copy `base` of parameters; the server
// keeps the same copy and sends `target - base` in int8, and both add what was sent to their
// copy, so the copies stay equal bit for bit and what was not sent stays in the difference
// for the next pull (error feedback without a residual of its own). EncodeInt8Delta writes
// target[0, n) - base[0, n) as EncodeInt8 does (`base` null: zeros) and sets next[0, n) to
// base plus the sent values, exactly as AddInt8 would (`next` may be `base`); AddInt8 adds
// what Int8Bytes(offset, n) bytes decode to into out[0, n) (a non-finite chunk makes its
// elements NaN). The sum q * 2^e is exact, and base + it rounds the same way on both sides.
void EncodeInt8Delta(const float* target, const float* base, float* next, size_t n,
                     int64_t offset, void* out);
// `also` (n floats, or null): where the sums are written as well (a reader's parameters
// beside its copy, in the same pass).
void AddInt8(const void* in, size_t n, int64_t offset, float* out, float* also = nullptr);

// int4: the functions above with q in [-7, 7], two to a byte.
inline size_t Int4Bytes(int64_t offset, size_t n) { return Int8Chunks(offset, n) + (n + 1) / 2; }
void EncodeInt4(const float* in, size_t n, int64_t offset, void* out, float* residual);
void DecodeInt4(const void* in, size_t n, int64_t offset, float* out);
void EncodeInt4Delta(const float* target, const float* base, float* next, size_t n,
                     int64_t offset, void* out);
void AddInt4(const void* in, size_t n, int64_t offset, float* out, float* also = nullptr);

}  // namespace parasync
