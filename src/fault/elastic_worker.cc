#include "fault/elastic_worker.h"

#include <fmt/format.h>

#include <charconv>
#include <string_view>

#include "base/layer_guard.h"
#include "base/log.h"
#include "comm/rendezvous.h"
#include "parallel/model_spec.h"
#include "parallel/pipeline_schedule.h"

namespace kc::fault {
namespace {

Result<int64_t> ParseStep(std::string_view key, std::string_view text) {
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" is not a number", key, text));
  }
  return v;
}

// A deadline `d` from now on the clock `store` reads deadlines on.
TimePoint After(const comm::Store& store, Duration d) { return store.clock()->Now() + d; }

Duration Of(Seconds s) { return std::chrono::duration_cast<Duration>(s); }

// Whether a generation's error is one the loss of a member causes (STYLE.md: kAborted is
// retried at a higher level, a new group; kUnavailable and kDeadlineExceeded are what a peer
// gone or silent looks like).
bool PeerLoss(const Status& s) {
  return s.code() == ErrorCode::kAborted || s.code() == ErrorCode::kUnavailable ||
         s.code() == ErrorCode::kDeadlineExceeded;
}

}  // namespace

// Everything of one generation, destroyed (communicators last) before the next begins.
struct ElasticWorker::Generation {
  fault::Generation announced;
  int rank = 0;
  int world = 1;
  // The store as the communicator sees it: its waits give up once the generation has ended
  // (rendezvous_cancelled_). Declared before `comm`, which uses it to its end.
  std::unique_ptr<comm::Store> comm_store;
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<comm::Store> checkpoint_view;  // outlives the runner's persist thread
  std::unique_ptr<parallel::Trainer> trainer;
  std::unique_ptr<ResilientRunner> runner;
  std::unique_ptr<GenerationWatch> watch;  // destroyed first: it uses the others
  bool state_ready = false;  // the trainer holds a whole state (initialised or restored)
};

ElasticWorker::ElasticWorker(ElasticWorkerOptions options) : o_(std::move(options)) {}
ElasticWorker::~ElasticWorker() = default;

void ElasticWorker::Abort(Status why) {
  if (why.ok()) why = AbortedError("aborted");
  MutexLock lock(&mu_);
  if (aborted_.ok()) aborted_ = why;
  AbortLive(why);
}

void ElasticWorker::AbortLive(const Status& why) {
  rendezvous_cancelled_.store(true, std::memory_order_release);
  // Each returns at once (they mark and wake); called under mu_ so that the generation's
  // thread does not destroy them meanwhile.
  if (live_trainer_ != nullptr) {
    live_trainer_->Abort(why);
  } else if (live_comm_ != nullptr) {
    live_comm_->Abort(why);
  }
  if (live_runner_ != nullptr) live_runner_->Abandon();
}

bool ElasticWorker::StopRequested() const {
  return stop_.load(std::memory_order_acquire) ||
         (o_.stop_requested != nullptr && o_.stop_requested->load(std::memory_order_acquire));
}

void ElasticWorker::Report(const fault::Report& report, bool leader) {
  if (o_.observer == nullptr || !leader) return;
  {
    MutexLock lock(&mu_);
    if (!aborted_.ok()) return;  // a killed rank says nothing more
  }
  o_.observer->OnReport(report);
}

// A stop asked for: the step every rank stops after, once known. The generation's rank 0
// names it, the step after the one it has just done: every other rank is then at most inside
// that step (it cannot end it without rank 0), so each one, asking after every step once it
// too was asked to stop, finds it in time.
bool ElasticWorker::StopAfter(Generation& g, int64_t done) {
  if (!StopRequested()) return false;
  if (g.world == 1) return true;
  const std::string key = o_.job + "/stop-after";
  if (stop_after_ < 0 && g.rank == 0) {
    stop_after_ = done + 1;
    if (Status s = stop_store_->Set(key, std::to_string(stop_after_)); !s.ok()) {
      KC_LOG(ERROR) << "rank 0: cannot ask the others to stop: " << s;
    }
  } else if (stop_after_ < 0) {
    const std::string keys[1] = {key};
    Result<bool> named = stop_store_->Check(keys);
    if (named.ok() && *named) {
      Result<std::string> v = stop_store_->Get(key, After(*stop_store_, o_.timeout));
      if (v.ok()) stop_after_ = ParseStep(key, *v).value_or(-1);
    }
  }
  return stop_after_ >= 0 && done >= stop_after_;
}

