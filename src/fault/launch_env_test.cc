#include "fault/launch_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace kc::fault {
namespace {

std::map<std::string, std::string> AsMap(
    const std::vector<std::pair<std::string, std::string>>& v) {
  return {v.begin(), v.end()};
}

TEST(LaunchEnvironmentTest, GivesTorchrunsContractForEachRank) {
  const LaunchContract c{.master_port = 29500,
                         .world_size = 4,
                         .local_world_size = 2,
                         .group_rank = 1,
                         .restart_count = 2,
                         .max_restarts = 3,
                         .run_id = "job-7",
                         .checkpoint_dir = "/data/ckpt",
                         .heartbeat_dir = "/run/beats",
                         .heartbeat_period_s = 0.5};
  const std::map<std::string, std::string> env = AsMap(LaunchEnvironment(c, 1, false));
  EXPECT_EQ(env.at("MASTER_ADDR"), "127.0.0.1");
  EXPECT_EQ(env.at("MASTER_PORT"), "29500");
  EXPECT_EQ(env.at("RANK"), "3");  // host 1's second rank
  EXPECT_EQ(env.at("WORLD_SIZE"), "4");
  EXPECT_EQ(env.at("LOCAL_RANK"), "1");
  EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(env.at("GROUP_RANK"), "1");
  EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(env.at("TORCHELASTIC_MAX_RESTARTS"), "3");
  EXPECT_EQ(env.at("TORCHELASTIC_RUN_ID"), "job-7");
  EXPECT_EQ(env.at("KC_CHECKPOINT_DIR"), "/data/ckpt");
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(env.at("KC_HEARTBEAT_FILE"), "/run/beats/rank-3");  // by its rank in the run
  EXPECT_EQ(env.at("KC_HEARTBEAT_PERIOD"), "0.5");
  // Hosts of unequal shares (3 ranks: 2 on the first host, 1 here): its first rank is given.
  const LaunchContract uneven{
      .world_size = 3, .local_world_size = 1, .group_rank = 1, .first_rank = 2};
  EXPECT_EQ(AsMap(LaunchEnvironment(uneven, 0, false)).at("RANK"), "2");
}

TEST(LaunchEnvironmentTest, LeavesOutWhatIsNotAskedFor) {
  const LaunchContract one{.master_port = 1, .run_id = "r"};
  const std::map<std::string, std::string> env = AsMap(LaunchEnvironment(one, 0, false));
  EXPECT_EQ(env.count("KC_CHECKPOINT_DIR"), 0u);
  EXPECT_EQ(env.count("KC_HEARTBEAT_FILE"), 0u);
  EXPECT_EQ(env.count("KC_HEARTBEAT_PERIOD"), 0u);
  EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u);  // one rank: its threads are its own
  const LaunchContract two{.master_port = 1, .world_size = 2, .local_world_size = 2};
  EXPECT_EQ(AsMap(LaunchEnvironment(two, 0, /*omp_num_threads_set=*/true)).count("OMP_NUM_THREADS"),
            0u);
}

TEST(LaunchEnvironmentTest, ItsVariablesAreTheLaunchsOwn) {
  for (const char* name :
       {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
        "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
        "KC_CHECKPOINT_DIR", "KC_ANYTHING", "CUDA_VISIBLE_DEVICES"}) {
    EXPECT_TRUE(IsLaunchVariable(name)) << name;
  }
  for (const char* name : {"OMP_NUM_THREADS", "HF_HOME", "RANKS", "PATH"}) {
    EXPECT_FALSE(IsLaunchVariable(name)) << name;
  }
}

}  // namespace
}  // namespace kc::fault
