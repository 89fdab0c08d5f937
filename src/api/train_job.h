// The typed job (proto/kc/v1/train_job.proto) and what kcd, the agent and `kc train` make of
// it: `kc submit` reads the job file once into a TrainJob; kcd checks it as a job file is
// checked and stores it as it is; the agent hands it unchanged, with the run's assignment, to
// the run's launcher as one file (TrainRun); the launcher's supervisor reports back as
// TrainReport messages, length-delimited in a file the agent follows. Decisions:
// docs/design/job-contract.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "api/job_spec.h"
#include "base/status.h"
#include "comm/lanes.h"
#include "comm/rate_limit.h"
#include "fault/supervisor.h"
#include "hal/host_load.h"
#include "kc/v1/train_job.pb.h"
#include "parallel/plan.h"

namespace kc::api {

// A plan and its IDL form, field for field (the schedule by its name). FromTrainPlan:
// kInvalidArgument for a schedule it does not know.
kc::v1::TrainPlan ToTrainPlan(const parallel::ParallelPlan& plan);
Result<parallel::ParallelPlan> FromTrainPlan(const kc::v1::TrainPlan& plan);

// The typed job of a spec, and back. JobSpecOf checks nothing (for a job kcd already
// checked); CheckedJobSpec checks what it receives as LoadJobFile checks a job file, errors
// naming the job file's key ("job: min_devices: 3 is above max_devices (2)").
kc::v1::TrainJob ToTrainJob(const JobSpec& spec);
JobSpec JobSpecOf(const kc::v1::TrainJob& job);
Result<JobSpec> CheckedJobSpec(const kc::v1::TrainJob& job);

// The job as kcd stores it: the TrainJob in protobuf's JSON form (the IDL's field names), so
// that an admin reading the database reads the job. ReadStoredJob also reads the JSON spec
// kcd stored before the typed job (JobSpecText); `display_name` stands for it in errors.
std::string StoredJobText(const JobSpec& spec);
Result<kc::v1::TrainJob> ReadStoredTrainJob(std::string_view text, const std::string& display_name);
Result<JobSpec> ReadStoredJob(std::string_view text, const std::string& display_name);

// A job's comm limits and lanes and their IDL form. FromCommLimits: kInvalidArgument for an
// unknown lane name or values the rate limiter or the lanes refuse.
kc::v1::CommLimits ToCommLimits(const comm::RateLimit& limit, const comm::LaneOptions& lanes);
Status FromCommLimits(const kc::v1::CommLimits& in, comm::RateLimit* limit,
                      comm::LaneOptions* lanes);

// TrainRun files: written whole (atomically replaced) by the agent, read by `kc train --job`.
Status WriteTrainRun(const std::string& path, const kc::v1::TrainRun& run);
Result<kc::v1::TrainRun> ReadTrainRun(const std::string& path);

// A supervisor's fault event as its report.
kc::v1::FaultReport ToFaultReport(const fault::FaultEvent& e);
// One line of it for people and the audit log: {"event":"detected","worker":1,...}.
std::string FaultReportJson(const kc::v1::FaultReport& report);

// An inspection of a running kc train (where every rank is): the request, {"request": N},
// written whole beside the run's metrics by kc agent or kc diagnose --live, and the answer,
// ProgressReport as JSON, written whole there by kc train (and appended to its reports).
inline constexpr const char* kInspectRequestFile = "inspect.json";
inline constexpr const char* kInspectAnswerFile = "progress.json";
// Asks the kc train whose metrics are in `dir` where its ranks are: kInspectRequestFile there,
// {"request": N}, written whole.
Status WriteInspectRequest(const std::string& dir, int64_t request);

// A supervisor's answer to Supervisor::Inspect as its report: each worker's published
// progress (fault::ProgressToJson's text) read into groups and operations; text that does not
// parse counts as nothing published.
kc::v1::ProgressReport ToProgressReport(const fault::ProgressSnapshot& s);
// A report as JSON, with the proto's field names, zeros included: kInspectAnswerFile's text,
// kc diagnose --json's "live", the metrics header's "start".
std::string ReportJson(const google::protobuf::Message& report);

// A host's load as its report (`host` its name, `request` JobService.Inspect's or 0).
kc::v1::HostLoadReport ToHostLoadReport(const hal::HostLoad& load, const std::string& host,
                                        int64_t request);

// Appends `report` to `out` length-delimited. False when the write failed.
bool AppendReport(std::FILE* out, const kc::v1::TrainReport& report);

// Reads the whole reports appended to `path` since *offset, calling `each` for every one in
// order and advancing *offset past them; a report being written (its bytes not all there
// yet) waits for the next call. A missing file has none yet. kDataLoss for bytes that are
// not a report (the file is not one kc train wrote): *offset stays, nothing more is read.
Status ReadNewReports(const std::string& path, int64_t* offset,
                      const std::function<void(const kc::v1::TrainReport&)>& each);

}  // namespace kc::api
