// Pools: static partitions of the cluster set by resource admins, and the scheduler's
// settings, from one YAML file (examples/admin/pools.yaml). Format and errors:
// docs/operations/scheduling.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "hal/topology.h"

namespace kc::sched {

// A job's class. Its numeric value is its priority level: a higher level is scheduled first
// and may preempt a lower one. Demotion lowers a job's level, not its class.
enum class JobClass : uint8_t { kPreemptible = 0, kNormal = 1, kHigh = 2 };
std::string_view JobClassName(JobClass c);  // "preemptible", "normal", "high"
std::optional<JobClass> JobClassFromName(std::string_view name);

struct PoolSpec {
  std::string name;
  std::vector<JobClass> classes;   // the classes level 1 maps here
  std::vector<std::string> teams;  // and their teams; empty: every team
  // Exactly one of these says which devices: a count or a share of the cluster (whole hosts
  // along the topology, rack by rack), a Slurm hostlist, or whatever the others leave.
  int devices = 0;
  double share = 0;
  std::string hosts;
  bool rest = false;
  bool lend = true;  // idle devices may run other pools' jobs (preemptibly)
};

struct SchedulerSettings {
  double fair_share_half_life_s = 7 * 86400.0;  // decay of recorded usage (Slurm's default)
  double preempt_grace_s = 30;                  // a victim's time to checkpoint before it stops
  double reconfigure_s = 5;                     // an elastic job's pause to shrink or grow
  double restart_s = -1;  // a resumed job's load time; < 0: its checkpoint cost
  // Priority demotion: a job whose fault rate over its running time passes this many faults
  // an hour, after at least `demote_min_faults` faults, drops a level.
  double demote_faults_per_hour = 2;
  int demote_min_faults = 3;
  int backfill_depth = 2000;          // pending jobs a pass considers for backfill
  double grow_min_remaining_s = 600;  // grow an elastic job only if it has this much to run
  // A job pending this long in all (PBS's max_starve) is starving: it goes first within its
  // level, and a preemptible one is scheduled at the normal level from then on. 0: never.
  double starve_after_s = 4 * 3600.0;
  // A high-priority job that has waited this long, or whose reservation would start it later
  // than this, may also preempt normal jobs on the pools it may use (they checkpoint within
  // the grace period and go back to the queue). A gang larger than what it may take at once
  // then waits about this long at most. 0: high-priority jobs preempt only preemptible ones.
  double high_max_wait_s = 1800;
};

struct PoolConfig {
  std::vector<PoolSpec> pools;
  SchedulerSettings settings;
};

// Reads a pools file. kNotFound if the file does not exist; kInvalidArgument as
// "FILE:LINE: key.path: what" for an unknown key, a pool with no name or a name used twice,
// an unknown class, a pool with none or more than one of devices/share/hosts/rest, two rest
// pools, or a setting out of range. Whether the pools fit a cluster is checked by
// PartitionPools.
Result<PoolConfig> LoadPoolConfig(const std::string& path);
Result<PoolConfig> LoadPoolConfigString(std::string_view text, std::string display_name);

// The pools used when no file is given: "high" (1/8 of the devices, class high), "normal"
// (the rest, class normal) and "preemptible" (1/4, class preemptible), all lending.
PoolConfig DefaultPoolConfig();

// One pool, "all", of every device, for every class: a cluster's pools before an admin sets
// any (kcd's scheduler without DIR/pools.yaml).
PoolConfig AllDevicesPoolConfig();

// A pool with its devices (ascending indices into the topology).
struct Pool {
  PoolSpec spec;
  std::vector<int> devices;
};

// Gives every pool its devices: hostlist pools first, then count and share pools in file
// order take whole hosts in topology order (rack by rack, hosts in file order within a
// rack; a count that is not a multiple of the host size ends with part of a host), then the
// rest pool. kInvalidArgument naming the pool for a hostlist naming an unknown host or a
// host another pool has, pools asking for more devices than there are, a pool left with no
// devices, or devices left over with no rest pool. Linear in devices.
Result<std::vector<Pool>> PartitionPools(const hal::Topology& topology, const PoolConfig& config);

}  // namespace kc::sched
