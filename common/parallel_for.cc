#include "common/parallel_for.h"

#include "common/denormals.h"

namespace parasync {

ParallelFor::ParallelFor(int threads) {
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this] { Helper(); });
}

ParallelFor::~ParallelFor() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void ParallelFor::Drain(Job& job) {
  for (size_t i; (i = job.next.fetch_add(1, std::memory_order_relaxed)) < job.n;) (*job.fn)(i);
}

void ParallelFor::ForEach(size_t n, const std::function<void(size_t)>& fn) {
  if (helpers_.empty() || n < 2) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Job job{&fn, n};
  {
    std::lock_guard lock(mu_);
    job_ = &job;
    ++generation_;
  }
  start_.notify_all();
  Drain(job);
  // Every item is taken. A helper that wakes from here on finds no job; the ones inside it
  // finish the item they hold.
  std::unique_lock lock(mu_);
  job_ = nullptr;
  done_.wait(lock, [&] { return active_ == 0; });
}

void ParallelFor::Helper() {
  // Helpers apply updates (Shard::Apply) and copy parameters: never on denormals' slow path.
  FlushDenormalsOnThisThread();
  uint64_t seen = 0;
  for (;;) {
    Job* job = nullptr;
    {
      std::unique_lock lock(mu_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      if (job == nullptr) continue;  // woke too late: the caller did it all
      ++active_;
    }
    Drain(*job);
    {
      std::lock_guard lock(mu_);
      if (--active_ == 0) done_.notify_one();
    }
  }
}

}  // namespace parasync
