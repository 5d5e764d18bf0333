#include "tests/fuzz/fuzz_input.h"

#include <algorithm>

namespace parasync::fuzz {

Config Config::FromByte(uint8_t byte) {
  Config c;
  switch (byte & 3) {
    case 0: c.mode.kind = TrainingMode::Kind::kAsync; break;
    case 1: c.mode.kind = TrainingMode::Kind::kSync; break;
    case 2:
      c.mode.kind = TrainingMode::Kind::kSsp;
      c.mode.staleness = 1;
      break;
    default:
      c.mode.kind = TrainingMode::Kind::kSync;
      c.replicas_to_aggregate = 1;
      break;
  }
  c.preregister = (byte & 4) != 0;
  switch ((byte >> 3) & 3) {
    case 0: c.optimizer = OptimizerKind::kSgd; break;
    case 1: c.optimizer = OptimizerKind::kMomentum; break;
    default:
      c.optimizer = OptimizerKind::kAdam;
      c.staleness_aware = ((byte >> 3) & 3) == 3;
      break;
  }
  c.drop_push_replies = (byte & 32) != 0;
  c.zero_barrier_timeout = (byte & 64) != 0;
  c.zero_worker_timeout = (byte & 128) != 0;
  return c;
}

uint8_t Config::ToByte() const {
  unsigned b = 0;
  if (mode.kind == TrainingMode::Kind::kSync) b = replicas_to_aggregate == 1 ? 3 : 1;
  if (mode.kind == TrainingMode::Kind::kSsp) b = 2;
  if (preregister) b |= 4;
  unsigned opt = 0;
  if (optimizer == OptimizerKind::kMomentum) opt = 1;
  if (optimizer == OptimizerKind::kAdam) opt = staleness_aware ? 3 : 2;
  b |= opt << 3;
  if (drop_push_replies) b |= 32;
  if (zero_barrier_timeout) b |= 64;
  if (zero_worker_timeout) b |= 128;
  return static_cast<uint8_t>(b);
}

Input Parse(const uint8_t* data, size_t size) {
  Input in;
  size_t pos = 0;
  if (pos < size) in.config = data[pos++];
  while (pos < size && in.messages.size() < kMaxMessages) {
    const size_t frames = 1 + data[pos++] % kMaxFrames;
    Message message;
    for (size_t f = 0; f < frames; ++f) {
      uint32_t length = 0;
      for (int i = 0; i < 4 && pos < size; ++i) {
        length |= static_cast<uint32_t>(data[pos++]) << (8 * i);
      }
      const size_t take = std::min<size_t>(length, size - pos);
      message.emplace_back(reinterpret_cast<const char*>(data + pos), take);
      pos += take;
    }
    in.messages.push_back(std::move(message));
  }
  return in;
}

std::string Serialize(const Input& input) {
  std::string out(1, static_cast<char>(input.config));
  for (const Message& m : input.messages) {
    out.push_back(static_cast<char>((m.size() - 1) % kMaxFrames));
    for (const std::string& f : m) {
      const auto length = static_cast<uint32_t>(f.size());
      for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
      out += f;
    }
  }
  return out;
}

ModelRegistration FuzzModel(const Config& config) {
  ModelRegistration reg;
  reg.variables = {{"dense/kernel", {20, 10}, DType::kFloat32, {InitKind::kUniform, 0.1f}},
                   {"dense/bias", {10}, DType::kFloat32, {InitKind::kConstant, 0.25f}}};
  reg.tables = {{"emb/fixed", kFixedTableRows, kFixedTableDim, {InitKind::kUniform, 0.05f}},
                {"emb/hashed", 0, kHashedTableDim, {InitKind::kConstant, 0.5f}}};
  reg.optimizer.kind = config.optimizer;
  reg.optimizer.learning_rate = 0.05f;
  reg.optimizer.staleness_aware = config.staleness_aware;
  reg.seed = 7;
  reg.max_slice_elements = 50;
  reg.num_shards = kNumShards;
  reg.mode = config.mode.ToString();
  return reg;
}

}  // namespace parasync::fuzz
