#include "fault/memory_copy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "parallel/training_test_support.h"

namespace kc::fault {
namespace {

using parallel::testing::OneCore;
using parallel::testing::TinyCorpus;
using parallel::testing::TinyModel;
using ::testing::HasSubstr;

int Holder(std::vector<int> hosts, int rank) { return CopyHolder(hosts, rank); }

TEST(CopyHolderTest, EachRanksCopyGoesToTheSamePlaceOnTheNextHost) {
  // Two hosts of two: across, both ways.
  EXPECT_EQ(Holder({0, 0, 1, 1}, 0), 2);
  EXPECT_EQ(Holder({0, 0, 1, 1}, 1), 3);
  EXPECT_EQ(Holder({0, 0, 1, 1}, 2), 0);
  EXPECT_EQ(Holder({0, 0, 1, 1}, 3), 1);
  // Three hosts, a ring; hosts in the order their first rank comes.
  EXPECT_EQ(Holder({5, 5, 2, 2, 7, 7}, 1), 3);
  EXPECT_EQ(Holder({5, 5, 2, 2, 7, 7}, 3), 5);
  EXPECT_EQ(Holder({5, 5, 2, 2, 7, 7}, 5), 1);
  // A host of one: places wrap on it.
  EXPECT_EQ(Holder({0, 0, 0, 1}, 2), 3);
  EXPECT_EQ(Holder({0, 0, 0, 1}, 3), 0);
  // One host: the next rank; alone: itself.
  EXPECT_EQ(Holder({0, 0, 0}, 2), 0);
  EXPECT_EQ(Holder({0}, 0), 0);
}

class MemoryCopiesTest : public ::testing::Test {
 protected:
  std::unique_ptr<parallel::Trainer> MakeTrainer(int zero_stage = 0) {
    parallel::TrainerOptions o;
    o.spec = TinyModel();
    o.plan = {.micro_batch_size = 4, .zero_stage = zero_stage};
    o.global_batch = 4;
    o.data = corpus_.train();
    o.total_steps = 8;
    o.device = device_.get();
    Result<std::unique_ptr<parallel::Trainer>> t = parallel::Trainer::Create(o);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }
  static std::vector<float> Values(parallel::Trainer& t) {
    return TakeSnapshot(t, t.loader().state()).data;
  }

  const TinyCorpus corpus_;
  std::unique_ptr<hal::ComputeDevice> device_ = OneCore(0);
};

// A rank alone keeps its own copy: rolling back to it gives the state of that step, and the
// steps after it again, bit for bit.
TEST_F(MemoryCopiesTest, ARollBackToTheCopyReplaysTheSameSteps) {
  std::unique_ptr<parallel::Trainer> t = MakeTrainer();
  ASSERT_NE(t, nullptr);
  MemoryCopies copies;
  EXPECT_EQ(copies.step(), -1);
  Result<MemoryRestore> none = copies.Restore(t.get(), nullptr, -1);
  EXPECT_EQ(none.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("no step has a copy of every pipeline stage"));

  for (int s = 0; s < 2; ++s) ASSERT_TRUE(t->Step().ok());
  ASSERT_TRUE(copies.Exchange(*t, t->loader().state(), nullptr).ok());
  EXPECT_EQ(copies.step(), 2);
  EXPECT_GT(copies.bytes(), 0);
  const std::vector<float> at2 = Values(*t);
  Result<parallel::StepStats> third = t->Step();
  ASSERT_TRUE(third.ok());
  ASSERT_TRUE(t->Step().ok());

  // A newer checkpoint wins over the copies; one as old does not.
  Result<MemoryRestore> newer = copies.Restore(t.get(), nullptr, 3);
  EXPECT_EQ(newer.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_THAT(newer.status().message(),
              HasSubstr("the checkpoint of step 3 is newer than the copies' step 2"));
  EXPECT_EQ(t->steps_done(), 4);  // nothing changed

  Result<MemoryRestore> back = copies.Restore(t.get(), nullptr, 2);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 2);
  EXPECT_EQ(back->bytes, 0);  // its own copy
  EXPECT_EQ(t->steps_done(), 2);
  EXPECT_EQ(Values(*t), at2);
  Result<parallel::StepStats> again = t->Step();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->loss, third->loss);
}

// With ZeRO-1 a copy of one rank's moments is a shard of them: not a state to roll back to.
TEST_F(MemoryCopiesTest, ShardedMomentsAreRefused) {
  std::unique_ptr<parallel::Trainer> t = MakeTrainer(/*zero_stage=*/1);
  ASSERT_NE(t, nullptr);
  MemoryCopies copies;
  ASSERT_TRUE(t->Step().ok());
  ASSERT_TRUE(copies.Exchange(*t, t->loader().state(), nullptr).ok());
  Result<MemoryRestore> r = copies.Restore(t.get(), nullptr, -1);
  EXPECT_EQ(r.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("ZeRO-1"));
}

}  // namespace
}  // namespace kc::fault
