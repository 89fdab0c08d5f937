// What a training run reports as it goes, as typed records: the elastic worker hands them to
// its observer, a launcher carries them to the supervisor, and the supervisor hands them to its
// own observer (kc train writes them to metrics.jsonl and draws its progress from them; an
// agent passes them on to kcd). One JSON form, ReportToJson: the metrics file's records and the
// local launcher's pipe are it. Design: docs/design/runtime.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "base/status.h"
#include "fault/checkpoint.h"
#include "parallel/trainer.h"

namespace kc::fault {

// The first generation's engine is built (metrics type "start").
struct StartReport {
  int64_t parameters = 0;
  double flops_per_token = 0;
  int64_t grad_buckets = 0;
  int64_t arena_bytes = 0;                      // the leader's model memory
  std::vector<int64_t> stage_activation_bytes;  // per pipeline stage
};

// The run resumed from a checkpoint ("resume").
struct ResumeReport {
  int64_t step = 0;
  std::string checkpoint;
};

// A step done ("step"); times in milliseconds, as the metrics file has them.
struct StepReport {
  int64_t step = 0;  // 1-based: the steps done
  double loss = 0;   // mean over the global batch, before the step's update
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  double compute_ms = 0;
  double comm_exposed_ms = 0;
  double tp_comm_ms = 0;
  std::vector<double> stage_bubble;
  int64_t tokens = 0;  // in the global batch
  double tokens_per_s = 0;
  // This rank's collectives' wait for the job's comm limits (the admin's token buckets) in
  // the step; 0 without limits.
  double rate_limit_wait_ms = 0;
  // This rank's TCP links (none over shared memory): per lane (comm::Lane order: gradient,
  // activation, control, telemetry) the time its chunks queued in the step, summed over the
  // chunks, and the most chunks queued at once so far; the segments retransmitted since its
  // generation's communicator was made; the largest smoothed round trip now. Empty lanes: no
  // TCP links.
  std::vector<double> lane_wait_ms;
  std::vector<int64_t> lane_backlog;
  int64_t retransmits = 0;
  double rtt_ms = 0;
  // The in-memory copy exchanged after this step (memory_copy.h), if any: its time on this
  // rank and the bytes of the copies this rank holds now (its own and its peers').
  double memory_copy_ms = 0;
  int64_t memory_copy_bytes = 0;
};
StepReport ToStepReport(const parallel::StepStats& stats);

// A validation loss ("val").
struct EvaluationReport {
  int64_t step = 0;
  double loss = 0;
};

// A checkpoint persisted ("checkpoint").
struct CheckpointReport {
  int64_t step = 0;
  double stall_ms = 0;
  double persist_ms = 0;
  int64_t raw_bytes = 0;
  int64_t bytes_written = 0;
  int64_t chunks_written = 0;
  int64_t chunks_reused = 0;
  int64_t chunks_delta = 0;  // of chunks_written, deltas against the previous save
};
CheckpointReport ToCheckpointReport(const SaveStats& stats);

// A new Young/Daly checkpoint interval ("checkpoint_interval").
struct IntervalReport {
  int64_t step = 0;
  int64_t every_steps = 0;
  double cost_s = 0;
  double interval_s = 0;
  double mtbf_s = 0;
  std::string source;  // where mtbf_s came from: "mtbf_s" (given) or the scheduler's advice
};

// A generation after the first restored its state ("recovery"): by its leader.
struct RecoveryReport {
  int64_t generation = 0;
  int ranks = 0;
  int d = 0;
  int64_t micro_batch_size = 0;  // the leader's replica's (others may differ by a sequence)
  int64_t micro_batches = 0;
  int64_t step = 0;    // the steps done of the state restored
  std::string source;  // "replica", "memory" (a peer host's in-memory copies) or "checkpoint"
  int64_t state_bytes_received = 0;
  double rebuild_s = 0;  // from the generation's start to the state restored
  std::string reason;    // why the generation began
  bool stop = false;     // a generation below the minimum: it only saves a checkpoint
};

// A replacement worker is up and waits to be taken into a generation ("ready"): from it, not
// from a leader.
struct ReadyReport {
  int worker = 0;
};

// Each rank's compute time per step, its mean over its last second or so of steps ("ranks"):
// made by the supervisor from what the ranks publish (ComputeKey), every ten seconds or so, so
// that a straggler (a throttled device, other work on its cores) is seen by rank.
struct RanksReport {
  int64_t step = 0;          // the leader's last step when it was made
  std::vector<int> workers;  // in rank order of the generation running
  std::vector<double> compute_ms;
};

using Report =
    std::variant<StartReport, ResumeReport, StepReport, EvaluationReport, CheckpointReport,
                 IntervalReport, RecoveryReport, ReadyReport, RanksReport>;

// {"type": "step", "step": 12, ...}: the metrics file's record of it.
nlohmann::json ReportToJson(const Report& report);
// kInvalidArgument for an object that is no report (an unknown type, a missing or mistyped
// field).
Result<Report> ReportFromJson(const nlohmann::json& j);

// A worker's reports, from its engine's thread. Implementations say whether they are safe for
// concurrent use; the worker calls them from one thread.
class WorkerObserver {
 public:
  virtual ~WorkerObserver() = default;
  // The run's progress, from the leader (rank 0) of each generation; ReadyReport from a
  // replacement once it is up.
  virtual void OnReport(const Report& report) = 0;
};

}  // namespace kc::fault
