// The supervisor of one run: starts its ranks through a ProcessLauncher, watches them (their
// exits, and their heartbeats through the job's store), decides what follows a failure, and
// reports what happens through an observer. Without elasticity the first failure stops the
// others (a stop, then a kill after a grace period). With it (shape.min_ranks below the ranks)
// the survivors go on as the next generation, replacements are started up to max_restarts and
// taken in once they are up, and below min_ranks the run stops with a checkpoint of what
// survived. A stop request is passed on to every rank, which stop after a step they agree on,
// with a checkpoint of it. The supervisor knows nothing of processes, RPC or files: kc train
// drives it with a LocalLauncher; tests with a ThreadLauncher.
//
//   KC_ASSIGN_OR_RETURN(auto supervisor, Supervisor::Create({.ranks = 4, .shape = shape,
//                                                             .store = &store, .launcher = &l}));
//   KC_ASSIGN_OR_RETURN(RunOutcome outcome, supervisor->Run());  // until every rank has ended
//
// Design: docs/design/runtime.md, docs/design/elastic-recovery.md.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "comm/store.h"
#include "fault/elastic.h"
#include "fault/heartbeat.h"
#include "fault/launcher.h"
#include "fault/reports.h"

namespace kc::fault {

// Something that happened to the run's ranks: the fault log's events.
struct FaultEvent {
  enum class Kind {
    kDetected,   // a rank failed: it ended badly, or went silent and was killed
    kRecovered,  // a generation after a failure or a join restored its state and goes on
    kJoined,     // a replacement was taken into a generation
    kStopped,    // a generation below the minimum saved what survived and ended the run
    kResized,    // asked to run at `ranks` (Supervisor::Resize): workers started or retired
  };
  Kind kind = Kind::kDetected;
  int worker = -1;  // kDetected, kJoined
  // kResized: the ask and what was done ("retired workers 3, 2"). kDetected: why. `silent_s` > 0:
  // it sent no heartbeat for that long and was killed; else it ended by itself (`exit`),
  // `last_output` being its last line of diagnostics.
  std::string reason;  // for people, from the fields below
  double silent_s = 0;
  double heartbeat_timeout_s = 0;
  RankExit exit;
  std::string last_output;
  // kDetected of a silent rank: where every rank was in its collectives (HangReport), "" when
  // none waited in one.
  std::string hang;
  // The generation that follows (kDetected in an elastic run, kJoined) or was restored
  // (kRecovered, kStopped); -1: none.
  int64_t generation = -1;
  int ranks = 0;
  // kDetected of a generation below the minimum: the workers alive, how many of them could
  // have trained (whole replicas the global batch splits over), and the minimum.
  bool below_minimum = false;
  int alive = 0;
  int usable = 0;
  int min_ranks = 0;
  int d = 0;  // the replicas of that generation
  // kRecovered, kStopped.
  std::string source;  // "replica", "memory" (a peer host's in-memory copies) or "checkpoint"
  int64_t step = 0;    // of the state restored
  double rebuild_s = 0;
  // Steps reported before the failure that the restored state does not hold, and the time
  // from the failure (or join) to the state restored; unset when it followed no failure.
  std::optional<int64_t> steps_lost;
  std::optional<double> duration_s;

