#include "common/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace parasync {
namespace {

TEST(StatusTest, DefaultIsOkWithEmptyMessage) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_TRUE(Status::Ok().ok());
}

TEST(StatusTest, FactoriesSetCodeAndMessage) {
  struct Case {
    Status status;
    StatusCode code;
    std::string_view name;
  };
  const std::vector<Case> cases = {
      {Status::InvalidArgument("m"), StatusCode::kInvalidArgument, "InvalidArgument"},
      {Status::NotFound("m"), StatusCode::kNotFound, "NotFound"},
      {Status::Unavailable("m"), StatusCode::kUnavailable, "Unavailable"},
      {Status::TimedOut("m"), StatusCode::kTimedOut, "TimedOut"},
      {Status::Aborted("m"), StatusCode::kAborted, "Aborted"},
      {Status::Corruption("m"), StatusCode::kCorruption, "Corruption"},
      {Status::Internal("m"), StatusCode::kInternal, "Internal"},
      {Status::NotSupported("m"), StatusCode::kNotSupported, "NotSupported"},
      {Status::FailedPrecondition("m"), StatusCode::kFailedPrecondition, "FailedPrecondition"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(c.status.ok()) << c.name;
    EXPECT_EQ(c.status.code(), c.code) << c.name;
    EXPECT_EQ(c.status.message(), "m") << c.name;
    EXPECT_EQ(StatusCodeName(c.code), c.name);
    EXPECT_EQ(c.status.ToString(), std::string(c.name) + ": m");
  }
}

TEST(StatusTest, CodeNumbersMatchTheWireSchema) {
  // schema/parasync.fbs enum Code uses these numbers; renumbering breaks old peers.
  EXPECT_EQ(static_cast<int>(StatusCode::kOk), 0);
  EXPECT_EQ(static_cast<int>(StatusCode::kInvalidArgument), 1);
  EXPECT_EQ(static_cast<int>(StatusCode::kCorruption), 6);
  EXPECT_EQ(static_cast<int>(StatusCode::kNotSupported), 8);
  EXPECT_EQ(static_cast<int>(StatusCode::kFailedPrecondition), 9);
}

TEST(StatusTest, WithContextPrefixesMessageAndKeepsCode) {
  Status s = Status::NotFound("slice 3").WithContext("ps shard 1");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "ps shard 1: slice 3");
}

TEST(StatusTest, WithContextOnOkStaysOk) {
  Status s = Status::Ok().WithContext("ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
}

TEST(ResultTest, HoldsValue) {
  Result<int> r = 42;
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.status().ok());
  EXPECT_EQ(*r, 42);
  EXPECT_EQ(r.value(), 42);
}

TEST(ResultTest, HoldsError) {
  Result<int> r = Status::Unavailable("down");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(), "down");
}

TEST(ResultTest, MovesOutMoveOnlyValue) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 7);
}

TEST(ResultDeathTest, ConstructingFromOkStatusAborts) {
  EXPECT_DEATH({ Result<int> r = Status::Ok(); (void)r; }, "ok Status");
}

Status FailIfNegative(int x) {
  if (x < 0) return Status::InvalidArgument("negative");
  return Status::Ok();
}

Status ChainReturnIfError(int x, bool* reached_end) {
  PARASYNC_RETURN_IF_ERROR(FailIfNegative(x));
  *reached_end = true;
  return Status::Ok();
}

Result<int> Doubled(int x) {
  if (x < 0) return Status::InvalidArgument("negative");
  return 2 * x;
}

Result<int> ChainAssignOrReturn(int x) {
  PARASYNC_ASSIGN_OR_RETURN(int d, Doubled(x));
  return d + 1;
}

TEST(StatusMacrosTest, ReturnIfErrorStopsOnError) {
  bool reached = false;
  EXPECT_EQ(ChainReturnIfError(-1, &reached).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(reached);
  EXPECT_TRUE(ChainReturnIfError(1, &reached).ok());
  EXPECT_TRUE(reached);
}

TEST(StatusMacrosTest, AssignOrReturnUnwrapsValueOrPropagatesError) {
  Result<int> ok = ChainAssignOrReturn(5);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 11);
  Result<int> bad = ChainAssignOrReturn(-5);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "negative");
}

}  // namespace
}  // namespace parasync
