#include "comm/comm_limits_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace kc::comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The admin file is the only input LoadCommLimits takes, so every test writes one.
class CommLimitsConfigTest : public ::testing::Test {
 protected:
  Result<CommLimits> Load(const std::string& text) {
    path_ = ::testing::TempDir() + "comm_limits_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".yaml";
    std::ofstream(path_) << text;
    return LoadCommLimits(path_);
  }
  // The message of a load that must fail with kInvalidArgument.
  std::string LoadError(const std::string& text) {
    Result<CommLimits> limits = Load(text);
    EXPECT_FALSE(limits.ok());
    if (limits.ok()) return "";
    EXPECT_EQ(limits.status().code(), ErrorCode::kInvalidArgument) << limits.status();
    return limits.status().message();
  }

  std::string path_;
};

TEST_F(CommLimitsConfigTest, AnEmptyFileGivesTheDefaults) {
  Result<CommLimits> limits = Load("");
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_EQ(limits->default_limit.ops_per_second, RateLimit{}.ops_per_second);
  EXPECT_EQ(limits->default_limit.bytes_per_second, 10e9);
  EXPECT_EQ(limits->default_limit.burst_ops, 1000);
  EXPECT_EQ(limits->default_limit.burst_bytes, 256e6);
  EXPECT_TRUE(limits->jobs.empty());
  EXPECT_EQ(limits->lanes.chunk_bytes, 256 * 1024);
  EXPECT_EQ(limits->lanes.queue_chunks, 1024);
  EXPECT_EQ(limits->lanes.low_lane_min_share, 0.05);
  EXPECT_EQ(limits->lanes.priority, LaneOptions{}.priority);
}

TEST_F(CommLimitsConfigTest, ReadsRatesLanesAndJobEntries) {
  Result<CommLimits> limits = Load(
      "rate_limits:\n"
      "  default: {ops_per_second: 5000, bytes_per_second_gb: 2.5, burst_ops: 100, "
      "burst_mb: 64}\n"
      "  jobs:\n"
      "    - {job: \"team-a/*\", ops_per_second: 200}\n"
      "    - {job: team-b/eval, bytes_per_second_gb: 0.5, burst_mb: 1}\n"
      "lanes:\n"
      "  chunk_kib: 64\n"
      "  queue_chunks: 512\n"
      "  low_lane_min_share: 0.1\n"
      "  priority: [activation, gradient, control, telemetry]\n");
  ASSERT_TRUE(limits.ok()) << limits.status();
  const RateLimit& d = limits->default_limit;
  EXPECT_EQ(d.ops_per_second, 5000);
  EXPECT_EQ(d.bytes_per_second, 2.5e9);
  EXPECT_EQ(d.burst_ops, 100);
  EXPECT_EQ(d.burst_bytes, 64e6);
  ASSERT_EQ(limits->jobs.size(), 2u);
  EXPECT_EQ(limits->jobs[0].pattern, "team-a/*");
  EXPECT_EQ(limits->jobs[0].limit.ops_per_second, 200);
  EXPECT_EQ(limits->jobs[0].limit.bytes_per_second, 2.5e9);  // from the default
  EXPECT_EQ(limits->jobs[1].limit.bytes_per_second, 0.5e9);
  EXPECT_EQ(limits->jobs[1].limit.burst_bytes, 1e6);
  EXPECT_EQ(limits->jobs[1].limit.ops_per_second, 5000);
  EXPECT_EQ(limits->lanes.chunk_bytes, 64 * 1024);
  EXPECT_EQ(limits->lanes.queue_chunks, 512);
  EXPECT_EQ(limits->lanes.low_lane_min_share, 0.1);
  EXPECT_THAT(limits->lanes.priority,
              ElementsAre(Lane::kActivation, Lane::kGradient, Lane::kControl, Lane::kTelemetry));
}

