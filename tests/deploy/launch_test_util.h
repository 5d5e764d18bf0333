// What the launcher tests (launch_test.cc, launch_plan_test.cc, snapshot_server_test.cc)
// share: fake parasync-ps / parasync-worker scripts, the real parasync-launch as a child
// process (on tests/support's Child), reading what it wrote, and the LaunchTest fixture.
#pragma once

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
#include "tests/support/temp_dir.h"

namespace parasync::launch::launch_test {

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
//   ok           prints, exits 0 FAKE_OK_DELAY_<name> (else FAKE_OK_DELAY) s after all are
//                ready, leaving its last line without a newline; worker0 appends two rows
//                to eval.jsonl when FAKE_WRITE_EVAL is set (best accuracy 0.8801 at epoch
//                4, final 0.8712 at 5)
//   fail3        prints, exits 3 0.2 s after all are ready
//   hang         runs until SIGTERM, then says so and exits 0
//   ignore_term  ignores SIGTERM; only SIGKILL ends it
//   refuse       says so and exits 2 before it serves (no ready file)
//   busy_restart as hang, but its starts 2 to 1 + FAKE_BUSY_TRIES (default 2) say that its
//                port is in use, as parasync-ps does, and exit 2
// Each fake records its arguments (one a line; also, for its start number n, in
// <name>.args.<n>), its PARASYNC_LOG_PREFIXED ("unset" when absent) and its PID in
// $FAKE_DIR, and a .ready marker once its greeting is printed; ok and fail3 wait (up to 5 s)
// until all FAKE_COUNT (default 4) fakes are ready, so no fake is stopped before it has set
// itself up. Given --ready-file, it writes there what parasync-ps / parasync-worker write
// (and a copy in $FAKE_DIR/<name>.bound.<n>) before its greeting: a PS's own --ps-hosts
// entry and its --metrics-port, a port 0 replaced by a random port below the ephemeral range
// (the fake binds none), with FAKE_FREE_PORTS set one free now (for a test that binds it
// after the fake: python3 tries binds, which takes a while).
inline constexpr const char* kFakeScript = R"(#!/bin/sh
role=ps
case "$0" in *parasync-worker) role=worker ;; esac
index=
log_dir=
ready_file=
metrics_port=
ps_hosts=
prev=
for arg in "$@"; do
  [ "$prev" = "--task-index" ] && index=$arg
  [ "$prev" = "--log-dir" ] && log_dir=$arg
  [ "$prev" = "--ready-file" ] && ready_file=$arg
  [ "$prev" = "--metrics-port" ] && metrics_port=$arg
  [ "$prev" = "--ps-hosts" ] && ps_hosts=$arg
  prev=$arg
done
name=$role$index
eval "behaviour=\${FAKE_$name:-\${FAKE_DEFAULT:-hang}}"
case "$behaviour" in
  hang|busy_restart) trap 'echo "$name got SIGTERM"; exit 0' TERM ;;
  ignore_term) trap '' TERM ;;
esac
# First, so that a fake stopped at once is still found (and checked gone).
echo $$ > "$FAKE_DIR/$name.pid.tmp" && mv "$FAKE_DIR/$name.pid.tmp" "$FAKE_DIR/$name.pid"
start=1
while [ -e "$FAKE_DIR/$name.args.$start" ]; do start=$((start + 1)); done
printf '%s\n' "$@" > "$FAKE_DIR/$name.args.$start"
printf '%s\n' "$@" > "$FAKE_DIR/$name.args"
printf '%s\n' "${PARASYNC_LOG_PREFIXED-unset}" > "$FAKE_DIR/$name.env"
own=$(printf '%s\n' "$ps_hosts" | tr ',' '\n' | sed -n "$((index + 1))p")
if [ "$behaviour" = refuse ]; then
  echo "$name refuses to start" >&2
  exit 2
