// --wire-dtype int8 and topk against real servers: what a push of compressed gradients
// applies, the error feedback on both sides, and the frames a server refuses
// (common/int8_codec.h, common/topk_codec.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "common/float_codec.h"
#include "common/int8_codec.h"
#include "common/slice_map.h"
#include "common/topk_codec.h"
#include "common/wire.h"
#include "tests/ps/server_test_util.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using namespace server_test;  // tests/ps/server_test_util.h

// What a client's int8 or top-k pushes send, slice by slice as the map cuts the variables,
// with the client's residual: the reference of the error feedback, computed here alone.
class CodecReference {
 public:
  CodecReference(const ModelRegistration& reg, WireFormat wire)
      : map_(SliceMap::Build(reg.variables, reg.max_slice_elements, reg.num_shards).value()),
        wire_(wire) {
    for (const VariableSpec& v : reg.variables) {
      residual_.emplace_back(static_cast<size_t>(v.num_elements()), 0.0f);
    }
  }

  // `values` quantized slice by slice; with `feedback`, with this reference's residual
  // (added before and what was not sent kept after), as a pushing client does.
  std::vector<std::vector<float>> Send(const std::vector<std::vector<float>>& values,
                                       bool feedback = true) {
    std::vector<std::vector<float>> out = values;
    for (const SliceInfo& s : map_.slices()) {
      const auto n = static_cast<size_t>(s.length);
      std::vector<int8_t> wire(WireBytes(wire_, n, s.offset));
      float* residual = feedback ? residual_[s.var_index].data() + s.offset : nullptr;
      EncodeRange(values[s.var_index].data() + s.offset, n, s.offset, wire_, wire.data(),
                  residual);
      DecodeRange(wire.data(), n, s.offset, wire_, out[s.var_index].data() + s.offset);
    }
    return out;
  }

  void set_wire(WireFormat wire) { wire_ = wire; }

  // `values` plus the residual, in float32, the residual zeroed: a push after the probe
  // turned compression off.
  std::vector<std::vector<float>> Fold(const std::vector<std::vector<float>>& values) {
    std::vector<std::vector<float>> out = values;
    for (size_t v = 0; v < out.size(); ++v) {
      for (size_t i = 0; i < out[v].size(); ++i) {
        out[v][i] += residual_[v][i];
        residual_[v][i] = 0.0f;
      }
    }
    return out;
  }

  size_t PushBytes() const {
    size_t bytes = 0;
    for (const SliceInfo& s : map_.slices()) {
      bytes += WireBytes(wire_, static_cast<size_t>(s.length), s.offset);
    }
    return bytes;
  }

 private:
  SliceMap map_;
  WireFormat wire_;
  std::vector<std::vector<float>> residual_;
};

std::vector<std::vector<float>> Scaled(std::vector<std::vector<float>> g, float by, float plus) {
  for (auto& v : g) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = v[i] * by + plus * static_cast<float>(i % 7);
  }
  return g;
}

// A raw pull of `count` elements of slice `slice` asking for `wire`: the reply, its frames in
// *frames.
Result<Header> RawPull(RawPeer& peer, WireFormat wire, uint32_t slice, int64_t count,
                       std::vector<std::vector<uint8_t>>* frames) {
  Header pull;
  pull.type = MsgType::kPull;
  pull.dtype = wire.dtype;
  pull.topk_keep = static_cast<uint8_t>(wire.keep);
  pull.slices = {{slice, 0, count}};
  peer.SendHeader(pull);
  return peer.Receive(frames);
}

std::vector<float> Bfloat16(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bfloat16ToFloat(FloatToBfloat16(v[i]));
  return out;
}

// A sync server's options for the two ranks of SyncWorkers.
ServerOptions SyncOfTwo() {
  ServerOptions options;
  options.mode = TrainingMode::Parse("sync").value();
  options.num_workers = 2;
  options.worker_timeout = milliseconds(10000);
  options.barrier_timeout = milliseconds(4000);
  return options;
}

