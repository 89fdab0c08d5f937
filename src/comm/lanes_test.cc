#include "comm/lanes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"

namespace kc::comm {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::ElementsAre;

constexpr int64_t kKib = 1024;

class LaneSchedulerTest : public ::testing::Test {
 protected:
  std::unique_ptr<LaneScheduler> Make(const LaneOptions& options = {}) {
    Result<std::unique_ptr<LaneScheduler>> s = LaneScheduler::Create(options, &clock_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  TimePoint Far() const { return clock_.Now() + hours(1); }
  // Enqueues without waiting: a full lane gives kDeadlineExceeded at once.
  Status Put(LaneScheduler& s, Lane lane, uint64_t id, int64_t size_bytes) {
    return s.Enqueue(lane, WorkItem{.id = id, .size_bytes = size_bytes}, clock_.Now());
  }
  // The next chunk, which must be queued already.
  Chunk Take(LaneScheduler& s) {
    Result<Chunk> c = s.Next(clock_.Now());
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : Chunk{};
  }

  FakeClock clock_;
};

TEST(LaneTest, NamesRoundTrip) {
  for (Lane lane : kAllLanes) EXPECT_EQ(LaneFromName(LaneName(lane)), lane);
  EXPECT_EQ(LaneName(Lane::kTelemetry), "telemetry");
  EXPECT_EQ(LaneFromName("logging"), std::nullopt);
}

TEST(LaneTest, GuardIntervalFollowsTheMinimumShare) {
  LaneOptions o;
  EXPECT_EQ(o.StrictChunksPerGuardChunk(), 19);  // 0.05: 1 chunk in 20
  o.low_lane_min_share = 0.1;
  EXPECT_EQ(o.StrictChunksPerGuardChunk(), 9);
  o.low_lane_min_share = 0.3;  // 1 in 3 is at least 0.3
  EXPECT_EQ(o.StrictChunksPerGuardChunk(), 2);
  o.low_lane_min_share = 0.5;
  EXPECT_EQ(o.StrictChunksPerGuardChunk(), 1);
  o.low_lane_min_share = 0;
  EXPECT_EQ(o.StrictChunksPerGuardChunk(), 0);
}

TEST(LaneTest, OptionsRejectTelemetryAboveGradient) {
  LaneOptions o;
  o.priority = {Lane::kTelemetry, Lane::kGradient, Lane::kActivation, Lane::kControl};
  EXPECT_EQ(ValidateLaneOptions(o).code(), ErrorCode::kInvalidArgument);
  o.priority = {Lane::kActivation, Lane::kTelemetry, Lane::kGradient, Lane::kControl};
  EXPECT_EQ(ValidateLaneOptions(o).code(), ErrorCode::kInvalidArgument);
  FakeClock clock;
  EXPECT_EQ(LaneScheduler::Create(o, &clock).status().code(), ErrorCode::kInvalidArgument);
  o.priority = {Lane::kActivation, Lane::kGradient, Lane::kControl, Lane::kTelemetry};
  EXPECT_TRUE(ValidateLaneOptions(o).ok());
}

TEST(LaneTest, OptionsRejectBadValues) {
  LaneOptions o;
  o.chunk_bytes = 0;
  EXPECT_EQ(ValidateLaneOptions(o).code(), ErrorCode::kInvalidArgument);
  o = {};
  o.queue_chunks = 0;
  EXPECT_EQ(ValidateLaneOptions(o).code(), ErrorCode::kInvalidArgument);
  o = {};
  o.low_lane_min_share = 0.6;
  EXPECT_EQ(ValidateLaneOptions(o).code(), ErrorCode::kInvalidArgument);
  o = {};
  o.priority = {Lane::kGradient, Lane::kGradient, Lane::kControl, Lane::kTelemetry};
  EXPECT_EQ(ValidateLaneOptions(o).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(ValidateLaneOptions(LaneOptions{}).ok());
}

TEST_F(LaneSchedulerTest, SendsTheHighestNonEmptyLaneFirst) {
  auto s = Make();
  ASSERT_TRUE(Put(*s, Lane::kTelemetry, 4, 10).ok());
  ASSERT_TRUE(Put(*s, Lane::kControl, 3, 10).ok());
  ASSERT_TRUE(Put(*s, Lane::kActivation, 2, 10).ok());
  ASSERT_TRUE(Put(*s, Lane::kGradient, 1, 10).ok());
  std::vector<Lane> order;
  for (int i = 0; i < 4; ++i) order.push_back(Take(*s).lane);
  EXPECT_THAT(order,
              ElementsAre(Lane::kGradient, Lane::kActivation, Lane::kControl, Lane::kTelemetry));
}

TEST_F(LaneSchedulerTest, FollowsAConfiguredPriorityOrder) {
  LaneOptions o;
  o.priority = {Lane::kActivation, Lane::kGradient, Lane::kControl, Lane::kTelemetry};
  auto s = Make(o);
  ASSERT_TRUE(Put(*s, Lane::kGradient, 1, 10).ok());
  ASSERT_TRUE(Put(*s, Lane::kActivation, 2, 10).ok());
  EXPECT_EQ(Take(*s).lane, Lane::kActivation);
  EXPECT_EQ(Take(*s).lane, Lane::kGradient);
}

TEST_F(LaneSchedulerTest, KeepsFifoOrderWithinALane) {
  auto s = Make();
  for (uint64_t id = 1; id <= 5; ++id) ASSERT_TRUE(Put(*s, Lane::kActivation, id, 100).ok());
  std::vector<uint64_t> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(Take(*s).message_id);
  EXPECT_THAT(ids, ElementsAre(1, 2, 3, 4, 5));
}

TEST_F(LaneSchedulerTest, SplitsMessagesIntoChunksInOrder) {
  auto s = Make({.chunk_bytes = 100});
  auto payload = std::make_shared<int>(42);
  ASSERT_TRUE(
      s->Enqueue(Lane::kGradient, {.id = 7, .size_bytes = 250, .payload = payload}, Far()).ok());
  ASSERT_TRUE(Put(*s, Lane::kGradient, 8, 0).ok());  // an empty message is one empty chunk
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int i = 0; i < 3; ++i) {
    Chunk c = Take(*s);
    EXPECT_EQ(c.message_id, 7u);
    EXPECT_EQ(c.index, i);
    EXPECT_EQ(c.count, 3);
    EXPECT_EQ(c.last(), i == 2);
    EXPECT_EQ(c.payload, payload);
    ranges.emplace_back(c.offset_bytes, c.size_bytes);
  }
  EXPECT_THAT(ranges, ElementsAre(std::pair<int64_t, int64_t>{0, 100},
                                  std::pair<int64_t, int64_t>{100, 100},
                                  std::pair<int64_t, int64_t>{200, 50}));
  EXPECT_EQ(payload.use_count(), 1);  // the scheduler let go after the last chunk
  Chunk empty = Take(*s);
  EXPECT_EQ(empty.message_id, 8u);
  EXPECT_EQ(empty.size_bytes, 0);
  EXPECT_TRUE(empty.last());
}

TEST_F(LaneSchedulerTest, AHigherLaneCutsInBetweenTheChunksOfALowerMessage) {
  auto s = Make({.chunk_bytes = 10});
  ASSERT_TRUE(Put(*s, Lane::kTelemetry, 1, 100).ok());  // 10 chunks
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Take(*s).index, i);
  ASSERT_TRUE(Put(*s, Lane::kGradient, 2, 10).ok());
  Chunk g = Take(*s);
  EXPECT_EQ(g.lane, Lane::kGradient);
  EXPECT_EQ(g.message_id, 2u);
  Chunk t = Take(*s);
  EXPECT_EQ(t.lane, Lane::kTelemetry);
  EXPECT_EQ(t.index, 3);  // the telemetry message resumes where it stopped
  LaneSchedulerMetrics m = s->metrics();
  EXPECT_EQ(m.lane(Lane::kGradient).preemptions, 1u);
  EXPECT_EQ(m.lane(Lane::kTelemetry).passed_over, 1u);
  EXPECT_EQ(m.lane(Lane::kTelemetry).preemptions, 0u);
}

// The seed's §5.1 incident: logging flooded the wire at top priority and stalled gradient
// sync. Here 64 MiB of telemetry (4096 chunks of 16 KiB) is queued and partly sent; one 4 KiB
// gradient chunk must be the very next chunk out.
TEST_F(LaneSchedulerTest, Seed51TelemetryFloodDoesNotDelayGradientSync) {
  auto s = Make({.chunk_bytes = 16 * kKib, .queue_chunks = 8192});
  constexpr int kMessages = 64;
  for (uint64_t id = 0; id < kMessages; ++id) {
    ASSERT_TRUE(Put(*s, Lane::kTelemetry, id, 1024 * kKib).ok());
  }
  EXPECT_EQ(s->metrics().lane(Lane::kTelemetry).depth_bytes, 64 * 1024 * kKib);
  EXPECT_EQ(s->metrics().lane(Lane::kTelemetry).depth_chunks, 4096);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(Take(*s).lane, Lane::kTelemetry);

  ASSERT_TRUE(Put(*s, Lane::kGradient, 1000, 4 * kKib).ok());
  Chunk next = Take(*s);
  EXPECT_EQ(next.lane, Lane::kGradient);
  EXPECT_EQ(next.message_id, 1000u);
  EXPECT_EQ(next.size_bytes, 4 * kKib);

  // The flood then continues in order, nothing lost.
  int64_t telemetry_chunks = 100;
  uint64_t last_id = 0;
  while (true) {
    Result<Chunk> c = s->Next(clock_.Now());
    if (!c.ok()) break;
    ASSERT_EQ(c->lane, Lane::kTelemetry);
    ASSERT_GE(c->message_id, last_id);
    last_id = c->message_id;
    ++telemetry_chunks;
  }
  EXPECT_EQ(telemetry_chunks, 4096);
}

// With the guard due (a lower lane passed over 19 times), a new gradient chunk may wait for
// one guard chunk, never more: the added latency is at most one chunk time.
TEST_F(LaneSchedulerTest, GradientWaitsForAtMostOneChunkWhileLowerLanesFlood) {
  auto s = Make({.chunk_bytes = 16 * kKib, .queue_chunks = 8192});
  for (uint64_t id = 0; id < 64; ++id) {
    ASSERT_TRUE(Put(*s, Lane::kTelemetry, id, 1024 * kKib).ok());
    ASSERT_TRUE(Put(*s, Lane::kActivation, 100 + id, 256 * kKib).ok());
    ASSERT_TRUE(Put(*s, Lane::kControl, 200 + id, 64 * kKib).ok());
  }
  int delayed_rounds = 0;
  for (int round = 0; round < 200; ++round) {
    ASSERT_TRUE(Put(*s, Lane::kGradient, 1000 + static_cast<uint64_t>(round), 4 * kKib).ok());
    // Drain until the gradient chunk leaves; one other chunk at most may precede it.
    int before = 0;
    while (Take(*s).lane != Lane::kGradient) ++before;
    ASSERT_LE(before, 1) << "round " << round;
    delayed_rounds += before;
  }
  EXPECT_EQ(delayed_rounds, 10);  // the guard's 1 in 20
}

TEST_F(LaneSchedulerTest, StarvationGuardGivesLowerLanesTheirMinimumShare) {
  auto s = Make({.chunk_bytes = 10});
  for (uint64_t id = 0; id < 200; ++id) {
    ASSERT_TRUE(Put(*s, Lane::kGradient, id, 10).ok());
    ASSERT_TRUE(Put(*s, Lane::kTelemetry, 1000 + id, 10).ok());
  }
  std::vector<int> telemetry_at;
  for (int i = 0; i < 200; ++i) {
    Chunk c = Take(*s);
    if (c.lane == Lane::kTelemetry) {
      EXPECT_TRUE(c.guard);
      telemetry_at.push_back(i);
    }
  }
  // 0.05 of the chunks: one after every 19 gradient chunks.
  EXPECT_THAT(telemetry_at, ElementsAre(19, 39, 59, 79, 99, 119, 139, 159, 179, 199));
  EXPECT_EQ(s->metrics().lane(Lane::kTelemetry).guard_chunks, 10u);
}

TEST_F(LaneSchedulerTest, WithoutTheGuardLowerLanesWaitForHigherOnesToEmpty) {
  auto s = Make({.chunk_bytes = 10, .low_lane_min_share = 0});
  for (uint64_t id = 0; id < 50; ++id) {
    ASSERT_TRUE(Put(*s, Lane::kGradient, id, 10).ok());
    ASSERT_TRUE(Put(*s, Lane::kTelemetry, 1000 + id, 10).ok());
  }
  for (int i = 0; i < 50; ++i) ASSERT_EQ(Take(*s).lane, Lane::kGradient);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(Take(*s).lane, Lane::kTelemetry);
}

TEST_F(LaneSchedulerTest, GuardServesTheLowerLaneThatWaitedLongest) {
  auto s = Make({.chunk_bytes = 10, .low_lane_min_share = 0.5});  // alternate
  for (uint64_t id = 0; id < 10; ++id) {
    ASSERT_TRUE(Put(*s, Lane::kGradient, id, 10).ok());
    ASSERT_TRUE(Put(*s, Lane::kActivation, 100 + id, 10).ok());
    ASSERT_TRUE(Put(*s, Lane::kTelemetry, 200 + id, 10).ok());
  }
  std::vector<Lane> order;
  for (int i = 0; i < 8; ++i) order.push_back(Take(*s).lane);
  EXPECT_THAT(order,
              ElementsAre(Lane::kGradient, Lane::kActivation, Lane::kGradient, Lane::kTelemetry,
                          Lane::kGradient, Lane::kActivation, Lane::kGradient, Lane::kTelemetry));
}

TEST_F(LaneSchedulerTest, EnqueueOnAFullLaneBlocksUntilTheConsumerMakesRoom) {
  auto s = Make({.chunk_bytes = 10, .queue_chunks = 4});
  for (uint64_t id = 0; id < 4; ++id) ASSERT_TRUE(Put(*s, Lane::kControl, id, 10).ok());
  // Other lanes have their own room.
  ASSERT_TRUE(Put(*s, Lane::kTelemetry, 50, 10).ok());
  Status blocked;
  std::thread producer(
      [&] { blocked = s->Enqueue(Lane::kControl, {.id = 4, .size_bytes = 10}, Far()); });
  clock_.BlockUntilWaiters(1);
  EXPECT_EQ(s->metrics().lane(Lane::kControl).blocked_now, 1);
  EXPECT_EQ(Take(*s).message_id, 0u);
  producer.join();
  EXPECT_TRUE(blocked.ok()) << blocked;
  LaneMetrics m = s->metrics().lane(Lane::kControl);
  EXPECT_EQ(m.blocked_enqueues, 1u);
  EXPECT_EQ(m.blocked_now, 0);
  EXPECT_EQ(m.depth_chunks, 4);
  EXPECT_EQ(m.max_depth_chunks, 4);
}

TEST_F(LaneSchedulerTest, EnqueueOnAFullLaneGivesUpAtTheDeadline) {
  auto s = Make({.chunk_bytes = 10, .queue_chunks = 2});
  ASSERT_TRUE(Put(*s, Lane::kActivation, 0, 20).ok());
  // A deadline already passed: at once.
  EXPECT_EQ(Put(*s, Lane::kActivation, 1, 10).code(), ErrorCode::kDeadlineExceeded);
  Status blocked;
  std::thread producer([&] {
    blocked = s->Enqueue(Lane::kActivation, {.id = 2, .size_bytes = 10}, clock_.Now() + seconds(5));
  });
  clock_.BlockUntilWaiters(1);
  clock_.Advance(seconds(4));  // not yet
  clock_.BlockUntilWaiters(1);
  clock_.Advance(seconds(1));
  producer.join();
  EXPECT_EQ(blocked.code(), ErrorCode::kDeadlineExceeded);
  LaneMetrics m = s->metrics().lane(Lane::kActivation);
  EXPECT_EQ(m.enqueue_deadline_exceeded, 2u);
  EXPECT_EQ(m.enqueued_messages, 1u);  // nothing was queued by the failed calls
  EXPECT_EQ(m.depth_chunks, 2);
}

TEST_F(LaneSchedulerTest, AMessageLargerThanTheLaneIsAdmittedIntoAnEmptyLane) {
  auto s = Make({.chunk_bytes = 10, .queue_chunks = 4});
  ASSERT_TRUE(Put(*s, Lane::kGradient, 1, 100).ok());  // 10 chunks
  EXPECT_EQ(s->metrics().lane(Lane::kGradient).depth_chunks, 10);
  EXPECT_EQ(Put(*s, Lane::kGradient, 2, 10).code(), ErrorCode::kDeadlineExceeded);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(Take(*s).message_id, 1u);
  EXPECT_TRUE(Put(*s, Lane::kGradient, 2, 10).ok());
}

TEST_F(LaneSchedulerTest, BlockedProducersOfALaneAreAdmittedInArrivalOrder) {
  auto s = Make({.chunk_bytes = 10, .queue_chunks = 4});
  for (uint64_t id = 0; id < 4; ++id) ASSERT_TRUE(Put(*s, Lane::kGradient, id, 10).ok());
  Status big_status;
  Status small_status;
  std::thread big(
      [&] { big_status = s->Enqueue(Lane::kGradient, {.id = 100, .size_bytes = 30}, Far()); });
  clock_.BlockUntilWaiters(1);
  std::thread small(
      [&] { small_status = s->Enqueue(Lane::kGradient, {.id = 200, .size_bytes = 10}, Far()); });
  clock_.BlockUntilWaiters(2);
  // The first free slot would fit the small message, but the big one is ahead of it.
  std::vector<uint64_t> ids;
  for (int i = 0; i < 8; ++i) {
    Result<Chunk> c = s->Next(Far());
    if (!c.ok()) {
      ADD_FAILURE() << c.status();
      s->Close();  // unblocks the producers so that they can be joined
      break;
    }
    ids.push_back(c->message_id);
  }
  big.join();
  small.join();
  EXPECT_TRUE(big_status.ok());
  EXPECT_TRUE(small_status.ok());
  EXPECT_THAT(ids, ElementsAre(0, 1, 2, 3, 100, 100, 100, 200));
}

TEST_F(LaneSchedulerTest, CloseCancelsEnqueueAndNextDrainsFirst) {
  auto s = Make({.chunk_bytes = 10});
  ASSERT_TRUE(Put(*s, Lane::kControl, 1, 20).ok());
  s->Close();
  EXPECT_EQ(Put(*s, Lane::kControl, 2, 10).code(), ErrorCode::kCancelled);
  EXPECT_EQ(Take(*s).index, 0);
  EXPECT_EQ(Take(*s).index, 1);
  EXPECT_EQ(s->Next(Far()).status().code(), ErrorCode::kCancelled);
  s->Close();  // idempotent
}

TEST_F(LaneSchedulerTest, CloseWakesABlockedConsumer) {
  auto s = Make();
  Status status;
  std::thread consumer([&] { status = s->Next(Far()).status(); });
  clock_.BlockUntilWaiters(1);
  s->Close();
  consumer.join();
  EXPECT_EQ(status.code(), ErrorCode::kCancelled);
}

TEST_F(LaneSchedulerTest, CloseWakesABlockedProducerWithoutQueueingItsMessage) {
  auto s = Make({.chunk_bytes = 10, .queue_chunks = 1});
  ASSERT_TRUE(Put(*s, Lane::kTelemetry, 1, 10).ok());
  Status status;
  std::thread producer(
      [&] { status = s->Enqueue(Lane::kTelemetry, {.id = 2, .size_bytes = 10}, Far()); });
  clock_.BlockUntilWaiters(1);
  s->Close();
  producer.join();
  EXPECT_EQ(status.code(), ErrorCode::kCancelled);
  EXPECT_EQ(Take(*s).message_id, 1u);
  EXPECT_EQ(s->Next(Far()).status().code(), ErrorCode::kCancelled);
}

TEST_F(LaneSchedulerTest, NextTimesOutOnTheFakeClock) {
  auto s = Make();
  EXPECT_EQ(s->Next(clock_.Now()).status().code(), ErrorCode::kDeadlineExceeded);
  Status status;
  std::thread consumer([&] { status = s->Next(clock_.Now() + seconds(2)).status(); });
  clock_.BlockUntilWaiters(1);
  clock_.Advance(seconds(2));
  consumer.join();
  EXPECT_EQ(status.code(), ErrorCode::kDeadlineExceeded);
}

TEST_F(LaneSchedulerTest, RejectsANegativeSizeAndAnUnknownLane) {
  auto s = Make();
  EXPECT_EQ(Put(*s, Lane::kGradient, 1, -1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(Put(*s, static_cast<Lane>(9), 1, 1).code(), ErrorCode::kInvalidArgument);
}

TEST_F(LaneSchedulerTest, CountsBytesDepthAndQueuedTime) {
  auto s = Make({.chunk_bytes = 100});
  ASSERT_TRUE(Put(*s, Lane::kActivation, 1, 150).ok());
  ASSERT_TRUE(Put(*s, Lane::kTelemetry, 2, 30).ok());
  LaneSchedulerMetrics m = s->metrics();
  EXPECT_EQ(m.lane(Lane::kActivation).enqueued_messages, 1u);
  EXPECT_EQ(m.lane(Lane::kActivation).enqueued_chunks, 2u);
  EXPECT_EQ(m.lane(Lane::kActivation).enqueued_bytes, 150);
  EXPECT_EQ(m.lane(Lane::kActivation).depth_chunks, 2);
  EXPECT_EQ(m.lane(Lane::kActivation).depth_bytes, 150);

  clock_.Advance(milliseconds(3));
  Chunk a0 = Take(*s);
  EXPECT_EQ(a0.queued_for, milliseconds(3));
  clock_.Advance(milliseconds(2));
  Chunk a1 = Take(*s);
  EXPECT_EQ(a1.queued_for, milliseconds(5));
  Chunk t = Take(*s);
  EXPECT_EQ(t.queued_for, milliseconds(5));

  m = s->metrics();
  const LaneMetrics& a = m.lane(Lane::kActivation);
  EXPECT_EQ(a.sent_chunks, 2u);
  EXPECT_EQ(a.sent_bytes, 150);
  EXPECT_EQ(a.depth_chunks, 0);
  EXPECT_EQ(a.depth_bytes, 0);
  EXPECT_EQ(a.max_depth_chunks, 2);
  EXPECT_EQ(a.total_queued_time, milliseconds(8));
  EXPECT_EQ(a.preemptions, 2u);  // telemetry waited behind both chunks
  EXPECT_EQ(m.lane(Lane::kTelemetry).passed_over, 2u);
  EXPECT_EQ(m.lane(Lane::kTelemetry).sent_bytes, 30);
  EXPECT_EQ(m.lane(Lane::kGradient).enqueued_chunks, 0u);
}

// Producers on every lane and one consumer: every message arrives exactly once, each
// producer's messages of a lane in order, chunks of a message in order. Small queues make
// the producers block on backpressure.
TEST_F(LaneSchedulerTest, ConcurrentProducersLoseNothing) {
  auto s = Make({.chunk_bytes = 10, .queue_chunks = 8});
  constexpr int kProducers = 4;
  constexpr int kPerProducer = 200;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i) {
        const Lane lane = kAllLanes[static_cast<size_t>((p + i) % kNumLanes)];
        const uint64_t id = static_cast<uint64_t>(p) * 1'000'000 + static_cast<uint64_t>(i);
        const Status st = s->Enqueue(lane, {.id = id, .size_bytes = 10 * (i % 3)}, Far());
        if (!st.ok()) {
          ADD_FAILURE() << st;
          return;
        }
      }
    });
  }
  std::map<uint64_t, int64_t> next_index;                // message -> next chunk index
  std::map<std::pair<int, int>, uint64_t> last_of_lane;  // (producer, lane) -> last id
  int64_t messages = 0;
  bool failed = false;
  while (!failed && messages < kProducers * kPerProducer) {
    Result<Chunk> c = s->Next(Far());
    if (!c.ok()) {
      ADD_FAILURE() << c.status();
      break;
    }
    int64_t& expected = next_index[c->message_id];
    EXPECT_EQ(c->index, expected) << "message " << c->message_id;
    failed |= c->index != expected;
    ++expected;
    if (c->index == 0) {
      const auto key =
          std::make_pair(static_cast<int>(c->message_id / 1'000'000), static_cast<int>(c->lane));
      auto it = last_of_lane.find(key);
      if (it != last_of_lane.end()) {
        EXPECT_GT(c->message_id, it->second);
        failed |= c->message_id <= it->second;
      }
      last_of_lane[key] = c->message_id;
    }
    if (c->last()) ++messages;
  }
  if (failed) s->Close();  // unblocks the producers so that they can be joined
  for (std::thread& t : producers) t.join();
  EXPECT_EQ(s->Next(clock_.Now()).status().code(),
            failed ? ErrorCode::kCancelled : ErrorCode::kDeadlineExceeded);
  EXPECT_EQ(next_index.size(), static_cast<size_t>(kProducers * kPerProducer));
}

}  // namespace
}  // namespace kc::comm
