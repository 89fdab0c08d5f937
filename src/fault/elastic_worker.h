// One training rank of a run, every generation it is a member of: it builds the generation's
// communicator and engine (parallel::Trainer) as its rank there, brings them to the run's state
// (the checkpoint it was asked to resume from, its own state and the surviving replicas'
// (elastic.h), the in-memory copies of a peer host (memory_copy.h), or the newest good
// checkpoint), steps them with the resilient runner
// (runner.h), evaluates on a cadence, beats its heartbeat, stops after a step every rank agrees
// on when asked to, and reports its progress through an observer. When a generation fails
// (a peer lost or silent, a new generation announced) it keeps its state and joins the next
// one the supervisor announces. kc train's worker processes run one each; tests run several as
// threads (thread_launcher.h).
//
//   ElasticWorker worker(options);
//   Result<int> rank = worker.Run();  // OK: the run is done; kCancelled: stopped on request
//
// Design: docs/design/runtime.md, docs/design/elastic-recovery.md.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/status.h"
#include "comm/communicator.h"
#include "comm/store.h"
#include "fault/elastic.h"
#include "fault/heartbeat.h"
#include "fault/memory_copy.h"
#include "fault/reports.h"
#include "fault/runner.h"
#include "parallel/trainer.h"

namespace kc::fault {

// What a generation is to one worker: hooks see it.
struct WorkerGeneration {
  const Generation* generation = nullptr;  // valid during the hook
  int rank = 0;                            // the worker's rank in it
  int ranks = 1;
};

// Where a caller adds to a worker's generations (kc train's drills, its trace and export).
struct ElasticWorkerHooks {
  // Before each generation's engine is built: e.g. a timeline in trainer->timeline, a persist
  // hook in runner->checkpoint.on_persist.
  std::function<void(const WorkerGeneration&, parallel::TrainerOptions* trainer,
                     RunnerOptions* runner)>
      configure;
  // The generation's engine is built (its parameters initialised, before any state is
  // restored). An error ends the generation.
  std::function<Status(const WorkerGeneration&, parallel::Trainer& trainer)> on_trainer;
  // Before step `next` (1-based) runs: after the previous step's report, checkpoint and
  // evaluation, and before the first step of the first generation.
  std::function<void(int64_t next)> before_step;
};

struct ElasticWorkerOptions {
  int worker = 0;     // the lasting id (launcher.h)
  bool join = false;  // a replacement: it waits to be taken into a later generation
  // The first generation's ranks, t, p, the global batch and [min_ranks, max_ranks]: elastic
  // when min_ranks < ranks.
  int ranks = 1;
  ElasticShape shape;
  // Names the run's communicators ("<job>/g<generation>") and its stop key.
  std::string job = "kc";
  // A new connection to the run's store, one per user that blocks on it (the communicators,
  // the heartbeat, checkpoints, the generation watch, the stop). Unset for a run of one rank.
  std::function<Result<std::unique_ptr<comm::Store>>()> connect;
  comm::TransportKind transport = comm::TransportKind::kAuto;
  // The host this rank runs on (ranks of one host share memory; others are reached by TCP),
  // and the numeric address its TCP transport listens on and publishes: one the other hosts
  // reach. Empty host: this machine's name.
  std::string host;
  std::string bind_address = "127.0.0.1";
  // The cluster's topology (null: none): each generation's communicator places its ranks on
  // their hosts' devices in it by host name and chooses its collectives by its cost model
  // (comm::CommunicatorOptions::topology).
  std::shared_ptr<const hal::Topology> topology;
  // The job's comm limits (the admin's file): every generation's communicator admits its
  // operations through `rate_limiter` (not owned; null: no limit) and sends by `lanes`.
  comm::RateLimiter* rate_limiter = nullptr;
  comm::LaneOptions lanes;
  Duration timeout = std::chrono::minutes(5);  // rendezvous and collectives
  HeartbeatOptions heartbeat;                  // its period; its timeout bounds waits
  // The engine: everything but its communicator, its plan's size and its batch, set per
  // generation (trainer.plan's t, p and micro-batching are the shape's, its d the generation's;
  // the batch is the shape's global batch, each replica taking its share). trainer.plan's
  // schedule, v, recompute and zero_stage are the run's. trainer.device is not owned.
  parallel::TrainerOptions trainer;
  // The runner: everything but its rank, ranks, store and plan, set per generation.
  // runner.resume_from applies to the first generation only.
  RunnerOptions runner;
  // Every N steps (0: never) each rank copies its state in memory and sends a copy to a rank
  // of another host (memory_copy.h): a later generation whose lost ranks took every replica of
  // some position rolls back to those copies instead of reading the newest checkpoint, unless
  // that checkpoint is newer.
  int64_t memory_copy_every = 0;
  int64_t eval_every = 0;    // validation every N steps and after the last (0: the last only)
  int64_t eval_batches = 0;  // validation batches per rank; 0: no validation
  // A stop asked for from outside (a signal handler may set it): as RequestStop.
  const std::atomic<bool>* stop_requested = nullptr;
  WorkerObserver* observer = nullptr;  // not owned; may be null
  ElasticWorkerHooks hooks;
};

// Run on one thread; RequestStop and Abort from any.
class ElasticWorker {
 public:
  explicit ElasticWorker(ElasticWorkerOptions options);
  ~ElasticWorker();
  ElasticWorker(const ElasticWorker&) = delete;
  ElasticWorker& operator=(const ElasticWorker&) = delete;

