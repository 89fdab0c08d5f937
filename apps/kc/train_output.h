// What `kc train`'s launcher shows and writes from the run's typed reports: the live progress
// (a bar or lines), the summary at the end, the joined trace.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/kc/train_report.h"
#include "apps/kc/train_setup.h"
#include "base/status.h"
#include "fault/reports.h"
#include "fault/supervisor.h"
#include "kc/v1/train_job.pb.h"

namespace kc::app {

// The run's progress as its reports come: the records the summary and the plot need, and the
// progress bar or lines on stderr. Not thread-safe: the supervisor's observer thread owns it.
class TrainProgress {
 public:
  // mode: "bar", "lines" or "none"; `steps`: the run's.
  TrainProgress(std::string mode, int64_t steps);

  void OnReport(const fault::Report& report);
  // A line above the bar (a rank's diagnostics, the launcher's notices).
  void OnLine(const std::string& line);
  void Finish();  // clears the bar

  int64_t last_step() const { return steps_.empty() ? 0 : steps_.back().step; }
  const std::vector<StepRecord>& steps() const { return steps_; }
  const std::vector<ValRecord>& val() const { return val_; }
  const std::vector<int64_t>& stage_activation_bytes() const { return stage_activation_bytes_; }
  const std::vector<fault::CheckpointReport>& checkpoints() const { return checkpoints_; }
  // Rank 0's in-memory copies (--memory-copy-every): each one's time, ms, and bytes held.
  const std::vector<std::pair<double, int64_t>>& memory_copies() const { return memory_copies_; }
  int64_t resumed_from() const { return resumed_from_; }

 private:
  void Show(bool line_due);
  void ClearBar();

  const std::string mode_;
  const int64_t total_;
  const int64_t every_;  // lines mode: a line every this many steps
  bool bar_shown_ = false;
  std::vector<StepRecord> steps_;
  std::vector<ValRecord> val_;
  std::vector<int64_t> stage_activation_bytes_;
  std::vector<fault::CheckpointReport> checkpoints_;
  std::vector<std::pair<double, int64_t>> memory_copies_;
  int64_t resumed_from_ = -1;  // the checkpoint's step, when resumed
};

// What the supervisor reports, shown and written: the run's records to the metrics file (and
// the progress), its faults to the fault log, its decisions and the ranks' diagnostics to
// stderr. Called from the supervisor's thread only.
class LauncherView final : public fault::SupervisorObserver {
 public:
  // `metrics` (not owned) stays open while the supervisor runs; so does `reports` (not owned;
  // null: none), where the run's typed reports are appended (--reports).
  // Answers to Supervisor::Inspect go to `inspect_answer` (ProgressReport as JSON, replaced
  // whole each time; empty: not written) and to `reports`.
  LauncherView(const TrainArgs& a, std::ofstream* metrics, std::filesystem::path fault_log,
               std::string job, TrainProgress* progress, std::FILE* reports = nullptr,
               std::filesystem::path inspect_answer = {});

  void OnReport(int worker, const fault::Report& report) override;
  void OnFault(const fault::FaultEvent& e) override;
  void OnOutput(int worker, const std::string& line) override;
  void OnReplacement(int worker, const Status& started) override;
  void OnProgress(const fault::ProgressSnapshot& snapshot) override;

  // The recovered and stopped events, for the summary.
  const std::vector<fault::FaultEvent>& recoveries() const { return recoveries_; }

 private:
  const TrainArgs& a_;  // the launcher's, which outlives the run
  std::ofstream* const metrics_;
  const std::filesystem::path fault_log_path_;
  const std::string job_;
  TrainProgress* const progress_;  // not owned
  std::ofstream fault_log_;        // opened at the first event
  std::FILE* const reports_;
  const std::filesystem::path inspect_answer_;
  // The checkpoint interval in force and why, for the checkpoint reports.
  int64_t interval_steps_ = 0;
  std::string interval_reason_;
  int ranks_ = 0;  // of the generation running
  std::vector<fault::FaultEvent> recoveries_;

  void Append(kc::v1::TrainReport report);
};

// What --comm-limits (or a run file's limits) applies to every rank's communicators, for the
// metrics' header; null without any.
nlohmann::json CommLimitsJson(const TrainSetup& p);

// The typed reports of a run whose checkpoint already holds every step asked for (a step and
// a checkpoint at `step`), appended to `reports`; false when the write failed.
bool AppendDoneReports(std::FILE* reports, const std::string& run_id, int64_t step);
// The run's start (what it runs: its metrics' "run" record) and its summary as typed reports.
bool AppendRunReport(std::FILE* reports, const TrainArgs& a, const TrainSetup& p,
                     const std::optional<kc::v1::HostLoadReport>& start);
bool AppendSummaryReport(std::FILE* reports, const std::string& run_id,
                         const nlohmann::json& summary);

// The line a failed run ends with ("rank 1 failed: ...; the other ranks were stopped").
std::string DescribeFailure(const TrainArgs& a, const TrainSetup& p, const fault::RunOutcome& o);

// The end-of-run summary on stdout, and its record for the metrics file in *summary_json.
// peak_per_core: one core's measured sgemm rate, or on GPUs one GPU's measured matrix rate in
// the run's precision. `recoveries`: the run's recovered and stopped fault events.
void PrintSummary(const TrainArgs& a, const TrainSetup& p, const TrainProgress& m, int faults,
                  const std::vector<fault::FaultEvent>& recoveries, double peak_per_core,
                  const std::filesystem::path& metrics_path, const std::filesystem::path& plot_path,
                  nlohmann::json* summary_json);

// Where rank `rank` leaves its trace events for the launcher to join.
std::string TracePart(const std::string& trace, int rank);
// Joins the ranks' trace events into one Chrome-trace / Perfetto file and removes the parts.
Status JoinTrace(const std::string& trace, int ranks);

// GPU 0's matrix-product rate in the run's precision (hal::MeasureGemmFlops).
Result<double> MeasureGpuFlops(const TrainSetup& p);

}  // namespace kc::app
