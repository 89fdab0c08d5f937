// What a run's host is doing now, for `kc diagnose --live` (docs/user-guide/diagnose.md): how
// busy each of the run's cores is and who keeps it busy, and what each of them computes now.
// Linux only: read from /proc.
//
//   KC_ASSIGN_OR_RETURN(HostLoad load, MeasureHostLoad({.roots = {launcher_pid}}));
//   for (const OtherProcess& p : load.others) ... pid p.pid took p.cpu_share of a core
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "base/status.h"

namespace kc::hal {

// One of the run's cores over the window.
struct CoreLoad {
  int cpu = 0;       // OS index
  double busy = 0;   // fraction of the window it ran anything (every process, the kernel)
  double run = 0;    // the run's processes' share of it
  double steal = 0;  // taken by the hypervisor for other machines (a VM's cores shared)
  // fp32 FLOP/s of a short sgemm pinned to it now (best of a few, each shorter than a
  // scheduler slice, so a core shared with busy processes still shows its own speed); 0: not
  // measured.
  double sgemm_flops = 0;
};

// A process outside the run that ran on the run's cores during the window.
struct OtherProcess {
  int pid = 0;
  std::string command;   // its comm (/proc/PID/comm)
  double cpu_share = 0;  // cores' worth of CPU time over the window
  int cpu = -1;          // the core it last ran on
};

struct HostLoad {
  double window_s = 0;
  std::vector<CoreLoad> cores;       // the run's cores, by OS index
  std::vector<OtherProcess> others;  // busiest first, those over 2% of a core
  int run_processes = 0;             // the run's processes found (the roots and descendants)
  // A copy's bytes per second on this host now (8 MiB arrays, best of a few passes, on the
  // core the scheduler gives); 0: not measured.
  double copy_bytes_per_s = 0;
};

struct HostLoadOptions {
  // The run's processes: these and their descendants. Its cores are the union of the CPUs
  // the descendants may run on (their affinity), or every CPU of this process when there are
  // none.
  std::vector<int> roots;
  std::chrono::milliseconds window{500};
  // The per-core sgemm (about 10 ms a core) and the copy (at most about a second).
  bool measure_rates = true;
  int max_rate_cores = 16;  // at most this many cores' rates, the run's first ones
};

// This machine's host name (gethostname); "localhost" when it has none.
std::string HostName();

// kNotFound when no root is alive; kInvalidArgument without a root or with a window outside
// [10 ms, 10 s]; kUnavailable when /proc cannot be read.
Result<HostLoad> MeasureHostLoad(const HostLoadOptions& options);

}  // namespace kc::hal
