// Heartbeats: each worker says it is alive through the job's rendezvous store, and the
// supervisor (the launcher, later kcd's) declares a rank that has gone silent failed. A rank is
// silent when its process is alive but not running: stopped, swapped out, wedged in the
// kernel. A dead process is seen at once by its supervisor without heartbeats, and a broken
// link by the communicator.
//
//   Worker:      KC_ASSIGN_OR_RETURN(auto beat, Heartbeat::Start(store, rank, period));
//   Supervisor:  HeartbeatMonitor monitor(store, ranks, {period, timeout});
//                every period / 2: for (int r : monitor.Check(now)) ... rank r failed
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "comm/communicator.h"
#include "comm/store.h"

namespace kc::fault {

using Seconds = std::chrono::duration<double>;

// The store key rank `rank` beats on: kHeartbeatPrefix and the rank.
inline constexpr std::string_view kHeartbeatPrefix = "kc/heartbeat/";
std::string HeartbeatKey(int rank);

// Hang localisation (docs/user-guide/diagnose.md#a-hung-job). With each beat a rank publishes
// where it is in its collectives (comm::Communicator::progress) under ProgressKey(rank), as
// ProgressToJson writes it; when a rank goes silent the supervisor reads every rank's and
// HangReport names who holds the others up.
std::string ProgressKey(int rank);
// Where worker `worker` publishes its compute time per step (milliseconds, decimal: the mean
// of its steps over about a second), for the supervisor's RanksReport.
std::string ComputeKey(int worker);
std::string ProgressToJson(const std::vector<comm::OpProgress>& ops, TimePoint now);
// From each rank's published progress (rank -> ProgressToJson's text; a rank without one has
// published nothing), in words: for each communicator whose newest operation some rank is in,
// the ranks that have not entered it (with what they did last) and those waiting in it, e.g.
// "allreduce #36 of job/g0/sub0.0 (4.0 MB): worker 1 has not entered it (last: allreduce #35,
// finished); workers 0, 2 wait in it (2.0 s)". "" when no rank waits. A communicator whose
// longest waiter has waited less than `min_wait_s` is left out: ranks of a healthy run, each
// seen at its own last beat, are often a collective apart for a moment.
std::string HangReport(const std::map<int, std::string>& progress, double min_wait_s = 0);

// A thread that sets HeartbeatKey(rank) to a counter every `period` until destroyed. The store
// (not owned) must outlive it and be for it alone (its calls block the thread).
class Heartbeat {
 public:
  // `progress`, when set, is asked at each beat for the text to publish under
  // ProgressKey(rank) (ProgressToJson of the rank's communicator).
  static Result<std::unique_ptr<Heartbeat>> Start(comm::Store* store, int rank, Seconds period,
                                                  std::function<std::string()> progress = {});
  // The heartbeat of a program `kc run` started (KC_HEARTBEAT_FILE): touches `path` (creates it,
  // then sets its modification time) at once and every `period`.
  static Result<std::unique_ptr<Heartbeat>> StartFile(std::string path, Seconds period);
  ~Heartbeat();
  int64_t beats() const;

 private:
  Heartbeat(Seconds period, std::function<void(int64_t)> beat)
      : period_(period), beat_(std::move(beat)) {}
  void Loop();

  const Seconds period_;
  const std::function<void(int64_t)> beat_;  // beat n: say it (errors are the watcher's to see)
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ KC_GUARDED_BY(mu_) = false;
  int64_t beats_ KC_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

struct HeartbeatOptions {
  Seconds period{1.0};
  Seconds timeout{30.0};  // silent this long after a beat: failed
  // A rank not heard from at all gets this long from the start (process start-up and model
  // building come before its first beat).
  Seconds first_beat{300.0};
};

// Validates a period and timeout: both positive, the timeout at least two periods.
Status ValidateHeartbeat(const HeartbeatOptions& options);

// Touches `path` as Heartbeat::StartFile does, once.
Status TouchFile(const std::string& path);
// A file heartbeat's current beat: its modification time and size; nullopt while it does not
// exist (the rank has not beaten yet).
std::optional<std::string> FileBeat(const std::string& path);

// The supervisor's side. Not thread-safe.
class HeartbeatMonitor {
 public:
  using Clock = std::chrono::steady_clock;
  // Rank r's beat now (any text that changes with each beat); nullopt: none yet.
  using BeatReader = std::function<std::optional<std::string>(int rank)>;
  // Ranks [0, ranks); a rank not heard from yet counts from `start`, against first_beat.
  HeartbeatMonitor(comm::Store* store, int ranks, HeartbeatOptions options,
                   Clock::time_point start);
  // The beats `read` returns: FileBeat of each rank's file for `kc run`'s ranks.
  HeartbeatMonitor(BeatReader read, int ranks, HeartbeatOptions options, Clock::time_point start);

  // Reads every watched rank's counter; returns the ranks silent for longer than the timeout
  // (each once; they are no longer watched). Called every period / 2 or more often, a rank
  // that stops is reported within timeout + period of its last beat.
  std::vector<int> Check(Clock::time_point now);
  // How long rank r had been silent when Check reported it.
  Seconds silent_for(int rank) const { return silent_for_.at(static_cast<size_t>(rank)); }
  // Whether rank r had beaten at all (else it was reported against first_beat).
  bool heard(int rank) const { return heard_.at(static_cast<size_t>(rank)); }
  void Forget(int rank);  // stop watching (the rank exited)
  // Watches `rank` (a new one, or one forgotten) as not heard from since `start`.
  void Watch(int rank, Clock::time_point start);

 private:
  const BeatReader read_;
  const HeartbeatOptions options_;
  std::vector<std::string> last_value_;
  std::vector<Clock::time_point> last_change_;
  std::vector<bool> watched_;
  std::vector<bool> heard_;
  std::vector<Seconds> silent_for_;
};

}  // namespace kc::fault
