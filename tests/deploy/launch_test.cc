// Tests of deploy/launch: plan building in-process, and the real parasync-launch binary run
// as a subprocess against fake parasync-ps / parasync-worker shell scripts whose behaviour
// each test picks through FAKE_<name> environment variables.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deploy/launch/launcher.h"
#include "deploy/launch/snapshot_server.h"
#include "tests/support/process_util.h"

namespace parasync::launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using parasync::testing::Child;
using parasync::testing::HttpGet;
using parasync::testing::ReadFile;
using parasync::testing::ReadLines;  // non-empty lines
using parasync::testing::WaitFor;
using Clock = std::chrono::steady_clock;

// Behaviour per process from FAKE_<name> or FAKE_DEFAULT:
//   ok           prints, exits 0 FAKE_OK_DELAY s after all are ready, leaving its last line
//                without a newline; worker0 appends two rows to eval.jsonl when
//                FAKE_WRITE_EVAL is set (best accuracy 0.8801 at epoch 4, final 0.8712 at 5)
//   fail3        prints, exits 3 0.2 s after all are ready
//   hang         runs until SIGTERM, then says so and exits 0
//   ignore_term  ignores SIGTERM; only SIGKILL ends it
// Each fake records its arguments (one a line), its PARASYNC_LOG_PREFIXED ("unset" when
// absent) and its PID in $FAKE_DIR, and a .ready marker once its greeting is printed; ok
// and fail3 wait (up to 5 s) until all FAKE_COUNT (default 4) fakes are ready, so no fake
// is stopped before it has set itself up.
constexpr const char* kFakeScript = R"(#!/bin/sh
role=ps
case "$0" in *parasync-worker) role=worker ;; esac
index=
log_dir=
prev=
for arg in "$@"; do
  [ "$prev" = "--task-index" ] && index=$arg
  [ "$prev" = "--log-dir" ] && log_dir=$arg
  prev=$arg
done
name=$role$index
eval "behaviour=\${FAKE_$name:-\${FAKE_DEFAULT:-hang}}"
case "$behaviour" in
  hang) trap 'echo "$name got SIGTERM"; exit 0' TERM ;;
  ignore_term) trap '' TERM ;;
esac
printf '%s\n' "$@" > "$FAKE_DIR/$name.args"
printf '%s\n' "${PARASYNC_LOG_PREFIXED-unset}" > "$FAKE_DIR/$name.env"
# What a real process writes at exit (written at start here: the launcher reads it after);
# worker i counts 1000 * (i + 1) examples.
eval "no_prom=\${FAKE_NO_PROM_$name:-\${FAKE_NO_PROM:-}}"
if [ -n "$log_dir" ] && [ -z "$no_prom" ]; then
  printf 'fake_final{name="%s"} 42\n' "$name" > "$log_dir/metrics-$name.prom"
  if [ "$role" = worker ]; then
    printf 'parasync_worker_examples_total{rank="%s",role="worker"} %s\n' "$index" \
      $((1000 * (index + 1))) >> "$log_dir/metrics-$name.prom"
  fi
