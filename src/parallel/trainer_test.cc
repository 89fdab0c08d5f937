// The trainer with ranks as threads over an in-memory store: the global batch split over the
// data-parallel replicas, evenly or not, gives the losses of one rank.
#include "parallel/trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "comm/hash_store.h"
#include "parallel/training_test_support.h"

namespace kc::parallel {
namespace {

using testing::MaxRelativeDifference;
using testing::OneCore;
using testing::TinyCorpus;
using testing::TinyModel;

struct Trajectory {
  std::vector<double> losses, grad_norms, val;
  std::vector<int64_t> tokens;
};

// `steps` steps of TinyModel on `ranks` data-parallel ranks (threads), with a global batch of
// `global_batch` sequences; rank 0's view.
Trajectory Train(const TinyCorpus& corpus, int ranks, int64_t global_batch, int steps) {
  static int runs = 0;
  comm::HashStore store;
  const std::string group =
      "trainer-test-" + std::to_string(getpid()) + "-" + std::to_string(runs++);
  Trajectory out;
  std::vector<std::jthread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<comm::Communicator> comm;
      if (ranks > 1) {
        auto c = comm::Communicator::Create(
            {.store = &store, .group = group, .rank = r, .size = ranks, .host = "one-host"});
        ASSERT_TRUE(c.ok()) << c.status();
        comm = *std::move(c);
      }
      auto device = OneCore(r);
      TrainerOptions o;
      o.spec = TinyModel();
      // The plan's micro-batch: the even part; the global batch says what is uneven.
      o.plan = {.d = ranks, .micro_batch_size = global_batch / ranks};
      o.global_batch = global_batch;
      o.data = corpus.train();
      o.validation = corpus.val();
      o.total_steps = steps;
      o.device = device.get();
      o.comm = comm.get();
      auto trainer = Trainer::Create(o);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      for (int s = 0; s < steps; ++s) {
        Result<StepStats> stats = (*trainer)->Step();
        ASSERT_TRUE(stats.ok()) << stats.status();
        if (r != 0) continue;
        out.losses.push_back(stats->loss);
        out.grad_norms.push_back(stats->grad_norm);
        out.tokens.push_back(stats->tokens);
      }
      Result<double> val = (*trainer)->Evaluate(2);
      ASSERT_TRUE(val.ok()) << val.status();
      if (r == 0) out.val.push_back(*val);
    });
  }
  threads.clear();
  return out;
}

TEST(TrainerTest, UnevenSharesOfTheGlobalBatchGiveTheLossesOfOneRank) {
  // 8 sequences over 3 ranks: 3, 3, 2, each rank's gradient and loss weighted by its tokens.
  const TinyCorpus corpus;
  const Trajectory one = Train(corpus, 1, 8, 6);
  const Trajectory three = Train(corpus, 3, 8, 6);
  ASSERT_EQ(one.losses.size(), 6u);
  // Within fp32 rounding (the sums run in another order).
  EXPECT_LE(MaxRelativeDifference(one.losses, three.losses), 1e-5);
  EXPECT_LE(MaxRelativeDifference(one.grad_norms, three.grad_norms), 1e-4);
  EXPECT_LE(MaxRelativeDifference(one.val, three.val), 1e-5);
  EXPECT_EQ(three.tokens.front(), 8 * 16);
  // The losses move: the comparison is of a run that trains.
  EXPECT_LT(one.losses.back(), one.losses.front());
}

TEST(TrainerTest, AnEvenSplitStillGivesTheLossesOfOneRank) {
  const TinyCorpus corpus;
  const Trajectory one = Train(corpus, 1, 4, 4);
  const Trajectory two = Train(corpus, 2, 4, 4);
  EXPECT_LE(MaxRelativeDifference(one.losses, two.losses), 1e-5);
}

// What runs is what was planned: a plan for another group size, or one the engine does not run,
// is refused before anything is built.
TEST(TrainerTest, APlanForAnotherSizeOrOneTheEngineDoesNotRunIsRefused) {
  const TinyCorpus corpus;
  auto device = OneCore(0);
  TrainerOptions o;
  o.spec = TinyModel();
  o.data = corpus.train();
  o.total_steps = 1;
  o.device = device.get();
  o.plan = {.d = 2};
  EXPECT_EQ(Trainer::Create(o).status().code(), ErrorCode::kInvalidArgument);
  o.plan = {.zero_stage = 2};
  EXPECT_EQ(Trainer::Create(o).status().code(), ErrorCode::kUnimplemented);
  o.plan = {};
  EXPECT_TRUE(Trainer::Create(o).ok());
}

}  // namespace
}  // namespace kc::parallel
