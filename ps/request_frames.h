// What the frames of a pull or push carry, checked against the shard and read out before
// anything is touched: the ids frames of embedding row ranges, a push's layout and fields,
// and its gradients as float32 arrays. ZeroMQ frames need not be aligned and may carry a
// 16-bit wire dtype, so the readers copy or widen where they must.
//
// Not thread-safe (GradientReader keeps a buffer): the server loop owns them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <zmq.hpp>

#include "common/status.h"
#include "common/wire.h"
#include "ps/reject_reason.h"
#include "ps/shard.h"

namespace parasync {

// The ids of a request's `n` ids frames, frames[first + k * stride], copied out (ZeroMQ
// frames need not be 8-byte aligned); kByteLength when one is not a whole number of uint64s.
Status ReadIdsFrames(const std::vector<zmq::message_t>& frames, size_t first, size_t stride,
                     size_t n, std::vector<std::vector<uint64_t>>* ids, RejectReason* reason);

// The fields of a push that make sense: its frames (the slices', then an ids and a values
// frame per row range) against `shard`'s ranges, its batch size and its data position. On
// failure sets *reason.
Status CheckPush(const Header& req, const std::vector<zmq::message_t>& in_frames,
                 const Shard& shard, RejectReason* reason);

// A push's row ranges: their ids (ReadPushRowIds, before the push is admitted) and
// gradients (GradientReader, after).
struct PushRows {
  std::vector<std::vector<uint64_t>> ids;
  std::vector<const float*> grads;
  RowsRequest request(const Header& req) const { return {req.rows, ids, grads}; }
};
// The ids of a push's row ranges, checked with their values frames' lengths
// (Shard::ValidateRows); on failure sets *reason.
Status ReadPushRowIds(const Header& req, const std::vector<zmq::message_t>& in_frames,
                      const Shard& shard, std::vector<std::vector<uint64_t>>* ids,
                      RejectReason* reason);

class GradientReader {
 public:
  // The push's gradients as float32 arrays, the slices' returned and its row ranges' in
  // *row_grads: its frames, or (16-bit dtypes) this reader's buffer, or copies in
  // `realigned` for frames that are not aligned. Valid until the next Read. Precondition:
  // CheckPush and ReadPushRowIds ok (frame sizes).
  std::vector<const float*> Read(const Header& req, const std::vector<zmq::message_t>& in_frames,
                                 std::vector<std::vector<float>>& realigned,
                                 std::vector<const float*>* row_grads);

 private:
  // A push in a 16-bit wire dtype, widened to float32 (at most the shard's elements; kept
  // between pushes so its pages are not faulted in again each time).
  std::vector<float> widened_;
};

}  // namespace parasync