fi
echo $$ > "$FAKE_DIR/$name.pid.tmp" && mv "$FAKE_DIR/$name.pid.tmp" "$FAKE_DIR/$name.pid"
echo "hello from $name"
echo "$name to stderr" >&2
printf 'partial from %s' "$name"
sleep 0.05
printf ' completed\n'
touch "$FAKE_DIR/$name.ready"
all_ready() {
  set -- "$FAKE_DIR"/*.ready
  [ -e "$1" ] && [ $# -ge "${FAKE_COUNT:-4}" ]
}
tries=0
if [ "$behaviour" = ok ] || [ "$behaviour" = fail3 ]; then
  until all_ready || [ $tries -ge 250 ]; do sleep 0.02; tries=$((tries + 1)); done
fi
case "$behaviour" in
  ok)
    sleep "${FAKE_OK_DELAY:-0.3}"
    if [ "$name" = worker0 ] && [ -n "$FAKE_WRITE_EVAL" ]; then
      echo '{"epoch": 4, "test_accuracy": 0.8801, "examples": 48000, "wall_s": 99.0}' \
        >> "$log_dir/eval.jsonl"
      echo '{"epoch": 5, "test_accuracy": 0.8712, "examples": 60000, "wall_s": 123.4}' \
        >> "$log_dir/eval.jsonl"
    fi
    printf 'last words of %s' "$name"
    exit 0 ;;
  fail3) sleep 0.2; echo "$name failing"; exit 3 ;;
  *) while :; do sleep 0.05; done ;;
esac
)";

// A fake parasync-export: records its arguments, says how many fake PS and workers are
// still alive, and then, by FAKE_EXPORT, writes the --out file (ok, the default) or exits 4.
constexpr const char* kFakeExportScript = R"sh(#!/bin/sh
printf '%s\n' "$@" > "$FAKE_DIR/export.args"
printf '%s\n' "${PARASYNC_LOG_PREFIXED-unset}" > "$FAKE_DIR/export.env"
alive() {
  n=0
  for f in "$FAKE_DIR"/$1*.pid; do
    [ -e "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && n=$((n + 1))
  done
  echo $n
}
echo "export sees $(alive ps) ps and $(alive worker) workers alive"
case "${FAKE_EXPORT:-ok}" in
  ok)
    out=
    prev=
    for arg in "$@"; do
      [ "$prev" = "--out" ] && out=$arg
      prev=$arg
    done
    echo model > "$out"
    echo "wrote $out" ;;
  *) echo "export failing" >&2; exit 4 ;;
esac
)sh";

std::string LauncherPath() {
  const char* bin_dir = std::getenv("PARASYNC_BIN_DIR");
  if (bin_dir != nullptr && *bin_dir != '\0') return std::string(bin_dir) + "/parasync-launch";
  // Run by hand: the test sits next to the launcher in <build>/bin.
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string() +
         "/parasync-launch";
}

bool ProcessGone(pid_t pid) { return kill(pid, 0) == -1 && errno == ESRCH; }

// Waits up to `timeout` for every PID to be gone; returns those still there.
std::vector<pid_t> WaitUntilGone(const std::vector<pid_t>& pids,
                                 std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    std::vector<pid_t> alive;
    for (pid_t pid : pids) {
      if (!ProcessGone(pid)) alive.push_back(pid);
    }
    if (alive.empty() || Clock::now() >= deadline) return alive;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// The launcher binary running as our child, stdout and stderr captured to files.
class LauncherProcess {
 public:
  LauncherProcess(std::vector<std::string> args, const std::map<std::string, std::string>& env,
                  const std::string& out_path, const std::string& err_path)
      : out_path_(out_path),
        err_path_(err_path),
        start_(Clock::now()),
        child_(Start(std::move(args), env, out_path, err_path)) {}

  pid_t pid() const { return child_.pid(); }

  // Waits up to `timeout` for the launcher to exit; returns its exit code, 128 + signal if
  // it died of one, or -1 (after killing it) if it did not exit in time.
  int Wait(std::chrono::milliseconds timeout) {
    if (std::optional<int> status = child_.Wait(timeout)) {
      seconds_ = std::chrono::duration<double>(Clock::now() - start_).count();
      return ExitCode(*status);
    }
    child_.Signal(SIGKILL);
    child_.Wait(std::chrono::hours(1));
    return -1;
  }

  double seconds() const { return seconds_; }
  std::string out() const { return ReadFile(out_path_); }
  std::string err() const { return ReadFile(err_path_); }

 private:
  // The launcher with our environment less the FAKE_ variables of other tests, plus `env`;
  // stdin is ours, as a user's terminal would be.
  static Child Start(std::vector<std::string> args, const std::map<std::string, std::string>& env,
                     const std::string& out_path, const std::string& err_path) {
    SpawnOptions options;
    options.argv = std::move(args);
    options.argv.insert(options.argv.begin(), LauncherPath());
    options.env_unset = {"FAKE_*"};
    for (const auto& [key, value] : env) options.env_set.push_back(key + "=" + value);
    options.in = StreamTarget::Inherit();
    options.out = StreamTarget::File(out_path);
    options.err = StreamTarget::File(err_path);
    return Child::Start(std::move(options));
  }

  std::string out_path_;
  std::string err_path_;
  Clock::time_point start_;
  Child child_;
  double seconds_ = 0;
};

// The launcher's own lines of `out` ("[launch HH:MM:SS.mmm] text"), as their text. Lines
// that begin "[launch" without such a timestamp come back whole, so no check can miss them.
std::vector<std::string> LauncherMessages(const std::string& out) {
  static const std::regex kStamped(R"(^\[launch \d\d:\d\d:\d\d\.\d\d\d\] (.*)$)");
  std::vector<std::string> messages;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[launch", 0) != 0) continue;
    std::smatch match;
    messages.push_back(std::regex_match(line, match, kStamped) ? match[1].str() : line);
  }
  return messages;
}

// Every line of the launcher's output is a process's ("[ps0] ...") or the launcher's own,
// with the time of day.
void ExpectEveryLauncherLineTimestamped(const std::string& out) {
  static const std::regex kStamped(R"(^\[launch \d\d:\d\d:\d\d\.\d\d\d\] \S.*$)");
  static const std::regex kForwarded(R"(^\[(ps|worker)\d+\] .*|^\[export\] .*)");
  std::istringstream lines(out);
  int stamped = 0;
  for (std::string line; std::getline(lines, line);) {
    if (std::regex_match(line, kStamped)) {
      ++stamped;
    } else {
      EXPECT_TRUE(std::regex_match(line, kForwarded)) << "a line without a timestamp: " << line;
    }
  }
  EXPECT_GE(stamped, 8) << out;  // starting, one per process, the end and the final lines
}

// <log_dir>/summary.json, or null when it is missing or not JSON.
nlohmann::json ReadSummary(const std::string& log_dir) {
  return nlohmann::json::parse(ReadFile(log_dir + "/summary.json"), nullptr, false);
}

// The entry of summary.json's "processes" named `name` (null if none).
nlohmann::json SummaryProcess(const nlohmann::json& summary, const std::string& name) {
  for (const nlohmann::json& process : summary["processes"]) {
    if (process["name"] == name) return process;
  }
  return nullptr;
}

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tmp_.path();
    bin_dir_ = root_ + "/bin";
    fake_dir_ = root_ + "/fake";
    log_dir_ = root_ + "/logs";
    std::filesystem::create_directories(bin_dir_);
    std::filesystem::create_directories(fake_dir_);
    for (const char* name : {"parasync-ps", "parasync-worker"}) {
      const std::string path = bin_dir_ + "/" + name;
      std::ofstream(path) << kFakeScript;
      ASSERT_EQ(chmod(path.c_str(), 0755), 0);
    }
    // The launcher looks for the data set before it starts anything; the fakes read none.
    data_dir_ = root_ + "/data";
    std::filesystem::create_directories(data_dir_);
    for (const char* name : {"train_x.npy", "train_y.npy", "test_x.npy", "test_y.npy"}) {
      std::ofstream(data_dir_ + "/" + name) << "";
    }
  }

  void TearDown() override {
    // Safety net: a failed test must not leave fakes running.
    for (pid_t pid : RecordedPids()) kill(pid, SIGKILL);
  }

  void InstallFakeExporter() const {
    const std::string path = bin_dir_ + "/parasync-export";
    std::ofstream(path) << kFakeExportScript;
    ASSERT_EQ(chmod(path.c_str(), 0755), 0);
  }

  std::vector<std::string> BaseArgs() const {
    return {"--bin-dir", bin_dir_, "--log-dir", log_dir_, "--dataset", data_dir_};
  }

  std::unique_ptr<LauncherProcess> Launch(std::vector<std::string> args,
                                          std::map<std::string, std::string> env) {
    env["FAKE_DIR"] = fake_dir_;
    return std::make_unique<LauncherProcess>(std::move(args), env, root_ + "/stdout",
                                             root_ + "/stderr");
  }

  std::vector<pid_t> RecordedPids() const {
    std::vector<pid_t> pids;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(fake_dir_, ec)) {
      if (entry.path().extension() != ".pid") continue;
      const std::string text = ReadFile(entry.path().string());
      if (!text.empty()) pids.push_back(static_cast<pid_t>(std::stol(text)));
    }
    return pids;
  }

  size_t ReadyFakes() const {
    size_t ready = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(fake_dir_, ec)) {
      if (entry.path().extension() == ".ready") ++ready;
    }
    return ready;
  }

  // Waits up to `timeout` until `count` fakes have printed their greeting.
  bool WaitForFakes(size_t count, std::chrono::milliseconds timeout) const {
    const auto deadline = Clock::now() + timeout;
    while (ReadyFakes() < count) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

  void ExpectAllFakesGone(size_t expected_count) const {
    const std::vector<pid_t> pids = RecordedPids();
    EXPECT_EQ(pids.size(), expected_count);
    EXPECT_THAT(WaitUntilGone(pids, std::chrono::seconds(3)), ::testing::IsEmpty())
        << "processes left behind";
  }

  parasync::testing::TempDir tmp_;
  std::string root_;
  std::string bin_dir_;
  std::string fake_dir_;
  std::string log_dir_;
  std::string data_dir_;  // empty files the launcher's preflight finds
};

// ---- in-process: options and plan -------------------------------------------------------

TEST(LaunchPlanTest, AcceptsOnlyKnownModes) {
  EXPECT_TRUE(IsValidMode("async"));
  EXPECT_TRUE(IsValidMode("sync"));
  EXPECT_TRUE(IsValidMode("ssp:0"));
  EXPECT_TRUE(IsValidMode("ssp:12"));
  EXPECT_FALSE(IsValidMode("ssp:"));
  EXPECT_FALSE(IsValidMode("ssp:-1"));
  EXPECT_FALSE(IsValidMode("ssp:3x"));
  EXPECT_FALSE(IsValidMode("Async"));
  EXPECT_FALSE(IsValidMode(""));
}

TEST(LaunchPlanTest, RejectsCountsBelowOne) {
  LaunchOptions options;
  options.num_ps = 0;
  EXPECT_EQ(ValidateOptions(options).code(), StatusCode::kInvalidArgument);
  options.num_ps = 1;
  options.num_workers = 0;
  EXPECT_EQ(ValidateOptions(options).code(), StatusCode::kInvalidArgument);
  options.num_workers = 1;
  options.epochs = 0;
  EXPECT_EQ(ValidateOptions(options).code(), StatusCode::kInvalidArgument);
  options.epochs = 1;
  EXPECT_TRUE(ValidateOptions(options).ok());
}

TEST(LaunchPlanTest, BuildsCommandLinesForEveryProcess) {
  LaunchOptions options;
  options.mode = "sync";
  options.epochs = 3;
  options.data_dir = "/data";
  options.lr = "0.1";
  options.ps_args = {"--data-dir=/ckpt"};
  options.worker_args = {"--device=cpu"};
  const Result<LaunchPlan> plan =
      BuildPlan(options, "/opt/bin", "/logs", {5000, 5001, 6000, 6001, 7000, 7001, 7002, 7003});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->processes.size(), 4u);
  EXPECT_EQ(plan->processes[0].name, "ps0");
  EXPECT_EQ(plan->processes[3].name, "worker1");
  EXPECT_EQ(plan->processes[3].address, "127.0.0.1:6001");
  EXPECT_EQ(plan->processes[3].log_path, "/logs/worker1.log");
  EXPECT_THAT(plan->processes[1].argv,
              ElementsAre("/opt/bin/parasync-ps", "--ps-hosts", "127.0.0.1:5000,127.0.0.1:5001",
                          "--worker-hosts", "127.0.0.1:6000,127.0.0.1:6001", "--task-index", "1",
                          "--mode", "sync", "--metrics-port", "7001", "--metrics-bind",
                          "127.0.0.1", "--log-dir", "/logs",
                          "--data-dir=/ckpt"));
  EXPECT_THAT(plan->processes[2].argv,
              ElementsAre("/opt/bin/parasync-worker", "--ps-hosts",
                          "127.0.0.1:5000,127.0.0.1:5001", "--worker-hosts",
                          "127.0.0.1:6000,127.0.0.1:6001", "--task-index", "0", "--mode", "sync",
                          "--metrics-port", "7002", "--metrics-bind", "127.0.0.1", "--log-dir",
                          "/logs", "--local-rank", "0", "--epochs", "3",
                          "--dataset", "/data", "--lr", "0.1", "--device=cpu"));
}

TEST(LaunchPlanTest, ModeSettingsGoToTheParameterServersOnly) {
  LaunchOptions options;
  options.mode = "sync";
  options.num_ps = 1;
  options.num_workers = 3;
  options.replicas_to_aggregate = "3";
  options.worker_timeout = "2.5";
  const Result<LaunchPlan> plan =
      BuildPlan(options, "/b", "/l", {5000, 6000, 6001, 6002, 7000, 7001, 7002, 7003});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_THAT(plan->processes[0].argv,
              ::testing::IsSupersetOf({"--replicas-to-aggregate", "3", "--worker-timeout", "2.5"}));
  EXPECT_THAT(plan->processes[1].argv, ::testing::Not(::testing::Contains("--worker-timeout")));
}

TEST(LaunchPlanTest, ReplicasToAggregateMustFitTheWorkersAndSyncMode) {
  LaunchOptions options;
  options.mode = "sync";
  options.num_workers = 2;
  options.replicas_to_aggregate = "2";
  EXPECT_TRUE(ValidateOptions(options).ok());
  options.replicas_to_aggregate = "3";
  Status s = ValidateOptions(options);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--replicas-to-aggregate 3 is more than the 2 workers (it may be at "
                         "most --workers; fewer makes the rest backup workers)");
  options.replicas_to_aggregate = "1";
  options.mode = "async";
  s = ValidateOptions(options);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("applies to --mode sync only"));
}

TEST(LaunchPlanTest, HostMustBeAnAddressOrAName) {
  LaunchOptions options;
  for (const char* bad : {"999.1.1.1", "1.2.3", "a b", "h:1"}) {
    options.host = bad;
    const Status s = ValidateOptions(options);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr(std::string("--host must be")) ) << bad;
  }
  options.host = "node-1.example.org";
  EXPECT_TRUE(ValidateOptions(options).ok());
}

TEST(LaunchPlanTest, TwoSpellingsOfOneHostThatWouldShareAPortAreRefused) {
  LaunchOptions options;
  options.num_ps = 2;
  options.ps_placement = {{"node1", 1}, {"NODE1", 1}};
  options.num_workers = 1;
  options.worker_placement = {{"node2", 1}};
  const Result<LaunchPlan> plan =
      BuildPlan(options, "/b", "/l", {29500, 29500, 29500, 30000, 30000, 30000});
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("names one address twice: 'node1:29500'"));
}

TEST(LaunchPlanTest, DataDirGivesEveryParameterServerItsOwnDirectory) {
  LaunchOptions options;
  options.ps_data_dir = "/state";
  const Result<LaunchPlan> plan =
      BuildPlan(options, "/b", "/l", {5000, 5001, 6000, 6001, 7000, 7001, 7002, 7003});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_THAT(plan->processes[0].argv, ::testing::IsSupersetOf({"--state-dir", "/state/ps0"}));
  EXPECT_THAT(plan->processes[1].argv, ::testing::IsSupersetOf({"--state-dir", "/state/ps1"}));
  EXPECT_THAT(plan->processes[1].argv, Not(::testing::Contains("/state/ps0")));
  for (size_t worker = 2; worker < 4; ++worker) {
    EXPECT_THAT(plan->processes[worker].argv, Not(::testing::Contains("--state-dir")));
  }
  options.ps_data_dir.clear();
  const Result<LaunchPlan> without =
      BuildPlan(options, "/b", "/l", {5000, 5001, 6000, 6001, 7000, 7001, 7002, 7003});
  ASSERT_TRUE(without.ok());
  EXPECT_THAT(without->processes[0].argv, Not(::testing::Contains("--state-dir")));
}

TEST(LaunchPlanTest, RankArgsGoToTheirWorkerOnlyAfterTheSharedOnes) {
  LaunchOptions options;
  options.num_ps = 1;
  options.num_workers = 2;
  options.worker_args = {"--device=cpu"};
  options.rank_args = {{1, "--slowdown=4"}, {1, "--log-level=debug"}};
  const Result<LaunchPlan> plan =
      BuildPlan(options, "/b", "/l", {5000, 6000, 6001, 7000, 7001, 7002});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->processes[1].argv.back(), "--device=cpu");
  EXPECT_THAT(plan->processes[1].argv, Not(::testing::Contains("--slowdown=4")));
  const std::vector<std::string>& worker1 = plan->processes[2].argv;
  ASSERT_GE(worker1.size(), 3u);
  EXPECT_EQ(worker1[worker1.size() - 3], "--device=cpu");
  EXPECT_EQ(worker1[worker1.size() - 2], "--slowdown=4");
  EXPECT_EQ(worker1.back(), "--log-level=debug");
  EXPECT_THAT(plan->processes[0].argv, Not(::testing::Contains("--slowdown=4")));
  options.rank_args = {{2, "--slowdown=4"}};
  EXPECT_EQ(ValidateOptions(options).code(), StatusCode::kInvalidArgument);
}

TEST(LaunchPlanTest, CurveDirGivesEveryProcessItsKeys) {
  LaunchOptions options;
  options.num_ps = 1;
  options.num_workers = 2;
  options.curve_dir = "/k";
  options.export_path = "/out/model.psm";
  const Result<LaunchPlan> plan =
      BuildPlan(options, "/b", "/l", {5000, 6000, 6001, 7000, 7001, 7002});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_THAT(plan->processes[0].argv,
              ::testing::IsSupersetOf({"--curve-key", "/k/ps.key", "--curve-allow", "/k/allowed"}));
  EXPECT_THAT(plan->processes[2].argv, ::testing::IsSupersetOf({"/k/worker1.key", "/k/ps.pub"}));
  EXPECT_THAT(plan->processes[2].argv, Not(::testing::Contains("/k/worker0.key")));
  ASSERT_TRUE(plan->exporter.has_value());
  EXPECT_THAT(plan->exporter->argv, ::testing::IsSupersetOf({"/k/export.key", "/k/ps.pub"}));
}

TEST(LaunchPlanTest, RemoteProcessesAreToldTheirLinesArePrefixed) {
  // The launcher prefixes a remote process's lines as a local one's: the process runs with
  // PARASYNC_LOG_PREFIXED=1 on its host.
  EXPECT_THAT(RemoteCommand({"/opt/bin/parasync-ps", "--task-index", "0"}, 10.0),
              HasSubstr("; PARASYNC_LOG_PREFIXED=1 /opt/bin/parasync-ps --task-index 0 "
                        "</dev/null"));
}

TEST(EnsureCurveKeysTest, MakesWhatIsMissingAndKeepsWhatExists) {
  parasync::testing::TempDir tmp;
  const std::string dir = tmp.path();
  ASSERT_TRUE(EnsureCurveKeys(dir, 2).ok());
  for (const char* f : {"ps.key", "ps.pub", "worker0.key", "worker1.key", "export.key",
                        "allowed/worker0.pub", "allowed/worker1.pub", "allowed/export.pub"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + f)) << f;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/allowed/ps.pub")) << "the server is no client";
  const std::string before = ReadFile(dir + "/worker0.key");
  ASSERT_TRUE(EnsureCurveKeys(dir, 3).ok());
  EXPECT_EQ(ReadFile(dir + "/worker0.key"), before) << "an existing key was replaced";
  EXPECT_TRUE(std::filesystem::exists(dir + "/allowed/worker2.pub"));
  EXPECT_EQ(std::filesystem::status(dir + "/ps.key").permissions() &
                std::filesystem::perms::others_read,
            std::filesystem::perms::none);
}

TEST(LaunchPlanTest, HostPlacementRefusesBadHostsAndLocalhostBesideRemoteHosts) {
  LaunchOptions options;
  options.num_ps = 1;
  options.num_workers = 1;
  options.ps_placement = {{"localhost", 1}};
  options.worker_placement = {{"node2", 1}};
  EXPECT_THAT(ValidateOptions(options).message(), HasSubstr("localhost cannot be mixed"));
  for (const char* bad : {"-oProxyCommand=id", "user@node", "2", "a b"}) {
    options.ps_placement = {{bad, 1}};
    EXPECT_THAT(ValidateOptions(options).message(), HasSubstr("not a host name")) << bad;
  }
  options.ps_placement = {{"node1", 1}};
  EXPECT_TRUE(ValidateOptions(options).ok());
  EXPECT_FALSE(ParseHostSlots("node1:0", "-H").ok());
  EXPECT_FALSE(ParseHostSlots("node1:x", "-H").ok());
  auto slots = ParseHostSlots("a:2,b", "-H");
  ASSERT_TRUE(slots.ok());
  EXPECT_EQ((*slots)[1].count, 1);
}

TEST(ParseFaultTest, ReadsRoleIndexTimeAndOptionalRestart) {
  auto ps = ParseFault("ps:1@20");
  ASSERT_TRUE(ps.ok()) << ps.status().ToString();
  EXPECT_TRUE(ps->ps);
  EXPECT_EQ(ps->index, 1);
  EXPECT_EQ(ps->at_seconds, 20.0);
  EXPECT_FALSE(ps->restart_after.has_value());
  auto worker = ParseFault("worker:3@2.5+0.75");
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  EXPECT_FALSE(worker->ps);
  EXPECT_EQ(worker->index, 3);
  EXPECT_EQ(worker->at_seconds, 2.5);
  EXPECT_EQ(worker->restart_after, 0.75);
  for (const char* bad : {"", "ps", "ps:1", "ps:@3", "ps:x@3", "chief:1@3", "ps:1@", "ps:1@-2",
                          "ps:1@3+", "ps:1@3+x", "ps:1@nan", "worker:1@3+2+1"}) {
    auto f = ParseFault(bad);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_THAT(f.status().message(), HasSubstr("'" + std::string(bad) + "'"));
  }
}

TEST(LaunchPlanTest, KillMustNameAnExistingProcessOtherThanTheChief) {
  LaunchOptions options;
  options.num_ps = 2;
  options.num_workers = 3;
  options.faults = {Fault{true, 1, 5.0, 2.0}, Fault{false, 2, 1.0, std::nullopt}};
  EXPECT_TRUE(ValidateOptions(options).ok());
  options.faults = {Fault{true, 2, 5.0, std::nullopt}};
  EXPECT_THAT(ValidateOptions(options).message(), HasSubstr("ps2"));
  options.faults = {Fault{false, 3, 5.0, std::nullopt}};
  EXPECT_THAT(ValidateOptions(options).message(), HasSubstr("worker3"));
  options.faults = {Fault{false, 0, 5.0, 1.0}};
  EXPECT_THAT(ValidateOptions(options).message(), HasSubstr("chief"));
}

TEST(LaunchPlanTest, CheckpointEachEpochGoesToTheWorkersOnly) {
  LaunchOptions options;
  options.num_ps = 1;
  options.num_workers = 2;
  options.checkpoint_each_epoch = true;
  options.worker_args = {"--device=cpu"};
  const Result<LaunchPlan> plan =
      BuildPlan(options, "/b", "/l", {5000, 6000, 6001, 7000, 7001, 7002});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_THAT(plan->processes[0].argv, Not(::testing::Contains("--checkpoint-each-epoch")));
  for (size_t worker = 1; worker < 3; ++worker) {
    const std::vector<std::string>& argv = plan->processes[worker].argv;
    ASSERT_GE(argv.size(), 2u);
    // Before the verbatim --worker-arg values, so those can still override it.
    EXPECT_EQ(argv[argv.size() - 2], "--checkpoint-each-epoch");
    EXPECT_EQ(argv.back(), "--device=cpu");
  }
  options.checkpoint_each_epoch = false;
  const Result<LaunchPlan> without =
      BuildPlan(options, "/b", "/l", {5000, 6000, 6001, 7000, 7001, 7002});
  ASSERT_TRUE(without.ok());
  EXPECT_THAT(without->processes[1].argv, Not(::testing::Contains("--checkpoint-each-epoch")));
}

TEST(LaunchPlanTest, ExportPlansTheExporterAgainstEveryParameterServer) {
  LaunchOptions options;
  options.export_path = "/out/model.psm";
  const Result<LaunchPlan> plan =
      BuildPlan(options, "/opt/bin", "/logs", {5000, 5001, 6000, 6001, 7000, 7001, 7002, 7003});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(plan->exporter.has_value());
  EXPECT_EQ(plan->exporter->role, Role::kExport);
  EXPECT_EQ(plan->exporter->name, "export");
  EXPECT_EQ(plan->exporter->log_path, "/logs/export.log");
  EXPECT_THAT(plan->exporter->argv,
              ElementsAre("/opt/bin/parasync-export", "--ps-hosts",
                          "127.0.0.1:5000,127.0.0.1:5001", "--out", "/out/model.psm"));
  // The exporter is no cluster process: no port, and not among those started at once.
  EXPECT_EQ(plan->processes.size(), 4u);

  options.export_path.clear();
  const Result<LaunchPlan> without =
      BuildPlan(options, "/opt/bin", "/logs", {5000, 5001, 6000, 6001, 7000, 7001, 7002, 7003});
  ASSERT_TRUE(without.ok());
  EXPECT_FALSE(without->exporter.has_value());
}

TEST(LaunchPlanTest, RejectsWrongPortCount) {
  const Result<LaunchPlan> plan = BuildPlan(LaunchOptions(), "/b", "/l", {1, 2, 3});
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
}

TEST(LaunchPlanTest, ReservesDistinctPorts) {
  Result<PortReservation> reservation = PortReservation::Reserve("127.0.0.1", 16);
  ASSERT_TRUE(reservation.ok()) << reservation.status().ToString();
  const std::vector<int>& ports = reservation->ports();
  EXPECT_EQ(std::set<int>(ports.begin(), ports.end()).size(), 16u);
  for (int port : ports) EXPECT_GT(port, 0);
}

// ---- the binary: flags ------------------------------------------------------------------

TEST_F(LaunchTest, HelpExitsZeroWithExample) {
  auto launcher = Launch({"--help"}, {});
  EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), 0);
  EXPECT_THAT(launcher->out(), HasSubstr("Example"));
  EXPECT_THAT(launcher->out(), HasSubstr("--grace-seconds"));
}

TEST_F(LaunchTest, BadFlagExitsTwoWithOneLine) {
  auto launcher = Launch({"--no-such-flag"}, {});
  EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitUsage);
  EXPECT_THAT(launcher->err(), HasSubstr("--no-such-flag"));
  const std::string err = launcher->err();
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

TEST_F(LaunchTest, ZeroWorkersExitsTwo) {
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--workers", "0"});
  auto launcher = Launch(args, {});
  EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitUsage);
  EXPECT_THAT(launcher->err(), HasSubstr("--workers"));
  EXPECT_TRUE(RecordedPids().empty());
}

TEST_F(LaunchTest, UnknownModeExitsTwo) {
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--mode", "eventually"});
  auto launcher = Launch(args, {});
  EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitUsage);
  EXPECT_THAT(launcher->err(), HasSubstr("--mode"));
}

TEST_F(LaunchTest, MissingBinariesExitTwoNamingThem) {
  const std::string empty_dir = root_ + "/empty";
  std::filesystem::create_directories(empty_dir);
  auto launcher = Launch({"--bin-dir", empty_dir, "--log-dir", log_dir_}, {});
  EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitUsage);
  EXPECT_THAT(launcher->err(), HasSubstr(empty_dir + "/parasync-ps"));
  const std::string err = launcher->err();
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

// ---- the binary: running a cluster of fakes ---------------------------------------------

TEST_F(LaunchTest, ChiefFinishingStopsOthersAndExitsZero) {
  auto launcher = Launch(BaseArgs(), {{"FAKE_worker0", "ok"}, {"FAKE_WRITE_EVAL", "1"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitOk) << launcher->out();
  ExpectAllFakesGone(4);

  const std::string out = launcher->out();
  EXPECT_THAT(out, HasSubstr("[ps0] hello from ps0\n"));
  EXPECT_THAT(out, HasSubstr("[ps1] ps1 to stderr\n"));
  EXPECT_THAT(out, HasSubstr("[worker1] partial from worker1 completed\n"));
  EXPECT_THAT(out, HasSubstr("[worker0] last words of worker0\n"));
  EXPECT_THAT(out, HasSubstr("[worker1] worker1 got SIGTERM\n"));
  EXPECT_THAT(out, HasSubstr("[ps1] ps1 got SIGTERM\n"));
  EXPECT_THAT(out, HasSubstr("final test accuracy 0.8712 after epoch 5 (123.4 s)"));
  EXPECT_THAT(out, HasSubstr("http://127.0.0.1:"));
  EXPECT_THAT(out, HasSubstr("metrics-<role><index>.prom"));

  const std::string ps0_log = ReadFile(log_dir_ + "/ps0.log");
  EXPECT_THAT(ps0_log, HasSubstr("hello from ps0\nps0 to stderr\npartial from ps0 completed\n"));
  EXPECT_THAT(ps0_log, Not(HasSubstr("[ps0]")));
  EXPECT_THAT(ReadFile(log_dir_ + "/worker0.log"), HasSubstr("last words of worker0\n"));
  // Workers are stopped before the PS processes.
  ASSERT_THAT(out, HasSubstr("[ps0] ps0 got SIGTERM\n"));
  EXPECT_LT(out.find("worker1 got SIGTERM"), out.find("ps0 got SIGTERM"));
  ExpectEveryLauncherLineTimestamped(out);
}

TEST_F(LaunchTest, SummaryJsonTellsTheConfigurationFiguresAndEveryProcessExit) {
  // An earlier run's row in the same directory is no part of this run's figures.
  std::filesystem::create_directories(log_dir_);
  std::ofstream(log_dir_ + "/eval.jsonl")
      << R"({"epoch": 9, "test_accuracy": 0.99, "examples": 7, "wall_s": 1.0})" << "\n";
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--mode", "sync", "--epochs", "3", "--model", "cnn"});
  // Set to something else here: every child must see "1" all the same.
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"},
                                {"FAKE_WRITE_EVAL", "1"},
                                {"PARASYNC_LOG_PREFIXED", "0"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitOk) << launcher->out();
  ExpectAllFakesGone(4);

  const nlohmann::json summary = ReadSummary(log_dir_);
  ASSERT_TRUE(summary.is_object()) << ReadFile(log_dir_ + "/summary.json");
  EXPECT_FALSE(std::filesystem::exists(log_dir_ + "/summary.json.tmp"));
  EXPECT_EQ(summary["outcome"], "succeeded");
  EXPECT_EQ(summary["exit_code"], 0);
  EXPECT_TRUE(summary["reason"].is_null());
  std::vector<std::string> command_line = args;
  command_line.insert(command_line.begin(), LauncherPath());
  // The dataset as given (BaseArgs may name one).
  nlohmann::json dataset = nullptr;
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--data" || args[i] == "--dataset") dataset = args[i + 1];
  }
  const nlohmann::json expected_config = {
      {"mode", "sync"}, {"ps", 2},          {"workers", 2},         {"epochs", 3},
      {"model", "cnn"}, {"dataset", dataset}, {"host", "127.0.0.1"}, {"log_dir", log_dir_},
      {"command_line", command_line}};
  EXPECT_EQ(summary["config"], expected_config) << summary["config"].dump();

  const std::regex iso(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d)");
  EXPECT_TRUE(std::regex_match(summary["start_time"].get<std::string>(), iso)) << summary;
  EXPECT_TRUE(std::regex_match(summary["end_time"].get<std::string>(), iso)) << summary;
  EXPECT_LE(summary["start_time"].get<std::string>(), summary["end_time"].get<std::string>());
  const double wall = summary["wall_seconds"].get<double>();
  EXPECT_GT(wall, 0.0);
  EXPECT_LE(wall, launcher->seconds()) << "longer than the launcher's whole life";

  // Examples from the workers' final snapshots (1000 + 2000), over the run's wall time.
  EXPECT_EQ(summary["examples"], 3000);
  EXPECT_EQ(summary["examples_source"], "worker_snapshots");
  EXPECT_NEAR(summary["examples_per_second"].get<double>(), 3000.0 / wall,
              0.01 * 3000.0 / wall);
  // This run's two rows only: the best is not the earlier run's 0.99.
  EXPECT_EQ(summary["eval_rows"], 2);
  EXPECT_EQ(summary["final"], nlohmann::json::parse(R"({"epoch": 5, "test_accuracy": 0.8712,
                                                         "examples": 60000, "wall_s": 123.4})"));
  EXPECT_EQ(summary["best"], nlohmann::json::parse(R"({"epoch": 4, "test_accuracy": 0.8801,
                                                        "examples": 48000, "wall_s": 99.0})"));

  ASSERT_EQ(summary["processes"].size(), 4u) << summary["processes"];
  for (const char* name : {"ps0", "ps1", "worker0", "worker1"}) {
    const nlohmann::json process = SummaryProcess(summary, name);
    ASSERT_TRUE(process.is_object()) << name;
    EXPECT_EQ(std::to_string(process["pid"].get<int>()) + "\n",
              ReadFile(fake_dir_ + "/" + name + ".pid"))
        << name;
    EXPECT_EQ(process["exit_status"], 0) << name;
    EXPECT_TRUE(process["signal"].is_null()) << name;
    EXPECT_EQ(process["killed_by_launcher"], false) << name;
    EXPECT_EQ(process["log"], log_dir_ + "/" + name + ".log");
    // The chief finished by itself; the launcher stopped the rest with SIGTERM.
    if (std::string(name) == "worker0") {
      EXPECT_TRUE(process["launcher_signal"].is_null());
    } else {
      EXPECT_EQ(process["launcher_signal"], "SIGTERM") << name;
    }
    EXPECT_EQ(ReadFile(fake_dir_ + "/" + name + ".env"), "1\n")
        << name << " was not told PARASYNC_LOG_PREFIXED=1";
  }
  EXPECT_EQ(SummaryProcess(summary, "ps1")["role"], "ps");
  EXPECT_EQ(SummaryProcess(summary, "worker1")["role"], "worker");

  const std::string out = launcher->out();
  const std::vector<std::string> messages = LauncherMessages(out);
  EXPECT_THAT(messages,
              ::testing::Contains(::testing::MatchesRegex(
                  R"(final test accuracy 0\.8712 after epoch 5 \(123\.4 s\), best 0\.8801 )"
                  R"(after epoch 4; run wall time [0-9]+\.[0-9] s, 3000 examples, )"
                  R"([0-9]+ examples/sec)")))
      << out;
  EXPECT_THAT(messages, ::testing::Contains("evaluation log: " + log_dir_ + "/eval.jsonl"));
  EXPECT_THAT(messages, ::testing::Contains("run summary: " + log_dir_ +
                                            "/summary.json (fields: docs/run-summary.md)"));
  ExpectEveryLauncherLineTimestamped(out);
}

TEST_F(LaunchTest, SummaryJsonOfAFailedRunNamesTheFailureAndHowEachProcessEnded) {
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--grace-seconds", "0.2"});
  // worker1 ignores SIGTERM and leaves no metrics snapshot (as when killed), and no
  // evaluation is written: no examples can be counted.
  auto launcher = Launch(args, {{"FAKE_ps1", "fail3"},
                                {"FAKE_worker1", "ignore_term"},
                                {"FAKE_NO_PROM_worker1", "1"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitFailed) << launcher->out();
  ExpectAllFakesGone(4);

  const nlohmann::json summary = ReadSummary(log_dir_);
  ASSERT_TRUE(summary.is_object()) << ReadFile(log_dir_ + "/summary.json");
  EXPECT_EQ(summary["outcome"], "failed");
  EXPECT_EQ(summary["exit_code"], kExitFailed);
  EXPECT_THAT(summary["reason"].get<std::string>(),
              ::testing::StartsWith("ps1 (pid " + ReadLines(fake_dir_ + "/ps1.pid")[0] +
                                    ") failed with exit status 3"));
  EXPECT_GT(summary["wall_seconds"].get<double>(), 0.2) << "the grace period is in it";
  EXPECT_LE(summary["wall_seconds"].get<double>(), launcher->seconds());
  EXPECT_EQ(summary["eval_rows"], 0);
  EXPECT_TRUE(summary["final"].is_null());
  EXPECT_TRUE(summary["best"].is_null());
  EXPECT_TRUE(summary["examples"].is_null());
  EXPECT_TRUE(summary["examples_source"].is_null());
  EXPECT_TRUE(summary["examples_per_second"].is_null());

  const nlohmann::json ps1 = SummaryProcess(summary, "ps1");
  EXPECT_EQ(ps1["exit_status"], 3);
  EXPECT_TRUE(ps1["signal"].is_null());
  EXPECT_TRUE(ps1["launcher_signal"].is_null());
  EXPECT_EQ(ps1["killed_by_launcher"], false);
  const nlohmann::json worker1 = SummaryProcess(summary, "worker1");
  EXPECT_TRUE(worker1["exit_status"].is_null());
  EXPECT_EQ(worker1["signal"], "SIGKILL");
  EXPECT_EQ(worker1["launcher_signal"], "SIGKILL");
  EXPECT_EQ(worker1["killed_by_launcher"], true);
  for (const char* name : {"ps0", "worker0"}) {  // stopped politely, exited 0
    const nlohmann::json process = SummaryProcess(summary, name);
    EXPECT_EQ(process["exit_status"], 0) << name;
    EXPECT_EQ(process["launcher_signal"], "SIGTERM") << name;
    EXPECT_EQ(process["killed_by_launcher"], false) << name;
  }

  // Only what exists is pointed at: no evaluation log.
  const std::string out = launcher->out();
  const std::vector<std::string> messages = LauncherMessages(out);
  EXPECT_THAT(messages, ::testing::Contains("no " + log_dir_ +
                                            "/eval.jsonl (the chief writes it after each "
                                            "evaluation)"));
  EXPECT_THAT(messages,
              ::testing::Contains(::testing::MatchesRegex(R"(run wall time [0-9]+\.[0-9] s)")));
  EXPECT_THAT(out, Not(HasSubstr("evaluation log:")));
  EXPECT_FALSE(std::filesystem::exists(log_dir_ + "/eval.jsonl"));
  ExpectEveryLauncherLineTimestamped(out);
}

TEST_F(LaunchTest, KillInjectsFaultsRestartsWhenAskedAndTheRunStillSucceeds) {
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--kill", "ps:1@0.3+0.2", "--kill", "worker:1@0.4"});
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"}, {"FAKE_OK_DELAY", "2"}});
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(fake_dir_ + "/ps1.pid"); },
                      std::chrono::seconds(5)));
  const std::string first_ps1 = ReadFile(fake_dir_ + "/ps1.pid");
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(10)), kExitOk) << launcher->out();
  const std::string out = launcher->out();
  EXPECT_THAT(out, HasSubstr("fault injection: killed ps1 (pid "));
  EXPECT_THAT(out, HasSubstr("restarting it in 0.2 s"));
  EXPECT_THAT(out, HasSubstr("fault injection: restarted ps1 as pid "));
  EXPECT_THAT(out, HasSubstr("fault injection: killed worker1 (pid "));
  EXPECT_THAT(out, HasSubstr("worker1 killed by fault injection"));
  EXPECT_THAT(out, HasSubstr("run succeeded: every process not killed by fault injection"));
  // The restart is a new process with the same command line, logging to the same file.
  const std::string second_ps1 = ReadFile(fake_dir_ + "/ps1.pid");
  EXPECT_NE(second_ps1, first_ps1);
  const std::string ps1_log = ReadFile(log_dir_ + "/ps1.log");
  EXPECT_NE(ps1_log.find("hello from ps1"), ps1_log.rfind("hello from ps1"))
      << "the restarted ps1 must append to its log:\n" << ps1_log;
  const auto cluster = nlohmann::json::parse(ReadFile(log_dir_ + "/cluster.json"));
  EXPECT_EQ(std::to_string(cluster["processes"][1]["pid"].get<int>()) + "\n", second_ps1);
  ExpectAllFakesGone(4);

  const nlohmann::json summary = ReadSummary(log_dir_);
  ASSERT_TRUE(summary.is_object()) << ReadFile(log_dir_ + "/summary.json");
  EXPECT_EQ(summary["outcome"], "succeeded");
  const nlohmann::json ps1 = SummaryProcess(summary, "ps1");
  EXPECT_EQ(ps1["restarts"], 1);
  EXPECT_EQ(ps1["fault_injection"], false);
  EXPECT_EQ(std::to_string(ps1["pid"].get<int>()) + "\n", second_ps1);
  EXPECT_EQ(ps1["exit_status"], 0);
  const nlohmann::json worker1 = SummaryProcess(summary, "worker1");
  EXPECT_EQ(worker1["fault_injection"], true);
  EXPECT_EQ(worker1["signal"], "SIGKILL");
  EXPECT_EQ(worker1["killed_by_launcher"], true);
  EXPECT_EQ(worker1["restarts"], 0);
  // A killed worker's count is lost, and no evaluation was written: no examples figure.
  EXPECT_TRUE(summary["examples"].is_null()) << summary["examples"];
}

TEST_F(LaunchTest, AStartThatFailsLeavesASummarySayingWhy) {
  // ps1's log file cannot be opened: the launcher fails before it starts any process.
  std::filesystem::create_directories(log_dir_ + "/ps1.log");
  auto launcher = Launch(BaseArgs(), {});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitFailed) << launcher->err();
  EXPECT_TRUE(RecordedPids().empty());
  const nlohmann::json summary = ReadSummary(log_dir_);
  ASSERT_TRUE(summary.is_object()) << ReadFile(log_dir_ + "/summary.json");
  EXPECT_EQ(summary["outcome"], "failed");
  EXPECT_EQ(summary["exit_code"], kExitFailed);
  EXPECT_THAT(summary["reason"].get<std::string>(),
              HasSubstr("cannot open " + log_dir_ + "/ps1.log"));
  ASSERT_EQ(summary["processes"].size(), 4u);
  for (const nlohmann::json& process : summary["processes"]) {
    EXPECT_TRUE(process["pid"].is_null()) << process;
    EXPECT_TRUE(process["exit_status"].is_null()) << process;
  }
}

TEST_F(LaunchTest, ABareSshCommandIsFoundInThePath) {
  // As the default "ssh -o ...": a name, not a path. The fake runs the command here, without
  // the environment the launcher gave it (ssh passes none on).
  const std::string path_dir = root_ + "/path";
  std::filesystem::create_directories(path_dir);
  std::ofstream(path_dir + "/fake-ssh")
      << "#!/bin/sh\nshift\nexec env -u PARASYNC_LOG_PREFIXED /bin/sh -c \"$1\"\n";
  ASSERT_EQ(chmod((path_dir + "/fake-ssh").c_str(), 0755), 0);
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(),
              {"--ps", "127.0.0.2:1", "-H", "127.0.0.3:1", "--ssh-command", "fake-ssh"});
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"},
                                {"FAKE_COUNT", "2"},
                                {"PATH", path_dir + ":" + std::getenv("PATH")}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitOk) << launcher->out();
  EXPECT_THAT(launcher->out(), HasSubstr("[127.0.0.3 worker0] hello from worker0\n"));
  // Told through the remote command line, not the ssh client's environment.
  EXPECT_EQ(ReadFile(fake_dir_ + "/ps0.env"), "1\n");
  ExpectAllFakesGone(2);
}

TEST_F(LaunchTest, BadKillOrRankArgExitsTwoWithOneLine) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--kill", "ps:9@1"}, std::vector<std::string>{"--kill", "boom"},
        std::vector<std::string>{"--kill", "worker:0@1"},
        std::vector<std::string>{"--rank-arg", "x:--slowdown=2"},
        std::vector<std::string>{"--rank-arg", "7:--slowdown=2"}}) {
    std::vector<std::string> args = BaseArgs();
    args.insert(args.end(), extra.begin(), extra.end());
    auto launcher = Launch(args, {});
    EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), 2) << extra[1];
    EXPECT_EQ(ReadLines(root_ + "/stderr").size(), 1u) << extra[1] << ": " << launcher->err();
  }
}

TEST_F(LaunchTest, ImpossibleCountsAndBadAddressesExitTwoBeforeStartingAnything) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--mode", "sync", "--workers", "2", "--replicas-to-aggregate", "3"},
       "parasync-launch: --replicas-to-aggregate 3 is more than the 2 workers (it may be at "
       "most --workers; fewer makes the rest backup workers)\n"},
      {{"--host", "999.1.1.1"},
       "parasync-launch: --host must be a host name or IPv4 address (four octets 0-255), got "
       "'999.1.1.1'\n"},
  };
  for (const auto& [extra, line] : cases) {
    std::vector<std::string> args = BaseArgs();
    args.insert(args.end(), extra.begin(), extra.end());
    // Fakes that would run until stopped: a launch that starts them cannot end in time.
    auto launcher = Launch(args, {{"FAKE_DEFAULT", "hang"}});
    EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitUsage) << extra[1];
    EXPECT_EQ(launcher->err(), line);
    EXPECT_TRUE(RecordedPids().empty()) << extra[1] << ": processes were started";
    EXPECT_FALSE(std::filesystem::exists(log_dir_)) << extra[1];
  }
}

TEST_F(LaunchTest, PassesClusterSpecPortsAndFlags) {
  std::vector<std::string> args = BaseArgs();
  // --data: the old name of --dataset, still accepted.
  args.insert(args.end(), {"--mode", "ssp:3", "--epochs", "7", "--data", data_dir_,
                           "--batch-size", "32", "--lr", "0.05", "--seed", "0", "--log-every",
                           "2.5", "--ps-arg", "--ps-flag", "--ps-arg=--ps-extra=1",
                           "--worker-arg=--device=cpu"});
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitOk) << launcher->out();
  ExpectAllFakesGone(4);
  EXPECT_THAT(launcher->out(), HasSubstr("eval.jsonl (the chief writes it"));

  const std::vector<std::string> ps1 = ReadLines(fake_dir_ + "/ps1.args");
  const std::vector<std::string> worker1 = ReadLines(fake_dir_ + "/worker1.args");
  ASSERT_EQ(ps1.size(), 16u);
  ASSERT_GE(worker1.size(), 2u);
  const std::string ps_hosts = ps1[1];
  const std::string worker_hosts = ps1[3];
  EXPECT_THAT(ps1, ElementsAre("--ps-hosts", ps_hosts, "--worker-hosts", worker_hosts,
                               "--task-index", "1", "--mode", "ssp:3", "--metrics-port",
                               ::testing::_, "--metrics-bind", "127.0.0.1", "--log-dir",
                               log_dir_, "--ps-flag",
                               "--ps-extra=1"));
  EXPECT_THAT(worker1,
              ElementsAre("--ps-hosts", ps_hosts, "--worker-hosts", worker_hosts, "--task-index",
                          "1", "--mode", "ssp:3", "--metrics-port", ::testing::_,
                          "--metrics-bind", "127.0.0.1", "--log-dir", log_dir_, "--local-rank", "1",
                          "--epochs", "7", "--dataset", data_dir_, "--batch-size",
                          "32", "--lr", "0.05", "--seed", "0", "--log-every", "2.5",
                          "--device=cpu"));

  // Every service and metrics port is distinct, and cluster.json agrees with the fakes.
  std::set<std::string> ports;
  size_t port_count = 0;
  auto add_hosts = [&](const std::string& hosts) {
    std::stringstream stream(hosts);
    for (std::string address; std::getline(stream, address, ',');) {
      ASSERT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
      ports.insert(address.substr(address.find(':') + 1));
      ++port_count;
    }
  };
  add_hosts(ps_hosts);
  add_hosts(worker_hosts);
  const nlohmann::json cluster =
      nlohmann::json::parse(ReadFile(log_dir_ + "/cluster.json"), nullptr, false);
  ASSERT_TRUE(cluster.is_object());
  ASSERT_EQ(cluster["processes"].size(), 4u);
  for (const nlohmann::json& process : cluster["processes"]) {
    const std::string name = process["name"].get<std::string>();
    const std::vector<std::string> recorded = ReadLines(fake_dir_ + "/" + name + ".args");
    ASSERT_GE(recorded.size(), 10u);
    EXPECT_EQ(recorded[9], std::to_string(process["metrics_port"].get<int>()));
    EXPECT_EQ(recorded[5], std::to_string(process["index"].get<int>()));
    EXPECT_EQ(ReadFile(fake_dir_ + "/" + name + ".pid"),
              std::to_string(process["pid"].get<int>()) + "\n");
    ports.insert(recorded[9]);
    ++port_count;
  }
  EXPECT_EQ(port_count, 8u);
  EXPECT_EQ(ports.size(), 8u);

  // prometheus-targets.json: one file_sd group per process, at its metrics port, labelled
  // with the run's job (the log directory's name) and the process's role and shard/rank.
  const nlohmann::json targets =
      nlohmann::json::parse(ReadFile(log_dir_ + "/prometheus-targets.json"), nullptr, false);
  ASSERT_TRUE(targets.is_array()) << ReadFile(log_dir_ + "/prometheus-targets.json");
  ASSERT_EQ(targets.size(), 4u);
  const std::string job = std::filesystem::path(log_dir_).filename().string();
  for (size_t i = 0; i < 4; ++i) {
    const nlohmann::json& process = cluster["processes"][i];
    const nlohmann::json& group = targets[i];
    ASSERT_EQ(group["targets"].size(), 1u);
    EXPECT_EQ(group["targets"][0],
              "127.0.0.1:" + std::to_string(process["metrics_port"].get<int>()));
    const bool is_ps = process["role"] == "ps";
    const nlohmann::json expected_labels = {
        {"job", job},
        {"role", process["role"]},
        {is_ps ? "shard" : "rank", std::to_string(process["index"].get<int>())}};
    EXPECT_EQ(group["labels"], expected_labels) << group.dump();
  }
}

TEST_F(LaunchTest, JobFlagNamesTheRunInTheTargets) {
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--job", "fmnist-sync"});
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitOk) << launcher->out();
  const nlohmann::json targets =
      nlohmann::json::parse(ReadFile(log_dir_ + "/prometheus-targets.json"), nullptr, false);
  ASSERT_TRUE(targets.is_array());
  ASSERT_EQ(targets.size(), 4u);
  for (const nlohmann::json& group : targets) EXPECT_EQ(group["labels"]["job"], "fmnist-sync");
  EXPECT_THAT(launcher->out(), HasSubstr("Prometheus targets (job \"fmnist-sync\")"));
}

TEST_F(LaunchTest, MetricsFlagKeepsServingEachProcessFinalMetricsUntilInterrupted) {
  std::vector<std::string> args = BaseArgs();
  args.push_back("--metrics");
  // A snapshot an earlier run left in the directory must not pass for this run's: worker1
  // leaves none this time (as if it had been killed), so its port stays closed.
  std::filesystem::create_directories(log_dir_);
  std::ofstream(log_dir_ + "/metrics-worker1.prom") << "stale_from_an_earlier_run 1\n";
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"}, {"FAKE_NO_PROM_worker1", "1"}});
  ASSERT_TRUE(WaitFor(
      [&] { return launcher->out().find("serving the final metrics") != std::string::npos; },
      std::chrono::seconds(10)))
      << launcher->out();
  ExpectAllFakesGone(4);  // the processes are gone; their ports answer all the same
  EXPECT_THAT(launcher->out(), HasSubstr("worker1 left no final metrics"));
  const nlohmann::json cluster =
      nlohmann::json::parse(ReadFile(log_dir_ + "/cluster.json"), nullptr, false);
  ASSERT_TRUE(cluster.is_object());
  for (const nlohmann::json& process : cluster["processes"]) {
    const std::string name = process["name"].get<std::string>();
    const int port = process["metrics_port"].get<int>();
    const std::string response = HttpGet(port, "/metrics");
    if (name == "worker1") {
      EXPECT_EQ(response, "") << "worker1's port should be closed";
      continue;
    }
    EXPECT_THAT(response, HasSubstr("200 OK")) << name;
    EXPECT_THAT(response, HasSubstr("fake_final{name=\"" + name + "\"} 42")) << name;
    EXPECT_THAT(HttpGet(port, "/other"), HasSubstr("404")) << name;
  }
  ASSERT_EQ(kill(launcher->pid(), SIGINT), 0);
  // The run itself succeeded: Ctrl-C only ends the serving.
  EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitOk) << launcher->out();
  EXPECT_THAT(launcher->out(), HasSubstr("stopped serving the final metrics"));
}

TEST_F(LaunchTest, MetricsFlagWithoutAnySnapshotSaysSoAndEnds) {
  std::vector<std::string> args = BaseArgs();
  args.push_back("--metrics");
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"}, {"FAKE_NO_PROM", "1"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitOk) << launcher->out();
  EXPECT_THAT(launcher->out(), HasSubstr("left no final metrics"));
  EXPECT_THAT(launcher->out(), HasSubstr("its port stays closed"));
  EXPECT_THAT(launcher->err(), HasSubstr("--metrics: no process left a final metrics snapshot"));
}

TEST_F(LaunchTest, ExportRunsAfterTheWorkersStopAndBeforeTheServersStop) {
  InstallFakeExporter();
  // Into the log directory, which does not exist before the launcher creates it.
  const std::string model = log_dir_ + "/model.psm";
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--export", model});
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitOk) << launcher->out();
  ExpectAllFakesGone(4);

  const std::string out = launcher->out();
  EXPECT_THAT(out, HasSubstr("[export] export sees 2 ps and 0 workers alive\n"));
  EXPECT_THAT(out, HasSubstr("[export] wrote " + model + "\n"));
  EXPECT_THAT(LauncherMessages(out), ::testing::Contains(HasSubstr("model: " + model)));
  EXPECT_THAT(out, HasSubstr("parasync-worker --eval-only --model-file " + model));
  EXPECT_LT(out.find("worker1 got SIGTERM"), out.find("[export] export sees"));
  ASSERT_THAT(out, HasSubstr("[ps0] ps0 got SIGTERM\n"));
  EXPECT_LT(out.find("[export] wrote"), out.find("ps0 got SIGTERM"));
  EXPECT_EQ(ReadFile(model), "model\n");
  EXPECT_EQ(ReadFile(fake_dir_ + "/export.env"), "1\n");
  EXPECT_THAT(ReadFile(log_dir_ + "/export.log"), HasSubstr("wrote " + model));
  const std::vector<std::string> ps0 = ReadLines(fake_dir_ + "/ps0.args");
  ASSERT_GE(ps0.size(), 2u);
  EXPECT_THAT(ReadLines(fake_dir_ + "/export.args"),
              ElementsAre("--ps-hosts", ps0[1], "--out", model));
}

TEST_F(LaunchTest, FailingExportFailsTheRunNamingItAndStillStopsTheServers) {
  InstallFakeExporter();
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--export", root_ + "/model.psm"});
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"}, {"FAKE_EXPORT", "fail"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitFailed) << launcher->out();
  ExpectAllFakesGone(4);
  const std::string out = launcher->out();
  EXPECT_THAT(out, HasSubstr("[export] export failing\n"));
  EXPECT_THAT(out, HasSubstr("run failed: parasync-export (pid "));
  EXPECT_THAT(out, HasSubstr("failed with exit status 4; log: " + log_dir_ + "/export.log"));
  EXPECT_THAT(out, HasSubstr("[ps0] ps0 got SIGTERM"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/model.psm"));
}

TEST_F(LaunchTest, NoExportAfterAFailedRun) {
  InstallFakeExporter();
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--export", root_ + "/model.psm"});
  auto launcher = Launch(args, {{"FAKE_ps1", "fail3"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitFailed) << launcher->out();
  ExpectAllFakesGone(4);
  EXPECT_FALSE(std::filesystem::exists(fake_dir_ + "/export.args")) << launcher->out();
  EXPECT_THAT(launcher->out(), HasSubstr("no model exported to " + root_ + "/model.psm"));
}

TEST_F(LaunchTest, ExportWithoutTheExporterBinaryExitsTwoNamingIt) {
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--export", root_ + "/model.psm"});
  auto launcher = Launch(args, {});
  EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitUsage);
  EXPECT_THAT(launcher->err(), HasSubstr(bin_dir_ + "/parasync-export"));
  EXPECT_TRUE(RecordedPids().empty());
}

TEST_F(LaunchTest, ExportToADirectoryExitsTwoBeforeStarting) {
  InstallFakeExporter();
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--export", root_});
  auto launcher = Launch(args, {});
  EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitUsage);
  EXPECT_THAT(launcher->err(), HasSubstr("--export must name a file"));
  EXPECT_TRUE(RecordedPids().empty());
}

TEST_F(LaunchTest, FailingPsStopsEveryoneAndExitsOne) {
  auto launcher = Launch(BaseArgs(), {{"FAKE_ps1", "fail3"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitFailed) << launcher->out();
  EXPECT_LT(launcher->seconds(), 4.0);
  ExpectAllFakesGone(4);
  const std::string out = launcher->out();
  EXPECT_THAT(out, HasSubstr("ps1 (pid "));
  EXPECT_THAT(out, HasSubstr("failed with exit status 3 before the chief finished; log: " +
                             log_dir_ + "/ps1.log"));
  EXPECT_THAT(out, HasSubstr("[worker0] worker0 got SIGTERM"));
  EXPECT_THAT(out, HasSubstr("[ps0] ps0 got SIGTERM"));
  EXPECT_THAT(ReadFile(log_dir_ + "/ps1.log"), HasSubstr("ps1 failing\n"));
}

TEST_F(LaunchTest, ProcessIgnoringSigtermIsKilledAfterGrace) {
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--grace-seconds", "1"});
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"}, {"FAKE_worker1", "ignore_term"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitFailed) << launcher->out();
  EXPECT_GE(launcher->seconds(), 1.0);
  EXPECT_LT(launcher->seconds(), 5.0);
  ExpectAllFakesGone(4);
  const std::string out = launcher->out();
  EXPECT_THAT(out, HasSubstr("worker1 (pid "));
  EXPECT_THAT(out, HasSubstr("was killed with SIGKILL"));
  // The PS processes are still stopped politely afterwards.
  EXPECT_THAT(out, HasSubstr("[ps0] ps0 got SIGTERM"));
}

TEST_F(LaunchTest, SigintStopsEverythingAndExits130) {
  auto launcher = Launch(BaseArgs(), {});
  ASSERT_TRUE(WaitForFakes(4, std::chrono::seconds(5)));
  ASSERT_EQ(kill(launcher->pid(), SIGINT), 0);
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitInterrupted) << launcher->out();
  ExpectAllFakesGone(4);
  EXPECT_THAT(launcher->out(), HasSubstr("got SIGINT"));
  EXPECT_THAT(launcher->out(), HasSubstr("[worker0] worker0 got SIGTERM"));
  const nlohmann::json summary = ReadSummary(log_dir_);
  ASSERT_TRUE(summary.is_object()) << ReadFile(log_dir_ + "/summary.json");
  EXPECT_EQ(summary["outcome"], "interrupted");
  EXPECT_EQ(summary["exit_code"], kExitInterrupted);
  EXPECT_EQ(summary["reason"], "got SIGINT");
  ASSERT_EQ(summary["processes"].size(), 4u);
  for (const nlohmann::json& process : summary["processes"]) {
    EXPECT_EQ(process["launcher_signal"], "SIGTERM") << process;
    EXPECT_EQ(process["exit_status"], 0) << process;
  }
}

TEST_F(LaunchTest, ChildrenDieWithAKilledLauncher) {
  // Orphans come to us, not init, so we can reap them and see them gone.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  auto launcher = Launch(BaseArgs(), {});
  ASSERT_TRUE(WaitForFakes(4, std::chrono::seconds(5)));
  const std::vector<pid_t> pids = RecordedPids();
  ASSERT_EQ(kill(launcher->pid(), SIGKILL), 0);
  EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), 128 + SIGKILL);

  std::set<pid_t> waiting(pids.begin(), pids.end());
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  while (!waiting.empty() && Clock::now() < deadline) {
    const pid_t reaped = waitpid(-1, nullptr, WNOHANG);
    if (reaped > 0) {
      waiting.erase(reaped);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  EXPECT_TRUE(waiting.empty()) << waiting.size() << " fakes outlived the launcher";
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

TEST(SnapshotServerTest, ServesEachBodyOnItsPortUntilTheWakeFdIsReadable) {
  auto server = SnapshotServer::Start({{"127.0.0.1", 0, "a_metric 1\n"},
                                       {"127.0.0.1", 0, "b_metric 2\n"}});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::vector<int> ports = (*server)->ports();
  ASSERT_EQ(ports.size(), 2u);
  int wake[2];
  ASSERT_EQ(pipe(wake), 0);
  int64_t answered = -1;
  std::thread serving([&] { answered = (*server)->ServeUntilReadable(wake[0]); });
  const std::string a = HttpGet(ports[0], "/metrics");
  const std::string b = HttpGet(ports[1], "/metrics?name[]=x");
  const std::string missing = HttpGet(ports[0], "/");
  ASSERT_EQ(write(wake[1], "x", 1), 1);
  serving.join();
  close(wake[0]);
  close(wake[1]);
  EXPECT_THAT(a, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(a, HasSubstr("Content-Length: 11\r\n"));
  EXPECT_THAT(a, HasSubstr("\r\n\r\na_metric 1\n"));
  EXPECT_THAT(b, HasSubstr("b_metric 2"));
  EXPECT_THAT(missing, HasSubstr("404 Not Found"));
  EXPECT_THAT(missing, Not(HasSubstr("a_metric")));
  EXPECT_EQ(answered, 3);
}

TEST(SnapshotServerTest, APortInUseIsAClearError) {
  auto first = SnapshotServer::Start({{"127.0.0.1", 0, "x 1\n"}});
  ASSERT_TRUE(first.ok());
  auto second = SnapshotServer::Start({{"127.0.0.1", (*first)->ports()[0], "x 1\n"}});
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("cannot serve the final metrics on 127.0.0.1:"));
  EXPECT_FALSE(SnapshotServer::Start({{"not-an-ip", 0, ""}}).ok());
}

TEST(MetricsBindTest, LoopbackStaysLoopbackAndNamesListenEverywhere) {
  EXPECT_EQ(MetricsBindFor("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(MetricsBindFor("localhost"), "127.0.0.1");
  EXPECT_EQ(MetricsBindFor("10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(MetricsBindFor("node7.cluster"), "0.0.0.0");
}

}  // namespace
}  // namespace parasync::launch
