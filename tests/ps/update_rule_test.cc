// The update rules (ps/update_rule.h) as units: each mode's decisions — may a gradient be
// taken, is it applied now or at its step, may a pull be served — over a real Shard,
// Coordinator and PushLedger, driven as the server drives them. No sockets, no clock waits.
#include "ps/update_rule.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace parasync {
namespace {

using Verdict = UpdateRule::Verdict;

constexpr uint64_t kIncarnation = 0x1234;
constexpr float kLearningRate = 0.5f;
constexpr float kInitial = 1.0f;  // every parameter's value at registration
constexpr int64_t kElements = 4;  // one slice

// What a rule asks of the server, recorded.
struct RecordingHost : RuleHost {
  void OnStoreFailure(const Status& failure, const std::string& /*what*/) override {
    failures.push_back(failure.ToString());
  }
  void PublishProgress() override { ++progress_published; }
  void RecordStragglerWait(int rank, double /*seconds*/, TimePoint /*now*/,
                           const char* /*what*/) override {
    charged.push_back(rank);
  }
  std::vector<std::string> failures;
  int progress_published = 0;
  std::vector<int> charged;  // ranks charged with a wait, in order
};

// One shard of a one-slice model, the parts a server gives its rule, and the rule of `mode`.
class Rules {
 public:
  explicit Rules(const std::string& mode, int num_workers = 2,
                 OptimizerKind kind = OptimizerKind::kSgd)
      : mode_(TrainingMode::Parse(mode).value()),
        metrics_(0, num_workers),
        coordinator_({mode_, num_workers, 0, std::chrono::milliseconds(1000)},
                     std::chrono::steady_clock::now()),
        ledger_(num_workers),
        durability_({}, &metrics_, std::chrono::steady_clock::now()) {
    ModelRegistration reg;
    reg.variables = {{"w", {kElements}, DType::kFloat32, {InitKind::kConstant, kInitial}}};
    reg.optimizer.kind = kind;
    reg.optimizer.learning_rate = IsWorkerSide(kind) ? 1.0f : kLearningRate;
    reg.seed = 1;
    reg.max_slice_elements = 8;
    reg.mode = mode;
    RejectReason reason = RejectReason::kNone;
    const Status registered = shard_.Register(reg, &reason);
    EXPECT_TRUE(registered.ok()) << registered.ToString();
    rule_ = MakeUpdateRule(mode_, {&shard_, &coordinator_, &ledger_, &durability_, &metrics_,
                                   &host_, kIncarnation});
  }

  // A push from `rank` computed from `read_version`, and a pull of `rank` waiting for
  // `min_version` (sync), both of the whole slice and made for this server's incarnation.
  static Header PushOf(int rank, int64_t read_version) {
    Header req = RequestOf(MsgType::kPush, rank);
    req.version = read_version;
    req.batch_examples = 1;
    return req;
  }
  static Header PullOf(int rank, int64_t min_version = 0) {
    Header req = RequestOf(MsgType::kPull, rank);
    req.min_version = min_version;
    return req;
  }

  // What the server does with a push: Admit, and if admitted Take, count the gradient on
  // its rank's clock, and complete a step that is due. Returns the verdict.
  Verdict Push(const Header& req, float value) {
    const UpdateRule::Admission a = rule_->Admit(req);
    if (a.verdict != Verdict::kTake) return a.verdict;
    const std::vector<float> grad(kElements, value);
    const float* g = grad.data();
    RejectReason reason = RejectReason::kNone;
    const Status taken =
        rule_->Take({req, {&g, 1}, {}, shard_.version() - a.read_version}, &reason);
    EXPECT_TRUE(taken.ok()) << taken.ToString();
    if (coordinator_.ValidRank(req.rank)) (void)coordinator_.RecordGradient(req.rank);
    EXPECT_TRUE(rule_->MaybeCompleteStep());
    return a.verdict;
  }
  Verdict Push(int rank, int64_t read_version, float value = 1.0f) {
    return Push(PushOf(rank, read_version), value);
  }
  // A pull of `rank` answered: the coordinator notes what it read.
  void Read(int rank) { coordinator_.RecordRead(rank); }

  float Value() const { return shard_.SnapshotOfSlice(0).values[0]; }

  UpdateRule& rule() { return *rule_; }
  Shard& shard() { return shard_; }
  Coordinator& coordinator() { return coordinator_; }
  RecordingHost& host() { return host_; }

 private:
  static Header RequestOf(MsgType type, int rank) {
    Header req;
    req.type = type;
    req.rank = rank;
    req.incarnation = kIncarnation;
    req.slices = {{0, 0, kElements}};
    return req;
  }

