#include "api/quota_service.h"

#include <fmt/format.h>

#include <algorithm>

#include "api/internal/authorize.h"
#include "api/quota_usage.h"

namespace kc::api {
namespace {

using internal::Authorized;

// The subject and name a request names; "" names the caller.
// The quota's subject, which the roles file must name. kInvalidArgument otherwise.
Result<std::pair<QuotaSubject, std::string>> Subject(const RolesConfig& roles,
                                                     const Principal& caller,
                                                     const std::string& subject,
                                                     const std::string& name) {
  if (subject == "user") {
    const std::string user = name.empty() ? caller.user : name;
    if (!roles.PrincipalFor(user)) {
      return InvalidArgumentError(fmt::format("name: no user \"{}\" in the roles file", user));
    }
    return std::pair{QuotaSubject::kUser, user};
  }
  if (subject == "team") {
    if (name.empty()) return InvalidArgumentError("name: a team must be named");
    const bool known = std::any_of(roles.teams.begin(), roles.teams.end(),
                                   [&](const TeamSpec& t) { return t.name == name; });
    if (!known) {
      return InvalidArgumentError(fmt::format("name: no team \"{}\" in the roles file", name));
    }
    return std::pair{QuotaSubject::kTeam, name};
  }
  return InvalidArgumentError(
      fmt::format("subject: unknown \"{}\" (want \"user\" or \"team\")", subject));
}

std::string QuotaPath(QuotaSubject subject, std::string_view name) {
  return fmt::format("quota/{}/{}", QuotaSubjectName(subject), name);
}

Quota FromProto(const kc::v1::QuotaLimits& l) {
  Quota q;
  if (l.has_max_devices()) q.max_devices = l.max_devices();
  if (l.has_max_device_hours()) q.max_device_hours = l.max_device_hours();
  if (l.has_max_storage_gb()) q.max_storage_gb = l.max_storage_gb();
  return q;
}

void ToProto(const Quota& q, kc::v1::QuotaLimits* out) {
  if (q.max_devices) out->set_max_devices(*q.max_devices);
  if (q.max_device_hours) out->set_max_device_hours(*q.max_device_hours);
  if (q.max_storage_gb) out->set_max_storage_gb(*q.max_storage_gb);
}

void Fill(const QuotaRequest& r, kc::v1::QuotaRequestInfo* out) {
  out->set_id(r.id);
  out->set_subject(std::string(QuotaSubjectName(r.subject)));
  out->set_name(r.name);
  out->set_requester(r.requester);
  ToProto(r.wanted, out->mutable_wanted());
  out->set_reason(r.reason);
  out->set_state(std::string(RequestStateName(r.state)));
  out->set_decided_by(r.decided_by);
  out->set_decision_reason(r.decision_reason);
}

}  // namespace

CheckResult QuotaServiceImpl::CheckQuotaAccess(const Principal& caller, Action action,
                                               QuotaSubject subject,
                                               const std::string& name) const {
  const Resource r{.kind = "quota", .id = fmt::format("{}/{}", QuotaSubjectName(subject), name)};
  return subject == QuotaSubject::kUser
             ? internal::CheckUserResource(*roles_, caller, action, r, name)
             : internal::CheckTeamResource(caller, action, r, name);
}

CheckResult QuotaServiceImpl::CheckDecision(const Principal& caller, Action action,
                                            const QuotaRequest& request) const {
  std::vector<std::string> teams = {request.name};
  if (request.subject == QuotaSubject::kUser) {
    const std::optional<Principal> user = roles_->PrincipalFor(request.name);
    teams = user ? user->teams : std::vector<std::string>{};
  }
  const std::string id = std::to_string(request.id);
  // Both the one who asked and the user whose quota it is count as its owners: neither
  // decides it.
  CheckResult by_requester = internal::CheckInTeams(
      caller, action, {.kind = "quota-request", .id = id, .owner = request.requester}, teams);
  if (!by_requester.allowed || request.subject != QuotaSubject::kUser) return by_requester;
  CheckResult by_subject = internal::CheckInTeams(
      caller, action, {.kind = "quota-request", .id = id, .owner = request.name}, teams);
  by_subject.override_own |= by_requester.override_own;
  return by_subject;
}

grpc::Status QuotaServiceImpl::Get(grpc::ServerContext* context, const kc::v1::GetQuotaRequest* req,
                                   kc::v1::QuotaInfo* response) {
  return guard_->Serve(context, "kc.v1.QuotaService.Get", [&](const Principal& caller) -> Status {
    KC_ASSIGN_OR_RETURN(auto subject, Subject(*roles_, caller, req->subject(), req->name()));
    const auto& [kind, name] = subject;
    KC_RETURN_IF_ERROR(Authorized(audit_, caller, Action::kQuotaGet, QuotaPath(kind, name),
                                  CheckQuotaAccess(caller, Action::kQuotaGet, kind, name)));
    KC_ASSIGN_OR_RETURN(Quota quota, quotas_->Get(kind, name));
    KC_ASSIGN_OR_RETURN(std::vector<JobRecord> all, jobs_->List({.limit = 1 << 30}));
    const QuotaUsage usage = UsageOf(all, kind, name);
    response->set_subject(std::string(QuotaSubjectName(kind)));
    response->set_name(name);
    ToProto(quota, response->mutable_limits());
    response->mutable_usage()->set_devices(usage.devices);
    response->mutable_usage()->set_device_hours(usage.device_hours);
    response->mutable_usage()->set_storage_gb(usage.storage_gb);
    return OkStatus();
  });
}

grpc::Status QuotaServiceImpl::RequestIncrease(grpc::ServerContext* context,
                                               const kc::v1::QuotaIncreaseRequest* req,
                                               kc::v1::QuotaRequestInfo* response) {
  return guard_->Serve(
      context, "kc.v1.QuotaService.RequestIncrease", [&](const Principal& caller) -> Status {
        KC_ASSIGN_OR_RETURN(auto subject, Subject(*roles_, caller, req->subject(), req->name()));
        const auto& [kind, name] = subject;
        if (req->reason().empty()) return InvalidArgumentError("reason: must not be empty");
        KC_RETURN_IF_ERROR(Authorized(audit_, caller, Action::kQuotaRequest, QuotaPath(kind, name),
                                      CheckQuotaAccess(caller, Action::kQuotaRequest, kind, name)));
        KC_ASSIGN_OR_RETURN(QuotaRequest filed,
                            quotas_->Request({.subject = kind,
                                              .name = name,
                                              .requester = caller.user,
                                              .wanted = FromProto(req->wanted()),
                                              .reason = req->reason()}));
        KC_RETURN_IF_ERROR(AuditNow(audit_, caller.user, "quota.request",
                                    fmt::format("quota-request/{}", filed.id), "ok",
                                    fmt::format("{}: {}", QuotaPath(kind, name), filed.reason)));
        Fill(filed, response);
        return OkStatus();
      });
}

grpc::Status QuotaServiceImpl::ListRequests(grpc::ServerContext* context,
                                            const kc::v1::ListQuotaRequestsRequest* req,
                                            kc::v1::ListQuotaRequestsResponse* response) {
  return guard_->Serve(
      context, "kc.v1.QuotaService.ListRequests", [&](const Principal& caller) -> Status {
        KC_RETURN_IF_ERROR(Authorized(audit_, caller, Action::kQuotaApprove, "quota-request",
                                      Check(caller, Action::kQuotaApprove, {.kind = "quota"})));
        std::optional<RequestState> state;
        if (!req->all()) state = RequestState::kPending;
        KC_ASSIGN_OR_RETURN(std::vector<QuotaRequest> all, quotas_->Requests(state));
        for (const QuotaRequest& r : all) {
          if (CheckDecision(caller, Action::kQuotaApprove, r).allowed) {
            Fill(r, response->add_requests());
          }
        }
        return OkStatus();
      });
}

Status QuotaServiceImpl::Decide(const Principal& caller, const kc::v1::DecideQuotaRequest& req,
                                bool approve, kc::v1::QuotaRequestInfo* response) {
  const Action action = approve ? Action::kQuotaApprove : Action::kQuotaDeny;
  KC_ASSIGN_OR_RETURN(std::vector<QuotaRequest> all, quotas_->Requests(std::nullopt));
  const auto it =
      std::find_if(all.begin(), all.end(), [&](const QuotaRequest& r) { return r.id == req.id(); });
  if (it == all.end())
    return NotFoundError(fmt::format("quota request {}: no such request", req.id()));
  const std::string path = fmt::format("quota-request/{}", req.id());
  const CheckResult check = CheckDecision(caller, action, *it);
  KC_RETURN_IF_ERROR(Authorized(audit_, caller, action, path, check));
  Result<QuotaRequest> result = quotas_->Decide(req.id(), approve, caller.user, req.reason());
  if (!result.ok()) {
    return internal::AuditedFailure(audit_, caller, ActionName(action), path, result.status());
  }
  const QuotaRequest& decided = *result;
  KC_RETURN_IF_ERROR(
      internal::AuditDecision(audit_, caller, ActionName(action), path, check,
                              fmt::format("{} {}{}", approve ? "approved" : "denied",
                                          QuotaPath(decided.subject, decided.name),
                                          req.reason().empty() ? "" : ": " + req.reason())));
  Fill(decided, response);
  return OkStatus();
}

grpc::Status QuotaServiceImpl::Approve(grpc::ServerContext* context,
                                       const kc::v1::DecideQuotaRequest* req,
                                       kc::v1::QuotaRequestInfo* response) {
  return guard_->Serve(context, "kc.v1.QuotaService.Approve", [&](const Principal& caller) {
    return Decide(caller, *req, /*approve=*/true, response);
  });
}

grpc::Status QuotaServiceImpl::Deny(grpc::ServerContext* context,
                                    const kc::v1::DecideQuotaRequest* req,
                                    kc::v1::QuotaRequestInfo* response) {
  return guard_->Serve(context, "kc.v1.QuotaService.Deny", [&](const Principal& caller) {
    return Decide(caller, *req, /*approve=*/false, response);
  });
}

}  // namespace kc::api
