// deploy/launch in-process: options, the plan of processes, faults to inject, curve keys.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
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
#include "common/subprocess.h"
#include "deploy/launch/launcher.h"
#include "deploy/launch/snapshot_server.h"
#include "tests/deploy/launch_test_util.h"

namespace parasync::launch {
namespace {

using namespace launch_test;  // this file's helpers: tests/deploy/launch_test_util.h

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
                          "127.0.0.1", "--log-dir", "/logs", "--ready-file", "/logs/ps1.ready",
                          "--data-dir=/ckpt"));
  EXPECT_THAT(plan->processes[2].argv,
              ElementsAre("/opt/bin/parasync-worker", "--ps-hosts",
                          "127.0.0.1:5000,127.0.0.1:5001", "--worker-hosts",
                          "127.0.0.1:6000,127.0.0.1:6001", "--task-index", "0", "--mode", "sync",
                          "--metrics-port", "7002", "--metrics-bind", "127.0.0.1", "--log-dir",
                          "/logs", "--ready-file", "/logs/worker0.ready", "--local-rank", "0",
                          "--epochs", "3",
                          "--dataset", "/data", "--lr", "0.1", "--wait-for-workers", "300",
                          "--device=cpu"));
}

TEST(LaunchPlanTest, TheChiefAloneWaitsForTheOtherWorkersUnlessTheyStopWithIt) {
  LaunchOptions options;
  options.num_ps = 1;
  options.num_workers = 3;
  options.finish_timeout = 42.5;
  const std::vector<int> ports = {5000, 6000, 6001, 6002, 7000, 7001, 7002, 7003};
  const Result<LaunchPlan> plan = BuildPlan(options, "/b", "/l", ports);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_THAT(plan->processes[1].argv, ::testing::IsSupersetOf({"--wait-for-workers", "42.5"}));
  for (size_t i : {0, 2, 3}) {
    EXPECT_THAT(plan->processes[i].argv, Not(::testing::Contains("--wait-for-workers"))) << i;
  }
  options.stop_workers_with_chief = true;
  const Result<LaunchPlan> stopping = BuildPlan(options, "/b", "/l", ports);
  ASSERT_TRUE(stopping.ok());
  EXPECT_THAT(stopping->processes[1].argv, Not(::testing::Contains("--wait-for-workers")));
  options.stop_workers_with_chief = false;
  options.finish_timeout = -1;
  EXPECT_THAT(ValidateOptions(options).message(), HasSubstr("--finish-timeout"));
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

TEST(LaunchPlanTest, AProcessEnvironmentIsSetOnceHereAndInItsRemoteCommand) {
  // kLogPrefixedEnv=1 for every process, once, unless its own variables set it.
  EXPECT_THAT(ChildEnvironment({}), ElementsAre("PARASYNC_LOG_PREFIXED=1"));
  EXPECT_THAT(ChildEnvironment({"A=1"}), ElementsAre("PARASYNC_LOG_PREFIXED=1", "A=1"));
  EXPECT_THAT(ChildEnvironment({"A=1", "PARASYNC_LOG_PREFIXED=1"}),
              ElementsAre("A=1", "PARASYNC_LOG_PREFIXED=1"));
  // Over ssh, as shell assignments before the command, values quoted where needed.
  EXPECT_THAT(RemoteCommand({"/bin/prog", "x"}, 10.0, {"A=a b", "J={\"k\": [1]}", "E="}),
              HasSubstr("; PARASYNC_LOG_PREFIXED=1 A='a b' J='{\"k\": [1]}' E='' /bin/prog x "
                        "</dev/null"));
  // --dry-run's form of a local process: the same assignments, then its command.
  ProcessSpec spec;
  spec.spawn_argv = {"/bin/prog", "a b"};
  spec.env = {"A=it's"};
  EXPECT_EQ(DisplayCommand(spec), "A='it'\\''s' /bin/prog 'a b'");
  spec.env.clear();
  EXPECT_EQ(DisplayCommand(spec), "/bin/prog 'a b'");
}

// ---- --worker-command: the user's program as every worker -------------------------------

// "NAME=value" entries as a map (each name once: a name set twice is a test failure).
std::map<std::string, std::string> EnvMap(const std::vector<std::string>& env) {
  std::map<std::string, std::string> map;
  for (const std::string& entry : env) {
    const size_t equals = entry.find('=');
    EXPECT_NE(equals, std::string::npos) << entry;
    EXPECT_TRUE(map.emplace(entry.substr(0, equals), entry.substr(equals + 1)).second)
        << "set twice: " << entry;
  }
  return map;
}

TEST(LaunchPlanTest, WorkerCommandRunsTheProgramWithTheClusterInItsEnvironment) {
  LaunchOptions options;
  options.mode = "sync";
  options.epochs = 3;
  options.worker_command = "python3 train.py --flag";
  const Result<LaunchPlan> plan =
      BuildPlan(options, "/opt/bin", "/logs", {5000, 5001, 6000, 6001, 7000, 7001, 7002, 7003});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // The servers are ours, as without it.
  EXPECT_EQ(plan->processes[0].argv[0], "/opt/bin/parasync-ps");
  EXPECT_TRUE(plan->processes[0].env.empty());
  EXPECT_FALSE(plan->processes[0].user_command);

  const ProcessSpec& chief = plan->processes[2];
  EXPECT_TRUE(chief.user_command);
  // sh execs the program: the pid the launcher signals becomes the program's.
  EXPECT_THAT(chief.argv, ElementsAre("/bin/sh", "-c", "exec python3 train.py --flag"));
  EXPECT_EQ(chief.spawn_argv, chief.argv);
  // Only what every worker is told: no training setting was given.
  EXPECT_THAT(chief.env,
              ElementsAre("TF_CONFIG={\"cluster\":{\"ps\":[\"127.0.0.1:5000\",\"127.0.0.1:5001\"],"
                          "\"worker\":[\"127.0.0.1:6000\",\"127.0.0.1:6001\"]},"
                          "\"task\":{\"type\":\"worker\",\"index\":0}}",
                          "RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "HOROVOD_RANK=0",
                          "HOROVOD_SIZE=2", "HOROVOD_LOCAL_RANK=0", "HOROVOD_LOCAL_SIZE=2",
                          "HOROVOD_CROSS_RANK=0", "HOROVOD_CROSS_SIZE=1",
                          "PARASYNC_MODE=sync", "PARASYNC_LOG_DIR=/logs",
                          "PARASYNC_METRICS_PORT=7002", "PARASYNC_METRICS_BIND=127.0.0.1",
                          "LOCAL_RANK=0", "PARASYNC_LOG_PREFIXED=1", "PARASYNC_EPOCHS=3",
                          "PARASYNC_BIN_DIR=/opt/bin", "OMP_NUM_THREADS=1",
                          "PARASYNC_READY_FILE=/logs/worker0.ready",
                          "PARASYNC_WAIT_FOR_WORKERS=300"));

  // Worker 1: its own index, port and local rank; only the chief waits for the others.
  const std::map<std::string, std::string> worker1 = EnvMap(plan->processes[3].env);
  EXPECT_EQ(worker1.at("PARASYNC_METRICS_PORT"), "7003");
  EXPECT_EQ(worker1.at("LOCAL_RANK"), "1");
  EXPECT_EQ(worker1.count("PARASYNC_WAIT_FOR_WORKERS"), 0u);
  // TF_CONFIG is what a process of ours would read as its cluster.
  const Result<ClusterSpec> cluster = ParseTfConfig(worker1.at("TF_CONFIG"));
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  EXPECT_THAT(cluster->ps, ElementsAre("127.0.0.1:5000", "127.0.0.1:5001"));
  EXPECT_THAT(cluster->workers, ElementsAre("127.0.0.1:6000", "127.0.0.1:6001"));
  EXPECT_EQ(cluster->task_type, "worker");
  EXPECT_EQ(cluster->task_index, 1);

  // --dry-run's form: the environment as shell assignments, then the command.
  EXPECT_THAT(DisplayCommand(chief),
              ::testing::StartsWith("TF_CONFIG='{\"cluster\":{\"ps\":[\"127.0.0.1:5000\","));
  EXPECT_THAT(DisplayCommand(chief),
              HasSubstr(" PARASYNC_MODE=sync PARASYNC_LOG_DIR=/logs PARASYNC_METRICS_PORT=7002 "));
  EXPECT_THAT(DisplayCommand(chief),
              ::testing::EndsWith(" /bin/sh -c 'exec python3 train.py --flag'"));
}

TEST(LaunchPlanTest, WorkerCommandIsToldEachTrainingSettingGivenAndItsCurveKeys) {
  LaunchOptions options;
  options.num_ps = 1;
  options.num_workers = 2;
  options.worker_command = "./train";
  options.data_dir = "/data/fm";
  options.batch_size = "32";
  options.lr = "0.05";
  options.optimizer = "adam";
  options.lr_schedule = "cosine";
  options.model = "cnn";
  options.seed = "7";
  options.max_steps = "100";
  options.log_every = "2.5";
  options.wire_dtype = "bfloat16";
  options.topk_probe = "off";
  options.delta_pulls = "off";
  options.checkpoint_each_epoch = true;
  options.curve_dir = "/k";
  options.finish_timeout = 42.5;
  options.worker_python_path = "/opt/python:/inherited";
  const std::vector<int> ports = {5000, 6000, 6001, 7000, 7001, 7002};
  const Result<LaunchPlan> plan = BuildPlan(options, "/opt/bin", "/logs", ports);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (int rank : {0, 1}) {
    std::map<std::string, std::string> env =
        EnvMap(plan->processes[static_cast<size_t>(1 + rank)].env);
    const std::map<std::string, std::string> given = {
        {"PARASYNC_DATA", "/data/fm"},
        {"PARASYNC_BATCH_SIZE", "32"},
        {"PARASYNC_LR", "0.05"},
        {"PARASYNC_OPTIMIZER", "adam"},
        {"PARASYNC_LR_SCHEDULE", "cosine"},
        {"PARASYNC_MODEL", "cnn"},
        {"PARASYNC_SEED", "7"},
        {"PARASYNC_MAX_STEPS", "100"},
        {"PARASYNC_LOG_EVERY", "2.5"},
        {"PARASYNC_WIRE_DTYPE", "bfloat16"},
        {"PARASYNC_TOPK_PROBE", "off"},
        {"PARASYNC_DELTA_PULLS", "off"},
        {"PARASYNC_CHECKPOINT_EACH_EPOCH", "1"},
        {"PARASYNC_CURVE_KEY", "/k/worker" + std::to_string(rank) + ".key"},
        {"PARASYNC_CURVE_SERVER_KEY", "/k/ps.pub"},
        {"PYTHONPATH", "/opt/python:/inherited"}};
    for (const auto& [name, value] : given) {
      ASSERT_EQ(env.count(name), 1u) << name << " of worker " << rank;
      EXPECT_EQ(env.at(name), value) << name << " of worker " << rank;
    }
    EXPECT_EQ(env.count("PARASYNC_WAIT_FOR_WORKERS"), rank == 0 ? 1u : 0u) << rank;
  }
  EXPECT_EQ(EnvMap(plan->processes[1].env).at("PARASYNC_WAIT_FOR_WORKERS"), "42.5");
  // The servers still get their keys as flags.
  EXPECT_THAT(plan->processes[0].argv, ::testing::IsSupersetOf({"--curve-key", "/k/ps.key"}));

  // Stopped with the chief, the chief waits for nobody.
  options.stop_workers_with_chief = true;
  const Result<LaunchPlan> stopping = BuildPlan(options, "/opt/bin", "/logs", ports);
  ASSERT_TRUE(stopping.ok());
  EXPECT_EQ(EnvMap(stopping->processes[1].env).count("PARASYNC_WAIT_FOR_WORKERS"), 0u);
}

TEST(LaunchPlanTest, WorkerCommandGetsTheWorkerAndRankArgsAsQuotedWordsAfterItself) {
  LaunchOptions options;
  options.num_ps = 1;
  options.num_workers = 2;
  // Spaces and both kinds of quote, in the command and in the extra words.
  options.worker_command = R"(printf '%s\n' "my file.py" 'it''s')";
  options.worker_args = {"--note=a b", "plain"};
  options.rank_args = {{1, "it's"}};
  const Result<LaunchPlan> plan =
      BuildPlan(options, "/b", "/l", {5000, 6000, 6001, 7000, 7001, 7002});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // The command as written (the shell reads it), the extra words quoted.
  EXPECT_EQ(plan->processes[1].argv[2],
            R"(exec printf '%s\n' "my file.py" 'it''s' '--note=a b' plain)");
  EXPECT_EQ(plan->processes[2].argv[2],
            R"(exec printf '%s\n' "my file.py" 'it''s' '--note=a b' plain 'it'\''s')");
  // What the program gets, run by the real shell: each word intact.
  parasync::testing::TempDir tmp;
  const parasync::testing::Finished run =
      parasync::testing::RunToExit(plan->processes[2].argv, tmp.path(), std::chrono::seconds(10));
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "my file.py\nits\n--note=a b\nplain\nit's\n");
}

