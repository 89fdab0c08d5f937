// The admin example shipped in examples/admin/ loads and says what the operations guide says.
#include <gtest/gtest.h>

#include <string>

#include "comm/comm_limits_config.h"
#include "tests/support/repo_root.h"

namespace kc::comm {
namespace {

TEST(CommLimitsExampleTest, TheShippedExampleLoads) {
  Result<CommLimits> limits =
      LoadCommLimits(kc::testing::RepoRoot() + "examples/admin/comm-limits.yaml");
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_EQ(limits->ForJob("team-a/train").ops_per_second, 2000);
  EXPECT_EQ(limits->ForJob("team-b/eval").bytes_per_second, 1e9);
  EXPECT_EQ(limits->ForJob("someone-else").ops_per_second, 10000);
  EXPECT_EQ(limits->lanes.priority[0], Lane::kGradient);
}

}  // namespace
}  // namespace kc::comm
