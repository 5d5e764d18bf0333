#include "ps/request_frames.h"

#include <algorithm>
#include <cstring>

#include "common/float_codec.h"

namespace parasync {

namespace {

// A float32 frame's values: the frame itself when it is aligned (ZeroMQ frames need not be),
// else a copy appended to `copies`.
const float* AlignedFloats(const zmq::message_t& frame, std::vector<std::vector<float>>& copies) {
  if (reinterpret_cast<uintptr_t>(frame.data()) % alignof(float) == 0) {
    return static_cast<const float*>(frame.data());
  }
  copies.emplace_back(frame.size() / sizeof(float));
  std::memcpy(copies.back().data(), frame.data(), frame.size());
  return copies.back().data();
}

// The ids of a request's `n` ids frames, frames[first + k * stride], copied out (ZeroMQ
// frames need not be 8-byte aligned); kByteLength when one is not a whole number of uint64s.
Status ReadIdsFrames(const std::vector<zmq::message_t>& frames, size_t first, size_t stride,
                     size_t n, std::vector<std::vector<uint64_t>>* ids, RejectReason* reason) {
  ids->resize(n);
  for (size_t k = 0; k < n; ++k) {
    const zmq::message_t& frame = frames[first + k * stride];
    if (frame.size() % sizeof(uint64_t) != 0) {
      *reason = RejectReason::kByteLength;
      return Status::InvalidArgument("an ids frame is not a whole number of uint64s");
    }
    (*ids)[k].resize(frame.size() / sizeof(uint64_t));
    if (frame.size() != 0) std::memcpy((*ids)[k].data(), frame.data(), frame.size());
  }
  return Status::Ok();
}

}  // namespace

Status ReadRegisterValues(const Header& req, const std::vector<zmq::message_t>& frames,
                          std::vector<std::span<const uint8_t>>* values, RejectReason* reason) {
  if (frames.size() != req.slices.size() || (!req.slices.empty() && req.dtype != DType::kFloat32)) {
    *reason = RejectReason::kFrameCount;
    return Status::InvalidArgument(
        "a registration with " + std::to_string(req.slices.size()) + " ranges of initial values "
        "carries " + std::to_string(frames.size()) + " frames (float32, one per range)");
  }
  for (const zmq::message_t& f : frames) {
    values->emplace_back(static_cast<const uint8_t*>(f.data()), f.size());
  }
  return Status::Ok();
}

Status ReadPull(const Header& req, const std::vector<zmq::message_t>& frames, const Shard& shard,
                std::vector<std::vector<uint64_t>>* row_ids, RejectReason* reason) {
  if (frames.size() != req.rows.size()) {
    *reason = RejectReason::kFrameCount;
    return Status::InvalidArgument(
        "a pull request carries one ids frame per row range and no tensor frames");
  }
  PARASYNC_RETURN_IF_ERROR(shard.ValidateRanges(req.slices, req.wire(), std::nullopt, reason));
  PARASYNC_RETURN_IF_ERROR(ReadIdsFrames(frames, 0, 1, req.rows.size(), row_ids, reason));
  return shard.ValidateRows(req.rows, *row_ids, req.dtype, std::nullopt, reason);
}

Status CheckGroupPush(const Header& req, int num_workers, const TrainingMode& mode,
                      RejectReason* reason) {
  if (mode.kind != TrainingMode::Kind::kSync) {
    std::string ranks;
    for (int32_t r : req.ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    *reason = RejectReason::kUnsupported;
    return Status::FailedPrecondition(
        "a local group's push (summing the gradients of ranks " + ranks +
        ") needs a sync mode: in " + mode.ToString() + " every worker's gradient is its own update");
  }
  if (!req.rows.empty()) {
    *reason = RejectReason::kUnsupported;
    return Status::InvalidArgument("a local group's push carries no embedding rows");
  }
  std::vector<int32_t> seen;
  for (int32_t r : req.ranks) {
    if (r < 0 || r >= num_workers || r == req.rank ||
        std::find(seen.begin(), seen.end(), r) != seen.end()) {
      *reason = RejectReason::kBadRank;
      return Status::InvalidArgument("a local group's push names rank " + std::to_string(r) +
                                     ": not another rank of the " + std::to_string(num_workers) +
                                     " workers, or twice");
    }
    seen.push_back(r);
  }
  return Status::Ok();
}

Status CheckPush(const Header& req, const std::vector<zmq::message_t>& in_frames,
                 const Shard& shard, RejectReason* reason) {
  // The slices' frames, then an ids frame and a values frame per row range.
  if (in_frames.size() != req.slices.size() + 2 * req.rows.size() && !req.rows.empty()) {
    *reason = RejectReason::kFrameCount;
    return Status::InvalidArgument(
        "a push with " + std::to_string(req.slices.size()) + " slice ranges and " +
        std::to_string(req.rows.size()) + " row ranges carries " +
        std::to_string(in_frames.size()) + " frames");
  }
  std::vector<size_t> sizes;
  sizes.reserve(in_frames.size());
  for (size_t i = 0; i < in_frames.size() - 2 * req.rows.size(); ++i) {
    sizes.push_back(in_frames[i].size());
  }
  PARASYNC_RETURN_IF_ERROR(
      shard.ValidateRanges(req.slices, req.wire(), std::span<const size_t>(sizes), reason));
  if (req.dtype == DType::kTopK) {
    // A top-k frame's indices say where its values go: one out of place would write there.
    for (size_t i = 0; i < req.slices.size(); ++i) {
      const SliceRange& r = req.slices[i];
      if (!WellFormedRange(in_frames[i].data(), static_cast<size_t>(r.count),
                           shard.slice_map()->slices()[r.slice_id].offset + r.begin, req.wire())) {
        *reason = RejectReason::kMalformed;
        return Status::InvalidArgument("tensor frame " + std::to_string(i) +
                                       " is not a top-k frame: its indices are out of order "
                                       "or outside their chunk");
      }
    }
  }
  if (req.batch_examples < 0 || req.batch_examples > (int64_t{1} << 31)) {
    *reason = RejectReason::kMalformed;
    return Status::InvalidArgument("batch_examples " + std::to_string(req.batch_examples) +
                                   " is out of range");
  }
  const DataProgress& p = req.progress;
  if (p.epoch < 0 || p.of < 0 || p.of > (int64_t{1} << 40) || p.done < 0 || p.done > p.of ||
      (p.epoch == 0 && (p.done != 0 || p.of != 0))) {
    *reason = RejectReason::kMalformed;
    return Status::InvalidArgument(
        "progress epoch " + std::to_string(p.epoch) + ", " + std::to_string(p.done) + " of " +
        std::to_string(p.of) + " examples is not a position in a data shard");
  }
  return Status::Ok();
}

Status ReadPushRowIds(const Header& req, const std::vector<zmq::message_t>& in_frames,
                      const Shard& shard, std::vector<std::vector<uint64_t>>* ids,
                      RejectReason* reason) {
  const size_t first = req.slices.size();
  const size_t n = req.rows.size();
  PARASYNC_RETURN_IF_ERROR(ReadIdsFrames(in_frames, first, 2, n, ids, reason));
  std::vector<size_t> value_bytes(n);
  for (size_t k = 0; k < n; ++k) value_bytes[k] = in_frames[first + 2 * k + 1].size();
  return shard.ValidateRows(req.rows, *ids, req.dtype, std::span<const size_t>(value_bytes),
                             reason);
}

std::vector<const float*> GradientReader::Read(const Header& req, const SliceMap& map,
                                               const std::vector<zmq::message_t>& in_frames,
                                               std::vector<std::vector<float>>& realigned,
                                               std::vector<const float*>* row_grads) {
  // The slices' frames, then each row range's ids and values frames.
  const size_t first = req.slices.size();
  std::vector<const float*> grads;
  grads.reserve(first);
  row_grads->clear();
  if (req.dtype != DType::kFloat32) {
    // A 16-bit or int8 wire dtype: widened to float32 before the finite check and the
    // optimizer see it (NaN and Inf survive the narrowing, so the check still catches them).
    // Rows are never int8 (Shard::ValidateRows), so their counts are bytes over the size.
    const size_t size = DTypeSize(req.dtype);
    size_t total = 0;
    for (size_t i = 0; i < first; ++i) total += static_cast<size_t>(req.slices[i].count);
    for (size_t k = 0; k < req.rows.size(); ++k) {
      total += in_frames[first + 2 * k + 1].size() / size;
    }
    if (widened_.size() < total) widened_.resize(total);
    float* at = widened_.data();
    auto widen = [&](const zmq::message_t& frame, size_t count, int64_t offset) {
      DecodeRange(frame.data(), count, offset, req.wire(), at);
      at += count;
      return at - count;
    };
    for (size_t i = 0; i < first; ++i) {
      const SliceRange& r = req.slices[i];
      grads.push_back(widen(in_frames[i], static_cast<size_t>(r.count),
                            map.slices()[r.slice_id].offset + r.begin));
    }
    for (size_t k = 0; k < req.rows.size(); ++k) {
      const zmq::message_t& values = in_frames[first + 2 * k + 1];
      row_grads->push_back(widen(values, values.size() / size, 0));
    }
    return grads;
  }
  for (size_t i = 0; i < first; ++i) grads.push_back(AlignedFloats(in_frames[i], realigned));
  for (size_t k = 0; k < req.rows.size(); ++k) {
    row_grads->push_back(AlignedFloats(in_frames[first + 2 * k + 1], realigned));
  }
  return grads;
}

}  // namespace parasync
