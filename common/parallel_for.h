// ParallelFor: a fork-join over a fixed set of helper threads, for per-slice passes over a
// large tensor (Shard::Apply spreads a push's slices over them, PsClient the copy of a pull
// reply into the caller's parameters). The items are claimed one at a time from a shared
// counter, by the caller at once and by each helper as soon as it runs, so the caller never
// waits for a helper to be scheduled: on a machine whose cores are busy (with ZeroMQ's I/O
// threads, say) it simply does more of the items itself, and waits at the end only for the
// items helpers have already taken. One caller at a time. Helpers flush denormals to zero
// (common/denormals.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace parasync {

class ParallelFor {
 public:
  // The caller and threads - 1 helpers (none when threads <= 1).
  explicit ParallelFor(int threads);
  ~ParallelFor();
  ParallelFor(const ParallelFor&) = delete;
  ParallelFor& operator=(const ParallelFor&) = delete;

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

  // Calls fn(i) exactly once for every i in [0, n), on the calling thread and on whichever
  // helpers join in, and returns when every call has returned (their effects visible to the
  // caller). `fn` must not throw.
  void ForEach(size_t n, const std::function<void(size_t)>& fn);

 private:
  struct Job {
    const std::function<void(size_t)>* fn;
    size_t n;
    std::atomic<size_t> next{0};
  };
  static void Drain(Job& job);
  void Helper();

  std::mutex mu_;
  std::condition_variable start_;
  std::condition_variable done_;
  Job* job_ = nullptr;       // guarded by mu_; null once the caller stopped taking helpers
  uint64_t generation_ = 0;  // guarded by mu_
  int active_ = 0;           // guarded by mu_: helpers inside the current job
  bool stop_ = false;        // guarded by mu_
  std::vector<std::thread> helpers_;
};

}  // namespace parasync
