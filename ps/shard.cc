#include "ps/shard.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/float_codec.h"
#include "ps/optimizer.h"

namespace parasync {

std::string_view RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kNone: return "none";
    case RejectReason::kMalformed: return "malformed";
    case RejectReason::kVersionMismatch: return "protocol_version";
    case RejectReason::kNotRegistered: return "not_registered";
    case RejectReason::kRegisterMismatch: return "register_mismatch";
    case RejectReason::kBadRegistration: return "bad_registration";
    case RejectReason::kUnknownSlice: return "unknown_slice";
    case RejectReason::kOrder: return "order";
    case RejectReason::kRange: return "range";
    case RejectReason::kByteLength: return "byte_length";
    case RejectReason::kFrameCount: return "frame_count";
    case RejectReason::kDType: return "dtype";
    case RejectReason::kNonFinite: return "non_finite";
    case RejectReason::kUnsupported: return "unsupported";
    case RejectReason::kBadRank: return "bad_rank";
    case RejectReason::kDuplicate: return "duplicate";
    case RejectReason::kBadVersion: return "bad_version";
    case RejectReason::kPartial: return "partial";
    case RejectReason::kBarrierTimeout: return "barrier_timeout";
    case RejectReason::kStoreFailed: return "store_failed";
    case RejectReason::kUnreadReplies: return "unread_replies";
    case RejectReason::kQueueFull: return "queue_full";
    case RejectReason::kCount: break;
  }
  return "unknown";
}

Shard::Shard(int shard_index, int num_shards, int64_t max_bytes, int apply_threads,
             int64_t max_table_rows)
    : shard_index_(shard_index),
      num_shards_(num_shards),
      max_bytes_(max_bytes),
      apply_threads_(apply_threads > 1 ? std::make_unique<ParallelFor>(apply_threads) : nullptr),
      tables_({shard_index, num_shards, max_table_rows}) {}

void Shard::set_table_options(const EmbeddingTables::Options& options) {
  tables_ = EmbeddingTables(options);
}

