// Wire dtypes: float32 tensors sent as bfloat16 or float16 (--wire-dtype), half the bytes.
//
// Parameters and optimizer state always stay float32; only the bytes on the wire narrow.
// A sender encodes, the receiver decodes back to float32 before anything else looks at the
// values (the finite check, the optimizer, the trainer).
//
// Rounding is to nearest, ties to even (what hardware conversions do). NaN stays NaN (quiet)
// and +-Inf stays +-Inf, so the server's finite check still sees a bad gradient. A finite
// value beyond the narrow type's range becomes its largest finite value of the same sign
// (float16: +-65504; bfloat16: +-3.39e38) instead of turning into Inf: narrowing alone never
// makes a good gradient look non-finite. Subnormals are kept (float16 below 6.1e-5 loses
// precision gradually, as the format does). Pure functions; thread-safe; any alignment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "common/variable.h"

namespace parasync {

// Bytes per element of `dtype` on the wire (int8: before its exponent bytes; top-k: per
// element sent, before its index and exponent bytes; int4: 1, its elements being two a
// byte — WireBytes).
inline size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kBfloat16:
    case DType::kFloat16: return 2;
    default: return 1;
  }
}
// int8, int4 and top-k: lossy beyond rounding, so their senders keep a residual (error feedback),
// their pulls of parameters travel as changes to the reader's copy (ps/delta_pulls.h)
// or in bfloat16, and embedding rows never use them.
inline bool HasErrorFeedback(DType dtype) {
  return dtype == DType::kInt8 || dtype == DType::kInt4 || dtype == DType::kTopK;
}
// Bytes on the wire of `n` elements of a variable, the first at element `offset` of it
// (only int8's, int4's and top-k's depend on where: common/int8_codec.h, common/topk_codec.h).
size_t WireBytes(WireFormat format, size_t n, int64_t offset);

// "float32", "bfloat16", "float16", "int8", "int4", "topk".
std::string_view DTypeName(DType dtype);
// Accepts the names above and bf16, fp16, f16, fp32, f32, i8, i4 (any case); nullopt otherwise.
std::optional<DType> ParseDType(std::string_view text);
// A --wire-dtype: a dtype name as above, or topk / topk:R for top-k sending a fraction R in
// (0, 1] of each chunk (common/topk_codec.h; topk alone: R = 1/32); nullopt otherwise.
std::optional<WireFormat> ParseWireFormat(std::string_view text);
// "topk:0.03125" for top-k (the density its keep gives), DTypeName otherwise.
std::string WireFormatName(WireFormat format);

uint16_t FloatToBfloat16(float value);
float Bfloat16ToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t bits);

// Writes `n` floats as `to` into `out` (n * DTypeSize(to) bytes, little-endian; int8 and
// top-k: as elements 0..n of a variable, WireBytes(to, n, 0) bytes, top-k at its default
// keep — EncodeRange for the others).
void EncodeFloats(const float* in, size_t n, DType to, void* out);
// Reads `n` elements of `from` (n * DTypeSize(from) bytes; int8 as above) into `out` as float32.
void DecodeFloats(const void* in, size_t n, DType from, float* out);

// Any wire format, int8, int4 and top-k included: `n` elements from element `offset` of a
// variable, as WireBytes(to, n, offset) bytes. `residual` (n floats, or null) is int8's and
// top-k's error feedback (EncodeInt8, EncodeTopK); the other dtypes ignore it.
void EncodeRange(const float* in, size_t n, int64_t offset, WireFormat to, void* out,
                 float* residual = nullptr);
// Whether WireBytes(from, n, offset) bytes can be decoded: false only for a top-k frame whose
// indices EncodeTopK cannot have written (TopKWellFormed), or a top-k keep outside 1..255.
bool WellFormedRange(const void* in, size_t n, int64_t offset, WireFormat from);
void DecodeRange(const void* in, size_t n, int64_t offset, WireFormat from, float* out);

// Delta pulls (ps/delta_pulls.h) in int8, int4 or top-k: EncodeDeltaRange writes target - base
// (`base` null: zeros) as EncodeRange would, without a residual, and sets `next` (which may
// be `base`) to base plus what the bytes decode to, exactly as AddRange computes it on the
// other side (int8: EncodeInt8Delta, AddInt8). AddRange adds what WireBytes(from, n, offset)
// bytes decode to into out[0, n), and writes the sums to `also` too when it is not null.
void EncodeDeltaRange(const float* target, const float* base, float* next, size_t n,
                      int64_t offset, WireFormat to, void* out);
void AddRange(const void* in, size_t n, int64_t offset, WireFormat from, float* out,
              float* also = nullptr);

// Whether EncodeFloats and DecodeFloats convert 8 elements at a time in this process
// (x86-64 with AVX2 and F16C), giving the scalar functions' bits either way.
bool FloatCodecIsVectorized();

// memcpy of `n` floats whose stores bypass the caches (x86-64: SSE2 streaming stores; plain
// memcpy elsewhere). For a destination too large to still be cached when it is next read:
// an ordinary store first reads the destination's cache line in, a streaming one does not,
// so a copy moves two bytes per byte instead of three. Ends with a store fence, so the
// values are published by the caller's next release (a lock, an atomic) like ordinary
// stores. `in` and `out` must not overlap; any alignment.
void CopyFloatsStreaming(const float* in, size_t n, float* out);

}  // namespace parasync
