#include "common/wire.h"

#include <cstring>

#include <flatbuffers/flatbuffers.h>

#include "schema/parasync_generated.h"

namespace parasync {

namespace fb = ::parasync::wire;

std::string_view MsgTypeName(MsgType type) {
  switch (type) {
    case MsgType::kRegister: return "register";
    case MsgType::kPull: return "pull";
    case MsgType::kPush: return "push";
    case MsgType::kStats: return "stats";
    case MsgType::kShutdown: return "shutdown";
    case MsgType::kHeartbeat: return "heartbeat";
    case MsgType::kLeave: return "leave";
    case MsgType::kCheckpoint: return "checkpoint";
  }
  return "unknown";
}

namespace {

flatbuffers::Offset<fb::RegisterRequest> EncodeRegistration(flatbuffers::FlatBufferBuilder& b,
                                                            const ModelRegistration& r) {
  std::vector<flatbuffers::Offset<fb::VariableSpec>> vars;
  vars.reserve(r.variables.size());
  for (const VariableSpec& v : r.variables) {
    vars.push_back(fb::CreateVariableSpec(b, b.CreateString(v.name), b.CreateVector(v.shape),
                                          static_cast<fb::DType>(v.dtype),
                                          static_cast<fb::InitKind>(v.init.kind), v.init.value));
  }
  const OptimizerSpec& o = r.optimizer;
  auto opt = fb::CreateOptimizerSpec(b, static_cast<fb::OptimizerKind>(o.kind), o.learning_rate,
                                     o.momentum, o.beta1, o.beta2, o.epsilon, o.staleness_aware,
                                     static_cast<fb::LrSchedule>(o.schedule), o.decay_examples,
                                     o.final_lr_fraction);
  return fb::CreateRegisterRequest(b, b.CreateVector(vars), opt, r.seed, r.max_slice_elements,
                                   r.num_shards, b.CreateString(r.mode),
                                   r.model.empty() ? 0 : b.CreateString(r.model));
}

}  // namespace

std::vector<uint8_t> EncodeHeader(const Header& h) {
  flatbuffers::FlatBufferBuilder b(256 + h.slices.size() * sizeof(fb::SliceRange));

  flatbuffers::Offset<fb::RegisterRequest> reg = 0;
  if (h.registration) reg = EncodeRegistration(b, *h.registration);
  flatbuffers::Offset<fb::StatsReply> stats = 0;
  if (h.stats) {
    const ShardStats& s = *h.stats;
    std::vector<fb::WorkerStats> workers;
    workers.reserve(s.workers.size());
    for (const WorkerStats& w : s.workers) {
      workers.emplace_back(w.live, w.clock, w.gradients, w.dropped);
    }
    flatbuffers::Offset<fb::RegisterRequest> stats_reg = 0;
    if (s.registration) stats_reg = EncodeRegistration(b, *s.registration);
    stats = fb::CreateStatsReply(b, s.shard, s.version, s.examples, s.num_slices, s.num_elements,
                                 s.requests, s.rejected, s.registered, b.CreateString(s.mode),
                                 s.live_workers, s.dropped_stale, s.max_version_staleness,
                                 s.max_clock_staleness, s.blocked_pulls, s.workers_declared_dead,
                                 b.CreateVectorOfStructs(workers), stats_reg);
  }
  flatbuffers::Offset<flatbuffers::Vector<const fb::SliceRange*>> slices = 0;
  if (!h.slices.empty()) {
    std::vector<fb::SliceRange> ranges;
    ranges.reserve(h.slices.size());
    for (const SliceRange& s : h.slices) ranges.emplace_back(s.slice_id, s.begin, s.count);
    slices = b.CreateVectorOfStructs(ranges);
  }
  flatbuffers::Offset<flatbuffers::String> message = 0;
  if (!h.status.message().empty()) message = b.CreateString(h.status.message());

  fb::HeaderBuilder hb(b);
  hb.add_protocol_version(h.protocol_version);
  hb.add_type(static_cast<fb::MsgType>(h.type));
  hb.add_request_id(h.request_id);
  hb.add_rank(h.rank);
  hb.add_code(static_cast<fb::Code>(h.status.code()));
  if (!message.IsNull()) hb.add_message(message);
  hb.add_dtype(static_cast<fb::DType>(h.dtype));
  if (!slices.IsNull()) hb.add_slices(slices);
  hb.add_batch_examples(h.batch_examples);
  hb.add_version(h.version);
  hb.add_min_version(h.min_version);
  hb.add_clock(h.clock);
  hb.add_dropped(h.dropped);
  hb.add_incarnation(h.incarnation);
  hb.add_seq(h.seq);
  hb.add_replayed(h.replayed);
  hb.add_staleness(h.staleness);
  hb.add_progress_epoch(h.progress.epoch);
  hb.add_progress_done(h.progress.done);
  hb.add_progress_of(h.progress.of);
  if (!reg.IsNull()) hb.add_register_(reg);
  if (!stats.IsNull()) hb.add_stats(stats);
  b.Finish(hb.Finish());
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

namespace {

template <typename E>
bool InRange(E value, E max) {
  return static_cast<int>(value) >= 0 && static_cast<int>(value) <= static_cast<int>(max);
}

// The Verifier (FlatBuffers 2.0.8) checks a vector's length field for 4-byte alignment, not
// its elements: a crafted frame can place 8-byte elements ([long], SliceRange, WorkerStats) at
// 4 mod 8, and reading them is undefined behaviour (found by tests/fuzz). FlatBufferBuilder
// always aligns them, so such a frame is refused. The buffer start is 8-aligned (see
// DecodeHeader), so the address tells the offset's alignment.
template <typename V>
bool ElementsAligned(const V* v, size_t alignment) {
  return v == nullptr || v->size() == 0 ||
         reinterpret_cast<uintptr_t>(v->Data()) % alignment == 0;
}

}  // namespace

namespace {

Result<ModelRegistration> DecodeRegistration(const fb::RegisterRequest* r) {
  ModelRegistration reg;
  if (const auto* vars = r->variables()) {
    for (const fb::VariableSpec* v : *vars) {
      VariableSpec spec;
      if (v->name()) spec.name = v->name()->str();
      if (!ElementsAligned(v->shape(), alignof(int64_t))) {
        return Status::Corruption("misaligned variable shape");
      }
      if (v->shape()) spec.shape.assign(v->shape()->begin(), v->shape()->end());
      if (!InRange(v->dtype(), fb::DType::MAX)) return Status::Corruption("unknown dtype");
      if (!InRange(v->init_kind(), fb::InitKind::MAX)) {
        return Status::Corruption("unknown initializer");
      }
      spec.dtype = static_cast<DType>(v->dtype());
      spec.init = {static_cast<InitKind>(v->init_kind()), v->init_value()};
      reg.variables.push_back(std::move(spec));
    }
  }
  const fb::OptimizerSpec* o = r->optimizer();
  if (o == nullptr) return Status::Corruption("register request without an optimizer");
  if (!InRange(o->kind(), fb::OptimizerKind::MAX)) {
    return Status::Corruption("unknown optimizer kind");
  }
  if (!InRange(o->lr_schedule(), fb::LrSchedule::MAX)) {
    return Status::Corruption("unknown learning-rate schedule");
  }
  reg.optimizer = {static_cast<OptimizerKind>(o->kind()),
                   o->learning_rate(),
                   o->momentum(),
                   o->beta1(),
                   o->beta2(),
                   o->epsilon(),
                   o->staleness_aware(),
                   static_cast<LrSchedule>(o->lr_schedule()),
                   o->decay_examples(),
                   o->final_lr_fraction()};
  reg.seed = r->seed();
  reg.max_slice_elements = r->max_slice_elements();
  reg.num_shards = r->num_shards();
  if (r->mode()) reg.mode = r->mode()->str();
  if (r->model()) reg.model = r->model()->str();
  return reg;
}

}  // namespace

Result<Header> DecodeHeader(const void* data, size_t size) {
  if (size >= FLATBUFFERS_MAX_BUFFER_SIZE) return Status::Corruption("header frame too large");
  // FlatBuffers reads scalars in place; ZeroMQ gives frames at any address.
  std::vector<uint64_t> aligned;
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (reinterpret_cast<uintptr_t>(data) % alignof(uint64_t) != 0) {
    aligned.resize((size + sizeof(uint64_t) - 1) / sizeof(uint64_t));
    std::memcpy(aligned.data(), data, size);
    bytes = reinterpret_cast<const uint8_t*>(aligned.data());
  }
  flatbuffers::Verifier verifier(bytes, size, /*max_depth=*/16, /*max_tables=*/100000);
  if (size < sizeof(flatbuffers::uoffset_t) || !fb::VerifyHeaderBuffer(verifier)) {
    return Status::Corruption("header frame fails the FlatBuffers verifier (" +
                              std::to_string(size) + " bytes)");
  }
  const fb::Header* in = fb::GetHeader(bytes);
  Header h;
  h.protocol_version = in->protocol_version();
  h.request_id = in->request_id();
  h.rank = in->rank();
  if (h.protocol_version != kProtocolVersion) return h;  // the rest may mean other things
  if (!InRange(in->type(), fb::MsgType::MAX)) return Status::Corruption("unknown message type");
  h.type = static_cast<MsgType>(in->type());
  if (!InRange(in->code(), fb::Code::MAX)) return Status::Corruption("unknown status code");
  if (in->code() != fb::Code::Ok) {
    h.status = Status(static_cast<StatusCode>(in->code()),
                      in->message() ? in->message()->str() : std::string());
  }
  if (!InRange(in->dtype(), fb::DType::MAX)) return Status::Corruption("unknown dtype");
  h.dtype = static_cast<DType>(in->dtype());
  if (const auto* s = in->slices()) {
    if (!ElementsAligned(s, alignof(fb::SliceRange))) {
      return Status::Corruption("misaligned slice ranges");
    }
    h.slices.reserve(s->size());
    for (const fb::SliceRange* r : *s) h.slices.push_back({r->slice_id(), r->begin(), r->count()});
  }
  h.batch_examples = in->batch_examples();
  h.version = in->version();
  h.min_version = in->min_version();
  h.clock = in->clock();
  h.dropped = in->dropped();
  h.incarnation = in->incarnation();
  h.seq = in->seq();
  h.replayed = in->replayed();
  h.staleness = in->staleness();
  h.progress = {in->progress_epoch(), in->progress_done(), in->progress_of()};
  if (const fb::RegisterRequest* r = in->register_()) {
    auto reg = DecodeRegistration(r);
    if (!reg.ok()) return reg.status();
    h.registration = std::move(reg).value();
  }
  if (const fb::StatsReply* s = in->stats()) {
    ShardStats out;
    out.shard = s->shard();
    out.version = s->version();
    out.examples = s->examples();
    out.num_slices = s->num_slices();
    out.num_elements = s->num_elements();
    out.requests = s->requests();
    out.rejected = s->rejected();
    out.registered = s->registered();
    if (s->mode()) out.mode = s->mode()->str();
    out.live_workers = s->live_workers();
    out.dropped_stale = s->dropped_stale();
    out.max_version_staleness = s->max_version_staleness();
    out.max_clock_staleness = s->max_clock_staleness();
    out.blocked_pulls = s->blocked_pulls();
    out.workers_declared_dead = s->workers_declared_dead();
    if (const auto* ws = s->workers()) {
      if (!ElementsAligned(ws, alignof(fb::WorkerStats))) {
        return Status::Corruption("misaligned worker stats");
      }
      for (const fb::WorkerStats* w : *ws) {
        out.workers.push_back({w->live(), w->clock(), w->gradients(), w->dropped()});
      }
    }
    if (const fb::RegisterRequest* r = s->registration()) {
      auto reg = DecodeRegistration(r);
      if (!reg.ok()) return reg.status();
      out.registration = std::move(reg).value();
    }
    h.stats = std::move(out);
  }
  return h;
}

}  // namespace parasync
