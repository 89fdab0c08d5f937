#include "api/audit_service.h"

#include <fmt/format.h>

#include "api/internal/authorize.h"

namespace kc::api {
namespace {

constexpr int kDefaultLimit = 100;
constexpr int kPageSize = 1000;  // records read from the log per step while filtering

}  // namespace

grpc::Status AuditServiceImpl::Query(grpc::ServerContext* context,
                                     const kc::v1::AuditQueryRequest* req,
                                     kc::v1::AuditQueryResponse* response) {
  return guard_->Serve(context, "kc.v1.AuditService.Query", [&](const Principal& caller) -> Status {
    if (req->limit() < 0) return InvalidArgumentError("limit: must not be negative");
    if (req->since_s() < 0) return InvalidArgumentError("since_s: must not be negative");
    KC_RETURN_IF_ERROR(internal::Authorized(audit_, caller, Action::kAuditQuery, "audit",
                                            Check(caller, Action::kAuditQuery, {.kind = "audit"})));
    const int limit = req->limit() == 0 ? kDefaultLimit : req->limit();
    AuditQuery q{.principal = req->principal(),
                 .action = req->action(),
                 .resource_prefix = req->resource_prefix(),
                 .since_s = req->since_s(),
                 .after_seq = req->after_seq(),
                 .limit = kPageSize};
    // Page through the matches, keeping those the caller may read, until `limit` are kept.
    while (response->records_size() < limit) {
      KC_ASSIGN_OR_RETURN(std::vector<AuditRecord> page, audit_->Query(q));
      for (const AuditRecord& r : page) {
        const Resource res{.kind = "audit", .id = std::to_string(r.seq)};
        if (!internal::CheckUserResource(*roles_, caller, Action::kAuditQuery, res, r.principal)
                 .allowed) {
          continue;
        }
        kc::v1::AuditRecordInfo* out = response->add_records();
        out->set_seq(r.seq);
        out->set_time_s(r.time_s);
        out->set_principal(r.principal);
        out->set_action(r.action);
        out->set_resource(r.resource);
        out->set_outcome(r.outcome);
        out->set_reason(r.reason);
        out->set_hash(r.hash);
        if (response->records_size() == limit) break;
      }
      if (static_cast<int>(page.size()) < kPageSize) break;
      q.after_seq = page.back().seq;
    }
    return OkStatus();
  });
}

grpc::Status AuditServiceImpl::Verify(grpc::ServerContext* context,
                                      const kc::v1::AuditVerifyRequest* req,
                                      kc::v1::AuditVerifyResponse* response) {
  return guard_->Serve(
      context, "kc.v1.AuditService.Verify", [&](const Principal& caller) -> Status {
        KC_RETURN_IF_ERROR(
            internal::Authorized(audit_, caller, Action::kAuditVerify, "audit",
                                 Check(caller, Action::kAuditVerify, {.kind = "audit"})));
        KC_ASSIGN_OR_RETURN(AuditVerifyResult v, audit_->Verify(req->expected_head()));
        response->set_ok(v.ok);
        response->set_records(v.records);
        response->set_first_bad_seq(v.first_bad_seq);
        response->set_problem(v.problem);
        response->set_head(v.head);
        response->set_head_seq(v.head_seq);
        return OkStatus();
      });
}

}  // namespace kc::api
