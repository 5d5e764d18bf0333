#include "ps/parallel_for.h"

namespace parasync {

ParallelFor::ParallelFor(int threads) {
  for (int part = 1; part < threads; ++part) helpers_.emplace_back([this, part] { Helper(part); });
}

ParallelFor::~ParallelFor() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void ParallelFor::Run(const std::function<void(int part, int parts)>& fn) {
  if (helpers_.empty()) {
    fn(0, 1);
    return;
  }
  {
    std::lock_guard lock(mu_);
    job_ = &fn;
    running_ = static_cast<int>(helpers_.size());
    ++generation_;
  }
  start_.notify_all();
  fn(0, threads());
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return running_ == 0; });
  job_ = nullptr;
}

void ParallelFor::Helper(int part) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int, int)>* job = nullptr;
    {
      std::unique_lock lock(mu_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    (*job)(part, threads());
    {
      std::lock_guard lock(mu_);
      if (--running_ == 0) done_.notify_one();
    }
  }
}

}  // namespace parasync