// What kcd hands an agent reads back to the same values, job entries and odd patterns included.
TEST_F(CommLimitsConfigTest, FormattedLimitsReadBackTheSame) {
  Result<CommLimits> limits = Load(
      "rate_limits:\n"
      "  default: {ops_per_second: 5000.5, bytes_per_second_gb: 2.5, burst_ops: 100, "
      "burst_mb: 64}\n"
      "  jobs:\n"
      "    - {job: \"team-a/*\", ops_per_second: 200}\n"
      "    - {job: \"odd: \\\"name\\\" #1\", bytes_per_second_gb: 0.3}\n"
      "lanes:\n"
      "  chunk_kib: 64\n"
      "  low_lane_min_share: 0.1\n"
      "  priority: [activation, gradient, control, telemetry]\n");
  ASSERT_TRUE(limits.ok()) << limits.status();
  Result<CommLimits> back = LoadCommLimitsString(FormatCommLimits(*limits), "formatted");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << FormatCommLimits(*limits);
  const auto same = [](const RateLimit& a, const RateLimit& b) {
    return a.ops_per_second == b.ops_per_second && a.bytes_per_second == b.bytes_per_second &&
           a.burst_ops == b.burst_ops && a.burst_bytes == b.burst_bytes;
  };
  EXPECT_TRUE(same(back->default_limit, limits->default_limit));
  ASSERT_EQ(back->jobs.size(), 2u);
  EXPECT_EQ(back->jobs[1].pattern, "odd: \"name\" #1");
  EXPECT_TRUE(same(back->jobs[1].limit, limits->jobs[1].limit));
  EXPECT_EQ(back->lanes.chunk_bytes, limits->lanes.chunk_bytes);
  EXPECT_EQ(back->lanes.low_lane_min_share, 0.1);
  EXPECT_EQ(back->lanes.priority, limits->lanes.priority);
  EXPECT_EQ(DescribeCommLimits(back->jobs[0].limit, back->lanes),
            "200 ops/s, 2.5 GB/s (bursts of 100 ops, 64 MB); lanes activation > gradient > "
            "control > telemetry, 64 KiB chunks, 10% kept for the lower lanes");
}

TEST_F(CommLimitsConfigTest, ForJobPicksTheMostSpecificMatch) {
  Result<CommLimits> limits = Load(
      "rate_limits:\n"
      "  default: {ops_per_second: 1}\n"
      "  jobs:\n"
      "    - {job: \"*\", ops_per_second: 2}\n"
      "    - {job: \"team-a/*\", ops_per_second: 3}\n"
      "    - {job: \"team-a/train-*\", ops_per_second: 4}\n"
      "    - {job: team-a/train-7, ops_per_second: 5}\n"
      "    - {job: \"team-a/train-?\", ops_per_second: 6}\n"
      "    - {job: \"team-?/train-*\", ops_per_second: 7}\n");
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_EQ(limits->ForJob("team-a/train-7").ops_per_second, 5);  // exact beats every glob
  EXPECT_EQ(limits->ForJob("team-a/train-8").ops_per_second, 6);  // 13 literals, no '*'
  EXPECT_EQ(limits->ForJob("team-a/train-10").ops_per_second, 4);
  EXPECT_EQ(limits->ForJob("team-b/train-10").ops_per_second, 7);
  EXPECT_EQ(limits->ForJob("team-a/eval").ops_per_second, 3);
  EXPECT_EQ(limits->ForJob("other").ops_per_second, 2);

  Result<CommLimits> no_catch_all = Load(
      "rate_limits:\n"
      "  default: {ops_per_second: 1}\n"
      "  jobs:\n"
      "    - {job: \"a*\", ops_per_second: 2}\n"
      "    - {job: \"*a\", ops_per_second: 3}\n");
  ASSERT_TRUE(no_catch_all.ok()) << no_catch_all.status();
  EXPECT_EQ(no_catch_all->ForJob("b").ops_per_second, 1);
  EXPECT_EQ(no_catch_all->ForJob("aa").ops_per_second, 2);  // a tie: the earlier entry
}

TEST(JobPatternTest, MatchesGlobs) {
  EXPECT_TRUE(JobPatternMatches("*", ""));
  EXPECT_TRUE(JobPatternMatches("*", "team-a/x/y"));
  EXPECT_TRUE(JobPatternMatches("team-a/*", "team-a/x/y"));
  EXPECT_FALSE(JobPatternMatches("team-a/*", "team-b/x"));
  EXPECT_TRUE(JobPatternMatches("a*b", "ab"));
  EXPECT_TRUE(JobPatternMatches("a*b", "axxbxb"));
  EXPECT_FALSE(JobPatternMatches("a*b", "axxbc"));
  EXPECT_TRUE(JobPatternMatches("a?c", "abc"));
  EXPECT_FALSE(JobPatternMatches("a?c", "ac"));
  EXPECT_TRUE(JobPatternMatches("exact", "exact"));
  EXPECT_FALSE(JobPatternMatches("exact", "exactly"));
  EXPECT_TRUE(JobPatternMatches("**x*", "yyx"));
}

