// `kc run` across hosts. The run's supervisor (`kc run --hosts h1:2,h2:2 --rendezvous ADDR:PORT`,
// or `--listen ADDR` to serve the store itself) starts no rank of its own: it starts every rank
// through fault::RemoteLauncher with its part of the launch contract (RANK, WORLD_SIZE,
// LOCAL_RANK, GROUP_RANK, MASTER_ADDR and MASTER_PORT of the first host, ...), prints what each
// rank writes prefixed by its rank, and stops the others when one fails. On each host,
// `kc run --share HOST --rendezvous ADDR:PORT -- PROGRAM ARGS` is that host's share
// (fault::ServeHostShare): it publishes the address and a free port the run's MASTER_ADDR and
// MASTER_PORT are when its host holds rank 0, and runs the ranks it is sent, each as a process
// group of its own, with its host's own checkpoint directory. Docs:
// docs/user-guide/pytorch.md ("Across hosts").
#pragma once

#include <csignal>
#include <string>
#include <vector>

#include "base/status.h"
#include "fault/heartbeat.h"

namespace kc::app {

struct RunArgs {
  int nproc = 1;
  int min_nproc = 0;  // 0: --nproc
  int max_restarts = 0;
  int restart_offset = 0;  // restarts before this kc run (a cluster's requeues)
  double grace_s = 30;
  double heartbeat_timeout_s = 0;  // 0: no heartbeats asked of the ranks
  double heartbeat_period_s = 1;
  double heartbeat_first_s = 300;
  std::string checkpoint_dir;
  std::string run_id;
  // Across hosts: the supervisor's hosts, or this host's share; the run's store.
  std::string hosts;
  std::string share;
  std::string rendezvous;
  std::string listen;
  double timeout_s = 300;  // for the store and the first host's address
  std::vector<std::string> command;
};

// The exit code when SIGTERM or SIGINT stopped the run (128 + SIGTERM, as a shell reports).
inline constexpr int kExitStopped = 128 + SIGTERM;

// `name` as execve needs it: itself when it names a path, else the first executable of that
// name on $PATH.
Result<std::string> FindProgram(const std::string& name);

// A TCP port free now on `address` (numeric), as torchrun picks MASTER_PORT.
Result<int> FreePort(const std::string& address);

// A private directory for the ranks' heartbeat files, removed with the object.
class BeatDir {
 public:
  BeatDir() = default;
  BeatDir(const BeatDir&) = delete;
  BeatDir& operator=(const BeatDir&) = delete;
  ~BeatDir();
  Status Create();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The heartbeat watch --heartbeat-timeout, --heartbeat-period and --heartbeat-first ask for.
fault::HeartbeatOptions HeartbeatOptionsOf(const RunArgs& a);

// Why rank `rank`, which `monitor` (watching with `options`) reported silent, is declared
// failed: "sent no heartbeat for 1.1 s (--heartbeat-timeout 1 s): declared failed and killed".
std::string SilenceReason(const fault::HeartbeatMonitor& monitor, int rank,
                          const fault::HeartbeatOptions& options);

// Whether `a` asks for a run across hosts (--hosts or --share).
inline bool AcrossHosts(const RunArgs& a) { return !a.hosts.empty() || !a.share.empty(); }

// Checks the flags of a run across hosts (and that a local run gives none of them), and what
// a run across hosts does not take yet: "" or the error.
std::string CheckHostsRunArgs(const RunArgs& a, bool nproc_given);

// `kc run --hosts ...`: supervises the run until every rank has ended; SIGTERM and SIGINT (read
// from `stop_fd`, a signalfd) stop every rank. With --heartbeat-timeout each host's share
// watches its ranks' heartbeat files and kills a silent one, saying why through the store. An
// exit code.
int RunAcrossHosts(const RunArgs& a, int stop_fd);

// `kc run --share HOST --rendezvous ADDR:PORT -- PROGRAM ARGS`: serves this host's ranks until
// the supervisor says the run is over. An exit code.
int RunHostShareOfRun(const RunArgs& a, const std::string& program);

}  // namespace kc::app