void ElasticWorker::PublishCompute(double compute_ms) {
  if (store_ == nullptr) return;  // a lone rank: nobody to compare it with
  compute_ms_sum_ += compute_ms;
  ++compute_steps_;
  const auto now = std::chrono::steady_clock::now();
  if (now - compute_published_ < std::chrono::seconds(1)) return;
  // Not worth failing a step over: the next publish tries again.
  store_->Set(ComputeKey(o_.worker), fmt::format("{:.3f}", compute_ms_sum_ / compute_steps_))
      .IgnoreError();
  compute_ms_sum_ = 0;
  compute_steps_ = 0;
  compute_published_ = now;
}

// The links' counters (comm::LinkStats) for the step's report: each lane's queued time in the
// step, the deepest backlog, the retransmits so far (a sampled step still counts them all),
// the round trip.
void ElasticWorker::AddLinks(const comm::Communicator& comm, StepReport* report) {
  const comm::LinkStats now = comm.metrics().links;
  if (links_of_ != &comm) links_seen_ = {};  // a new generation's communicator
  links_of_ = &comm;
  if (now.lanes) {
    for (comm::Lane lane : comm::kAllLanes) {
      const comm::LaneMetrics& m = now.lanes->lane(lane);
      const Duration before =
          links_seen_.lanes ? links_seen_.lanes->lane(lane).total_queued_time : Duration::zero();
      // (A new communicator at the old one's address starts below the last count.)
      const Duration queued =
          m.total_queued_time >= before ? m.total_queued_time - before : m.total_queued_time;
      report->lane_wait_ms.push_back(std::chrono::duration<double, std::milli>(queued).count());
      report->lane_backlog.push_back(m.max_depth_chunks);
    }
  }
  report->retransmits = static_cast<int64_t>(now.retransmits);
  report->rtt_ms = now.max_rtt_s * 1e3;
  links_seen_ = now;
}

Result<int> ElasticWorker::Run() {
  KC_LAYER_ENTRY(Layer::kFault, "elastic_worker");
  const bool elastic = o_.shape.min_ranks < std::max(o_.ranks, o_.shape.max_ranks);
  if (o_.connect) {
    KC_ASSIGN_OR_RETURN(store_, o_.connect());
    // Heartbeats first: the supervisor hears from this worker while it rendezvouses and
    // builds its model.
    KC_ASSIGN_OR_RETURN(heartbeat_store_, o_.connect());
    KC_ASSIGN_OR_RETURN(heartbeat_, Heartbeat::Start(heartbeat_store_.get(), o_.worker,
                                                     o_.heartbeat.period, [this]() -> std::string {
                                                       // Where it is in its collectives (hang
                                                       // reports).
                                                       MutexLock lock(&mu_);
                                                       if (live_comm_ == nullptr) return "[]";
                                                       return ProgressToJson(live_comm_->progress(),
                                                                             Clock::Real()->Now());
                                                     }));
    if (!o_.runner.checkpoint.dir.empty()) {
      KC_ASSIGN_OR_RETURN(checkpoint_store_, o_.connect());
    }
    if (elastic) {
      KC_ASSIGN_OR_RETURN(watch_store_, o_.connect());
    }
    KC_ASSIGN_OR_RETURN(stop_store_, o_.connect());
  } else if (o_.ranks > 1 || o_.join) {
    return InvalidArgumentError("elastic worker: several ranks need a store to connect to");
  }
  fault::Generation gen = FirstGeneration(o_.shape, o_.ranks);
  if (o_.join) {
    // A newcomer: it learns the generation running now, says it is up, and waits (as a
    // spare) for a generation that takes it in.
    if (!elastic) return InvalidArgumentError("elastic worker: a replacement joins elastic runs");
    KC_ASSIGN_OR_RETURN(std::string current,
                        store_->Get(kCurrentGenerationKey, After(*store_, o_.timeout)));
    KC_ASSIGN_OR_RETURN(const int64_t number, ParseStep(kCurrentGenerationKey, current));
    KC_ASSIGN_OR_RETURN(gen, AwaitGeneration(*store_, number, After(*store_, o_.timeout)));
    Report(ReadyReport{.worker = o_.worker}, /*leader=*/true);
  }
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (!aborted_.ok()) return aborted_;
    }
    const int rank = gen.rank_of(o_.worker);
    if (gen.done || (rank < 0 && gen.stop)) return rank;
    if (rank < 0) {  // a spare: it waits for a generation that takes it in
      KC_ASSIGN_OR_RETURN(gen, AwaitGeneration(*watch_store_, gen.number + 1,
                                               After(*watch_store_, std::chrono::hours(24 * 365))));
      continue;
    }
    Generation g{.announced = gen, .rank = rank, .world = static_cast<int>(gen.members.size())};
    Status s = RunGeneration(g);
    {
      MutexLock lock(&mu_);
      if (!aborted_.ok()) return aborted_;
    }
    if (s.ok()) return rank;
    // kCancelled: stopped on request. Only what a lost or silent peer causes (the group
    // aborted or unreachable, a deadline) is followed by a next generation; any other error
    // (bad input, a corrupt checkpoint) would fail it the same way.
    if (!elastic || !PeerLoss(s)) return s;
    // The generation failed; this worker kept its state. The supervisor announces the next
    // one when a member dies or goes silent: waiting longer than that is waiting for nothing.
    Result<fault::Generation> next = AwaitGeneration(
        *watch_store_, gen.number + 1,
        After(*watch_store_, Of(o_.heartbeat.timeout + 2 * o_.heartbeat.period + Seconds(10))));
    if (!next.ok()) return s;
    KC_LOG(WARNING) << fmt::format(
        "rank {} (worker {}): generation {} ended ({}); generation {} begins: {}", rank, o_.worker,
        gen.number, s.message(), next->number, next->reason);
    gen = *std::move(next);
  }
}

