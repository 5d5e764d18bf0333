#include "worker/chief.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/temp_dir.h"

namespace parasync {
namespace {

// Rows of evaluations within an epoch (--eval-every) carry the epochs done as a fraction
// and do not count as logged epochs: a chief resumed mid-epoch still owes the epoch's end.
TEST(ChiefTest, RowsWithinAnEpochAreFractionsAndNoLoggedEpoch) {
  testing::TempDir dir;
  const std::string log = dir.path() + "/eval.jsonl";
  EXPECT_EQ(LastLoggedEpoch(log), -1);
  EvalRecord row;
  row.mode = "sync";
  row.epoch = 0;
  ASSERT_TRUE(AppendEvalRow(log, row).ok());
  row.epoch = 1;
  row.epoch_progress = 0.25600000001;
  ASSERT_TRUE(AppendEvalRow(log, row).ok());
  EXPECT_EQ(LastLoggedEpoch(log), 0);
  row.epoch_progress = NAN;
  ASSERT_TRUE(AppendEvalRow(log, row).ok());
  EXPECT_EQ(LastLoggedEpoch(log), 1);

  std::ifstream in(log);
  std::string line;
  std::getline(in, line);
  EXPECT_FALSE(nlohmann::json::parse(line).contains("within_epoch")) << line;
  std::getline(in, line);
  const auto within = nlohmann::json::parse(line);
  EXPECT_EQ(within["epoch"].get<double>(), 0.256) << line;
  EXPECT_TRUE(within["epoch"].is_number_float()) << line;
  EXPECT_EQ(within["within_epoch"], true) << line;
  std::getline(in, line);
  EXPECT_TRUE(nlohmann::json::parse(line)["epoch"].is_number_integer()) << line;
}

}  // namespace
}  // namespace parasync
