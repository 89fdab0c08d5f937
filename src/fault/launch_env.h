// The environment a rank of any program is started with: the launch contract PyTorch programs
// read (torchrun's, so that `init_process_group("env://")`, DDP and torch.distributed.elastic's
// helpers work unchanged) plus Kuangchao's own. Used by `kc run` for local runs.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kc::fault {

struct LaunchContract {
  std::string master_addr = "127.0.0.1";  // where rank 0's TCPStore listens
  int master_port = 0;
  int world_size = 1;        // ranks of the run
  int local_world_size = 1;  // ranks on this host
  int group_rank = 0;        // this host's index among the run's hosts
  // The rank of this host's local rank 0; -1: group_rank * local_world_size (every host runs
  // as many ranks, as torchrun's --nproc-per-node).
  int first_rank = -1;
  int restart_count = 0;  // runs of the job before this one (torchrun's restarts)
  int max_restarts = 0;
  std::string run_id;          // one id per job, the same over its restarts
  std::string checkpoint_dir;  // KC_CHECKPOINT_DIR: lasts over restarts; "" = none
  // Heartbeats (kc run --heartbeat-timeout): rank r touches KC_HEARTBEAT_FILE,
  // heartbeat_dir/rank-r, every KC_HEARTBEAT_PERIOD seconds (kc's torch backend does it for a
  // program that uses it). "" = none.
  std::string heartbeat_dir;
  double heartbeat_period_s = 1;
};

// The file rank `rank` beats on under `heartbeat_dir`.
std::string HeartbeatFile(const std::string& heartbeat_dir, int rank);

// NAME=VALUE pairs for the rank `local_rank` of this host: MASTER_ADDR, MASTER_PORT, RANK
// (first_rank, or group_rank * local_world_size, + local_rank), WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, KC_CHECKPOINT_DIR (when set),
// KC_HEARTBEAT_FILE and KC_HEARTBEAT_PERIOD (with a heartbeat_dir), and, as
// torchrun does for several ranks on a host, OMP_NUM_THREADS=1 unless `omp_num_threads_set`.
std::vector<std::pair<std::string, std::string>> LaunchEnvironment(const LaunchContract& c,
                                                                   int local_rank,
                                                                   bool omp_num_threads_set);

// Whether the launch sets `name` for each rank (any variable LaunchEnvironment gives but
// OMP_NUM_THREADS, which is only a default, every TORCHELASTIC_* and KC_* name, and
// CUDA_VISIBLE_DEVICES, which a cluster agent sets to the job's GPUs): a job may not set it
// itself.
bool IsLaunchVariable(std::string_view name);

}  // namespace kc::fault