// Ranks 0 and 1 of a sync run on `server`, pushing in `wire` with `probe`, `reg` registered
// (fewer on a failure, which it reports).
std::vector<std::unique_ptr<PsClient>> SyncWorkers(zmq::context_t& context,
                                                   InProcessServer& server,
                                                   const ModelRegistration& reg, WireFormat wire,
                                                   PsClientOptions::TopKProbe probe = {}) {
  std::vector<std::unique_ptr<PsClient>> workers;
  for (int rank = 0; rank < 2; ++rank) {
    PsClientOptions o;
    o.ps_addresses = {server.endpoint()};
    o.rank = rank;
    o.request_timeout = kWait;
    o.blocking_timeout = kWait;
    o.wire_dtype = wire;
    o.topk_probe = probe;
    auto c = PsClient::Connect(context, o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok() || !(*c)->Register(reg, kWait).ok()) break;
    workers.push_back(std::move(c).value());
  }
  return workers;
}

// int8, int4, and top-k keeping 3 of 256 (the small model's slices of 50 send 3 each, its
// bias of 10 3 of them).
class ServerCompressionTest : public ::testing::TestWithParam<WireFormat> {};

INSTANTIATE_TEST_SUITE_P(Codecs, ServerCompressionTest,
                         ::testing::Values(WireFormat(DType::kInt8), WireFormat(DType::kInt4),
                                           WireFormat(DType::kTopK, 3)),
                         [](const auto& p) { return std::string(DTypeName(p.param.dtype)); });

// What delta pulls give a reader (ps/delta_pulls.h): its copy, slice by slice, changed by
// (the servers' values - the copy) in `wire`, starting from zeros (the first pull in int8).
class DeltaReference {
 public:
  explicit DeltaReference(const ModelRegistration& reg, WireFormat wire = DType::kInt8)
      : map_(SliceMap::Build(reg.variables, reg.max_slice_elements, reg.num_shards).value()),
        wire_(wire) {
    for (const VariableSpec& v : reg.variables) {
      copy_.emplace_back(static_cast<size_t>(v.num_elements()), 0.0f);
    }
  }
  const std::vector<std::vector<float>>& Pull(const std::vector<std::vector<float>>& values) {
    const WireFormat wire = pulls_++ == 0 ? WireFormat(DType::kInt8) : wire_;
    for (const SliceInfo& s : map_.slices()) {
      const auto n = static_cast<size_t>(s.length);
      std::vector<int8_t> bytes(WireBytes(wire, n, s.offset));
      float* copy = copy_[s.var_index].data() + s.offset;
      EncodeDeltaRange(values[s.var_index].data() + s.offset, copy, copy, n, s.offset, wire,
                       bytes.data());
    }
    return copy_;
  }

 private:
  SliceMap map_;
  WireFormat wire_;
  int pulls_ = 0;
  std::vector<std::vector<float>> copy_;
};

