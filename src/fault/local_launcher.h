// Ranks as processes of this machine (kc train's launcher): each is started with
// base/subprocess.h from the command the caller builds for it, its stderr and its report pipe
// (kReportFd, one JSON report a line: ReportPipe on its side) read by one thread of the
// launcher, its exit seen at once through its pidfd.
#pragma once

#include <functional>
#include <memory>

#include "base/status.h"
#include "base/subprocess.h"
#include "fault/launcher.h"
#include "fault/reports.h"

namespace kc::fault {

// The descriptor a rank writes its reports to.
inline constexpr int kReportFd = 3;

struct LocalLauncherOptions {
  // The program, argv, environment and cores of a rank. The launcher sets its stderr and
  // kReportFd to pipes of its own. A rank in a process group of its own (Group::kNew) is
  // signalled as a group, and what is left of the group is killed when it exits (its helpers
  // would hold its output open).
  std::function<SubprocessOptions(const RankLaunch&)> command;
  // Its stdout as well as its stderr into OnOutput (any program's output, as kc run shows it;
  // kc train's workers keep stdout for themselves).
  bool stdout_as_output = false;
};

// Safe for concurrent use.
class LocalLauncher final : public ProcessLauncher {
 public:
  static Result<std::unique_ptr<LocalLauncher>> Create(LocalLauncherOptions options);
  // Kills the ranks still running (without reporting their exits) and stops its thread.
  ~LocalLauncher() override;

  // kInternal when the pipes or the process cannot be made.
  Status Start(const RankLaunch& launch, RankEvents* events) override;
  // kStop is SIGTERM, kKill SIGKILL, to the rank's process.
  void Signal(int worker, RankSignal signal) override;

 private:
  class Impl;
  explicit LocalLauncher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A rank's side of the report pipe: each report as a JSON line on kReportFd, when the launcher
// gave it that descriptor (a worker started by hand has none, and reports nothing). Not
// thread-safe; owned by the worker's thread.
class ReportPipe final : public WorkerObserver {
 public:
  ReportPipe();
  ~ReportPipe() override;
  ReportPipe(const ReportPipe&) = delete;
  ReportPipe& operator=(const ReportPipe&) = delete;
  void OnReport(const Report& report) override;

 private:
  int fd_ = -1;
};

}  // namespace kc::fault
