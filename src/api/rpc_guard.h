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
  // Refusals (no or a bad token, over a rate limit) written to the audit log per caller (the
  // user, or the peer's address without its port for a call without a valid token): at most
  // this many a second, in bursts of refusal_audit_burst; the rest are counted, and the next
  // record written says how many were left out.
  double refusal_audits_per_second = 1;
  double refusal_audit_burst = 20;
  // Calls one caller may have in progress at once; more are RESOURCE_EXHAUSTED.
  int max_calls_in_flight_per_caller = 64;
  // Callers with buckets of their own (rate limits, refusal audits); past it, callers not yet
  // seen share one bucket, so a flood of new addresses cannot grow kcd's memory.
  size_t max_callers = 4096;
};

// Safe for concurrent use: gRPC calls Serve from many threads.
class RpcGuard {
 public:
  explicit RpcGuard(RpcGuardOptions options);

  using Handler = std::function<Status(const Principal& caller)>;

  // Runs `handler` for the call of `method` ("kc.v1.PermissionService.Check") in `context`:
  // UNAUTHENTICATED without a valid "authorization: Bearer TOKEN" (the methods of kc.v1.Health
  // need none) or for a user the roles file does not name; PERMISSION_DENIED for a token whose
  // kind does not reach the method (a run's token: PermissionService.Check alone; an agent's:
  // AgentService alone; a user's: not AgentService); RESOURCE_EXHAUSTED over the method's
  // annotated limit (its own, else its service's default) or over the caller's calls in
  // flight; otherwise the handler's status, INTERNAL if the method does not declare that code.
  // Refusals are written to the audit log, as many as options.refusal_audits_per_second
  // allows per caller.
  grpc::Status Serve(grpc::ServerContext* context, std::string_view method, const Handler& handler);

 private:
  struct MethodInfo {
    std::vector<ErrorCode> errors;
    double calls_per_second = 0;
    double burst = 0;
    bool per_caller = true;
    bool needs_token = true;
    std::string service;  // full name, "kc.v1.JobService"
  };
  // Who is calling: the principal, or the peer address for a call without a valid token.
  struct Caller {
    Principal principal;
    std::string key;  // the user, "agent/HOST", or "peer ADDRESS"
  };
  // The method's annotations, read once from the descriptor pool. Its limits are the IDL's,
  // not permissions, so keeping them is not caching a right.
  Result<MethodInfo> Info(std::string_view method) KC_REQUIRES(mu_);
  // The caller of a call that needs a token, or why it may not make it.
  Result<Caller> Authenticate(const grpc::ServerContext& context, std::string_view method,
                              const MethodInfo& info);
  // The bucket for `key` in `buckets` (made with `rate` and `burst`); past max_callers keys,
  // one shared by every key not yet seen.
  comm::TokenBucket& Bucket(std::map<std::string, std::unique_ptr<comm::TokenBucket>>* buckets,
                            const std::string& key, double rate, double burst) KC_REQUIRES(mu_);
  // Records a refusal of `caller_key` (if its refusal audits allow), returns it as the call's
  // status.
  grpc::Status Refuse(const std::string& caller_key, std::string_view who, std::string_view method,
                      const Status& why);

  RpcGuardOptions options_;
  Mutex mu_;
  std::map<std::string, MethodInfo, std::less<>> methods_ KC_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<comm::TokenBucket>> buckets_ KC_GUARDED_BY(mu_);
  // Per caller key: its refusal audits, those left out since the last one written, and its
  // calls in progress.
  std::map<std::string, std::unique_ptr<comm::TokenBucket>> refusal_buckets_ KC_GUARDED_BY(mu_);
  std::map<std::string, int64_t> refusals_left_out_ KC_GUARDED_BY(mu_);
  std::map<std::string, int> in_flight_ KC_GUARDED_BY(mu_);
};

// The address of a gRPC peer ("ipv4:10.0.0.7:51234", "ipv6:[::1]:8080") without its port:
// every connection from one host is one caller.
std::string PeerAddress(std::string_view peer);

// Appends a record to `audit` (if not null) for a decision made now; an audit write that
// fails is logged, never hidden: the caller decides whether to go on.
Status AuditNow(AuditLog* audit, std::string_view principal, std::string_view action,
                std::string_view resource, std::string_view outcome, std::string_view reason);

// The bearer token of a call's metadata, or "".
std::string BearerToken(const grpc::ServerContext& context);

}  // namespace kc::api
