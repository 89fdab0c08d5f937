#include "parallel/timeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

namespace kc::parallel {
namespace {

TEST(TimelineTest, WritesCompleteEventsPerRankAndSumsByKind) {
  Timeline t(4);
  const Timeline::Clock::time_point t0{std::chrono::microseconds(1000)};
  t.Add("forward", SpanKind::kCompute, 0, t0, t0 + std::chrono::microseconds(250));
  t.Add("wait", SpanKind::kComm, 0, t0 + std::chrono::microseconds(250),
        t0 + std::chrono::microseconds(300));
  t.Add("backward", SpanKind::kCompute, 1, t0 + std::chrono::microseconds(300),
        t0 + std::chrono::microseconds(800));
  EXPECT_EQ(t.size(), 3u);
  EXPECT_NEAR(t.Seconds(SpanKind::kCompute), 750e-6, 1e-12);
  EXPECT_NEAR(t.Seconds(SpanKind::kComm), 50e-6, 1e-12);
  EXPECT_EQ(t.Seconds(SpanKind::kData), 0);

  // Two ranks' events joined as the launcher joins them parse as one trace.
  const std::string joined =
      "{\"traceEvents\":[" + t.ChromeTraceEvents(0) + ",\n" + t.ChromeTraceEvents(3) + "]}";
  const nlohmann::json trace = nlohmann::json::parse(joined);
  const nlohmann::json& events = trace["traceEvents"];
  ASSERT_EQ(events.size(), 2u * (2 + 3));
  EXPECT_EQ(events[0]["ph"], "M");
  EXPECT_EQ(events[0]["args"]["name"], "rank 0");
  const nlohmann::json& forward = events[2];
  EXPECT_EQ(forward["name"], "forward");
  EXPECT_EQ(forward["cat"], "compute");
  EXPECT_EQ(forward["ph"], "X");
  EXPECT_DOUBLE_EQ(forward["ts"].get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(forward["dur"].get<double>(), 250.0);
  EXPECT_EQ(events[4]["args"]["step"], 1);
  EXPECT_EQ(events[5]["args"]["name"], "rank 3");
  EXPECT_EQ(events[9]["pid"], 3);
  t.Clear();
  EXPECT_EQ(t.size(), 0u);
}

}  // namespace
}  // namespace kc::parallel
