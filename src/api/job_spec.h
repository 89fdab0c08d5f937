// What `kc submit` sends: a job file (YAML) naming a model file and how to train it. The
// model's text travels inside the spec, so agents on other hosts need no shared filesystem.
// Paths a job names (data, checkpoints) are relative to the agent's own roots and may not
// climb out of them. Reference: docs/user-guide/jobs.md.
//
//   name: gpt-tiny
//   model: ../models/gpt-tiny.yaml   # relative to the job file
//   ranks: 2
//   steps: 200
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace kc::api {

// The most a job may ask for: its runtime (hours) and storage (GB). Finite: a job file's `.inf`
// is refused where it is read, naming the file, line and key.
inline constexpr double kMaxExpectedHours = 100000;
inline constexpr double kMaxStorageGb = 1e9;
// The largest model file a job file may name.
inline constexpr uintmax_t kMaxModelBytes = 1 << 20;

struct JobSpec {
  std::string name;
  std::string team;                  // "" = the submitter's first team
  std::string job_class = "normal";  // "high", "normal" or "preemptible"
  std::string model_yaml;            // the model file's text ("" for a command job)
  // A command job instead of a model: the program and its arguments, run on every rank with
  // torchrun's launch environment (`kc run`), in `workdir` (under the agent's work root; "" =
  // the job's own directory) with `env` set over the agent's environment.
  std::vector<std::string> command;
  std::string workdir;
  std::vector<std::pair<std::string, std::string>> env;
  int ranks = 1;  // worker processes, one device each, on one host
  // Elastic within [min_devices, ranks]: a run that loses ranks goes on down to min_devices,
  // and replacements start for the lost ones. The job file's `max_devices` is `ranks` (which is
  // shorthand for both); 0 here: min_devices = ranks (not elastic).
  int min_devices = 0;
  // The plan every rank runs, in kc train's --plan form ("t=1 p=1 d=2 ..."; PlanToString): the
  // job file's, checked at submission, or "" and kcd's planner's, which kcd writes here in the
  // spec of each start order, so that what runs is what was planned (and approved).
  std::string plan;
  int64_t steps = 100;
  int64_t global_batch = 0;      // 0: kc train's default
  int64_t checkpoint_every = 0;  // steps; 0: kc train's (after the last step only)
  // `checkpoint_every: auto`: the Young/Daly interval for the mean time between interruptions
  // kcd's scheduler advises for the job's pool and class, followed as the advice changes.
  bool checkpoint_auto = false;
  // After a run that failed (a rank lost below min_devices, kc train crashed or was killed),
  // the job is requeued and resumes from its newest good checkpoint, at most max_restarts
  // times, the first after restart_backoff_s seconds, each next after twice as long.
  int max_restarts = 3;
  double restart_backoff_s = 10;
  double expected_hours = 1;   // runtime allowed, for the device-hours quota; (0, 100000]
  double storage_gb = 0;       // [0, 1e9]
  std::string data;            // a manifest under the agent's data root; "" = its default
  std::string checkpoint_dir;  // under the agent's work root; "" = the job's own directory
  int checkpoint_keep = 3;     // checkpoints kept (the newest)
  bool checkpoint_compress = false;
  // Steps between in-memory copies of each rank's state on another host (kc train
  // --memory-copy-every); the job file's `memory_copy_every`: N, 0 (none) or auto (the default).
  // Here as in CheckpointPolicy: 0: auto, -1: none.
  int64_t memory_copy_every = 0;
  // What the gradients' all-reduces send (kc train --grad-wire): fp32 or bf16.
  std::string grad_wire = "fp32";
  // A rank silent for heartbeat_timeout_s (no heartbeat) is declared failed.
  double heartbeat_period_s = 1;
  double heartbeat_timeout_s = 30;
};

// Reads a job file. Errors are `FILE:LINE: key: ...`; a model file that is missing or
// invalid is named with the job file's key; a path that is absolute or climbs out with ".."
// is refused naming its key.
Result<JobSpec> LoadJobFile(const std::string& path);

// The spec as kcd stores it and agents receive it (JSON, the model inline), and back.
// ParseJobSpec checks it as LoadJobFile does; `display_name` stands for it in errors.
std::string JobSpecText(const JobSpec& spec);
Result<JobSpec> ParseJobSpec(std::string_view text, std::string display_name);

// kInvalidArgument, naming `key`, for a path that is absolute, empty where it must not be, or
// that has a ".." component: job-supplied paths stay under the roots the agent chooses.
Status CheckRelativePath(std::string_view key, std::string_view path);

// Whether a job's `checkpoint_dir` names the agent's own directories under its work root:
// jobs/ (every job's default checkpoints and runs) or agent/ (its records of processes).
bool IsReservedCheckpointDir(std::string_view path);

}  // namespace kc::api
