#include "parallel/pipeline_schedule.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

namespace kc::parallel {
namespace {

using ::testing::HasSubstr;

std::vector<std::vector<PipeOp>> Build(Schedule s, int p, int m, int v = 1) {
  Result<std::vector<std::vector<PipeOp>>> r = BuildPipelineSchedule(s, p, m, v);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<std::vector<PipeOp>>{};
}

PipelineSimulation Simulate(const std::vector<std::vector<PipeOp>>& schedule, int v,
                            PipeCosts costs = {}) {
  Result<PipelineSimulation> r = SimulatePipeline(schedule, v, costs);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : PipelineSimulation{};
}

TEST(PipelineScheduleTest, OneForwardOneBackwardInOrder) {
  EXPECT_EQ(ScheduleToString(Build(Schedule::k1F1B, 2, 3), 1),
            "s0: F0 F1 B0 F2 B1 B2\n"
            "s1: F0 B0 F1 B1 F2 B2\n");
  EXPECT_EQ(ScheduleToString(Build(Schedule::kGpipe, 2, 2), 1),
            "s0: F0 F1 B0 B1\n"
            "s1: F0 F1 B0 B1\n");
  EXPECT_EQ(ScheduleToString(Build(Schedule::kZeroBubbleH1, 2, 2), 1),
            "s0: F0 F1 b0 W0 b1 W1\n"
            "s1: F0 b0 F1 b1 W0 W1\n");
  // Megatron's interleaving: micro-batches in groups of p per chunk.
  EXPECT_EQ(ScheduleToString(Build(Schedule::kInterleaved, 2, 2, 2), 2),
            "s0: F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0\n"
            "s1: F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0\n");
}

TEST(PipelineScheduleTest, GpipeAnd1F1BReachTheIdealBubbleAndDifferInMemory) {
  for (int p : {1, 2, 3, 4}) {
    for (int m : {1, 2, 4, 8}) {
      for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B}) {
        // Backward twice the forward, no communication: the ideal (p-1)/(m+p-1).
        const PipelineSimulation sim =
            Simulate(Build(s, p, m), 1, {.forward = 1, .backward_input = 1, .backward_weight = 1});
        EXPECT_NEAR(sim.bubble_fraction, IdealBubbleFraction(p, m), 1e-12)
            << ScheduleName(s) << " p=" << p << " m=" << m;
        EXPECT_DOUBLE_EQ(sim.makespan, 3.0 * (m + p - 1));
        for (int stage = 0; stage < p; ++stage) {
          // GPipe holds every micro-batch; 1F1B at most p - stage.
          const int expected = s == Schedule::kGpipe ? m : std::min(m, p - stage);
          EXPECT_EQ(sim.stages[static_cast<size_t>(stage)].peak_activations, expected)
              << ScheduleName(s) << " p=" << p << " m=" << m << " stage " << stage;
        }
      }
    }
  }
}

TEST(PipelineScheduleTest, InterleavedAndZeroBubbleBeat1F1B) {
  const PipeCosts costs{.forward = 1, .backward_input = 1, .backward_weight = 1};
  for (int m : {2, 4, 8}) {
    const double one = Simulate(Build(Schedule::k1F1B, 2, m), 1, costs).bubble_fraction;
    const PipelineSimulation inter = Simulate(Build(Schedule::kInterleaved, 2, m, 2), 2, costs);
    const PipelineSimulation zb = Simulate(Build(Schedule::kZeroBubbleH1, 2, m), 1, costs);
    EXPECT_LT(inter.bubble_fraction, one) << "m=" << m;
    EXPECT_LT(zb.bubble_fraction, one) << "m=" << m;
    // ZB-H1's bubble is (p - 1)(F + b - W) per stage with equal passes: one pass, not 1F1B's
    // three; and no stage holds more micro-batches than 1F1B's fullest.
    EXPECT_NEAR(zb.makespan, 3.0 * m + 1, 1e-12) << "m=" << m;
    for (const StageTimeline& t : zb.stages) EXPECT_LE(t.peak_activations, std::min(m, 2));
  }
  // The four side by side (printed for docs/design/pipeline-schedules.md).
  std::string table = "p m  ideal  gpipe   1f1b  inter2  zb-h1\n";
  for (int m : {2, 4, 8}) {
    table +=
        fmt::format("2 {}  {:.3f}  {:.3f}  {:.3f}  {:.3f}  {:.3f}\n", m, IdealBubbleFraction(2, m),
                    Simulate(Build(Schedule::kGpipe, 2, m), 1, costs).bubble_fraction,
                    Simulate(Build(Schedule::k1F1B, 2, m), 1, costs).bubble_fraction,
                    Simulate(Build(Schedule::kInterleaved, 2, m, 2), 2, costs).bubble_fraction,
                    Simulate(Build(Schedule::kZeroBubbleH1, 2, m), 1, costs).bubble_fraction);
  }
  std::cout << table;
  // p = 4, m = 8: interleaving with v = 2 halves the warm-up and cool-down; ZB-H1 idles
  // (p - 1) passes per stage.
  const double one = Simulate(Build(Schedule::k1F1B, 4, 8), 1, costs).bubble_fraction;
  const double inter = Simulate(Build(Schedule::kInterleaved, 4, 8, 2), 2, costs).bubble_fraction;
  const PipelineSimulation zb = Simulate(Build(Schedule::kZeroBubbleH1, 4, 8), 1, costs);
  EXPECT_LT(inter, one);
  EXPECT_NEAR(zb.makespan, 3.0 * 8 + 3, 1e-12);
  for (const StageTimeline& t : zb.stages) EXPECT_LE(t.peak_activations, 4);
}