// A server-side optimizer (SGD) over two shards: each push applies exactly the quantized
// gradient plus the client's residual; parameters come back as changes in its format to the
// client's copy (delta pulls), bit for bit the reference's, and in bfloat16 without them.
TEST_P(ServerCompressionTest, PushesApplyTheQuantizedGradientWithTheClientsResidual) {
  const WireFormat wire = GetParam();
  zmq::context_t context;
  InProcessServer s0(context, 0, 2), s1(context, 1, 2);
  ASSERT_TRUE(s0.started() && s1.started());
  const ModelRegistration reg = SmallModel(2);
  auto int8 = ConnectClient(context, {s0.endpoint(), s1.endpoint()}, 1, wire);
  auto exact = ConnectClient(context, {s0.endpoint(), s1.endpoint()}, 1);
  PsClientOptions plain_pulls;
  plain_pulls.ps_addresses = {s0.endpoint(), s1.endpoint()};
  plain_pulls.request_timeout = kWait;
  plain_pulls.wire_dtype = wire;
  plain_pulls.delta_pulls = false;
  auto bf16_pulls = PsClient::Connect(context, plain_pulls);
  ASSERT_TRUE(int8 && exact && bf16_pulls.ok());
  ASSERT_TRUE(int8->Register(reg, kWait).ok());
  ASSERT_TRUE(exact->Register(reg, kWait).ok());
  ASSERT_TRUE((*bf16_pulls)->Register(reg, kWait).ok());

  CodecReference ref(reg, wire);
  DeltaReference copy(reg, wire);
  std::vector<std::vector<float>> expected = InitialValues(reg);
  std::vector<std::vector<float>> params = {std::vector<float>(200), std::vector<float>(10)};
  std::vector<std::vector<float>> held = params;
  int fed_back = 0;
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> g =
        Scaled(Gradients(reg), 1.0f + static_cast<float>(step), 0.0013f);
    const std::vector<std::vector<float>> plain = CodecReference(reg, wire).Send(g, false);
    const std::vector<std::vector<float>> sent = ref.Send(g);
    ASSERT_TRUE(int8->PushPull(Pointers<const float>(g), 8, Pointers<float>(params)).ok());
    ASSERT_TRUE(exact->Pull(Pointers<float>(held)).ok());
    std::vector<std::vector<float>> narrow = params;
    ASSERT_TRUE((*bf16_pulls)->Pull(Pointers<float>(narrow)).ok());
    const std::vector<std::vector<float>>& want = copy.Pull(held);
    for (size_t v = 0; v < held.size(); ++v) {
      for (size_t i = 0; i < held[v].size(); ++i) {
        expected[v][i] -= kLearningRate * sent[v][i];
        fed_back += step > 0 && sent[v][i] != plain[v][i];
      }
      ASSERT_EQ(held[v], expected[v]) << "step " << step << ", variable " << v;
      ASSERT_EQ(params[v], want[v]) << "step " << step << ", variable " << v;
      ASSERT_EQ(narrow[v], Bfloat16(held[v])) << "step " << step << ", variable " << v;
    }
  }
  EXPECT_GT(fed_back, 0) << "the residual must change what a later push sends";
  // int8: a byte per element and one per 128-element chunk each slice touches (4 slices of
  // 50, 1 of 10: 6 or 7 chunks, by where the slices begin). top-k: 3 elements of each
  // slice (none reaches element 256, so each is a part of one chunk), 1 + 2 * 3 bytes each.
  const double pushed = s0.metrics().bytes_received[static_cast<size_t>(MsgType::kPush)]->Value() +
                        s1.metrics().bytes_received[static_cast<size_t>(MsgType::kPush)]->Value();
  if (wire.dtype == DType::kInt8) {
    EXPECT_GE(ref.PushBytes(), 210u + 5u);
    EXPECT_LE(ref.PushBytes(), 210u + 7u);
  } else if (wire.dtype == DType::kInt4) {  // half a byte per element: 25 per slice of 50, 5
    EXPECT_GE(ref.PushBytes(), 105u + 5u);
    EXPECT_LE(ref.PushBytes(), 105u + 7u);
  } else {
    EXPECT_EQ(ref.PushBytes(), 5u * 7u);
  }
  EXPECT_EQ(pushed, 3.0 * static_cast<double>(ref.PushBytes()));
}

// Sync with the workers' own optimizer (the aggregate): the servers average the ranks'
// compressed gradients, compress the average with their own residual, and both ranks pull
// exactly that, bit for bit what a single process applying the same codecs computes.
TEST_P(ServerCompressionTest, SyncAggregateEndsEqualToOneProcessApplyingTheSameCodecs) {
  const WireFormat wire = GetParam();
  zmq::context_t context;
  ServerOptions options = SyncOfTwo();
  InProcessServer server(context, options);
  ASSERT_TRUE(server.started());
  ModelRegistration reg = SmallModel(1);
  reg.mode = "sync";
  reg.optimizer.kind = OptimizerKind::kAggregate;
  reg.optimizer.learning_rate = 1.0f;
  std::vector<std::unique_ptr<PsClient>> workers = SyncWorkers(context, server, reg, wire);
  ASSERT_EQ(workers.size(), 2u);
  // The reference: each rank's pushes with its residual, the server's average with its own.
  CodecReference rank0(reg, wire), rank1(reg, wire), server_side(reg, wire);
  int server_fed_back = 0;
  for (int step = 0; step < 4; ++step) {
    auto g0 = Scaled(Gradients(reg), 0.3f + static_cast<float>(step), 0.0007f);
    auto g1 = Scaled(Gradients(reg), -1.7f, 0.0011f * static_cast<float>(step));
    const auto s0 = rank0.Send(g0), s1 = rank1.Send(g1);
    std::vector<std::vector<float>> average = s0;
    for (size_t v = 0; v < average.size(); ++v) {
      for (size_t i = 0; i < average[v].size(); ++i) {
        average[v][i] = (0.0f + s0[v][i] + s1[v][i]) * 0.5f;  // the server's order
      }
    }
    const auto want = server_side.Send(average);
    const auto plain = CodecReference(reg, wire).Send(average, false);
    for (size_t v = 0; v < want.size(); ++v) {
      for (size_t i = 0; i < want[v].size(); ++i) server_fed_back += want[v][i] != plain[v][i];
    }
    ASSERT_TRUE(workers[0]->Push(Pointers<const float>(g0), 8).ok());
    ASSERT_TRUE(workers[1]->Push(Pointers<const float>(g1), 8).ok());
    for (auto& w : workers) {
      std::vector<std::vector<float>> got = {std::vector<float>(200), std::vector<float>(10)};
      ASSERT_TRUE(w->Pull(Pointers<float>(got), step + 1).ok());
      ASSERT_EQ(got, want) << "step " << step;
    }
  }
  // The server's residual is at work: what was pulled differs from the average's plain
  // quantization somewhere (each rank's residual is checked by the test above).
  EXPECT_GT(server_fed_back, 0);
  EXPECT_EQ(server.metrics().bytes_received[static_cast<size_t>(MsgType::kPush)]->Value(),
            4.0 * 2 * static_cast<double>(CodecReference(reg, wire).PushBytes()));
}

