// The topology: devices, the links between them, the network between hosts, and the groups
// (islands of fast links) computed from them. Upper layers ask it what moving bytes costs:
// comm to choose algorithms, sched to place jobs, the planner to estimate.
//
// A Topology is immutable: every method is const, so what a job receives cannot be changed
// by it. Changes (measured values, edited groups) go through TopologyAdmin
// (hal/topology_admin.h), which needs an AdminCapability, and produce a new Topology.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "hal/device.h"

namespace kc::hal {

// How devices of one host that have no explicit Link reach each other (e.g. PCIe through
// the host bridge, or shared memory between CPU slices).
struct IntraHostDefault {
  LinkKind kind = LinkKind::kPcie;
  double bandwidth = 0;  // bytes/s per direction
  double latency = 0;    // seconds
  // Set by `kc topo probe` (declared values stay as written); like Link's, they win when set.
  std::optional<double> measured_bandwidth;
  std::optional<double> measured_latency;

  // Measured where known, else declared.
  double effective_bandwidth() const { return measured_bandwidth.value_or(bandwidth); }
  double effective_latency() const { return measured_latency.value_or(latency); }
};

// What Path assumes between two devices of a host that declares no IntraHostDefault and no
// Link for them: PCIe 3.0 x8 class with a 10 us latency, so an undeclared path is never
// mistaken for a fast one. Two CPU slices get the same numbers with kind kSharedMemory.
inline constexpr double kConservativeIntraHostBandwidth = 8e9;  // bytes/s
inline constexpr double kConservativeIntraHostLatency = 10e-6;  // seconds

struct HostSpec {
  std::string name;
  std::string rack;  // "" when not declared
  std::optional<IntraHostDefault> intra_host_default;
};

// Between hosts, a pair of devices gets min(their network_bandwidth) within a rack, times
// cross_rack_bandwidth_factor across racks (the oversubscription of the spine).
struct NetworkSpec {
  double cross_rack_bandwidth_factor = 1.0;  // (0, 1]
  double cross_rack_latency = 0;             // seconds added when crossing racks
};

// Everything a Topology is built from: what an inventory file or a probe produces.
struct TopologySpec {
  std::string name;
  std::vector<DeviceDescriptor> devices;
  std::vector<Link> links;  // explicit intra-host links; indices into devices
  std::vector<HostSpec> hosts;
  NetworkSpec network;
};

// The effective path between two devices.
struct PathCost {
  double bandwidth = 0;  // bytes/s per direction (the bottleneck)
  double latency = 0;    // seconds
  LinkKind kind = LinkKind::kNetwork;
  bool crosses_host = false;
  bool crosses_rack = false;
};

// A set of devices joined by fast links: collectives inside it are cheap.
struct Group {
  std::string name;          // "HOST/g0"; user-edited groups keep their file's names
  std::vector<int> devices;  // ascending device indices
  double min_bandwidth = 0;  // slowest path between two members (bytes/s); one member:
                             // its memory bandwidth
  bool spans_hosts = false;
  bool spans_racks = false;  // members in two different declared racks
};

enum class CollectiveOp : uint8_t { kAllreduce, kReduceScatter, kAllgather, kBroadcast, kReduce };
enum class CollectiveAlgo : uint8_t {
  kAuto,          // the cheapest of the others
  kRing,          // bandwidth-optimal: 2(n-1)/n * S / B for all-reduce
  kTree,          // latency-optimal: log2(n) steps of S / B (recursive doubling)
  kHierarchical,  // inside groups, then among group leaders, then inside groups again
};
std::string_view CollectiveOpName(CollectiveOp op);        // "allreduce", "reduce_scatter", ...
std::string_view CollectiveAlgoName(CollectiveAlgo algo);  // "auto", "ring", "tree", ...

struct CollectiveCost {
  double seconds = 0;
  CollectiveAlgo algo = CollectiveAlgo::kRing;  // the one the estimate is for
  bool crosses_slow_link = false;               // leaves a group
};

class TopologyAdmin;

// Immutable (no mutators, not assignable); safe for concurrent use.
class Topology {
 public:
  // Validates and indexes `spec`, then computes the groups. kInvalidArgument (naming the
  // device id, link or host) for: an empty or duplicate device id, a device whose host is
  // not in spec.hosts, a zero or negative memory, FLOP/s or bandwidth, a link to an unknown
  // index or between devices of different hosts or to itself, a duplicate link.
  // Also for: an empty or duplicate host name, a device whose rack differs from its host's,
  // a negative or NaN latency, a cross-rack factor outside (0, 1], and a zero network
  // bandwidth when there is more than one host (bf16 FLOP/s may be 0). A link given as
  // (b, a) is stored as (a, b). Devices inherit their host's rack when they declare none.
  // Linear in devices + links; a 10,000-device topology builds in well under a second.
  static Result<Topology> Build(TopologySpec spec);

