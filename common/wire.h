// The wire codec: C++ values <-> the FlatBuffers header frame of schema/parasync.fbs.
//
// This is the only code that includes the generated FlatBuffers header. A message is a
// Header frame followed by one raw little-endian tensor frame per SliceRange that carries
// data (Pull replies, Push requests). Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/float_codec.h"
#include "common/model_spec.h"
#include "common/progress.h"
#include "common/status.h"

namespace parasync {

// Bumped on every incompatible change of schema/parasync.fbs or of message semantics. Not for
// additions a peer without them reads as before (new fields with defaults, such as the
// embedding tables): the stores keep their registration as a Header frame, and a bump would
// make every older store unreadable.
inline constexpr uint32_t kProtocolVersion = 3;

enum class MsgType : uint8_t {
  kRegister = 0,
  kPull = 1,
  kPush = 2,
  kStats = 3,
  kShutdown = 4,
  kHeartbeat = 5,
  kLeave = 6,
  kCheckpoint = 7,
  kGather = 8,
};
std::string_view MsgTypeName(MsgType type);
inline constexpr int kNumMsgTypes = 9;
// Tied to the enum here, and to the schema's MsgType in common/wire.cc.
static_assert(static_cast<int>(MsgType::kGather) + 1 == kNumMsgTypes,
              "kNumMsgTypes must count every MsgType");

struct SliceRange {
  uint32_t slice_id = 0;
  int64_t begin = 0;  // first element within the slice
  int64_t count = 0;  // elements
  bool operator==(const SliceRange&) const = default;
};

// `count` rows of embedding table `table` by id (schema/parasync.fbs, RowRange): their ids
// frame (and values frame) follow the slices' frames.
struct RowRange {
  uint32_t table = 0;
  int64_t count = 0;
  bool operator==(const RowRange&) const = default;
};

struct WorkerStats {
  bool live = false;
  int64_t clock = 0;
  int64_t gradients = 0;
  int64_t dropped = 0;
  bool operator==(const WorkerStats&) const = default;
};

struct ShardStats {
  int32_t shard = 0;
  int64_t version = 0;
  int64_t examples = 0;
  int32_t num_slices = 0;
  int64_t num_elements = 0;
  int64_t requests = 0;
  int64_t rejected = 0;
  bool registered = false;
  std::string mode;
  int32_t live_workers = 0;
  int64_t dropped_stale = 0;
  int64_t max_version_staleness = 0;
  int64_t max_clock_staleness = 0;
  int64_t blocked_pulls = 0;
  int64_t workers_declared_dead = 0;
  std::vector<WorkerStats> workers;  // by rank
  std::optional<ModelRegistration> registration;  // the registered model, once there is one
  int64_t rows_held = 0;  // embedding rows held, all tables
};

struct Header {
  uint32_t protocol_version = kProtocolVersion;
  MsgType type = MsgType::kPull;
  uint64_t request_id = 0;
  int32_t rank = -1;
  Status status;  // replies: outcome
  DType dtype = DType::kFloat32;
  uint8_t topk_keep = 0;  // dtype kTopK: elements sent per chunk (common/topk_codec.h)
  WireFormat wire() const { return {dtype, topk_keep}; }
  std::vector<SliceRange> slices;
  int64_t batch_examples = 0;
  int64_t version = 0;      // push: version read; replies: shard version
  int64_t min_version = 0;  // sync pull: wait for this version
  int64_t clock = 0;        // register reply: the rank's clock
  bool dropped = false;     // push reply: stale gradient dropped
  uint64_t incarnation = 0; // replies: the server's; requests: the one last heard
  uint64_t seq = 0;         // push: (sender incarnation << 32) | counter; 0 = none
  bool replayed = false;    // push reply: already applied, not applied again
  int64_t staleness = 0;    // push reply: versions applied between read and acceptance
  DataProgress progress;    // push: sender's position after it; register reply: the rank's
  std::optional<ModelRegistration> registration;  // Register requests
  std::optional<ShardStats> stats;                // Stats replies
  std::vector<RowRange> rows;  // pull/push: embedding rows (frames after the slices')
  std::string key;             // gather: the collective's name
  std::vector<int32_t> ranks;  // gather reply: whose payload each frame is; push: a group's members
  // Requests of a restarted worker not yet back in the run: the server does not count the
  // rank live for them; a gather with it waits to be admitted at its key's next round.
  bool joining = false;
  std::vector<int32_t> admitted;  // gather reply: ranks admitted back at this round
  // Delta pulls (ps/delta_pulls.h). Pull: the change from the copy of generation delta_base
  // (0: none) is asked for, in int8 or top-k. Reply: the frames are changes to the copy of
  // generation delta_base (0: to zeros, in int8), which becomes delta_generation.
  bool delta_pull = false;
  uint64_t delta_base = 0;
  uint64_t delta_generation = 0;
};

// Serializes `header` into a fresh buffer. Never fails.
std::vector<uint8_t> EncodeHeader(const Header& header);

// Parses a header frame. Returns Corruption if the bytes fail the FlatBuffers Verifier, hold
// an enum value this build does not know or misaligned 8-byte vector elements (which no
// FlatBufferBuilder writes); never reads outside [data, data+size).
// `data` need not be aligned. A header of another protocol version comes back with only
// protocol_version, request_id and rank filled in, so the receiver can refuse it by name.
Result<Header> DecodeHeader(const void* data, size_t size);

}  // namespace parasync
