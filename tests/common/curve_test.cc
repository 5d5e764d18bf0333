#include "common/curve.h"

#include <gtest/gtest.h>

#include <string>

namespace parasync {
namespace {

TEST(ClassifyServerHandshakeEventTest, TellsMechanismMismatchFromBadKeysAndLeavesZapDenialsToZap) {
  EXPECT_EQ(ClassifyServerHandshakeEvent(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL,
                                         ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH),
            CurveRefusal::kPlainTextClient);
  EXPECT_EQ(ClassifyServerHandshakeEvent(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL,
                                         ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC),
            CurveRefusal::kBadKeyOrSecret);
  EXPECT_EQ(ClassifyServerHandshakeEvent(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL,
                                         ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_HELLO),
            CurveRefusal::kOther);
  EXPECT_EQ(ClassifyServerHandshakeEvent(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, 104),
            CurveRefusal::kOther);
  // The ZapAuthenticator counts its own denials (400); other statuses are no decision of it.
  EXPECT_EQ(ClassifyServerHandshakeEvent(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, 400), std::nullopt);
  EXPECT_EQ(ClassifyServerHandshakeEvent(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, 500),
            CurveRefusal::kOther);
  EXPECT_EQ(ClassifyServerHandshakeEvent(ZMQ_EVENT_HANDSHAKE_SUCCEEDED, 0), std::nullopt);
  EXPECT_EQ(ClassifyServerHandshakeEvent(ZMQ_EVENT_ACCEPTED, 12), std::nullopt);
  EXPECT_EQ(ClassifyServerHandshakeEvent(ZMQ_EVENT_DISCONNECTED, 12), std::nullopt);
}

TEST(CurveRefusalNameTest, NamesAreTheMetricLabels) {
  EXPECT_STREQ(CurveRefusalName(CurveRefusal::kPlainTextClient), "plain_text_client");
  EXPECT_STREQ(CurveRefusalName(CurveRefusal::kBadKeyOrSecret), "bad_key_or_secret");
  EXPECT_STREQ(CurveRefusalName(CurveRefusal::kNotAllowed), "not_allowed");
  EXPECT_STREQ(CurveRefusalName(CurveRefusal::kOther), "other");
}

TEST(RefusalLogSuppressedBeforeTest, LogsTheFirstTwentyThenEveryThousandthWithTheGap) {
  for (uint64_t n = 1; n <= 20; ++n) EXPECT_EQ(RefusalLogSuppressedBefore(n), uint64_t{0}) << n;
  EXPECT_EQ(RefusalLogSuppressedBefore(21), std::nullopt);
  EXPECT_EQ(RefusalLogSuppressedBefore(999), std::nullopt);
  EXPECT_EQ(RefusalLogSuppressedBefore(1000), uint64_t{979});  // 21..999
  EXPECT_EQ(RefusalLogSuppressedBefore(1001), std::nullopt);
  EXPECT_EQ(RefusalLogSuppressedBefore(2000), uint64_t{999});  // 1001..1999
  uint64_t logged = 0;
  for (uint64_t n = 1; n <= 100000; ++n) logged += RefusalLogSuppressedBefore(n).has_value();
  EXPECT_EQ(logged, 20u + 100u);
}

}  // namespace
}  // namespace parasync
