#include "api/rpc_guard.h"

#include <fmt/format.h>
#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "api/internal/digest.h"
#include "base/log.h"
#include "kc/v1/options.pb.h"

namespace kc::api {
namespace {

using internal::WallSeconds;

constexpr std::string_view kPublicService = "kc.v1.Health";

grpc::Status ToGrpc(const Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace

std::string BearerToken(const grpc::ServerContext& context) {
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return "";
  const std::string_view v(it->second.data(), it->second.size());
  constexpr std::string_view kBearer = "Bearer ";
  return v.starts_with(kBearer) ? std::string(v.substr(kBearer.size())) : "";
}

Status AuditNow(AuditLog* audit, std::string_view principal, std::string_view action,
                std::string_view resource, std::string_view outcome, std::string_view reason) {
  if (audit == nullptr) return OkStatus();
  Result<AuditRecord> r = audit->Append({.seq = 0,
                                         .time_s = WallSeconds(),
                                         .principal = std::string(principal),
                                         .action = std::string(action),
                                         .resource = std::string(resource),
                                         .outcome = std::string(outcome),
                                         .reason = std::string(reason),
                                         .prev_hash = "",
                                         .hash = ""});
  if (!r.ok()) KC_LOG(ERROR) << "audit: " << r.status().message();
  return r.status();
}

std::string PeerAddress(std::string_view peer) {
  const size_t colon = peer.rfind(':');
  const size_t scheme = peer.find(':');
  // "ipv4:HOST:PORT" and "ipv6:[HOST]:PORT" lose ":PORT"; anything else (a unix socket) stays.
  if (colon == std::string_view::npos || colon == scheme) return std::string(peer);
  const std::string_view port = peer.substr(colon + 1);
  const bool numeric = !port.empty() && std::all_of(port.begin(), port.end(),
                                                    [](char c) { return c >= '0' && c <= '9'; });
  return std::string(numeric ? peer.substr(0, colon) : peer);
}

RpcGuard::RpcGuard(RpcGuardOptions options) : options_(options) {}

comm::TokenBucket& RpcGuard::Bucket(
    std::map<std::string, std::unique_ptr<comm::TokenBucket>>* buckets, const std::string& key,
    double rate, double burst) {
  auto it = buckets->find(key);
  if (it != buckets->end()) return *it->second;
  if (buckets->size() >= options_.max_callers) {
    // Forget the callers that have been quiet long enough to be back to a full bucket; if
    // none has, new callers share one bucket.
    for (auto b = buckets->begin(); b != buckets->end();) {
      b = b->second->tokens() >= b->second->burst() ? buckets->erase(b) : std::next(b);
    }
    if (buckets->size() >= options_.max_callers) {
      const std::string shared = "*";
      it = buckets->find(shared);
      if (it != buckets->end()) return *it->second;
      return *buckets
                  ->emplace(shared,
                            std::make_unique<comm::TokenBucket>(rate, burst, options_.clock))
                  .first->second;
    }
  }
  return *buckets->emplace(key, std::make_unique<comm::TokenBucket>(rate, burst, options_.clock))
              .first->second;
}

grpc::Status RpcGuard::Refuse(const std::string& caller_key, std::string_view who,
                              std::string_view method, const Status& why) {
  int64_t left_out = 0;
  {
    MutexLock lock(&mu_);
    if (!Bucket(&refusal_buckets_, caller_key, options_.refusal_audits_per_second,
                options_.refusal_audit_burst)
             .TryTake(1)) {
      ++refusals_left_out_[caller_key];
      return ToGrpc(why);
    }
    if (auto it = refusals_left_out_.find(caller_key); it != refusals_left_out_.end()) {
      left_out = it->second;
      refusals_left_out_.erase(it);
    }
  }
  const std::string reason =
      left_out == 0 ? std::string(why.message())
                    : fmt::format(
                          "{} ({} more refusals of {} since the last recorded were not "
                          "recorded: over {} a second)",
                          why.message(), left_out, caller_key, options_.refusal_audits_per_second);
  AuditNow(options_.audit, who, method, "rpc", "denied", reason).IgnoreError();  // logged
  return ToGrpc(why);
}

Result<RpcGuard::Caller> RpcGuard::Authenticate(const grpc::ServerContext& context,
                                                std::string_view method, const MethodInfo& info) {
  const std::string token = BearerToken(context);
  if (token.empty()) {
    return UnauthenticatedError(fmt::format("{}: no bearer token (log in: kc login)", method));
  }
  KC_ASSIGN_OR_RETURN(TokenIdentity id, options_.tokens->Authenticate(token, WallSeconds()));
  constexpr std::string_view kAgentService = "kc.v1.AgentService";
  constexpr std::string_view kExecutionCheck = "kc.v1.PermissionService.Check";
  if (id.kind == TokenKind::kAgent) {
    Caller agent{.principal = {.user = "agent/" + id.subject, .agent_host = id.subject}};
    agent.key = agent.principal.user;
    if (info.service != kAgentService) {
      return PermissionDeniedError(
          fmt::format("{}: {} is an agent's identity, which may call the agent service only",
                      method, agent.key));
    }
    return agent;
  }
  std::optional<Principal> p = options_.roles->PrincipalFor(id.subject);
  if (!p) {
    return UnauthenticatedError(
        fmt::format("{}: user {} is not in the cluster's roles file", method, id.subject));
  }
  if (id.kind == TokenKind::kRun && method != kExecutionCheck) {
    return PermissionDeniedError(fmt::format(
        "{}: a run's token (issued by kcd to {} for a job's execution-time checks) may call "
        "{} only",
        method, id.subject, kExecutionCheck));
  }
  if (info.service == kAgentService) {
    return PermissionDeniedError(
        fmt::format("{}: {} is a user; the agent service takes an agent's identity (kc token issue "
                    "--agent HOST)",
                    method, id.subject));
  }
  return Caller{.principal = *std::move(p), .key = id.subject};
}

Result<RpcGuard::MethodInfo> RpcGuard::Info(std::string_view method) {
  if (auto it = methods_.find(method); it != methods_.end()) return it->second;
  const google::protobuf::MethodDescriptor* md =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(std::string(method));
  if (md == nullptr) {
    return InternalError(fmt::format("rpc: method {} is not in the compiled IDL", method));
  }
  MethodInfo info;
  const google::protobuf::MethodOptions& mo = md->options();
  for (int i = 0; i < mo.ExtensionSize(kc::v1::errors); ++i) {
    info.errors.push_back(static_cast<ErrorCode>(mo.GetExtension(kc::v1::errors, i)));
  }
  const kc::v1::RateLimit limit =
      mo.HasExtension(kc::v1::rate_limit)
          ? mo.GetExtension(kc::v1::rate_limit)
          : md->service()->options().GetExtension(kc::v1::default_rate_limit);
  info.calls_per_second = limit.calls_per_second();
  info.burst =
      limit.burst() > 0 ? limit.burst() : std::max(1.0, std::ceil(limit.calls_per_second()));
  info.per_caller = limit.scope() == kc::v1::RateLimit::PER_CALLER;
  info.service = md->service()->full_name();
  info.needs_token = info.service != kPublicService;
  if (!(info.calls_per_second > 0)) {
    return InternalError(fmt::format("rpc: method {} declares no rate limit", method));
  }
  methods_.emplace(std::string(method), info);
  return info;
}

grpc::Status RpcGuard::Serve(grpc::ServerContext* context, std::string_view method,
                             const Handler& handler) {
  MethodInfo info;
  {
    MutexLock lock(&mu_);
    Result<MethodInfo> i = Info(method);
    if (!i.ok()) {
      KC_LOG(ERROR) << i.status().message();
      return ToGrpc(i.status());
    }
    info = *i;
  }
  Caller caller{.key = "peer " + PeerAddress(context->peer())};
  if (info.needs_token) {
    Result<Caller> c = Authenticate(*context, method, info);
    // Refused: the record names the peer (the message, a principal it knows of).
    if (!c.ok()) return Refuse(caller.key, context->peer(), method, c.status());
    caller = *std::move(c);
  }
  Status over;
  {
    MutexLock lock(&mu_);
    const std::string bucket = fmt::format("{}|{}", method, info.per_caller ? caller.key : "");
    if (!Bucket(&buckets_, bucket, info.calls_per_second, info.burst).TryTake(1)) {
      over = ResourceExhaustedError(fmt::format(
          "{}: over the rate limit of {} calls/s{} (burst {}); retry with backoff", method,
          info.calls_per_second, info.per_caller ? " per caller" : "", info.burst));
    } else if (in_flight_[caller.key] >= options_.max_calls_in_flight_per_caller) {
      over = ResourceExhaustedError(
          fmt::format("{}: {} has {} calls in progress, the most one caller may; retry when "
                      "one has ended",
                      method, caller.key, options_.max_calls_in_flight_per_caller));
    } else {
      ++in_flight_[caller.key];
    }
  }
  if (!over.ok()) {
    return Refuse(caller.key,
                  caller.principal.user.empty() ? context->peer() : caller.principal.user, method,
                  over);
  }
  const Status s = [&] {
    const Status result = handler(caller.principal);
    MutexLock lock(&mu_);
    if (auto it = in_flight_.find(caller.key); it != in_flight_.end() && --it->second <= 0) {
      in_flight_.erase(it);
    }
    return result;
  }();
  if (s.ok()) return grpc::Status::OK;
  const ErrorCode code = s.code();
  const bool declared =
      std::find(info.errors.begin(), info.errors.end(), code) != info.errors.end();
  const bool transport = code == ErrorCode::kCancelled || code == ErrorCode::kDeadlineExceeded ||
                         code == ErrorCode::kUnavailable;
  if (!declared && !transport) {
    KC_LOG(ERROR) << "rpc: " << method << " returned an undeclared error: " << s.message();
    return ToGrpc(InternalError(fmt::format("{}: internal error", method)));
  }
  return ToGrpc(s);
}

}  // namespace kc::api