TEST(PipelineScheduleTest, SendsLengthenThePipeline) {
  const auto schedule = Build(Schedule::k1F1B, 3, 4);
  const double free = Simulate(schedule, 1).makespan;
  const double sent = Simulate(schedule, 1, {.send = 0.5}).makespan;
  // The first micro-batch crosses 2 links forward and 2 back before the pipeline drains.
  EXPECT_GE(sent, free + 4 * 0.5);
}

TEST(PipelineScheduleTest, BadSchedulesAreRefusedWithTheReason) {
  EXPECT_THAT(BuildPipelineSchedule(Schedule::kInterleaved, 2, 3, 2).status().message(),
              HasSubstr("m a multiple of p"));
  EXPECT_THAT(BuildPipelineSchedule(Schedule::k1F1B, 2, 4, 2).status().message(),
              HasSubstr("v=2 needs the interleaved schedule"));
  EXPECT_EQ(BuildPipelineSchedule(Schedule::kGpipe, 0, 4).status().code(),
            ErrorCode::kInvalidArgument);

  // The last stage runs B0 before F0 can have arrived from... itself: it never can.
  std::vector<std::vector<PipeOp>> swapped = Build(Schedule::k1F1B, 2, 2);
  std::swap(swapped[1][0], swapped[1][1]);
  Result<PipelineSimulation> r = SimulatePipeline(swapped, 1, {});
  EXPECT_THAT(r.status().message(), HasSubstr("deadlock: "));
  EXPECT_THAT(r.status().message(), HasSubstr("stage 1 waits forever at pass 0 (B0"));

  std::vector<std::vector<PipeOp>> missing = Build(Schedule::kZeroBubbleH1, 2, 2);
  missing[0].pop_back();  // W1 of stage 0
  EXPECT_THAT(SimulatePipeline(missing, 1, {}).status().message(),
              HasSubstr("stage 0: micro-batch 1 chunk 0 needs one B, or one b and one W"));
  std::vector<std::vector<PipeOp>> twice = Build(Schedule::kGpipe, 2, 2);
  twice[0].push_back(twice[0][0]);
  EXPECT_THAT(SimulatePipeline(twice, 1, {}).status().message(), HasSubstr("appears twice"));
}

TEST(PartitionTest, MinimisesTheLargestPart) {
  const std::vector<double> even = {1, 1, 1, 1, 1, 1};
  EXPECT_EQ(*PartitionByCost(even, 3), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(*PartitionByCost(even, 1), (std::vector<int>{0, 6}));
  EXPECT_EQ(*PartitionByCost(even, 6), (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
  // Seven equal layers over three stages: 3, 2, 2 (the extra one early).
  const std::vector<double> seven(7, 1.0);
  EXPECT_EQ(*PartitionByCost(seven, 3), (std::vector<int>{0, 3, 5, 7}));
  // A heavy last unit gets a part of its own.
  const std::vector<double> heavy = {1, 1, 1, 1, 10};
  EXPECT_EQ(*PartitionByCost(heavy, 2), (std::vector<int>{0, 4, 5}));
  EXPECT_EQ(PartitionByCost(even, 7).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(PartitionByCost(even, 0).status().code(), ErrorCode::kInvalidArgument);
  const std::vector<double> negative = {1, -1};
  EXPECT_EQ(PartitionByCost(negative, 1).status().code(), ErrorCode::kInvalidArgument);
}

TEST(PartitionTest, StagesAreBalancedByCostNotCount) {
  ModelSpec spec;
  spec.name = "gpt2";
  spec.layers = 12;
  spec.hidden = 768;
  spec.heads = 12;
  spec.ffn_hidden = 3072;
  spec.vocab = 50257;
  spec.seq_len = 1024;
  spec.batch_per_rank = 1;
  const std::vector<double> costs = LayerCosts(spec);
  ASSERT_EQ(costs.size(), 12u);
  EXPECT_GT(costs.back(), 2 * costs.front());  // the logits of a 50k vocabulary
  Result<std::vector<int>> stages = BalanceStages(spec, 4);
  ASSERT_TRUE(stages.ok()) << stages.status();
  ASSERT_EQ(stages->size(), 5u);
  const int first = (*stages)[1] - (*stages)[0];
  const int last = (*stages)[4] - (*stages)[3];
  EXPECT_LT(last, first);  // by count it would be 3 and 3
  EXPECT_THAT(BalanceStages(spec, 13).status().message(), HasSubstr("13 stages for 12 layers"));
}

}  // namespace
}  // namespace kc::parallel