// Delta pulls in sync steps (SGD on the server): both workers hold the same generation and
// pull the same version, so the change is encoded once and the second pull gets the same
// bytes; both copies equal the reference, and stay within a step's scale of the servers'
// values. A pull naming the generation again (a resend) is answered with the same reply; an
// unknown generation, from zeros; malformed delta pulls are refused; copies past
// max_delta_copies evict the least recently used.
TEST(ServerDeltaPullTest, SyncWorkersShareOneChangeAResendGetsItAgainAndCopiesAreBounded) {
  zmq::context_t context;
  ServerOptions options = SyncOfTwo();
  options.max_delta_copies = 3;
  InProcessServer server(context, options);
  ASSERT_TRUE(server.started());
  ModelRegistration reg = SmallModel(1);
  reg.mode = "sync";
  std::vector<std::unique_ptr<PsClient>> workers =
      SyncWorkers(context, server, reg, DType::kInt8);
  ASSERT_EQ(workers.size(), 2u);
  auto exact = ConnectClient(context, {server.endpoint()}, 1);
  ASSERT_TRUE(exact && exact->Register(reg, kWait).ok());
  const PsMetrics& m = server.metrics();
  DeltaReference copy(reg);
  std::vector<std::vector<float>> before = {std::vector<float>(200), std::vector<float>(10)};
  const int steps = 5;
  for (int step = 0; step < steps; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      auto g = Scaled(Gradients(reg), 1.0f + static_cast<float>(rank + step), 0.002f);
      ASSERT_TRUE(workers[static_cast<size_t>(rank)]->Push(Pointers<const float>(g), 8).ok());
    }
    std::vector<std::vector<float>> held = InitialValues(reg);
    ASSERT_TRUE(exact->Pull(Pointers<float>(held), step + 1).ok());
    // A pull leaves each element within half a step of its chunk's scale of the change it
    // sent: under 1/127 of the largest difference between the values and the copy before.
    float change = 0.0f;
    for (size_t v = 0; v < held.size(); ++v) {
      for (size_t i = 0; i < held[v].size(); ++i) {
        change = std::max(change, std::fabs(held[v][i] - before[v][i]));
      }
    }
    const std::vector<std::vector<float>> want = copy.Pull(held);
    for (auto& w : workers) {
      std::vector<std::vector<float>> got = {std::vector<float>(200), std::vector<float>(10)};
      ASSERT_TRUE(w->Pull(Pointers<float>(got), step + 1).ok());
      ASSERT_EQ(got, want) << "step " << step;
      for (size_t v = 0; v < got.size(); ++v) {
        for (size_t i = 0; i < got[v].size(); ++i) {
          ASSERT_LE(std::fabs(got[v][i] - held[v][i]), change / 127.0f) << step << " " << v;
        }
      }
    }
    before = want;
  }
  EXPECT_EQ(m.delta_pulls_from_zeros->Value(), 1.0);  // the first step's second pull reuses it
  EXPECT_EQ(m.delta_pulls_changed->Value(), steps - 1.0);
  EXPECT_EQ(m.delta_pulls_reused->Value(), static_cast<double>(steps));

  // A raw peer: from zeros, then the same generation twice (a resend: the same reply).
  RawPeer peer(context, server.endpoint());
  auto pull = [&](uint64_t base, DType dtype, std::vector<std::vector<uint8_t>>* frames) {
    Header h;
    h.type = MsgType::kPull;
    h.dtype = dtype;
    h.delta_pull = true;
    h.delta_base = base;
    const SliceMap map = SliceMap::Build(reg.variables, reg.max_slice_elements, 1).value();
    for (const SliceInfo& s : map.slices()) h.slices.push_back({s.id, 0, s.length});
    peer.SendHeader(h);
    return peer.Receive(frames);
  };
  std::vector<std::vector<uint8_t>> first, again, unknown;
  Result<Header> a = pull(0, DType::kInt8, &first);
  ASSERT_TRUE(a.ok() && a->status.ok()) << (a.ok() ? a->status.ToString() : "");
  EXPECT_TRUE(a->delta_pull);
  EXPECT_EQ(a->delta_base, 0u);
  Result<Header> b = pull(a->delta_generation, DType::kInt8, &again);
  Result<Header> c = pull(a->delta_generation, DType::kInt8, &unknown);
  ASSERT_TRUE(b.ok() && c.ok() && b->status.ok() && c->status.ok());
  EXPECT_EQ(b->delta_base, a->delta_generation);
  EXPECT_EQ(c->delta_generation, b->delta_generation) << "a resend gets the same reply";
  EXPECT_EQ(again, unknown);
  Result<Header> d = pull(12345678, DType::kInt8, &unknown);
  ASSERT_TRUE(d.ok() && d->status.ok());
  EXPECT_EQ(d->delta_base, 0u) << "a generation never given: from zeros";
  EXPECT_EQ(unknown, first) << "the same version from zeros: the same bytes";
  EXPECT_LE(m.delta_copies->Value(), 3.0);

  // Malformed: float32, a part of the shard, rows.
  Result<Header> wrong = pull(0, DType::kFloat32, nullptr);
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ(wrong->status.code(), StatusCode::kInvalidArgument) << wrong->status.ToString();
  Header part;
  part.type = MsgType::kPull;
  part.dtype = DType::kInt8;
  part.delta_pull = true;
  part.slices = {{0, 0, 10}};
  peer.SendHeader(part);
  Result<Header> refused = peer.Receive();
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->status.code(), StatusCode::kInvalidArgument) << refused->status.ToString();
}

