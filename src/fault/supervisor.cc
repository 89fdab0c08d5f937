#include "fault/supervisor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <variant>
#include <vector>

#include "base/layer_guard.h"
#include "base/mutex.h"

namespace kc::fault {

std::string_view FaultEvent::EventName() const {
  switch (kind) {
    case Kind::kDetected:
      return "detected";
    case Kind::kRecovered:
      return "recovered";
    case Kind::kJoined:
      return "joined";
    case Kind::kStopped:
      return "stopped";
    case Kind::kResized:
      return "resized";
  }
  return "detected";
}

nlohmann::json FaultEvent::ToJson() const {
  nlohmann::json j;
  const std::string event(EventName());
  switch (kind) {
    case Kind::kDetected:
      j = {{"event", event}, {"worker", worker}, {"reason", reason}};
      if (!hang.empty()) j["hang"] = hang;
      if (generation >= 0) {
        j["generation"] = generation;
        j["ranks"] = ranks;
      }
      return j;
    case Kind::kJoined:
      return {{"event", event}, {"worker", worker}, {"generation", generation}, {"ranks", ranks}};
    case Kind::kResized:
      j = {{"event", event}, {"ranks", ranks}, {"reason", reason}};
      if (generation >= 0) j["generation"] = generation;
      return j;
    case Kind::kRecovered:
    case Kind::kStopped:
      j = {{"event", event},        {"generation", generation},
           {"ranks", ranks},        {"d", d},
           {"source", source},      {"step", step},
           {"rebuild_s", rebuild_s}};
      if (steps_lost) j["steps_lost"] = *steps_lost;
      if (duration_s) j["duration_s"] = *duration_s;
      return j;
  }
  return j;
}

class Supervisor::Impl final : public RankEvents {
 public:
  explicit Impl(const SupervisorOptions& o) : o_(o) {}

  // RankEvents: from the launcher's threads, into the queue Run reads.
  void OnOutput(int worker, std::string line) override {
    Push({.kind = Event::kOutput, .worker = worker, .line = std::move(line)});
  }
  void OnReport(int worker, Report report) override {
    Push({.kind = Event::kReport, .worker = worker, .report = std::move(report)});
  }
  void OnExit(int worker, RankExit exit) override {
    Push({.kind = Event::kExit, .worker = worker, .exit = std::move(exit)});
  }
  void OnExits(std::vector<std::pair<int, RankExit>> exits) override {
    MutexLock lock(&mu_);
    for (auto& [worker, exit] : exits) {
      events_.push_back({.kind = Event::kExit, .worker = worker, .exit = std::move(exit)});
    }
    cv_.SignalAll();
  }
  void RequestStop() { Push({.kind = Event::kStop}); }
  void Resize(int ranks) { Push({.kind = Event::kResize, .worker = ranks}); }
  void Inspect(int64_t request) { Push({.kind = Event::kInspect, .request = request}); }

  Result<RunOutcome> Run();

 private:
  struct Event {
    enum Kind { kOutput, kReport, kExit, kStop, kResize, kInspect } kind = kOutput;
    int worker = -1;      // kResize: the ranks asked for
    int64_t request = 0;  // kInspect
    std::string line;
    Report report;
    RankExit exit;
  };
  struct Worker {
    bool exited = false;
    std::string last_output;  // its last non-empty line
    double silent_s = 0;      // > 0: killed for its silence
    std::string hang;         // then: the hang report made as it was declared silent
  };
  struct Recovering {
    TimePoint detected;
    int64_t last_step = 0;  // the last step reported before it
  };

  void Push(Event e) {
    MutexLock lock(&mu_);
    events_.push_back(std::move(e));
    cv_.SignalAll();
  }
  // Waits for events until `deadline` and takes them.
  std::deque<Event> Take(TimePoint deadline) {
    MutexLock lock(&mu_);
    if (deadline == TimePoint::max()) {
      while (events_.empty()) cv_.Wait(&mu_);
    } else {
      AwaitWithDeadline(o_.clock, &cv_, &mu_, deadline,
                        [&]() KC_REQUIRES(mu_) { return !events_.empty(); });
    }
    return std::exchange(events_, {});
  }

