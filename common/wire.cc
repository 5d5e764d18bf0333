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
    case MsgType::kGather: return "gather";
  }
  return "unknown";
}

// Every C++ enum that mirrors a schema enum has the same numbers (they travel as they are).
template <typename A, typename B>
constexpr bool SameNumber(A a, B b) {
  return static_cast<int>(a) == static_cast<int>(b);
}
static_assert(kNumMsgTypes == static_cast<int>(fb::MsgType::MAX) + 1);
static_assert(SameNumber(MsgType::kRegister, fb::MsgType::Register));
static_assert(SameNumber(MsgType::kPull, fb::MsgType::Pull));
static_assert(SameNumber(MsgType::kPush, fb::MsgType::Push));
static_assert(SameNumber(MsgType::kStats, fb::MsgType::Stats));
static_assert(SameNumber(MsgType::kShutdown, fb::MsgType::Shutdown));
static_assert(SameNumber(MsgType::kHeartbeat, fb::MsgType::Heartbeat));
static_assert(SameNumber(MsgType::kLeave, fb::MsgType::Leave));
static_assert(SameNumber(MsgType::kCheckpoint, fb::MsgType::Checkpoint));
static_assert(SameNumber(MsgType::kGather, fb::MsgType::Gather));
static_assert(SameNumber(StatusCode::kOk, fb::Code::Ok));
static_assert(SameNumber(StatusCode::kInvalidArgument, fb::Code::InvalidArgument));
static_assert(SameNumber(StatusCode::kNotFound, fb::Code::NotFound));
static_assert(SameNumber(StatusCode::kUnavailable, fb::Code::Unavailable));
static_assert(SameNumber(StatusCode::kTimedOut, fb::Code::TimedOut));
static_assert(SameNumber(StatusCode::kAborted, fb::Code::Aborted));
static_assert(SameNumber(StatusCode::kCorruption, fb::Code::Corruption));
static_assert(SameNumber(StatusCode::kInternal, fb::Code::Internal));
static_assert(SameNumber(StatusCode::kNotSupported, fb::Code::NotSupported));
static_assert(SameNumber(StatusCode::kFailedPrecondition, fb::Code::FailedPrecondition));
static_assert(SameNumber(StatusCode::kFailedPrecondition, fb::Code::MAX));
static_assert(SameNumber(DType::kFloat32, fb::DType::Float32));
static_assert(SameNumber(DType::kBfloat16, fb::DType::Bfloat16));
static_assert(SameNumber(DType::kFloat16, fb::DType::Float16));
static_assert(SameNumber(DType::kInt8, fb::DType::Int8));
static_assert(SameNumber(DType::kTopK, fb::DType::TopK));
static_assert(SameNumber(DType::kInt4, fb::DType::Int4));
static_assert(SameNumber(DType::kInt4, fb::DType::MAX));
static_assert(SameNumber(InitKind::kZeros, fb::InitKind::Zeros));
static_assert(SameNumber(InitKind::kConstant, fb::InitKind::Constant));
static_assert(SameNumber(InitKind::kUniform, fb::InitKind::Uniform));
static_assert(SameNumber(InitKind::kProvided, fb::InitKind::Provided));
static_assert(SameNumber(InitKind::kProvided, fb::InitKind::MAX));
static_assert(SameNumber(OptimizerKind::kSgd, fb::OptimizerKind::Sgd));
static_assert(SameNumber(OptimizerKind::kMomentum, fb::OptimizerKind::Momentum));
static_assert(SameNumber(OptimizerKind::kAdam, fb::OptimizerKind::Adam));
static_assert(SameNumber(OptimizerKind::kAdagrad, fb::OptimizerKind::Adagrad));
static_assert(SameNumber(OptimizerKind::kAggregate, fb::OptimizerKind::Aggregate));
static_assert(SameNumber(OptimizerKind::kDelta, fb::OptimizerKind::Delta));
static_assert(SameNumber(OptimizerKind::kDelta, fb::OptimizerKind::MAX));
static_assert(SameNumber(LrSchedule::kConstant, fb::LrSchedule::Constant));
static_assert(SameNumber(LrSchedule::kCosine, fb::LrSchedule::Cosine));
static_assert(SameNumber(LrSchedule::kCosine, fb::LrSchedule::MAX));

