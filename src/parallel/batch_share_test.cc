#include "parallel/batch_share.h"

#include <gtest/gtest.h>

namespace kc::parallel {
namespace {

BatchShare Share(int64_t global, int d, int r, int64_t mbs, int64_t m) {
  Result<BatchShare> s = ShareOfBatch(global, d, r, mbs, m);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : BatchShare{};
}

TEST(BatchShareTest, AnEvenSplitKeepsThePlansMicroBatches) {
  for (int r = 0; r < 4; ++r) {
    const BatchShare s = Share(32, 4, r, 4, 2);
    EXPECT_EQ(s.offset, 8 * r);
    EXPECT_EQ(s.sequences, 8);
    EXPECT_EQ(s.micro_batch_size, 4);
    EXPECT_EQ(s.micro_batches, 2);
  }
}

TEST(BatchShareTest, TheFirstReplicasTakeOneSequenceMoreAndTheSharesCoverTheBatch) {
  // 32 over 3: 11, 11, 10, back to back.
  int64_t next = 0;
  for (int d : {1, 3, 5, 7, 32}) {
    next = 0;
    for (int r = 0; r < d; ++r) {
      const BatchShare s = Share(32, d, r, 1, 1);
      EXPECT_EQ(s.offset, next) << d << " " << r;
      EXPECT_EQ(s.sequences, 32 / d + (r < 32 % d ? 1 : 0));
      next += s.sequences;
    }
    EXPECT_EQ(next, 32) << d;
  }
  EXPECT_EQ(Share(32, 3, 0, 1, 1).sequences, 11);
  EXPECT_EQ(Share(32, 3, 2, 1, 1).sequences, 10);
}

TEST(BatchShareTest, AShareTheMicroBatchDoesNotDivideKeepsTheCountOrTakesOne) {
  // 12 over 3 with micro-batches of 3: shares of 4 in one micro-batch of 4.
  BatchShare s = Share(12, 3, 1, 3, 1);
  EXPECT_EQ(s.micro_batch_size, 4);
  EXPECT_EQ(s.micro_batches, 1);
  // 16 over 3 with 2 micro-batches: 6 as 2 x 3, 5 as one of 5.
  s = Share(16, 3, 0, 4, 2);
  EXPECT_EQ(s.micro_batch_size, 3);
  EXPECT_EQ(s.micro_batches, 2);
  s = Share(16, 3, 2, 4, 2);
  EXPECT_EQ(s.sequences, 5);
  EXPECT_EQ(s.micro_batch_size, 5);
  EXPECT_EQ(s.micro_batches, 1);
}

TEST(BatchShareTest, FewerSequencesThanReplicasOrABadReplicaIsRefused) {
  EXPECT_EQ(ShareOfBatch(2, 3, 0, 1, 1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ShareOfBatch(8, 3, 3, 1, 1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ShareOfBatch(8, 0, 0, 1, 1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ShareOfBatch(8, 2, 0, 0, 1).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kc::parallel
