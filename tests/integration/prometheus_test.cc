// A real Prometheus (Debian's) scrapes a live local cluster started by parasync-launch
// --metrics and watched through tools/watch-run.sh, exactly as the README tells a user, and
// every PromQL expression of every panel of a dashboard must return a finite sample through the
// HTTP API while the cluster trains:
// - dashboards/parasync.json on 2 PS and 2 workers training Fashion-MNIST; then the
//   dashboard's global examples/sec, evaluated over the window between two of the chief's
//   evaluations, must agree within 10% with the examples the chief itself counted there.
// - dashboards/parasync-embeddings.json on 2 PS and 2 workers training the ctr model on
//   parasync-gen-ctr data, with --max-table-rows small enough that the servers evict.
// The bounds of each test's waits add up to less than ctest's 300 s (255 s and 225 s), so a
// hang fails here with a message.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/ports.h"
#include "tests/support/process_util.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::TempDir;

constexpr const char* kJob = "promtest";
// Far more than the tests need (a Fashion-MNIST epoch took 0.6-0.8 s on the 2-core VM when
// this was written, a 200k-example ctr epoch about 0.4 s): each test stops its run itself
// once it has what it needs.
constexpr int kEpochs = 1000;

std::string UrlEncode(const std::string& text) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

struct Panel {
  std::string title;
  std::string expr;  // as written in the dashboard
};

void CollectPanels(const nlohmann::json& panels, std::vector<Panel>* out) {
  for (const nlohmann::json& panel : panels) {
    if (panel.contains("panels")) CollectPanels(panel["panels"], out);  // collapsed rows
    if (!panel.contains("targets")) continue;
    for (const nlohmann::json& target : panel["targets"]) {
      if (target.contains("expr") && target["expr"].is_string()) {
        out->push_back({panel.value("title", "(untitled)"), target["expr"].get<std::string>()});
      }
    }
  }
}

// The dashboard's expressions with Grafana's variables replaced as Grafana would for this
// run: our job, every rank, shard and table, and `rate_interval` for $__rate_interval.
std::string Substitute(std::string expr, const std::string& rate_interval) {
  const std::pair<std::regex, std::string> rules[] = {
      {std::regex(R"(\$\{?__rate_interval\}?)"), rate_interval},
      {std::regex(R"(\$\{?__interval\}?)"), "1s"},
      {std::regex(R"(\$\{?__range\}?)"), "5m"},
      {std::regex(R"(\$\{?job(:\w+)?\}?)"), kJob},
      {std::regex(R"(\$\{?(rank|shard|table)(:\w+)?\}?)"), ".*"},
  };
  for (const auto& [pattern, value] : rules) expr = std::regex_replace(expr, pattern, value);
  return expr;
}

// An instant query at `time` (0: now). Returns the "data" object, or null with `error` set.
nlohmann::json Query(int port, const std::string& expr, double time, std::string* error) {
  std::string path = "/api/v1/query?query=" + UrlEncode(expr);
  if (time > 0) path += "&time=" + std::to_string(time);
  const std::string response = testing::HttpGet(port, path);
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) {
    *error = "no HTTP response";
    return nullptr;
  }
  const nlohmann::json doc = nlohmann::json::parse(response.substr(body + 4), nullptr, false);
  if (!doc.is_object() || doc.value("status", "") != "success") {
    *error = response.substr(body + 4, 300);
    return nullptr;
  }
  return doc["data"];
}

// Every finite value of an instant-query result (vector or scalar).
std::vector<double> FiniteValues(const nlohmann::json& data) {
  std::vector<double> values;
  if (!data.is_object()) return values;
  auto take = [&](const nlohmann::json& sample) {
    if (!sample.is_array() || sample.size() != 2 || !sample[1].is_string()) return;
    const double v = std::strtod(sample[1].get<std::string>().c_str(), nullptr);
    if (std::isfinite(v)) values.push_back(v);
  };
  if (data.value("resultType", "") == "scalar") {
    take(data["result"]);
  } else if (data.value("resultType", "") == "vector") {
    for (const nlohmann::json& series : data["result"]) take(series["value"]);
  }
  return values;
}

std::vector<nlohmann::json> EvalRows(const std::string& path) {
  std::vector<nlohmann::json> rows;
  for (const std::string& line : testing::ReadLines(path)) {
    nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object()) rows.push_back(std::move(row));
  }
  return rows;
}