fi
if [ "$behaviour" = busy_restart ] && [ "$start" -ge 2 ] &&
   [ "$start" -le $((1 + ${FAKE_BUSY_TRIES:-2})) ]; then
  echo "$name start $start"
  echo "parasync-ps: shard $index's address in --ps-hosts, $own: port ${own##*:} on ${own%:*} is in use"
  exit 2
fi
free_ports() {
  if [ -z "$FAKE_FREE_PORTS" ]; then
    od -An -N4 -tu2 /dev/urandom
    return
  fi
  python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
found = []
while len(found) < 2:
    port = random.randrange(10000, low)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        if port not in found:
            found.append(port)
    except OSError:
        pass
    s.close()
print(*found)'
}
if [ -n "$ready_file" ]; then
  set -- $(free_ports)
  if [ -z "$FAKE_FREE_PORTS" ]; then
    set -- $((10000 + $1 % 22000)) $((10000 + $2 % 22000))
  fi
  address=
  if [ "$role" = ps ]; then
    address=$own
    [ "${own##*:}" = 0 ] && address="${own%:*}:$1"
  fi
  [ "$metrics_port" = 0 ] && metrics_port=$2
  printf '{"role": "%s", "task_index": %s, "pid": %s, "address": "%s", "metrics_port": %s}\n' \
    "$role" "$index" $$ "$address" "$metrics_port" > "$ready_file.tmp"
  cp "$ready_file.tmp" "$FAKE_DIR/$name.bound.$start"
  mv "$ready_file.tmp" "$ready_file"
fi
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
    eval "delay=\${FAKE_OK_DELAY_$name:-\${FAKE_OK_DELAY:-0.3}}"
    sleep "$delay"
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
inline constexpr const char* kFakeExportScript = R"sh(#!/bin/sh
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

// A fake --worker-command program (the user's own worker, reading its environment). It finds
// its rank in TF_CONFIG and records, for its start number n (1, then 2 when restarted), its
// environment (NUL-separated NAME=value, as env -0 prints it) in $FAKE_DIR/cmd<rank>.env.<n>,
// its arguments (one a line) in cmd<rank>.args.<n> and its PID in cmd<rank>-<n>.pid. Then it
// writes what a worker writes: the chief a row of $PARASYNC_LOG_DIR/eval.jsonl, every worker
// its final metrics snapshot metrics-worker<rank>.prom counting 100 examples, and, unless
// FAKE_CMD_NO_READY is set, what the parasync package writes to $PARASYNC_READY_FILE (when
// set): metrics port 20000 + its start number * 100 + its rank (bound by nothing). With
// FAKE_CMD_WAIT_<rank> (or FAKE_CMD_WAIT) set, it then waits up to 10 s for
// $FAKE_DIR/release. It exits FAKE_CMD_EXIT_<rank> (default 0).
inline constexpr const char* kFakeWorkerCommandScript = R"sh(#!/bin/sh
rank=$(printf '%s' "$TF_CONFIG" | sed -n 's/.*"task":{"type":"worker","index":\([0-9]*\)}.*/\1/p')
[ -n "$rank" ] || { echo "no worker index in TF_CONFIG '$TF_CONFIG'" >&2; exit 9; }
n=1
while [ -e "$FAKE_DIR/cmd$rank.env.$n" ]; do n=$((n + 1)); done
printf '%s\n' "$@" > "$FAKE_DIR/cmd$rank.args.$n"
record="$FAKE_DIR/cmd$rank"
echo $$ > "$record-$n.pid.tmp" && mv "$record-$n.pid.tmp" "$record-$n.pid"
env -0 > "$record.env.$n.tmp" && mv "$record.env.$n.tmp" "$record.env.$n"
if [ "$rank" = 0 ]; then
  echo '{"epoch": 1, "test_accuracy": 0.625, "examples": 200, "wall_s": 1.5}' \
    >> "$PARASYNC_LOG_DIR/eval.jsonl"
fi
printf 'parasync_worker_examples_total{rank="%s",role="worker"} 100\n' "$rank" \
  > "$PARASYNC_LOG_DIR/metrics-worker$rank.prom"
