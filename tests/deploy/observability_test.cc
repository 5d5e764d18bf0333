// Tests that the Grafana dashboards (dashboards/parasync.json and
// dashboards/parasync-embeddings.json) and the Prometheus alert rules
// (deploy/prometheus/parasync-alerts.yml) use only metric names the processes export, taken
// from the registries parasync-ps and parasync-worker really build and the process metrics
// every metrics server adds (common/process_metrics.h), none deprecated, and that each
// dashboard keeps the structure its provisioning relies on. A renamed metric fails here, not
// on a blank panel in production.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "common/process_metrics.h"
#include "ps/ps_metrics.h"
#include "worker/worker_metrics.h"

namespace parasync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// One query and where it was found, e.g. `panel "Version per shard" (id 14) target A`.
struct Expr {
  std::string where;
  std::string expr;
};

// Adds the names a query may use for each family in `registry`: counters and gauges as
// registered; histograms only as name_bucket, name_sum and name_count (a classic histogram
// has no series under its bare name); summaries as name, name_sum and name_count.
void AddExportedNames(const std::vector<prometheus::MetricFamily>& families,
                      std::set<std::string>* names) {
  for (const prometheus::MetricFamily& family : families) {
    switch (family.type) {
      case prometheus::MetricType::Histogram:
        names->insert(family.name + "_bucket");
        names->insert(family.name + "_sum");
        names->insert(family.name + "_count");
        break;
      case prometheus::MetricType::Summary:
        names->insert(family.name);
        names->insert(family.name + "_sum");
        names->insert(family.name + "_count");
        break;
      default:
        names->insert(family.name);
    }
  }
}

// Every name a parameter server or a worker exports. Rank 0 is the chief, the one rank that
// also exports the evaluation gauges; the server has an embedding table, as it does once a
// model with tables registers (before, the per-table families have no series).
std::set<std::string> ExportedNames() {
  std::set<std::string> names;
  PsMetrics ps(/*shard=*/0, /*num_workers=*/2);
  ps.AddTables({"table"});
  const WorkerMetrics chief(/*rank=*/0);
  AddExportedNames(ps.registry->Collect(), &names);
  AddExportedNames(chief.registry->Collect(), &names);
  AddExportedNames(ProcessCollector().Collect(), &names);
  return names;
}

// Still exported for one release, but no dashboard or rule of ours may build on them.
const std::set<std::string> kDeprecated = {"parasync_ps_straggler_rank"};

// The parasync_... and process_... metric names in a PromQL expression, in order of
// appearance.
std::vector<std::string> MetricTokens(const std::string& expr) {
  static const std::regex kToken("\\b(?:parasync|process)_[a-zA-Z0-9_:]+");
  std::vector<std::string> tokens;
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), kToken);
       it != std::sregex_iterator(); ++it) {
    tokens.push_back(it->str());
  }
  return tokens;
}

// One message "<where>: unknown metric <name>" for every token of `exprs` not in `known`.
std::vector<std::string> UnknownMetrics(const std::vector<Expr>& exprs,
                                        const std::set<std::string>& known) {
  std::vector<std::string> unknown;
  for (const Expr& e : exprs) {
    for (const std::string& token : MetricTokens(e.expr)) {
      if (known.count(token) == 0) unknown.push_back(e.where + ": unknown metric " + token);
      if (kDeprecated.count(token) != 0) {
        unknown.push_back(e.where + ": deprecated metric " + token);
      }
    }
  }
  return unknown;
}

std::string PanelName(const nlohmann::json& panel) {
  return "panel \"" + panel.value("title", std::string("(untitled)")) + "\" (id " +
         (panel.contains("id") ? panel["id"].dump() : std::string("none")) + ")";
}

// Calls visit(panel) for every panel of the dashboard, rows and their nested panels (a
// collapsed row keeps its panels inside it) included.
template <typename Visit>
void ForEachPanel(const nlohmann::json& dashboard, const Visit& visit) {
  for (const nlohmann::json& panel : dashboard.value("panels", nlohmann::json::array())) {
    visit(panel);
    for (const nlohmann::json& nested : panel.value("panels", nlohmann::json::array())) {
      visit(nested);
    }
  }
}

