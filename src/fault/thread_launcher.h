// Ranks as threads of this process: the launcher seam's in-memory double (as leveldb's memenv is
// its Env's), for tests that run a supervisor and its ranks in one process over one in-memory
// store, in the style of gloo's test harness. Each rank runs `body` on a thread of its own with
// a RankContext: store connections that fail once the rank is killed (as a dead process's do),
// the observer that carries its reports to the supervisor (silent after a kill), the flag a stop
// sets, and what a kill must abort.
//
//   ThreadLauncher launcher({.store = &store, .body = [&](RankContext& rank) {
//     ElasticWorker worker(Options(rank));
//     auto hook = rank.OnKill([&](Status why) { worker.Abort(why); });
//     return worker.Run().status();
//   }});
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "comm/store.h"
#include "fault/launcher.h"
#include "fault/reports.h"

namespace kc::fault {

// What a rank thread has of its launcher. Safe for concurrent use.
class RankContext {
 public:
  virtual ~RankContext() = default;
  virtual int worker() const = 0;
  virtual bool join() const = 0;
  // A connection to the run's store (a view of the launcher's): every call fails with
  // kUnavailable once the rank is killed; its heartbeats are dropped once it is silenced.
  virtual std::unique_ptr<comm::Store> Connect() = 0;
  // Carries reports to the supervisor; drops them once the rank is killed.
  virtual WorkerObserver* observer() = 0;
  // Set by a stop (RankSignal::kStop), with a notify_all (std::atomic::wait wakes).
  virtual const std::atomic<bool>* stop_requested() const = 0;
  // While the returned hook lives, a kill calls `abort` (once, from the killing thread): it
  // must make the body return soon (ElasticWorker::Abort). Destroy the hook before what
  // `abort` uses.
  class KillHook {
   public:
    virtual ~KillHook() = default;
  };
  [[nodiscard]] virtual std::unique_ptr<KillHook> OnKill(std::function<void(Status)> abort) = 0;
  // A line of diagnostics, to the supervisor.
  virtual void Output(std::string line) = 0;
};

struct ThreadLauncherOptions {
  comm::Store* store = nullptr;  // the run's; not owned; outlives the launcher
  // The rank. OK is an exit status 0; an error a failure (its message the description).
  std::function<Status(RankContext&)> body;
};

// Safe for concurrent use.
class ThreadLauncher final : public ProcessLauncher {
 public:
  explicit ThreadLauncher(ThreadLauncherOptions options);
  // Kills the ranks still running and joins their threads. REQUIRES: the RankEvents given to
  // Start outlive it (their supervisor has seen every exit).
  ~ThreadLauncher() override;

  Status Start(const RankLaunch& launch, RankEvents* events) override;
  // kStop sets the rank's stop flag; kKill kills it: its store connections fail, its reports
  // are dropped, its abort is called, and its exit ("killed") is reported at once, as a killed
  // process's is (its thread is joined later).
  void Signal(int worker, RankSignal signal) override;

  // The rank goes on but its heartbeats no longer reach the store, as a stopped process's:
  // the supervisor's heartbeat check finds it.
  void Silence(int worker);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kc::fault
