#include "api/plan_service.h"

#include <fmt/format.h>

#include "api/internal/authorize.h"
#include "api/internal/digest.h"

namespace kc::api {
namespace {

void Fill(const PlanRecord& p, kc::v1::PlanInfo* out) {
  out->set_job(p.job);
  out->set_plan_yaml(p.plan_yaml);
  out->set_summary(p.summary);
  out->set_approval_required(p.approval_required);
  for (const std::string& r : p.reasons) out->add_reasons(r);
  out->set_decision(p.decision);
  out->set_decided_by(p.decided_by);
  out->set_note(p.note);
  out->set_decided_s(p.decided_s);
}

// The job's plan as the permission table sees it: the job's owner's and team's.
CheckResult CheckPlan(const Principal& caller, Action action, const JobRecord& j) {
  return Check(caller, action,
               {.kind = "plan", .id = std::to_string(j.id), .owner = j.owner, .team = j.team});
}

}  // namespace

grpc::Status PlanServiceImpl::Get(grpc::ServerContext* context, const kc::v1::GetPlanRequest* req,
                                  kc::v1::PlanInfo* response) {
  return guard_->Serve(context, "kc.v1.PlanService.Get", [&](const Principal& caller) -> Status {
    KC_ASSIGN_OR_RETURN(JobRecord j, jobs_->Get(req->job()));
    KC_RETURN_IF_ERROR(internal::Authorized(audit_, caller, Action::kPlanGet,
                                            fmt::format("plan/{}", j.id),
                                            CheckPlan(caller, Action::kPlanGet, j)));
    KC_ASSIGN_OR_RETURN(PlanRecord p, plans_->Get(j.id));
    Fill(p, response);
    return OkStatus();
  });
}

Status PlanServiceImpl::Decide(const Principal& caller, const kc::v1::DecidePlanRequest& req,
                               bool approve, kc::v1::PlanInfo* response) {
  if (!approve && req.note().empty()) return InvalidArgumentError("note: say why it is denied");
  KC_ASSIGN_OR_RETURN(JobRecord j, jobs_->Get(req.job()));
  const Action action = approve ? Action::kPlanApprove : Action::kPlanDeny;
  const CheckResult check = CheckPlan(caller, action, j);
  KC_RETURN_IF_ERROR(
      internal::Authorized(audit_, caller, action, fmt::format("plan/{}", j.id), check));
  if (j.phase != JobPhase::kApprovalRequired) {
    const std::string why =
        fmt::format("job {}: it is {}, not waiting for approval", j.id, JobPhaseName(j.phase));
    // Recorded as a second quota decision is: the attempt, and why it did nothing.
    AuditNow(audit_, caller.user, approve ? "plan.approve" : "plan.deny",
             fmt::format("plan/{}", j.id), "failed", why)
        .IgnoreError();
    return FailedPreconditionError(why);
  }
  const double now = internal::WallSeconds();
  KC_ASSIGN_OR_RETURN(PlanRecord p, plans_->Decide(j.id, approve, caller.user, req.note(), now));
  const std::string reason = fmt::format("plan {} by {}{}", p.decision, caller.user,
                                         req.note().empty() ? "" : ": " + req.note());
  KC_RETURN_IF_ERROR(
      jobs_->Transition(j.id, approve ? JobPhase::kQueued : JobPhase::kCancelled, reason, now)
          .status());
  KC_RETURN_IF_ERROR(internal::AuditDecision(audit_, caller, ActionName(action),
                                             fmt::format("plan/{}", j.id), check, reason));
  if (dispatcher_ != nullptr) dispatcher_->Wake();
  Fill(p, response);
  return OkStatus();
}

grpc::Status PlanServiceImpl::Approve(grpc::ServerContext* context,
                                      const kc::v1::DecidePlanRequest* req,
                                      kc::v1::PlanInfo* response) {
  return guard_->Serve(context, "kc.v1.PlanService.Approve", [&](const Principal& caller) {
    return Decide(caller, *req, true, response);
  });
}

grpc::Status PlanServiceImpl::Deny(grpc::ServerContext* context,
                                   const kc::v1::DecidePlanRequest* req,
                                   kc::v1::PlanInfo* response) {
  return guard_->Serve(context, "kc.v1.PlanService.Deny", [&](const Principal& caller) {
    return Decide(caller, *req, false, response);
  });
}

}  // namespace kc::api