int64_t Shard::ExpiryNow() const {
  // The version a push makes, from 1: a stamp of 0 means none (ps/row_snapshot.h).
  if (!tables_.options().expire_in_seconds) return version_ + 1;
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Shard::ForEachRange(size_t n, bool parallel, const std::function<void(size_t)>& fn) const {
  if (!parallel || !apply_threads_) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  apply_threads_->ForEach(n, fn);
}

Status Shard::CheckInitialValues(const ModelRegistration& reg, const SliceMap& map,
                                 const ProvidedValues& values, RejectReason* reason) const {
  std::vector<uint32_t> provided;
  for (uint32_t id : map.SlicesOfShard(shard_index_)) {
    if (reg.variables[map.slices()[id].var_index].init.kind == InitKind::kProvided) {
      provided.push_back(id);
    }
  }
  if (values.ranges.size() != provided.size() || values.bytes.size() != provided.size()) {
    *reason = RejectReason::kBadRegistration;
    return Status::InvalidArgument(
        "the registration carries initial values for " + std::to_string(values.ranges.size()) +
        " slices, but shard " + std::to_string(shard_index_) + " holds " +
        std::to_string(provided.size()) + " slices of variables with provided values");
  }
  for (size_t i = 0; i < provided.size(); ++i) {
    const SliceInfo& info = map.slices()[provided[i]];
    const SliceRange& r = values.ranges[i];
    const std::string& name = reg.variables[info.var_index].name;
    if (r.slice_id != provided[i] || r.begin != 0 || r.count != info.length ||
        values.bytes[i].size() != static_cast<size_t>(info.length) * sizeof(float)) {
      *reason = RejectReason::kBadRegistration;
      return Status::InvalidArgument("the initial values of slice " + std::to_string(provided[i]) +
                                     " (" + name + ") do not cover it whole");
    }
    for (int64_t k = 0; k < info.length; ++k) {
      float v;
      std::memcpy(&v, values.bytes[i].data() + k * static_cast<int64_t>(sizeof(float)), sizeof v);
      if (!std::isfinite(v)) {
        *reason = RejectReason::kNonFinite;
        return Status::InvalidArgument("the initial value of " + name + " at element " +
                                       std::to_string(info.offset + k) + " is not finite");
      }
    }
  }
  return Status::Ok();
}

Status Shard::Register(const ModelRegistration& reg, RejectReason* reason,
                       const ProvidedValues& values) {
  if (registration_) {
    std::string diff = DescribeRegistrationMismatch(*registration_, reg);
    if (diff.empty()) return Status::Ok();
    *reason = RejectReason::kRegisterMismatch;
    return Status::FailedPrecondition("model differs from the one registered on shard " +
                                      std::to_string(shard_index_) + ": " + diff);
  }
  if (Status s = ValidateRegistration(reg); !s.ok()) {
    *reason = RejectReason::kBadRegistration;
    return s;
  }
  if (reg.num_shards != num_shards_) {
    *reason = RejectReason::kBadRegistration;
    return Status::InvalidArgument("worker expects " + std::to_string(reg.num_shards) +
                                   " parameter servers but this cluster has " +
                                   std::to_string(num_shards_));
  }
  auto map = SliceMap::Build(reg.variables, reg.max_slice_elements, reg.num_shards);
  if (!map.ok()) {
    *reason = RejectReason::kBadRegistration;
    return map.status();
  }
  const int num_slots = NumOptimizerSlots(reg.optimizer.kind);
  if (Status s = CheckModelFits(*map, num_slots); !s.ok()) {
    *reason = RejectReason::kBadRegistration;
    return s;
  }
  // Values are needed where this shard holds slices of kProvided variables (elsewhere the
  // model is the same whoever creates it).
  const std::vector<uint32_t>& mine = map->SlicesOfShard(shard_index_);
  const bool provided = std::any_of(mine.begin(), mine.end(), [&](uint32_t id) {
    return reg.variables[map->slices()[id].var_index].init.kind == InitKind::kProvided;
  });
  if (provided && values.empty()) {
    *reason = RejectReason::kNotRegistered;
    return Status::Unavailable("shard " + std::to_string(shard_index_) +
                               " has no model yet: its initial values come with rank 0's "
                               "registration");
  }
  if (provided || !values.empty()) {
    PARASYNC_RETURN_IF_ERROR(CheckInitialValues(reg, *map, values, reason));
  }
  local_index_.assign(map->slices().size(), -1);
  owned_.clear();
  size_t next_value = 0;
  for (uint32_t id : map->SlicesOfShard(shard_index_)) {
    const SliceInfo& info = map->slices()[id];
    SliceState state;
    state.values = LendableFloats(info.length);
    state.offset = info.offset;
    const Initializer& init = reg.variables[info.var_index].init;
    if (init.kind == InitKind::kProvided) {
      std::memcpy(state.values.data(), values.bytes[next_value++].data(),
                  static_cast<size_t>(info.length) * sizeof(float));
    } else {
      InitializeElements(init, reg.seed, info.var_index, info.offset, state.values.data(),
                         info.length);
    }
    state.slots.assign(static_cast<size_t>(num_slots),
                       std::vector<float>(static_cast<size_t>(info.length), 0.0f));
    local_index_[id] = static_cast<int32_t>(owned_.size());
    owned_.push_back(std::move(state));
  }
  registration_ = reg;
  map_ = std::move(map).value();
  tables_.Configure(reg.tables, reg.optimizer, reg.seed);
  return Status::Ok();
}

Status Shard::ValidateRows(std::span<const RowRange> ranges,
                           std::span<const std::vector<uint64_t>> ids, DType dtype,
                           std::optional<std::span<const size_t>> value_bytes,
                           RejectReason* reason) const {
  if (HasErrorFeedback(dtype) && !ranges.empty()) {
    // A row's residual would outlive the row's next pull by an unknown time: no int8 there.
    *reason = RejectReason::kDType;
    return Status::InvalidArgument("embedding rows are not sent in " +
                                   std::string(DTypeName(dtype)) +
                                   ": use float32, bfloat16 or float16");
  }
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (i > 0 && ranges[i].table <= ranges[i - 1].table) {
      *reason = RejectReason::kOrder;
      return Status::InvalidArgument("row ranges must name tables in strictly increasing order");
    }
    if (ranges[i].count != static_cast<int64_t>(ids[i].size())) {
      *reason = RejectReason::kByteLength;
      return Status::InvalidArgument("the ids frame of row range " + std::to_string(i) +
                                     " holds " + std::to_string(ids[i].size()) + " ids, not " +
                                     std::to_string(ranges[i].count));
    }
    std::optional<size_t> bytes;
    if (value_bytes) bytes = (*value_bytes)[i];
    PARASYNC_RETURN_IF_ERROR(tables_.Validate(ranges[i].table, ids[i], bytes, dtype, reason));
  }
  return Status::Ok();
}

