// Ranks on other hosts. A run's supervisor starts its ranks through a RemoteLauncher; on every
// host a host share (ServeHostShare) starts and watches that host's ranks with a launcher of its
// own (a LocalLauncher) and carries what they do back. The two sides talk only through the
// run's store, which the supervisor serves: orders go down a queue per host, events come back
// up another, and each share beats a counter. No host is special: losing any one loses only its
// ranks, which the supervisor takes for lost once that host's share has been silent for
// `share_timeout` (a killed host is noticed in that time, well before its ranks' heartbeats
// run out), and a share that cannot reach the store for as long kills its own ranks, so that a
// host cut off never trains on beside the others (its own fence, below any agent's lease).
//
//   Supervisor:  RemoteLauncher launcher(...);   Supervisor::Create({.launcher = &launcher, ...})
//   Each host:   ServeHostShare({.store = ..., .host = "h2", .launcher = &local_launcher});
//
// The keys, under the prefix the caller gives both sides (one run's):
//   hosts/H/session          counter: each share of host H takes the next session S
//   hosts/H/S/order/N        {"op": "start"|"stop"|"kill"|"end", "worker": W, "join": bool,
//                             "env": [[NAME, VALUE], ...] (a start's RankLaunch::env)}
//   hosts/H/S/event/N        {"worker": W, "output": LINE} | {"worker": W, "report": {...}} |
//                            {"worker": W, "exit": {"ok", "killed", "description"}}
//   hosts/H/S/beat           counter the share adds to every beat period
// Each queue has one writer, which numbers its entries from 0; the reader deletes what it read.
// Design: docs/design/multi-host.md.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "comm/store.h"
#include "fault/launcher.h"

namespace kc::fault {

struct RemoteHost {
  std::string name;
  int slots = 1;  // ranks it may run at once
};

struct RemoteLauncherOptions {
  // A connection to the run's store for the launcher alone (its thread polls it). Not owned.
  comm::Store* store = nullptr;
  // The hosts in placement order. A first-generation worker w (RankLaunch::join false) goes
  // to the host whose slots hold position w when the hosts' slots are laid end to end; a
  // replacement to the host with the most free slots of those whose share is up (the first of
  // them on a tie), so a host that comes back takes ranks again; failing that, to one given
  // slots by SetHosts whose share has not come up yet (it waits there for the share).
  std::vector<RemoteHost> hosts;
  // A share silent this long (its beat counter unchanged) is taken for lost, with its ranks.
  Duration share_timeout = std::chrono::milliseconds(1500);
  Duration poll = std::chrono::milliseconds(20);
  Clock* clock = Clock::Real();
};

// Safe for concurrent use.
class RemoteLauncher final : public ProcessLauncher {
 public:
  // kInvalidArgument for no store, no hosts or a host without slots.
  static Result<std::unique_ptr<RemoteLauncher>> Create(RemoteLauncherOptions options);
  // Tells every share the run is over (Finish) and stops its thread.
  ~RemoteLauncher() override;

  // Queues the start on the worker's host (sent once that host's share is up). kUnavailable
  // for a replacement when no host that is up has a free slot.
  Status Start(const RankLaunch& launch, RankEvents* events) override;
  // kStop or kKill, through the worker's host; a kill of a worker whose host is down (or
  // never came up) ends it at once (OnExit, killed).
  void Signal(int worker, RankSignal signal) override;

  // Every share is told the run is over: each ends once its ranks have. Idempotent.
  void Finish();

  // The hosts and their slots from now on (the run's placement grew or shrank): hosts not yet
  // known are added (their shares are awaited), a known host left out keeps its share but has
  // no slots. The ranks a host runs beyond its slots are Overplaced. kInvalidArgument for a bad
  // name or a name given twice; kFailedPrecondition once finished.
  Status SetHosts(const std::vector<RemoteHost>& hosts);
  std::vector<int> Overplaced() const override;

  // The host a worker was placed on ("" when none).
  std::string HostOf(int worker) const;

 private:
  class Impl;
  explicit RemoteLauncher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct HostShareOptions {
  // This share's connection to the run's store, with the prefix the supervisor's launcher
  // uses. Not owned.
  comm::Store* store = nullptr;
  std::string host;                     // this host's name, one of the launcher's hosts
  ProcessLauncher* launcher = nullptr;  // starts this host's ranks; not owned
  Duration beat_period = std::chrono::milliseconds(250);
  // Cut off from the store this long (every call failing): its ranks are killed and the share
  // ends with kUnavailable. Keep it at most the launcher's share_timeout.
  Duration fence_after = std::chrono::milliseconds(1500);
  Clock* clock = Clock::Real();
};

// Serves the host's orders until the supervisor's launcher says the run is over and every rank
// it started here has ended (OK), or the store stays out of reach for fence_after (its ranks are
// killed first: kUnavailable).
Status ServeHostShare(const HostShareOptions& options);

}  // namespace kc::fault
