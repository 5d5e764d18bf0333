// LendableFloats: a float array that its owner can lend, without a copy, to readers on other
// threads — pull replies that ZeroMQ's I/O thread writes out after the server loop has moved
// on. The block is reference counted: the owner holds one reference, each loan another, and
// the block is freed when the last one is given back, whichever thread that is.
//
// The owner may write only while nothing is lent (lent() is false); a writer that finds the
// array lent writes into another block instead (copy-on-write; see Shard::ApplyToSlice).
// Not thread-safe apart from Lend/Return: one thread owns the object.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

namespace parasync {

class LendableFloats {
 public:
  LendableFloats() = default;
  // `n` floats, uninitialized, 64-byte aligned. Throws std::bad_alloc.
  explicit LendableFloats(int64_t n);
  ~LendableFloats() { Release(block_); }
  LendableFloats(LendableFloats&& other) noexcept : block_(other.block_) { other.block_ = nullptr; }
  LendableFloats& operator=(LendableFloats&& other) noexcept;
  LendableFloats(const LendableFloats&) = delete;
  LendableFloats& operator=(const LendableFloats&) = delete;

  float* data() { return block_ ? Floats(block_) : nullptr; }
  const float* data() const { return block_ ? Floats(block_) : nullptr; }
  int64_t size() const { return block_ ? block_->size : 0; }
  operator std::span<const float>() const { return {data(), static_cast<size_t>(size())}; }
  const float* begin() const { return data(); }
  const float* end() const { return data() + size(); }

  // True while a loan is outstanding. False means no other thread reads the array (every
  // loan's reads happened before its Return), so the owner may write it.
  bool lent() const { return block_ && block_->refs.load(std::memory_order_acquire) > 1; }

  // Takes a reference for a reader: the array stays valid, and unchanged by its owner, until
  // Return(token) — exactly once, from any thread, even after the owner is gone.
  // Precondition: data() != nullptr.
  void* Lend() const {
    block_->refs.fetch_add(1, std::memory_order_relaxed);
    return block_;
  }
  static void Return(void* token) noexcept { Release(static_cast<Block*>(token)); }

 private:
  struct Block {
    std::atomic<int64_t> refs;
    int64_t size;
  };
  static constexpr size_t kHeader = 64;  // keeps the floats 64-byte aligned
  static float* Floats(Block* b) {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(b) + kHeader);
  }
  static const float* Floats(const Block* b) {
    return reinterpret_cast<const float*>(reinterpret_cast<const char*>(b) + kHeader);
  }
  static void Release(Block* b) noexcept;

  Block* block_ = nullptr;
};

}  // namespace parasync
