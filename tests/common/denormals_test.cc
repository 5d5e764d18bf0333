#include "common/denormals.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "common/parallel_for.h"

namespace parasync {
namespace {

// Runs `fn` on a new thread whose flush bits are cleared first: the state a thread of a new
// process, or of a pool made before anyone set them, is in.
template <typename Fn>
void OnAClearedThread(Fn fn) {
  std::thread([&] {
    KeepDenormalsOnThisThread();
    fn();
  }).join();
}

// a * b computed at run time (volatile: not folded by the compiler, whose constant
// arithmetic keeps denormals).
float Multiply(float a, float b) {
  volatile float x = a;
  volatile float y = b;
  return x * y;
}

TEST(DenormalsTest, FlushingMakesADenormalResultAndADenormalOperandZero) {
  OnAClearedThread([] {
    const float tiny = 1e-40f;  // below FLT_MIN (1.18e-38): denormal
    ASSERT_LT(tiny, std::numeric_limits<float>::min());
    ASSERT_FALSE(DenormalsFlushedOnThisThread());
    EXPECT_NE(Multiply(1e-20f, 1e-20f), 0.0f) << "IEEE: the denormal product is kept";
    EXPECT_NE(Multiply(tiny, 1.0f), 0.0f);

    ASSERT_TRUE(FlushDenormalsOnThisThread());
    EXPECT_TRUE(DenormalsFlushedOnThisThread());
    EXPECT_EQ(Multiply(1e-20f, 1e-20f), 0.0f) << "a denormal result is flushed";
    EXPECT_EQ(Multiply(tiny, 1e10f), 0.0f) << "a denormal operand reads as zero";
    EXPECT_FLOAT_EQ(Multiply(1e-19f, 1e-18f), 1e-37f) << "normal results are untouched";
  });
}

TEST(DenormalsTest, ParallelForHelpersFlushWhateverTheirCreatorHad) {
  OnAClearedThread([] {
    ParallelFor pool(3);
    // Three items that each wait (bounded) until all three are taken: each runs on its own
    // thread, so both helpers take one.
    std::atomic<int> taken{0};
    std::mutex mu;
    std::vector<std::pair<std::thread::id, bool>> seen;
    pool.ForEach(3, [&](size_t) {
      taken.fetch_add(1);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (taken.load() < 3 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      std::lock_guard lock(mu);
      seen.emplace_back(std::this_thread::get_id(), DenormalsFlushedOnThisThread());
    });
    ASSERT_EQ(taken.load(), 3);
    ASSERT_EQ(seen.size(), 3u);
    int helpers = 0;
    for (const auto& [id, flushed] : seen) {
      if (id == std::this_thread::get_id()) {
        EXPECT_FALSE(flushed) << "the caller's own bits are the caller's business";
      } else {
        ++helpers;
        EXPECT_TRUE(flushed) << "a helper thread computes with denormals on";
      }
    }
    EXPECT_EQ(helpers, 2);
  });
}

}  // namespace
}  // namespace parasync
