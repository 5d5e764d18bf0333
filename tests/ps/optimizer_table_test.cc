// The optimizer table (ps/optimizer.h): one row per OptimizerKind, named as the wire and the
// command line name it, with a slot count that fits kMaxOptimizerSlots.
#include <gtest/gtest.h>

#include "common/model_spec.h"
#include "ps/optimizer.h"

namespace parasync {
namespace {

constexpr OptimizerKind kKinds[] = {OptimizerKind::kSgd, OptimizerKind::kMomentum,
                                    OptimizerKind::kAdam};

TEST(OptimizerTableTest, EveryKindHasARowNamedAsTheCommandLineNamesIt) {
  for (OptimizerKind kind : kKinds) {
    const OptimizerDef* def = FindOptimizer(kind);
    ASSERT_NE(def, nullptr) << static_cast<int>(kind);
    EXPECT_EQ(def->kind, kind);
    EXPECT_EQ(def->name, OptimizerKindName(kind));
    auto parsed = ParseOptimizerKind(std::string(def->name));
    ASSERT_TRUE(parsed.ok()) << def->name;
    EXPECT_EQ(*parsed, kind);
  }
}

TEST(OptimizerTableTest, SlotCountsFitTheSlotArray) {
  for (OptimizerKind kind : kKinds) {
    const OptimizerDef* def = FindOptimizer(kind);
    ASSERT_NE(def, nullptr);
    EXPECT_GE(def->slots, 0);
    EXPECT_LE(def->slots, kMaxOptimizerSlots);
    EXPECT_EQ(NumOptimizerSlots(kind), def->slots);
  }
}

TEST(OptimizerTableTest, AKindOutsideTheTableHasNoRow) {
  EXPECT_EQ(FindOptimizer(static_cast<OptimizerKind>(200)), nullptr);
  EXPECT_EQ(NumOptimizerSlots(static_cast<OptimizerKind>(200)), 0);
}

}  // namespace
}  // namespace parasync