TEST(LaunchPlanTest, WorkerCommandOnAnotherHostGetsItsEnvironmentInTheRemoteCommand) {
  LaunchOptions options;
  options.num_ps = 1;
  options.num_workers = 2;
  options.ps_placement = {{"node1", 1}};
  options.worker_placement = {{"node2", 2}};
  options.remote_bin_dir = "/remote/bin";
  options.worker_command = "python3 train.py";
  const Result<LaunchPlan> plan = BuildPlan(options, "/b", "/l", PortBasePorts(options));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const ProcessSpec& worker1 = plan->processes[2];
  ASSERT_TRUE(worker1.remote);
  const std::map<std::string, std::string> env = EnvMap(worker1.env);
  EXPECT_EQ(env.at("LOCAL_RANK"), "1");  // the second worker on node2
  EXPECT_EQ(env.at("PARASYNC_BIN_DIR"), "/remote/bin");
  EXPECT_EQ(env.at("PARASYNC_METRICS_BIND"), "0.0.0.0");
  EXPECT_EQ(env.at("PARASYNC_METRICS_PORT"), "30001");
  // ssh passes no environment: the remote shell sets it, each variable once, before the
  // command (also what --dry-run prints for it).
  const std::string remote = worker1.spawn_argv.back();
  EXPECT_THAT(remote, HasSubstr(" PARASYNC_LOG_PREFIXED=1 ")) << remote;
  EXPECT_EQ(remote.find("PARASYNC_LOG_PREFIXED="), remote.rfind("PARASYNC_LOG_PREFIXED="));
  EXPECT_THAT(remote, HasSubstr("TF_CONFIG='{\"cluster\":{\"ps\":[\"node1:29500\"],\"worker\":"
                                "[\"node2:29500\",\"node2:29501\"]},\"task\":{\"type\":\"worker\","
                                "\"index\":1}}' "));
  EXPECT_THAT(remote, HasSubstr(" LOCAL_RANK=1 "));
  EXPECT_THAT(remote, HasSubstr(" /bin/sh -c 'exec python3 train.py' </dev/null"));
  EXPECT_EQ(DisplayCommand(worker1), ShellJoin(worker1.spawn_argv));
}

