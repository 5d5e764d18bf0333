// The fuzz input format of the PS message fuzzer (tests/fuzz/ps_message_fuzzer.cc), shared
// with the seed generator (make_corpus.cc). See docs/fuzzing.md.
//
//   input   := config message*
//   config  := 1 byte: bits 0-1 mode (0 async, 1 sync, 2 ssp:1, 3 sync with
//              replicas_to_aggregate 1), bit 2 the harness registers FuzzModel() first,
//              bits 3-4 its optimizer (sgd, momentum, adam, adam staleness-aware), bit 5 fault
//              injection (every 2nd push reply dropped), bit 6 barrier timeout 0 (a parked
//              pull fails at the next turn), bit 7 worker timeout 0 (every live rank is
//              declared dead at the next turn; its next message revives it)
//   message := count frame{1 + count % kMaxFrames}
//   frame   := length (u32 little-endian) bytes{length}
//
// Frame 0 is the header frame, the rest are tensor frames (a slice's values; for embedding rows
// an ids frame, and in a push a values frame, per row range): exactly what a DEALER sends. Parsing
// never fails: a length past the end takes what is left, a missing config byte is 0, and at
// most kMaxMessages messages are taken. An input is therefore any byte string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/mode.h"
#include "common/model_spec.h"

namespace parasync::fuzz {

inline constexpr size_t kMaxFrames = 64;
inline constexpr size_t kMaxMessages = 64;
// The server under test is shard 0 of this many, with this many workers.
inline constexpr int kNumShards = 2;
inline constexpr int kNumWorkers = 2;

struct Config {
  TrainingMode mode;
  int replicas_to_aggregate = 0;
  bool preregister = false;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  bool staleness_aware = false;
  bool drop_push_replies = false;
  bool zero_barrier_timeout = false;
  bool zero_worker_timeout = false;

  static Config FromByte(uint8_t byte);
  uint8_t ToByte() const;
};

using Message = std::vector<std::string>;  // frames: header, then tensors

struct Input {
  uint8_t config = 0;
  std::vector<Message> messages;
};

Input Parse(const uint8_t* data, size_t size);
std::string Serialize(const Input& input);

// FuzzModel's embedding tables: table 0 has kFixedTableRows rows, table 1 is unbounded (any
// uint64 id); each shard holds the rows ShardOfRow gives it.
inline constexpr int64_t kFixedTableRows = 1000;
inline constexpr int64_t kFixedTableDim = 4;
inline constexpr int64_t kHashedTableDim = 2;

// The small model the harness registers (and the seeds use): a 20x10 kernel in four 50-element
// slices and a 10-element bias, split over kNumShards shards, plus two embedding tables
// ("emb/fixed": kFixedTableRows rows of kFixedTableDim floats; "emb/hashed": unbounded, rows of
// kHashedTableDim floats), for `config`'s mode and optimizer.
ModelRegistration FuzzModel(const Config& config);

}  // namespace parasync::fuzz