// Copies are bounded: readers at ever new generations evict the least recently used.
TEST(ServerDeltaPullTest, CopiesPastTheBoundEvictTheLeastRecentlyUsed) {
  zmq::context_t context;
  ServerOptions options;
  options.max_delta_copies = 2;
  InProcessServer server(context, options);
  ASSERT_TRUE(server.started());
  const ModelRegistration reg = SmallModel(1);
  auto pusher = ConnectClient(context, {server.endpoint()}, 1);
  auto reader = ConnectClient(context, {server.endpoint()}, 1, DType::kInt8);
  auto exact = ConnectClient(context, {server.endpoint()}, 1);
  ASSERT_TRUE(pusher && reader && exact);
  ASSERT_TRUE(pusher->Register(reg, kWait).ok() && reader->Register(reg, kWait).ok() &&
              exact->Register(reg, kWait).ok());
  DeltaReference copy(reg);
  for (int step = 0; step < 6; ++step) {
    auto g = Scaled(Gradients(reg), 1.0f + static_cast<float>(step), 0.001f);
    ASSERT_TRUE(pusher->Push(Pointers<const float>(g), 8).ok());
    std::vector<std::vector<float>> held = InitialValues(reg), got = held;
    ASSERT_TRUE(exact->Pull(Pointers<float>(held)).ok());
    ASSERT_TRUE(reader->Pull(Pointers<float>(got)).ok());
    ASSERT_EQ(got, copy.Pull(held)) << "step " << step;  // its own copy is never the one evicted
  }
  EXPECT_EQ(server.metrics().delta_copies->Value(), 2.0);
  EXPECT_EQ(server.metrics().delta_copies_evicted->Value(), 4.0);  // 6 copies made, 2 kept
  EXPECT_EQ(server.metrics().delta_pulls_from_zeros->Value(), 1.0);
}