  TrainingMode mode_;
  PsMetrics metrics_;
  Shard shard_{0, 1};
  Coordinator coordinator_;
  PushLedger ledger_;
  Durability durability_;
  RecordingHost host_;
  std::unique_ptr<UpdateRule> rule_;
};

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(UpdateRuleTest, ToolsPushOnlyInAsyncAndOnlySyncAppliesInSteps) {
  for (const std::string mode : {"async", "ssp:2", "sync", "sync:delayed"}) {
    SCOPED_TRACE(mode);
    Rules r(mode);
    const bool async = mode == "async";
    const bool sync = mode.starts_with("sync");
    EXPECT_EQ(r.rule().TakesToolPushes(), async);
    // A sync step waits for the rank's contribution, so a replayed push is taken there.
    EXPECT_EQ(r.rule().AcknowledgesRecordedData(), !sync);
    EXPECT_EQ(AppliesInSteps(TrainingMode::Parse(mode).value()), sync);
  }
}

TEST(UpdateRuleTest, EveryRuleRefusesAGradientFromAVersionTheShardNeverHad) {
  for (const std::string mode : {"async", "ssp:2", "sync", "sync:delayed"}) {
    SCOPED_TRACE(mode);
    Rules r(mode);
    EXPECT_EQ(r.Push(0, /*read_version=*/3), Verdict::kBadVersion);
    EXPECT_EQ(r.Push(0, /*read_version=*/-1), Verdict::kBadVersion);
    EXPECT_EQ(r.shard().version(), 0);
    EXPECT_FLOAT_EQ(r.Value(), kInitial);
  }
}

TEST(AsyncRuleTest, AppliesEachGradientOnArrivalAndServesEveryPull) {
  Rules r("async");
  EXPECT_TRUE(r.rule().CanServe(Rules::PullOf(0, /*min_version=*/100)));
  EXPECT_EQ(r.Push(0, 0, 1.0f), Verdict::kTake);
  EXPECT_EQ(r.shard().version(), 1);
  EXPECT_FLOAT_EQ(r.Value(), kInitial - kLearningRate * 1.0f);
  // A gradient read before the last update is still applied: async has no bound.
  EXPECT_EQ(r.Push(1, 0, 1.0f), Verdict::kTake);
  EXPECT_EQ(r.shard().version(), 2);
  EXPECT_EQ(r.Push(-1, 2, 1.0f), Verdict::kTake);  // a tool
  EXPECT_EQ(r.shard().version(), 3);
  EXPECT_EQ(r.host().progress_published, 3);
}

TEST(SyncRuleTest, APullOfTheNextStepWaitsUntilTheStepIsApplied) {
  Rules r("sync");
  const Header next = Rules::PullOf(0, /*min_version=*/1);
  EXPECT_FALSE(r.rule().CanServe(next));
  EXPECT_EQ(r.Push(0, 0, 1.0f), Verdict::kTake);
  // One of two gradients: nothing is applied, the pull still waits, and says for whom.
  EXPECT_EQ(r.shard().version(), 0);
  EXPECT_FLOAT_EQ(r.Value(), kInitial);
  EXPECT_FALSE(r.rule().CanServe(next));
  const std::string wait = r.rule().DescribeWait(next);
  EXPECT_TRUE(Contains(wait, "1 of 2 gradients")) << wait;
  EXPECT_TRUE(Contains(wait, "missing ranks: 1)")) << wait;
  EXPECT_TRUE(r.rule().CanServe(Rules::PullOf(0, /*min_version=*/0)));

  EXPECT_EQ(r.Push(1, 0, 3.0f), Verdict::kTake);
  // Applied once, with the average of the two gradients.
  EXPECT_EQ(r.shard().version(), 1);
  EXPECT_FLOAT_EQ(r.Value(), kInitial - kLearningRate * 2.0f);
  EXPECT_TRUE(r.rule().CanServe(next));
  EXPECT_FALSE(r.rule().CanServe(Rules::PullOf(0, /*min_version=*/2)));
}

TEST(SyncRuleTest, DropsAStaleGradientAndASecondOneFromARankInOneStep) {
  Rules r("sync");
  ASSERT_EQ(r.Push(0, 0), Verdict::kTake);
  EXPECT_EQ(r.Push(0, 0), Verdict::kDuplicate);
  ASSERT_EQ(r.Push(1, 0), Verdict::kTake);
  ASSERT_EQ(r.shard().version(), 1);
  EXPECT_EQ(r.Push(1, 0), Verdict::kStale);  // a gradient of the step already applied
  EXPECT_EQ(r.Push(1, 1), Verdict::kTake);
  EXPECT_EQ(r.shard().version(), 1);  // rank 0 has not given its gradient of step 1
}

TEST(SyncRuleTest, APushForAnotherIncarnationIsDroppedAndAPullForOneServed) {
  Rules r("sync");
  Header push = Rules::PushOf(0, 0);
  push.incarnation = kIncarnation + 1;  // computed from a dead server's parameters
  EXPECT_EQ(r.Push(push, 1.0f), Verdict::kStale);
  Header pull = Rules::PullOf(0, /*min_version=*/7);
  EXPECT_FALSE(r.rule().CanServe(pull));
  pull.incarnation = kIncarnation + 1;  // waits for a version of a dead process
  EXPECT_TRUE(r.rule().CanServe(pull));
}

TEST(SyncRuleTest, AStepCompletesWithoutARankThatLeft) {
  Rules r("sync", /*num_workers=*/3);
  ASSERT_EQ(r.Push(0, 0), Verdict::kTake);
  r.coordinator().Leave(2);
  EXPECT_TRUE(r.rule().MaybeCompleteStep());
  EXPECT_EQ(r.shard().version(), 0);  // rank 1 is still live and missing
  ASSERT_EQ(r.Push(1, 0), Verdict::kTake);
  EXPECT_EQ(r.shard().version(), 1);
}

TEST(SyncRuleTest, TheLastGradientOfAStepChargesItsRankWithTheWait) {
  Rules r("sync", /*num_workers=*/3);
  ASSERT_EQ(r.Push(0, 0), Verdict::kTake);
  ASSERT_EQ(r.Push(2, 0), Verdict::kTake);
  EXPECT_TRUE(r.host().charged.empty());  // two ranks were missing: nobody alone
  ASSERT_EQ(r.Push(1, 0), Verdict::kTake);
  EXPECT_EQ(r.host().charged, std::vector<int>{1});
}

TEST(DelayedSyncRuleTest, TakesAGradientOneVersionOldButNotTwo) {
  for (const std::string mode : {"sync:delayed", "sync"}) {
    SCOPED_TRACE(mode);
    Rules r(mode, /*num_workers=*/1);
    ASSERT_EQ(r.Push(0, 0), Verdict::kTake);
    ASSERT_EQ(r.Push(0, 1), Verdict::kTake);
    ASSERT_EQ(r.shard().version(), 2);
    EXPECT_EQ(r.Push(0, 0), Verdict::kStale);
    EXPECT_EQ(r.Push(0, 1), mode == "sync:delayed" ? Verdict::kTake : Verdict::kStale);
  }
}

TEST(SspRuleTest, APullWaitsWhileALiveRankIsMoreThanKClocksBehind) {
  Rules r("ssp:1");
  ASSERT_EQ(r.Push(0, 0), Verdict::kTake);
  EXPECT_TRUE(r.rule().CanServe(Rules::PullOf(0)));  // clock 1, rank 1 at 0: within K
  ASSERT_EQ(r.Push(0, 1), Verdict::kTake);
  EXPECT_EQ(r.shard().version(), 2);  // applied on arrival
  // Rank 0 at clock 2, rank 1 at 0: two behind, the bound is one.
  EXPECT_FALSE(r.rule().CanServe(Rules::PullOf(0)));
  EXPECT_EQ(r.rule().Blocker(0), 1);
  const std::string wait = r.rule().DescribeWait(Rules::PullOf(0));
  EXPECT_TRUE(Contains(wait, "ssp:1 bound (ranks too far behind: 1)")) << wait;
  EXPECT_TRUE(r.rule().CanServe(Rules::PullOf(1)));  // the slow rank reads
  EXPECT_TRUE(r.rule().CanServe(Rules::PullOf(-1)));  // a tool has no clock
  ASSERT_EQ(r.Push(1, 0), Verdict::kTake);
  EXPECT_TRUE(r.rule().CanServe(Rules::PullOf(0)));
  EXPECT_EQ(r.rule().Blocker(0), -1);
}

TEST(SspRuleTest, AGradientStalerThanTheBoundIsDroppedNotApplied) {
  Rules r("ssp:1", /*num_workers=*/1);
  r.Read(0);
  EXPECT_EQ(r.Push(0, 0), Verdict::kTake);  // clock staleness 0
  EXPECT_EQ(r.Push(0, 1), Verdict::kTake);  // 1: at the bound
  // Two gradients since its last read: past the bound (across a death and rejoin).
  EXPECT_EQ(r.Push(0, 2), Verdict::kStale);
  EXPECT_EQ(r.shard().version(), 2);
  r.Read(0);
  EXPECT_EQ(r.Push(0, 2), Verdict::kTake);
}

// aggregate and delta need no rule of their own: the sync rule with `aggregate` sets the
// step's average, the async rule with `delta` adds each change.
TEST(WorkerSideOptimizerTest, AggregateUnderSyncSetsTheAverageAndDeltaUnderAsyncAddsEach) {
  Rules sync("sync", 2, OptimizerKind::kAggregate);
  ASSERT_EQ(sync.Push(0, 0, 1.0f), Verdict::kTake);
  EXPECT_FLOAT_EQ(sync.Value(), kInitial);  // not before the step
  ASSERT_EQ(sync.Push(1, 0, 4.0f), Verdict::kTake);
  EXPECT_FLOAT_EQ(sync.Value(), 2.5f);

  Rules async("async", 2, OptimizerKind::kDelta);
  ASSERT_EQ(async.Push(0, 0, 0.25f), Verdict::kTake);
  EXPECT_FLOAT_EQ(async.Value(), kInitial + 0.25f);
  ASSERT_EQ(async.Push(1, 0, -1.0f), Verdict::kTake);
  EXPECT_FLOAT_EQ(async.Value(), kInitial - 0.75f);
}

}  // namespace
}  // namespace parasync
