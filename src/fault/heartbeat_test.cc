#include "fault/heartbeat.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <thread>

#include "comm/hash_store.h"
#include "comm/tcp_store.h"
#include "tests/support/temp_dir.h"

namespace kc::fault {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Clock = HeartbeatMonitor::Clock;

Clock::time_point At(Clock::time_point t0, double s) {
  return t0 + std::chrono::duration_cast<Clock::duration>(Seconds(s));
}

TEST(HeartbeatTest, BeatsUntilDestroyed) {
  comm::HashStore store;
  auto beat = Heartbeat::Start(&store, 3, Seconds(0.001));
  ASSERT_TRUE(beat.ok()) << beat.status();
  // The first beat is there when Start returns.
  const std::string keys[1] = {HeartbeatKey(3)};
  EXPECT_TRUE(*store.Check(keys));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((*beat)->beats() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_GE((*beat)->beats(), 3);
  beat->reset();  // joins
  auto v = store.Get(HeartbeatKey(3), store.clock()->Now());
  ASSERT_TRUE(v.ok());
  EXPECT_GE(std::stoll(*v), 3);
}

// A rank that stops beating is reported once, within timeout + period of its last beat when
// checked every period / 2; a rank never heard from counts from the start.
TEST(HeartbeatTest, MonitorReportsSilentRanksWithinTimeoutPlusAPeriod) {
  comm::HashStore store;
  const Clock::time_point t0 = Clock::now();
  HeartbeatMonitor monitor(
      &store, 3, {.period = Seconds(0.2), .timeout = Seconds(1.0), .first_beat = Seconds(2.0)}, t0);
  // Ranks 0 and 1 beat every 0.2 s until rank 1 stops after its beat at 1.0 s; rank 2 never.
  double last_beat_1 = 0;
  std::vector<std::pair<double, int>> reports;
  int64_t beats = 0;
  for (double t = 0; t <= 4.0; t += 0.1) {  // checks every period / 2
    if (static_cast<int>(std::lround(t * 10)) % 2 == 0) {
      ++beats;
      ASSERT_TRUE(store.Set(HeartbeatKey(0), std::to_string(beats)).ok());
      if (t <= 1.0 + 1e-9) {
        ASSERT_TRUE(store.Set(HeartbeatKey(1), std::to_string(beats)).ok());
        last_beat_1 = t;
      }
    }
    for (int r : monitor.Check(At(t0, t))) reports.emplace_back(t, r);
  }
  ASSERT_EQ(reports.size(), 2u);
  // Rank 1 stopped after its beat at 1.0 s; rank 2, never heard from, had 2 s to start.
  EXPECT_EQ(reports[0].second, 1);
  EXPECT_GT(reports[0].first - last_beat_1, 1.0);
  EXPECT_LE(reports[0].first - last_beat_1, 1.0 + 0.2 + 1e-9);
  EXPECT_EQ(reports[1].second, 2);
  EXPECT_GT(reports[1].first, 2.0);
  EXPECT_LE(reports[1].first, 2.0 + 0.2 + 1e-9);
  EXPECT_GT(monitor.silent_for(1).count(), 1.0);
  EXPECT_THAT(monitor.Check(At(t0, 4.1)), IsEmpty());  // each once; rank 0 still beats
}

TEST(HeartbeatTest, ForgottenRanksAreNotReported) {
  comm::HashStore store;
  const Clock::time_point t0 = Clock::now();
  HeartbeatMonitor monitor(
      &store, 2, {.period = Seconds(1), .timeout = Seconds(2), .first_beat = Seconds(2)}, t0);
  monitor.Forget(0);
  EXPECT_THAT(monitor.Check(At(t0, 5)), ElementsAre(1));
}

// Over TCP, as kc train runs it: the monitor hears a rank beating on its own connection (a
// Get whose deadline is now would fail before it is sent, and every rank would look silent).
TEST(HeartbeatTest, MonitorHearsBeatsOverTcp) {
  auto server = comm::TcpStoreServer::Start({.bind_address = "127.0.0.1", .port = 0});
  ASSERT_TRUE(server.ok()) << server.status();
  const TimePoint deadline = kc::Clock::Real()->Now() + std::chrono::seconds(30);
  auto worker = comm::TcpStoreClient::Connect("127.0.0.1", (*server)->port(), deadline);
  auto supervisor = comm::TcpStoreClient::Connect("127.0.0.1", (*server)->port(), deadline);
  ASSERT_TRUE(worker.ok() && supervisor.ok());
  const HeartbeatMonitor::Clock::time_point t0 = HeartbeatMonitor::Clock::now();
  HeartbeatMonitor monitor(supervisor->get(), 2,
                           {.period = Seconds(1), .timeout = Seconds(2), .first_beat = Seconds(2)},
                           t0);
  auto beat = Heartbeat::Start(worker->get(), 0, Seconds(1));
  ASSERT_TRUE(beat.ok()) << beat.status();
  // Rank 0's first beat is in the store: heard, whatever the time; rank 1 never beat.
  EXPECT_THAT(monitor.Check(At(t0, 10)), ElementsAre(1));
  EXPECT_THAT(monitor.Check(At(t0, 11)), IsEmpty());
}

// kc run's heartbeats: each rank touches its own file. A file not there yet is a rank not heard
// from; one whose time stops changing goes silent; a touch is heard again after Watch.
TEST(HeartbeatTest, FileBeatsAreHeardAndTheirSilenceReported) {
  kc::testing::TempDir dir("kc_beat");
  const std::string files[2] = {dir.Path("rank-0"), dir.Path("rank-1")};
  EXPECT_EQ(FileBeat(files[0]), std::nullopt);
  const Clock::time_point t0 = Clock::now();
  HeartbeatMonitor monitor([&](int rank) { return FileBeat(files[rank]); }, 2,
                           {.period = Seconds(1), .timeout = Seconds(2), .first_beat = Seconds(5)},
                           t0);
  ASSERT_TRUE(TouchFile(files[0]).ok());
  const std::optional<std::string> first = FileBeat(files[0]);
  ASSERT_TRUE(first.has_value());
  EXPECT_THAT(monitor.Check(At(t0, 1)), IsEmpty());  // rank 0 heard; rank 1 has 5 s to start
  // Rank 0 beats again (a time of its own, so that the change does not depend on the clock's
  // resolution), then stops.
  const timespec times[2] = {{.tv_sec = 1000, .tv_nsec = 0}, {.tv_sec = 1000, .tv_nsec = 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, files[0].c_str(), times, 0), 0);
  EXPECT_NE(FileBeat(files[0]), first);
  EXPECT_THAT(monitor.Check(At(t0, 2.5)), IsEmpty());       // heard at 2.5 s
  EXPECT_THAT(monitor.Check(At(t0, 4.4)), IsEmpty());       // 1.9 s silent
  EXPECT_THAT(monitor.Check(At(t0, 4.6)), ElementsAre(0));  // 2.1 s silent
  EXPECT_THAT(monitor.Check(At(t0, 5.1)), ElementsAre(1));  // never beat: 5.1 s from the start
  monitor.Watch(0, At(t0, 6));
  EXPECT_THAT(monitor.Check(At(t0, 6.5)), IsEmpty());  // the same file, heard again
}

TEST(HeartbeatTest, FileHeartbeatTouchesItsFile) {
  kc::testing::TempDir dir("kc_beat");
  const std::string file = dir.Path("rank-3");
  auto beat = Heartbeat::StartFile(file, Seconds(0.001));
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_TRUE(FileBeat(file).has_value());  // the first beat is there when StartFile returns
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((*beat)->beats() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_GE((*beat)->beats(), 3);
  beat->reset();
  EXPECT_THAT(Heartbeat::StartFile(dir.Path("no-such-dir/rank-0"), Seconds(1)).status().message(),
              HasSubstr("no-such-dir/rank-0"));
}

TEST(HeartbeatTest, OptionsAreChecked) {
  EXPECT_TRUE(ValidateHeartbeat({.period = Seconds(1), .timeout = Seconds(2)}).ok());
  EXPECT_THAT(ValidateHeartbeat({.period = Seconds(1), .timeout = Seconds(1.5)}).message(),
              HasSubstr("at least two periods"));
  EXPECT_THAT(ValidateHeartbeat({.period = Seconds(0), .timeout = Seconds(1)}).message(),
              HasSubstr("must be positive"));
  EXPECT_FALSE(Heartbeat::Start(nullptr, 0, Seconds(1)).ok());
}

// The hang report from what ranks published: per communicator, who waits in its newest
// operation and who has not entered it; groups a rank is not in do not count against it, and
// nothing waited for makes no report.
TEST(HangReportTest, NamesWhoHasNotEnteredWhatTheOthersWaitIn) {
  const TimePoint now = kc::Clock::Real()->Now();
  auto at = [&](const std::string& group, const char* op, uint64_t seq, bool done, double ago) {
    return comm::OpProgress{.group = group,
                            .op = op,
                            .seq = seq,
                            .bytes = 4000000,
                            .done = done,
                            .since = now - std::chrono::duration_cast<Duration>(Seconds(ago))};
  };
  // t=2: tp groups j/g0/sub0 (workers 0, 1) and j/g0/sub1 (2, 3); worker 3 stopped before
  // its tensor-parallel all-reduce #7; worker 1 and 2 are in theirs.
  const std::map<int, std::string> progress = {
      {0,
       ProgressToJson(
           {at("j/g0", "allreduce", 3, true, 1), at("j/g0/sub0", "allreduce", 7, true, 0.1)}, now)},
      {1,
       ProgressToJson(
           {at("j/g0", "allreduce", 3, true, 1), at("j/g0/sub0", "allreduce", 8, false, 2)}, now)},
      {2, ProgressToJson(
              {at("j/g0", "allreduce", 3, true, 1), at("j/g0/sub1", "allreduce", 7, false, 2.5)},
              now)},
      {3,
       ProgressToJson(
           {at("j/g0", "allreduce", 3, true, 1), at("j/g0/sub1", "allreduce", 6, true, 3)}, now)},
  };
  EXPECT_EQ(HangReport(progress),
            "allreduce #8 of j/g0/sub0 (4.0 MB): worker 0 has not entered it (last: allreduce #7, "
            "finished); worker 1 waits in it (2.0 s); allreduce #7 of j/g0/sub1 (4.0 MB): worker 3 "
            "has not entered it (last: allreduce #6, finished); worker 2 waits in it (2.5 s)");
  // Every one through its last operation: no report.
  EXPECT_EQ(HangReport({{0, ProgressToJson({at("j/g0", "barrier", 2, true, 0)}, now)},
                        {1, ProgressToJson({at("j/g0", "barrier", 2, true, 0)}, now)}}),
            "");
  // Waits shorter than the minimum are the flow of a healthy run: left out.
  EXPECT_EQ(HangReport(progress, 2.2),
            "allreduce #7 of j/g0/sub1 (4.0 MB): worker 3 has not entered it (last: allreduce #6, "
            "finished); worker 2 waits in it (2.5 s)");
  // A worker with no communicator (not yet built) has entered nothing.
  EXPECT_EQ(
      HangReport({{0, ProgressToJson({at("j/g1", "allreduce", 0, false, 1)}, now)}, {1, "[]"}}),
      "allreduce #0 of j/g1 (4.0 MB): worker 1 has not entered it (last: no communicator); "
      "worker 0 waits in it (1.0 s)");
}

}  // namespace
}  // namespace kc::fault