TEST(LaunchPlanTest, WorkerCommandsGetTorchrunsAndHorovodsNamesForWhereTheyRun) {
  LaunchOptions options;
  options.num_ps = 1;
  options.num_workers = 3;
  options.ps_placement = {{"node1", 1}};
  options.worker_placement = {{"node2", 2}, {"node3", 1}};
  options.worker_command = "python3 train.py";
  const Result<LaunchPlan> plan = BuildPlan(options, "/b", "/l", PortBasePorts(options));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // rank, local rank, local size, cross rank (the host's index), for each worker
  const std::vector<std::array<std::string, 4>> want = {
      {"0", "0", "2", "0"}, {"1", "1", "2", "0"}, {"2", "0", "1", "1"}};
  for (size_t w = 0; w < want.size(); ++w) {
    const std::map<std::string, std::string> env = EnvMap(plan->processes[1 + w].env);
    EXPECT_EQ(env.at("RANK"), want[w][0]) << w;
    EXPECT_EQ(env.at("HOROVOD_RANK"), want[w][0]) << w;
    EXPECT_EQ(env.at("WORLD_SIZE"), "3") << w;
    EXPECT_EQ(env.at("HOROVOD_SIZE"), "3") << w;
    EXPECT_EQ(env.at("LOCAL_RANK"), want[w][1]) << w;
    EXPECT_EQ(env.at("HOROVOD_LOCAL_RANK"), want[w][1]) << w;
    EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), want[w][2]) << w;
    EXPECT_EQ(env.at("HOROVOD_LOCAL_SIZE"), want[w][2]) << w;
    EXPECT_EQ(env.at("HOROVOD_CROSS_RANK"), want[w][3]) << w;
    EXPECT_EQ(env.at("HOROVOD_CROSS_SIZE"), "2") << w;
    // One OpenMP thread each where workers share a host (torchrun's default); none set for
    // node3's single worker.
    EXPECT_EQ(env.count("OMP_NUM_THREADS") ? env.at("OMP_NUM_THREADS") : "unset",
              want[w][2] == "2" ? "1" : "unset") << w;
  }
  // The user's own OMP_NUM_THREADS (in the launcher's environment) reaches every worker.
  options.omp_threads_given = true;
  const Result<LaunchPlan> chosen = BuildPlan(options, "/b", "/l", PortBasePorts(options));
  ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
  for (size_t w = 0; w < want.size(); ++w) {
    EXPECT_EQ(EnvMap(chosen->processes[1 + w].env).count("OMP_NUM_THREADS"), 0u) << w;
  }
}

