#include "ps/admission.h"

#include <algorithm>
#include <limits>

namespace parasync {

namespace {

// SplitMix64's finalizer: a good 64-bit mix of a key and a row's seed.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

AdmissionFilter::AdmissionFilter(int threshold, int width_bits)
    : threshold_(std::min(threshold, static_cast<int>(std::numeric_limits<uint16_t>::max()))),
      width_bits_(width_bits) {
  if (enabled()) counts_.assign(static_cast<size_t>(kDepth) << width_bits_, 0);
}

uint64_t AdmissionFilter::Cell(int row, const RowKey& key) const {
  const uint64_t h = Mix(key.id ^ Mix((uint64_t{key.table} << 8) | static_cast<uint64_t>(row)));
  return (static_cast<uint64_t>(row) << width_bits_) | (h >> (64 - width_bits_));
}

int AdmissionFilter::Estimate(const RowKey& key) const {
  if (!enabled()) return 0;
  uint16_t least = std::numeric_limits<uint16_t>::max();
  for (int r = 0; r < kDepth; ++r) least = std::min(least, counts_[Cell(r, key)]);
  return least;
}

bool AdmissionFilter::CountAndAdmit(const RowKey& key) {
  if (!enabled()) return true;
  // Conservative update: only the cells at the minimum go up, to the new count.
  const int count = Estimate(key) + 1;
  for (int r = 0; r < kDepth; ++r) {
    uint16_t& c = counts_[Cell(r, key)];
    if (c < count && c < std::numeric_limits<uint16_t>::max()) c = static_cast<uint16_t>(count);
  }
  return count >= threshold_;
}

void AdmissionFilter::Clear() { std::fill(counts_.begin(), counts_.end(), 0); }

}  // namespace parasync
