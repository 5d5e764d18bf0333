// tests/support/prometheus_text.h: the one reader of Prometheus text the tests share.
#include "tests/support/prometheus_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace parasync::testing {
namespace {

TEST(PrometheusTextTest, ReadsNameLabelsAndValueOfEverySampleLine) {
  const std::vector<PrometheusSample> samples = ParsePrometheusText(
      "# HELP parasync_x_total Things.\n"
      "# TYPE parasync_x_total counter\n"
      "parasync_x_total 3\n"
      "parasync_y{role=\"ps\",note=\"a \\\"b\\\" \\\\ c\\nd, e}\",} 2.5e-3 1700000000000\n"
      "parasync_z_bucket{le=\"+Inf\"}\t+Inf\r\n"
      "\n");
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[0].name, "parasync_x_total");
  EXPECT_TRUE(samples[0].labels.empty());
  EXPECT_EQ(samples[0].value, 3);
  EXPECT_EQ(samples[1].name, "parasync_y");
  EXPECT_EQ(samples[1].labels, (PrometheusLabels{{"role", "ps"}, {"note", "a \"b\" \\ c\nd, e}"}}));
  EXPECT_EQ(samples[1].value, 2.5e-3);
  EXPECT_EQ(samples[2].labels, (PrometheusLabels{{"le", "+Inf"}}));
  EXPECT_TRUE(std::isinf(samples[2].value));
}

TEST(PrometheusTextTest, SkipsTheHttpHeadAndLinesThatAreNotSamples) {
  const std::vector<PrometheusSample> samples = ParsePrometheusText(
      "HTTP/1.1 200 OK\r\n"
      "Content-Type: text/plain; version=0.0.4\r\n"
      "X: 5\r\n"
      "\r\n"
      "good 1\n"
      "unterminated{a=\"b\" 2\n"
      "no_value\n"
      "not_a_number{a=\"b\"} x\n"
      "trailing 1 2 3\n"
      "{a=\"b\"} 4\n");
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].name, "good");
}

TEST(PrometheusTextTest, ValueIsTheFirstSampleOfThatExactNameHavingEveryLabelAsked) {
  const std::string page =
      "requests_total_seconds 9\n"
      "requests_total{type=\"pull\",shard=\"0\"} 1\n"
      "requests_total{type=\"push\",shard=\"0\"} 2\n"
      "requests_total{type=\"push\",shard=\"1\"} 3\n";
  EXPECT_EQ(PrometheusValue(page, "requests_total"), 1);
  EXPECT_EQ(PrometheusValue(page, "requests_total", {{"type", "push"}}), 2);
  EXPECT_EQ(PrometheusValue(page, "requests_total", {{"shard", "1"}, {"type", "push"}}), 3);
  EXPECT_EQ(PrometheusValue(page, "requests_total", {{"type", "leave"}}), std::nullopt);
  EXPECT_EQ(PrometheusValue(page, "requests_total", {{"role", "ps"}}), std::nullopt);
  EXPECT_EQ(PrometheusValue(page, "requests"), std::nullopt);
}

}  // namespace
}  // namespace parasync::testing