Status Shard::CheckRowsFinite(const RowsRequest& rows, RejectReason* reason) const {
  for (size_t i = 0; i < rows.ranges.size(); ++i) {
    if (!tables_.AllFinite(rows.ranges[i].table, rows.ids[i], rows.grads[i])) {
      *reason = RejectReason::kNonFinite;
      return Status::InvalidArgument("gradient rows for table " +
                                     std::to_string(rows.ranges[i].table) +
                                     " contain NaN or Inf");
    }
  }
  return Status::Ok();
}

OptimizerSpec Shard::Effective(float lr_scale) const {
  OptimizerSpec opt = registration_->optimizer;
  opt.learning_rate *= lr_scale;
  return opt;
}

Status Shard::CheckModelFits(const SliceMap& map, int num_slots) const {
  int64_t here = 0;
  for (uint32_t id : map.SlicesOfShard(shard_index_)) here += map.slices()[id].length;
  // Values, their spare for copy-on-write (ApplyToSlice), and the slots.
  const int64_t bytes = here * (2 + num_slots) * static_cast<int64_t>(sizeof(float));
  if (max_bytes_ > 0 && bytes > max_bytes_) {
    return Status::InvalidArgument("the model needs " + std::to_string(bytes) +
                                   " bytes on shard " + std::to_string(shard_index_) +
                                   ", more than its limit of " + std::to_string(max_bytes_) +
                                   " (--max-model-bytes)");
  }
  // A worker pushes its whole share here in one message: it must fit the message bound.
  const int64_t push_bytes = here * static_cast<int64_t>(sizeof(float)) +
                             32 * static_cast<int64_t>(map.SlicesOfShard(shard_index_).size()) +
                             4096;
  if (max_message_bytes_ > 0 && push_bytes > max_message_bytes_) {
    return Status::InvalidArgument("a push of shard " + std::to_string(shard_index_) +
                                   "'s share of the model takes up to " +
                                   std::to_string(push_bytes) + " bytes, more than its limit of " +
                                   std::to_string(max_message_bytes_) +
                                   " (--max-message-bytes)");
  }
  return Status::Ok();
}

Status Shard::ValidateRanges(std::span<const SliceRange> ranges, WireFormat wire,
                             std::optional<std::span<const size_t>> frame_bytes,
                             RejectReason* reason) const {
  const DType dtype = wire.dtype;
  if (!registration_) {
    *reason = RejectReason::kNotRegistered;
    return Status::FailedPrecondition("shard " + std::to_string(shard_index_) +
                                      " has no model yet: send Register first");
  }
  if (dtype != DType::kFloat32 && dtype != DType::kBfloat16 && dtype != DType::kFloat16 &&
      dtype != DType::kInt8 && dtype != DType::kInt4 && dtype != DType::kTopK) {
    *reason = RejectReason::kDType;
    return Status::InvalidArgument(
        "dtype " + std::to_string(static_cast<int>(dtype)) +
        " is not a wire dtype (float32, bfloat16, float16, int8, int4 or topk)");
  }
  if (dtype == DType::kTopK && (wire.keep < 1 || wire.keep > 255)) {
    *reason = RejectReason::kDType;
    return Status::InvalidArgument("topk keeps " + std::to_string(wire.keep) +
                                   " elements per chunk: 1 to 255 are allowed");
  }
  if (frame_bytes && frame_bytes->size() != ranges.size()) {
    *reason = RejectReason::kFrameCount;
    return Status::InvalidArgument(std::to_string(frame_bytes->size()) + " tensor frames for " +
                                   std::to_string(ranges.size()) + " slice ranges");
  }
  for (size_t i = 0; i < ranges.size(); ++i) {
    const SliceRange& r = ranges[i];
    if (i > 0 && r.slice_id <= ranges[i - 1].slice_id) {
      *reason = RejectReason::kOrder;
      return Status::InvalidArgument("slice ids must be strictly increasing within a request (" +
                                     std::to_string(r.slice_id) + " follows " +
                                     std::to_string(ranges[i - 1].slice_id) + ")");
    }
    if (r.slice_id >= local_index_.size() || local_index_[r.slice_id] < 0) {
      *reason = RejectReason::kUnknownSlice;
      return Status::NotFound("slice " + std::to_string(r.slice_id) + " is not held by shard " +
                              std::to_string(shard_index_));
    }
    const int64_t length = map_->slices()[r.slice_id].length;
    if (r.begin < 0 || r.count < 0 || r.begin > length || r.count > length - r.begin) {
      *reason = RejectReason::kRange;
      return Status::InvalidArgument("range [" + std::to_string(r.begin) + ", +" +
                                     std::to_string(r.count) + ") is outside slice " +
                                     std::to_string(r.slice_id) + " of " +
                                     std::to_string(length) + " elements");
    }
    if (frame_bytes) {
      const size_t want = WireBytes(wire, static_cast<size_t>(r.count),
                                    map_->slices()[r.slice_id].offset + r.begin);
      if ((*frame_bytes)[i] != want) {
        *reason = RejectReason::kByteLength;
        return Status::InvalidArgument("tensor frame " + std::to_string(i) + " has " +
                                       std::to_string((*frame_bytes)[i]) + " bytes, expected " +
                                       std::to_string(want));
      }
    }
  }
  return Status::Ok();
}

