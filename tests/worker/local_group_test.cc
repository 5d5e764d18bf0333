// LocalGroup (worker/local_group.h): a leader and members on an ipc socket in a temp dir, each
// on its own thread, and a leader in a child process that exits (the member's liveness check).
#include "worker/local_group.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include "tests/support/temp_dir.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;

LocalGroupOptions Options(const std::string& dir, std::vector<int> ranks, int rank,
                          std::chrono::milliseconds timeout = 20s) {
  LocalGroupOptions o;
  o.endpoint = "ipc://" + dir + "/group.sock";
  o.ranks = std::move(ranks);
  o.rank = rank;
  o.timeout = timeout;
  return o;
}

TEST(LocalGroupRanksTest, ParsesSortsAndRefusesWhatIsNotAGroup) {
  auto r = ParseLocalGroupRanks("3,1,2");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, (std::vector<int>{1, 2, 3}));
  for (const char* bad : {"", "1", "1,1", "0,x", "0,-1", "0,,1", "0,1,"}) {
    EXPECT_FALSE(ParseLocalGroupRanks(bad).ok()) << "'" << bad << "' was taken";
  }
  const TrainingMode sync = *TrainingMode::Parse("sync");
  EXPECT_FALSE(LocalGroupFor("0,1", "", 2, 4, sync, {"h:5000"}).ok()) << "rank not in group";
  EXPECT_FALSE(LocalGroupFor("0,4", "", 0, 4, sync, {"h:5000"}).ok()) << "rank past the workers";
  EXPECT_FALSE(LocalGroupFor("0,1", "", 0, 4, *TrainingMode::Parse("async"), {"h:5000"}).ok());
  EXPECT_FALSE(LocalGroupFor("0,1", "", 0, 4, *TrainingMode::Parse("ssp:2"), {"h:5000"}).ok());
  auto ok = LocalGroupFor("2,3", "", 3, 4, *TrainingMode::Parse("sync:delayed"), {"h:5000"});
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->endpoint, DefaultLocalGroupEndpoint({"h:5000"}, 2));
  EXPECT_NE(ok->endpoint.find("5000-r2"), std::string::npos) << ok->endpoint;
}

// Leader 0 and members 1, 2: the sum is the leader's gradient plus the members' in rank
// order, the examples add up, and each member gets the parameters and the outcome.
TEST(LocalGroupTest, LeaderSumsTheGroupAndEveryMemberGetsTheParameters) {
  testing::TempDir dir;
  zmq::context_t ctx;
  const std::vector<int64_t> sizes = {3, 2};
  auto leader = LocalGroup::Open(ctx, Options(dir.path(), {0, 1, 2}, 0));
  ASSERT_TRUE(leader.ok()) << leader.status().message();
  std::vector<std::vector<float>> got(3);
  std::vector<LocalGroup::Outcome> outcomes(3);
  std::vector<std::thread> members;
  for (int r = 1; r <= 2; ++r) {
    members.emplace_back([&, r] {
      auto m = LocalGroup::Open(ctx, Options(dir.path(), {0, 1, 2}, r));
      ASSERT_TRUE(m.ok()) << m.status().message();
      const float f = static_cast<float>(r);
      std::vector<float> g0 = {f, 10 * f, 100 * f}, g1 = {-f, 0.5f * f};
      std::vector<float> p0(3), p1(2);
      const float* grads[] = {g0.data(), g1.data()};
      float* params[] = {p0.data(), p1.data()};
      auto out = (*m)->Exchange(grads, sizes, 8 * r, params, {});
      ASSERT_TRUE(out.ok()) << out.status().message();
      outcomes[static_cast<size_t>(r)] = *out;
      got[static_cast<size_t>(r)] = {p0[0], p0[1], p0[2], p1[0], p1[1]};
    });
  }
  std::vector<float> own0 = {0.25f, 0.5f, 0.75f}, own1 = {1, 2};
  const float* own[] = {own0.data(), own1.data()};
  std::vector<std::vector<float>> sum;
  int64_t examples = 4;
  auto ranks = (*leader)->Gather(own, sizes, sum, &examples, {});
  ASSERT_TRUE(ranks.ok()) << ranks.status().message();
  EXPECT_EQ(*ranks, (std::vector<int>{1, 2}));
  EXPECT_EQ(examples, 4 + 8 + 16);
  EXPECT_EQ(sum[0], (std::vector<float>{3.25f, 30.5f, 300.75f}));
  EXPECT_EQ(sum[1], (std::vector<float>{1 - 3.0f, 2 + 1.5f}));
  std::vector<float> p0 = {7, 8, 9}, p1 = {-1, -2};
  float* params[] = {p0.data(), p1.data()};
  LocalGroup::Outcome outcome;
  outcome.last_version = 41;
  outcome.staleness = 1;
  outcome.dropped = true;
  outcome.read_versions = {40, 41};
  outcome.read_incarnations = {5, 6};
  (*leader)->Answer(*ranks, outcome, params, sizes);
  for (std::thread& t : members) t.join();
  for (int r = 1; r <= 2; ++r) {
    const LocalGroup::Outcome& o = outcomes[static_cast<size_t>(r)];
    EXPECT_TRUE(o.status.ok());
    EXPECT_EQ(got[static_cast<size_t>(r)], (std::vector<float>{7, 8, 9, -1, -2}));
    EXPECT_EQ(o.last_version, 41);
    EXPECT_EQ(o.staleness, 1);
    EXPECT_TRUE(o.dropped);
    EXPECT_EQ(o.read_versions, (std::vector<int64_t>{40, 41}));
    EXPECT_EQ(o.read_incarnations, (std::vector<uint64_t>{5, 6}));
  }
}

