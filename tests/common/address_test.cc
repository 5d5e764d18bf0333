#include "common/address.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace parasync {
namespace {

bool Mentions(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CheckHostTest, AcceptsDottedQuadsIpv6AndHostNames) {
  for (const char* host : {"0.0.0.0", "127.0.0.1", "255.255.255.255", "10.1.2.3", "::1",
                           "[::1]", "fe80::1", "localhost", "node-1", "ps-0.ps.default.svc",
                           "parasync_ps_1", "example.org.", "2node"}) {
    EXPECT_TRUE(CheckHost(host, "--flag").ok()) << host << ": " << CheckHost(host, "--flag").message();
  }
}

TEST(CheckHostTest, RefusesWhatLibrariesWouldReadTheirOwnWayNamingFlagAndText) {
  // 999.1.1.1 is what civetweb bound as 231.1.1.1; 10.1, 0x7f.1 and 017.0.0.1 are
  // inet_aton's short, hexadecimal and octal forms.
  for (const char* host : {"999.1.1.1", "256.0.0.1", "1.2.3.4.5", "1.2.3", "10.1", "2",
                           "0x7f.1", "017.0.0.1", "1..2.3", "-node", "a b", "node@x", "",
                           "::g", "a..b"}) {
    const Status s = CheckHost(host, "--metrics-bind");
    ASSERT_FALSE(s.ok()) << host << " was accepted";
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(s.message(), "--metrics-bind '" + std::string(host) + "'")) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one line: " << s.message();
  }
}

TEST(ParseHostPortTest, SplitsHostAndPortAndChecksTheRange) {
  auto a = ParseHostPort("10.0.0.1:5000", "--ps-hosts", PortRule::kNonZero);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->host, "10.0.0.1");
  EXPECT_EQ(a->port, 5000);
  auto v6 = ParseHostPort("[::1]:65535", "--ps-hosts", PortRule::kNonZero);
  ASSERT_TRUE(v6.ok()) << v6.status().ToString();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 65535);
  EXPECT_TRUE(ParseHostPort("h:0", "--bind", PortRule::kZeroAllowed).ok());
  for (const char* bad : {"h:0", "h:65536", "h:-1", "h:", "h", ":1", "999.1.1.1:5000",
                          "::1:5000", "[::1]5000", "h:5000x"}) {
    EXPECT_FALSE(ParseHostPort(bad, "--ps-hosts", PortRule::kNonZero).ok()) << bad;
  }
}

TEST(ResolveBindHostTest, KeepsAddressesResolvesNamesAndRefusesTheRest) {
  EXPECT_EQ(*ResolveBindHost("*", "--bind"), "*");
  EXPECT_EQ(*ResolveBindHost("0.0.0.0", "--bind"), "0.0.0.0");
  EXPECT_EQ(*ResolveBindHost("[::1]", "--bind"), "::1");
  auto local = ResolveBindHost("localhost", "--bind");
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_EQ(local->rfind("127.", 0), 0u) << *local;
  const auto wrapped = ResolveBindHost("999.1.1.1", "--metrics-bind");
  ASSERT_FALSE(wrapped.ok()) << "became " << *wrapped;
  EXPECT_TRUE(Mentions(wrapped.status().message(), "'999.1.1.1'")) << wrapped.status().message();
  const auto unknown = ResolveBindHost("no-such-host.invalid", "--metrics-bind");
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(Mentions(unknown.status().message(), "does not resolve")) << unknown.status().message();
}

TEST(CheckDistinctAddressesTest, RefusesTheSameAddressTwiceNamingIt) {
  EXPECT_TRUE(CheckDistinctAddresses({"a:1", "a:2", "b:1"}, "--ps-hosts").ok());
  const Status twice = CheckDistinctAddresses({"a:1", "b:2", "a:1"}, "--ps-hosts");
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(twice.message(), "--ps-hosts names one address twice: 'a:1'"))
      << twice.message();
  // The same host spelled differently, where that is certain without a lookup.
  const Status spelled = CheckDistinctAddresses({"localhost:5000", "127.0.0.1:5000"}, "--ps-hosts");
  ASSERT_FALSE(spelled.ok());
  EXPECT_TRUE(Mentions(spelled.message(), "'localhost:5000' and '127.0.0.1:5000'"))
      << spelled.message();
  EXPECT_FALSE(CheckDistinctAddresses({"Node1:5000", "node1:5000"}, "--ps-hosts").ok());
  EXPECT_FALSE(CheckDistinctAddresses({"999.1.1.1:5000"}, "--ps-hosts").ok());
}

}  // namespace
}  // namespace parasync