// The query of a templating variable: a string, or an object with a "query" string.
std::string VariableQuery(const nlohmann::json& variable) {
  if (!variable.contains("query")) return "";
  const nlohmann::json& q = variable["query"];
  if (q.is_string()) return q.get<std::string>();
  if (q.is_object() && q.contains("query") && q["query"].is_string()) {
    return q["query"].get<std::string>();
  }
  return "";
}

// Every query of the dashboard: each panel target's expr and each templating query.
std::vector<Expr> DashboardExprs(const nlohmann::json& dashboard) {
  std::vector<Expr> exprs;
  ForEachPanel(dashboard, [&](const nlohmann::json& panel) {
    for (const nlohmann::json& target : panel.value("targets", nlohmann::json::array())) {
      if (!target.contains("expr") || !target["expr"].is_string()) continue;
      exprs.push_back({PanelName(panel) + " target " + target.value("refId", std::string("?")),
                       target["expr"].get<std::string>()});
    }
  });
  const nlohmann::json templating = dashboard.value("templating", nlohmann::json::object());
  for (const nlohmann::json& variable : templating.value("list", nlohmann::json::array())) {
    const std::string query = VariableQuery(variable);
    if (!query.empty()) {
      exprs.push_back({"variable \"" + variable.value("name", std::string("?")) + "\"", query});
    }
  }
  return exprs;
}

size_t Indent(const std::string& line) {
  const size_t first = line.find_first_not_of(' ');
  return first == std::string::npos ? line.size() : first;
}

// Every `expr:` of a Prometheus rules file, found line by line: the value on the same line,
// or a block scalar (`expr: |`) made of the following lines indented deeper than the key.
std::vector<Expr> AlertExprs(const std::string& yaml) {
  std::vector<Expr> exprs;
  std::vector<std::string> lines;
  std::istringstream in(yaml);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  static const std::regex kAlert(R"(^\s*-\s*(alert|record):\s*(\S+))");
  static const std::regex kExpr(R"(^(\s*)(-\s*)?expr:\s*(.*)$)");
  std::string rule = "(no rule name)";
  for (size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    if (std::regex_search(lines[i], m, kAlert)) rule = m[1].str() + " " + m[2].str();
    if (!std::regex_match(lines[i], m, kExpr)) continue;
    std::string value = m[3].str();
    if (!value.empty() && (value[0] == '|' || value[0] == '>')) {
      const size_t key_indent = Indent(lines[i]);
      value.clear();
      for (size_t j = i + 1; j < lines.size(); ++j) {
        if (Indent(lines[j]) <= key_indent &&
            lines[j].find_first_not_of(' ') != std::string::npos) {
          break;
        }
        value += lines[j] + "\n";
      }
    }
    exprs.push_back({rule + " (line " + std::to_string(i + 1) + ")", value});
  }
  return exprs;
}

// PARASYNC_SOURCE_DIR from the environment, else the tree this test was built from.
std::string SourceDir() {
  const char* dir = std::getenv("PARASYNC_SOURCE_DIR");
  if (dir != nullptr && *dir != '\0') return dir;
#ifdef PARASYNC_TEST_SOURCE_DIR
  return PARASYNC_TEST_SOURCE_DIR;
#else
  return "";
#endif
}

// The contents of `relative` under the source tree; empty and a test failure when unreadable.
std::string ReadSourceFile(const std::string& relative) {
  const std::string dir = SourceDir();
  if (dir.empty()) {
    ADD_FAILURE() << "PARASYNC_SOURCE_DIR is not set";
    return "";
  }
  const std::filesystem::path path = std::filesystem::path(dir) / relative;
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return "";
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The dashboard at `relative` under the source tree; an empty object and a test failure when
// it cannot be read or parsed.
nlohmann::json LoadDashboard(const std::string& relative) {
  const std::string text = ReadSourceFile(relative);
  if (text.empty()) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    ADD_FAILURE() << relative << " is not valid JSON: " << e.what();
    return nlohmann::json::object();
  }
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out += "  " + line + "\n";
  return out;
}

