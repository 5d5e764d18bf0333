#include "common/cluster_spec.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace parasync {
namespace {

using Strings = std::vector<std::string>;

bool Names(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const char kTfConfig[] = R"({
  "cluster": {
    "ps": ["ps0.example:2222", "ps1.example:2222"],
    "worker": ["w0.example:2222", "w1.example:2222", "w2.example:2222"]
  },
  "task": {"type": "worker", "index": 2}
})";

TEST(ParseTfConfigTest, ReadsClusterAndTask) {
  Result<ClusterSpec> spec = ParseTfConfig(kTfConfig);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->ps, (Strings{"ps0.example:2222", "ps1.example:2222"}));
  EXPECT_EQ(spec->workers, (Strings{"w0.example:2222", "w1.example:2222", "w2.example:2222"}));
  EXPECT_EQ(spec->task_type, "worker");
  EXPECT_EQ(spec->task_index, 2);
}

TEST(ParseTfConfigTest, ChiefBecomesWorkerZero) {
  Result<ClusterSpec> spec = ParseTfConfig(R"({
    "cluster": {"chief": ["c:1000"], "worker": ["w0:1001", "w1:1002"], "ps": ["p:2000"]},
    "task": {"type": "chief", "index": 0}})");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->workers, (Strings{"c:1000", "w0:1001", "w1:1002"}));
  EXPECT_EQ(spec->task_type, "worker");
  EXPECT_EQ(spec->task_index, 0);
}

TEST(ParseTfConfigTest, WorkerIndexCountsPastChief) {
  // In TensorFlow, worker index 0 is the first "worker" entry, not the chief. With the chief
  // prepended as worker 0 here, that process is rank 1; two processes must never share a rank.
  const char* cluster = R"("cluster": {"chief": ["c:1000"], "worker": ["w0:1001", "w1:1002"],
                                        "ps": ["p:2000"]})";
  Result<ClusterSpec> w0 =
      ParseTfConfig(std::string("{") + cluster + R"(, "task": {"type": "worker", "index": 0}})");
  Result<ClusterSpec> w1 =
      ParseTfConfig(std::string("{") + cluster + R"(, "task": {"type": "worker", "index": 1}})");
  ASSERT_TRUE(w0.ok() && w1.ok());
  EXPECT_EQ(w0->workers[static_cast<size_t>(w0->task_index)], "w0:1001");
  EXPECT_EQ(w1->workers[static_cast<size_t>(w1->task_index)], "w1:1002");
}

TEST(ParseTfConfigTest, MissingTaskLeavesDefaults) {
  Result<ClusterSpec> spec = ParseTfConfig(R"({"cluster": {"ps": ["p:1"]}})");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->task_type, "");
  EXPECT_EQ(spec->task_index, 0);
  EXPECT_TRUE(spec->workers.empty());
}

TEST(ParseTfConfigTest, RejectsMalformedJson) {
  for (const char* text : {"", "{", "not json", R"({"cluster": })", "[1, 2]", "42"}) {
    Result<ClusterSpec> spec = ParseTfConfig(text);
    ASSERT_FALSE(spec.ok()) << "'" << text << "' was accepted";
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(ParseTfConfigTest, RejectsFieldsOfWrongType) {
  for (const char* text : {R"({"cluster": []})", R"({"cluster": {"ps": "p:1"}})",
                           R"({"cluster": {"ps": [1]}})", R"({"task": "ps"})",
                           R"({"task": {"type": 3}})", R"({"task": {"index": "0"}})"}) {
    Result<ClusterSpec> spec = ParseTfConfig(text);
    ASSERT_FALSE(spec.ok()) << text << " was accepted";
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << text;
  }
}

TEST(ResolveClusterSpecTest, UsesTfConfigWhenNoFlags) {
  Result<ClusterSpec> spec = ResolveClusterSpec({}, std::string(kTfConfig), "worker");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->ps.size(), 2u);
  EXPECT_EQ(spec->workers.size(), 3u);
  EXPECT_EQ(spec->task_type, "worker");
  EXPECT_EQ(spec->task_index, 2);
}

TEST(ResolveClusterSpecTest, FlagsOverrideTfConfigFieldByField) {
  ClusterFlags flags;
  flags.ps_hosts = "10.0.0.1:5000";
  Result<ClusterSpec> spec = ResolveClusterSpec(flags, std::string(kTfConfig), "worker");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->ps, (Strings{"10.0.0.1:5000"}));
  EXPECT_EQ(spec->workers.size(), 3u);  // still from TF_CONFIG
  EXPECT_EQ(spec->task_index, 2);       // still from TF_CONFIG

  flags = ClusterFlags{};
  flags.worker_hosts = "a:1,b:2";
  flags.task_index = 1;
  spec = ResolveClusterSpec(flags, std::string(kTfConfig), "worker");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->ps, (Strings{"ps0.example:2222", "ps1.example:2222"}));
  EXPECT_EQ(spec->workers, (Strings{"a:1", "b:2"}));
  EXPECT_EQ(spec->task_index, 1);
}

TEST(ResolveClusterSpecTest, FlagsAloneSuffice) {
  ClusterFlags flags;
  flags.ps_hosts = "127.0.0.1:5000, 127.0.0.1:5001";
  flags.worker_hosts = "127.0.0.1:6000";
  flags.task_index = 1;
  Result<ClusterSpec> spec = ResolveClusterSpec(flags, std::nullopt, "ps");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->ps, (Strings{"127.0.0.1:5000", "127.0.0.1:5001"}));
  EXPECT_EQ(spec->task_type, "ps");
  EXPECT_EQ(spec->task_index, 1);
}