// A frame of the wrong length is refused like any other; rows never travel in int8; a
// client with embedding tables refuses int8 before it registers.
TEST(ServerInt8Test, MalformedInt8FramesAndInt8RowsAreRefused) {
  zmq::context_t context;
  InProcessServer server(context, 0, 1);
  ASSERT_TRUE(server.started());
  const ModelRegistration reg = SmallModel(1);
  auto client = ConnectClient(context, {server.endpoint()}, 1);
  ASSERT_TRUE(client && client->Register(reg, kWait).ok());
  RawPeer peer(context, server.endpoint());
  // The slice of 50 kernel elements that a chunk's edge (element 128) cuts: 52 bytes.
  const SliceMap map = SliceMap::Build(reg.variables, reg.max_slice_elements, 1).value();
  const SliceInfo* cut = nullptr;
  for (const SliceInfo& s : map.slices()) {
    if (s.length == 50 && s.offset < 128 && s.offset + 50 > 128) cut = &s;
  }
  ASSERT_NE(cut, nullptr);
  ASSERT_EQ(Int8Bytes(cut->offset, 50), 52u);
  Header push;
  push.type = MsgType::kPush;
  push.dtype = DType::kInt8;
  push.slices = {{cut->id, 0, 50}};
  peer.SendHeader(push, {std::vector<uint8_t>(51, 0)});  // one chunk's exponent missing
  Result<Header> reply = peer.Receive();
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(reply->status.message(), HasSubstr("expected 52"));
  EXPECT_EQ(server.Rejected(RejectReason::kByteLength), 1);

  std::vector<float> g(50, 0.25f);
  std::vector<uint8_t> wire(52);
  EncodeRange(g.data(), 50, cut->offset, DType::kInt8, wire.data());
  peer.SendHeader(push, {wire});
  reply = peer.Receive();
  ASSERT_TRUE(reply.ok());
  EXPECT_TRUE(reply->status.ok()) << reply->status.ToString();

  // An int8 pull is answered in int8 (a tool may ask; a worker asks only for aggregates).
  std::vector<std::vector<uint8_t>> frames;
  reply = RawPull(peer, DType::kInt8, cut->id, 50, &frames);
  ASSERT_TRUE(reply.ok());
  ASSERT_TRUE(reply->status.ok()) << reply->status.ToString();
  EXPECT_EQ(reply->dtype, DType::kInt8);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].size(), 52u);

  ModelRegistration with_table = reg;
  with_table.tables.push_back({"emb", 100, 4, {}});
  PsClientOptions o;
  o.ps_addresses = {server.endpoint()};
  o.request_timeout = kWait;
  o.wire_dtype = DType::kInt8;
  auto tabled = PsClient::Connect(context, o);
  ASSERT_TRUE(tabled.ok());
  const Status refused = (*tabled)->Register(with_table, kWait);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("embedding tables"));
}

// The probe (PsClientOptions::topk_probe: one step in each format after the first): where it
// finds top-k does not pay (margin 1: nothing ever does) the client pushes the last format it
// tried from then on — int8 without the float32 check, float32 with it (compression off) —
// and where it pays (a margin far below 0) top-k again. One residual carries over every
// switch (the first float32 push sends what it held, and zeroes it), so
// each push applies exactly what one reference client switching alike sends; a float32 step
// pulls the parameters whole, and the delta pulls after it go on from the copy.
TEST(ServerTopKTest, TheProbeSwitchesToInt8WhereTopKDoesNotPayKeepingTheResidual) {
  const WireFormat topk(DType::kTopK, 3), int8(DType::kInt8), float32(DType::kFloat32);
  for (const bool check_float32 : {false, true}) {
    for (const double margin : {1.0, -1e9}) {
      SCOPED_TRACE("margin " + std::to_string(margin) + ", float32 " +
                   std::to_string(check_float32));
      zmq::context_t context;
      InProcessServer server(context, 0, 1);
      ASSERT_TRUE(server.started());
      const ModelRegistration reg = SmallModel(1);
      PsClientOptions o;
      o.ps_addresses = {server.endpoint()};
      o.request_timeout = kWait;
      o.wire_dtype = topk;
      o.topk_probe = {.enabled = true, .start_after = 1, .window = 1, .rounds = 1,
                      .margin = margin, .float32 = check_float32};
      auto client = PsClient::Connect(context, o);
      auto exact = ConnectClient(context, {server.endpoint()}, 1);
      ASSERT_TRUE(client.ok() && exact);
      ASSERT_TRUE((*client)->Register(reg, kWait).ok());
      ASSERT_TRUE(exact->Register(reg, kWait).ok());
      // Step 1 before the probe, 2 in top-k, 3 in int8, (4 in float32,) then the verdict's.
      std::vector<WireFormat> formats = {topk, topk, int8};
      if (check_float32) formats.push_back(float32);
      const WireFormat after = margin < 0 ? topk : check_float32 ? float32 : int8;
      formats.insert(formats.end(), {after, after});
      CodecReference ref(reg, topk);
      std::vector<std::vector<float>> expected = InitialValues(reg);
      std::vector<std::vector<float>> params = {std::vector<float>(200), std::vector<float>(10)};
      std::vector<std::vector<float>> held = params;
      bool folded = false;
      for (size_t step = 0; step < formats.size(); ++step) {
        EXPECT_EQ((*client)->push_format(), formats[step]) << "step " << step + 1;
        ref.set_wire(formats[step]);
        auto g = Scaled(Gradients(reg), 1.0f + static_cast<float>(step), 0.0013f);
        // The first float32 push carries the residual too.
        const bool fold = !folded && formats[step] == float32;
        const auto sent = fold ? ref.Fold(g) : ref.Send(g);
        folded = folded || fold;
        ASSERT_TRUE((*client)->PushPull(Pointers<const float>(g), 8, Pointers<float>(params)).ok());
        ASSERT_TRUE(exact->Pull(Pointers<float>(held)).ok());
        for (size_t v = 0; v < held.size(); ++v) {
          for (size_t i = 0; i < held[v].size(); ++i) expected[v][i] -= kLearningRate * sent[v][i];
          ASSERT_EQ(held[v], expected[v]) << "step " << step + 1 << ", variable " << v;
          if (formats[step] == float32) ASSERT_EQ(params[v], held[v]) << "step " << step + 1;
        }
      }
      EXPECT_EQ(folded, check_float32);
    }
  }
}

