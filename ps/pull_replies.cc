#include "ps/pull_replies.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "common/float_codec.h"
#include "common/int8_codec.h"
#include "ps/memory_bound.h"

namespace parasync {

namespace {

// What a pull reply's frame holds until ZeroMQ frees it: the shard's loan (or a buffer of
// its own) and its bytes on the unread counters.
struct FrameHold {
  void* loan = nullptr;  // a Shard loan token; null: the frame's data is malloc'ed
  int64_t bytes = 0;
  std::shared_ptr<std::atomic<int64_t>> peer, total, released;
};

// ZeroMQ's free function for a reply frame; runs on its I/O thread (or where the socket is
// closed).
void ReleaseFrame(void* data, void* hint) {
  auto* hold = static_cast<FrameHold*>(hint);
  if (hold->loan != nullptr) {
    Shard::ReturnLoan(hold->loan);
  } else {
    std::free(data);
  }
  hold->peer->fetch_sub(hold->bytes, std::memory_order_relaxed);
  hold->total->fetch_sub(hold->bytes, std::memory_order_relaxed);
  hold->released->fetch_add(hold->bytes, std::memory_order_relaxed);
  delete hold;
}

// Counts `hold`'s bytes on its unread counters and appends the frame of `data`, which `hold`
// then owns (ReleaseFrame gives both back once ZeroMQ is done with it). Counted before the
// frame exists: ReleaseFrame may run as soon as it is queued. On a throw both are released.
void AppendHeldFrame(void* data, size_t size, FrameHold* hold,
                     std::vector<zmq::message_t>& frames) {
  hold->peer->fetch_add(hold->bytes, std::memory_order_relaxed);
  hold->total->fetch_add(hold->bytes, std::memory_order_relaxed);
  try {
    frames.emplace_back(data, size, &ReleaseFrame, hold);
  } catch (...) {
    ReleaseFrame(data, hold);
    throw;
  }
}

}  // namespace

PullReplies::ByteCounter PullReplies::PeerCounter(const zmq::message_t& identity) {
  ByteCounter& c =
      by_peer_[std::string(static_cast<const char*>(identity.data()), identity.size())];
  if (!c) c = std::make_shared<std::atomic<int64_t>>(0);
  return c;
}

void PullReplies::ForgetIdlePeers() {
  std::erase_if(by_peer_, [](const auto& entry) { return entry.second.use_count() == 1; });
  std::erase_if(last_answered_,
                [this](const auto& entry) { return !by_peer_.contains(entry.first); });
}

bool PullReplies::AnsweringAlready(const zmq::message_t& identity, const Header& req) const {
  const std::string id(static_cast<const char*>(identity.data()), identity.size());
  const auto last = last_answered_.find(id);
  if (last == last_answered_.end() || last->second != req.request_id || req.request_id == 0) {
    return false;
  }
  const auto peer = by_peer_.find(id);
  return peer != by_peer_.end() && peer->second->load(std::memory_order_relaxed) > 0;
}

void PullReplies::Answered(const zmq::message_t& identity, uint64_t request_id) {
  last_answered_[std::string(static_cast<const char*>(identity.data()), identity.size())] =
      request_id;
}

std::optional<std::string> PullReplies::Refusal(const Header& req,
                                                const std::atomic<int64_t>& peer) const {
  // What a reply keeps alive: a float32 frame pins its whole slice (a loan), a 16-bit one its
  // own encoded copy.
  int64_t bytes = 0;
  const SliceMap* map = shard_->slice_map();  // registered: the ranges were validated
  for (const SliceRange& r : req.slices) {
    if (map == nullptr) {
      bytes += r.count * static_cast<int64_t>(DTypeSize(req.dtype));
    } else if (req.dtype == DType::kFloat32) {
      bytes += map->slices()[r.slice_id].length * static_cast<int64_t>(sizeof(float));
    } else {
      bytes += static_cast<int64_t>(WireBytes(req.wire(), static_cast<size_t>(r.count),
                                              map->slices()[r.slice_id].offset + r.begin));
    }
  }
  bytes += RowReplyBytes(req);
  const int64_t peer_unread = peer.load(std::memory_order_relaxed);
  const int64_t total_unread = unread();
  const int64_t elements =
      UnreadBasis(*options_, shard_->num_elements(), shard_->tables().num_tables() > 0);
  const int64_t peer_cap = 2 * elements * static_cast<int64_t>(sizeof(float));
  const int64_t cap = UnreadReplyCap(*options_, elements);
  if ((peer_unread <= 0 || peer_unread + bytes <= peer_cap) && total_unread + bytes <= cap) {
    return std::nullopt;
  }
  // Another reply would pin another version of the model for a peer that does not read.
  return peer_unread + bytes > peer_cap
             ? "pull refused: " + std::to_string(peer_unread) +
                   " bytes of earlier pull replies to this connection are still unread"
             : "pull refused: this server has " + std::to_string(total_unread) +
                   " bytes of pull replies unread by their peers (at most " +
                   std::to_string(cap) + ", --max-unread-reply-bytes)";
}

Result<std::vector<zmq::message_t>> PullReplies::Frames(
    const Header& req, const std::vector<std::vector<uint64_t>>& row_ids,
    const ByteCounter& peer) {
  std::vector<zmq::message_t> frames = SliceFrames(req, peer);
  PARASYNC_RETURN_IF_ERROR(AppendRowFrames(req, row_ids, peer, frames));
  return frames;
}

std::vector<zmq::message_t> PullReplies::SliceFrames(const Header& req, const ByteCounter& peer) {
  // Zero-copy: each frame points at the slice's values and holds them (ZeroMQ returns the
  // loan once the bytes are written out); an update meanwhile goes to another buffer. A
  // reply in a 16-bit wire dtype is encoded into a buffer of its own instead.
  std::vector<Shard::Loan> loans;
  shard_->Lend(req.slices, loans);
  std::vector<zmq::message_t> frames;
  frames.reserve(loans.size());
  size_t taken = 0;  // loans [taken, end) are still ours to return
  const SliceMap& map = *shard_->slice_map();
  try {
    for (; taken < loans.size(); ++taken) {
      const SliceRange& r = req.slices[taken];
      AppendSliceFrame(req.wire(), map.slices()[r.slice_id].offset + r.begin, loans[taken], peer,
                       frames, taken);
    }
  } catch (...) {
    // Out of memory mid-reply: what is not yet in a frame goes back (the frames built so
    // far give theirs back as `frames` is destroyed).
    for (; taken < loans.size(); ++taken) Shard::ReturnLoan(loans[taken].token);
    throw;
  }
  return frames;
}

std::vector<zmq::message_t> PullReplies::DeltaFrames(const Header& req, const ByteCounter& peer,
                                                     DeltaPulls& deltas, Header* reply) {
  std::vector<Shard::Loan> loans;
  shard_->Lend(req.slices, loans);
  std::vector<const float*> values;
  values.reserve(loans.size());
  for (const Shard::Loan& l : loans) values.push_back(l.data);
  DeltaPulls::Change change;
  try {
    change = deltas.Answer(req, values);
  } catch (...) {
    for (const Shard::Loan& l : loans) Shard::ReturnLoan(l.token);
    throw;
  }
  for (const Shard::Loan& l : loans) Shard::ReturnLoan(l.token);
  reply->delta_pull = true;
  reply->dtype = change.format.dtype;
  reply->topk_keep = static_cast<uint8_t>(change.format.dtype == DType::kTopK ? change.format.keep : 0);
  reply->delta_base = change.base;
  reply->delta_generation = change.generation;
  std::vector<zmq::message_t> frames;
  frames.reserve(req.slices.size());
  const SliceMap& map = *shard_->slice_map();
  size_t pos = 0;
  for (const SliceRange& r : req.slices) {
    const size_t size =
        WireBytes(change.format, static_cast<size_t>(r.count), map.slices()[r.slice_id].offset);
    auto hold = std::make_unique<FrameHold>(
        FrameHold{nullptr, static_cast<int64_t>(size), peer, total_, released_});
    void* data = std::malloc(size);
    if (data == nullptr) throw std::bad_alloc();
    std::memcpy(data, change.bytes->data() + pos, size);
    pos += size;
    AppendHeldFrame(data, size, hold.release(), frames);
  }
  return frames;
}

void PullReplies::AppendSliceFrame(WireFormat dtype, int64_t offset, const Shard::Loan& loan,
                                   const ByteCounter& peer,
                                   std::vector<zmq::message_t>& frames, size_t& taken) {
  const size_t size = WireBytes(dtype, static_cast<size_t>(loan.count), offset);
  if (size == 0) {
    frames.emplace_back();
    Shard::ReturnLoan(loan.token);
    return;
  }
  const bool lent = dtype.dtype == DType::kFloat32;
  // A lent frame keeps its whole slice alive; an encoded one its own bytes.
  auto owned_hold = std::make_unique<FrameHold>(FrameHold{
      nullptr,
      lent ? loan.pinned * static_cast<int64_t>(sizeof(float)) : static_cast<int64_t>(size),
      peer, total_, released_});
  void* data = const_cast<float*>(loan.data);
  if (!lent) {
    data = std::malloc(size);
    if (data == nullptr) throw std::bad_alloc();
    EncodeRange(loan.data, static_cast<size_t>(loan.count), offset, dtype, data);
    Shard::ReturnLoan(loan.token);
  } else {
    owned_hold->loan = loan.token;
  }
  // From here the hold owns the loan (or the buffer).
  try {
    AppendHeldFrame(data, size, owned_hold.release(), frames);
  } catch (...) {
    ++taken;  // given back with the hold
    throw;
  }
}

int64_t PullReplies::RowReplyBytes(const Header& req) const {
  int64_t bytes = 0;
  for (const RowRange& r : req.rows) {
    bytes += r.count * shard_->tables().table(r.table).dim *
             static_cast<int64_t>(DTypeSize(req.dtype));
  }
  return bytes;
}

Status PullReplies::AppendRowFrames(const Header& req,
                                    const std::vector<std::vector<uint64_t>>& row_ids,
                                    const ByteCounter& peer, std::vector<zmq::message_t>& frames) {
  std::vector<float> narrowed;  // a 16-bit reply's rows before encoding
  for (size_t k = 0; k < req.rows.size(); ++k) {
    const RowRange& r = req.rows[k];
    const auto n = static_cast<size_t>(r.count * shard_->tables().table(r.table).dim);
    const size_t size = n * DTypeSize(req.dtype);
    if (size == 0) {
      frames.emplace_back();
      continue;
    }
    auto hold = std::make_unique<FrameHold>(
        FrameHold{nullptr, static_cast<int64_t>(size), peer, total_, released_});
    void* data = std::malloc(size);
    if (data == nullptr) throw std::bad_alloc();
    Status read;
    if (req.dtype == DType::kFloat32) {
      read = shard_->ReadRows(r.table, row_ids[k], static_cast<float*>(data));  // malloc: aligned
    } else {
      narrowed.resize(n);
      read = shard_->ReadRows(r.table, row_ids[k], narrowed.data());
      if (read.ok()) EncodeFloats(narrowed.data(), n, req.dtype, data);
    }
    AppendHeldFrame(data, size, hold.release(), frames);
    PARASYNC_RETURN_IF_ERROR(read);  // the cold tier's: the frames go back with `frames`
    if (r.table < metrics_->tables.size()) {
      metrics_->tables[r.table].rows_pulled->Increment(static_cast<double>(r.count));
    }
  }
  return Status::Ok();
}

}  // namespace parasync