TEST(ObservabilityTest, RegistriesExportTheMetricsDashboardsAreBuiltOn) {
  const std::set<std::string> names = ExportedNames();
  EXPECT_EQ(names.count("parasync_worker_examples_total"), 1u);
  EXPECT_EQ(names.count("parasync_ps_version"), 1u);
  EXPECT_EQ(names.count("parasync_ps_apply_seconds_bucket"), 1u);
  EXPECT_EQ(names.count("parasync_ps_apply_seconds"), 0u) << "a histogram has no bare series";
  EXPECT_EQ(names.count("parasync_ps_straggler"), 1u);
  EXPECT_EQ(names.count("parasync_build_info"), 1u);
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                           "process_virtual_memory_bytes", "process_start_time_seconds",
                           "process_open_fds", "process_max_fds"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
  }
}

// Fails the test for each metric of the dashboard at `relative` no process exports.
void ExpectOnlyExportedMetrics(const std::string& relative) {
  const std::vector<Expr> exprs = DashboardExprs(LoadDashboard(relative));
  ASSERT_FALSE(exprs.empty()) << "no queries found in " << relative;
  const std::vector<std::string> unknown = UnknownMetrics(exprs, ExportedNames());
  EXPECT_THAT(unknown, IsEmpty()) << relative << " uses metrics no process exports:\n"
                                  << Joined(unknown);
}

TEST(ObservabilityTest, DashboardUsesOnlyExportedMetrics) {
  ExpectOnlyExportedMetrics("dashboards/parasync.json");
}

TEST(ObservabilityTest, EmbeddingsDashboardUsesOnlyExportedMetrics) {
  ExpectOnlyExportedMetrics("dashboards/parasync-embeddings.json");
}

TEST(ObservabilityTest, AlertRulesUseOnlyExportedMetrics) {
  const std::string rules = ReadSourceFile("deploy/prometheus/parasync-alerts.yml");
  const std::vector<Expr> exprs = AlertExprs(rules);
  ASSERT_FALSE(exprs.empty()) << "no expr found in deploy/prometheus/parasync-alerts.yml";
  size_t tokens = 0;
  for (const Expr& e : exprs) tokens += MetricTokens(e.expr).size();
  EXPECT_GT(tokens, 0u) << "the alert exprs name no parasync_ metric: is the scan broken?";
  const std::vector<std::string> unknown = UnknownMetrics(exprs, ExportedNames());
  EXPECT_THAT(unknown, IsEmpty()) << "deploy/prometheus/parasync-alerts.yml uses metrics no "
                                     "process exports:\n"
                                  << Joined(unknown);
}

// Fails the test where the dashboard at `relative` lacks what provisioning relies on: its
// `uid`, a `datasource` variable every panel and target reads through, the query variables
// `query_variables` over parasync_ metrics, unique panel ids, a query in every panel.
void ExpectProvisionable(const std::string& relative, const std::string& uid,
                         const std::vector<std::string>& query_variables) {
  SCOPED_TRACE(relative);
  const nlohmann::json dashboard = LoadDashboard(relative);
  EXPECT_EQ(dashboard.value("uid", std::string()), uid);
  EXPECT_GE(dashboard.value("schemaVersion", 0), 39);

  std::map<std::string, nlohmann::json> variables;
  const nlohmann::json templating = dashboard.value("templating", nlohmann::json::object());
  for (const nlohmann::json& v : templating.value("list", nlohmann::json::array())) {
    variables[v.value("name", std::string())] = v;
  }
  ASSERT_EQ(variables.count("datasource"), 1u) << "no `datasource` variable";
  EXPECT_EQ(variables["datasource"].value("type", std::string()), "datasource");
  EXPECT_EQ(variables["datasource"].value("query", std::string()), "prometheus");
  for (const std::string& name : query_variables) {
    ASSERT_EQ(variables.count(name), 1u) << "no `" << name << "` variable";
    EXPECT_EQ(variables[name].value("type", std::string()), "query") << name;
    EXPECT_THAT(VariableQuery(variables[name]), HasSubstr("parasync_")) << name;
  }

  std::set<std::string> ids;
  int panels = 0;
  ForEachPanel(dashboard, [&](const nlohmann::json& panel) {
    const std::string name = PanelName(panel);
    EXPECT_TRUE(panel.contains("id") && panel["id"].is_number_integer()) << name << ": no id";
    if (panel.contains("id")) {
      EXPECT_TRUE(ids.insert(panel["id"].dump()).second) << name << ": duplicate id";
    }
    if (panel.value("type", std::string()) == "row") return;
    ++panels;
    const nlohmann::json ds = panel.value("datasource", nlohmann::json::object());
    EXPECT_EQ(ds.value("uid", std::string()), "${datasource}") << name << ": datasource";
    EXPECT_EQ(ds.value("type", std::string()), "prometheus") << name << ": datasource type";
    int queries = 0;
    for (const nlohmann::json& target : panel.value("targets", nlohmann::json::array())) {
      if (target.contains("datasource")) {
        EXPECT_EQ(target["datasource"].value("uid", std::string()), "${datasource}")
            << name << " target " << target.value("refId", std::string("?"));
      }
      if (target.value("expr", std::string()).find_first_not_of(" \n") != std::string::npos) {
        ++queries;
      }
    }
    EXPECT_GT(queries, 0) << name << ": no target with a query";
  });
  EXPECT_GT(panels, 0) << "no panels";
}