namespace {

// Tables are built field by field (never Create*(b, ...) by position), so a new field cannot
// shift the others silently. Fields are added in the order the generated Create* functions
// use (largest first), and nested objects are made in the order they were before, so the
// bytes stay what they were.

flatbuffers::Offset<fb::VariableSpec> EncodeVariable(flatbuffers::FlatBufferBuilder& b,
                                                     const VariableSpec& v) {
  const auto shape = b.CreateVector(v.shape);
  const auto name = b.CreateString(v.name);
  fb::VariableSpecBuilder vb(b);
  vb.add_init_value(v.init.value);
  vb.add_shape(shape);
  vb.add_name(name);
  vb.add_init_kind(static_cast<fb::InitKind>(v.init.kind));
  vb.add_dtype(static_cast<fb::DType>(v.dtype));
  return vb.Finish();
}

flatbuffers::Offset<fb::OptimizerSpec> EncodeOptimizer(flatbuffers::FlatBufferBuilder& b,
                                                       const OptimizerSpec& o) {
  fb::OptimizerSpecBuilder ob(b);
  ob.add_decay_examples(o.decay_examples);
  ob.add_initial_accumulator(o.initial_accumulator);
  ob.add_final_lr_fraction(o.final_lr_fraction);
  ob.add_epsilon(o.epsilon);
  ob.add_beta2(o.beta2);
  ob.add_beta1(o.beta1);
  ob.add_momentum(o.momentum);
  ob.add_learning_rate(o.learning_rate);
  ob.add_lr_schedule(static_cast<fb::LrSchedule>(o.schedule));
  ob.add_staleness_aware(o.staleness_aware);
  ob.add_kind(static_cast<fb::OptimizerKind>(o.kind));
  return ob.Finish();
}

flatbuffers::Offset<fb::TableSpec> EncodeTable(flatbuffers::FlatBufferBuilder& b,
                                               const TableSpec& t) {
  const auto name = b.CreateString(t.name);
  fb::TableSpecBuilder tb(b);
  tb.add_rows(t.rows);
  tb.add_dim(t.dim);
  tb.add_init_value(t.init.value);
  tb.add_name(name);
  tb.add_init_kind(static_cast<fb::InitKind>(t.init.kind));
  return tb.Finish();
}

flatbuffers::Offset<fb::RegisterRequest> EncodeRegistration(flatbuffers::FlatBufferBuilder& b,
                                                            const ModelRegistration& r) {
  std::vector<flatbuffers::Offset<fb::VariableSpec>> vars;
  vars.reserve(r.variables.size());
  for (const VariableSpec& v : r.variables) vars.push_back(EncodeVariable(b, v));
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::TableSpec>>> tables = 0;
  if (!r.tables.empty()) {  // absent when none: a registration without tables keeps its bytes
    std::vector<flatbuffers::Offset<fb::TableSpec>> specs;
    for (const TableSpec& t : r.tables) specs.push_back(EncodeTable(b, t));
    tables = b.CreateVector(specs);
  }
  const auto opt = EncodeOptimizer(b, r.optimizer);
  const auto model = r.model.empty() ? 0 : b.CreateString(r.model);
  const auto mode = b.CreateString(r.mode);
  const auto variables = b.CreateVector(vars);
  fb::RegisterRequestBuilder rb(b);
  rb.add_max_slice_elements(r.max_slice_elements);
  rb.add_seed(r.seed);
  rb.add_model(model);
  rb.add_mode(mode);
  rb.add_num_shards(r.num_shards);
  rb.add_optimizer(opt);
  rb.add_variables(variables);
  if (!tables.IsNull()) rb.add_tables(tables);
  return rb.Finish();
}

fb::WorkerStats EncodeWorker(const WorkerStats& w) {
  fb::WorkerStats out;  // zeroed padding, as the generated constructor writes
  out.mutate_live(w.live);
  out.mutate_clock(w.clock);
  out.mutate_gradients(w.gradients);
  out.mutate_dropped(w.dropped);
  return out;
}

flatbuffers::Offset<fb::StatsReply> EncodeStats(flatbuffers::FlatBufferBuilder& b,
                                                const ShardStats& s) {
  std::vector<fb::WorkerStats> worker_stats;
  worker_stats.reserve(s.workers.size());
  for (const WorkerStats& w : s.workers) worker_stats.push_back(EncodeWorker(w));
  flatbuffers::Offset<fb::RegisterRequest> registration = 0;
  if (s.registration) registration = EncodeRegistration(b, *s.registration);
  const auto workers = b.CreateVectorOfStructs(worker_stats);
  const auto mode = b.CreateString(s.mode);
  fb::StatsReplyBuilder sb(b);
  sb.add_rows_held(s.rows_held);
  sb.add_workers_declared_dead(s.workers_declared_dead);
  sb.add_blocked_pulls(s.blocked_pulls);
  sb.add_max_clock_staleness(s.max_clock_staleness);
  sb.add_max_version_staleness(s.max_version_staleness);
  sb.add_dropped_stale(s.dropped_stale);
  sb.add_rejected(s.rejected);
  sb.add_requests(s.requests);
  sb.add_num_elements(s.num_elements);
  sb.add_examples(s.examples);
  sb.add_version(s.version);
  sb.add_registration(registration);
  sb.add_workers(workers);
  sb.add_live_workers(s.live_workers);
  sb.add_mode(mode);
  sb.add_num_slices(s.num_slices);
  sb.add_shard(s.shard);
  sb.add_registered(s.registered);
  return sb.Finish();
}

fb::RowRange EncodeRows(const RowRange& r) {
  fb::RowRange out;  // zeroed padding, as the generated constructor writes
  out.mutate_table(r.table);
  out.mutate_count(r.count);
  return out;
}

fb::SliceRange EncodeSlice(const SliceRange& s) {
  fb::SliceRange out;  // zeroed padding, as the generated constructor writes
  out.mutate_slice_id(s.slice_id);
  out.mutate_begin(s.begin);
  out.mutate_count(s.count);
  return out;
}

}  // namespace

