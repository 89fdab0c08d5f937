// The resilient runner: the training loop of a rank. It steps the L3 engine, saves
// checkpoints on a cadence (asynchronously: the step only waits for the copy to memory) and
// restores from one, so the engine below knows nothing of checkpoints or faults. Failure
// detection and elastic recovery (the fault-tolerance issue) grow here.
//
//   KC_ASSIGN_OR_RETURN(auto runner, ResilientRunner::Create(trainer.get(), options));
//   KC_RETURN_IF_ERROR(runner->Restore());  // when options.resume_from is set
//   KC_RETURN_IF_ERROR(runner->Run(callbacks));
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "comm/store.h"
#include "fault/checkpoint.h"
#include "parallel/trainer.h"

namespace kc::fault {

struct RunnerOptions {
  int64_t steps = 0;  // the run ends when this many steps are done (a resumed run counts on)
  // Checkpoints: none when checkpoint.dir is empty.
  CheckpointOptions checkpoint;
  int64_t checkpoint_every = 0;  // steps between checkpoints; 0: only after the last step
  // Instead, the Young/Daly interval sqrt(2 C MTBF) for this mean time between failures or
  // preemptions (seconds), C being the checkpoint's measured cost to the training: the step's
  // stall plus what the background persist slows the steps it overlaps. Re-estimated at every
  // checkpoint; rank 0's choice is every rank's (through the store).
  double mtbf_s = 0;
  // checkpoint_every: auto on a cluster: instead of mtbf_s (which is then 0), the mean time
  // between interruptions L4 advises for the job's pool and class (sched::CheckpointAdvice's
  // mtbi_s), asked again at every re-estimate so that the run follows changes of the advice.
  // `source` says whose advice it is; it is recorded with each interval. An advice of 0 or less
  // checkpoints after every step until a positive one comes.
  struct AdvisedMtbf {
    double mtbf_s = 0;
    std::string source;
  };
  std::function<AdvisedMtbf()> advised_mtbf;
  std::string resume_from;  // a checkpoint directory (DIR/step-N) to start from, or empty
  nlohmann::json plan;      // recorded in the manifest
  nlohmann::json model;     // recorded in the manifest; checked when resuming
  int rank = 0;
  int ranks = 1;
  comm::Store* store = nullptr;  // not owned; for several ranks' checkpoints
};

struct RunnerCallbacks {
  // After every step, with its statistics; an error stops the run.
  std::function<Status(const parallel::StepStats&)> on_step;
  // After every step's statistics and any checkpoint started for it (evaluation, fault
  // injection); `done` counts steps from the start of training.
  std::function<Status(int64_t done)> after_step;
  // When a checkpoint has been persisted (on this rank; committed too on rank 0).
  std::function<void(const SaveStats&)> on_checkpoint;
  // After every step's statistics: whether the run stops after it, short of options.steps (a
  // stop asked for from outside: the job's host is being freed). Every rank must answer true
  // for the same step. The run then saves a checkpoint of that step (with a checkpoint
  // directory), waits until it is persisted, and returns kCancelled.
  std::function<bool(int64_t done)> stop_after;
  // With mtbf_s or advised_mtbf: each new interval, its steps, and the cost, the interval in
  // seconds and the MTBF behind it, with where the MTBF came from.
  struct Interval {
    int64_t steps = 0;
    double cost_s = 0;
    double interval_s = 0;
    double mtbf_s = 0;
    std::string source;  // "mtbf_s" (given), or the advice's source
  };
  std::function<void(const Interval&)> on_interval;
};

class ResilientRunner {
 public:
  static Result<std::unique_ptr<ResilientRunner>> Create(parallel::Trainer* trainer,
                                                         const RunnerOptions& options);

  // Loads options.resume_from into the trainer (any plan's checkpoint of the same model) and
  // returns the step it holds; kInvalidArgument when its model differs from this one (naming
  // the field) or it is already at options.steps.
  Result<int64_t> Restore();

  // Steps until options.steps are done, checkpointing on the cadence and after the last step,
  // and waits for the last checkpoint to be persisted. kCancelled when callbacks.stop_after
  // stopped it sooner (with its checkpoint persisted too).
  Status Run(const RunnerCallbacks& callbacks);

  // Saves a checkpoint of the state now and waits until it is committed (a job stopping below
  // its minimum size).
  Status SaveNow(const RunnerCallbacks& callbacks);

  // From any thread: the run's group is gone (a new generation began). Waits on other ranks
  // through the store (a checkpoint's commit, the shared checkpoint interval) give up with
  // kAborted instead of waiting out their deadlines. The communicator is aborted separately.
  void Abandon();

 private:
  ResilientRunner(parallel::Trainer* trainer, RunnerOptions options)
      : trainer_(trainer), options_(std::move(options)) {}
  Status Checkpoint(const RunnerCallbacks& callbacks);
  Ownership Owner() const;  // which pieces of the state this rank saves
  // Whether the interval is Young/Daly's (mtbf_s or advised_mtbf), not checkpoint_every.
  bool auto_interval() const { return options_.mtbf_s > 0 || options_.advised_mtbf != nullptr; }
  // With auto_interval(): the steps until the next checkpoint, from the last persisted one's
  // cost.
  Result<int64_t> NextInterval(const RunnerCallbacks& callbacks);

  parallel::Trainer* const trainer_;
  const RunnerOptions options_;
  std::atomic<bool> abandoned_{false};
  std::unique_ptr<CheckpointWriter> writer_;
  int64_t reported_ = -1;        // the last checkpoint step handed to on_checkpoint
  int64_t next_checkpoint_ = 1;  // with mtbf_s: the step after which the next one is taken
  // Recent step times, with and without a persist in the background (seconds).
  std::vector<double> clean_steps_;
  std::vector<double> busy_steps_;
};

// The fields of a model spec that fix its parameters' shapes, as the manifest records them.
nlohmann::json ModelFingerprint(const parallel::ModelSpec& spec);

}  // namespace kc::fault
