#include "api/job_service.h"

#include <fmt/format.h>

#include <algorithm>

#include "api/internal/digest.h"
#include "api/quota_usage.h"

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
}

Resource JobResource(const JobRecord& j) {
  return {.kind = "job", .id = std::to_string(j.id), .owner = j.owner, .team = j.team};
}

}  // namespace

Status JobServiceImpl::Allowed(const Principal& caller, Action action, const JobRecord& j) {
  const CheckResult r = Check(caller, action, JobResource(j));
  if (r.allowed) return OkStatus();
  AuditNow(audit_, caller.user, ActionName(action), fmt::format("job/{}", j.id), "denied", r.reason)
      .IgnoreError();  // logged by AuditNow; the denial stands
  return PermissionDeniedError(r.reason);
}

grpc::Status JobServiceImpl::Submit(grpc::ServerContext* context,
                                    const kc::v1::SubmitJobRequest* req,
                                    kc::v1::JobInfo* response) {
  return guard_->Serve(context, "kc.v1.JobService.Submit", [&](const Principal& caller) -> Status {
    if (req->name().empty()) return InvalidArgumentError("name: must not be empty");
    if (req->devices() < 0 || req->expected_hours() < 0 || req->storage_gb() < 0) {
      return InvalidArgumentError("devices, expected_hours, storage_gb: must not be negative");
    }
    JobRecord j{.id = 0,
                .name = req->name(),
                .owner = caller.user,
                .team = req->team(),
                .spec = req->spec(),
                .devices = req->devices(),
                .device_hours = req->expected_hours() * static_cast<double>(req->devices()),
                .storage_gb = req->storage_gb(),
                .phase = JobPhase::kPending,
                .submitted_s = 0,
                .updated_s = 0,
                .reason = "submitted"};
    if (j.team.empty() && !caller.teams.empty()) j.team = caller.teams.front();
    if (!j.team.empty() && caller.role != Role::kSystemAdmin &&
        std::find(caller.teams.begin(), caller.teams.end(), j.team) == caller.teams.end()) {
      const std::string why = fmt::format("{} is not in team {}", caller.user, j.team);
      AuditNow(audit_, caller.user, "job.submit", "job/new", "denied", why).IgnoreError();
      return PermissionDeniedError(why);
    }
    KC_RETURN_IF_ERROR(Allowed(caller, Action::kJobSubmit, j));
    // Quotas: the submitter's and the team's, against their jobs that have not ended.
    KC_ASSIGN_OR_RETURN(std::vector<JobRecord> all, jobs_->List({.limit = 1 << 30}));
    const QuotaAsk ask{
        .devices = j.devices, .device_hours = j.device_hours, .storage_gb = j.storage_gb};
    KC_ASSIGN_OR_RETURN(Quota user_quota, quotas_->Get(QuotaSubject::kUser, j.owner));
    Status over =
        CheckQuota("user " + j.owner, user_quota, UsageOf(all, QuotaSubject::kUser, j.owner), ask);
    if (over.ok() && !j.team.empty()) {
      KC_ASSIGN_OR_RETURN(Quota team_quota, quotas_->Get(QuotaSubject::kTeam, j.team));
      over =
          CheckQuota("team " + j.team, team_quota, UsageOf(all, QuotaSubject::kTeam, j.team), ask);
    }
    if (!over.ok()) {
      AuditNow(audit_, caller.user, "job.submit", "job/new", "denied", over.message())
          .IgnoreError();
      return over;
    }
    KC_ASSIGN_OR_RETURN(JobRecord stored, jobs_->Submit(std::move(j), internal::WallSeconds()));
    KC_RETURN_IF_ERROR(AuditNow(audit_, caller.user, "job.submit", fmt::format("job/{}", stored.id),
                                "ok", stored.name));
    Fill(stored, response);
    return OkStatus();
  });
}

grpc::Status JobServiceImpl::Get(grpc::ServerContext* context, const kc::v1::GetJobRequest* req,
                                 kc::v1::JobInfo* response) {
  return guard_->Serve(context, "kc.v1.JobService.Get", [&](const Principal& caller) -> Status {
    KC_ASSIGN_OR_RETURN(JobRecord j, jobs_->Get(req->id()));
    KC_RETURN_IF_ERROR(Allowed(caller, Action::kJobGet, j));
    Fill(j, response);
    return OkStatus();
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
    Fill(done, response);
    return OkStatus();
  });
}

}  // namespace kc::api
