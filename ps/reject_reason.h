// RejectReason: why a parameter server refused a request — the label of
// parasync_ps_rejected_total, shared by the Shard, the embedding tables and the Server.
#pragma once

#include <cstdint>
#include <string_view>

namespace parasync {

// Why a request was refused; the label of parasync_ps_rejected_total.
enum class RejectReason : uint8_t {
  kNone = 0,
  kMalformed,          // header failed the FlatBuffers verifier or made no sense
  kVersionMismatch,    // built from another schema
  kNotRegistered,      // pull/push before any Register
  kRegisterMismatch,   // Register differing from the registered model
  kBadRegistration,    // invalid variables/optimizer, wrong shard count
  kUnknownSlice,       // slice id not in the map or not on this shard
  kOrder,              // slice ids not strictly increasing
  kRange,              // element range outside the slice
  kByteLength,         // tensor frame length != count * dtype size
  kFrameCount,         // number of tensor frames != number of ranges
  kDType,              // dtype that is not a wire dtype
  kNonFinite,          // gradient with NaN or Inf
  kUnsupported,        // message type this server does not accept
  kBadRank,            // worker rank outside the cluster
  kDuplicate,          // sync: a second gradient from one rank for one step
  kBadVersion,         // gradient computed from a version the shard has not reached
  kPartial,            // sync: a push that does not cover every slice of the shard
  kBarrierTimeout,     // a pull waited longer than the barrier timeout
  kStoreFailed,        // every-update: the store failed a write; nothing more is acknowledged
  kUnreadReplies,      // a pull while this peer (or all peers) left too many reply bytes unread
  kQueueFull,          // past its connection's queue: kServerPeerQueue waiting, no room by weight
  // Not a reason: the number of them. New reasons go above it.
  kCount,
};
// Every reason, kNone included: the size of the by-reason arrays (metrics), taken from the
// enum itself. (RejectReason has no counterpart on the wire: schema/parasync.fbs carries a
// status Code only, so there is no generated enum to tie it to.)
inline constexpr int kNumRejectReasons = static_cast<int>(RejectReason::kCount);
static_assert(kNumRejectReasons - 1 == static_cast<int>(RejectReason::kQueueFull),
              "a new RejectReason goes after kQueueFull and before kCount: update this "
              "line, RejectReasonName and the metrics' label test with it");
std::string_view RejectReasonName(RejectReason reason);

}  // namespace parasync
