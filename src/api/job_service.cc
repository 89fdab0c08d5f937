#include "api/job_service.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "api/internal/authorize.h"
#include "api/internal/digest.h"
#include "api/job_spec.h"
#include "api/quota_usage.h"
#include "api/train_job.h"

namespace kc::api {
namespace {

void Fill(const JobRecord& j, kc::v1::JobInfo* out) {
  out->set_id(j.id);
  out->set_name(j.name);
  out->set_owner(j.owner);
  out->set_team(j.team);
  out->set_phase(std::string(JobPhaseName(j.phase)));
  out->set_reason(j.reason);
  out->set_devices(j.devices);
  out->set_submitted_s(j.submitted_s);
  out->set_updated_s(j.updated_s);
  out->set_expected_hours(j.devices > 0 ? j.device_hours / static_cast<double>(j.devices) : 0);
}

// Fill, with where the job runs, how far it got, and its history.
Status FillDetail(const JobStore& jobs, const JobRecord& j, kc::v1::JobInfo* out) {
  Fill(j, out);
  KC_ASSIGN_OR_RETURN(JobProgress p, jobs.Progress(j.id));
  out->set_host(p.host);
  out->set_step(p.step);
  out->set_checkpoint_step(p.checkpoint_step);
  KC_ASSIGN_OR_RETURN(std::vector<JobEvent> history, jobs.History(j.id));
  for (const JobEvent& e : history) {
    kc::v1::JobEvent* x = out->add_history();
    x->set_phase(std::string(JobPhaseName(e.phase)));
    x->set_reason(e.reason);
    x->set_time_s(e.time_s);
  }
  return OkStatus();
}

Resource JobResource(const JobRecord& j) {
  return {.kind = "job", .id = std::to_string(j.id), .owner = j.owner, .team = j.team};
}

}  // namespace

Status JobServiceImpl::Allowed(const Principal& caller, Action action, const JobRecord& j) {
  return internal::Authorized(audit_, caller, action, fmt::format("job/{}", j.id),
                              Check(caller, action, JobResource(j)));
}

Status JobServiceImpl::CheckQuotas(const Principal& caller, std::string_view action,
                                   std::string_view resource, const std::string& owner,
                                   const std::string& team, const QuotaAsk& ask) {
  KC_ASSIGN_OR_RETURN(std::vector<JobRecord> all, jobs_->List({.limit = 1 << 30}));
  KC_ASSIGN_OR_RETURN(Quota user_quota, quotas_->Get(QuotaSubject::kUser, owner));
  Status over =
      CheckQuota("user " + owner, user_quota, UsageOf(all, QuotaSubject::kUser, owner), ask);
  if (over.ok() && !team.empty()) {
    KC_ASSIGN_OR_RETURN(Quota team_quota, quotas_->Get(QuotaSubject::kTeam, team));
    over = CheckQuota("team " + team, team_quota, UsageOf(all, QuotaSubject::kTeam, team), ask);
  }
  if (!over.ok()) {
    AuditNow(audit_, caller.user, action, resource, "denied", over.message())
        .IgnoreError();  // logged by AuditNow; the refusal stands
  }
  return over;
}

grpc::Status JobServiceImpl::Submit(grpc::ServerContext* context,
                                    const kc::v1::SubmitJobRequest* req,
                                    kc::v1::JobInfo* response) {
  return guard_->Serve(context, "kc.v1.JobService.Submit", [&](const Principal& caller) -> Status {
    if (req->name().empty()) return InvalidArgumentError("name: must not be empty");
    // Written so that NaN fails too: what quotas and run tokens are computed from is finite.
    if (req->devices() < 0 || !(req->expected_hours() >= 0) ||
        !(req->expected_hours() <= kMaxExpectedHours) || !(req->storage_gb() >= 0) ||
        !(req->storage_gb() <= kMaxStorageGb)) {
      return InvalidArgumentError(fmt::format(
          "devices, expected_hours, storage_gb: must not be negative, and at most {} hours "
          "and {} GB",
          kMaxExpectedHours, kMaxStorageGb));
    }
    if (req->has_job() && !req->spec().empty()) {
      return InvalidArgumentError("job, spec: give one (the typed job, or its JSON form)");
    }
    // A job to run: it must hold as a job file does, and says what it uses. kcd keeps it as
    // it came, in the typed job's JSON form.
    std::string job_text;
    if (req->has_job() || !req->spec().empty()) {
      KC_ASSIGN_OR_RETURN(JobSpec spec, req->has_job() ? CheckedJobSpec(req->job())
                                                       : ParseJobSpec(req->spec(), "spec"));
      if (req->devices() != spec.ranks) {
        return InvalidArgumentError(fmt::format(
            "devices: {} differs from the job's max_devices ({})", req->devices(), spec.ranks));
      }
      job_text = StoredJobText(spec);
    }
    JobRecord j{.id = 0,
                .name = req->name(),
                .owner = caller.user,
                .team = req->team(),
                .spec = job_text,
                .devices = req->devices(),
                .device_hours = req->expected_hours() * static_cast<double>(req->devices()),
                .storage_gb = req->storage_gb(),
                .phase = JobPhase::kPending,
                .submitted_s = 0,
                .updated_s = 0,
                .reason = "submitted"};
    if (j.team.empty() && !caller.teams.empty()) j.team = caller.teams.front();
    if (!j.team.empty() && std::none_of(roles_->teams.begin(), roles_->teams.end(),
                                        [&](const TeamSpec& t) { return t.name == j.team; })) {
      return InvalidArgumentError(fmt::format("team: no team \"{}\" in the roles file", j.team));
    }
    if (!j.team.empty() && caller.role != Role::kSystemAdmin &&
        std::find(caller.teams.begin(), caller.teams.end(), j.team) == caller.teams.end()) {
      const std::string why = fmt::format("{} is not in team {}", caller.user, j.team);
      AuditNow(audit_, caller.user, "job.submit", "job/new", "denied", why).IgnoreError();
      return PermissionDeniedError(why);
    }
    KC_RETURN_IF_ERROR(Allowed(caller, Action::kJobSubmit, j));
    // The limits, and the quotas: the submitter's and the team's, against their jobs. Checked
    // and stored under one lock: two submissions never both take the last of a quota.
    MutexLock lock(&quota_mu_);
    KC_ASSIGN_OR_RETURN(const int64_t active, jobs_->CountActive(j.owner));
    if (active >= options_.max_active_jobs_per_user) {
      const Status over = ResourceExhaustedError(fmt::format(
          "user {}: {} jobs that have not ended, the most one user may have; wait for one to "
          "end, or cancel one",
          j.owner, active));
      AuditNow(audit_, caller.user, "job.submit", "job/new", "denied", over.message())
          .IgnoreError();  // logged by AuditNow; the refusal stands
      return over;
    }
    KC_RETURN_IF_ERROR(CheckQuotas(
        caller, "job.submit", "job/new", j.owner, j.team,
        {.devices = j.devices, .device_hours = j.device_hours, .storage_gb = j.storage_gb}));
    KC_ASSIGN_OR_RETURN(JobRecord stored, jobs_->Submit(std::move(j), internal::WallSeconds()));
    KC_RETURN_IF_ERROR(AuditNow(audit_, caller.user, "job.submit", fmt::format("job/{}", stored.id),
                                "ok", stored.name));
    if (dispatcher_ != nullptr) dispatcher_->Wake();
    Fill(stored, response);
    return OkStatus();
  });
}

grpc::Status JobServiceImpl::Get(grpc::ServerContext* context, const kc::v1::GetJobRequest* req,
                                 kc::v1::JobInfo* response) {
  return guard_->Serve(context, "kc.v1.JobService.Get", [&](const Principal& caller) -> Status {
    KC_ASSIGN_OR_RETURN(JobRecord j, jobs_->Get(req->id()));
    KC_RETURN_IF_ERROR(Allowed(caller, Action::kJobGet, j));
    if (dispatcher_ != nullptr) response->set_comm_limits(dispatcher_->CommLimitsOf(j));
    return FillDetail(*jobs_, j, response);
  });
}

grpc::Status JobServiceImpl::List(grpc::ServerContext* context, const kc::v1::ListJobsRequest* req,
                                  kc::v1::ListJobsResponse* response) {
  return guard_->Serve(context, "kc.v1.JobService.List", [&](const Principal& caller) -> Status {
    std::optional<JobPhase> phase;
    if (!req->phase().empty()) {
      phase = JobPhaseFromName(req->phase());
      if (!phase) return InvalidArgumentError(fmt::format("phase: unknown \"{}\"", req->phase()));
    }
    KC_ASSIGN_OR_RETURN(std::vector<JobRecord> all,
                        jobs_->List({.phase = phase, .limit = 1 << 30}));
    for (const JobRecord& j : all) {
      if (Check(caller, Action::kJobList, JobResource(j)).allowed) Fill(j, response->add_jobs());
    }
    return OkStatus();
  });
}

grpc::Status JobServiceImpl::Cancel(grpc::ServerContext* context,
                                    const kc::v1::CancelJobRequest* req,
                                    kc::v1::JobInfo* response) {
  return guard_->Serve(context, "kc.v1.JobService.Cancel", [&](const Principal& caller) -> Status {
    KC_ASSIGN_OR_RETURN(JobRecord j, jobs_->Get(req->id()));
    KC_RETURN_IF_ERROR(Allowed(caller, Action::kJobCancel, j));
    const std::string reason = fmt::format("cancelled by {}{}", caller.user,
                                           req->reason().empty() ? "" : ": " + req->reason());
    KC_ASSIGN_OR_RETURN(JobRecord done, jobs_->Transition(j.id, JobPhase::kCancelled, reason,
                                                          internal::WallSeconds()));
    KC_RETURN_IF_ERROR(
        AuditNow(audit_, caller.user, "job.cancel", fmt::format("job/{}", j.id), "ok", reason));
    if (dispatcher_ != nullptr) dispatcher_->Wake();
    Fill(done, response);
    return OkStatus();
  });
}

grpc::Status JobServiceImpl::Modify(grpc::ServerContext* context,
                                    const kc::v1::ModifyJobRequest* req,
                                    kc::v1::JobInfo* response) {
  return guard_->Serve(context, "kc.v1.JobService.Modify", [&](const Principal& caller) -> Status {
    KC_ASSIGN_OR_RETURN(JobRecord j, jobs_->Get(req->id()));
    KC_RETURN_IF_ERROR(Allowed(caller, Action::kJobModify, j));
    std::optional<std::string> name;
    if (!req->name().empty()) name = req->name();
    std::optional<double> device_hours;
    std::string what = name ? fmt::format("name {}", *name) : "";
    if (std::isnan(req->expected_hours()) || req->expected_hours() > kMaxExpectedHours) {
      return InvalidArgumentError(
          fmt::format("expected_hours: at most {} (negative keeps the job's)", kMaxExpectedHours));
    }
    if (req->expected_hours() >= 0) {
      device_hours = req->expected_hours() * static_cast<double>(j.devices);
      what += fmt::format("{}expected_hours {}", what.empty() ? "" : ", ", req->expected_hours());
    }
    MutexLock lock(&quota_mu_);
    // More hours must still fit the quotas: the difference is what is asked for.
    if (device_hours && *device_hours > j.device_hours) {
      KC_RETURN_IF_ERROR(CheckQuotas(caller, "job.modify", fmt::format("job/{}", j.id), j.owner,
                                     j.team, {.device_hours = *device_hours - j.device_hours}));
    }
    KC_ASSIGN_OR_RETURN(JobRecord done, jobs_->Modify(j.id, std::move(name), device_hours,
                                                      internal::WallSeconds()));
    KC_RETURN_IF_ERROR(
        AuditNow(audit_, caller.user, "job.modify", fmt::format("job/{}", j.id), "ok", what));
    Fill(done, response);
    return OkStatus();
  });
}

grpc::Status JobServiceImpl::Pause(grpc::ServerContext* context, const kc::v1::PauseJobRequest* req,
                                   kc::v1::JobInfo* response) {
  return guard_->Serve(context, "kc.v1.JobService.Pause", [&](const Principal& caller) -> Status {
    KC_ASSIGN_OR_RETURN(JobRecord j, jobs_->Get(req->id()));
    KC_RETURN_IF_ERROR(Allowed(caller, Action::kJobPause, j));
    if (j.phase != JobPhase::kQueued && j.phase != JobPhase::kRunning) {
      return FailedPreconditionError(
          fmt::format("job {}: it is {}; only a queued or running job can be paused", j.id,
                      JobPhaseName(j.phase)));
    }
    const std::string reason = fmt::format("paused by {}{}", caller.user,
                                           req->reason().empty() ? "" : ": " + req->reason());
    KC_ASSIGN_OR_RETURN(JobRecord done, jobs_->Transition(j.id, JobPhase::kPaused, reason,
                                                          internal::WallSeconds()));
    KC_RETURN_IF_ERROR(
        AuditNow(audit_, caller.user, "job.pause", fmt::format("job/{}", j.id), "ok", reason));
    if (dispatcher_ != nullptr) dispatcher_->Wake();
    Fill(done, response);
    return OkStatus();
  });
}

grpc::Status JobServiceImpl::Resume(grpc::ServerContext* context,
                                    const kc::v1::ResumeJobRequest* req,
                                    kc::v1::JobInfo* response) {
  return guard_->Serve(context, "kc.v1.JobService.Resume", [&](const Principal& caller) -> Status {
    KC_ASSIGN_OR_RETURN(JobRecord j, jobs_->Get(req->id()));
    KC_RETURN_IF_ERROR(Allowed(caller, Action::kJobResume, j));
    if (j.phase != JobPhase::kPaused) {
      return FailedPreconditionError(fmt::format(
          "job {}: it is {}; only a paused job can be resumed", j.id, JobPhaseName(j.phase)));
    }
    const std::string reason = fmt::format("resumed by {}", caller.user);
    KC_ASSIGN_OR_RETURN(JobRecord done, jobs_->Transition(j.id, JobPhase::kQueued, reason,
                                                          internal::WallSeconds()));
    KC_RETURN_IF_ERROR(
        AuditNow(audit_, caller.user, "job.resume", fmt::format("job/{}", j.id), "ok", reason));
    if (dispatcher_ != nullptr) dispatcher_->Wake();
    Fill(done, response);
    return OkStatus();
  });
}

grpc::Status JobServiceImpl::Logs(grpc::ServerContext* context, const kc::v1::JobLogsRequest* req,
                                  kc::v1::JobLogsResponse* response) {
  return guard_->Serve(context, "kc.v1.JobService.Logs", [&](const Principal& caller) -> Status {
    if (req->offset() < 0) return InvalidArgumentError("offset: must not be negative");
    KC_ASSIGN_OR_RETURN(JobRecord j, jobs_->Get(req->id()));
    KC_RETURN_IF_ERROR(Allowed(caller, Action::kJobLogs, j));
    KC_ASSIGN_OR_RETURN(LogSlice slice, jobs_->ReadLog(j.id, req->offset(), 1 << 20));
    response->set_from_offset(slice.from);
    response->set_next_offset(slice.from + static_cast<int64_t>(slice.data.size()));
    response->set_complete(IsTerminal(j.phase) && slice.data.size() < (1u << 20));
    response->set_data(std::move(slice.data));
    return OkStatus();
  });
}

grpc::Status JobServiceImpl::Records(grpc::ServerContext* context,
                                     const kc::v1::JobRecordsRequest* req,
                                     kc::v1::JobRecordsResponse* response) {
  return guard_->Serve(context, "kc.v1.JobService.Records", [&](const Principal& caller) -> Status {
    KC_ASSIGN_OR_RETURN(JobRecord j, jobs_->Get(req->id()));
    KC_RETURN_IF_ERROR(Allowed(caller, Action::kJobLogs, j));  // the run's output, as Logs
    KC_ASSIGN_OR_RETURN(std::vector<std::string> reports, jobs_->Reports(j.id));
    for (const std::string& r : reports) {
      if (!response->add_reports()->ParseFromString(r)) response->mutable_reports()->RemoveLast();
    }
    return OkStatus();
  });
}

grpc::Status JobServiceImpl::Inspect(grpc::ServerContext* context,
                                     const kc::v1::InspectJobRequest* req,
                                     kc::v1::InspectJobResponse* response) {
  return guard_->Serve(context, "kc.v1.JobService.Inspect", [&](const Principal& caller) -> Status {
    KC_ASSIGN_OR_RETURN(JobRecord j, jobs_->Get(req->id()));
    KC_RETURN_IF_ERROR(Allowed(caller, Action::kJobLogs, j));  // what it tells, as Records
    if (dispatcher_ == nullptr) {
      return FailedPreconditionError(
          fmt::format("job {}: this kcd runs no jobs (no dispatcher): nothing to inspect", j.id));
    }
    KC_ASSIGN_OR_RETURN(*response, dispatcher_->Inspect(j.id));
    return OkStatus();
  });
}

}  // namespace kc::api