TEST(ResolveClusterSpecTest, EmptyTfConfigIsIgnored) {
  ClusterFlags flags;
  flags.ps_hosts = "h:1";
  flags.worker_hosts = "h:2";
  EXPECT_TRUE(ResolveClusterSpec(flags, std::string(""), "worker").ok());
}

TEST(ResolveClusterSpecTest, RejectsClusterWithoutPs) {
  ClusterFlags flags;
  flags.worker_hosts = "h:2";
  Result<ClusterSpec> spec = ResolveClusterSpec(flags, std::nullopt, "worker");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Names(spec.status().message(), "parameter server")) << spec.status().message();
}

TEST(ResolveClusterSpecTest, RejectsClusterWithoutWorkers) {
  ClusterFlags flags;
  flags.ps_hosts = "h:1";
  EXPECT_EQ(ResolveClusterSpec(flags, std::nullopt, "ps").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ResolveClusterSpecTest, RejectsBadPortsAndNamesTheAddress) {
  for (const char* ps : {"h:0", "h:65536", "h:-1", "h:port", "h:", "h", ":80", "h:80x"}) {
    ClusterFlags flags;
    flags.ps_hosts = ps;
    flags.worker_hosts = "w:1";
    Result<ClusterSpec> spec = ResolveClusterSpec(flags, std::nullopt, "worker");
    ASSERT_FALSE(spec.ok()) << ps << " was accepted";
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << ps;
    EXPECT_TRUE(Names(spec.status().message(), ps)) << spec.status().message();
  }
}

TEST(ResolveClusterSpecTest, RejectsTheSameAddressTwiceNamingIt) {
  ClusterFlags flags;
  flags.ps_hosts = "127.0.0.1:5000,127.0.0.1:5000";
  flags.worker_hosts = "w:1";
  Result<ClusterSpec> spec = ResolveClusterSpec(flags, std::nullopt, "worker");
  ASSERT_FALSE(spec.ok()) << "a duplicate PS address was accepted";
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Names(spec.status().message(), "--ps-hosts names one address twice: '127.0.0.1:5000'"))
      << spec.status().message();
  flags.ps_hosts = "p:1";
  flags.worker_hosts = "w:1,W:1";
  EXPECT_FALSE(ResolveClusterSpec(flags, std::nullopt, "worker").ok());
  // From TF_CONFIG too, named as such.
  spec = ResolveClusterSpec(
      {}, std::string(R"({"cluster":{"ps":["p:1","p:1"],"worker":["w:1"]},"task":{"type":"worker","index":0}})"),
      "worker");
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(Names(spec.status().message(), "TF_CONFIG cluster.ps")) << spec.status().message();
}

TEST(ResolveClusterSpecTest, RejectsHostsThatAreNotAddresses) {
  for (const char* ps : {"999.1.1.1:5000", "1.2.3:5000", "bad host:5000", "-x:5000"}) {
    ClusterFlags flags;
    flags.ps_hosts = ps;
    flags.worker_hosts = "w:1";
    Result<ClusterSpec> spec = ResolveClusterSpec(flags, std::nullopt, "worker");
    ASSERT_FALSE(spec.ok()) << ps << " was accepted";
    EXPECT_TRUE(Names(spec.status().message(), ps)) << spec.status().message();
  }
}

TEST(ResolveClusterSpecTest, AcceptsPortBounds) {
  ClusterFlags flags;
  flags.ps_hosts = "h:1,h:65535";
  flags.worker_hosts = "w:1";
  EXPECT_TRUE(ResolveClusterSpec(flags, std::nullopt, "ps").ok());
}

TEST(ResolveClusterSpecTest, RejectsTaskIndexOutOfRange) {
  ClusterFlags flags;
  flags.ps_hosts = "p:1,p:2";
  flags.worker_hosts = "w:1";
  for (int index : {-1, 2}) {
    flags.task_index = index;
    Result<ClusterSpec> spec = ResolveClusterSpec(flags, std::nullopt, "ps");
    ASSERT_FALSE(spec.ok()) << index;
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Names(spec.status().message(), std::to_string(index)));
  }
  // Index 1 is a valid ps but not a valid worker (one worker).
  flags.task_index = 1;
  EXPECT_TRUE(ResolveClusterSpec(flags, std::nullopt, "ps").ok());
  EXPECT_FALSE(ResolveClusterSpec(flags, std::nullopt, "worker").ok());
}

TEST(ResolveClusterSpecTest, RejectsTfConfigIndexOutOfRange) {
  Result<ClusterSpec> spec = ResolveClusterSpec(
      {}, std::string(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]},
                          "task": {"type": "worker", "index": 1}})"),
      "worker");
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
}

TEST(ResolveClusterSpecTest, RejectsMalformedTfConfig) {
  Result<ClusterSpec> spec = ResolveClusterSpec({}, std::string("{\"cluster\": "), "worker");
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
}

TEST(ResolveClusterSpecTest, RejectsTfConfigTaskTypeMismatch) {
  Result<ClusterSpec> spec = ResolveClusterSpec({}, std::string(kTfConfig), "ps");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Names(spec.status().message(), "worker")) << spec.status().message();
  EXPECT_TRUE(Names(spec.status().message(), "ps")) << spec.status().message();
}

TEST(SplitHostListTest, TrimsWhitespaceAndDropsEmptyItems) {
  EXPECT_EQ(SplitHostList(" a:1 ,\tb:2,, ,c:3,"), (Strings{"a:1", "b:2", "c:3"}));
}

TEST(SplitHostListTest, EmptyAndBlankGiveNothing) {
  EXPECT_TRUE(SplitHostList("").empty());
  EXPECT_TRUE(SplitHostList(" , ,").empty());
}

TEST(SplitHostListTest, SingleItemWithoutComma) { EXPECT_EQ(SplitHostList("h:1"), (Strings{"h:1"})); }

}  // namespace
}  // namespace parasync