// A member whose gradient does not fit the model is dropped and told why: the step goes on
// with the others, and the next step does not wait for it.
TEST(LocalGroupTest, AMemberWithAMisfitGradientIsRefusedAndDropped) {
  testing::TempDir dir;
  zmq::context_t ctx;
  const std::vector<int64_t> sizes = {4};
  auto leader = LocalGroup::Open(ctx, Options(dir.path(), {0, 1}, 0));
  ASSERT_TRUE(leader.ok());
  Status member_saw;
  std::thread member([&] {
    auto m = LocalGroup::Open(ctx, Options(dir.path(), {0, 1}, 1));
    ASSERT_TRUE(m.ok());
    std::vector<float> g(3), p(3);  // three elements where the model has four
    const float* grads[] = {g.data()};
    float* params[] = {p.data()};
    const std::vector<int64_t> wrong = {3};
    member_saw = (*m)->Exchange(grads, wrong, 1, params, {}).status();
  });
  std::vector<float> own(4, 1.0f);
  const float* grads[] = {own.data()};
  std::vector<std::vector<float>> sum;
  int64_t examples = 1;
  auto ranks = (*leader)->Gather(grads, sizes, sum, &examples, {});
  member.join();
  ASSERT_TRUE(ranks.ok());
  EXPECT_TRUE(ranks->empty());
  EXPECT_EQ(examples, 1);
  // Told it is dropped (Unavailable): PsClient then goes on alone.
  EXPECT_EQ(member_saw.code(), StatusCode::kUnavailable);
  EXPECT_NE(member_saw.message().find("does not fit"), std::string::npos) << member_saw.message();
  // Dropped for good: the next step gathers at once.
  const auto t0 = std::chrono::steady_clock::now();
  ranks = (*leader)->Gather(grads, sizes, sum, &examples, {});
  ASSERT_TRUE(ranks.ok());
  EXPECT_TRUE(ranks->empty());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

// Members never heard from are given up on after the timeout; interrupted stops a wait.
TEST(LocalGroupTest, SilentMembersAreGivenUpOnAndAWaitCanBeInterrupted) {
  testing::TempDir dir;
  zmq::context_t ctx;
  const std::vector<int64_t> sizes = {2};
  std::vector<float> own = {1, 2};
  const float* grads[] = {own.data()};
  std::vector<std::vector<float>> sum;
  int64_t examples = 0;
  {
    auto leader = LocalGroup::Open(ctx, Options(dir.path(), {0, 1}, 0, 1s));
    ASSERT_TRUE(leader.ok());
    int polls = 0;
    auto stopped = (*leader)->Gather(grads, sizes, sum, &examples, [&] { return ++polls > 2; });
    EXPECT_EQ(stopped.status().code(), StatusCode::kAborted);
    auto ranks = (*leader)->Gather(grads, sizes, sum, &examples, {});
    ASSERT_TRUE(ranks.ok()) << ranks.status().message();
    EXPECT_TRUE(ranks->empty());
    EXPECT_EQ(sum[0], own);
  }
  // A member that leaves (Close) is not waited for: the gather ends without the timeout.
  {
    auto leader = LocalGroup::Open(ctx, Options(dir.path(), {0, 1}, 0, 60s));
    ASSERT_TRUE(leader.ok());
    auto member = LocalGroup::Open(ctx, Options(dir.path(), {0, 1}, 1));
    ASSERT_TRUE(member.ok());
    (*member)->Close();
    const auto t0 = std::chrono::steady_clock::now();
    auto ranks = (*leader)->Gather(grads, sizes, sum, &examples, {});
    ASSERT_TRUE(ranks.ok()) << ranks.status().message();
    EXPECT_TRUE(ranks->empty());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  }
  // A member whose leader never answers gives up after the timeout.
  auto member = LocalGroup::Open(ctx, Options(dir.path(), {0, 1}, 1, 1s));
  ASSERT_TRUE(member.ok());
  std::vector<float> p(2);
  float* params[] = {p.data()};
  auto out = (*member)->Exchange(grads, sizes, 1, params, {});
  EXPECT_EQ(out.status().code(), StatusCode::kTimedOut) << out.status().message();
}

// The leader's process gone: a member's next step fails at once, naming it. The leader is a
// child process that answers one step and is then killed (SIGKILL: it tells nobody).
TEST(LocalGroupTest, AMemberGivesUpWhenTheLeadersProcessIsGone) {
  testing::TempDir dir;
  const std::vector<int64_t> sizes = {2};
  std::vector<float> g = {1, 2}, p(2);
  const float* grads[] = {g.data()};
  float* params[] = {p.data()};
  int answered[2];
  ASSERT_EQ(::pipe(answered), 0);
  const pid_t child = ::fork();  // before this process makes a ZeroMQ context
  if (child == 0) {
    zmq::context_t ctx;
    auto leader = LocalGroup::Open(ctx, Options(dir.path(), {0, 1}, 0));
    if (!leader.ok()) ::_exit(3);
    std::vector<std::vector<float>> sum;
    int64_t examples = 0;
    auto ranks = (*leader)->Gather(grads, sizes, sum, &examples, {});
    if (!ranks.ok()) ::_exit(4);
    (*leader)->Answer(*ranks, LocalGroup::Outcome{}, params, sizes);
    char byte = 0;
    (void)::read(answered[0], &byte, 1);  // the member has the answer
    ::kill(::getpid(), SIGKILL);
  }
  zmq::context_t ctx;
  auto member = LocalGroup::Open(ctx, Options(dir.path(), {0, 1}, 1));
  ASSERT_TRUE(member.ok());
  auto first = (*member)->Exchange(grads, sizes, 1, params, {});
  ASSERT_EQ(::write(answered[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::close(answered[0]);
  ::close(answered[1]);
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  const auto t0 = std::chrono::steady_clock::now();
  auto second = (*member)->Exchange(grads, sizes, 1, params, {});
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable) << second.status().message();
  EXPECT_NE(second.status().message().find("exited"), std::string::npos)
      << second.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

// A leader that leaves (Close, at the end of its training) tells its members: their next step
// fails at once with Unavailable, and PsClient goes on alone.
TEST(LocalGroupTest, AMembersStepAfterTheLeaderLeftFailsAtOnce) {
  testing::TempDir dir;
  zmq::context_t ctx;
  const std::vector<int64_t> sizes = {1};
  auto leader = LocalGroup::Open(ctx, Options(dir.path(), {0, 1}, 0));
  ASSERT_TRUE(leader.ok());
  auto member = LocalGroup::Open(ctx, Options(dir.path(), {0, 1}, 1));
  ASSERT_TRUE(member.ok());
  std::vector<float> g = {1}, p(1);
  const float* grads[] = {g.data()};
  float* params[] = {p.data()};
  std::thread leader_side([&] {
    std::vector<std::vector<float>> sum;
    int64_t examples = 0;
    auto ranks = (*leader)->Gather(grads, sizes, sum, &examples, {});
    ASSERT_TRUE(ranks.ok());
    (*leader)->Answer(*ranks, LocalGroup::Outcome{}, params, sizes);
    (*leader)->Close();
  });
  auto first = (*member)->Exchange(grads, sizes, 1, params, {});
  leader_side.join();
  ASSERT_TRUE(first.ok()) << first.status().message();
  auto second = (*member)->Exchange(grads, sizes, 1, params, {});
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("left the group"), std::string::npos)
      << second.status().message();
}

}  // namespace
}  // namespace parasync
