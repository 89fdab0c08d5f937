// TopologyAdmin: the one path by which measured values and groups change.
#include "hal/topology_admin.h"

#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "base/layer_guard.h"

namespace kc::hal {
namespace {

int64_t PairKey(int a, int b, size_t n) {
  if (a > b) std::swap(a, b);
  return static_cast<int64_t>(a) * static_cast<int64_t>(n) + b;
}

Status CheckMeasurement(std::string_view subject, double bandwidth, double latency) {
  if (!std::isfinite(bandwidth) || bandwidth <= 0) {
    return InvalidArgumentError(
        fmt::format("{}: measured bandwidth must be > 0, got {}", subject, bandwidth));
  }
  if (!std::isfinite(latency) || latency < 0) {
    return InvalidArgumentError(
        fmt::format("{}: measured latency must be >= 0, got {}", subject, latency));
  }
  return OkStatus();
}

}  // namespace

TopologyAdmin::TopologyAdmin(const AdminCapability& /*capability*/, const Topology& base)
    : spec_(base.spec()) {
  if (base.has_user_groups()) user_groups_ = base.groups();
  Index();
}

TopologyAdmin::TopologyAdmin(const AdminCapability& /*capability*/, TopologySpec spec)
    : spec_(std::move(spec)) {
  Index();
}

void TopologyAdmin::Index() {
  const size_t n = spec_.devices.size();
  for (size_t i = 0; i < n; ++i)
    device_index_.try_emplace(spec_.devices[i].id, static_cast<int>(i));
  for (size_t h = 0; h < spec_.hosts.size(); ++h) {
    host_index_.try_emplace(spec_.hosts[h].name, static_cast<int>(h));
  }
  for (size_t l = 0; l < spec_.links.size(); ++l) {
    link_index_.try_emplace(PairKey(spec_.links[l].a, spec_.links[l].b, n), static_cast<int>(l));
  }
}

Status TopologyAdmin::SetLinkMeasurement(std::string_view a, std::string_view b, double bandwidth,
                                         double latency) {
  KC_LAYER_ENTRY(Layer::kHal, "topology");
  auto ia = device_index_.find(std::string(a));
  auto ib = device_index_.find(std::string(b));
  for (auto [it, id] : {std::pair{ia, a}, std::pair{ib, b}}) {
    if (it == device_index_.end()) return NotFoundError(fmt::format("device '{}': unknown", id));
  }
  auto link = link_index_.find(PairKey(ia->second, ib->second, spec_.devices.size()));
  if (link == link_index_.end()) {
    return NotFoundError(fmt::format("no explicit link joins '{}' and '{}'", a, b));
  }
  KC_RETURN_IF_ERROR(CheckMeasurement(fmt::format("link '{}' <-> '{}'", a, b), bandwidth, latency));
  Link& l = spec_.links[link->second];
  l.measured_bandwidth = bandwidth;
  l.measured_latency = latency;
  return OkStatus();
}

Status TopologyAdmin::SetHostDefaultMeasurement(std::string_view host, double bandwidth,
                                                double latency) {
  KC_LAYER_ENTRY(Layer::kHal, "topology");
  auto it = host_index_.find(std::string(host));
  if (it == host_index_.end()) return NotFoundError(fmt::format("host '{}': unknown", host));
  KC_RETURN_IF_ERROR(CheckMeasurement(fmt::format("host '{}'", host), bandwidth, latency));
  HostSpec& h = spec_.hosts[it->second];
  if (!h.intra_host_default) {
    bool all_cpu = true;
    for (const DeviceDescriptor& d : spec_.devices) {
      if (d.host == h.name && d.kind != DeviceKind::kCpu) all_cpu = false;
    }
    h.intra_host_default = IntraHostDefault{
        .kind = all_cpu ? LinkKind::kSharedMemory : LinkKind::kPcie,
        .bandwidth = kConservativeIntraHostBandwidth,
        .latency = kConservativeIntraHostLatency,
    };
  }
  h.intra_host_default->measured_bandwidth = bandwidth;
  h.intra_host_default->measured_latency = latency;
  return OkStatus();
}

void TopologyAdmin::ClearMeasurements() {
  for (Link& l : spec_.links) {
    l.measured_bandwidth.reset();
    l.measured_latency.reset();
  }
  for (HostSpec& h : spec_.hosts) {
    if (!h.intra_host_default) continue;
    h.intra_host_default->measured_bandwidth.reset();
    h.intra_host_default->measured_latency.reset();
  }
}

void TopologyAdmin::SetGroups(std::vector<Group> groups) { user_groups_ = std::move(groups); }

Result<std::shared_ptr<const Topology>> TopologyAdmin::Commit() const {
  KC_LAYER_ENTRY(Layer::kHal, "topology");
  KC_ASSIGN_OR_RETURN(Topology t, Topology::BuildWithGroups(spec_, user_groups_));
  return std::shared_ptr<const Topology>(std::make_shared<Topology>(std::move(t)));
}

}  // namespace kc::hal