TEST_F(CommLimitsConfigTest, RejectsAnUnknownKeyWithItsPosition) {
  const std::string error = LoadError(
      "rate_limits:\n"
      "  default: {ops_per_secnd: 5}\n");
  EXPECT_THAT(error, StartsWith(path_ + ":2: rate_limits.default.ops_per_secnd: unknown key"));
}

TEST_F(CommLimitsConfigTest, RejectsANegativeRate) {
  const std::string error = LoadError(
      "rate_limits:\n"
      "  jobs:\n"
      "    - job: team-a/train\n"
      "      ops_per_second: -5\n");
  EXPECT_THAT(error, StartsWith(path_ + ":4: rate_limits.jobs[0].ops_per_second: expected a "
                                        "positive number, got \"-5\""));
}

TEST_F(CommLimitsConfigTest, RejectsAnInfiniteRateAndAZeroBurst) {
  EXPECT_THAT(LoadError("rate_limits:\n  default: {bytes_per_second_gb: .inf}\n"),
              HasSubstr("rate_limits.default.bytes_per_second_gb: expected a finite number"));
  EXPECT_THAT(LoadError("rate_limits:\n  default: {burst_mb: 0}\n"),
              HasSubstr("rate_limits.default.burst_mb: expected a positive number"));
  EXPECT_THAT(LoadError("rate_limits:\n  default: {burst_ops: 0.5}\n"),
              HasSubstr("rate_limits.default.burst_ops: expected a number >= 1"));
}

TEST_F(CommLimitsConfigTest, RejectsTelemetryAboveGradient) {
  const std::string error = LoadError(
      "lanes:\n"
      "  priority: [telemetry, gradient, activation, control]\n");
  EXPECT_THAT(error,
              StartsWith(path_ + ":2: lanes.priority: telemetry cannot rank above gradient"));
  EXPECT_THAT(LoadError("lanes:\n  priority: [activation, telemetry, gradient, control]\n"),
              HasSubstr("telemetry cannot rank above gradient"));
}

TEST_F(CommLimitsConfigTest, RejectsABadPriorityList) {
  EXPECT_THAT(LoadError("lanes:\n  priority: [gradient, logging, control, telemetry]\n"),
              HasSubstr("priority[1]: unknown lane \"logging\""));
  EXPECT_THAT(LoadError("lanes:\n  priority: [gradient, gradient, control, telemetry]\n"),
              HasSubstr("lane \"gradient\" is named twice"));
  EXPECT_THAT(LoadError("lanes:\n  priority: [gradient, control]\n"),
              HasSubstr("expected the 4 lanes"));
}

TEST_F(CommLimitsConfigTest, RejectsBadLaneValues) {
  EXPECT_THAT(LoadError("lanes:\n  low_lane_min_share: 0.7\n"),
              HasSubstr("lanes.low_lane_min_share: expected a number in [0, 0.5]"));
  EXPECT_THAT(LoadError("lanes:\n  chunk_kib: 0\n"), HasSubstr("lanes.chunk_kib: expected"));
  EXPECT_THAT(LoadError("lanes:\n  queue_chunks: 8.5\n"), HasSubstr("lanes.queue_chunks"));
}

TEST_F(CommLimitsConfigTest, RejectsBadJobEntries) {
  EXPECT_THAT(LoadError("rate_limits:\n"
                        "  jobs:\n"
                        "    - {job: a, ops_per_second: 1}\n"
                        "    - {job: a, ops_per_second: 2}\n"),
              HasSubstr(":4: rate_limits.jobs[1].job: duplicate job pattern (first at "
                        "rate_limits.jobs[0])"));
  EXPECT_THAT(LoadError("rate_limits:\n  jobs:\n    - {job: \"\"}\n"),
              HasSubstr("rate_limits.jobs[0].job: expected a job name or glob"));
  EXPECT_THAT(LoadError("rate_limits:\n  jobs:\n    - {ops_per_second: 1}\n"),
              HasSubstr("rate_limits.jobs[0].job"));
}

TEST_F(CommLimitsConfigTest, AMissingFileIsNotFound) {
  Result<CommLimits> limits =
      LoadCommLimits(::testing::TempDir() + "comm_limits_no_such_file.yaml");
  EXPECT_EQ(limits.status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace kc::comm
