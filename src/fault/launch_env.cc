#include "fault/launch_env.h"

#include <fmt/format.h>

#include <filesystem>

namespace kc::fault {

std::string HeartbeatFile(const std::string& heartbeat_dir, int rank) {
  return (std::filesystem::path(heartbeat_dir) / fmt::format("rank-{}", rank)).string();
}

std::vector<std::pair<std::string, std::string>> LaunchEnvironment(const LaunchContract& c,
                                                                   int local_rank,
                                                                   bool omp_num_threads_set) {
  const int rank =
      (c.first_rank >= 0 ? c.first_rank : c.group_rank * c.local_world_size) + local_rank;
  std::vector<std::pair<std::string, std::string>> env = {
      {"MASTER_ADDR", c.master_addr},
      {"MASTER_PORT", std::to_string(c.master_port)},
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(c.world_size)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(c.local_world_size)},
      {"GROUP_RANK", std::to_string(c.group_rank)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(c.world_size)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(c.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(c.max_restarts)},
      {"TORCHELASTIC_RUN_ID", c.run_id},
  };
  if (!c.checkpoint_dir.empty()) env.emplace_back("KC_CHECKPOINT_DIR", c.checkpoint_dir);
  if (!c.heartbeat_dir.empty()) {
    env.emplace_back("KC_HEARTBEAT_FILE", HeartbeatFile(c.heartbeat_dir, rank));
    env.emplace_back("KC_HEARTBEAT_PERIOD", fmt::format("{}", c.heartbeat_period_s));
  }
  if (c.local_world_size > 1 && !omp_num_threads_set) env.emplace_back("OMP_NUM_THREADS", "1");
  return env;
}

bool IsLaunchVariable(std::string_view name) {
  if (name.starts_with("TORCHELASTIC_") || name.starts_with("KC_")) return true;
  // The devices a rank may use are the ones the scheduler gave it (a cluster agent sets it).
  if (name == "CUDA_VISIBLE_DEVICES") return true;
  // Every name the launch gives, from a contract that sets them all (OMP_NUM_THREADS not).
  static const std::vector<std::pair<std::string, std::string>> given =
      LaunchEnvironment({.local_world_size = 2, .checkpoint_dir = "d"}, 0,
                        /*omp_num_threads_set=*/true);
  for (const auto& [launch, value] : given) {
    if (name == launch) return true;
  }
  return false;
}

}  // namespace kc::fault