void Shard::Read(std::span<const SliceRange> ranges, std::span<float* const> out) const {
  for (size_t i = 0; i < ranges.size(); ++i) {
    const SliceState& s = owned_[static_cast<size_t>(local_index_[ranges[i].slice_id])];
    std::memcpy(out[i], s.values.data() + ranges[i].begin,
                static_cast<size_t>(ranges[i].count) * sizeof(float));
  }
}

void Shard::Lend(std::span<const SliceRange> ranges, std::vector<Loan>& out) const {
  out.clear();
  for (const SliceRange& r : ranges) {
    const SliceState& s = owned_[static_cast<size_t>(local_index_[r.slice_id])];
    out.push_back({s.values.data() + r.begin, r.count, s.values.Lend(), s.values.size()});
  }
}

Status Shard::CheckFinite(std::span<const SliceRange> ranges, std::span<const float* const> grads,
                          RejectReason* reason, bool parallel) const {
  std::vector<uint8_t> finite(ranges.size(), 1);
  ForEachRange(ranges.size(), parallel,
               [&](size_t i) { finite[i] = IsAllFinite(grads[i], ranges[i].count) ? 1 : 0; });
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (finite[i] == 0) {
      *reason = RejectReason::kNonFinite;
      return Status::InvalidArgument("gradient for slice " + std::to_string(ranges[i].slice_id) +
                                     " contains NaN or Inf");
    }
  }
  return Status::Ok();
}

void Shard::ApplyToSlice(SliceState& s, int64_t begin, const float* grad, int64_t count,
                         float lr_scale) {
  ++s.updates;
  std::array<float*, kMaxOptimizerSlots> slot_ptrs{};
  for (size_t k = 0; k < s.slots.size(); ++k) slot_ptrs[k] = s.slots[k].data() + begin;
  const OptimizerSpec opt = Effective(lr_scale);
  const std::span<float* const> slots(slot_ptrs.data(), s.slots.size());
  if (!s.values.lent()) {
    ApplyUpdate(opt, s.updates, s.values.data() + begin, s.values.data() + begin, grad, slots,
                count);
    return;
  }
  // A pull reply is still sending these values: the update goes into another buffer (the
  // optimizer reads the old values and writes the new, the same traffic as in place), which
  // then becomes the slice's values, the old ones becoming the spare. The spare is reused
  // when no longer lent, else a buffer is allocated; one replaced while still lent is freed
  // by its last reply. One spare per slice is what --max-model-bytes counts.
  LendableFloats next = TakeSpare(s);
  const float* old = s.values.data();
  const size_t tail = static_cast<size_t>(begin + count);
  std::memcpy(next.data(), old, static_cast<size_t>(begin) * sizeof(float));
  std::memcpy(next.data() + tail, old + tail,
              (static_cast<size_t>(s.values.size()) - tail) * sizeof(float));
  ApplyUpdate(opt, s.updates, old + begin, next.data() + begin, grad, slots, count);
  s.spare = std::move(s.values);
  s.values = std::move(next);
}