// The probe with a worker-side aggregate (sync, the workers' optimizer): both ranks switch at
// the same steps and take one verdict from both ranks' medians (a Gather), so every step's
// pushes share one format, the servers quantize the average in it, and the pulls ask for it
// too: each step both ranks read bit for bit what one process applying the same codecs,
// switching alike, computes (a pull left in top-k after the switch would read a top-k of the
// int8 average instead); with the float32 check, the first float32 step carries the ranks'
// residuals and the servers' too.
TEST(ServerTopKTest, TheProbeWithAWorkerSideAggregateSwitchesEveryRankAlike) {
  const WireFormat topk(DType::kTopK, 3), int8(DType::kInt8), float32(DType::kFloat32);
  for (const auto& [margin, check_float32] :
       std::vector<std::pair<double, bool>>{{1.0, false}, {-1e9, false}, {1.0, true}}) {
    SCOPED_TRACE("margin " + std::to_string(margin) + ", float32 " +
                 std::to_string(check_float32));
    zmq::context_t context;
    InProcessServer server(context, SyncOfTwo());
    ASSERT_TRUE(server.started());
    ModelRegistration reg = SmallModel(1);
    reg.mode = "sync";
    reg.optimizer.kind = OptimizerKind::kAggregate;
    reg.optimizer.learning_rate = 1.0f;
    std::vector<std::unique_ptr<PsClient>> workers = SyncWorkers(
        context, server, reg, topk,
        {.enabled = true, .start_after = 1, .window = 1, .rounds = 1, .margin = margin,
         .float32 = check_float32});
    ASSERT_EQ(workers.size(), 2u);
    std::vector<WireFormat> formats = {topk, topk, int8};
    if (check_float32) formats.push_back(float32);
    const WireFormat after = margin < 0 ? topk : check_float32 ? float32 : int8;
    formats.insert(formats.end(), {after, after});
    bool folded = false;
    CodecReference rank0(reg, topk), rank1(reg, topk), server_side(reg, topk);
    for (size_t step = 0; step < formats.size(); ++step) {
      for (auto& w : workers) EXPECT_EQ(w->push_format(), formats[step]) << "step " << step + 1;
      for (CodecReference* r : {&rank0, &rank1, &server_side}) r->set_wire(formats[step]);
      auto g0 = Scaled(Gradients(reg), 0.3f + static_cast<float>(step), 0.0007f);
      auto g1 = Scaled(Gradients(reg), -1.7f, 0.0011f * static_cast<float>(step));
      // The first float32 step sends every residual too: the ranks' and the servers'.
      const bool fold = !folded && formats[step] == float32;
      folded = folded || fold;
      const auto s0 = fold ? rank0.Fold(g0) : rank0.Send(g0);
      const auto s1 = fold ? rank1.Fold(g1) : rank1.Send(g1);
      std::vector<std::vector<float>> average = s0;
      for (size_t v = 0; v < average.size(); ++v) {
        for (size_t i = 0; i < average[v].size(); ++i) {
          average[v][i] = (0.0f + s0[v][i] + s1[v][i]) * 0.5f;
        }
      }
      const auto want = fold ? server_side.Fold(average) : server_side.Send(average);
      std::vector<std::vector<float>> got0 = {std::vector<float>(200), std::vector<float>(10)};
      std::vector<std::vector<float>> got1 = got0;
      Status other;
      std::thread one([&] {
        other = workers[1]->PushPull(Pointers<const float>(g1), 8, Pointers<float>(got1),
                                     static_cast<int64_t>(step) + 1);
      });
      const Status mine = workers[0]->PushPull(Pointers<const float>(g0), 8,
                                               Pointers<float>(got0),
                                               static_cast<int64_t>(step) + 1);
      one.join();
      ASSERT_TRUE(mine.ok() && other.ok()) << mine.ToString() << " / " << other.ToString();
      ASSERT_EQ(got0, want) << "step " << step + 1;
      ASSERT_EQ(got1, want) << "step " << step + 1;
    }
  }
}

