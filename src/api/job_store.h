// kcd's record of jobs and their lifecycle, in SQLite (WAL, synchronous commits): a job the
// store acknowledged survives kcd being killed at any moment. The lifecycle is
//
//   pending -> approval_required -> queued -> running <-> paused
//                                                     -> succeeded | failed | cancelled
//
// and every change is a checked transition. Design: docs/design/kcd-state.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kc::api {

enum class JobPhase : uint8_t {
  kPending,           // accepted, not yet checked against quotas and the planner
  kApprovalRequired,  // its plan passes an approval limit: waits for a resource admin
  kQueued,            // the scheduler has it
  kRunning,
  kPaused,  // checkpointed and stopped (preempted, paused by a user, out of runtime)
  kSucceeded,
  kFailed,
  kCancelled,
};
std::string_view JobPhaseName(JobPhase p);  // "pending", "approval_required", ...
std::optional<JobPhase> JobPhaseFromName(std::string_view name);
bool IsTerminal(JobPhase p);  // succeeded, failed, cancelled
// Whether a job may go from `from` to `to` (the diagram above, plus cancelled and failed from
// any phase that is not terminal, running back to queued when its devices are lost, and
// queued to paused: a job paused before it started).
bool AllowedTransition(JobPhase from, JobPhase to);

struct JobRecord {
  int64_t id = 0;  // set by Submit: 1, 2, ...
  std::string name;
  std::string owner;
  std::string team;
  std::string spec;  // the submitted job file, as given
  // What it asked for, for quotas: devices at most, expected device-hours, storage.
  int64_t devices = 0;
  double device_hours = 0;
  double storage_gb = 0;
  JobPhase phase = JobPhase::kPending;
  double submitted_s = 0;  // seconds since the Unix epoch
  double updated_s = 0;
  std::string reason;  // why it is in its phase
  // Read only: the time it has spent running, every run together (seconds), up to its last
  // change of phase.
  double ran_s = 0;
};

// One change of a job's phase.
struct JobEvent {
  JobPhase phase = JobPhase::kPending;
  std::string reason;
  double time_s = 0;
};

// Where a job runs or last ran, and how far it got, as its agent last reported.
struct JobProgress {
  std::string host;
  int64_t step = 0;
  int64_t checkpoint_step = 0;
};

struct JobFilter {
  std::string owner;              // "" = any
  std::optional<JobPhase> phase;  // nullopt = any
  bool active = false;            // only jobs that have not ended (the dispatcher's passes)
  int limit = 1000;
};

struct JobStoreOptions {
  // Output kept per job: past it, the oldest is dropped (offsets stay those of the whole
  // output), so no job's logs grow kcd's database without bound.
  int64_t max_log_bytes = int64_t{16} << 20;
};

// A stretch of a job's output: `data` starts at byte `from` of everything it wrote (past the
// offset asked for when the bytes between were dropped).
struct LogSlice {
  int64_t from = 0;
  std::string data;
};

// One report of a job's run: a serialized kc.v1.TrainReport, and whether it is an event (the
// run's start or summary, a fault), kept apart from the steps and checkpoints.
struct JobReport {
  std::string bytes;
  bool event = false;
};

// Safe for concurrent use (one connection, serialised by a mutex).
class JobStore {
 public:
  // Opens or creates the store at `path`. kUnavailable naming the file when it cannot.
  static Result<std::unique_ptr<JobStore>> Open(const std::string& path,
                                                const JobStoreOptions& options = {});
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Records a new job in phase pending and returns it with its id, after the commit is on
  // disk. kInvalidArgument for an empty name or owner; kUnavailable when the write fails.
  Result<JobRecord> Submit(JobRecord job, double now_s);
  // Moves job `id` to `to` with `reason`. kNotFound for an unknown id; kFailedPrecondition,
  // naming both phases, for a transition the lifecycle does not allow.
  Result<JobRecord> Transition(int64_t id, JobPhase to, std::string reason, double now_s);
  // Sets why job `id` is where it is without changing its phase or its history (a waiting
  // job's pending reason, as the scheduler's passes refine it). kNotFound for an unknown id;
  // kFailedPrecondition for a job that ended; kUnavailable when the write fails.
  Status SetReason(int64_t id, std::string_view reason, double now_s);
  // Records in job `id`'s history an event of its run that keeps its phase (a running job that
  // shrank after a rank's loss, or grew back), which also becomes its reason. kNotFound;
  // kFailedPrecondition for a job that ended; kUnavailable when the write fails.
  Status Note(int64_t id, std::string reason, double now_s);
  Result<JobRecord> Get(int64_t id) const;
  Result<std::vector<JobRecord>> List(const JobFilter& filter) const;
  // How many of `owner`'s jobs have not ended.
  Result<int64_t> CountActive(std::string_view owner) const;
  // How many jobs are in each phase (phases without any are left out).
  Result<std::map<JobPhase, int64_t>> CountByPhase() const;
  // Every change of job `id`'s phase (its submission first), oldest first.
  Result<std::vector<JobEvent>> History(int64_t id) const;

  // Renames job `id` and/or sets its expected device-hours (nullopt keeps each).
  // kNotFound; kFailedPrecondition for a job that ended; kInvalidArgument for an empty name.
  Result<JobRecord> Modify(int64_t id, std::optional<std::string> name,
                           std::optional<double> device_hours, double now_s);

  // The agent's report on a job. kNotFound for an unknown id.
  Status SetProgress(int64_t id, const JobProgress& progress);
  Result<JobProgress> Progress(int64_t id) const;  // zeros before the first report

  // Appends output of the job's processes, dropping its oldest past options.max_log_bytes;
  // reads it back from byte `offset` (at most `max_bytes`, from the oldest kept when `offset`
  // was dropped). Logs live with the job in kcd's database.
  Status AppendLog(int64_t id, std::string_view data);
  Result<LogSlice> ReadLog(int64_t id, int64_t offset, int64_t max_bytes) const;

  // Appends what job `id`'s runs reported, keeping its newest kMaxJobReports steps and
  // checkpoints and its newest kMaxJobEvents events (runs' starts and summaries, faults), so
  // that a long run's start outlasts its steps; reads them back, oldest first. kNotFound for
  // an unknown id.
  static constexpr int64_t kMaxJobReports = 5000;
  static constexpr int64_t kMaxJobEvents = 1000;
  Status AppendReports(int64_t id, const std::vector<JobReport>& reports);
  Result<std::vector<std::string>> Reports(int64_t id) const;

 private:
  struct Impl;
  explicit JobStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kc::api