Status Shard::Apply(std::span<const SliceRange> ranges, std::span<const float* const> grads,
                    int64_t batch_examples, RejectReason* reason, float lr_scale,
                    const RowsRequest& rows) {
  lr_scale *= LrScheduleFactor(registration_->optimizer, examples_);
  // Rows first: the slices' checks below may apply as they check (ApplySgdWhole), so nothing
  // may fail after them.
  PARASYNC_RETURN_IF_ERROR(CheckRowsFinite(rows, reason));
  int64_t elements = 0;
  for (const SliceRange& r : ranges) elements += r.count;
  const bool parallel = ranges.size() >= 2 && elements >= kParallelApplyElements;
  const bool streaming = elements >= kStreamingApplyElements;
  bool whole = registration_->optimizer.kind == OptimizerKind::kSgd;
  for (const SliceRange& r : ranges) {
    whole = whole && r.begin == 0 &&
            r.count == owned_[static_cast<size_t>(local_index_[r.slice_id])].values.size();
  }
  if (whole) {
    PARASYNC_RETURN_IF_ERROR(ApplySgdWhole(ranges, grads, reason, lr_scale, parallel, streaming));
  } else {
    // Every gradient is checked before any slice changes.
    PARASYNC_RETURN_IF_ERROR(CheckFinite(ranges, grads, reason, parallel));
    // ValidateRanges allows one range per slice: one optimizer step per slice, and the
    // slices of different threads are disjoint.
    ForEachRange(ranges.size(), parallel, [&](size_t i) {
      SliceState& s = owned_[static_cast<size_t>(local_index_[ranges[i].slice_id])];
      ApplyToSlice(s, ranges[i].begin, grads[i], ranges[i].count, lr_scale);
    });
  }
  if (!rows.empty()) {
    const OptimizerSpec opt = Effective(lr_scale);
    tables_.SetNow(ExpiryNow());
    if (Status st = tables_.Expire(); !st.ok()) {
      *reason = RejectReason::kStoreFailed;
      return st;
    }
    for (size_t i = 0; i < rows.ranges.size(); ++i) {
      // Only the cold tier can fail here (the server rolls back to its store).
      if (Status st = tables_.Apply(rows.ranges[i].table, rows.ids[i], rows.grads[i], opt);
          !st.ok()) {
        *reason = RejectReason::kStoreFailed;
        return st;
      }
    }
  }
  ++version_;
  examples_ += batch_examples > 0 ? batch_examples : 0;
  return Status::Ok();
}

LendableFloats Shard::TakeSpare(SliceState& s) {
  return s.spare.data() != nullptr && !s.spare.lent() ? std::move(s.spare)
                                                      : LendableFloats(s.values.size());
}

Status Shard::ApplySgdWhole(std::span<const SliceRange> ranges,
                            std::span<const float* const> grads, RejectReason* reason,
                            float lr_scale, bool parallel, bool streaming) {
  // Each slice's new values go into another buffer (its spare when that is not lent), in
  // the same pass that checks the gradient; the buffers become the values only once every
  // gradient proved finite, so a refused push changes nothing.
  std::vector<LendableFloats> next(ranges.size());
  std::vector<uint8_t> finite(ranges.size(), 0);
  const float lr = registration_->optimizer.learning_rate * lr_scale;
  const auto apply = streaming ? ApplySgdIfFiniteStreaming : ApplySgdIfFinite;
  ForEachRange(ranges.size(), parallel, [&](size_t i) {
    SliceState& s = owned_[static_cast<size_t>(local_index_[ranges[i].slice_id])];
    next[i] = TakeSpare(s);
    finite[i] = apply(lr, s.values.data(), next[i].data(), grads[i], ranges[i].count) ? 1 : 0;
  });
  const auto bad = std::find(finite.begin(), finite.end(), uint8_t{0});
  for (size_t i = 0; i < ranges.size(); ++i) {
    SliceState& s = owned_[static_cast<size_t>(local_index_[ranges[i].slice_id])];
    if (bad != finite.end()) {
      if (s.spare.data() == nullptr) s.spare = std::move(next[i]);  // keep it for next time
      continue;
    }
    ++s.updates;
    s.spare = std::move(s.values);
    s.values = std::move(next[i]);
  }
  if (bad != finite.end()) {
    *reason = RejectReason::kNonFinite;
    return Status::InvalidArgument(
        "gradient for slice " +
        std::to_string(ranges[static_cast<size_t>(bad - finite.begin())].slice_id) +
        " contains NaN or Inf");
  }
  return Status::Ok();
}

