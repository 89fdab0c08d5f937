#include "parallel/planner/local_host.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace kc::parallel::planner {
namespace {

using ::testing::HasSubstr;

TEST(LocalHostTest, UpToFourDevicesACoreAreAllowed) {
  hal::HostInfo info;
  info.pus = 2;
  EXPECT_TRUE(CheckLocalDevices(8, info).ok());
  const Status more = CheckLocalDevices(9, info);
  EXPECT_EQ(more.code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(more.message(), HasSubstr("--devices 9: more than four per core of the 2 cores"));
}

// More devices than cores share them: the cluster has every device with its share of the
// host's figures, unpinned; as many as the cores, each device has its own.
TEST(LocalHostTest, DevicesBeyondTheCoresShareThem) {
  Result<hal::HostInfo> info = hal::ProbeHost();
  ASSERT_TRUE(info.ok()) << info.status();
  const int cores = std::max(1, info->pus);
  Result<MeasuredHost> own = MeasureLocalHost(*info, cores, /*quick=*/true);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->cluster.spec.devices, cores);
  EXPECT_EQ(own->cluster.spec.oversubscription, 1);
  ASSERT_EQ(own->device_cpus.size(), static_cast<size_t>(cores));
  for (const std::vector<int>& cpus : own->device_cpus) EXPECT_FALSE(cpus.empty());

  Result<MeasuredHost> shared = MeasureLocalHost(*info, 2 * cores, /*quick=*/true);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->cluster.spec.devices, 2 * cores);
  EXPECT_DOUBLE_EQ(shared->cluster.spec.oversubscription, 2);
  EXPECT_GT(shared->cluster.spec.peak_flops, 0);
  ASSERT_EQ(shared->device_cpus.size(), static_cast<size_t>(2 * cores));
  for (const std::vector<int>& cpus : shared->device_cpus) EXPECT_TRUE(cpus.empty());
  ASSERT_EQ(shared->cluster.notes.size(), 1u);
  EXPECT_THAT(shared->cluster.notes[0], HasSubstr("devices share"));
}

TEST(LocalHostTest, ACalibrationOfAnotherModelSaysSo) {
  Calibration c;
  c.host = "h";
  c.model = "gpt-tiny";
  c.cpus_per_device = 2;
  c.cluster.devices = 3;
  const PlannerCluster same = FromCalibration(c, "gpt-tiny");
  EXPECT_EQ(same.spec.devices, 3);
  EXPECT_EQ(same.spec.device, hal::DeviceKind::kCpu);
  EXPECT_TRUE(same.fp32);
  EXPECT_EQ(same.device_model, "2-core CPU slice");
  EXPECT_TRUE(same.notes.empty());
  const PlannerCluster other = FromCalibration(c, "gpt-small");
  ASSERT_EQ(other.notes.size(), 1u);
  EXPECT_THAT(other.notes[0], HasSubstr("calibrated with model gpt-tiny"));
}

}  // namespace
}  // namespace kc::parallel::planner
