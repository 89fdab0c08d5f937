// The generic server layer every Kuangchao RPC handler runs through (ARCHITECTURE.md rule 4):
// it reads the method's annotations from the compiled IDL (its error codes and rate limit),
// authenticates the caller's bearer token, enforces the rate limit, runs the handler, and
// turns an error the method did not declare into INTERNAL. No handler checks a token, counts
// calls or knows its limit. Design: docs/design/idl.md ("Enforcement").
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/audit_log.h"
#include "api/permissions.h"
#include "api/roles_file.h"
#include "api/tokens.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "base/status.h"
#include "comm/rate_limit.h"

namespace kc::api {

struct RpcGuardOptions {
  TokenStore* tokens = nullptr;        // not owned; outlives the guard
  const RolesConfig* roles = nullptr;  // not owned; outlives the guard (fixed while kcd runs)
  Clock* clock = Clock::Real();        // for the rate limits; not owned
  AuditLog* audit = nullptr;           // not owned; outlives the guard; null: no audit
};

// Safe for concurrent use: gRPC calls Serve from many threads.
class RpcGuard {
 public:
  explicit RpcGuard(RpcGuardOptions options);

  using Handler = std::function<Status(const Principal& caller)>;

  // Runs `handler` for the call of `method` ("kc.v1.PermissionService.Check") in `context`:
  // UNAUTHENTICATED without a valid "authorization: Bearer TOKEN" (the methods of kc.v1.Health
  // need none) or for a user the roles file does not name; RESOURCE_EXHAUSTED over the
  // method's annotated limit (its own, else its service's default); otherwise the handler's
  // status, INTERNAL if the method does not declare that code. Refusals (unauthenticated,
  // over the limit) are written to the audit log.
  grpc::Status Serve(grpc::ServerContext* context, std::string_view method, const Handler& handler);

 private:
  struct MethodInfo {
    std::vector<ErrorCode> errors;
    double calls_per_second = 0;
    double burst = 0;
    bool per_caller = true;
    bool needs_token = true;
  };
  // The method's annotations, read once from the descriptor pool. Its limits are the IDL's,
  // not permissions, so keeping them is not caching a right.
  Result<MethodInfo> Info(std::string_view method) KC_REQUIRES(mu_);
  bool Allow(std::string_view method, const MethodInfo& info, const std::string& caller)
      KC_REQUIRES(mu_);
  // Records a refusal; returns it as the call's status.
  grpc::Status Refuse(std::string_view who, std::string_view method, const Status& why);

  RpcGuardOptions options_;
  Mutex mu_;
  std::map<std::string, MethodInfo, std::less<>> methods_ KC_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<comm::TokenBucket>> buckets_ KC_GUARDED_BY(mu_);
};

// Appends a record to `audit` (if not null) for a decision made now; an audit write that
// fails is logged, never hidden: the caller decides whether to go on.
Status AuditNow(AuditLog* audit, std::string_view principal, std::string_view action,
                std::string_view resource, std::string_view outcome, std::string_view reason);

// The bearer token of a call's metadata, or "".
std::string BearerToken(const grpc::ServerContext& context);

}  // namespace kc::api
