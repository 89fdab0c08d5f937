// The topology report (`kc topo report`): the groups in use, which collectives should stay
// inside which group and which cross the slow links, and the anomalies worth a look
// (slow measured links, groups that span racks or slow links, declared devices not found).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hal/topology.h"

namespace kc::hal {

// What the local probe found on the machine it ran on.
struct ProbeFindings {
  std::string host;                     // the host the inventory calls this machine
  std::vector<std::string> device_ids;  // ids of the devices found there
};

struct ReportOptions {
  // Groups to report instead of the topology's, as LoadGrouping gives them (names and
  // device indices); they may cover a subset (Topology::ResolveGroups completes them).
  std::optional<std::vector<Group>> user_groups;
  // When set, devices the inventory declares on probe->host but the probe did not find are
  // flagged (device_not_found), and found ids the inventory lacks too (device_not_declared).
  std::optional<ProbeFindings> probe;
  // A link (or host default) is slow when measured < slow_measured_ratio * declared.
  double slow_measured_ratio = 0.5;
  // A group spans a slow link when a member pair's path < slow_pair_ratio * its fastest.
  double slow_pair_ratio = 0.5;
  // Hierarchical all-reduce is recommended when the groups are joined by links at least
  // this many times slower than the slowest group.
  double hierarchical_ratio = 4.0;
  // The all-reduce size estimated over the whole cluster (1 GiB).
  int64_t allreduce_bytes = int64_t{1} << 30;
};

enum class AnomalyKind : uint8_t {
  kSlowLink,            // measured bandwidth < slow_measured_ratio * declared
  kGroupSpansRacks,     // a group with members in two racks
  kGroupSpansSlowLink,  // a group crossing hosts, or with a pair < slow_pair_ratio * fastest
  kDeviceNotFound,      // declared on the probed host, not found by the probe
  kDeviceNotDeclared,   // found by the probe, not in the inventory
  kInvalidGrouping,     // the user groups were rejected; the topology's groups are shown
};
// "slow_link", "group_spans_racks", "group_spans_slow_link", "device_not_found",
// "device_not_declared", "invalid_grouping".
std::string_view AnomalyKindName(AnomalyKind kind);

struct Anomaly {
  AnomalyKind kind;
  std::string subject;  // a link "A <-> B", a host, a group or a device id
  std::string message;  // one sentence for people
};

// A recommendation of where a kind of communication should run.
struct PathAdvice {
  std::string parallelism;             // "tensor" (inside a group) or "data" (across groups)
  std::string scope;                   // the group's name, or "cluster"
  int max_devices = 0;                 // devices the communication may span there
  double bandwidth = 0;                // bytes/s it can count on (the slowest path it uses)
  LinkKind kind = LinkKind::kNetwork;  // the link kind of that slowest path
  std::string message;                 // one sentence for people
};

// An all-reduce of `bytes` over every device, per algorithm (Topology::Collective).
struct AllreduceEstimate {
  int64_t bytes = 0;
  double ring_seconds = 0;
  double tree_seconds = 0;
  double hierarchical_seconds = 0;
  CollectiveAlgo best = CollectiveAlgo::kRing;
  bool recommend_hierarchical = false;  // groups joined by >= hierarchical_ratio slower links
};

struct TopologyReport {
  std::string name;
  int num_devices = 0;
  int num_hosts = 0;
  int num_racks = 0;                    // distinct declared racks
  bool user_groups = false;             // groups come from a user grouping (or a commit)
  std::vector<std::string> device_ids;  // by device index, for naming group members
  std::vector<int> device_hosts;        // by device index: index into host_names
  std::vector<std::string> host_names;
  std::vector<Group> groups;                   // in use
  std::vector<PathAdvice> paths;               // one per group of >= 2 devices, then "data"
  double inter_group_bandwidth = 0;            // slowest hop of a ring over the group leaders
  std::optional<AllreduceEstimate> allreduce;  // absent for a single device
  std::vector<Anomaly> anomalies;
};

// Builds the report. Never fails: user groups that ResolveGroups rejects give an
// invalid_grouping anomaly and the topology's own groups. O(devices log devices + links).
TopologyReport MakeReport(const Topology& topology, const ReportOptions& options = {});

// A readable report: a header line with device, host and rack counts, the groups (hosts
// with the same layout collapsed after the first few), the path advice, the all-reduce
// estimate, and the anomalies marked WARNING.
std::string RenderReportText(const TopologyReport& report);

// The whole report as a JSON document (bandwidths in bytes/s, times in seconds).
std::string RenderReportJson(const TopologyReport& report);

}  // namespace kc::hal