  void Emit(const FaultEvent& e) {
    if (o_.observer != nullptr) o_.observer->OnFault(e);
  }
  std::vector<int> Alive() const {
    std::vector<int> alive;
    for (const auto& [id, w] : workers_) {
      if (!w.exited && ending_.count(id) == 0) alive.push_back(id);
    }
    return alive;
  }
  bool Announce(const Generation& next) {
    if (Status s = AnnounceGeneration(*o_.store, next); !s.ok()) {
      Fail(s.WithContext("announcing generation " + std::to_string(next.number)));
      return false;
    }
    current_ = next;
    return true;
  }
  // The run fails: every rank still running is asked to stop, and killed after the grace.
  void Fail(Status error) {
    if (!ended_) {
      ended_ = true;
      end_ = RunOutcome::End::kFailed;
      error_ = std::move(error);
    }
    StopOthers();
  }
  void FailBy(const FaultEvent& cause) {
    if (!ended_) {
      ended_ = true;
      end_ = RunOutcome::End::kFailed;
      cause_ = cause;
    }
    StopOthers();
  }
  void StopOthers() {
    for (int w : Alive()) o_.launcher->Signal(w, RankSignal::kStop);
    kill_at_ = o_.clock->Now() + o_.stop_grace;
  }

  void OnEvent(Event& e);
  void OnRankExit(int id, const RankExit& exit);
  void OnRecovery(const RecoveryReport& r);
  void CheckHeartbeats();
  std::map<int, std::string> ProgressNow();
  // What a worker published under `key` in the store (its heartbeat's progress, its compute
  // time); nullopt when it has published nothing there, or the store did not answer.
  std::optional<std::string> Published(const std::string& key);
  // Every kRanksReportPeriod of steps: each member's compute time per step, as it published
  // it (ComputeKey), to the observer as a RanksReport.
  void MaybeReportRanks();
  void StartReplacements();
  void TakeInReady();
  void ApplyResize();

  const SupervisorOptions o_;

  Mutex mu_;
  CondVar cv_;
  std::deque<Event> events_ KC_GUARDED_BY(mu_);