Status Shard::Accumulate(std::span<const SliceRange> ranges, std::span<const float* const> grads,
                         int64_t batch_examples, RejectReason* reason, int rank,
                         const RowsRequest& rows, WireFormat wire) {
  // Slice ids are strictly increasing (ValidateRanges), so covering every slice whole means
  // exactly one full range per owned slice.
  bool whole = ranges.size() == owned_.size();
  for (size_t i = 0; whole && i < ranges.size(); ++i) {
    const SliceState& s = owned_[static_cast<size_t>(local_index_[ranges[i].slice_id])];
    whole = ranges[i].begin == 0 && ranges[i].count == s.values.size();
  }
  if (!whole) {
    *reason = RejectReason::kPartial;
    return Status::InvalidArgument(
        "in sync mode a push must carry the gradient of every slice of the shard, whole");
  }
  // Aggregated gradients are the workers' to judge: an AMP GradScaler's overflowed step has
  // Inf in it on every rank alike, and each rank's scaler skips that step on seeing it.
  if (!IsWorkerSide(registration_->optimizer.kind)) {
    PARASYNC_RETURN_IF_ERROR(CheckFinite(ranges, grads, reason));
  }
  PARASYNC_RETURN_IF_ERROR(CheckRowsFinite(rows, reason));
  if (rank < 0) return Status::InvalidArgument("negative rank " + std::to_string(rank));
  for (size_t i = 0; i < rows.ranges.size(); ++i) {
    tables_.Accumulate(rank, rows.ranges[i].table, rows.ids[i], rows.grads[i]);
  }
  const auto r = static_cast<size_t>(rank);
  if (contributed_.size() <= r) contributed_.resize(r + 1, false);
  contributed_[r] = true;
  for (size_t i = 0; i < ranges.size(); ++i) {
    SliceState& s = owned_[static_cast<size_t>(local_index_[ranges[i].slice_id])];
    if (s.by_rank.size() <= r) s.by_rank.resize(r + 1);
    std::vector<float>& mine = s.by_rank[r];
    if (mine.empty()) mine.assign(s.values.size(), 0.0f);
    const float* g = grads[i];
    for (int64_t k = 0; k < ranges[i].count; ++k) mine[static_cast<size_t>(k)] += g[k];
  }
  pending_examples_ += batch_examples > 0 ? batch_examples : 0;
  if (HasErrorFeedback(wire.dtype)) step_wire_ = wire;
  return Status::Ok();
}

void Shard::QuantizeAverage(SliceState& s, WireFormat wire) {
  const size_t n = average_.size();
  if (s.pull_residual.size() != n) s.pull_residual.assign(n, 0.0f);
  quantized_.resize(WireBytes(wire, n, s.offset));
  EncodeRange(average_.data(), n, s.offset, wire, quantized_.data(), s.pull_residual.data());
  DecodeRange(quantized_.data(), n, s.offset, wire, average_.data());
}

Status Shard::ApplyAccumulated(int count) {
  const float inv = 1.0f / static_cast<float>(count);
  const float lr_scale = LrScheduleFactor(registration_->optimizer, examples_);
  const std::optional<WireFormat> quantize =
      registration_->optimizer.kind == OptimizerKind::kAggregate ? step_wire_ : std::nullopt;
  step_wire_.reset();
  for (SliceState& s : owned_) {
    average_.assign(s.values.size(), 0.0f);
    // Rank order, whatever order the pushes came in.
    for (size_t r = 0; r < contributed_.size() && r < s.by_rank.size(); ++r) {
      if (!contributed_[r]) continue;
      std::vector<float>& g = s.by_rank[r];
      for (size_t k = 0; k < g.size(); ++k) {
        average_[k] += g[k];
        g[k] = 0.0f;
      }
    }
    for (float& a : average_) a *= inv;
    if (quantize) {
      QuantizeAverage(s, *quantize);
    } else if (registration_->optimizer.kind == OptimizerKind::kAggregate &&
               !s.pull_residual.empty()) {
      // A float32 step after quantized ones (the workers' probe): it sends what was held.
      for (size_t k = 0; k < average_.size(); ++k) average_[k] += s.pull_residual[k];
      s.pull_residual.clear();
    }
    ApplyToSlice(s, 0, average_.data(), static_cast<int64_t>(average_.size()), lr_scale);
  }
  tables_.SetNow(ExpiryNow());
  Status rows = tables_.Expire();
  if (rows.ok()) {
    rows = tables_.ApplyAccumulated(Effective(lr_scale));
  } else {
    tables_.DropAccumulated();
  }
  std::fill(contributed_.begin(), contributed_.end(), false);
  ++version_;
  examples_ += pending_examples_;
  pending_examples_ = 0;
  return rows;
}