TEST(LaunchPlanTest, ARestartedWorkerIsToldItIsARestartHereAndOverSsh) {
  LaunchOptions options;
  options.num_ps = 1;
  options.num_workers = 2;
  options.ps_placement = {{"node1", 1}};
  options.worker_placement = {{"node2", 2}};
  options.worker_command = "python3 train.py";
  Result<LaunchPlan> plan = BuildPlan(options, "/b", "/l", PortBasePorts(options));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ProcessSpec worker = plan->processes[2];
  ASSERT_TRUE(worker.remote);
  EXPECT_FALSE(EnvMap(worker.env).contains("PARASYNC_RESTART"));
  MarkRestart(options, worker, 2);
  EXPECT_EQ(EnvMap(worker.env).at("PARASYNC_RESTART"), "2");
  // Over ssh the variables travel in the command line: the restart's is there too.
  EXPECT_THAT(ShellJoin(worker.spawn_argv), HasSubstr("PARASYNC_RESTART=2"));
  EXPECT_THAT(ShellJoin(plan->processes[2].spawn_argv), Not(HasSubstr("PARASYNC_RESTART")));
}

TEST(LaunchPlanTest, ABlankWorkerCommandIsRefused) {
  LaunchOptions options;
  EXPECT_TRUE(ValidateOptions(options).ok());
  for (const char* blank : {"", "   ", " \t\n"}) {
    options.worker_command = blank;
    const Status s = ValidateOptions(options);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "'" << blank << "'";
    EXPECT_THAT(s.message(), HasSubstr("--worker-command must name the program")) << blank;
  }
  options.worker_command = "x";
  EXPECT_TRUE(ValidateOptions(options).ok());
}

