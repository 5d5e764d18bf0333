#include "ps/parallel_for.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

namespace parasync {
namespace {

TEST(ParallelForTest, EveryPartRunsOnceOnItsOwnThreadAndRunWaitsForAll) {
  for (int threads : {1, 2, 3, 5}) {
    SCOPED_TRACE(threads);
    ParallelFor pool(threads);
    ASSERT_EQ(pool.threads(), threads);
    for (int round = 0; round < 200; ++round) {
      std::vector<std::atomic<int>> calls(static_cast<size_t>(threads));
      std::vector<std::thread::id> ids(static_cast<size_t>(threads));
      std::atomic<int> bad_parts{0};
      pool.Run([&](int part, int parts) {
        if (parts != threads || part < 0 || part >= threads) {
          bad_parts.fetch_add(1);
          return;
        }
        ids[static_cast<size_t>(part)] = std::this_thread::get_id();
        calls[static_cast<size_t>(part)].fetch_add(1);
      });
      // Run has returned: every part's effects are visible here.
      ASSERT_EQ(bad_parts.load(), 0);
      for (int p = 0; p < threads; ++p) ASSERT_EQ(calls[static_cast<size_t>(p)].load(), 1) << p;
      EXPECT_EQ(ids[0], std::this_thread::get_id()) << "part 0 is the caller's";
      EXPECT_EQ(std::set<std::thread::id>(ids.begin(), ids.end()).size(),
                static_cast<size_t>(threads));
    }
  }
}

}  // namespace
}  // namespace parasync
