#include "sched/checkpoint_advice.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kc::sched {
namespace {

TEST(CheckpointAdviceTest, YoungAndDaly) {
  EXPECT_DOUBLE_EQ(YoungDalyInterval(10, 3600 * 5), std::sqrt(2.0 * 10 * 18000));  // 600 s
  EXPECT_EQ(YoungDalyInterval(0, 100), 0);
  // Daly's is close to Young's minus the cost when C is small against M.
  const double young = YoungDalyInterval(60, 36000);
  const double daly = DalyInterval(60, 36000);
  EXPECT_NEAR(daly, young - 60, 0.05 * young);
  EXPECT_EQ(DalyInterval(100, 40), 40);  // C >= 2M: checkpoint every M
  EXPECT_EQ(DalyInterval(0, 40), 0);
}

TEST(CheckpointAdviceTest, NoHistoryGivesTheSeedRuleThenTheHistoryTakesOver) {
  CheckpointAdvisor advisor;
  const CheckpointAdvisor::Key preemptible{.pool = 0, .job_class = 0, .borrowed = false};
  const CheckpointAdvisor::Key normal{.pool = 1, .job_class = 1, .borrowed = false};
  // The prior is Young's interval for a 60 s checkpoint at the seed rule's intervals.
  EXPECT_NEAR(advisor.Advise(preemptible, 60).interval_s, SeedRuleInterval(true), 0.1 * 450);
  EXPECT_NEAR(advisor.Advise(normal, 60).interval_s, SeedRuleInterval(false), 0.1 * 1800);
  // A hundred hours of running without an interruption: much longer intervals.
  advisor.AddExposure(preemptible, 100 * 3600);
  EXPECT_GT(advisor.Advise(preemptible, 60).interval_s, 3 * SeedRuleInterval(true));
  // Many interruptions: shorter than the seed rule.
  for (int i = 0; i < 400; ++i) advisor.AddInterruption(preemptible);
  const CheckpointAdvice a = advisor.Advise(preemptible, 60);
  EXPECT_EQ(a.interruptions, 400);
  EXPECT_NEAR(a.mtbi_s, (100 * 3600 + 450.0 * 450 / 120) / 401, 1e-6);
  EXPECT_LT(a.interval_s, SeedRuleInterval(true));
}

}  // namespace
}  // namespace kc::sched
