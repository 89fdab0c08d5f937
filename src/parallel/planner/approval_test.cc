#include "parallel/planner/approval.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kc::parallel::planner {
namespace {

using ::testing::HasSubstr;

PlanEstimate Estimate() {
  PlanEstimate e;
  e.step_time_s = 2;
  e.memory.total = 50e9;
  e.tp.bytes_per_step = 1e9;
  e.pp.bytes_per_step = 0.5e9;
  e.dp.bytes_per_step = 0.5e9;
  return e;
}

ParallelPlan Plan() {
  ParallelPlan p;
  p.t = 8;
  p.p = 4;
  p.d = 4;  // 128 devices
  return p;
}

TEST(ApprovalTest, NoLimitsNeverRequireApprovalButTheFiguresAreThere) {
  const ApprovalVerdict v = CheckApproval(Plan(), Estimate(), 1000, {});
  EXPECT_FALSE(v.required);
  EXPECT_EQ(v.devices, 128);
  EXPECT_DOUBLE_EQ(v.memory_bytes_per_device, 50e9);
  EXPECT_DOUBLE_EQ(v.comm_bytes_per_step, 2e9 * 128);
  EXPECT_DOUBLE_EQ(v.runtime_s, 2000);
}

TEST(ApprovalTest, EachLimitPassedIsNamedWithItsFigure) {
  ApprovalLimits l;
  l.max_devices = 64;
  l.max_memory_bytes_per_device = 40e9;
  l.max_comm_bytes_per_step = 100e9;
  l.max_runtime_s = 1800;
  const ApprovalVerdict v = CheckApproval(Plan(), Estimate(), 1000, l);
  EXPECT_TRUE(v.required);
  ASSERT_EQ(v.reasons.size(), 4u);
  EXPECT_THAT(v.reasons[0], HasSubstr("128 devices, above the limit of 64"));
  EXPECT_THAT(v.reasons[1], HasSubstr("50.00 GB per device"));
  EXPECT_THAT(v.reasons[2], HasSubstr("256.00 GB of communication per step"));
  EXPECT_THAT(v.reasons[3], HasSubstr("0.56 h expected for 1000 steps"));

  // Within every limit: no approval.
  l = {.max_devices = 128,
       .max_memory_bytes_per_device = 50e9,
       .max_comm_bytes_per_step = 256e9,
       .max_runtime_s = 2000};
  EXPECT_FALSE(CheckApproval(Plan(), Estimate(), 1000, l).required);
}

TEST(ApprovalTest, ARuntimeLimitWithUnknownStepsRequiresApproval) {
  const ApprovalVerdict v = CheckApproval(Plan(), Estimate(), 0, {.max_runtime_s = 3600});
  EXPECT_TRUE(v.required);
  ASSERT_EQ(v.reasons.size(), 1u);
  EXPECT_THAT(v.reasons[0], HasSubstr("runtime unknown"));
}

TEST(ApprovalTest, LimitsFileReadsAndRejectsWithFileAndLine) {
  Result<ApprovalLimits> l = LoadApprovalLimitsFromString(
      "max_devices: 256\nmax_memory_gb_per_device: 70\nmax_comm_gb_per_step: 500\n"
      "max_runtime_hours: 24\n",
      "limits.yaml");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->max_devices, 256);
  EXPECT_DOUBLE_EQ(l->max_memory_bytes_per_device, 70e9);
  EXPECT_DOUBLE_EQ(l->max_comm_bytes_per_step, 500e9);
  EXPECT_DOUBLE_EQ(l->max_runtime_s, 24 * 3600);

  Result<ApprovalLimits> bad =
      LoadApprovalLimitsFromString("max_devices: 8\nmax_gpus: 3\n", "l.yaml");
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("l.yaml:2"));
  EXPECT_THAT(bad.status().message(), HasSubstr("max_gpus"));
  bad = LoadApprovalLimitsFromString("max_runtime_hours: -1\n", "l.yaml");
  EXPECT_THAT(bad.status().message(), HasSubstr("max_runtime_hours"));
}

}  // namespace
}  // namespace kc::parallel::planner