  // The fault log's record: {"event": "detected", "worker": 2, "reason": ..., ...}.
  nlohmann::json ToJson() const;
  // The record's "event": "detected", "recovered", "joined", "stopped" or "resized".
  std::string_view EventName() const;
};

// How a run ended.
struct RunOutcome {
  enum class End {
    kCompleted,     // every rank finished
    kFailed,        // a rank failed (`cause`) or the supervisor could not go on (`error`)
    kStopped,       // stopped on request (RequestStop), every rank after the same step
    kBelowMinimum,  // an elastic run lost ranks below its minimum (`cause`); what survived
                    // was checkpointed (with a checkpoint directory)
  };
  End end = End::kCompleted;
  std::optional<FaultEvent> cause;
  Status error;
  int faults = 0;  // ranks that failed
};

// Where every live rank is in its collectives, asked for while the run goes on
// (Supervisor::Inspect; `kc diagnose --live`).
struct ProgressSnapshot {
  int64_t request = 0;       // the asker's id, echoed
  std::vector<int> workers;  // the live workers, each asked
  // What each published with its last heartbeat (ProgressToJson's text: its communicators,
  // each with its newest operations); a worker absent has published nothing yet.
  std::map<int, std::string> progress;
  // HangReport of it: who holds up whom; "" when no rank has waited in one for two heartbeat
  // periods.
  std::string hang;
};

// What a supervisor reports, all from the thread running Supervisor::Run.
class SupervisorObserver {
 public:
  virtual ~SupervisorObserver() = default;
  // The run's progress, as its leaders report it (after a recovery the steps since the
  // restored state come again: the later ones count).
  virtual void OnReport(int /*worker*/, const Report& /*report*/) {}
  virtual void OnFault(const FaultEvent& /*event*/) {}
  // A line of a rank's diagnostics.
  virtual void OnOutput(int /*worker*/, const std::string& /*line*/) {}
  // A replacement worker was started (OK), or could not be (why).
  virtual void OnReplacement(int /*worker*/, const Status& /*started*/) {}
  // The answer to Supervisor::Inspect.
  virtual void OnProgress(const ProgressSnapshot& /*snapshot*/) {}
};

struct SupervisorOptions {
  int ranks = 1;  // workers 0..ranks-1 form the first generation
  // t, p, the global batch and [min_ranks, max_ranks]: elastic when min_ranks < ranks.
  ElasticShape shape;
  bool zero_sharded = false;  // ZeRO-1: a loss means state from a checkpoint
  int max_restarts = 0;       // replacements started, one per failure (elastic runs)
  HeartbeatOptions heartbeat;
  // The job's store, a connection for the supervisor alone: generations are announced and
  // heartbeats read there. Not owned. Null: a run of one rank, not watched by heartbeats and
  // not elastic.
  comm::Store* store = nullptr;
  ProcessLauncher* launcher = nullptr;     // not owned
  SupervisorObserver* observer = nullptr;  // not owned; may be null
  Clock* clock = Clock::Real();            // not owned
  // After a failure of a run that is not elastic: how long the other ranks have to stop
  // before they are killed.
  Duration stop_grace = std::chrono::seconds(5);
};

// Run and RequestStop may be called from different threads; Run once.
class Supervisor {
 public:
  // kInvalidArgument for options that cannot work (no launcher, an elastic run without a
  // store, a bad heartbeat period or timeout).
  static Result<std::unique_ptr<Supervisor>> Create(const SupervisorOptions& options);
  ~Supervisor();

  // Starts the ranks and supervises them until every one has ended (it waits for the ranks it
  // stops or kills): blocks for the run's length. How the run ended is the outcome; an error
  // only when the call was refused (the layer guard) and nothing started.
  Result<RunOutcome> Run();

  // From any thread: every rank is asked to stop after a step they agree on, with a checkpoint
  // of it; Run then ends kStopped, unless a failure ends it first.
  void RequestStop();

  // From any thread: the run is to go on at `ranks` workers, within [shape.min_ranks,
  // shape.max_ranks] (the scheduler's grow or shrink; an elastic run only, else ignored).
  // Growing: new workers start and join the next generation once they are up (not counted
  // against max_restarts). Shrinking: the workers not yet in the generation go first, then its
  // newest members: a generation without them is announced, the others go on from their own
  // state, and the retired ones are killed; their ends are no faults. The last call wins; one
  // made while a generation forms is carried out once it has.
  void Resize(int ranks);

  // From any thread: the observer is told where every live rank is in its collectives, from
  // their last heartbeats (OnProgress, within a heartbeat period or so), tagged `request`.
  // A run without a store (one rank) answers with no progress.
  void Inspect(int64_t request);

 private:
  class Impl;
  explicit Supervisor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kc::fault