Status ElasticWorker::RunGeneration(Generation& g) {
  const fault::Generation& gen = g.announced;
  const WorkerGeneration view{.generation = &gen, .rank = g.rank, .ranks = g.world};
  const auto rebuild_start = std::chrono::steady_clock::now();
  const bool leader = g.rank == 0;
  auto abort_generation = [this, number = gen.number] {
    MutexLock lock(&mu_);
    AbortLive(AbortedError(fmt::format("generation {} ended", number)));
  };
  // Publishes what Abort and the watch abort; false when the worker was aborted meanwhile.
  auto set_live = [this](comm::Communicator* c, parallel::Trainer* t, ResilientRunner* r) {
    MutexLock lock(&mu_);
    live_comm_ = c;
    live_trainer_ = t;
    live_runner_ = r;
    if (!aborted_.ok()) AbortLive(aborted_);
    return aborted_.ok();
  };
  {
    MutexLock lock(&mu_);  // an Abort already made stays made
    rendezvous_cancelled_.store(!aborted_.ok(), std::memory_order_release);
  }
  if (watch_store_ != nullptr) {
    KC_ASSIGN_OR_RETURN(g.watch,
                        GenerationWatch::Start(watch_store_.get(), gen.number, abort_generation));
  }
  // Survivors come to a new generation's rendezvous within a second or so; one that does not
  // come is dead or silent, which the supervisor turns into a later generation within the
  // heartbeat timeout: waiting longer than that is waiting for nothing.
  const Duration connect_timeout =
      gen.number == 0 ? o_.timeout
                      : std::min(o_.timeout, Of(2 * o_.heartbeat.timeout + Seconds(10)));
  auto run = [&]() -> Status {
    if (g.world > 1) {
      // A member lost while the generation forms makes the supervisor announce the next one:
      // the rendezvous then stops waiting for it (not at connect_timeout).
      g.comm_store = comm::WithCancel(store_.get(), &rendezvous_cancelled_);
      KC_ASSIGN_OR_RETURN(
          g.comm, comm::Communicator::Create({.store = g.comm_store.get(),
                                              .group = fmt::format("{}/g{}", o_.job, gen.number),
                                              .rank = g.rank,
                                              .size = g.world,
                                              .host = o_.host,
                                              .transport = o_.transport,
                                              .bind_address = o_.bind_address,
                                              .connect_timeout = connect_timeout,
                                              .timeout = o_.timeout,
                                              .lanes = o_.lanes,
                                              .rate_limiter = o_.rate_limiter,
                                              .topology = o_.topology}));
      set_live(g.comm.get(), nullptr, nullptr);
      if (g.watch != nullptr && g.watch->fired()) abort_generation();
    }
    parallel::TrainerOptions to = o_.trainer;
    to.comm = g.comm.get();
    // The plan for this generation's size: the run's, with this generation's replicas.
    to.plan.t = o_.shape.t;
    to.plan.p = o_.shape.p;
    to.plan.d = gen.d;
    to.plan.micro_batch_size = o_.shape.micro_batch_size;
    to.plan.micro_batches = o_.shape.micro_batches;
    to.global_batch = o_.shape.global_batch;
    RunnerOptions ro = o_.runner;
    if (gen.number > 0) ro.resume_from.clear();
    ro.plan = {{"t", to.plan.t},
               {"p", to.plan.p},
               {"d", gen.d},
               {"micro_batch_size", gen.micro_batch_size},
               {"micro_batches", gen.micro_batches},
               {"schedule", std::string(parallel::ScheduleName(to.plan.schedule))},
               {"v", to.plan.v},
               {"recompute", to.plan.recompute},
               {"zero_stage", to.plan.zero_stage}};
    ro.rank = g.rank;
    ro.ranks = g.world;
    if (checkpoint_store_ != nullptr) {
      // Each generation's commits in a key space of its own.
      g.checkpoint_view =
          comm::WithPrefix(checkpoint_store_.get(), comm::GenerationPrefix(gen.number));
      ro.store = g.checkpoint_view.get();
    }
    if (o_.hooks.configure) o_.hooks.configure(view, &to, &ro);
    KC_ASSIGN_OR_RETURN(g.trainer, parallel::Trainer::Create(to));
    set_live(g.comm.get(), g.trainer.get(), nullptr);
    if (o_.hooks.on_trainer) KC_RETURN_IF_ERROR(o_.hooks.on_trainer(view, *g.trainer));

    // The state: from the checkpoint asked for (the first generation), else from this
    // worker's own copy and the replicas (later ones), else the newest good checkpoint.
    std::string source;
    int64_t state_bytes = 0;
    bool need_checkpoint = gen.number > 0 && gen.from_checkpoint;
    if (gen.number > 0 && !gen.from_checkpoint) {
      const Member& me = gen.members[static_cast<size_t>(g.rank)];
      const bool has_state =
          me.has_state && snapshot_.valid && ApplySnapshot(snapshot_, g.trainer.get()).ok();
      Result<ReplicaRestore> r = RestoreFromReplicas(g.trainer.get(), g.comm.get(), has_state);
      if (r.ok()) {
        source = "replica";
        state_bytes = r->bytes;
      } else if (r.status().code() == ErrorCode::kFailedPrecondition) {
        need_checkpoint = true;
      } else {
        return r.status();
      }
    }
    if (need_checkpoint && o_.memory_copy_every > 0) {
      // The copies of a peer host, unless every member sees a newer checkpoint.
      int64_t checkpoint_step = -1;
      if (!ro.checkpoint.dir.empty()) {
        Result<std::vector<CheckpointEntry>> saved = ListCheckpoints(ro.checkpoint.dir);
        if (saved.ok() && !saved->empty()) checkpoint_step = saved->front().step;
      }
      Result<MemoryRestore> m = copies_.Restore(g.trainer.get(), g.comm.get(), checkpoint_step);
      if (m.ok()) {
        need_checkpoint = false;
        source = "memory";
        state_bytes = m->bytes;
      } else if (m.status().code() != ErrorCode::kFailedPrecondition) {
        return m.status();
      } else {
        KC_LOG(WARNING) << fmt::format("rank {}: {}; loading the newest checkpoint", g.rank,
                                       m.status().message());
      }
    }
    if (need_checkpoint) {
      if (ro.checkpoint.dir.empty()) {
        return FailedPreconditionError(
            "no data-parallel replica of the lost ranks survived whole, no in-memory copy "
            "of their state either, and there is no checkpoint directory to restore from");
      }
      KC_ASSIGN_OR_RETURN(CheckpointEntry e, LatestGoodCheckpoint(ro.checkpoint.dir, nullptr));
      ro.resume_from = e.path;
      source = "checkpoint";
    }
    KC_ASSIGN_OR_RETURN(g.runner, ResilientRunner::Create(g.trainer.get(), ro));
    set_live(g.comm.get(), g.trainer.get(), g.runner.get());
    if (g.watch != nullptr && g.watch->fired()) abort_generation();
    if (!ro.resume_from.empty()) {
      KC_ASSIGN_OR_RETURN(int64_t step, g.runner->Restore());
      if (gen.number == 0) Report(ResumeReport{.step = step, .checkpoint = ro.resume_from}, leader);
    }
    loader_after_ = g.trainer->loader().state();
    g.state_ready = true;
    if (gen.number == 0) {
      Report(StartReport{.parameters = parallel::ParameterCount(to.spec),
                         .flops_per_token = parallel::TrainingFlopsPerToken(to.spec),
                         .grad_buckets = g.trainer->grad_buckets(),
                         .arena_bytes = g.trainer->arena_bytes(),
                         .stage_activation_bytes = g.trainer->stage_activation_bytes()},
             leader);
    } else {
      Report(RecoveryReport{.generation = gen.number,
                            .ranks = g.world,
                            .d = gen.d,
                            .micro_batch_size = gen.micro_batch_size,
                            .micro_batches = gen.micro_batches,
                            .step = g.trainer->steps_done(),
                            .source = source,
                            .state_bytes_received = state_bytes,
                            .rebuild_s = std::chrono::duration<double>(
                                             std::chrono::steady_clock::now() - rebuild_start)
                                             .count(),
                            .reason = gen.reason,
                            .stop = gen.stop},
             leader);
    }
    RunnerCallbacks callbacks;
    callbacks.on_step = [&](const parallel::StepStats& s) {
      loader_after_ = g.trainer->loader().state();
      StepReport report = ToStepReport(s);
      const int64_t done = g.trainer->steps_done();
      if (o_.memory_copy_every > 0 && g.comm != nullptr && done < ro.steps &&
          done % o_.memory_copy_every == 0) {
        // The state of step `done`, copied before its checkpoint and evaluation (a lone rank
        // has nobody to hold its copy).
        const auto copy_start = std::chrono::steady_clock::now();
        KC_RETURN_IF_ERROR(copies_.Exchange(*g.trainer, loader_after_, g.comm.get()));
        report.memory_copy_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - copy_start)
                .count();
        report.memory_copy_bytes = copies_.bytes();
      }
      if (o_.rate_limiter != nullptr) {
        // The limiter is the rank's, over every group's collectives: its wait since the last step.
        const Duration waited = o_.rate_limiter->metrics().total_wait;
        report.rate_limit_wait_ms =
            std::chrono::duration<double, std::milli>(waited - rate_limit_waited_).count();
        rate_limit_waited_ = waited;
      }
      if (g.comm != nullptr) AddLinks(*g.comm, &report);  // none for a run of one rank
      Report(report, leader);
      PublishCompute(s.compute_s * 1e3);
      return OkStatus();
    };
    callbacks.after_step = [&](int64_t done) -> Status {
      const bool last = done == ro.steps;
      // A next generation was announced: one whose members share no communicator (a lone
      // survivor, before a replacement joins) has nothing the watch could abort, so it
      // leaves here, between steps, its state that of step `done`.
      if (!last && g.watch != nullptr && g.watch->fired()) {
        return AbortedError(fmt::format("generation {} ended after step {}", gen.number, done));
      }
      if (o_.eval_batches > 0 && ((o_.eval_every > 0 && done % o_.eval_every == 0) || last)) {
        KC_ASSIGN_OR_RETURN(double val, g.trainer->Evaluate(o_.eval_batches));
        Report(EvaluationReport{.step = done, .loss = val}, leader);
      }
      if (o_.hooks.before_step && !last) o_.hooks.before_step(done + 1);
      return OkStatus();
    };
    callbacks.on_checkpoint = [&](const SaveStats& c) { Report(ToCheckpointReport(c), leader); };
    callbacks.stop_after = [&](int64_t done) { return StopAfter(g, done); };
    callbacks.on_interval = [&](const RunnerCallbacks::Interval& i) {
      Report(IntervalReport{.step = g.trainer->steps_done(),
                            .every_steps = i.steps,
                            .cost_s = i.cost_s,
                            .interval_s = i.interval_s,
                            .mtbf_s = i.mtbf_s,
                            .source = i.source},
             leader);
    };
    if (gen.stop) {
      // Below the minimum: what survived goes to a checkpoint, and the run ends.
      if (!ro.checkpoint.dir.empty()) return g.runner->SaveNow(callbacks);
      return OkStatus();
    }
    if (gen.number == 0 && o_.hooks.before_step) o_.hooks.before_step(g.trainer->steps_done() + 1);
    return g.runner->Run(callbacks);
  };
  Status s = run();
  if (!s.ok() && g.trainer != nullptr && g.state_ready) {
    // Keep this worker's state for the next generation.
    snapshot_ = TakeSnapshot(*g.trainer, loader_after_);
  }
  g.watch.reset();  // first: its thread may be using the runner and the communicator
  set_live(nullptr, nullptr, nullptr);
  if (g.runner != nullptr && !s.ok()) g.runner->Abandon();  // a persist in flight waits for nobody
  g.runner.reset();
  g.trainer.reset();
  g.comm.reset();
  return s;
}

}  // namespace kc::fault
