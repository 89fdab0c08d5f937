#include "hal/host_probe.h"

#include <gtest/gtest.h>
#include <sched.h>

namespace kc::hal {
namespace {

TEST(HostProbeTest, FindsTheCoresThisProcessMayUse) {
  Result<HostInfo> info = ProbeHost();
  ASSERT_TRUE(info.ok()) << info.status();
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  EXPECT_EQ(info->pus, CPU_COUNT(&allowed));
  EXPECT_GE(info->cores, 1);
  EXPECT_LE(info->cores, info->pus);
  EXPECT_GE(info->packages, 1);
}

TEST(HostProbeTest, EveryCpuBelongsToExactlyOneNumaNode) {
  Result<HostInfo> info = ProbeHost();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_GE(info->numa_nodes.size(), 1u);
  size_t cpus = 0;
  int64_t memory = 0;
  for (const NumaNode& n : info->numa_nodes) {
    cpus += n.cpus.size();
    memory += n.memory_bytes;
  }
  EXPECT_EQ(cpus, static_cast<size_t>(info->pus));
  if (info->numa_nodes.size() == 1) {
    EXPECT_EQ(memory, info->memory_bytes);
  } else {
    EXPECT_LE(memory, info->memory_bytes);
  }
  EXPECT_GT(info->memory_bytes, 0);
}

}  // namespace
}  // namespace kc::hal
