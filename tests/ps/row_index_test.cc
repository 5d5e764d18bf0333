// ps/row_index.h: the flat hash index against std::map under random inserts and erases
// (backward-shift deletion keeps every key findable), and the arena's move-the-last removal.
#include "ps/row_index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "ps/row_snapshot.h"

namespace parasync {
namespace {

TEST(RowIndexTest, FindsWhatWasInsertedAndNotWhatWasErased) {
  RowIndex index;
  EXPECT_EQ(index.Find(RowKey{0, 1}), RowIndex::kNone);
  index.Insert(RowKey{0, 1}, 5);
  index.Insert(RowKey{1, 1}, 6);  // same id, other table
  EXPECT_EQ(index.Find(RowKey{0, 1}), 5);
  EXPECT_EQ(index.Find(RowKey{1, 1}), 6);
  index.Erase(RowKey{0, 1});
  EXPECT_EQ(index.Find(RowKey{0, 1}), RowIndex::kNone);
  EXPECT_EQ(index.Find(RowKey{1, 1}), 6);
  EXPECT_EQ(index.size(), 1);
  index.Clear();
  EXPECT_EQ(index.Find(RowKey{1, 1}), RowIndex::kNone);
  EXPECT_EQ(index.size(), 0);
}

TEST(RowIndexTest, AgreesWithAnOrderedMapUnderRandomInsertsAndErases) {
  RowIndex index;
  index.Reserve(100);
  std::map<RowKey, int32_t> want;
  std::mt19937_64 rng(7);
  for (int32_t step = 0; step < 200000; ++step) {
    // Few distinct keys, so runs collide and erases shift entries back often.
    const RowKey key{static_cast<uint32_t>(rng() % 3), rng() % 700};
    const auto it = want.find(key);
    ASSERT_EQ(index.Find(key), it == want.end() ? RowIndex::kNone : it->second) << step;
    if (it == want.end()) {
      index.Insert(key, step);
      want.emplace(key, step);
    } else if (rng() % 2 == 0) {
      index.Erase(key);
      want.erase(it);
    }
    ASSERT_EQ(index.size(), static_cast<int64_t>(want.size()));
  }
  for (const auto& [key, slot] : want) EXPECT_EQ(index.Find(key), slot);
}

TEST(RowArenaTest, RemovingACellMovesTheLastOneIntoIt) {
  RowArena arena(2);
  for (int32_t owner = 0; owner < 3000; ++owner) {  // three chunks
    const int32_t cell = arena.Add(owner);
    ASSERT_EQ(cell, owner);
    arena.at(cell)[0] = static_cast<float>(owner);
    arena.at(cell)[1] = -static_cast<float>(owner);
  }
  EXPECT_EQ(arena.Remove(10), 2999);  // the last cell's owner, now at cell 10
  EXPECT_EQ(arena.at(10)[0], 2999.0f);
  EXPECT_EQ(arena.at(10)[1], -2999.0f);
  EXPECT_EQ(arena.Remove(arena.size() - 1), RowArena::kNone);  // the last: nothing moves
  EXPECT_EQ(arena.size(), 2998);
  while (arena.size() > 1) (void)arena.Remove(0);
  EXPECT_EQ(arena.at(0)[0], 1.0f);  // cells 0 and 10 went; 1 moved down last
  arena.Clear();
  EXPECT_EQ(arena.size(), 0);
}

}  // namespace
}  // namespace parasync