// The chief's pid from the launcher's cluster.json is a running process.
bool ChiefAlive(const std::string& run) {
  const nlohmann::json cluster =
      nlohmann::json::parse(testing::ReadFile(run + "/cluster.json"), nullptr, false);
  if (!cluster.is_object()) return false;
  for (const nlohmann::json& process : cluster["processes"]) {
    if (process["name"] == "worker0") return testing::ProcessAlive(process["pid"].get<pid_t>());
  }
  return false;
}

bool OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    if (access((dirs.substr(start, end - start) + "/" + program).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

// Every panel query of the dashboard at `relative` (from the source tree); empty with a test
// failure when it cannot be read or parsed.
std::vector<Panel> LoadPanels(const std::string& relative) {
  std::ifstream file(std::string(PARASYNC_TEST_SOURCE_DIR) + "/" + relative);
  const nlohmann::json dashboard = nlohmann::json::parse(file, nullptr, false);
  std::vector<Panel> panels;
  if (!dashboard.is_object() || !dashboard.contains("panels")) {
    ADD_FAILURE() << "cannot parse " << relative;
    return panels;
  }
  CollectPanels(dashboard["panels"], &panels);
  return panels;
}

// Waits (up to 30 s) for parasync-launch to write the run's Prometheus targets, then starts
// tools/watch-run.sh on the run (1 s scrapes, its output in dir/prometheus.out) and waits (up
// to 20 s) until that Prometheus is ready. Returns it with its port, or nullopt with a test
// failure. Prometheus needs its port in advance: one free below the ephemeral range, and
// another (three tries in all) should a server starting beside it take that one first.
std::optional<std::pair<Child, int>> StartPrometheus(const std::string& dir,
                                                     const std::string& run) {
  if (!testing::WaitFor(
          [&] { return std::filesystem::exists(run + "/prometheus-targets.json"); }, 30s)) {
    ADD_FAILURE() << "no " << run << "/prometheus-targets.json:\n"
                  << testing::ReadFile(dir + "/launch.out");
    return std::nullopt;
  }
  const std::string out = dir + "/prometheus.out";
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int port = PickFreeLoopbackPorts(1)[0];
    Child prometheus = Child::Start({std::string(PARASYNC_TEST_SOURCE_DIR) + "/tools/watch-run.sh",
                                     run, "--port", std::to_string(port), "--scrape-interval",
                                     "1s"},
                                    out);
    std::optional<int> exited;
    const bool ready = testing::WaitFor(
        [&] {
          exited = prometheus.Wait(0ms);
          return exited || testing::HttpGet(port, "/-/ready").find(" 200 ") != std::string::npos;
        },
        20s);
    if (ready && !exited) return std::make_pair(std::move(prometheus), port);
    if (!exited || testing::ReadFile(out).find("address already in use") == std::string::npos) {
      break;
    }
  }
  ADD_FAILURE() << "Prometheus not ready:\n" << testing::ReadFile(out);
  return std::nullopt;
}

// Polls Prometheus on `port` (up to `limit`) until every panel's expression, its variables
// substituted with a 15 s rate interval (15 scrapes at 1 s), has returned a finite sample;
// a test failure names each one that has not. The run in `run` must still be training when
// the last one gets its data: its chief alive, short of its last epoch (a test failure if
// not). Returns whether every expression got data.
bool EveryExpressionHasDataWhileTraining(int port, const std::vector<Panel>& panels,
                                         const std::string& run, std::chrono::seconds limit) {
  std::vector<bool> seen(panels.size(), false);
  std::vector<std::string> last_answer(panels.size());
  size_t missing = panels.size();
  int final_epoch_when_done = -1;
  bool chief_alive_when_done = false;
  testing::WaitFor(
      [&] {
        for (size_t i = 0; i < panels.size(); ++i) {
          if (seen[i]) continue;
          std::string error;
          const nlohmann::json data = Query(port, Substitute(panels[i].expr, "15s"), 0, &error);
          last_answer[i] = data.is_null() ? error : data.dump().substr(0, 300);
          if (!FiniteValues(data).empty()) {
            seen[i] = true;
            --missing;
          }
        }
        if (missing > 0) return false;
        const std::vector<nlohmann::json> rows = EvalRows(run + "/eval.jsonl");
        final_epoch_when_done = rows.empty() ? 0 : rows.back().value("epoch", 0);
        chief_alive_when_done = ChiefAlive(run);
        return true;
      },
      limit);
  for (size_t i = 0; i < panels.size(); ++i) {
    EXPECT_TRUE(seen[i]) << "panel \"" << panels[i].title << "\": no finite sample for "
                         << Substitute(panels[i].expr, "15s") << "\n  last answer: "
                         << last_answer[i];
  }
  if (missing > 0) return false;
  // "Live": the chief was still training when the last expression got its data.
  EXPECT_TRUE(chief_alive_when_done) << "the chief had exited by then";
  EXPECT_LT(final_epoch_when_done, kEpochs);
  std::printf("all %zu expressions returned data by epoch %d of %d\n", panels.size(),
              final_epoch_when_done, kEpochs);
  return true;
}

TEST(PrometheusTest, EveryDashboardExpressionHasDataFromALiveClusterAndThroughputAgrees) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ASSERT_TRUE(OnPath("prometheus"))
      << "Debian's prometheus is needed (tools/install-deps.sh installs it)";
  const std::vector<Panel> panels = LoadPanels("dashboards/parasync.json");
  ASSERT_GE(panels.size(), 10u);

  TempDir dir;
  const std::string run = dir.path() + "/run";
  Child launch = Child::Start(
      {testing::BinDir() + "/parasync-launch", "--ps", "2", "--workers", "2", "--mode", "sync",
       "--epochs", std::to_string(kEpochs), "--log-dir", run, "--job", kJob, "--data",
       testing::DataDir(), "--data-dir", dir.path() + "/state", "--metrics",
       "--ps-arg=--checkpoint-every=1", "--worker-arg=--train-examples=20000",
       "--worker-arg=--device=cpu"},
      dir.path() + "/launch.out");
  std::optional<std::pair<Child, int>> watch = StartPrometheus(dir.path(), run);
  ASSERT_TRUE(watch.has_value());
  Child& prometheus = watch->first;
  const int port = watch->second;

  ASSERT_TRUE(EveryExpressionHasDataWhileTraining(port, panels, run, 80s))
      << testing::ReadFile(dir.path() + "/prometheus.out");

  // Throughput: two of the chief's evaluations at least 10 s apart, both made while
  // Prometheus was scraping every worker (a stretch it did not see would be extrapolated by
  // rate(), not measured).
  double first_scrape = NAN;  // when Prometheus first had a sample of every worker
  {
    const std::string all_samples =
        "parasync_worker_examples_total{job=\"" + std::string(kJob) + "\"}[10m]";
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          std::string error;
          const nlohmann::json data = Query(port, all_samples, 0, &error);
          if (!data.is_object() || data["result"].size() != 2) return false;
          first_scrape = 0;
          for (const nlohmann::json& series : data["result"]) {
            first_scrape = std::max(first_scrape, series["values"][0][0].get<double>());
          }
          return true;
        },
        20s))
        << all_samples;
  }
  const std::string eval_path = run + "/eval.jsonl";
  auto scraped_rows = [&] {
    std::vector<nlohmann::json> rows;
    for (nlohmann::json& row : EvalRows(eval_path)) {
      // Within one scrape interval of a sample, so rate() extrapolates to the row's time.
      if (row["epoch"].get<int>() >= 1 && row["time"].get<double>() > first_scrape + 0.5) {
        rows.push_back(std::move(row));
      }
    }
    return rows;
  };
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        const std::vector<nlohmann::json> rows = scraped_rows();
        return rows.size() >= 2 &&
               rows.back()["time"].get<double>() - rows.front()["time"].get<double>() >= 10.0;
      },
      50s))
      << testing::ReadFile(eval_path);
  const std::vector<nlohmann::json> rows = scraped_rows();
  const nlohmann::json& first = rows.front();
  const nlohmann::json& last = rows.back();
  const double seconds = last["time"].get<double>() - first["time"].get<double>();
  const double chief_rate =
      static_cast<double>(last["examples"].get<int64_t>() - first["examples"].get<int64_t>()) /
      seconds;
  // Prometheus must have scraped every worker after the later evaluation before it can
  // answer for the window that ends there.
  const std::string scraped_after =
      "min(timestamp(parasync_worker_examples_total{job=\"" + std::string(kJob) + "\"})) > " +
      std::to_string(last["time"].get<double>() + 0.5);
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        std::string error;
        return !FiniteValues(Query(port, scraped_after, 0, &error)).empty();
      },
      10s))
      << scraped_after;
  const std::string global_expr = Substitute(panels.front().expr,
                                             std::to_string(std::lround(seconds * 1000)) + "ms");
  double prometheus_rate = NAN;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        std::string error;
        const nlohmann::json data =
            Query(port, global_expr, last["time"].get<double>(), &error);
        const std::vector<double> values = FiniteValues(data);
        if (values.size() != 1) return false;
        prometheus_rate = values[0];
        return true;
      },
      10s))
      << global_expr;
  std::printf("global examples/sec over %.1f s (epochs %d-%d): Prometheus %.1f, chief %.1f, "
              "ratio %.4f\n",
              seconds, first["epoch"].get<int>(), last["epoch"].get<int>(), prometheus_rate,
              chief_rate, prometheus_rate / chief_rate);
  EXPECT_NEAR(prometheus_rate / chief_rate, 1.0, 0.10)
      << "first panel \"" << panels.front().title << "\": " << global_expr;

  launch.Signal(SIGINT);
  EXPECT_TRUE(launch.Wait(20s).has_value());
  prometheus.Signal(SIGTERM);
  EXPECT_TRUE(prometheus.Wait(15s).has_value());
}

