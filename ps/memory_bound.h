// MemoryBound: the memory a parameter server can take, computed from its options and the
// model's size: stated before anything is registered, and again once a model is. The caps on
// unread pull replies that keep the bound (Server refuses a pull past them) come from here
// too. Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/model_spec.h"
#include "ps/server_options.h"

namespace parasync {

// The memory a server can take, stated before anything is registered and again, with the
// model's figures, once it is: `fixed` bytes plus `per_connection` bytes for each connected
// peer. It holds whatever a peer sends or fails to read (ps/memory_bound.cc).
struct MemoryBound {
  int64_t fixed = 0;
  int64_t per_connection = 0;
  // The terms, for the log and --help.
  int64_t base = 0;       // code, libraries, threads, metrics, RocksDB's caches
  int64_t model = 0;      // values, spare, slots, sync buffers, snapshot copies
  int64_t unread = 0;     // pull replies not yet written out
  int64_t tables = 0;     // embedding rows at --max-table-rows, and a snapshot's copy of them
  int64_t gather = 0;     // collectives' payloads held, and their replies not yet written out
  int64_t deltas = 0;     // readers' copies for delta pulls and their cached replies
  std::string Describe() const;
};
// For a shard holding `elements` floats with `slots` optimizer slots per element. Before
// registration, pass the elements --max-model-bytes admits.
// `row_bytes`: the bytes one embedding row takes here (EmbeddingTables::BytesPerRow of the
// widest table; 0 without tables).
// `delta_pulls`: whether the model's pulls may be delta pulls (a server-side optimizer).
MemoryBound ComputeMemoryBound(const ServerOptions& options, int64_t elements, int slots,
                               int64_t row_bytes = 0, bool delta_pulls = true);
// The copies ps/delta_pulls.h keeps at most (options.max_delta_copies, or the workers + 2).
int64_t DeltaCopies(const ServerOptions& options);
// The bound of a server whose shard holds `elements` of the model registered as `reg` (its
// optimizer's slots, its widest table's rows); before a registration (null), the bound for
// the largest model --max-model-bytes admits.
MemoryBound MemoryBoundFor(const ServerOptions& options, const ModelRegistration* reg,
                           int64_t elements);
// The unread-reply cap in force (options.max_unread_reply_bytes, or its default).
int64_t UnreadReplyCap(const ServerOptions& options, int64_t elements);
// The elements the unread-reply caps are computed from: the shard's values and, with
// embedding tables (`tables`), one message's worth of rows (a pull whose rows' reply is
// larger than a message is refused).
int64_t UnreadBasis(const ServerOptions& options, int64_t elements, bool tables);
// The weight of small requests a connection's queue takes past kServerPeerQueue of them:
// kServerPeerQueueBytes, or less when kServerPeerQueue messages of `max_message_bytes` are
// less, which is what the memory bound counts a connection's queue as.
size_t PeerQueueBytes(int64_t max_message_bytes);

}  // namespace parasync
