// PushLedger and PushSeq (ps/push_ledger.h): push de-duplication and the per-rank data
// positions the server stores and tells restarted workers.
#include "ps/push_ledger.h"

#include <gtest/gtest.h>

namespace parasync {
namespace {

TEST(PushSeqTest, SplitsIncarnationAndCounter) {
  const PushSeq seq(0xabcd1234u, 7u);
  EXPECT_EQ(seq.raw(), (uint64_t{0xabcd1234u} << 32) | 7u);
  EXPECT_EQ(seq.incarnation(), 0xabcd1234u);
  EXPECT_EQ(seq.counter(), 7u);
  EXPECT_FALSE(seq.none());
  EXPECT_TRUE(PushSeq(0).none());
  EXPECT_EQ(PushSeq(seq.raw()).counter(), 7u);
}

TEST(PushSeqTest, CoveredOnlyByALaterSeqOfTheSameIncarnation) {
  const PushSeq last(5, 10);
  EXPECT_TRUE(PushSeq(5, 10).CoveredBy(last));
  EXPECT_TRUE(PushSeq(5, 1).CoveredBy(last));
  EXPECT_FALSE(PushSeq(5, 11).CoveredBy(last));
  EXPECT_FALSE(PushSeq(6, 1).CoveredBy(last));  // a restarted worker counts anew
  EXPECT_FALSE(PushSeq(0).CoveredBy(PushSeq(0)));
}

TEST(PushLedgerTest, AResendOfAnAppliedPushIsRecognized) {
  PushLedger ledger(2);
  EXPECT_FALSE(ledger.AlreadyApplied(0, PushSeq(1, 1)));
  ledger.RecordSeq(0, PushSeq(1, 3));
  EXPECT_TRUE(ledger.AlreadyApplied(0, PushSeq(1, 3)));
  EXPECT_TRUE(ledger.AlreadyApplied(0, PushSeq(1, 2)));
  EXPECT_FALSE(ledger.AlreadyApplied(0, PushSeq(1, 4)));
  EXPECT_FALSE(ledger.AlreadyApplied(1, PushSeq(1, 3)));  // per rank
  EXPECT_FALSE(ledger.AlreadyApplied(0, PushSeq(0)));     // no seq: never a resend
}

TEST(PushLedgerTest, UnknownRanksAndEmptyValuesAreIgnored) {
  PushLedger ledger(1);
  ledger.RecordSeq(5, PushSeq(1, 1));
  ledger.RecordSeq(-1, PushSeq(1, 1));
  ledger.RecordSeq(0, PushSeq(0));
  ledger.RecordProgress(0, DataProgress{});
  EXPECT_FALSE(ledger.AlreadyApplied(5, PushSeq(1, 1)));
  EXPECT_EQ(ledger.last_seq(0), 0u);
  EXPECT_TRUE(ledger.progress(0).empty());
  EXPECT_TRUE(ledger.AllRecords().empty());
}

TEST(PushLedgerTest, ARestartedRanksPushOfDataAppliedHereIsAReplay) {
  PushLedger ledger(2);
  const DataProgress recorded{2, 640, 30000};
  // Nothing recorded yet: nothing is a replay.
  EXPECT_FALSE(ledger.ReplaysRecordedData(0, PushSeq(7, 1), {2, 576, 30000}));
  ledger.RecordSeq(0, PushSeq(5, 10));
  ledger.RecordProgress(0, recorded);
  // The process after it, from the same position or before: applied here already.
  EXPECT_TRUE(ledger.ReplaysRecordedData(0, PushSeq(7, 1), {2, 640, 30000}));
  EXPECT_TRUE(ledger.ReplaysRecordedData(0, PushSeq(7, 1), {2, 576, 30000}));
  EXPECT_TRUE(ledger.ReplaysRecordedData(0, PushSeq(7, 2), {1, 30000, 30000}));
  // Past it: new data.
  EXPECT_FALSE(ledger.ReplaysRecordedData(0, PushSeq(7, 1), {2, 704, 30000}));
  EXPECT_FALSE(ledger.ReplaysRecordedData(0, PushSeq(7, 1), {3, 64, 30000}));
  // The same process going on (its seq is the resend check's business), another data shard,
  // no position, no seq, another rank: not a replay.
  EXPECT_FALSE(ledger.ReplaysRecordedData(0, PushSeq(5, 11), {2, 640, 30000}));
  EXPECT_FALSE(ledger.ReplaysRecordedData(0, PushSeq(7, 1), {2, 640, 20000}));
  EXPECT_FALSE(ledger.ReplaysRecordedData(0, PushSeq(7, 1), DataProgress{}));
  EXPECT_FALSE(ledger.ReplaysRecordedData(0, PushSeq(0), {2, 640, 30000}));
  EXPECT_FALSE(ledger.ReplaysRecordedData(1, PushSeq(7, 1), {2, 640, 30000}));
  EXPECT_FALSE(ledger.ReplaysRecordedData(9, PushSeq(7, 1), {2, 640, 30000}));
  // Once the new process has a push applied here, its pushes are compared by seq again.
  ledger.RecordSeq(0, PushSeq(7, 2));
  EXPECT_FALSE(ledger.ReplaysRecordedData(0, PushSeq(7, 3), {2, 640, 30000}));
}

TEST(PushLedgerTest, PendingProgressCountsOnlyOnceSettled) {
  PushLedger ledger(3);
  const DataProgress p{1, 10, 100};
  ledger.SetPending(2, p);
  EXPECT_TRUE(ledger.progress(2).empty());
  EXPECT_EQ(ledger.SettlePending(), std::vector<int>{2});
  EXPECT_EQ(ledger.progress(2), p);
  EXPECT_TRUE(ledger.SettlePending().empty());
}

TEST(PushLedgerTest, RecordsRoundTripThroughRestore) {
  PushLedger ledger(3);
  ledger.RecordSeq(0, PushSeq(1, 4));
  ledger.RecordProgress(2, DataProgress{2, 5, 50});
  const std::vector<RankRecord> all = ledger.AllRecords();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0], (RankRecord{0, PushSeq(1, 4).raw(), DataProgress{}}));
  EXPECT_EQ(all[1], (RankRecord{2, 0, DataProgress{2, 5, 50}}));
  const int some[] = {2, 7};
  EXPECT_EQ(ledger.Records(some), std::vector<RankRecord>{all[1]});

  PushLedger restored(3);
  restored.Restore(all);
  EXPECT_EQ(restored.AllRecords(), all);
  restored.Clear();
  EXPECT_TRUE(restored.AllRecords().empty());
}

TEST(PushLedgerTest, RecordAfterKeepsWhatThePushDoesNotCarry) {
  PushLedger ledger(1);
  ledger.RecordSeq(0, PushSeq(1, 1));
  ledger.RecordProgress(0, DataProgress{1, 1, 9});
  EXPECT_EQ(ledger.RecordAfter(0, 0, DataProgress{}),
            (RankRecord{0, PushSeq(1, 1).raw(), DataProgress{1, 1, 9}}));
  EXPECT_EQ(ledger.RecordAfter(0, PushSeq(1, 2).raw(), DataProgress{1, 2, 9}),
            (RankRecord{0, PushSeq(1, 2).raw(), DataProgress{1, 2, 9}}));
}

}  // namespace
}  // namespace parasync