TEST(LaunchPlanTest, AWorkerCommandIsToldAnAbsoluteDataSet) {
  LaunchOptions options;
  options.data_dir = "rel/data";
  ASSERT_TRUE(ResolvePaths(&options).ok());
  EXPECT_EQ(options.data_dir, "rel/data") << "parasync-worker gets it as given";
  options.worker_command = "python3 train.py";
  ASSERT_TRUE(ResolvePaths(&options).ok());
  EXPECT_EQ(options.data_dir, (std::filesystem::current_path() / "rel/data").string());
}

TEST(LaunchPlanTest, WorkerPythonPathPutsThePackageBesideTheBinariesFirst) {
  parasync::testing::TempDir tmp;
  const std::string bin = tmp.path() + "/build/bin";
  std::filesystem::create_directories(bin);
  EXPECT_EQ(WorkerPythonPath(bin, nullptr), "");
  EXPECT_EQ(WorkerPythonPath(bin, ""), "");
  EXPECT_EQ(WorkerPythonPath(bin, "/mine"), "/mine");
  // An installed package (cmake --install), and a build tree's, which comes first.
  std::filesystem::create_directories(tmp.path() + "/build/lib/python3/dist-packages/parasync");
  EXPECT_EQ(WorkerPythonPath(bin, nullptr), tmp.path() + "/build/lib/python3/dist-packages");
  std::filesystem::create_directories(tmp.path() + "/build/python");
  EXPECT_EQ(WorkerPythonPath(bin, nullptr), tmp.path() + "/build/lib/python3/dist-packages")
      << "a python directory without the package is not it";
  std::filesystem::create_directories(tmp.path() + "/build/python/parasync");
  EXPECT_EQ(WorkerPythonPath(bin, nullptr), tmp.path() + "/build/python");
  EXPECT_EQ(WorkerPythonPath(bin + "/", "/mine:/other"), tmp.path() + "/build/python:/mine:/other");
}

