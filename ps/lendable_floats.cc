#include "ps/lendable_floats.h"

#include <new>

namespace parasync {

namespace {
constexpr std::align_val_t kAlign{64};
}  // namespace

LendableFloats::LendableFloats(int64_t n) {
  void* p = ::operator new(kHeader + static_cast<size_t>(n) * sizeof(float), kAlign);
  block_ = new (p) Block{{1}, n};
}

LendableFloats& LendableFloats::operator=(LendableFloats&& other) noexcept {
  if (this != &other) {
    Release(block_);
    block_ = other.block_;
    other.block_ = nullptr;
  }
  return *this;
}

void LendableFloats::Release(Block* b) noexcept {
  // acq_rel: the last holder sees every other holder's reads finished before it frees.
  if (b == nullptr || b->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  b->~Block();
  ::operator delete(b, kAlign);
}

}  // namespace parasync