  // Trains until the run is done and returns the worker's rank in its last generation (-1: it
  // ended a spare). kCancelled when it stopped on request (after the agreed step, with its
  // checkpoint); kAborted after Abort; otherwise the error that ended its last generation:
  // without elasticity any error; with it, one that is not a peer's loss (kAborted,
  // kUnavailable, kDeadlineExceeded: those are followed by the next generation the supervisor
  // announces), or a loss no next generation followed within the heartbeat timeout.
  Result<int> Run();

  // Stops after a step every rank agrees on (the generation's rank 0 names the one after the
  // step it has just done), with a checkpoint of it.
  void RequestStop() { stop_.store(true, std::memory_order_release); }

  // Ends Run at once, with `why` (a kill of a rank that is a thread): the generation's
  // communicators and runner are aborted; nothing more is reported.
  void Abort(Status why);

 private:
  struct Generation;
  Status RunGeneration(Generation& g);
  bool StopRequested() const;
  bool StopAfter(Generation& g, int64_t done);
  void Report(const fault::Report& report, bool leader);
  // Fails the live generation's communicators and runner with `why`.
  void AbortLive(const Status& why) KC_REQUIRES(mu_);
  // Adds a step's compute time and, about once a second, publishes the mean of those since
  // under ComputeKey (the supervisor's RanksReport finds stragglers by it).
  void PublishCompute(double compute_ms);
  void AddLinks(const comm::Communicator& comm, StepReport* report);

  const ElasticWorkerOptions o_;
  std::atomic<bool> stop_{false};
  // Store connections: each for one user (a call blocks its connection).
  std::unique_ptr<comm::Store> store_, heartbeat_store_, checkpoint_store_, watch_store_,
      stop_store_;
  std::unique_ptr<Heartbeat> heartbeat_;
  double compute_ms_sum_ = 0;  // steps' compute since the last publish (the worker's thread)
  int compute_steps_ = 0;
  std::chrono::steady_clock::time_point compute_published_{};
  int64_t stop_after_ = -1;       // the agreed step to stop after, once known
  Duration rate_limit_waited_{};  // the rate limiter's total wait at the last step
  // The links' counters at the last step, of that communicator (a new one starts from zero).
  const comm::Communicator* links_of_ = nullptr;
  comm::LinkStats links_seen_;
  StateSnapshot snapshot_;              // this worker's state when its last generation ended
  MemoryCopies copies_;                 // its in-memory copies (memory_copy_every)
  parallel::LoaderState loader_after_;  // the loader after the trainer's last step

  // Set when the live generation ends (the next one announced, or Abort): its communicator's
  // rendezvous, waiting on the store for a member that will never come, gives up at once.
  std::atomic<bool> rendezvous_cancelled_{false};

  Mutex mu_;
  Status aborted_ KC_GUARDED_BY(mu_);
  // The current generation's, for aborting it (its thread may be blocked on them).
  comm::Communicator* live_comm_ KC_GUARDED_BY(mu_) = nullptr;
  parallel::Trainer* live_trainer_ KC_GUARDED_BY(mu_) = nullptr;
  ResilientRunner* live_runner_ KC_GUARDED_BY(mu_) = nullptr;
};

}  // namespace kc::fault
