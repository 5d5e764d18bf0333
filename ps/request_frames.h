// What the frames of a request carry, checked and read out before anything is touched: a
// Register's initial values, a pull's ranges and row ids, a push's layout, fields and row
// ids (against the shard), and its gradients as float32 arrays. ZeroMQ frames need not be aligned and may carry a
// 16-bit wire dtype, so the readers copy or widen where they must.
//
// Not thread-safe (GradientReader keeps a buffer): the server loop owns them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <zmq.hpp>

#include "common/status.h"
#include "common/mode.h"
#include "common/wire.h"
#include "ps/reject_reason.h"
#include "ps/shard.h"

namespace parasync {

// A Register's initial values (rank 0's, for kProvided variables): one float32 frame per
// slice range, as bytes that point into `frames`. On failure sets *reason.
Status ReadRegisterValues(const Header& req, const std::vector<zmq::message_t>& frames,
                          std::vector<std::span<const uint8_t>>* values, RejectReason* reason);

// A pull's frames (one ids frame per row range, no tensor frames) and its slice and row
// ranges against `shard`; the ids of its row ranges in *row_ids. On failure sets *reason.
Status ReadPull(const Header& req, const std::vector<zmq::message_t>& frames, const Shard& shard,
                std::vector<std::vector<uint64_t>>* row_ids, RejectReason* reason);

// A local group's push (header.ranks: the other workers whose gradients it sums, worker/
// local_group.h): only in a sync mode (in async and ssp each worker's gradient is its own
// update), without embedding rows, naming ranks of the cluster other than the sender's, each
// once. On failure sets *reason.
Status CheckGroupPush(const Header& req, int num_workers, const TrainingMode& mode,
                      RejectReason* reason);

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
  // CheckPush and ReadPushRowIds ok (frame sizes); `map` is the shard's.
  std::vector<const float*> Read(const Header& req, const SliceMap& map,
                                 const std::vector<zmq::message_t>& in_frames,
                                 std::vector<std::vector<float>>& realigned,
                                 std::vector<const float*>* row_grads);

 private:
  // A push in a 16-bit wire dtype, widened to float32 (at most the shard's elements; kept
  // between pushes so its pages are not faulted in again each time).
  std::vector<float> widened_;
};

}  // namespace parasync