  Topology(const Topology&) = default;
  Topology(Topology&&) = default;
  Topology& operator=(const Topology&) = delete;
  Topology& operator=(Topology&&) = delete;

  const std::string& name() const { return spec_.name; }
  int num_devices() const { return static_cast<int>(spec_.devices.size()); }
  const DeviceDescriptor& device(int i) const { return spec_.devices[i]; }
  std::optional<int> Find(std::string_view id) const;
  const std::vector<Link>& links() const { return spec_.links; }
  const std::vector<HostSpec>& hosts() const { return spec_.hosts; }
  const NetworkSpec& network() const { return spec_.network; }
  const TopologySpec& spec() const { return spec_; }
  int host_of(int device) const { return host_of_[device]; }  // index into hosts()

  // The path between devices a and b (a == b: the device's own memory bandwidth).
  PathCost Path(int a, int b) const;
  // latency + bytes / bandwidth along Path(a, b).
  double TransferSeconds(int a, int b, int64_t bytes) const;
  // Estimated time of `op` on `bytes` per device over `devices` (standard alpha-beta cost
  // formulas, docs/design/topology.md). kAuto picks the cheapest algorithm.
  // REQUIRES: every index in `devices` is in [0, num_devices()); duplicates are ignored.
  // One device or 0 bytes costs 0 seconds. O(n log n) Path lookups.
  CollectiveCost Collective(CollectiveOp op, std::span<const int> devices, int64_t bytes,
                            CollectiveAlgo algo = CollectiveAlgo::kAuto) const;
  // As above, with kHierarchical (and kAuto) using `groups`, a partition of the devices
  // such as ResolveGroups returns, instead of groups(): what another grouping would cost.
  // REQUIRES: every device of `devices` is in exactly one of `groups`.
  CollectiveCost Collective(CollectiveOp op, std::span<const int> devices, int64_t bytes,
                            CollectiveAlgo algo, std::span<const Group> groups) const;

  // The groups in use, every device in exactly one: the suggested ones (islands of fast
  // links, docs/design/topology.md), or the user-edited ones committed via TopologyAdmin.
  const std::vector<Group>& groups() const { return groups_; }
  int group_of(int device) const { return group_of_[device]; }
  // Whether groups() come from a user edit rather than the suggestion.
  bool has_user_groups() const { return has_user_groups_; }
  // The suggested groups, whatever groups() are.
  const std::vector<Group>& suggested_groups() const {
    return has_user_groups_ ? suggested_groups_ : groups_;
  }

  // Completes user-edited groups (names and device indices, as a grouping file gives them)
  // into a partition of all devices: devices sorted, min_bandwidth and spans flags filled
  // in; user groups first, in their order, then, for the devices no user group names,
  // their suggested group less the named devices (keeping its name; emptied ones dropped).
  // kInvalidArgument (naming the group) for an empty or duplicate name (a kept suggested
  // name counts), an empty group, an index out of range, or a device in two groups.
  Result<std::vector<Group>> ResolveGroups(std::vector<Group> user) const;

 private:
  friend class TopologyAdmin;
  Topology() = default;
  // Build, then use ResolveGroups(user_groups) as groups(); for TopologyAdmin::Commit.
  static Result<Topology> BuildWithGroups(TopologySpec spec, std::vector<Group> user_groups);
  Status Validate();
  void SuggestGroups();
  void UseGroups(std::vector<Group> groups);
  // Fills min_bandwidth and the spans flags of `g` from its sorted devices.
  void DescribeGroup(Group& g) const;

  // Immutable after Build.
  TopologySpec spec_;
  std::unordered_map<std::string, int> index_;
  std::vector<int> host_of_;                    // device -> index into spec_.hosts
  std::vector<std::vector<int>> host_devices_;  // host -> its devices, ascending
  std::vector<Group> groups_;
  std::vector<int> group_of_;
  bool has_user_groups_ = false;
  std::vector<Group> suggested_groups_;  // empty unless has_user_groups_
  // Explicit links by (min, max) device pair, packed as a * num_devices + b.
  std::unordered_map<int64_t, int> link_index_;
};

}  // namespace kc::hal