if [ -n "$PARASYNC_READY_FILE" ] && [ -z "$FAKE_CMD_NO_READY" ]; then
  printf '{"role": "worker", "task_index": %s, "pid": %s, "address": "", "metrics_port": %s}\n' \
    "$rank" $$ $((20000 + n * 100 + rank)) > "$PARASYNC_READY_FILE.tmp"
  mv "$PARASYNC_READY_FILE.tmp" "$PARASYNC_READY_FILE"
fi
echo "command worker $rank start $n"
eval "wait_for=\${FAKE_CMD_WAIT_$rank:-\${FAKE_CMD_WAIT:-}}"
tries=0
if [ -n "$wait_for" ]; then
  until [ -e "$FAKE_DIR/release" ] || [ $tries -ge 500 ]; do sleep 0.02; tries=$((tries + 1)); done
fi
eval "code=\${FAKE_CMD_EXIT_$rank:-0}"
exit "$code"
)sh";

inline std::string LauncherPath() {
  const char* bin_dir = std::getenv("PARASYNC_BIN_DIR");
  if (bin_dir != nullptr && *bin_dir != '\0') return std::string(bin_dir) + "/parasync-launch";
  // Run by hand: the test sits next to the launcher in <build>/bin.
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string() +
         "/parasync-launch";
}

inline bool ProcessGone(pid_t pid) { return kill(pid, 0) == -1 && errno == ESRCH; }

// Waits up to `timeout` for every PID to be gone; returns those still there.
inline std::vector<pid_t> WaitUntilGone(const std::vector<pid_t>& pids,
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
inline std::vector<std::string> LauncherMessages(const std::string& out) {
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
inline void ExpectEveryLauncherLineTimestamped(const std::string& out) {
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
inline nlohmann::json ReadSummary(const std::string& log_dir) {
  return nlohmann::json::parse(ReadFile(log_dir + "/summary.json"), nullptr, false);
}

// The entry of summary.json's "processes" named `name` (null if none).
inline nlohmann::json SummaryProcess(const nlohmann::json& summary, const std::string& name) {
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

  // Writes kFakeWorkerCommandScript to "<root>/my worker.sh" (a space, so that quoting is
  // tested too) and returns the --worker-command that runs it: its path, shell-quoted.
  std::string InstallFakeWorkerCommand() const {
    const std::string path = root_ + "/my worker.sh";
    std::ofstream(path) << kFakeWorkerCommandScript;
    EXPECT_EQ(chmod(path.c_str(), 0755), 0);
    return ShellJoin({path});
  }

  // The environment that start `n` of the fake command worker `rank` recorded; empty when it
  // recorded none.
  std::map<std::string, std::string> CommandEnv(int rank, int n) const {
    std::map<std::string, std::string> env;
    const std::string text =
        ReadFile(fake_dir_ + "/cmd" + std::to_string(rank) + ".env." + std::to_string(n));
    std::istringstream entries(text);
    for (std::string entry; std::getline(entries, entry, '\0');) {
      const size_t equals = entry.find('=');
      if (equals != std::string::npos) env[entry.substr(0, equals)] = entry.substr(equals + 1);
    }
    return env;
  }

  void InstallFakeExporter() const {
    const std::string path = bin_dir_ + "/parasync-export";
    std::ofstream(path) << kFakeExportScript;
    ASSERT_EQ(chmod(path.c_str(), 0755), 0);
  }

  // The fake workers run until SIGTERM unless told otherwise (FAKE_<name> ok): the tests of
  // other things stop them with the chief (--stop-workers-with-chief); the default end of a
  // run, which waits for them, has tests of its own on WaitingArgs().
  std::vector<std::string> BaseArgs() const {
    std::vector<std::string> args = WaitingArgs();
    args.push_back("--stop-workers-with-chief");
    return args;
  }
  std::vector<std::string> WaitingArgs() const {
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

}  // namespace parasync::launch::launch_test
