// The optimizer tables: kOptimizerKinds (common/model_spec.h) names each OptimizerKind as the
// command line does, with a slot count that fits kMaxOptimizerSlots; the server's update table
// (ps/optimizer.h) has a row for each.
#include <gtest/gtest.h>

#include "common/model_spec.h"
#include "ps/optimizer.h"

namespace parasync {
namespace {

// Listed by hand, not taken from the tables under test.
constexpr OptimizerKind kKinds[] = {OptimizerKind::kSgd, OptimizerKind::kMomentum,
                                    OptimizerKind::kAdam};

TEST(OptimizerTableTest, EveryKindHasARowNamedAsTheCommandLineNamesIt) {
  for (OptimizerKind kind : kKinds) {
    const OptimizerDef* def = FindOptimizer(kind);
    ASSERT_NE(def, nullptr) << static_cast<int>(kind);
    EXPECT_EQ(def->kind, kind);
    const OptimizerKindInfo* info = FindOptimizerKind(kind);
    ASSERT_NE(info, nullptr) << static_cast<int>(kind);
    EXPECT_EQ(info->name, OptimizerKindName(kind));
    auto parsed = ParseOptimizerKind(std::string(info->name));
    ASSERT_TRUE(parsed.ok()) << info->name;
    EXPECT_EQ(*parsed, kind);
  }
}

TEST(OptimizerTableTest, SlotCountsFitTheSlotArray) {
  for (OptimizerKind kind : kKinds) {
    const OptimizerKindInfo* info = FindOptimizerKind(kind);
    ASSERT_NE(info, nullptr);
    EXPECT_GE(info->slots, 0);
    EXPECT_LE(info->slots, kMaxOptimizerSlots);
    EXPECT_EQ(NumOptimizerSlots(kind), info->slots);
  }
}

TEST(OptimizerTableTest, AKindOutsideTheTableHasNoRow) {
  EXPECT_EQ(FindOptimizer(static_cast<OptimizerKind>(200)), nullptr);
  EXPECT_EQ(FindOptimizerKind(static_cast<OptimizerKind>(200)), nullptr);
  EXPECT_EQ(OptimizerKindName(static_cast<OptimizerKind>(200)), "unknown");
  EXPECT_EQ(NumOptimizerSlots(static_cast<OptimizerKind>(200)), 0);
}

}  // namespace
}  // namespace parasync