// Small enough to write in well under a second; about 23k distinct ids, so each of the two
// servers, holding at most kMaxTableRows rows, evicts throughout the run.
constexpr const char* kCtrTrainExamples = "200000";
constexpr int kMaxTableRows = 4000;

TEST(PrometheusTest, EveryEmbeddingsDashboardExpressionHasDataFromALiveCtrCluster) {
  ASSERT_TRUE(OnPath("prometheus"))
      << "Debian's prometheus is needed (tools/install-deps.sh installs it)";
  const std::vector<Panel> panels = LoadPanels("dashboards/parasync-embeddings.json");
  ASSERT_GE(panels.size(), 8u);

  TempDir dir;
  const std::string data = dir.path() + "/ctr";
  {
    Child gen = Child::Start({testing::BinDir() + "/parasync-gen-ctr", "--out", data, "--train",
                              kCtrTrainExamples, "--test", "10000", "--seed", "1"},
                             dir.path() + "/gen.out");
    const std::optional<int> status = gen.Wait(60s);
    ASSERT_TRUE(status.has_value() && testing::ExitCode(*status) == 0)
        << testing::ReadFile(dir.path() + "/gen.out");
  }
  const std::string run = dir.path() + "/run";
  Child launch = Child::Start(
      {testing::BinDir() + "/parasync-launch", "--ps", "2", "--workers", "2", "--mode", "async",
       "--epochs", std::to_string(kEpochs), "--dataset", data, "--model", "ctr", "--optimizer",
       "adagrad", "--lr", "0.05", "--batch-size", "256", "--log-dir", run, "--job", kJob,
       "--metrics", "--ps-arg=--max-table-rows=" + std::to_string(kMaxTableRows),
       // A store: evicted rows are demoted to it and promoted back, so the tier panels have
       // data too.
       "--state-dir", dir.path() + "/state"},
      dir.path() + "/launch.out");
  std::optional<std::pair<Child, int>> watch = StartPrometheus(dir.path(), run);
  ASSERT_TRUE(watch.has_value());
  Child& prometheus = watch->first;
  const int port = watch->second;

  EXPECT_TRUE(EveryExpressionHasDataWhileTraining(port, panels, run, 80s))
      << testing::ReadFile(dir.path() + "/prometheus.out");

  // The panels show this run: its servers evicted (to their stores) and promoted rows back,
  // and none held more rows than its capacity. (Failures here still stop the run below.)
  const std::string job = std::string("{job=\"") + kJob + "\"}";
  std::string error;
  const std::vector<double> evicted =
      FiniteValues(Query(port, "sum(parasync_ps_table_rows_evicted_total" + job + ")", 0, &error));
  EXPECT_EQ(evicted.size(), 1u) << error;
  if (evicted.size() == 1) {
    EXPECT_GT(evicted[0], 0) << "no row evicted at --max-table-rows=" << kMaxTableRows;
  }
  const std::vector<double> promoted = FiniteValues(
      Query(port, "sum(parasync_ps_table_rows_promoted_total" + job + ")", 0, &error));
  EXPECT_EQ(promoted.size(), 1u) << error;
  if (promoted.size() == 1) {
    EXPECT_GT(promoted[0], 0) << "no demoted row came back";
  }
  const std::vector<double> fullest = FiniteValues(
      Query(port, "max(sum by (shard) (parasync_ps_table_rows" + job + "))", 0, &error));
  EXPECT_EQ(fullest.size(), 1u) << error;
  if (fullest.size() == 1) {
    EXPECT_LE(fullest[0], kMaxTableRows);
  }

  launch.Signal(SIGINT);
  EXPECT_TRUE(launch.Wait(20s).has_value());
  prometheus.Signal(SIGTERM);
  EXPECT_TRUE(prometheus.Wait(15s).has_value());
}

}  // namespace
}  // namespace parasync
