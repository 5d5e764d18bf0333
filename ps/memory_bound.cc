#include "ps/memory_bound.h"

#include <algorithm>

#include <spdlog/fmt/fmt.h>

#include "ps/admission.h"
#include "ps/embedding_table.h"
#include "ps/update_rule.h"

namespace parasync {

namespace {

std::string Mib(int64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / 1048576.0);
}

// Process memory the model does not explain: code, libraries, ZeroMQ's and the metrics
// server's threads, RocksDB's block cache and memtables between flushes, the allocator's
// slack. Measured: an idle parasync-ps takes 13-20 MiB; the rest is headroom.
constexpr int64_t kBaseBytes = int64_t{96} << 20;
// Header-only replies (push acknowledgements, errors) ZeroMQ may queue for one peer: at
// most its send queue (1000 messages) of at most 1 KiB each (the stats reply aside).
constexpr int64_t kHeaderRepliesPerConnection = int64_t{1000} << 10;

}  // namespace

size_t PeerQueueBytes(int64_t max_message_bytes) {
  if (max_message_bytes <= 0 || max_message_bytes >= kServerPeerQueueBytes / kServerPeerQueue) {
    return static_cast<size_t>(kServerPeerQueueBytes);
  }
  return static_cast<size_t>(kServerPeerQueue * max_message_bytes);
}

int64_t UnreadBasis(const ServerOptions& options, int64_t elements, bool tables) {
  // Server::HandlePull refuses a rows reply larger than a message.
  return elements + (tables ? options.max_message_bytes / static_cast<int64_t>(sizeof(float)) : 0);
}

int64_t UnreadReplyCap(const ServerOptions& options, int64_t elements) {
  const int64_t values = elements * static_cast<int64_t>(sizeof(float));
  // Never below a reply for every worker at once (a sync step answers them together).
  if (options.max_unread_reply_bytes > 0) {
    return std::max(options.max_unread_reply_bytes, (options.num_workers + 1) * values);
  }
  return 2 * (options.num_workers + 2) * values;
}

int64_t DeltaCopies(const ServerOptions& options) {
  return options.max_delta_copies > 0 ? std::max<int64_t>(2, options.max_delta_copies)
                                      : options.num_workers + 2;
}

MemoryBound ComputeMemoryBound(const ServerOptions& options, int64_t elements, int slots,
                               int64_t row_bytes, bool delta_pulls) {
  const int64_t values = elements * static_cast<int64_t>(sizeof(float));
  MemoryBound b;
  b.base = kBaseBytes;
  // values + the spare copy-on-write buffer + slots; in steps (sync): a gradient per
  // contributing rank and their average; a 16-bit push widened; a store: a snapshot's copy,
  // its WriteBatch and its memtable entry (values and slots each), or a rollback's load.
  const bool steps = AppliesInSteps(options.mode);
  const int64_t copies = 2 + slots + (steps ? options.num_workers + 1 : 0) + 1 +
                         (options.store != nullptr ? 3 * (1 + slots) : 0);
  b.model = copies * values;
  b.unread = UnreadReplyCap(options, UnreadBasis(options, elements, row_bytes > 0));
  // Rows at capacity, and a snapshot's copy of them (the first after a restart may write
  // every row). The per-step sync accumulators are bounded by the messages they came in.
  int64_t rows = options.max_table_rows > 0 ? options.max_table_rows : 0;
  if (row_bytes > 0 && options.table_memory_bytes > 0) {
    const int64_t budget = std::max<int64_t>(1, options.table_memory_bytes / row_bytes);
    rows = rows > 0 ? std::min(rows, budget) : budget;
  }
  if (row_bytes > 0 && rows > 0) {
    b.tables = (1 + (options.store != nullptr ? 1 : 0)) * rows * row_bytes +
               AdmissionFilter::BytesFor(options.table_admit_after);
  }
  // One more frame being read past the limit and the deepest allocation the rollback or a
  // snapshot can add are covered by the terms above; a message read and not queued (refused
  // for a full queue, or a resend dropped) is not: one per server (the loop reads one at a
  // time and lets it go before the next).
  // Collectives: the payloads on the board, and as much again in replies whose payloads the
  // board has let go of and ZeroMQ has not yet written out.
  b.gather = 2 * options.max_gather_bytes;
  // Delta pulls: each copy the shard's values in float32, and a cached reply (a byte an
  // element and one a 128-element chunk, rounded up here to 2/7 of the values) from each copy
  // and from zeros.
  if (delta_pulls) {
    const int64_t copies = DeltaCopies(options);
    b.deltas = copies * values + (copies + 1) * (values * 2 / 7 + 1);
  }
  b.fixed = b.base + b.model + b.tables + b.unread + b.gather + b.deltas +
            options.max_message_bytes;
  // The loop queues up to kServerPeerQueue messages of a connection (the one being handled
  // among them), or more small ones weighing no more than those could together
  // (PeerQueueBytes), ZeroMQ up to kServerReceiveQueue more and decodes one more, each of at
  // most max_message_bytes. The gap: libzmq bounds each frame, not a message, and holds a
  // multipart message whole until its last frame is in, so one of many frames is held whole
  // before Receive refuses it (docs/reliability.md).
  b.per_connection = (kServerPeerQueue + kServerReceiveQueue + 1) * options.max_message_bytes +
                     kHeaderRepliesPerConnection;
  return b;
}

MemoryBound MemoryBoundFor(const ServerOptions& options, const ModelRegistration* reg,
                           int64_t elements) {
  if (reg == nullptr) return ComputeMemoryBound(options, options.max_model_bytes / 8, 0);
  const int slots = NumOptimizerSlots(reg->optimizer.kind);
  int64_t row_bytes = 0;
  for (const TableSpec& t : reg->tables) {
    row_bytes = std::max(row_bytes, EmbeddingTables::BytesPerRow(t.dim, slots,
                                                                 options.table_expire_after > 0));
  }
  return ComputeMemoryBound(options, elements, slots, row_bytes,
                            reg->optimizer.kind != OptimizerKind::kAggregate);
}

std::string MemoryBound::Describe() const {
  return fmt::format("{} + {} per connected peer (base {}, model {}, {}unread pull replies {}, "
                     "{}one message read past its queue {})",
                     Mib(fixed), Mib(per_connection), Mib(base), Mib(model),
                     tables > 0 ? "embedding rows " + Mib(tables) + ", " : std::string(),
                     Mib(unread),
                     deltas > 0 ? "delta pulls' copies " + Mib(deltas) + ", " : std::string(),
                     Mib(fixed - base - model - tables - unread - gather - deltas));
}

}  // namespace parasync
