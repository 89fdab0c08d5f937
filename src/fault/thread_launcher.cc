#include "fault/thread_launcher.h"

#include <map>
#include <thread>

#include "base/mutex.h"
#include "fault/heartbeat.h"

namespace kc::fault {
namespace {

class Rank;

// A rank's connection: the run's store until the rank is killed, then nothing (kUnavailable).
// Blocking calls wait in slices, so that a kill ends them as it would a dead process's.
class RankStore final : public comm::Store {
 public:
  RankStore(comm::Store* base, const std::atomic<bool>* killed, const std::atomic<bool>* silenced)
      : base_(base), killed_(killed), silenced_(silenced) {}

  Status Set(std::string_view key, std::string_view value) override {
    KC_RETURN_IF_ERROR(Alive());
    if (silenced_->load() && key.starts_with(kHeartbeatPrefix)) {
      return OkStatus();  // sent, and lost on the way
    }
    return base_->Set(key, value);
  }
  Result<std::string> Get(std::string_view key, TimePoint deadline) override {
    for (;;) {
      KC_RETURN_IF_ERROR(Alive());
      Result<std::string> r = base_->Get(key, Slice(deadline));
      if (r.ok() || !Retry(r.status(), deadline)) return r;
    }
  }
  Status Wait(std::span<const std::string> keys, TimePoint deadline) override {
    for (;;) {
      KC_RETURN_IF_ERROR(Alive());
      Status s = base_->Wait(keys, Slice(deadline));
      if (s.ok() || !Retry(s, deadline)) return s;
    }
  }
  Result<int64_t> Add(std::string_view key, int64_t delta) override {
    KC_RETURN_IF_ERROR(Alive());
    return base_->Add(key, delta);
  }
  Result<comm::CompareSetResult> CompareSet(std::string_view key,
                                            std::optional<std::string_view> expected,
                                            std::string_view desired) override {
    KC_RETURN_IF_ERROR(Alive());
    return base_->CompareSet(key, expected, desired);
  }
  Result<bool> Delete(std::string_view key) override {
    KC_RETURN_IF_ERROR(Alive());
    return base_->Delete(key);
  }
  Result<bool> Check(std::span<const std::string> keys) override {
    KC_RETURN_IF_ERROR(Alive());
    return base_->Check(keys);
  }
  Clock* clock() const override { return base_->clock(); }

 private:
  Status Alive() const {
    return killed_->load() ? UnavailableError("the rank was killed") : OkStatus();
  }
  TimePoint Slice(TimePoint deadline) const {
    return std::min(deadline, base_->clock()->Now() + std::chrono::milliseconds(50));
  }
  bool Retry(const Status& s, TimePoint deadline) const {
    return s.code() == ErrorCode::kDeadlineExceeded && base_->clock()->Now() < deadline;
  }

  comm::Store* const base_;                // the launcher's store outlives its ranks
  const std::atomic<bool>* const killed_;  // the Rank's, which outlives its connections'
  const std::atomic<bool>* const silenced_;
};

class Rank final : public RankContext, public WorkerObserver {
 public:
  Rank(const RankLaunch& launch, RankEvents* events, comm::Store* store)
      : launch_(launch), events_(events), store_(store) {}

  int worker() const override { return launch_.worker; }
  bool join() const override { return launch_.join; }
  std::unique_ptr<comm::Store> Connect() override {
    return std::make_unique<RankStore>(store_, &killed_, &silenced_);
  }
  WorkerObserver* observer() override { return this; }
  const std::atomic<bool>* stop_requested() const override { return &stop_; }
  std::unique_ptr<KillHook> OnKill(std::function<void(Status)> abort) override {
    MutexLock lock(&mu_);
    abort_ = std::move(abort);
    return std::make_unique<Hook>(this);
  }
  void Output(std::string line) override {
    if (!killed_.load()) events_->OnOutput(launch_.worker, std::move(line));
  }
  void OnReport(const Report& report) override {
    if (!killed_.load()) events_->OnReport(launch_.worker, report);
  }