TEST(LaunchPlanTest, WorkerCommandNeedsNoParasyncWorkerBinary) {
  parasync::testing::TempDir tmp;
  const std::string ps = tmp.path() + "/parasync-ps";
  std::ofstream(ps) << "#!/bin/sh\n";
  ASSERT_EQ(chmod(ps.c_str(), 0755), 0);
  EXPECT_TRUE(CheckBinaries(tmp.path(), false, /*with_worker=*/false).ok());
  const Status needed = CheckBinaries(tmp.path());
  EXPECT_EQ(needed.code(), StatusCode::kNotFound);
  EXPECT_THAT(needed.message(), HasSubstr(tmp.path() + "/parasync-worker"));
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

// ---- ports: picked by nobody in advance on a single host ----------------------------------

TEST(LaunchPlanTest, ASingleHostPlanLeavesEveryPortToItsServer) {
  LaunchOptions options;
  options.num_ps = 2;
  options.num_workers = 3;
  options.worker_command = "python3 train.py";
  const std::vector<int> ports = SingleHostPorts(options);
  EXPECT_THAT(ports, ElementsAre(0, 0, 1, 2, 3, 0, 0, 0, 0, 0));
  const Result<LaunchPlan> plan = BuildPlan(options, "/b", "/l", ports);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (size_t i : {0u, 1u}) {
    const ProcessSpec& ps = plan->processes[i];
    EXPECT_EQ(ps.address, "127.0.0.1:0");
    EXPECT_EQ(ps.ready_path, "/l/ps" + std::to_string(i) + ".ready");
    EXPECT_THAT(ps.argv, ::testing::IsSupersetOf(std::vector<std::string>{
                             "--ps-hosts", "127.0.0.1:0,127.0.0.1:0", "--worker-hosts",
                             "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "--metrics-port", "0",
                             "--ready-file", ps.ready_path}));
  }
  const std::map<std::string, std::string> worker2 = EnvMap(plan->processes[4].env);
  EXPECT_EQ(worker2.at("PARASYNC_METRICS_PORT"), "0");
  EXPECT_EQ(worker2.at("PARASYNC_READY_FILE"), "/l/worker2.ready");

  // Planned again with the ports the servers bound: what the workers and a restart get.
  std::vector<int> bound = ports;
  bound[0] = 24001;
  bound[1] = 24002;
  const Result<LaunchPlan> again = BuildPlan(options, "/b", "/l", bound);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_THAT(again->processes[1].argv,
              ::testing::IsSupersetOf({"--ps-hosts", "127.0.0.1:24001,127.0.0.1:24002",
                                       "--metrics-port", "0", "--ready-file", "/l/ps1.ready"}));
  const Result<ClusterSpec> cluster =
      ParseTfConfig(EnvMap(again->processes[4].env).at("TF_CONFIG"));
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  EXPECT_THAT(cluster->ps, ElementsAre("127.0.0.1:24001", "127.0.0.1:24002"));
}

TEST(LaunchPlanTest, AMultiHostPlanKeepsItsFixedPortsAndNeedsNoReadyFiles) {
  LaunchOptions options;
  options.num_ps = 1;
  options.num_workers = 1;
  options.ps_placement = {{"node1", 1}};
  options.worker_placement = {{"node2", 1}};
  const Result<LaunchPlan> plan = BuildPlan(options, "/b", "/l", PortBasePorts(options));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (const ProcessSpec& spec : plan->processes) {
    EXPECT_EQ(spec.ready_path, "") << spec.name;
    EXPECT_THAT(spec.argv, Not(::testing::Contains("--ready-file"))) << spec.name;
  }
  EXPECT_EQ(plan->processes[0].address, "node1:29500");
  EXPECT_THAT(plan->processes[1].argv, ::testing::IsSupersetOf({"--metrics-port", "30000"}));
}

// --ipc: the run's sockets are in a directory no other user can guess (so none can make it
// first, and servers make it private), named after the shard, the same before and after the
// servers' ports are known (a single-host run plans twice).
TEST(LaunchPlanTest, IpcSocketsAreInTheRunsUnguessableDirectoryAndSurviveThePlanningAgain) {
  const std::string dir = NewSocketDir();
  EXPECT_THAT(dir, ::testing::MatchesRegex("/tmp/parasync-[0-9a-f]{16}"));
  EXPECT_NE(NewSocketDir(), dir) << "two runs would share their sockets' directory";
  LaunchOptions options;
  options.num_ps = 2;
  options.num_workers = 1;
  options.local_ipc = true;
  options.socket_dir = dir;
  std::vector<int> ports = SingleHostPorts(options);
  const Result<LaunchPlan> first = BuildPlan(options, "/b", "/l", ports);
  ports[0] = 24001;
  ports[1] = 24002;
  const Result<LaunchPlan> again = BuildPlan(options, "/b", "/l", ports);
  ASSERT_TRUE(first.ok() && again.ok());
  const std::string socket0 = dir + "/ps0.sock";
  EXPECT_EQ(SocketPath(dir, 0), socket0);
  for (const Result<LaunchPlan>* plan : {&first, &again}) {
    EXPECT_THAT((*plan)->processes[0].argv,
                ::testing::IsSupersetOf(std::vector<std::string>{"--ipc", socket0}));
    EXPECT_THAT((*plan)->processes[2].argv,
                ::testing::IsSupersetOf(std::vector<std::string>{
                    "--ps-ipc", "0=" + socket0, "--ps-ipc", "1=" + dir + "/ps1.sock"}));
  }
}

// --local-aggregation: each host with several workers is a group; its workers get its ranks
// (as --local-group, or PARASYNC_LOCAL_GROUP for a --worker-command), a lone worker nothing;
// only sync modes take it.
TEST(LaunchPlanTest, LocalAggregationNamesEachHostsRanksToItsWorkers) {
  LaunchOptions options;
  options.mode = "sync";
  options.num_ps = 1;
  options.num_workers = 4;
  options.ps_placement = {{"node1", 1}};
  options.worker_placement = {{"node2", 2}, {"node3", 1}, {"node2", 1}};
  options.local_aggregation = true;
  ASSERT_TRUE(ValidateOptions(options).ok());
  const std::vector<std::string> want = {"0,1,3", "0,1,3", "", "0,1,3"};
  const Result<LaunchPlan> plan = BuildPlan(options, "/b", "/l", PortBasePorts(options));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (size_t w = 0; w < want.size(); ++w) {
    const std::vector<std::string>& argv = plan->processes[1 + w].argv;
    const auto flag = std::find(argv.begin(), argv.end(), "--local-group");
    EXPECT_EQ(flag == argv.end() ? "" : *(flag + 1), want[w]) << w;
  }
  options.worker_command = "python3 train.py";
  const Result<LaunchPlan> command = BuildPlan(options, "/b", "/l", PortBasePorts(options));
  ASSERT_TRUE(command.ok()) << command.status().ToString();
  for (size_t w = 0; w < want.size(); ++w) {
    const std::map<std::string, std::string> env = EnvMap(command->processes[1 + w].env);
    EXPECT_EQ(env.count("PARASYNC_LOCAL_GROUP") ? env.at("PARASYNC_LOCAL_GROUP") : "", want[w])
        << w;
  }
  options.mode = "ssp:2";
  const Status s = ValidateOptions(options);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--local-aggregation needs --mode sync or sync:delayed"));
}

}  // namespace
}  // namespace parasync::launch
