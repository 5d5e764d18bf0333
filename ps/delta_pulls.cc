#include "ps/delta_pulls.h"

#include <algorithm>
#include <string>

#include "common/float_codec.h"

namespace parasync {

Status DeltaPulls::Check(const Header& req, RejectReason* reason) const {
  const ModelRegistration& reg = *shard_->registration();
  if (reg.optimizer.kind == OptimizerKind::kAggregate) {
    *reason = RejectReason::kUnsupported;
    return Status::FailedPrecondition(
        "a delta pull reads parameters, and this model's workers apply the optimizer: "
        "pull its average in the format it was pushed in");
  }
  const std::vector<uint32_t>& mine = shard_->slice_map()->SlicesOfShard(shard_->shard_index());
  bool whole = req.slices.size() == mine.size() && req.rows.empty();
  for (size_t k = 0; whole && k < mine.size(); ++k) {
    const SliceRange& r = req.slices[k];
    whole = r.slice_id == mine[k] && r.begin == 0 &&
            r.count == shard_->slice_map()->slices()[mine[k]].length;
  }
  if (!HasErrorFeedback(req.dtype) || !whole) {
    *reason = RejectReason::kRange;
    return Status::InvalidArgument(
        "a delta pull asks for int8, int4 or top-k and names every slice of the shard whole, in "
        "order, without embedding rows");
  }
  return Status::Ok();
}

DeltaPulls::Copy* DeltaPulls::Find(uint64_t generation) {
  if (generation == 0) return nullptr;
  const auto it = std::find_if(copies_.begin(), copies_.end(),
                               [&](const Copy& c) { return c.generation == generation; });
  return it == copies_.end() ? nullptr : &*it;
}

DeltaPulls::Cached* DeltaPulls::CachedFrom(uint64_t from, WireFormat format) {
  const auto it = std::find_if(cached_.begin(), cached_.end(), [&](const Cached& c) {
    return c.from == from && c.format == format;
  });
  return it == cached_.end() ? nullptr : &*it;
}

DeltaPulls::Copy& DeltaPulls::NewCopy(const Copy* keep) {
  if (copies_.size() < capacity_) return copies_.emplace_back();
  Copy* oldest = nullptr;
  for (Copy& c : copies_) {
    if (&c != keep && (oldest == nullptr || c.used < oldest->used)) oldest = &c;
  }
  const uint64_t gone = oldest->generation;
  std::erase_if(cached_, [&](const Cached& c) { return c.from == gone || c.to == gone; });
  metrics_->delta_copies_evicted->Increment();
  return *oldest;
}

size_t DeltaPulls::ReplyBytes(WireFormat format) const {
  size_t bytes = 0;
  const SliceMap& map = *shard_->slice_map();
  for (uint32_t id : map.SlicesOfShard(shard_->shard_index())) {
    const SliceInfo& s = map.slices()[id];
    bytes += WireBytes(format, static_cast<size_t>(s.length), s.offset);
  }
  return bytes;
}

DeltaPulls::Change DeltaPulls::Answer(const Header& req, const std::vector<const float*>& values) {
  ++tick_;
  // Room for one more copy first: no copy moves while a pointer to one is held below.
  if (copies_.capacity() < capacity_ + 1) copies_.reserve(capacity_ + 1);
  Copy* from = Find(req.delta_base);
  const uint64_t from_generation = from != nullptr ? from->generation : 0;
  if (from != nullptr) from->used = tick_;
  // From zeros always in int8: top-k of the parameters themselves would send a few of them.
  const WireFormat format = from != nullptr ? req.wire() : WireFormat(DType::kInt8);
  Cached* cached = CachedFrom(from_generation, format);
  if (cached != nullptr && cached->version == shard_->version()) {
    if (Copy* to = Find(cached->to); to != nullptr) {
      to->used = tick_;
      metrics_->delta_pulls_reused->Increment();
      return {&cached->bytes, format, from_generation, cached->to};
    }
  }
  // A new copy: the one pulled from (or zeros) plus the change sent.
  const size_t n = static_cast<size_t>(shard_->num_elements());
  Copy& to = NewCopy(from);  // may drop cached replies: `cached` is looked up again
  cached = CachedFrom(from_generation, format);
  to.values.resize(n);  // an evicted copy's buffer is reused; EncodeDeltaRange writes it all
  to.generation = next_generation_;
  next_generation_ += 2;  // odd: never 0
  to.used = tick_;
  if (cached == nullptr) cached = &cached_.emplace_back();
  cached->from = from_generation;
  cached->format = format;
  cached->version = shard_->version();
  cached->to = to.generation;
  cached->bytes.resize(ReplyBytes(format));
  const SliceMap& map = *shard_->slice_map();
  const std::vector<uint32_t>& mine = map.SlicesOfShard(shard_->shard_index());
  size_t at = 0, pos = 0;
  for (size_t k = 0; k < mine.size(); ++k) {
    const SliceInfo& s = map.slices()[mine[k]];
    const auto count = static_cast<size_t>(s.length);
    EncodeDeltaRange(values[k], from != nullptr ? from->values.data() + at : nullptr,
                     to.values.data() + at, count, s.offset, format, cached->bytes.data() + pos);
    at += count;
    pos += WireBytes(format, count, s.offset);
  }
  (from != nullptr ? metrics_->delta_pulls_changed : metrics_->delta_pulls_from_zeros)->Increment();
  metrics_->delta_copies->Set(static_cast<double>(copies_.size()));
  return {&cached->bytes, format, from_generation, to.generation};
}

void DeltaPulls::Forget() {
  copies_.clear();
  cached_.clear();
  metrics_->delta_copies->Set(0);
}

}  // namespace parasync
