// The seam between a run's supervisor and wherever its ranks run: a ProcessLauncher starts a
// rank, passes it a stop or a kill, and tells the supervisor, through RankEvents, what the rank
// writes, reports and how it ended. LocalLauncher (local_launcher.h) runs ranks as processes of
// this machine, ThreadLauncher (thread_launcher.h) as threads of this process; an agent will
// run them on its host for a supervisor elsewhere. Design: docs/design/runtime.md.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "fault/reports.h"

namespace kc::fault {

struct RankLaunch {
  // The worker's lasting id: its rank in the first generation; replacements take the next
  // ids. A worker keeps its id while its rank changes from generation to generation.
  int worker = 0;
  bool join = false;  // a replacement: it joins a later generation of a running job
  // Variables its supervisor sets for it over what its host gives it (NAME, VALUE): the launch
  // contract of a command run across hosts (kc run --hosts). Carried to a remote host with the
  // start; a launcher's command adds them.
  std::vector<std::pair<std::string, std::string>> env;
};

struct RankExit {
  bool ok = false;      // it ended by itself, successfully (exit status 0)
  bool killed = false;  // a signal ended it (a process), or a kill (a thread)
  // "exited with status 86", "killed by signal 9 (Killed)", or a thread's error.
  std::string description;
};

// Where a launcher delivers what its ranks do. Implementations are safe for concurrent use;
// calls for one worker come in order, its OnExit last.
class RankEvents {
 public:
  virtual ~RankEvents() = default;
  virtual void OnOutput(int worker, std::string line) = 0;  // a line of its diagnostics
  virtual void OnReport(int worker, Report report) = 0;
  virtual void OnExit(int worker, RankExit exit) = 0;
  // Several ranks ended together (a host lost with its ranks): as OnExit for each, delivered
  // at once, so that what follows their loss (the next generation) leaves out all of them.
  virtual void OnExits(std::vector<std::pair<int, RankExit>> exits) {
    for (auto& [worker, exit] : exits) OnExit(worker, std::move(exit));
  }
};

enum class RankSignal {
  kStop,  // stop after a step the ranks agree on, with a checkpoint of it (SIGTERM)
  kKill,  // end now, without a word (SIGKILL)
};

// Safe for concurrent use.
class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  // Starts worker `launch.worker`; what it does goes to `events` (not owned; it outlives the
  // launcher's ranks), ending with exactly one OnExit. Errors: the rank did not start (no
  // OnExit follows).
  virtual Status Start(const RankLaunch& launch, RankEvents* events) = 0;
  // Passes `signal` to a started worker; nothing once it has ended.
  virtual void Signal(int worker, RankSignal signal) = 0;
  // Workers running where they no longer have a place (a host whose slots were taken away),
  // the ones to retire first when the run shrinks. None by default.
  virtual std::vector<int> Overplaced() const { return {}; }
};

}  // namespace kc::fault
