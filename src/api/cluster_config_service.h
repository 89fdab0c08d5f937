// The services over a cluster's configuration files (proto/kc/v1/topology.proto and
// pools.proto): DIR/topology.yaml, the inventory, and DIR/pools.yaml, the pools laid over it.
// Everyone may read them; a system admin replaces either, once it is validated against the
// other; replacements are durable and audited. kcd's scheduler reads both when kcd starts.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "api/audit_log.h"
#include "api/rpc_guard.h"
#include "base/mutex.h"
#include "kc/v1/pools.grpc.pb.h"
#include "kc/v1/topology.grpc.pb.h"

namespace kc::api {

// The cluster directory whose files the services read and replace. Safe for concurrent use:
// replacing a file (validating it against the other, then writing it) holds `mu`, so two
// replacements never validate against each other's old file.
struct ClusterDir {
  explicit ClusterDir(std::string dir) : path(std::move(dir)) {}
  const std::string path;
  Mutex mu;
};

// The note a replacement returns: when it takes effect.
inline constexpr char kEffectiveNow[] =
    "saved; kcd's scheduler applies it at its next pass (within seconds): running jobs keep "
    "their devices until they end, and one that no longer fits is flagged in its history";

// Safe for concurrent use.
class TopologyServiceImpl final : public kc::v1::TopologyService::Service {
 public:
  // Not owned; all outlive the service. `audit` may be null.
  TopologyServiceImpl(RpcGuard* guard, ClusterDir* dir, AuditLog* audit)
      : guard_(guard), dir_(dir), audit_(audit) {}

  grpc::Status Get(grpc::ServerContext* context, const kc::v1::GetTopologyRequest* request,
                   kc::v1::TopologyInfo* response) override;
  grpc::Status Put(grpc::ServerContext* context, const kc::v1::PutTopologyRequest* request,
                   kc::v1::PutTopologyResponse* response) override;

 private:
  // Not owned (constructor's contract).
  RpcGuard* guard_;
  ClusterDir* dir_;
  AuditLog* audit_;
};

// Safe for concurrent use.
class PoolServiceImpl final : public kc::v1::PoolService::Service {
 public:
  // Not owned; all outlive the service. `audit` may be null.
  PoolServiceImpl(RpcGuard* guard, ClusterDir* dir, AuditLog* audit)
      : guard_(guard), dir_(dir), audit_(audit) {}

  grpc::Status List(grpc::ServerContext* context, const kc::v1::ListPoolsRequest* request,
                    kc::v1::ListPoolsResponse* response) override;
  grpc::Status Put(grpc::ServerContext* context, const kc::v1::PutPoolsRequest* request,
                   kc::v1::PutPoolsResponse* response) override;

 private:
  // Not owned (constructor's contract).
  RpcGuard* guard_;
  ClusterDir* dir_;
  AuditLog* audit_;
};

}  // namespace kc::api