  // Owned by the thread in Run.
  std::map<int, Worker> workers_;
  int running_ = 0;
  int next_worker_ = 0;
  Generation current_;
  // The newest generation that formed (its leader reported its recovery): current_ unless a
  // newer one was announced and is forming (recovering_).
  Generation formed_;
  // A member of formed_ finished the training while a newer generation was forming: that one
  // never forms; its newcomers were stopped, and their ends are no faults.
  bool finished_early_ = false;
  bool completed_ = false;     // every member of the last generation finished the training
  bool elastic_open_ = false;  // generations still follow failures (off once the run ends)
  std::optional<HeartbeatMonitor> beats_;
  TimePoint next_check_{};
  std::optional<TimePoint> kill_at_;
  bool ended_ = false;  // the run's end is decided (a failure, a stop below the minimum)
  RunOutcome::End end_ = RunOutcome::End::kCompleted;
  std::optional<FaultEvent> cause_;
  Status error_;
  int faults_ = 0;
  bool stop_passed_on_ = false;
  int restarts_left_ = 0;
  int pending_spawns_ = 0;
  std::vector<int> awaiting_ready_;          // replacements not yet taken into a generation
  std::set<int> ready_;                      // ... of which these said they are up
  int64_t last_step_ = 0;                    // the last step a leader reported
  std::optional<TimePoint> ranks_reported_;  // the last RanksReport
  std::optional<Recovering> recovering_;
  std::optional<int> resize_to_;  // a Resize not yet carried out
  std::set<int> retiring_;        // killed by a Resize: their ends are no faults
  std::set<int> ending_;          // their exits are in the batch of events being handled
  std::set<int> left_out_;        // of those, left out by a generation announced for another
};

Result<RunOutcome> Supervisor::Impl::Run() {
  KC_LAYER_ENTRY(Layer::kFault, "supervisor");
  restarts_left_ = o_.max_restarts;
  const TimePoint start = o_.clock->Now();
  for (int w = 0; w < o_.ranks; ++w) {
    if (Status s = o_.launcher->Start({.worker = w}, this); !s.ok()) {
      Fail(s.WithContext("starting rank " + std::to_string(w)));
      break;
    }
    workers_[w] = {};
    ++running_;
  }
  next_worker_ = o_.ranks;
  if (!ended_ && o_.store != nullptr) {
    // A rank silent for the timeout is declared failed (checked every half period, so within
    // the timeout and one period of its last beat).
    HeartbeatOptions h = o_.heartbeat;
    beats_.emplace(o_.store, o_.ranks, h, start);
    next_check_ = start + std::chrono::duration_cast<Duration>(h.period / 2);
    current_ = FirstGeneration(o_.shape, o_.ranks);
    formed_ = current_;
    elastic_open_ = o_.shape.min_ranks < std::max(o_.ranks, o_.shape.max_ranks);
    if (elastic_open_ && !Announce(current_)) elastic_open_ = false;
  }
  while (running_ > 0) {
    TimePoint deadline = TimePoint::max();
    if (beats_) deadline = std::min(deadline, next_check_);
    if (kill_at_) deadline = std::min(deadline, *kill_at_);
    std::deque<Event> events = Take(deadline);
    // Ranks that ended together are left out together: the generation that follows the first
    // of them does not count the others alive.
    for (const Event& e : events) {
      if (e.kind == Event::kExit) ending_.insert(e.worker);
    }
    for (Event& e : events) OnEvent(e);
    ending_.clear();
    left_out_.clear();
    const TimePoint now = o_.clock->Now();
    if (beats_ && now >= next_check_) {
      CheckHeartbeats();
      next_check_ = now + std::chrono::duration_cast<Duration>(o_.heartbeat.period / 2);
    }
    ApplyResize();
    StartReplacements();
    TakeInReady();
    if (kill_at_ && o_.clock->Now() >= *kill_at_) {
      for (int w : Alive()) o_.launcher->Signal(w, RankSignal::kKill);
      kill_at_.reset();
    }
  }
  RunOutcome out;
  out.faults = faults_;
  if (ended_) {
    out.end = end_;
    out.cause = cause_;
    out.error = error_;
  } else if (stop_passed_on_) {
    out.end = RunOutcome::End::kStopped;
  }
  return out;
}

void Supervisor::Impl::OnEvent(Event& e) {
  switch (e.kind) {
    case Event::kOutput:
      if (!e.line.empty()) workers_[e.worker].last_output = e.line;
      if (o_.observer != nullptr) o_.observer->OnOutput(e.worker, e.line);
      return;
    case Event::kReport:
      if (const auto* ready = std::get_if<ReadyReport>(&e.report)) {
        ready_.insert(ready->worker);
        return;
      }
      if (const auto* step = std::get_if<StepReport>(&e.report)) last_step_ = step->step;
      if (const auto* r = std::get_if<RecoveryReport>(&e.report)) OnRecovery(*r);
      if (o_.observer != nullptr) o_.observer->OnReport(e.worker, e.report);
      if (std::holds_alternative<StepReport>(e.report)) MaybeReportRanks();
      return;
    case Event::kExit:
      OnRankExit(e.worker, e.exit);
      return;
    case Event::kResize:
      resize_to_ = e.worker;
      return;
    case Event::kInspect:
      if (o_.observer != nullptr) {
        ProgressSnapshot snapshot{.request = e.request, .workers = Alive()};
        snapshot.progress = ProgressNow();
        // A wait shorter than two beats is the ordinary flow of a healthy run, seen by
        // heartbeats taken at different moments.
        snapshot.hang = HangReport(snapshot.progress, 2 * o_.heartbeat.period.count());
        o_.observer->OnProgress(snapshot);
      }
      return;
    case Event::kStop:
      if (!stop_passed_on_) {
        stop_passed_on_ = true;
        for (int w : Alive()) o_.launcher->Signal(w, RankSignal::kStop);
      }
      return;
  }
}

void Supervisor::Impl::OnRecovery(const RecoveryReport& r) {
  FaultEvent e{.kind = r.stop ? FaultEvent::Kind::kStopped : FaultEvent::Kind::kRecovered,
               .generation = r.generation,
               .ranks = r.ranks,
               .d = r.d,
               .source = r.source,
               .step = r.step,
               .rebuild_s = r.rebuild_s};
  if (!r.stop && r.generation == current_.number) formed_ = current_;
  if (recovering_) {
    e.steps_lost = std::max<int64_t>(0, recovering_->last_step - r.step);
    e.duration_s = std::chrono::duration<double>(o_.clock->Now() - recovering_->detected).count();
    recovering_.reset();
  }
  Emit(e);
}

// A rank's exit is seen the moment it happens, so the first rank to fail is the one named,
// not a peer that failed because of it.
void Supervisor::Impl::OnRankExit(int id, const RankExit& exit) {
  Worker& w = workers_[id];
  if (w.exited) return;
  w.exited = true;
  --running_;
  if (beats_) beats_->Forget(id);
  if (retiring_.erase(id) != 0) return;  // retired by a Resize
  // A member finished: the run is ending; once every member has, the spares are told. A member
  // of the generation that formed last may finish the training while a newer one forms (a
  // replacement joined at the last steps): that one never forms, and the newcomers waiting
  // for it are stopped; their ends are no faults.
  const Generation& finishing = recovering_ ? formed_ : current_;
  if (exit.ok && elastic_open_ && finishing.rank_of(id) >= 0) {
    if (recovering_ && !finished_early_) {
      finished_early_ = true;
      for (int other : Alive()) {
        if (formed_.rank_of(other) < 0) o_.launcher->Signal(other, RankSignal::kKill);
      }
    }
    bool all = true;
    for (const Member& m : finishing.members) all = all && workers_[m.worker].exited;
    if (all) {
      Generation done;
      done.number = current_.number + 1;
      done.done = true;
      done.reason = "the job finished";
      elastic_open_ = false;
      completed_ = true;
      // Spares that miss it wait until the store goes, which ends them too. Newcomers not taken
      // in are stopped: one whose start waits for its host's share (a host the run grew onto)
      // would never see it, and a stop ends a worker that never started at once.
      AnnounceGeneration(*o_.store, done).IgnoreError();
      for (int other : awaiting_ready_) {
        if (!workers_[other].exited) o_.launcher->Signal(other, RankSignal::kStop);
      }
    }
  }
  // After the training finished, the ends of the workers outside it are no faults.
  if (exit.ok || ended_ || completed_ || (finished_early_ && formed_.rank_of(id) < 0)) return;
  ++faults_;
  FaultEvent e{.kind = FaultEvent::Kind::kDetected,
               .worker = id,
               .silent_s = w.silent_s,
               .heartbeat_timeout_s = o_.heartbeat.timeout.count(),
               .exit = exit,
               .last_output = w.last_output,
               .hang = w.hang};
  if (w.silent_s > 0) {
    e.reason = fmt::format(
        "sent no heartbeat for {:.1f} s (heartbeat timeout {} s): declared "
        "failed and killed{}",
        w.silent_s, o_.heartbeat.timeout.count(), w.hang.empty() ? "" : "; hang report: " + w.hang);
  } else if (w.last_output.empty()) {
    e.reason = exit.description;
  } else {
    e.reason = w.last_output + (exit.killed ? " (" + exit.description + ")" : "");
  }
  if (elastic_open_ && left_out_.erase(id) != 0) {
    // It ended together with the worker whose loss formed the generation running, which left
    // it out already.
    e.generation = current_.number;
    e.ranks = static_cast<int>(current_.members.size());
    e.d = current_.d;
    Emit(e);
    if (restarts_left_ > 0) {
      --restarts_left_;
      ++pending_spawns_;
    }
    return;
  }
  if (elastic_open_) {
    Result<Generation> next = NextGeneration(current_, o_.shape, Alive(), o_.zero_sharded,
                                             fmt::format("worker {} failed: {}", id, e.reason));
    for (int other : ending_) {
      if (other != id && !workers_[other].exited) left_out_.insert(other);
    }
    if (!next.ok()) {
      Fail(next.status());
    } else if (Announce(*next)) {
      e.generation = next->number;
      e.ranks = static_cast<int>(next->members.size());
      e.d = next->d;
      recovering_ = Recovering{o_.clock->Now(), last_step_};
      if (next->stop) {
        // Below the minimum: the members save what survived and exit; spares see the stop.
        const int alive = static_cast<int>(Alive().size());
        e.below_minimum = true;
        e.alive = alive;
        e.usable = UsableReplicas(o_.shape, alive) * o_.shape.t * o_.shape.p;
        e.min_ranks = o_.shape.min_ranks;
        ended_ = true;
        end_ = RunOutcome::End::kBelowMinimum;
        cause_ = e;
        elastic_open_ = false;
        Emit(e);
        return;
      }
      Emit(e);
      if (restarts_left_ > 0) {
        --restarts_left_;
        ++pending_spawns_;
      }
      return;
    }
  }
  Emit(e);
  FailBy(e);
}

void Supervisor::Impl::ApplyResize() {
  if (!resize_to_) return;
  if (!elastic_open_ || ended_ || stop_passed_on_) {
    resize_to_.reset();  // nothing to resize: not elastic, or ending
    return;
  }
  const int want = std::clamp(*resize_to_, o_.shape.min_ranks, o_.shape.max_ranks);
  std::vector<int> alive;
  for (int w : Alive()) {
    if (retiring_.count(w) == 0) alive.push_back(w);
  }
  const int have = static_cast<int>(alive.size()) + pending_spawns_;
  if (want > have) {
    pending_spawns_ += want - have;
    Emit({.kind = FaultEvent::Kind::kResized,
          .reason = fmt::format("asked for {} rank{}: starting {} more", want, want == 1 ? "" : "s",
                                want - have),
          .ranks = want});
    resize_to_.reset();
    return;
  }
  if (want == have) {
    resize_to_.reset();
    return;
  }
  if (recovering_) return;  // once the generation forming has formed
  resize_to_.reset();
  int excess = have - want;
  const int unstarted = std::min(excess, pending_spawns_);
  pending_spawns_ -= unstarted;
  excess -= unstarted;
  // Those where the launcher has no place for them any more (a host the run shrank off), then
  // those outside the generation (newcomers, spares), then its newest members.
  const std::vector<int> overplaced = o_.launcher->Overplaced();
  auto key = [&](int w) {
    const bool over = std::find(overplaced.begin(), overplaced.end(), w) != overplaced.end();
    return std::make_tuple(!over, current_.rank_of(w) >= 0, -w);
  };
  std::stable_sort(alive.begin(), alive.end(), [&](int a, int b) { return key(a) < key(b); });
  std::vector<int> retired(alive.begin(), alive.begin() + excess);
  std::vector<int> staying(alive.begin() + excess, alive.end());
  FaultEvent e{
      .kind = FaultEvent::Kind::kResized,
      .reason = fmt::format("asked for {} rank{}: retiring worker{} {}", want, want == 1 ? "" : "s",
                            retired.size() == 1 ? "" : "s", fmt::join(retired, ", ")),
      .ranks = want};
  const bool members_leave =
      std::any_of(retired.begin(), retired.end(), [&](int w) { return current_.rank_of(w) >= 0; });
  if (members_leave) {
    Result<Generation> next =
        NextGeneration(current_, o_.shape, staying, o_.zero_sharded,
                       fmt::format("resized to {} rank{}", want, want == 1 ? "" : "s"));
    if (!next.ok()) return Fail(next.status());
    if (!Announce(*next)) return;
    e.generation = next->number;
    recovering_ = Recovering{o_.clock->Now(), last_step_};
  }
  Emit(e);
  for (int w : retired) {
    retiring_.insert(w);
    std::erase(awaiting_ready_, w);
    o_.launcher->Signal(w, RankSignal::kKill);
  }
}

std::optional<std::string> Supervisor::Impl::Published(const std::string& key) {
  Result<bool> there = o_.store->Check(std::span<const std::string>(&key, 1));
  if (!there.ok() || !*there) return std::nullopt;
  Result<std::string> text = o_.store->Get(key, o_.clock->Now() + std::chrono::seconds(1));
  if (!text.ok()) return std::nullopt;
  return *std::move(text);
}

void Supervisor::Impl::MaybeReportRanks() {
  constexpr auto kRanksReportPeriod = std::chrono::seconds(10);
  const TimePoint now = o_.clock->Now();
  if (o_.store == nullptr || o_.observer == nullptr || current_.members.size() < 2) return;
  if (!ranks_reported_) ranks_reported_ = now;  // the first after a period of steps
  if (now - *ranks_reported_ < kRanksReportPeriod) return;
  ranks_reported_ = now;
  RanksReport r{.step = last_step_};
  for (const Member& m : current_.members) {
    const std::optional<std::string> text = Published(ComputeKey(m.worker));
    if (!text) continue;
    char* end = nullptr;
    const double ms = std::strtod(text->c_str(), &end);
    if (end == text->c_str() || !(ms >= 0)) continue;  // not a time: left out
    r.workers.push_back(m.worker);
    r.compute_ms.push_back(ms);
  }
  if (r.workers.size() >= 2) o_.observer->OnReport(-1, r);
}

// Where every live worker was in its collectives, from what their heartbeats published.
std::map<int, std::string> Supervisor::Impl::ProgressNow() {
  std::map<int, std::string> progress;
  if (o_.store == nullptr) return progress;
  for (int w : Alive()) {
    if (std::optional<std::string> text = Published(ProgressKey(w))) progress[w] = *std::move(text);
  }
  return progress;
}

void Supervisor::Impl::CheckHeartbeats() {
  for (int r : beats_->Check(o_.clock->Now())) {
    Worker& w = workers_[r];
    if (w.exited) continue;
    w.silent_s = std::max(beats_->silent_for(r).count(), 1e-9);
    w.hang = HangReport(ProgressNow());
    // A stopped or wedged process does not act on a stop: killed. Its exit is the failure
    // (in an elastic run, the next generation).
    o_.launcher->Signal(r, RankSignal::kKill);
  }
}

void Supervisor::Impl::StartReplacements() {
  for (; pending_spawns_ > 0 && !ended_; --pending_spawns_) {
    const int id = next_worker_++;
    Status s = o_.launcher->Start({.worker = id, .join = true}, this);
    if (o_.observer != nullptr) o_.observer->OnReplacement(id, s);
    if (!s.ok()) continue;
    workers_[id] = {};
    ++running_;
    if (beats_) beats_->Watch(id, o_.clock->Now());
    awaiting_ready_.push_back(id);
  }
}

// Replacements that are up join a generation that takes them in, as soon as the workers make
// more replicas than run now and the current generation has formed (its leader reported its
// recovery): a generation announced while the last one's communicators rendezvous would be
// noticed only when that rendezvous times out.
void Supervisor::Impl::TakeInReady() {
  if (recovering_) return;
  for (size_t i = 0; i < awaiting_ready_.size() && elastic_open_ && !ended_;) {
    const int id = awaiting_ready_[i];
    if (!workers_[id].exited && ready_.count(id) == 0) {
      ++i;
      continue;
    }
    awaiting_ready_.erase(awaiting_ready_.begin() + static_cast<std::ptrdiff_t>(i));
    if (workers_[id].exited) continue;
    Result<Generation> next = NextGeneration(current_, o_.shape, Alive(), o_.zero_sharded,
                                             fmt::format("worker {} joined", id));
    if (next.ok() && next->members.size() > current_.members.size() && Announce(*next)) {
      Emit({.kind = FaultEvent::Kind::kJoined,
            .worker = id,
            .generation = next->number,
            .ranks = static_cast<int>(next->members.size()),
            .d = next->d});
      recovering_ = Recovering{o_.clock->Now(), last_step_};
    }
  }
}

Result<std::unique_ptr<Supervisor>> Supervisor::Create(const SupervisorOptions& o) {
  if (o.launcher == nullptr) return InvalidArgumentError("supervisor: no launcher");
  if (o.ranks < 1) return InvalidArgumentError("supervisor: ranks must be at least 1");
  if (o.clock == nullptr) return InvalidArgumentError("supervisor: no clock");
  if (o.shape.min_ranks < std::max(o.ranks, o.shape.max_ranks) && o.store == nullptr) {
    return InvalidArgumentError("supervisor: an elastic run needs the job's store");
  }
  if (o.store != nullptr) KC_RETURN_IF_ERROR(ValidateHeartbeat(o.heartbeat));
  return std::unique_ptr<Supervisor>(new Supervisor(std::make_unique<Impl>(o)));
}

Supervisor::Supervisor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Supervisor::~Supervisor() = default;

Result<RunOutcome> Supervisor::Run() { return impl_->Run(); }

void Supervisor::RequestStop() { impl_->RequestStop(); }

void Supervisor::Resize(int ranks) { impl_->Resize(ranks); }
void Supervisor::Inspect(int64_t request) { impl_->Inspect(request); }

}  // namespace kc::fault