std::vector<uint8_t> EncodeHeader(const Header& h) {
  flatbuffers::FlatBufferBuilder b(256 + h.slices.size() * sizeof(fb::SliceRange));

  flatbuffers::Offset<fb::RegisterRequest> reg = 0;
  if (h.registration) reg = EncodeRegistration(b, *h.registration);
  flatbuffers::Offset<fb::StatsReply> stats = 0;
  if (h.stats) stats = EncodeStats(b, *h.stats);
  flatbuffers::Offset<flatbuffers::Vector<const fb::SliceRange*>> slices = 0;
  if (!h.slices.empty()) {
    std::vector<fb::SliceRange> ranges;
    ranges.reserve(h.slices.size());
    for (const SliceRange& s : h.slices) ranges.push_back(EncodeSlice(s));
    slices = b.CreateVectorOfStructs(ranges);
  }
  flatbuffers::Offset<flatbuffers::Vector<const fb::RowRange*>> rows = 0;
  if (!h.rows.empty()) {
    std::vector<fb::RowRange> ranges;
    ranges.reserve(h.rows.size());
    for (const RowRange& r : h.rows) ranges.push_back(EncodeRows(r));
    rows = b.CreateVectorOfStructs(ranges);
  }
  flatbuffers::Offset<flatbuffers::String> message = 0;
  if (!h.status.message().empty()) message = b.CreateString(h.status.message());
  flatbuffers::Offset<flatbuffers::String> key = 0;
  if (!h.key.empty()) key = b.CreateString(h.key);
  flatbuffers::Offset<flatbuffers::Vector<int32_t>> ranks = 0;
  if (!h.ranks.empty()) ranks = b.CreateVector(h.ranks);
  flatbuffers::Offset<flatbuffers::Vector<int32_t>> admitted = 0;
  if (!h.admitted.empty()) admitted = b.CreateVector(h.admitted);

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
  if (!rows.IsNull()) hb.add_rows(rows);
  if (!key.IsNull()) hb.add_key(key);
  if (!ranks.IsNull()) hb.add_ranks(ranks);
  if (h.joining) hb.add_joining(true);
  if (h.topk_keep != 0) hb.add_topk_keep(h.topk_keep);
  if (!admitted.IsNull()) hb.add_admitted(admitted);
  if (h.delta_pull) hb.add_delta_pull(true);
  if (h.delta_base != 0) hb.add_delta_base(h.delta_base);
  if (h.delta_generation != 0) hb.add_delta_generation(h.delta_generation);
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
  OptimizerSpec& opt = reg.optimizer;
  opt.kind = static_cast<OptimizerKind>(o->kind());
  opt.learning_rate = o->learning_rate();
  opt.momentum = o->momentum();
  opt.beta1 = o->beta1();
  opt.beta2 = o->beta2();
  opt.epsilon = o->epsilon();
  opt.initial_accumulator = o->initial_accumulator();
  opt.staleness_aware = o->staleness_aware();
  opt.schedule = static_cast<LrSchedule>(o->lr_schedule());
  opt.decay_examples = o->decay_examples();
  opt.final_lr_fraction = o->final_lr_fraction();
  if (const auto* tables = r->tables()) {
    for (const fb::TableSpec* t : *tables) {
      TableSpec spec;
      if (t->name()) spec.name = t->name()->str();
      if (!InRange(t->init_kind(), fb::InitKind::MAX)) {
        return Status::Corruption("unknown initializer");
      }
      spec.rows = t->rows();
      spec.dim = t->dim();
      spec.init = {static_cast<InitKind>(t->init_kind()), t->init_value()};
      reg.tables.push_back(std::move(spec));
    }
  }
  reg.seed = r->seed();
  reg.max_slice_elements = r->max_slice_elements();
  reg.num_shards = r->num_shards();
  if (r->mode()) reg.mode = r->mode()->str();
  if (r->model()) reg.model = r->model()->str();
  return reg;
}

