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

RpcGuard::RpcGuard(RpcGuardOptions options) : options_(options) {}

grpc::Status RpcGuard::Refuse(std::string_view who, std::string_view method, const Status& why) {
  AuditNow(options_.audit, who, method, "rpc", "denied", why.message()).IgnoreError();  // logged
  return ToGrpc(why);
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
  info.needs_token = md->service()->full_name() != kPublicService;
  if (!(info.calls_per_second > 0)) {
    return InternalError(fmt::format("rpc: method {} declares no rate limit", method));
  }
  methods_.emplace(std::string(method), info);
  return info;
}

bool RpcGuard::Allow(std::string_view method, const MethodInfo& info, const std::string& caller) {
  const std::string key = fmt::format("{}|{}", method, info.per_caller ? caller : "");
  auto it = buckets_.find(key);
  if (it == buckets_.end()) {
    it = buckets_
             .emplace(key, std::make_unique<comm::TokenBucket>(info.calls_per_second, info.burst,
                                                               options_.clock))
             .first;
  }
  return it->second->TryTake(1);
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
  Principal caller;
  std::string key = context->peer();
  if (info.needs_token) {
    const std::string token = BearerToken(*context);
    if (token.empty()) {
      return Refuse(
          key, method,
          UnauthenticatedError(fmt::format("{}: no bearer token (log in: kc login)", method)));
    }
    Result<std::string> user = options_.tokens->Authenticate(token, WallSeconds());
    if (!user.ok()) return Refuse(key, method, user.status());
    std::optional<Principal> p = options_.roles->PrincipalFor(*user);
    if (!p) {
      return Refuse(*user, method,
                    UnauthenticatedError(fmt::format(
                        "{}: user {} is not in the cluster's roles file", method, *user)));
    }
    caller = std::move(*p);
    key = caller.user;
  }
  Status over;
  {
    MutexLock lock(&mu_);
    if (!Allow(method, info, key)) {
      over = ResourceExhaustedError(fmt::format(
          "{}: over the rate limit of {} calls/s{} (burst {}); retry with backoff", method,
          info.calls_per_second, info.per_caller ? " per caller" : "", info.burst));
    }
  }
  if (!over.ok()) return Refuse(key, method, over);
  const Status s = handler(caller);
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
