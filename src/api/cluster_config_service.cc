#include "api/cluster_config_service.h"

#include <fmt/format.h>

#include <filesystem>
#include <optional>
#include <vector>

#include "api/internal/authorize.h"
#include "api/internal/digest.h"
#include "base/file.h"
#include "hal/inventory.h"
#include "hal/topology.h"
#include "sched/pools.h"

namespace kc::api {
namespace {

namespace fs = std::filesystem;

constexpr char kTopologyFile[] = "topology.yaml";
constexpr char kPoolsFile[] = "pools.yaml";

std::string PathIn(const ClusterDir& dir, const char* name) {
  return (fs::path(dir.path) / name).string();
}

// An inventory's text, loaded and built. Errors name the file as `display_name`, its line and
// key (kInvalidArgument).
Result<hal::Topology> BuildTopology(std::string_view text, const std::string& display_name) {
  KC_ASSIGN_OR_RETURN(hal::TopologySpec spec, hal::LoadInventoryString(text, display_name));
  Result<hal::Topology> topology = hal::Topology::Build(std::move(spec));
  if (!topology.ok()) {
    return InvalidArgumentError(fmt::format("{}: {}", display_name, topology.status().message()));
  }
  return topology;
}

// The stored inventory: kNotFound without one, kFailedPrecondition when it does not load.
Result<std::string> ReadTopology(const ClusterDir& dir) {
  Result<std::string> text = ReadWholeFile(PathIn(dir, kTopologyFile));
  if (text.status().code() == ErrorCode::kNotFound) {
    return NotFoundError(
        fmt::format("{}: the cluster has no topology (kc init --inventory, or TopologyService.Put)",
                    kTopologyFile));
  }
  return text;
}

// The stored topology, built; its text in `text` if not null. kNotFound without one,
// kFailedPrecondition when it does not load.
Result<hal::Topology> StoredTopology(const ClusterDir& dir, std::string* text = nullptr) {
  KC_ASSIGN_OR_RETURN(std::string stored, ReadTopology(dir));
  Result<hal::Topology> topology = BuildTopology(stored, kTopologyFile);
  if (!topology.ok()) return FailedPreconditionError(topology.status().message());
  if (text != nullptr) *text = std::move(stored);
  return topology;
}

// StoredTopology for the pools, which need one: kFailedPrecondition without it.
Result<hal::Topology> TopologyForPools(const ClusterDir& dir) {
  Result<hal::Topology> topology = StoredTopology(dir);
  if (topology.status().code() == ErrorCode::kNotFound) {
    return FailedPreconditionError(
        fmt::format("{}; pools are laid over the topology", topology.status().message()));
  }
  return topology;
}

// The stored pools file, nullopt without one. kFailedPrecondition when it does not load.
Result<std::optional<sched::PoolConfig>> StoredPools(const ClusterDir& dir) {
  Result<std::string> text = ReadWholeFile(PathIn(dir, kPoolsFile));
  if (text.status().code() == ErrorCode::kNotFound) return std::optional<sched::PoolConfig>();
  KC_RETURN_IF_ERROR(text.status());
  Result<sched::PoolConfig> config = sched::LoadPoolConfigString(*text, kPoolsFile);
  if (!config.ok()) return FailedPreconditionError(config.status().message());
  return std::optional<sched::PoolConfig>(std::move(*config));
}

void FillTopology(const hal::Topology& topology, std::string text, kc::v1::TopologyInfo* out) {
  out->set_sha256(internal::Sha256Hex(text));
  out->set_inventory(std::move(text));
  for (const hal::HostSpec& h : topology.hosts()) out->add_hosts(h.name);
  out->set_devices(topology.num_devices());
}

void FillPools(const hal::Topology& topology, const std::vector<sched::Pool>& pools,
               google::protobuf::RepeatedPtrField<kc::v1::PoolInfo>* out) {
  for (const sched::Pool& p : pools) {
    kc::v1::PoolInfo* info = out->Add();
    info->set_name(p.spec.name);
    info->set_devices(static_cast<int64_t>(p.devices.size()));
    for (sched::JobClass c : p.spec.classes) info->add_classes(std::string(sched::JobClassName(c)));
    for (const std::string& t : p.spec.teams) info->add_teams(t);
    info->set_lend(p.spec.lend);
    int last_host = -1;
    for (int d : p.devices) {  // ascending, so a host's devices are adjacent
      if (topology.host_of(d) == last_host) continue;
      last_host = topology.host_of(d);
      info->add_hosts(topology.hosts()[last_host].name);
    }
  }
}

}  // namespace

grpc::Status TopologyServiceImpl::Get(grpc::ServerContext* context,
                                      const kc::v1::GetTopologyRequest*,
                                      kc::v1::TopologyInfo* response) {
  return guard_->Serve(
      context, "kc.v1.TopologyService.Get", [&](const Principal& caller) -> Status {
        KC_RETURN_IF_ERROR(
            internal::Authorized(audit_, caller, Action::kTopologyRead, "topology",
                                 Check(caller, Action::kTopologyRead, {.kind = "topology"})));
        std::string text;
        KC_ASSIGN_OR_RETURN(hal::Topology topology, StoredTopology(*dir_, &text));
        FillTopology(topology, std::move(text), response);
        return OkStatus();
      });
}

grpc::Status TopologyServiceImpl::Put(grpc::ServerContext* context,
                                      const kc::v1::PutTopologyRequest* req,
                                      kc::v1::PutTopologyResponse* response) {
  return guard_->Serve(
      context, "kc.v1.TopologyService.Put", [&](const Principal& caller) -> Status {
        // The cluster's topology as a whole: only the `any` scope (system admins) covers it.
        KC_RETURN_IF_ERROR(internal::Authorized(
            audit_, caller, Action::kTopologyWrite, "topology",
            Check(caller, Action::kTopologyWrite, {.kind = "topology", .id = kTopologyFile})));
        MutexLock lock(&dir_->mu);
        Result<hal::Topology> topology = BuildTopology(req->inventory(), kTopologyFile);
        if (!topology.ok()) {
          return internal::AuditedFailure(audit_, caller, "topology.write", "topology",
                                          topology.status());
        }
        // The pools kcd will lay over it at its next start must still fit.
        KC_ASSIGN_OR_RETURN(std::optional<sched::PoolConfig> pools, StoredPools(*dir_));
        if (pools) {
          Result<std::vector<sched::Pool>> fit = sched::PartitionPools(*topology, *pools);
          if (!fit.ok()) {
            return FailedPreconditionError(fmt::format("{} does not fit the new topology: {}",
                                                       kPoolsFile, fit.status().message()));
          }
        }
        KC_RETURN_IF_ERROR(WriteFileDurably(PathIn(*dir_, kTopologyFile), req->inventory()));
        FillTopology(*topology, req->inventory(), response->mutable_topology());
        KC_RETURN_IF_ERROR(
            AuditNow(audit_, caller.user, "topology.write", "topology", "ok",
                     fmt::format("sha256 {}: {} hosts, {} devices", response->topology().sha256(),
                                 topology->hosts().size(), topology->num_devices())));
        response->set_note(kEffectiveNow);
        return OkStatus();
      });
}

grpc::Status PoolServiceImpl::List(grpc::ServerContext* context, const kc::v1::ListPoolsRequest*,
                                   kc::v1::ListPoolsResponse* response) {
  return guard_->Serve(context, "kc.v1.PoolService.List", [&](const Principal& caller) -> Status {
    KC_RETURN_IF_ERROR(internal::Authorized(audit_, caller, Action::kPoolList, "pool",
                                            Check(caller, Action::kPoolList, {.kind = "pool"})));
    KC_ASSIGN_OR_RETURN(hal::Topology topology, TopologyForPools(*dir_));
    KC_ASSIGN_OR_RETURN(std::optional<sched::PoolConfig> config, StoredPools(*dir_));
    response->set_defaults(!config.has_value());
    Result<std::vector<sched::Pool>> pools =
        sched::PartitionPools(topology, config ? *config : sched::AllDevicesPoolConfig());
    if (!pools.ok()) {
      return FailedPreconditionError(
          fmt::format("{}: {}", config ? kPoolsFile : "default pools", pools.status().message()));
    }
    FillPools(topology, *pools, response->mutable_pools());
    return OkStatus();
  });
}

grpc::Status PoolServiceImpl::Put(grpc::ServerContext* context, const kc::v1::PutPoolsRequest* req,
                                  kc::v1::PutPoolsResponse* response) {
  return guard_->Serve(context, "kc.v1.PoolService.Put", [&](const Principal& caller) -> Status {
    // Every pool and the scheduler's settings at once: a change to the whole cluster, which
    // only the `any` scope (system admins) covers; a resource admin's `team` scope covers its
    // team's pool alone.
    KC_RETURN_IF_ERROR(internal::Authorized(
        audit_, caller, Action::kPoolModify, "pool",
        Check(caller, Action::kPoolModify, {.kind = "pool", .id = kPoolsFile})));
    MutexLock lock(&dir_->mu);
    Result<sched::PoolConfig> config = sched::LoadPoolConfigString(req->pools(), kPoolsFile);
    if (!config.ok())
      return internal::AuditedFailure(audit_, caller, "pool.modify", "pool", config.status());
    KC_ASSIGN_OR_RETURN(hal::Topology topology, TopologyForPools(*dir_));
    Result<std::vector<sched::Pool>> pools = sched::PartitionPools(topology, *config);
    if (!pools.ok()) {
      return internal::AuditedFailure(
          audit_, caller, "pool.modify", "pool",
          InvalidArgumentError(fmt::format("{}: {}", kPoolsFile, pools.status().message())));
    }
    KC_RETURN_IF_ERROR(WriteFileDurably(PathIn(*dir_, kPoolsFile), req->pools()));
    FillPools(topology, *pools, response->mutable_pools());
    KC_RETURN_IF_ERROR(AuditNow(
        audit_, caller.user, "pool.modify", "pool", "ok",
        fmt::format("sha256 {}: {} pools", internal::Sha256Hex(req->pools()), pools->size())));
    response->set_note(kEffectiveNow);
    return OkStatus();
  });
}

}  // namespace kc::api