TEST(ObservabilityTest, DashboardHasVariablesDatasourcesAndQueriesProvisioningNeeds) {
  ExpectProvisionable("dashboards/parasync.json", "parasync-overview", {"job", "rank"});
}

TEST(ObservabilityTest, EmbeddingsDashboardHasVariablesDatasourcesAndQueriesProvisioningNeeds) {
  ExpectProvisionable("dashboards/parasync-embeddings.json", "parasync-embeddings",
                      {"job", "shard", "table"});
}

TEST(ObservabilityTest, ScanReportsUnknownMetricWithItsPanel) {
  const nlohmann::json dashboard = nlohmann::json::parse(R"json({
    "panels": [
      {"id": 1, "title": "Fine", "targets": [
        {"refId": "A", "expr": "sum(rate(parasync_worker_examples_total[1m]))"}]},
      {"id": 2, "type": "row", "title": "Collapsed", "panels": [
        {"id": 3, "title": "Broken", "targets": [
          {"refId": "B", "expr": "rate(parasync_worker_not_a_metric_total[1m])"}]}]}
    ],
    "templating": {"list": [
      {"name": "shard", "query": {"query": "label_values(parasync_ps_no_such_gauge, shard)"}}]}
  })json");
  const std::vector<std::string> unknown =
      UnknownMetrics(DashboardExprs(dashboard), ExportedNames());
  EXPECT_THAT(unknown,
              ElementsAre("panel \"Broken\" (id 3) target B: unknown metric "
                          "parasync_worker_not_a_metric_total",
                          "variable \"shard\": unknown metric parasync_ps_no_such_gauge"));
}

TEST(ObservabilityTest, ScanReportsBareHistogramName) {
  const std::vector<std::string> unknown = UnknownMetrics(
      {{"fake", "histogram_quantile(0.99, rate(parasync_ps_apply_seconds[1m]))"}},
      ExportedNames());
  EXPECT_THAT(unknown, ElementsAre("fake: unknown metric parasync_ps_apply_seconds"));
}

TEST(ObservabilityTest, ScanReportsUnknownProcessMetricAndDeprecatedMetric) {
  const std::vector<std::string> unknown = UnknownMetrics(
      {{"fake", "process_resident_memory_bytes + process_no_such_bytes + "
                "parasync_ps_straggler_rank"}},
      ExportedNames());
  EXPECT_THAT(unknown, ElementsAre("fake: unknown metric process_no_such_bytes",
                                   "fake: deprecated metric parasync_ps_straggler_rank"));
}

TEST(ObservabilityTest, AlertScanReadsInlineAndBlockExprs) {
  const std::string rules = R"yaml(groups:
  - name: g
    rules:
      - alert: Inline
        expr: parasync_ps_version > 0
        for: 1m
      - alert: Block
        expr: |
          rate(parasync_worker_not_a_metric_total[5m])
            > 0
        labels:
          severity: warning
)yaml";
  const std::vector<Expr> exprs = AlertExprs(rules);
  ASSERT_EQ(exprs.size(), 2u);
  EXPECT_EQ(exprs[0].expr, "parasync_ps_version > 0");
  EXPECT_THAT(exprs[1].expr, HasSubstr("> 0"));
  EXPECT_THAT(UnknownMetrics(exprs, ExportedNames()),
              ElementsAre("alert Block (line 8): unknown metric "
                          "parasync_worker_not_a_metric_total"));
}

}  // namespace
}  // namespace parasync