int64_t Shard::num_elements() const {
  int64_t n = 0;
  for (const SliceState& s : owned_) n += s.values.size();
  return n;
}

std::span<const float> Shard::SliceValues(uint32_t id) const {
  if (id >= local_index_.size() || local_index_[id] < 0) return {};
  return owned_[static_cast<size_t>(local_index_[id])].values;
}

SliceSnapshot Shard::SnapshotOfSlice(uint32_t id) const {
  const SliceState& s = owned_[static_cast<size_t>(local_index_[id])];
  SliceSnapshot out;
  out.id = id;
  out.updates = s.updates;
  out.values.assign(s.values.begin(), s.values.end());
  out.slots = s.slots;
  return out;
}

ShardSnapshot Shard::Snapshot() const {
  ShardSnapshot snap;
  snap.registration = *registration_;
  snap.version = version_;
  snap.examples = examples_;
  for (uint32_t id : map_->SlicesOfShard(shard_index_)) snap.slices.push_back(SnapshotOfSlice(id));
  return snap;
}

void Shard::TakeRowChanges(ShardSnapshot* snap) {
  snap->rows = tables_.TakeDirty(&snap->deleted_rows);
}

Status Shard::Restore(const ShardSnapshot& snap) {
  if (Status s = ValidateRegistration(snap.registration); !s.ok()) {
    return Status::Corruption("restored registration is invalid: " + s.message());
  }
  if (snap.registration.num_shards != num_shards_) {
    return Status::Corruption("restored model is for " + std::to_string(snap.registration.num_shards) +
                              " shards, this cluster has " + std::to_string(num_shards_));
  }
  auto map = SliceMap::Build(snap.registration.variables, snap.registration.max_slice_elements,
                             snap.registration.num_shards);
  if (!map.ok()) return Status::Corruption("restored model: " + map.status().message());
  const std::vector<uint32_t>& mine = map->SlicesOfShard(shard_index_);
  if (snap.slices.size() != mine.size()) {
    return Status::Corruption("restored snapshot holds " + std::to_string(snap.slices.size()) +
                              " slices, shard " + std::to_string(shard_index_) + " has " +
                              std::to_string(mine.size()));
  }
  const size_t num_slots = static_cast<size_t>(NumOptimizerSlots(snap.registration.optimizer.kind));
  std::vector<SliceState> owned;
  std::vector<int32_t> local(map->slices().size(), -1);
  for (size_t i = 0; i < mine.size(); ++i) {
    const SliceSnapshot& in = snap.slices[i];
    const auto length = static_cast<size_t>(map->slices()[mine[i]].length);
    if (in.id != mine[i] || in.values.size() != length || in.slots.size() != num_slots) {
      return Status::Corruption("restored slice " + std::to_string(in.id) +
                                " does not match the model's slice map");
    }
    for (const auto& slot : in.slots) {
      if (slot.size() != length) return Status::Corruption("restored optimizer slot of wrong size");
    }
    SliceState state;
    state.values = LendableFloats(static_cast<int64_t>(length));
    std::memcpy(state.values.data(), in.values.data(), length * sizeof(float));
    state.slots = in.slots;
    state.updates = in.updates;
    local[in.id] = static_cast<int32_t>(owned.size());
    owned.push_back(std::move(state));
  }
  EmbeddingTables tables(tables_.options());
  tables.Configure(snap.registration.tables, snap.registration.optimizer, snap.registration.seed);
  tables.SetNow(tables_.options().expire_in_seconds ? ExpiryNow() : snap.version + 1);
  if (Status s = tables.Restore(snap.rows, snap.stored_row_counts); !s.ok()) {
    return Status::Corruption("restored rows: " + s.message());
  }
  registration_ = snap.registration;
  map_ = std::move(map).value();
  tables_ = std::move(tables);
  local_index_ = std::move(local);
  owned_ = std::move(owned);
  version_ = snap.version;
  examples_ = snap.examples;
  pending_examples_ = 0;
  return Status::Ok();
}

}  // namespace parasync
