#include "fault/elastic.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>

#include "base/notification.h"
#include "comm/hash_store.h"

namespace kc::fault {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<int> Workers(const Generation& g) {
  std::vector<int> out;
  for (const Member& m : g.members) out.push_back(m.worker);
  return out;
}

std::vector<bool> States(const Generation& g) {
  std::vector<bool> out;
  for (const Member& m : g.members) out.push_back(m.has_state);
  return out;
}

ElasticShape Shape(int t, int p, int64_t global_batch, int64_t mbs, int64_t m, int min, int max) {
  return {.t = t,
          .p = p,
          .global_batch = global_batch,
          .micro_batch_size = mbs,
          .micro_batches = m,
          .min_ranks = min,
          .max_ranks = max};
}

TEST(ElasticTest, DataParallelSurvivorsKeepTheirStateAndTheGlobalBatch) {
  const ElasticShape s = Shape(1, 1, 12, 3, 1, 2, 4);
  const Generation g0 = FirstGeneration(s, 4);
  EXPECT_EQ(g0.d, 4);
  auto g1 = NextGeneration(g0, s, {0, 1, 3}, false, "worker 2 failed");
  ASSERT_TRUE(g1.ok()) << g1.status();
  EXPECT_EQ(g1->number, 1);
  EXPECT_EQ(g1->d, 3);
  EXPECT_THAT(Workers(*g1), ElementsAre(0, 1, 3));
  EXPECT_THAT(States(*g1), ElementsAre(true, true, true));
  // 12 sequences over 3 replicas: 4 each, which 3-sequence micro-batches do not divide, so one
  // micro-batch of 4.
  EXPECT_EQ(g1->micro_batch_size, 4);
  EXPECT_EQ(g1->micro_batches, 1);
  EXPECT_FALSE(g1->stop);
  EXPECT_FALSE(g1->from_checkpoint);
  EXPECT_THAT(g1->spares, IsEmpty());
  EXPECT_EQ(g1->reason, "worker 2 failed");
}

TEST(ElasticTest, EverySurvivorTrainsWithAnUnevenShareOfTheGlobalBatch) {
  // 16 sequences over 3 survivors: 6, 5, 5. Replica 0's 6 in one micro-batch (4 does not
  // divide it).
  const ElasticShape s = Shape(1, 1, 16, 4, 1, 2, 4);
  auto g1 = NextGeneration(FirstGeneration(s, 4), s, {0, 1, 2}, false, "x");
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(g1->d, 3);
  EXPECT_THAT(Workers(*g1), ElementsAre(0, 1, 2));
  EXPECT_THAT(g1->spares, IsEmpty());
  EXPECT_EQ(g1->micro_batch_size, 6);
  EXPECT_EQ(g1->micro_batches, 1);
  EXPECT_EQ(UsableReplicas(s, 3), 3);
  EXPECT_EQ(UsableReplicas(s, 5), 4);  // max_ranks
  // At most one replica per sequence: 2 sequences keep 2 of 3 workers busy.
  EXPECT_EQ(UsableReplicas(Shape(1, 1, 2, 1, 1, 1, 4), 3), 2);
  // Whole groups of t * p only.
  EXPECT_EQ(UsableReplicas(Shape(2, 1, 16, 4, 1, 2, 8), 7), 3);
}

TEST(ElasticTest, NewcomersFillReplicasWithoutStateAndGrowTheJobBack) {
  const ElasticShape s = Shape(1, 1, 16, 4, 1, 2, 4);
  auto g1 = NextGeneration(FirstGeneration(s, 4), s, {0, 1, 3}, false, "worker 2 failed");
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(g1->d, 3);
  EXPECT_THAT(g1->spares, IsEmpty());
  // Worker 4 (a replacement) is up: 4 replicas again.
  auto g2 = NextGeneration(*g1, s, {0, 1, 3, 4}, false, "worker 4 joined");
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(g2->number, 2);
  EXPECT_EQ(g2->d, 4);
  EXPECT_THAT(Workers(*g2), ElementsAre(0, 1, 3, 4));
  EXPECT_THAT(States(*g2), ElementsAre(true, true, true, false));
  EXPECT_EQ(g2->micro_batch_size, 4);
  EXPECT_EQ(g2->micro_batches, 1);
}

TEST(ElasticTest, TheFirstGenerationOfAnUnevenSplitRecordsReplicaZerosShare) {
  const Generation g = FirstGeneration(Shape(1, 1, 32, 10, 1, 3, 3), 3);
  EXPECT_EQ(g.d, 3);
  EXPECT_EQ(g.micro_batch_size, 11);
  EXPECT_EQ(g.micro_batches, 1);
}

TEST(ElasticTest, OnlyWholeReplicasOfATensorAndPipelineParallelPlanKeepState) {
  // t=2, p=2, d=2: rank = (stage * d + replica) * t + tp_rank. Replica 0 is ranks 0, 1, 4, 5;
  // replica 1 is ranks 2, 3, 6, 7. Losing worker 6 breaks replica 1.
  const ElasticShape s = Shape(2, 2, 8, 2, 2, 4, 8);
  const Generation g0 = FirstGeneration(s, 8);
  EXPECT_EQ(g0.d, 2);
  auto g1 = NextGeneration(g0, s, {0, 1, 2, 3, 4, 5, 7}, false, "worker 6 failed");
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(g1->d, 1);
  EXPECT_THAT(Workers(*g1), ElementsAre(0, 1, 4, 5));  // (stage, tp) kept
  EXPECT_THAT(States(*g1), ElementsAre(true, true, true, true));
  EXPECT_THAT(g1->spares, ElementsAre(2, 3, 7));
  EXPECT_EQ(g1->micro_batch_size, 2);
  EXPECT_EQ(g1->micro_batches, 4);
  // A replacement makes a second replica of the spares and itself: they get state by broadcast.
  auto g2 = NextGeneration(*g1, s, {0, 1, 2, 3, 4, 5, 7, 8}, false, "worker 8 joined");
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(g2->d, 2);
  // Replica 0 = workers 0, 1, 4, 5 at ranks 0, 1, 4, 5; replica 1 = 2, 3, 7, 8 at 2, 3, 6, 7.
  EXPECT_THAT(Workers(*g2), ElementsAre(0, 1, 2, 3, 4, 5, 7, 8));
  EXPECT_THAT(States(*g2), ElementsAre(true, true, false, false, true, true, false, false));
}

TEST(ElasticTest, WithoutAWholeReplicaOrWithShardedMomentsStateComesFromACheckpoint) {
  const ElasticShape tp = Shape(2, 1, 4, 2, 1, 2, 4);
  // d=2, t=2: replicas {0, 1} and {2, 3}; losing 1 and 2 leaves no whole one.
  auto g1 = NextGeneration(FirstGeneration(tp, 4), tp, {0, 3}, false, "two failed");
  ASSERT_TRUE(g1.ok());
  EXPECT_TRUE(g1->from_checkpoint);
  EXPECT_EQ(g1->d, 1);
  EXPECT_THAT(States(*g1), ElementsAre(false, false));

  const ElasticShape dp = Shape(1, 1, 12, 3, 1, 2, 4);
  auto zero = NextGeneration(FirstGeneration(dp, 4), dp, {0, 1, 3}, true, "worker 2 failed");
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(zero->from_checkpoint);
  // Nobody lost (a newcomer joins): ZeRO-1 state is all there.
  auto grow = NextGeneration(FirstGeneration(dp, 3), dp, {0, 1, 2, 3}, true, "joined");
  ASSERT_TRUE(grow.ok());
  EXPECT_FALSE(grow->from_checkpoint);
}

TEST(ElasticTest, BelowMinRanksTheGenerationIsAStopByOneWholeReplica) {
  // t=2, d=2: replicas {0, 1} and {2, 3}. Losing 3 leaves one whole replica: 2 ranks, below 3.
  const ElasticShape s = Shape(2, 1, 16, 4, 1, 3, 4);
  auto g1 = NextGeneration(FirstGeneration(s, 4), s, {0, 1, 2}, false, "worker 3 failed");
  ASSERT_TRUE(g1.ok());
  EXPECT_TRUE(g1->stop);
  EXPECT_EQ(g1->d, 1);
  EXPECT_THAT(Workers(*g1), ElementsAre(0, 1));
  EXPECT_THAT(g1->spares, ElementsAre(2));
  EXPECT_EQ(g1->micro_batch_size, 4);
  EXPECT_EQ(g1->micro_batches, 4);
}

TEST(ElasticTest, GenerationsRoundTripThroughTheStore) {
  const ElasticShape s = Shape(1, 1, 16, 4, 1, 2, 4);
  auto g1 = NextGeneration(FirstGeneration(s, 4), s, {0, 1}, false, "workers 2 and 3 failed");
  ASSERT_TRUE(g1.ok());
  comm::HashStore store;
  // Nothing announced: the wait ends at its deadline.
  EXPECT_EQ(AwaitGeneration(store, 1, store.clock()->Now()).status().code(),
            ErrorCode::kDeadlineExceeded);
  ASSERT_TRUE(AnnounceGeneration(store, *g1).ok());
  auto back = AwaitGeneration(store, 1, store.clock()->Now());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), g1->ToJson());
  EXPECT_EQ(*store.Get(kCurrentGenerationKey, store.clock()->Now()), "1");
  EXPECT_EQ(back->rank_of(1), 1);
  EXPECT_EQ(back->rank_of(2), -1);  // not a member
  ASSERT_TRUE(store.Set(GenerationKey(2), "{\"number\": 2}").ok());
  EXPECT_THAT(AwaitGeneration(store, 2, store.clock()->Now()).status().message(),
              HasSubstr("generation record"));
}

TEST(ElasticTest, TheWatchFiresOnceTheNextGenerationIsAnnounced) {
  comm::HashStore store;
  std::atomic<int> calls{0};
  Notification fired;
  auto watch = GenerationWatch::Start(&store, 3, [&] {
    ++calls;
    fired.Notify();
  });
  ASSERT_TRUE(watch.ok());
  // Generation 3 itself or another key does not fire it.
  Generation g3;
  g3.number = 3;
  ASSERT_TRUE(AnnounceGeneration(store, g3).ok());
  EXPECT_FALSE((*watch)->fired());
  Generation g4;
  g4.number = 4;
  ASSERT_TRUE(AnnounceGeneration(store, g4).ok());
  fired.WaitForNotification();
  EXPECT_TRUE((*watch)->fired());
  watch->reset();
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace kc::fault
