// Job traces: the CSV files `kc sim` replays. One row per job, with a header naming the
// columns; format and error messages: docs/operations/scheduling.md ("Traces").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kc::sched {

// One job of a trace. `duration_s` is the run time at max_devices: the job's work is
// duration_s * max_devices device-seconds and it runs that work at one device-second per
// device per second, so on n devices it takes duration_s * max_devices / n.
struct TraceJob {
  double submit_s = 0;  // virtual seconds from the start of the trace
  std::string job;      // unique in the trace
  std::string team;
  std::string user;
  std::string job_class;  // "high", "normal" or "preemptible"
  int min_devices = 1;
  int max_devices = 1;
  double duration_s = 0;
  // Optional columns; a trace without them gets these defaults.
  std::string kind;            // device kind or model ("A100-SXM4-80GB"); "" = any
  std::string pool;            // a pool named by the job; "" = chosen by class and team
  int tp = 1;                  // devices that must share a host (tensor-parallel group)
  double checkpoint_s = -1;    // cost of one checkpoint; < 0 = the simulator's default
  double faults_per_hour = 0;  // process faults the job suffers while it runs (Poisson)
};

// The columns every trace has, in this order in the files kc writes.
inline constexpr std::string_view kTraceRequiredColumns[] = {
    "submit_s", "job", "team", "user", "class", "min_devices", "max_devices", "duration_s"};
// The optional ones kc reads: kind, pool, tp, checkpoint_s, faults_per_hour. Any other column
// is ignored.

// Reads a trace. Rows come back sorted by submit_s (stable: ties keep file order).
// kNotFound if the file does not exist; kInvalidArgument as "FILE:LINE: column: what" for a
// missing required column, a row with the wrong number of fields, a value that is not a
// number, a negative submit time, a duration that is not positive, min_devices < 1,
// min_devices > max_devices, tp < 1 or not dividing min and max, a class other than
// high/normal/preemptible, or a job name used twice. Blank lines and lines starting with '#'
// are skipped. Fields are separated by commas; no quoting.
Result<std::vector<TraceJob>> LoadTrace(const std::string& path);
Result<std::vector<TraceJob>> LoadTraceString(std::string_view text, std::string display_name);

// Writes `jobs` as a trace with the required columns and, when any job sets them, the
// optional ones. LoadTraceString of the text gives the jobs back (numbers to 17 digits).
std::string TraceToCsv(const std::vector<TraceJob>& jobs);

}  // namespace kc::sched