  void Stop() {
    stop_.store(true);
    stop_.notify_all();  // for waiters on stop_requested()->wait(false)
  }
  void Silence() { silenced_.store(true); }
  // Its exit is seen at once, as a killed process's is; what its thread does until its body
  // returns reaches no one.
  void Kill() {
    if (killed_.exchange(true)) return;
    // The exit first: told of the kill, the body may return before this thread goes on, and
    // its return must not be taken for the rank's end.
    Exit({.ok = false, .killed = true, .description = "killed"});
    MutexLock lock(&mu_);
    if (abort_) abort_(AbortedError("killed"));
    abort_ = nullptr;
  }
  // The rank's exit, once: at a kill, or when its body returns.
  void Exit(RankExit exit) {
    if (!exited_.exchange(true)) events_->OnExit(launch_.worker, std::move(exit));
  }
  bool exited() const { return exited_.load(); }

 private:
  class Hook final : public KillHook {
   public:
    explicit Hook(Rank* rank) : rank_(rank) {}
    ~Hook() override {
      MutexLock lock(&rank_->mu_);
      rank_->abort_ = nullptr;
    }

   private:
    Rank* const rank_;  // outlives the body that holds the hook
  };

  const RankLaunch launch_;
  RankEvents* const events_;
  comm::Store* const store_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> killed_{false};
  std::atomic<bool> silenced_{false};
  std::atomic<bool> exited_{false};
  Mutex mu_;
  std::function<void(Status)> abort_ KC_GUARDED_BY(mu_);
};

}  // namespace

class ThreadLauncher::Impl {
 public:
  explicit Impl(ThreadLauncherOptions o) : o_(std::move(o)) {}
  ~Impl() {
    std::map<int, Entry> ranks;  // the nodes, and so what the threads point to, stay put
    {
      MutexLock lock(&mu_);
      ranks.swap(ranks_);
    }
    for (auto& [worker, e] : ranks) {
      if (!e.rank->exited()) e.rank->Kill();
    }
    for (auto& [worker, e] : ranks) e.thread.join();
  }

  Status Start(const RankLaunch& launch, RankEvents* events) {
    if (o_.store == nullptr || !o_.body) {
      return InvalidArgumentError("thread launcher: a store and a body are needed");
    }
    MutexLock lock(&mu_);
    if (ranks_.count(launch.worker) != 0) {
      return AlreadyExistsError("thread launcher: worker " + std::to_string(launch.worker) +
                                " started before");
    }
    Entry& e = ranks_[launch.worker];
    e.rank = std::make_unique<Rank>(launch, events, o_.store);
    e.thread = std::thread([this, rank = e.rank.get()] {
      const Status s = o_.body(*rank);
      rank->Exit(s.ok() ? RankExit{.ok = true, .description = "exited with status 0"}
                        : RankExit{.ok = false, .description = s.ToString()});
    });
    return OkStatus();
  }

  void Signal(int worker, RankSignal signal) {
    Rank* rank = Find(worker);
    if (rank == nullptr) return;
    if (signal == RankSignal::kKill) {
      rank->Kill();
    } else {
      rank->Stop();
    }
  }

  void Silence(int worker) {
    if (Rank* rank = Find(worker)) rank->Silence();
  }

 private:
  struct Entry {
    std::unique_ptr<Rank> rank;
    std::thread thread;
  };
  Rank* Find(int worker) {
    MutexLock lock(&mu_);
    auto it = ranks_.find(worker);
    return it == ranks_.end() ? nullptr : it->second.rank.get();
  }

  const ThreadLauncherOptions o_;
  Mutex mu_;
  // Entries are never removed before destruction: their Rank pointers stay valid.
  std::map<int, Entry> ranks_ KC_GUARDED_BY(mu_);
};

ThreadLauncher::ThreadLauncher(ThreadLauncherOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
ThreadLauncher::~ThreadLauncher() = default;

Status ThreadLauncher::Start(const RankLaunch& launch, RankEvents* events) {
  return impl_->Start(launch, events);
}

void ThreadLauncher::Signal(int worker, RankSignal signal) { impl_->Signal(worker, signal); }

void ThreadLauncher::Silence(int worker) { impl_->Silence(worker); }

}  // namespace kc::fault
