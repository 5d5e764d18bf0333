#include "common/mode.h"

#include <gtest/gtest.h>

#include <string>

namespace parasync {
namespace {

TEST(TrainingModeTest, DefaultIsAsync) {
  const TrainingMode m;
  EXPECT_EQ(m.kind, TrainingMode::Kind::kAsync);
  EXPECT_EQ(m.ToString(), "async");
}

TEST(TrainingModeTest, ParseReadsEachKind) {
  Result<TrainingMode> async = TrainingMode::Parse("async");
  ASSERT_TRUE(async.ok()) << async.status().ToString();
  EXPECT_EQ(async->kind, TrainingMode::Kind::kAsync);

  Result<TrainingMode> sync = TrainingMode::Parse("sync");
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  EXPECT_EQ(sync->kind, TrainingMode::Kind::kSync);
  EXPECT_EQ(sync->delay, 0);

  Result<TrainingMode> delayed = TrainingMode::Parse("sync:delayed");
  ASSERT_TRUE(delayed.ok()) << delayed.status().ToString();
  EXPECT_EQ(delayed->kind, TrainingMode::Kind::kSync);
  EXPECT_EQ(delayed->delay, 1);
  EXPECT_NE(*delayed, *sync);

  Result<TrainingMode> ssp = TrainingMode::Parse("ssp:3");
  ASSERT_TRUE(ssp.ok()) << ssp.status().ToString();
  EXPECT_EQ(ssp->kind, TrainingMode::Kind::kSsp);
  EXPECT_EQ(ssp->staleness, 3);
}

TEST(TrainingModeTest, ParseOfToStringGivesTheSameModeBack) {
  for (const std::string text : {"async", "sync", "sync:delayed", "ssp:0", "ssp:1", "ssp:42", "ssp:1000000"}) {
    Result<TrainingMode> m = TrainingMode::Parse(text);
    ASSERT_TRUE(m.ok()) << text << ": " << m.status().ToString();
    EXPECT_EQ(m->ToString(), text);
    Result<TrainingMode> again = TrainingMode::Parse(m->ToString());
    ASSERT_TRUE(again.ok()) << text;
    EXPECT_EQ(*again, *m) << text;
  }
}

TEST(TrainingModeTest, ParseOfAnythingElseIsInvalidArgumentQuotingTheText) {
  for (const std::string text : {"", "ssp:", "ssp:-1", "ssp:x", "ssp:1x", "ssp:+1", "ssp: 1",
                                 "ssp:1000001", "ssp:99999999999999999999", "ssp", "SYNC",
                                 "Async", " sync", "sync ", "bsp", "sync:", "sync:delay",
                                 "sync:1", "sync:Delayed"}) {
    Result<TrainingMode> m = TrainingMode::Parse(text);
    ASSERT_FALSE(m.ok()) << "'" << text << "' was accepted as " << m->ToString();
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(m.status().message().find("'" + text + "'"), std::string::npos)
        << m.status().message();
  }
}

TEST(CheckStoredModeTest, SameModeIsFineAnotherIsOneLineNamingBothAndTheDirectory) {
  EXPECT_TRUE(CheckStoredMode("sync", *TrainingMode::Parse("sync"), "/d").ok());
  EXPECT_TRUE(CheckStoredMode("ssp:3", *TrainingMode::Parse("ssp:3"), "/d").ok());
  for (const auto& [stored, running] : {std::pair<const char*, const char*>{"sync", "async"},
                                        {"async", "sync"},
                                        {"ssp:2", "ssp:3"},
                                        {"sync", "sync:delayed"},
                                        {"garbage", "async"}}) {
    const Status s = CheckStoredMode(stored, *TrainingMode::Parse(running), "/data/ps0");
    ASSERT_FALSE(s.ok()) << stored << " under " << running;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), std::string("--state-dir /data/ps0 holds a model registered in mode ") +
                               stored + ", but this server runs --mode " + running +
                               ": start it with --mode " + stored + ", or give a new --state-dir");
  }
}

}  // namespace
}  // namespace parasync