TEST(TopKPaysTest, ComparesTheMedianStepsWithAMargin) {
  EXPECT_TRUE(TopKPays({0.010, 0.011, 0.5}, {0.012, 0.012, 0.012}, 0.0));   // an outlier
  EXPECT_FALSE(TopKPays({0.013, 0.013, 0.001}, {0.012, 0.012, 0.5}, 0.0));
  EXPECT_FALSE(TopKPays({0.0100}, {0.0105}, 0.10));  // faster, but not by 10 %
  EXPECT_TRUE(TopKPays({0.0090}, {0.0105}, 0.10));
  EXPECT_TRUE(TopKPays({}, {0.0105}, 0.0));  // nothing measured: kept
}

// A top-k frame whose indices are out of order or outside their chunk is refused before
// anything is applied, as is a keep outside 1..255; a well-formed one applies, and a top-k
// pull is answered in top-k at the keep asked for.
TEST(ServerTopKTest, MalformedTopKFramesAndKeepsAreRefused) {
  zmq::context_t context;
  InProcessServer server(context, 0, 1);
  ASSERT_TRUE(server.started());
  const ModelRegistration reg = SmallModel(1);
  auto client = ConnectClient(context, {server.endpoint()}, 1);
  ASSERT_TRUE(client && client->Register(reg, kWait).ok());
  RawPeer peer(context, server.endpoint());
  const SliceMap map = SliceMap::Build(reg.variables, reg.max_slice_elements, 1).value();
  const SliceInfo& first = map.slices()[0];
  ASSERT_EQ(first.length, 50);
  const WireFormat wire(DType::kTopK, 3);
  std::vector<float> g(50);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 11);
  std::vector<uint8_t> good(WireBytes(wire, 50, first.offset));
  ASSERT_EQ(good.size(), 7u);
  EncodeRange(g.data(), 50, first.offset, wire, good.data());
  Header push;
  push.type = MsgType::kPush;
  push.dtype = DType::kTopK;
  push.topk_keep = 3;
  push.slices = {{first.id, 0, 50}};

  std::vector<uint8_t> bad = good;
  bad[3] = 50;  // the last index, past the slice's 50 elements
  peer.SendHeader(push, {bad});
  Result<Header> reply = peer.Receive();
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(reply->status.message(), HasSubstr("not a top-k frame"));
  EXPECT_EQ(server.Rejected(RejectReason::kMalformed), 1);
  std::swap(bad[1], bad[2]);
  bad[3] = good[3];
  peer.SendHeader(push, {bad});
  reply = peer.Receive();
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(server.Rejected(RejectReason::kMalformed), 2);

  push.topk_keep = 0;
  peer.SendHeader(push, {good});
  reply = peer.Receive();
  ASSERT_TRUE(reply.ok());
  EXPECT_THAT(reply->status.message(), HasSubstr("1 to 255"));
  EXPECT_EQ(server.Rejected(RejectReason::kDType), 1);

  push.topk_keep = 3;
  peer.SendHeader(push, {good});
  reply = peer.Receive();
  ASSERT_TRUE(reply.ok());
  EXPECT_TRUE(reply->status.ok()) << reply->status.ToString();

  std::vector<std::vector<uint8_t>> frames;
  reply = RawPull(peer, wire, first.id, 50, &frames);
  ASSERT_TRUE(reply.ok());
  ASSERT_TRUE(reply->status.ok()) << reply->status.ToString();
  EXPECT_EQ(reply->wire(), wire);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].size(), 7u);
  EXPECT_TRUE(WellFormedRange(frames[0].data(), 50, first.offset, wire));
}

}  // namespace
}  // namespace parasync
