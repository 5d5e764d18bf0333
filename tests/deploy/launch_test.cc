// Tests of deploy/launch: plan building in-process, and the real parasync-launch binary run
// as a subprocess against fake parasync-ps / parasync-worker shell scripts whose behaviour
// each test picks through FAKE_<name> environment variables.
// (The plan built in-process: launch_plan_test.cc; the final-metrics server:
// snapshot_server_test.cc.)
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/cluster_spec.h"
#include "deploy/launch/launcher.h"
#include "deploy/launch/snapshot_server.h"
#include "tests/deploy/launch_test_util.h"

namespace parasync::launch {
namespace {

using namespace launch_test;  // this file's helpers: tests/deploy/launch_test_util.h

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

TEST_F(LaunchTest, ChiefFinishingStopsOthersWithStopWorkersWithChiefAndExitsZero) {
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
  // The chief is not asked to wait for the others, and the run says whom it stopped.
  EXPECT_THAT(ReadLines(fake_dir_ + "/worker0.args"),
              Not(::testing::Contains("--wait-for-workers")));
  EXPECT_THAT(LauncherMessages(out),
              ::testing::Contains("stopped before the end of their last epoch: worker1 "
                                  "(--stop-workers-with-chief); the final evaluation misses the "
                                  "rest of their work"))
      << out;
  const nlohmann::json summary = ReadSummary(log_dir_);
  EXPECT_EQ(summary["workers_finished"], "stopped_with_chief");
  EXPECT_EQ(summary["workers_stopped"], nlohmann::json({"worker1"}));
}

// ---- the end of a run: the workers finish after the chief -------------------------------

TEST_F(LaunchTest, WorkersStillRunningAfterTheChiefFinishByThemselves) {
  // worker1 exits 1.5 s after the chief: within kWorkerExitSeconds, so never stopped.
  auto launcher = Launch(WaitingArgs(), {{"FAKE_worker0", "ok"},
                                         {"FAKE_worker1", "ok"},
                                         {"FAKE_OK_DELAY_worker1", "1.8"},
                                         {"FAKE_WRITE_EVAL", "1"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(10)), kExitOk) << launcher->out();
  ExpectAllFakesGone(4);
  const std::string out = launcher->out();
  const std::vector<std::string> messages = LauncherMessages(out);
  const std::string worker0_pid = ReadLines(fake_dir_ + "/worker0.pid")[0];
  const std::string worker1_pid = ReadLines(fake_dir_ + "/worker1.pid")[0];
  EXPECT_THAT(messages, ::testing::Contains("chief worker0 (pid " + worker0_pid +
                                            ") finished; waiting up to 5 s for worker1 to exit"))
      << out;
  EXPECT_THAT(messages, ::testing::Contains("worker1 (pid " + worker1_pid +
                                            ") finished with exit status 0"))
      << out;
  EXPECT_THAT(out, Not(HasSubstr("stopped before the end")));
  // The chief was told to wait for the others, by the default --finish-timeout; they were not.
  const std::vector<std::string> worker0_args = ReadLines(fake_dir_ + "/worker0.args");
  const auto wait = std::find(worker0_args.begin(), worker0_args.end(), "--wait-for-workers");
  ASSERT_NE(wait, worker0_args.end());
  ASSERT_NE(wait + 1, worker0_args.end());
  EXPECT_EQ(*(wait + 1), "300");
  EXPECT_THAT(ReadLines(fake_dir_ + "/worker1.args"),
              Not(::testing::Contains("--wait-for-workers")));

  const nlohmann::json summary = ReadSummary(log_dir_);
  EXPECT_EQ(summary["workers_finished"], "all");
  EXPECT_EQ(summary["workers_stopped"], nlohmann::json::array());
  EXPECT_TRUE(SummaryProcess(summary, "worker1")["launcher_signal"].is_null());
  EXPECT_EQ(SummaryProcess(summary, "worker1")["exit_status"], 0);
}

TEST_F(LaunchTest, AChiefThatFinishesLastEndsTheRunWithEveryWorkerFinished) {
  auto launcher = Launch(WaitingArgs(), {{"FAKE_worker0", "ok"},
                                         {"FAKE_worker1", "ok"},
                                         {"FAKE_OK_DELAY_worker0", "0.8"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitOk) << launcher->out();
  const std::string out = launcher->out();
  EXPECT_THAT(LauncherMessages(out),
              ::testing::Contains("chief worker0 (pid " + ReadLines(fake_dir_ + "/worker0.pid")[0] +
                                  ") finished; every worker has finished"))
      << out;
  const nlohmann::json summary = ReadSummary(log_dir_);
  EXPECT_EQ(summary["workers_finished"], "all");
  EXPECT_EQ(summary["workers_stopped"], nlohmann::json::array());
}

TEST_F(LaunchTest, AWorkerStillTrainingAfterTheFinishTimeoutIsStoppedAndTheRunSaysSo) {
  std::vector<std::string> args = WaitingArgs();
  args.insert(args.end(), {"--finish-timeout", "7.5"});
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"}, {"FAKE_WRITE_EVAL", "1"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(15)), kExitOk) << launcher->out();
  ExpectAllFakesGone(4);
  const std::string out = launcher->out();
  const std::vector<std::string> messages = LauncherMessages(out);
  EXPECT_THAT(messages, ::testing::Contains("worker1 still running 5 s after the chief exited "
                                            "(--finish-timeout 7.5 s): stopping it before the "
                                            "end of its last epoch"))
      << out;
  EXPECT_THAT(messages,
              ::testing::Contains("stopped before the end of their last epoch: worker1 (still "
                                  "training after --finish-timeout 7.5 s); the final evaluation "
                                  "misses the rest of their work"))
      << out;
  EXPECT_THAT(out, HasSubstr("[worker1] worker1 got SIGTERM\n"));
  EXPECT_THAT(ReadLines(fake_dir_ + "/worker0.args"),
              ::testing::IsSupersetOf({"--wait-for-workers", "7.5"}));
  const nlohmann::json summary = ReadSummary(log_dir_);
  EXPECT_EQ(summary["outcome"], "succeeded");
  EXPECT_EQ(summary["workers_finished"], "timed_out");
  EXPECT_EQ(summary["workers_stopped"], nlohmann::json({"worker1"}));
  EXPECT_EQ(SummaryProcess(summary, "worker1")["launcher_signal"], "SIGTERM");
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
  // The run ended before the chief finished: nothing to say about the workers' end.
  EXPECT_TRUE(summary["workers_finished"].is_null());
  EXPECT_EQ(summary["workers_stopped"], nlohmann::json::array());
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

// A server restarted by --kill comes back on the address it bound at its first start (the
// workers reconnect there), told so in its own --ps-hosts entry; its metrics port is its new
// ready file's, and cluster.json and the targets follow.
TEST_F(LaunchTest, KillRestartsAServerOnTheAddressItBoundFirst) {
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--kill", "ps:1@0.3+0.2"});
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"}, {"FAKE_OK_DELAY", "2"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(10)), kExitOk) << launcher->out();
  const auto first = nlohmann::json::parse(ReadFile(fake_dir_ + "/ps1.bound.1"), nullptr, false);
  const auto second = nlohmann::json::parse(ReadFile(fake_dir_ + "/ps1.bound.2"), nullptr, false);
  const auto ps0 = nlohmann::json::parse(ReadFile(fake_dir_ + "/ps0.bound.1"), nullptr, false);
  ASSERT_TRUE(first.is_object() && second.is_object() && ps0.is_object()) << launcher->out();
  EXPECT_NE(first["pid"], second["pid"]);
  const std::string address = first["address"].get<std::string>();
  EXPECT_NE(address, "127.0.0.1:0");
  EXPECT_EQ(second["address"], address);
  const std::vector<std::string> restart = ReadLines(fake_dir_ + "/ps1.args.2");
  ASSERT_GE(restart.size(), 2u);
  EXPECT_EQ(restart[1], ps0["address"].get<std::string>() + "," + address);
  EXPECT_THAT(restart, ::testing::IsSupersetOf(std::vector<std::string>{
                           "--metrics-port", "0", "--ready-file", log_dir_ + "/ps1.ready"}));
  const std::string metrics_url =
      "http://127.0.0.1:" + std::to_string(second["metrics_port"].get<int>()) + "/metrics";
  EXPECT_THAT(LauncherMessages(launcher->out()),
              ::testing::Contains("ps1 pid " + std::to_string(second["pid"].get<int>()) +
                                  " at " + address + ", metrics " + metrics_url));
  const auto cluster = nlohmann::json::parse(ReadFile(log_dir_ + "/cluster.json"));
  EXPECT_EQ(cluster["processes"][1]["pid"], second["pid"]);
  EXPECT_EQ(cluster["processes"][1]["address"], address);
  EXPECT_EQ(cluster["processes"][1]["metrics_url"], metrics_url);
  EXPECT_EQ(cluster["cluster"]["ps"][1], address);
  const auto targets = nlohmann::json::parse(ReadFile(log_dir_ + "/prometheus-targets.json"));
  EXPECT_EQ(targets[1]["targets"][0],
            "127.0.0.1:" + std::to_string(second["metrics_port"].get<int>()));
  ExpectAllFakesGone(4);
}

// A restarted server refused because its port is in use (exit status 2, "in use": another
// process took it meanwhile) is started again, a short while later, until it serves.
TEST_F(LaunchTest, ARestartThatFindsItsPortInUseIsTriedAgain) {
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--kill", "ps:1@0.3+0.2"});
  auto launcher = Launch(args, {{"FAKE_ps1", "busy_restart"},
                                {"FAKE_worker0", "ok"},
                                {"FAKE_OK_DELAY", "3"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(12)), kExitOk) << launcher->out();
  const auto first = nlohmann::json::parse(ReadFile(fake_dir_ + "/ps1.bound.1"), nullptr, false);
  ASSERT_TRUE(first.is_object()) << launcher->out();
  const std::string address = first["address"].get<std::string>();
  const std::string port = address.substr(address.find(':') + 1);
  const std::vector<std::string> messages = LauncherMessages(launcher->out());
  EXPECT_EQ(std::count(messages.begin(), messages.end(),
                       "fault injection: ps1 on " + address +
                           " refused to start (parasync-ps: shard 1's address in --ps-hosts, " +
                           address + ": port " + port +
                           " on 127.0.0.1 is in use); trying again in 0.5 s"),
            2)
      << launcher->out();
  // Starts 2 and 3 were refused; the fourth serves, on the same address.
  EXPECT_FALSE(std::filesystem::exists(fake_dir_ + "/ps1.bound.2"));
  EXPECT_FALSE(std::filesystem::exists(fake_dir_ + "/ps1.bound.3"));
  const auto last = nlohmann::json::parse(ReadFile(fake_dir_ + "/ps1.bound.4"), nullptr, false);
  ASSERT_TRUE(last.is_object()) << launcher->out();
  EXPECT_EQ(last["address"], address);
  EXPECT_THAT(messages, ::testing::Contains("fault injection: restarted ps1 as pid " +
                                            std::to_string(last["pid"].get<int>()) +
                                            " (try 3)"));
  const nlohmann::json ps1 = SummaryProcess(ReadSummary(log_dir_), "ps1");
  EXPECT_EQ(ps1["restarts"], 1);
  EXPECT_EQ(ps1["pid"], last["pid"]);
  EXPECT_EQ(ps1["exit_status"], 0);
}

TEST_F(LaunchTest, ARestartWhosePortStaysInUseFailsTheRunSayingSo) {
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--kill", "ps:1@0.3+0.2"});
  auto launcher = Launch(args, {{"FAKE_ps1", "busy_restart"}, {"FAKE_BUSY_TRIES", "1000"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(30)), kExitFailed) << launcher->out();
  const auto first = nlohmann::json::parse(ReadFile(fake_dir_ + "/ps1.bound.1"), nullptr, false);
  ASSERT_TRUE(first.is_object()) << launcher->out();
  const std::string failure = "fault injection: could not restart ps1 on " +
                              first["address"].get<std::string>() +
                              ": its port was still in use after 10 tries; log: " + log_dir_ +
                              "/ps1.log";
  EXPECT_THAT(LauncherMessages(launcher->out()), ::testing::Contains("run failed: " + failure))
      << launcher->out();
  EXPECT_EQ(ReadSummary(log_dir_)["reason"], failure);
  // The first start, then kRestartTries.
  EXPECT_TRUE(std::filesystem::exists(fake_dir_ + "/ps1.args.11"));
  EXPECT_FALSE(std::filesystem::exists(fake_dir_ + "/ps1.args.12"));
  EXPECT_THAT(launcher->out(), HasSubstr("[worker0] worker0 got SIGTERM"));
}

// A server that exits before it serves fails the run as one failing later does (its exit
// status 2 the launcher's), and no worker is started without its servers.
TEST_F(LaunchTest, AServerThatExitsBeforeItServesFailsTheRunAndNoWorkerStarts) {
  auto launcher = Launch(BaseArgs(), {{"FAKE_ps1", "refuse"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitUsage) << launcher->out();
  const std::string out = launcher->out();
  EXPECT_THAT(out, HasSubstr("[ps1] ps1 refuses to start\n"));
  const nlohmann::json summary = ReadSummary(log_dir_);
  ASSERT_TRUE(summary.is_object()) << out;
  const nlohmann::json ps0 = SummaryProcess(summary, "ps0");
  EXPECT_EQ(ps0["launcher_signal"], "SIGTERM");  // stopped, as every process of a failed run
  EXPECT_TRUE(ProcessGone(ps0["pid"].get<pid_t>()));
  const nlohmann::json ps1 = SummaryProcess(summary, "ps1");
  const std::string failure = "ps1 (pid " + std::to_string(ps1["pid"].get<int>()) +
                              ") failed with exit status 2 before the chief finished; log: " +
                              log_dir_ + "/ps1.log";
  EXPECT_THAT(LauncherMessages(out), ::testing::Contains(failure)) << out;
  EXPECT_EQ(summary["reason"], failure);
  EXPECT_EQ(summary["exit_code"], kExitUsage);
  for (const char* name : {"worker0", "worker1"}) {
    EXPECT_TRUE(SummaryProcess(summary, name)["pid"].is_null()) << name;
    EXPECT_FALSE(std::filesystem::exists(fake_dir_ + "/" + name + ".args")) << name;
  }
  EXPECT_THAT(LauncherMessages(out),
              ::testing::Contains(HasSubstr("worker0 not started, worker1 not started")));
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
        std::vector<std::string>{"--rank-arg", "7:--slowdown=2"},
        std::vector<std::string>{"--finish-timeout", "-1"},
        std::vector<std::string>{"--finish-timeout", "soon"}}) {
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

  // The servers are told port 0, for their service and their metrics, and where to say
  // which ports they bound.
  const std::vector<std::string> ps1 = ReadLines(fake_dir_ + "/ps1.args");
  const std::vector<std::string> worker1 = ReadLines(fake_dir_ + "/worker1.args");
  ASSERT_EQ(ps1.size(), 18u);
  ASSERT_GE(worker1.size(), 2u);
  const std::string worker_hosts = ps1[3];
  EXPECT_EQ(worker_hosts, "127.0.0.1:1,127.0.0.1:2") << "worker addresses only name them";
  EXPECT_THAT(ps1, ElementsAre("--ps-hosts", "127.0.0.1:0,127.0.0.1:0", "--worker-hosts",
                               worker_hosts, "--task-index", "1", "--mode", "ssp:3",
                               "--metrics-port", "0", "--metrics-bind", "127.0.0.1",
                               "--log-dir", log_dir_, "--ready-file", log_dir_ + "/ps1.ready",
                               "--ps-flag", "--ps-extra=1"));
  // The workers, started once the servers served, get the addresses they bound.
  const nlohmann::json cluster =
      nlohmann::json::parse(ReadFile(log_dir_ + "/cluster.json"), nullptr, false);
  ASSERT_TRUE(cluster.is_object());
  ASSERT_EQ(cluster["cluster"]["ps"].size(), 2u);
  const std::string ps_hosts = cluster["cluster"]["ps"][0].get<std::string>() + "," +
                               cluster["cluster"]["ps"][1].get<std::string>();
  EXPECT_THAT(worker1,
              ElementsAre("--ps-hosts", ps_hosts, "--worker-hosts", worker_hosts, "--task-index",
                          "1", "--mode", "ssp:3", "--metrics-port", "0", "--metrics-bind",
                          "127.0.0.1", "--log-dir", log_dir_, "--ready-file",
                          log_dir_ + "/worker1.ready", "--local-rank", "1", "--epochs", "7",
                          "--dataset", data_dir_, "--batch-size", "32", "--lr", "0.05",
                          "--seed", "0", "--log-every", "2.5", "--device=cpu"));
  ASSERT_EQ(cluster["processes"].size(), 4u);
  for (const nlohmann::json& process : cluster["processes"]) {
    const std::string name = process["name"].get<std::string>();
    EXPECT_EQ(ReadLines(fake_dir_ + "/" + name + ".args")[5],
              std::to_string(process["index"].get<int>()));
    EXPECT_EQ(ReadFile(fake_dir_ + "/" + name + ".pid"),
              std::to_string(process["pid"].get<int>()) + "\n");
  }
}

// What cluster.json, prometheus-targets.json and the launcher's lines say each process
// listens on is what that process said it bound, in its ready file.
TEST_F(LaunchTest, ClusterJsonAndTargetsHoldThePortsEachProcessBound) {
  auto launcher = Launch(BaseArgs(), {{"FAKE_worker0", "ok"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(8)), kExitOk) << launcher->out();
  const nlohmann::json cluster =
      nlohmann::json::parse(ReadFile(log_dir_ + "/cluster.json"), nullptr, false);
  const nlohmann::json targets =
      nlohmann::json::parse(ReadFile(log_dir_ + "/prometheus-targets.json"), nullptr, false);
  ASSERT_TRUE(cluster.is_object()) << ReadFile(log_dir_ + "/cluster.json");
  ASSERT_TRUE(targets.is_array()) << ReadFile(log_dir_ + "/prometheus-targets.json");
  ASSERT_EQ(cluster["processes"].size(), 4u);
  ASSERT_EQ(targets.size(), 4u);
  const std::vector<std::string> messages = LauncherMessages(launcher->out());
  const std::string job = std::filesystem::path(log_dir_).filename().string();
  for (size_t i = 0; i < 4; ++i) {
    const nlohmann::json& process = cluster["processes"][i];
    const std::string name = process["name"].get<std::string>();
    SCOPED_TRACE(name);
    const nlohmann::json bound =
        nlohmann::json::parse(ReadFile(fake_dir_ + "/" + name + ".bound.1"), nullptr, false);
    ASSERT_TRUE(bound.is_object()) << "no ready file written by " << name;
    EXPECT_EQ(nlohmann::json::parse(ReadFile(log_dir_ + "/" + name + ".ready")), bound);
    EXPECT_EQ(bound["pid"], process["pid"]);
    const int metrics_port = bound["metrics_port"].get<int>();
    EXPECT_EQ(process["metrics_port"], metrics_port);
    const std::string metrics_url =
        "http://127.0.0.1:" + std::to_string(metrics_port) + "/metrics";
    EXPECT_EQ(process["metrics_url"], metrics_url);
    // prometheus-targets.json: one file_sd group per process, at its metrics port, labelled
    // with the run's job (the log directory's name) and the process's role and shard/rank.
    EXPECT_EQ(targets[i]["targets"],
              nlohmann::json({"127.0.0.1:" + std::to_string(metrics_port)}));
    const bool is_ps = process["role"] == "ps";
    const nlohmann::json expected_labels = {
        {"job", job},
        {"role", process["role"]},
        {is_ps ? "shard" : "rank", std::to_string(process["index"].get<int>())}};
    EXPECT_EQ(targets[i]["labels"], expected_labels);
    EXPECT_EQ(process["address"], bound["address"]);
    const std::string pid = std::to_string(process["pid"].get<int>());
    if (is_ps) {
      const std::string address = bound["address"].get<std::string>();
      EXPECT_THAT(address, ::testing::StartsWith("127.0.0.1:"));
      EXPECT_NE(address, "127.0.0.1:0");
      EXPECT_EQ(cluster["cluster"]["ps"][process["index"].get<size_t>()], address);
      EXPECT_THAT(messages, ::testing::Contains(name + " pid " + pid + " at " + address +
                                                ", metrics " + metrics_url));
    } else {
      EXPECT_EQ(process["address"], "");
      EXPECT_THAT(messages,
                  ::testing::Contains(name + " pid " + pid + ", metrics " + metrics_url));
    }
    // The end of the run names the same endpoints.
    EXPECT_THAT(launcher->out(), HasSubstr(" " + name + " " + metrics_url));
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
  // The fakes' ports are served after them: free ones.
  auto launcher = Launch(args, {{"FAKE_worker0", "ok"},
                                {"FAKE_NO_PROM_worker1", "1"},
                                {"FAKE_FREE_PORTS", "1"}});
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
  // The servers' addresses as they bound them, as the workers were given them.
  const std::vector<std::string> worker0 = ReadLines(fake_dir_ + "/worker0.args");
  ASSERT_GE(worker0.size(), 2u);
  EXPECT_THAT(worker0[1], Not(HasSubstr(":0"))) << worker0[1];
  EXPECT_THAT(ReadLines(fake_dir_ + "/export.args"),
              ElementsAre("--ps-hosts", worker0[1], "--out", model));
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

// ---- --worker-command: the user's own program as every worker ---------------------------

TEST_F(LaunchTest, WorkerCommandRunsAsEveryWorkerWithTheClusterInItsEnvironment) {
  const std::string command = InstallFakeWorkerCommand();
  std::filesystem::create_directories(root_ + "/python/parasync");  // beside bin/: the package
  std::vector<std::string> args = WaitingArgs();
  args.insert(args.end(), {"--mode", "ssp:2", "--epochs", "3", "--lr", "0.05",
                           "--worker-command", command + " --from-command", "--worker-arg",
                           "a b", "--rank-arg", "1:it's"});
  auto launcher = Launch(args, {{"PYTHONPATH", "/inherited"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(10)), kExitOk)
      << launcher->out() << launcher->err();
  ExpectAllFakesGone(4);
  EXPECT_THAT(launcher->out(), HasSubstr("[worker1] command worker 1 start 1\n"));

  const nlohmann::json cluster =
      nlohmann::json::parse(ReadFile(log_dir_ + "/cluster.json"), nullptr, false);
  ASSERT_TRUE(cluster.is_object());
  for (int rank : {0, 1}) {
    SCOPED_TRACE("worker" + std::to_string(rank));
    std::map<std::string, std::string> env = CommandEnv(rank, 1);
    ASSERT_FALSE(env.empty());
    const Result<ClusterSpec> spec = ParseTfConfig(env["TF_CONFIG"]);
    ASSERT_TRUE(spec.ok()) << env["TF_CONFIG"];
    EXPECT_EQ(nlohmann::json(spec->ps), cluster["cluster"]["ps"]);
    EXPECT_EQ(nlohmann::json(spec->workers), cluster["cluster"]["worker"]);
    EXPECT_EQ(spec->task_type, "worker");
    EXPECT_EQ(spec->task_index, rank);
    const nlohmann::json& process = cluster["processes"][static_cast<size_t>(2 + rank)];
    // Any free port, told back in its ready file (the fake's: 20000 + 100 + rank).
    EXPECT_EQ(env["PARASYNC_METRICS_PORT"], "0");
    EXPECT_EQ(env["PARASYNC_READY_FILE"], log_dir_ + "/worker" + std::to_string(rank) + ".ready");
    EXPECT_EQ(process["metrics_port"], 20100 + rank);
    EXPECT_EQ(env["PARASYNC_METRICS_BIND"], "127.0.0.1");
    EXPECT_EQ(env["PARASYNC_LOG_DIR"], log_dir_);
    EXPECT_EQ(env["PARASYNC_MODE"], "ssp:2");
    EXPECT_EQ(env["PARASYNC_EPOCHS"], "3");
    EXPECT_EQ(env["PARASYNC_LR"], "0.05");
    EXPECT_EQ(env.count("PARASYNC_BATCH_SIZE"), 0u) << "not given, not set";
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env["PARASYNC_LOG_PREFIXED"], "1");
    EXPECT_EQ(env["PARASYNC_DATA"], data_dir_);
    EXPECT_EQ(env["PARASYNC_BIN_DIR"], bin_dir_);
    EXPECT_EQ(env["PYTHONPATH"], root_ + "/python:/inherited");
    EXPECT_EQ(env["FAKE_DIR"], fake_dir_) << "the launcher's environment is passed on";
    // Only the chief waits for the others' last epochs (--finish-timeout's default).
    if (rank == 0) {
      EXPECT_EQ(env["PARASYNC_WAIT_FOR_WORKERS"], "300");
    } else {
      EXPECT_EQ(env.count("PARASYNC_WAIT_FOR_WORKERS"), 0u);
    }
    // The pid the launcher started, and would signal and reap, is the program's own.
    EXPECT_EQ(ReadFile(fake_dir_ + "/cmd" + std::to_string(rank) + "-1.pid"),
              std::to_string(process["pid"].get<int>()) + "\n");
    EXPECT_EQ(process["env"]["TF_CONFIG"], env["TF_CONFIG"]) << "cluster.json records it";
    std::vector<std::string> expected_args = {"--from-command", "a b"};
    if (rank == 1) expected_args.push_back("it's");
    EXPECT_EQ(ReadLines(fake_dir_ + "/cmd" + std::to_string(rank) + ".args.1"), expected_args);
  }
  EXPECT_FALSE(std::filesystem::exists(fake_dir_ + "/cmd0.env.2")) << "started twice";

  // The summary reads what the programs wrote, as it reads a parasync-worker's.
  const nlohmann::json summary = ReadSummary(log_dir_);
  ASSERT_TRUE(summary.is_object()) << ReadFile(log_dir_ + "/summary.json");
  EXPECT_EQ(summary["outcome"], "succeeded");
  EXPECT_EQ(summary["examples"], 200);
  EXPECT_EQ(summary["examples_source"], "worker_snapshots");
  EXPECT_EQ(summary["eval_rows"], 1);
  EXPECT_EQ(summary["final"]["test_accuracy"], 0.625);
  EXPECT_EQ(summary["workers_finished"], "all");
  EXPECT_THAT(launcher->out(), HasSubstr("final test accuracy 0.625"));
}

TEST_F(LaunchTest, AWorkerCommandExitingTwoMakesTheLauncherExitTwo) {
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--worker-command", InstallFakeWorkerCommand()});
  // The chief waits (for a release that never comes) while worker1 exits 2.
  auto launcher = Launch(args, {{"FAKE_CMD_WAIT_0", "1"}, {"FAKE_CMD_EXIT_1", "2"}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(10)), kExitUsage) << launcher->out();
  ExpectAllFakesGone(4);
  EXPECT_THAT(launcher->out(),
              HasSubstr("worker1 (pid " + ReadLines(fake_dir_ + "/cmd1-1.pid")[0] +
                        ") failed with exit status 2 before the chief finished"));
  const nlohmann::json summary = ReadSummary(log_dir_);
  EXPECT_EQ(summary["outcome"], "failed");
  EXPECT_EQ(summary["exit_code"], kExitUsage);
}

TEST_F(LaunchTest, KillRestartsAWorkerCommandWithTheSameEnvironmentAndArgumentsAndSaysSo) {
  std::vector<std::string> args = WaitingArgs();
  args.insert(args.end(), {"--worker-command", InstallFakeWorkerCommand(), "--worker-arg",
                           "x y", "--kill", "worker:1@1+0.2"});
  // Every start waits until the test releases it, so the kill lands while worker1 runs.
  auto launcher = Launch(args, {{"FAKE_CMD_WAIT", "1"}});
  const bool restarted = WaitFor(
      [&] { return std::filesystem::exists(fake_dir_ + "/cmd1.env.2"); }, std::chrono::seconds(10));
  std::ofstream(fake_dir_ + "/release") << "";
  ASSERT_TRUE(restarted) << launcher->out();
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(10)), kExitOk) << launcher->out();
  ExpectAllFakesGone(5);

  const std::map<std::string, std::string> first = CommandEnv(1, 1);
  EXPECT_FALSE(first.empty());
  EXPECT_FALSE(first.contains("PARASYNC_RESTART"));
  // The same variables, and one more: this start is the first restart (parasync.horovod's
  // elastic rejoin reads it).
  std::map<std::string, std::string> second = CommandEnv(1, 2);
  EXPECT_EQ(second["PARASYNC_RESTART"], "1");
  second.erase("PARASYNC_RESTART");
  EXPECT_EQ(second, first);
  EXPECT_EQ(ReadLines(fake_dir_ + "/cmd1.args.2"), ReadLines(fake_dir_ + "/cmd1.args.1"));
  EXPECT_THAT(ReadLines(fake_dir_ + "/cmd1.args.2"), ElementsAre("x y"));
  EXPECT_FALSE(std::filesystem::exists(fake_dir_ + "/cmd0.env.2")) << "the chief was restarted";
  // SIGKILL went to the program itself, and its second start is the one reaped at the end.
  const std::string out = launcher->out();
  EXPECT_THAT(out, HasSubstr("fault injection: killed worker1 (pid " +
                             ReadLines(fake_dir_ + "/cmd1-1.pid")[0] + ") with SIGKILL"));
  EXPECT_THAT(out, HasSubstr("fault injection: restarted worker1 as pid " +
                             ReadLines(fake_dir_ + "/cmd1-2.pid")[0]));
  const nlohmann::json worker1 = SummaryProcess(ReadSummary(log_dir_), "worker1");
  EXPECT_EQ(worker1["restarts"], 1);
  EXPECT_EQ(worker1["exit_status"], 0);
}

// A program that does not tell its metrics port runs all the same, unscraped: cluster.json
// says the port is not known, and the targets leave it out.
TEST_F(LaunchTest, AWorkerCommandThatWritesNoReadyFileRunsWithItsMetricsPortUnknown) {
  std::vector<std::string> args = WaitingArgs();
  args.insert(args.end(), {"--worker-command", InstallFakeWorkerCommand(), "--metrics"});
  auto launcher = Launch(args, {{"FAKE_CMD_NO_READY", "1"}, {"FAKE_FREE_PORTS", "1"}});
  ASSERT_TRUE(WaitFor(
      [&] { return launcher->out().find("serving the final metrics") != std::string::npos; },
      std::chrono::seconds(10)))
      << launcher->out();
  ASSERT_EQ(kill(launcher->pid(), SIGINT), 0);
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitOk) << launcher->out();
  const nlohmann::json cluster = nlohmann::json::parse(ReadFile(log_dir_ + "/cluster.json"));
  for (size_t i : {2u, 3u}) {
    EXPECT_TRUE(cluster["processes"][i]["metrics_port"].is_null()) << cluster["processes"][i];
    EXPECT_TRUE(cluster["processes"][i]["metrics_url"].is_null()) << cluster["processes"][i];
  }
  const nlohmann::json targets =
      nlohmann::json::parse(ReadFile(log_dir_ + "/prometheus-targets.json"));
  ASSERT_EQ(targets.size(), 2u) << targets;
  EXPECT_EQ(targets[0]["labels"]["role"], "ps");
  EXPECT_EQ(targets[1]["labels"]["role"], "ps");
  EXPECT_THAT(launcher->out(), HasSubstr("worker1 never told its metrics port (no ready file)"));
  EXPECT_THAT(launcher->out(), Not(HasSubstr(" worker0 http://")));
}

TEST_F(LaunchTest, ABlankWorkerCommandExitsTwoWithOneLine) {
  for (const char* blank : {"", "  "}) {
    std::vector<std::string> args = BaseArgs();
    args.insert(args.end(), {"--worker-command", blank});
    auto launcher = Launch(args, {});
    EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitUsage) << "'" << blank << "'";
    EXPECT_THAT(ReadLines(root_ + "/stderr"),
                ElementsAre("parasync-launch: --worker-command must name the program every "
                            "worker runs, e.g. \"python3 train.py\"; got an empty command"))
        << "'" << blank << "'";
    EXPECT_TRUE(RecordedPids().empty());
  }
}

TEST_F(LaunchTest, AWorkerCommandsDataSetNeedOnlyBeADirectory) {
  // The program reads its data its own way: an empty directory is enough.
  const std::string own_data = root_ + "/own-data";
  std::filesystem::create_directories(own_data);
  std::vector<std::string> args = WaitingArgs();
  args.insert(args.end(), {"--worker-command", InstallFakeWorkerCommand(), "--dataset", own_data});
  auto launcher = Launch(args, {});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(10)), kExitOk) << launcher->out();
  EXPECT_EQ(CommandEnv(1, 1)["PARASYNC_DATA"], own_data);

  args.back() = root_ + "/missing";
  std::filesystem::remove_all(log_dir_);
  std::filesystem::remove_all(fake_dir_);
  std::filesystem::create_directories(fake_dir_);
  launcher = Launch(args, {});
  EXPECT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitUsage);
  EXPECT_THAT(ReadLines(root_ + "/stderr"),
              ElementsAre("parasync-launch: --dataset " + root_ + "/missing is not a directory"));
  EXPECT_TRUE(RecordedPids().empty());
}

TEST_F(LaunchTest, DryRunPrintsAWorkerCommandWithItsEnvironment) {
  std::vector<std::string> args = BaseArgs();
  const std::string command = InstallFakeWorkerCommand();
  args.insert(args.end(), {"--worker-command", command, "--dry-run"});
  auto launcher = Launch(args, {});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(5)), kExitOk) << launcher->err();
  const std::vector<std::string> lines = ReadLines(root_ + "/stdout");
  ASSERT_EQ(lines.size(), 5u) << launcher->out();
  EXPECT_THAT(lines[3], ::testing::StartsWith("worker1 on 127.0.0.1: TF_CONFIG='{\"cluster\":"));
  EXPECT_THAT(lines[3], HasSubstr(" LOCAL_RANK=1 "));
  EXPECT_THAT(lines[3], HasSubstr(" PARASYNC_METRICS_PORT=0 "));
  EXPECT_THAT(lines[3], HasSubstr(" PARASYNC_READY_FILE=" + log_dir_ + "/worker1.ready "));
  // The servers' ports are theirs to pick: the dry run says so.
  EXPECT_THAT(lines[0], HasSubstr(" --ps-hosts 127.0.0.1:0,127.0.0.1:0 "));
  EXPECT_THAT(lines[0], HasSubstr(" --metrics-port 0 "));
  EXPECT_THAT(lines[0], HasSubstr(" --ready-file " + log_dir_ + "/ps0.ready"));
  EXPECT_THAT(lines[4], ::testing::StartsWith("# each server binds a free port (:0)"));
  EXPECT_THAT(lines[3], ::testing::EndsWith(" " + ShellJoin({"/bin/sh", "-c", "exec " + command})));
  EXPECT_THAT(lines[0], HasSubstr("ps0 on 127.0.0.1: " + bin_dir_ + "/parasync-ps "));
  EXPECT_TRUE(RecordedPids().empty());
  EXPECT_FALSE(std::filesystem::exists(log_dir_)) << "a dry run starts nothing";
}

TEST_F(LaunchTest, AWorkerCommandOnAnotherHostGetsItsEnvironmentThroughSsh) {
  // The fake ssh runs the command here, without the variables the launcher sets: what the
  // program sees came through the remote command line.
  const std::string path_dir = root_ + "/path";
  std::filesystem::create_directories(path_dir);
  std::ofstream(path_dir + "/fake-ssh")
      << "#!/bin/sh\nshift\nexec env -u PARASYNC_LOG_PREFIXED -u TF_CONFIG -u LOCAL_RANK "
         "/bin/sh -c \"$1\"\n";
  ASSERT_EQ(chmod((path_dir + "/fake-ssh").c_str(), 0755), 0);
  std::vector<std::string> args = WaitingArgs();
  args.insert(args.end(), {"--ps", "127.0.0.2:1", "-H", "127.0.0.3:2", "--ssh-command",
                           "fake-ssh", "--worker-command", InstallFakeWorkerCommand()});
  auto launcher = Launch(args, {{"PATH", path_dir + ":" + std::getenv("PATH")}});
  ASSERT_EQ(launcher->Wait(std::chrono::seconds(10)), kExitOk) << launcher->out();
  ExpectAllFakesGone(3);
  std::map<std::string, std::string> env = CommandEnv(1, 1);
  EXPECT_EQ(env["LOCAL_RANK"], "1");  // the second worker on 127.0.0.3
  EXPECT_EQ(env["PARASYNC_LOG_PREFIXED"], "1");
  EXPECT_EQ(env["PARASYNC_METRICS_BIND"], "127.0.0.3");
  const Result<ClusterSpec> spec = ParseTfConfig(env["TF_CONFIG"]);
  ASSERT_TRUE(spec.ok()) << env["TF_CONFIG"];
  EXPECT_THAT(spec->ps, ElementsAre("127.0.0.2:29500"));
  EXPECT_THAT(spec->workers, ElementsAre("127.0.0.3:29500", "127.0.0.3:29501"));
  EXPECT_EQ(spec->task_index, 1);
  EXPECT_THAT(launcher->out(), HasSubstr("[127.0.0.3 worker1] command worker 1 start 1\n"));
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

}  // namespace
}  // namespace parasync::launch
