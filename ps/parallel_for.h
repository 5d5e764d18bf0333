// ParallelFor: a fork-join over a fixed set of helper threads, for the server loop's large
// updates (Shard::Apply splits a push's slices among them). The calling thread takes part 0;
// each helper one other part; Run returns when every part is done. One caller at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace parasync {

class ParallelFor {
 public:
  // `threads` parts in all: the caller and threads - 1 helpers (none when threads <= 1).
  explicit ParallelFor(int threads);
  ~ParallelFor();
  ParallelFor(const ParallelFor&) = delete;
  ParallelFor& operator=(const ParallelFor&) = delete;

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

  // Calls fn(part, threads()) once for every part in [0, threads()), part 0 on the calling
  // thread, and returns when all have returned. `fn` must not throw.
  void Run(const std::function<void(int part, int parts)>& fn);

 private:
  void Helper(int part);

  std::mutex mu_;
  std::condition_variable start_;
  std::condition_variable done_;
  const std::function<void(int, int)>* job_ = nullptr;  // guarded by mu_
  uint64_t generation_ = 0;                            // guarded by mu_
  int running_ = 0;                                    // guarded by mu_
  bool stop_ = false;                                  // guarded by mu_
  std::vector<std::thread> helpers_;
};

}  // namespace parasync
