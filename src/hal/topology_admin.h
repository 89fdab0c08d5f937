// The permissions seam of the topology: descriptors and topology configuration change only
// through TopologyAdmin, which needs an AdminCapability; everything a job receives is a
// std::shared_ptr<const Topology>, a view with no mutators (docs/design/topology.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "hal/topology.h"

namespace kc::hal {

// Proof that the holder may change topology configuration. Ordinary code cannot make one:
// the constructor is private and GrantForLocalAdmin is the one minting point. Copyable, so a
// holder may pass it on; whoever holds one is trusted as the system admin.
class AdminCapability {
 public:
  // The one minting point. The local `kc` CLI is the system admin of its own machine and
  // calls this directly; the control plane (kcd) wraps it behind its permission check
  // (role system_admin, checked against the permission service) and never hands the
  // capability to jobs.
  static AdminCapability GrantForLocalAdmin() { return AdminCapability(); }

 private:
  AdminCapability() = default;
};

// An edit of a topology: measured values and user-edited groups, applied to a private copy
// of the spec and published by Commit as a new immutable Topology. Views handed out earlier
// never change (copy-on-write). Not thread-safe; owned by the admin's thread.
class TopologyAdmin {
 public:
  // Starts from `base`: its spec and, if it has user groups, its groups as they are.
  TopologyAdmin(const AdminCapability& capability, const Topology& base);
  // Starts from a spec with the suggested groups.
  TopologyAdmin(const AdminCapability& capability, TopologySpec spec);

  // Records the measured bandwidth (bytes/s) and latency (seconds) of the explicit link
  // between the devices with ids `a` and `b` (either order). kNotFound for an unknown id
  // or when no explicit link joins them; kInvalidArgument for a bandwidth <= 0 or a
  // negative latency.
  Status SetLinkMeasurement(std::string_view a, std::string_view b, double bandwidth,
                            double latency);

  // Records the measured bandwidth and latency of the unlinked pairs of host `host`. A host
  // that declares no IntraHostDefault gets one, declared as the conservative default
  // (kConservativeIntraHostBandwidth, kind kPcie, or kSharedMemory for CPU-only hosts).
  // kNotFound for an unknown host; kInvalidArgument as for SetLinkMeasurement.
  Status SetHostDefaultMeasurement(std::string_view host, double bandwidth, double latency);

  // Forgets every measured value (links and host defaults).
  void ClearMeasurements();

  // Replaces the groups with user-edited ones (name + device indices, e.g. from
  // LoadGrouping). They may cover a subset of the devices: the rest keep their suggested
  // group (Topology::ResolveGroups). Checked at Commit. An empty list restores the
  // suggested groups.
  void SetGroups(std::vector<Group> groups);
  void ClearGroups() { SetGroups({}); }

  // Builds the edited topology. The result is a new immutable Topology; earlier views are
  // untouched. kInvalidArgument for anything Topology::Build or ResolveGroups rejects.
  // Does not block; O(devices + links), plus the user groups' pairs.
  Result<std::shared_ptr<const Topology>> Commit() const;

  // The spec as edited so far.
  const TopologySpec& spec() const { return spec_; }
  const std::vector<Group>& user_groups() const { return user_groups_; }

 private:
  void Index();

  TopologySpec spec_;
  std::vector<Group> user_groups_;
  // Lookups into spec_; its devices, hosts and links are never added or removed.
  std::unordered_map<std::string, int> device_index_;
  std::unordered_map<std::string, int> host_index_;
  std::unordered_map<int64_t, int> link_index_;  // (min, max) device pair -> link
};

}  // namespace kc::hal
