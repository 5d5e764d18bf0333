// AdmissionFilter: Monolith's frequency filter for embedding ids — an id gets a row only once
// `threshold` pushes have touched it, so ids seen once or twice (most of a long tail) cost no
// memory and no disk. Counts are kept approximately in fixed memory: a count-min sketch
// (4 rows of 2^width_bits 16-bit saturating counters) with conservative update, so a count
// is never under the truth and rarely over it while the ids counted are few next to the
// width. Counts are not persisted: after a restart an id not yet admitted counts anew.
//
// Not thread-safe: owned by one EmbeddingTables.
#pragma once

#include <cstdint>
#include <vector>

#include "ps/row_snapshot.h"

namespace parasync {

class AdmissionFilter {
 public:
  static constexpr int kDepth = 4;
  static constexpr int kWidthBits = 20;
  // threshold <= 1: every id is admitted at its first push (no memory is taken).
  explicit AdmissionFilter(int threshold = 0, int width_bits = kWidthBits);

  bool enabled() const { return threshold_ > 1; }
  int threshold() const { return threshold_; }
  // Counts one more push of `key` and returns true if its count has reached the threshold
  // (always true when !enabled()).
  bool CountAndAdmit(const RowKey& key);
  // The count of `key` as the sketch has it (never below the pushes counted).
  int Estimate(const RowKey& key) const;
  // Forgets every count.
  void Clear();
  // The sketch's memory.
  int64_t bytes() const { return static_cast<int64_t>(counts_.size() * sizeof(uint16_t)); }
  // What bytes() is for a filter of `threshold` and `width_bits`, without making one.
  static int64_t BytesFor(int threshold, int width_bits = kWidthBits) {
    return threshold > 1 ? int64_t{kDepth} * (int64_t{1} << width_bits) *
                               static_cast<int64_t>(sizeof(uint16_t))
                         : 0;
  }

 private:
  uint64_t Cell(int row, const RowKey& key) const;

  int threshold_;
  int width_bits_;
  std::vector<uint16_t> counts_;  // kDepth rows of 2^width_bits_, row-major; empty if disabled
};

}  // namespace parasync