Result<ShardStats> DecodeStats(const fb::StatsReply* s) {
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
  out.rows_held = s->rows_held();
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
  return out;
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
  if (const auto* r = in->rows()) {
    if (!ElementsAligned(r, alignof(fb::RowRange))) {
      return Status::Corruption("misaligned row ranges");
    }
    h.rows.reserve(r->size());
    for (const fb::RowRange* x : *r) h.rows.push_back({x->table(), x->count()});
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
  if (const auto* k = in->key()) h.key = k->str();
  if (const auto* r = in->ranks()) h.ranks.assign(r->begin(), r->end());
  h.joining = in->joining();
  h.topk_keep = in->topk_keep();
  if (const auto* a = in->admitted()) h.admitted.assign(a->begin(), a->end());
  h.delta_pull = in->delta_pull();
  h.delta_base = in->delta_base();
  h.delta_generation = in->delta_generation();
  if (const fb::RegisterRequest* r = in->register_()) {
    auto reg = DecodeRegistration(r);
    if (!reg.ok()) return reg.status();
    h.registration = std::move(reg).value();
  }
  if (const fb::StatsReply* s = in->stats()) {
    auto stats = DecodeStats(s);
    if (!stats.ok()) return stats.status();
    h.stats = std::move(stats).value();
  }
  return h;
}

}  // namespace parasync
