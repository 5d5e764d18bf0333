#include "common/parallel_for.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace parasync {
namespace {

TEST(ParallelForTest, EveryItemRunsOnceAndForEachWaitsForAll) {
  for (int threads : {1, 2, 3, 5}) {
    SCOPED_TRACE(threads);
    ParallelFor pool(threads);
    ASSERT_EQ(pool.threads(), threads);
    for (size_t n : {0, 1, 2, 7, 64}) {
      for (int round = 0; round < 50; ++round) {
        std::vector<std::atomic<int>> calls(n);
        std::vector<int> written(n, 0);  // plain writes: ForEach's return must publish them
        pool.ForEach(n, [&](size_t i) {
          calls[i].fetch_add(1);
          written[i] = static_cast<int>(i) + 1;
        });
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(calls[i].load(), 1) << i;
          ASSERT_EQ(written[i], static_cast<int>(i) + 1) << i;
        }
      }
    }
  }
}

TEST(ParallelForTest, HelpersTakeItemsTheCallerCannot) {
  // The first item taken blocks until some other item has run on another thread: only a
  // helper can do that, so with no working helper the wait runs out and the test fails.
  ParallelFor pool(3);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<bool> first_taken{false};
  std::atomic<bool> other_thread_ran{false};
  std::atomic<bool> waited_out{false};
  pool.ForEach(8, [&](size_t) {
    {
      std::lock_guard lock(mu);
      ids.insert(std::this_thread::get_id());
    }
    if (!first_taken.exchange(true)) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!other_thread_ran.load()) {
        if (std::chrono::steady_clock::now() >= deadline) {
          waited_out.store(true);
          return;
        }
        std::this_thread::yield();
      }
      return;
    }
    // The thread that took the first item is blocked in it, so this one is another.
    other_thread_ran.store(true);
  });
  EXPECT_FALSE(waited_out.load());
  EXPECT_GE(ids.size(), 2u);
}

TEST(ParallelForTest, BackToBackJobsEachRunEveryItemOnce) {
  // Tiny jobs back to back: helpers often wake after the caller took every item (and must
  // then leave that job alone) or join the next job late; every item still runs once.
  ParallelFor pool(2);
  std::atomic<int64_t> total{0};
  for (int round = 0; round < 2000; ++round) {
    pool.ForEach(2, [&](size_t i) { total.fetch_add(static_cast<int64_t>(i) + 1); });
  }
  EXPECT_EQ(total.load(), 2000 * 3);
}

}  // namespace
}  // namespace parasync
