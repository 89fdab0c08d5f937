// The topology report: assembled from a Topology, rendered as text for people and as JSON.
#include "hal/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace kc::hal {
namespace {

// Hosts of one layout shown in the groups table before the rest are collapsed.
constexpr size_t kHostsShownPerLayout = 2;
// Anomalies listed in the text report; the JSON has them all.
constexpr size_t kMaxAnomalyLines = 100;

std::string GBps(double bytes_per_second) {
  return fmt::format("{:.1f} GB/s", bytes_per_second / 1e9);
}

std::string Seconds(double s) {
  if (s >= 1) return fmt::format("{:.2f} s", s);
  if (s >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

// 1250 -> "1,250".
std::string Count(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

// "1 device", "2 devices", "1,250 hosts".
std::string Plural(int64_t n, std::string_view noun) {
  return Count(n) + " " + std::string(noun) + (n == 1 ? "" : "s");
}

std::string Bytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:g} GiB", std::ldexp(bytes, -30));
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:g} MiB", std::ldexp(bytes, -20));
  return fmt::format("{} B", bytes);
}

// The slowest and fastest paths between two members of a single-host group.
struct PairRange {
  PathCost slowest;
  int slow_a = -1, slow_b = -1;
  double fastest = 0;
};

PairRange SingleHostPairs(const Topology& t, const Group& g) {
  PairRange r;
  r.slowest.bandwidth = std::numeric_limits<double>::infinity();
  for (size_t x = 0; x < g.devices.size(); ++x) {
    for (size_t y = x + 1; y < g.devices.size(); ++y) {
      const PathCost p = t.Path(g.devices[x], g.devices[y]);
      r.fastest = std::max(r.fastest, p.bandwidth);
      if (p.bandwidth < r.slowest.bandwidth) {
        r.slowest = p;
        r.slow_a = g.devices[x];
        r.slow_b = g.devices[y];
      }
    }
  }
  return r;
}

void AddSlowLinkAnomalies(const Topology& t, const ReportOptions& options, TopologyReport& r) {
  for (const Link& l : t.links()) {
    if (!l.measured_bandwidth) continue;
    const double ratio = *l.measured_bandwidth / l.declared_bandwidth;
    if (ratio >= options.slow_measured_ratio) continue;
    std::string subject = fmt::format("{} <-> {}", t.device(l.a).id, t.device(l.b).id);
    std::string message = fmt::format(
        "Link {} ({}) measured {}, {:.2f}x its declared {}; check the cabling, the link width "
        "or the driver.",
        subject, LinkKindName(l.kind), GBps(*l.measured_bandwidth), ratio,
        GBps(l.declared_bandwidth));
    r.anomalies.push_back({AnomalyKind::kSlowLink, std::move(subject), std::move(message)});
  }
  for (const HostSpec& h : t.hosts()) {
    if (!h.intra_host_default || !h.intra_host_default->measured_bandwidth) continue;
    const IntraHostDefault& d = *h.intra_host_default;
    const double ratio = *d.measured_bandwidth / d.bandwidth;
    if (ratio >= options.slow_measured_ratio) continue;
    r.anomalies.push_back(
        {AnomalyKind::kSlowLink, h.name,
         fmt::format("The intra-host paths of host {} ({}) measured {}, {:.2f}x the declared {}.",
                     h.name, LinkKindName(d.kind), GBps(*d.measured_bandwidth), ratio,
                     GBps(d.bandwidth))});
  }
}

void AddGroupAnomalies(const Topology& t, const ReportOptions& options, TopologyReport& r) {
  for (const Group& g : r.groups) {
    if (g.spans_racks) {
      std::set<std::string> racks;
      for (int d : g.devices) racks.insert(t.hosts()[t.host_of(d)].rack);
      racks.erase("");
      std::string list;
      for (const std::string& rack : racks) list += (list.empty() ? "" : ", ") + rack;
      r.anomalies.push_back(
          {AnomalyKind::kGroupSpansRacks, g.name,
           fmt::format("Group {} spans {} racks ({}); its collectives cross the spine.", g.name,
                       racks.size(), list)});
    }
    if (g.spans_hosts) {
      std::unordered_set<int> hosts;
      for (int d : g.devices) hosts.insert(t.host_of(d));
      r.anomalies.push_back(
          {AnomalyKind::kGroupSpansSlowLink, g.name,
           fmt::format("Group {} spans {} hosts: its members talk over the network at {}.", g.name,
                       hosts.size(), GBps(g.min_bandwidth))});
      continue;
    }
    if (g.devices.size() < 2) continue;
    const PairRange range = SingleHostPairs(t, g);
    if (range.slowest.bandwidth < options.slow_pair_ratio * range.fastest) {
      r.anomalies.push_back(
          {AnomalyKind::kGroupSpansSlowLink, g.name,
           fmt::format("Group {} joins {} and {} over {} at {}, {:.2f}x its fastest pair ({}).",
                       g.name, t.device(range.slow_a).id, t.device(range.slow_b).id,
                       LinkKindName(range.slowest.kind), GBps(range.slowest.bandwidth),
                       range.slowest.bandwidth / range.fastest, GBps(range.fastest))});
    }
  }
}

void AddProbeAnomalies(const Topology& t, const ProbeFindings& probe, TopologyReport& r) {
  std::unordered_set<std::string_view> found(probe.device_ids.begin(), probe.device_ids.end());
  for (int d = 0; d < t.num_devices(); ++d) {
    const DeviceDescriptor& dev = t.device(d);
    if (dev.host != probe.host || found.contains(dev.id)) continue;
    r.anomalies.push_back(
        {AnomalyKind::kDeviceNotFound, dev.id,
         fmt::format("Device {} is declared on host {} but the probe did not find it.", dev.id,
                     probe.host)});
  }
  for (const std::string& id : probe.device_ids) {
    if (t.Find(id)) continue;
    r.anomalies.push_back(
        {AnomalyKind::kDeviceNotDeclared, id,
         fmt::format("The probe found device {} on host {}, which the inventory does not declare.",
                     id, probe.host)});
  }
}

void AddPathAdvice(const Topology& t, const ReportOptions& options, TopologyReport& r) {
  double slowest_group = std::numeric_limits<double>::infinity();
  for (const Group& g : r.groups) {
    if (g.devices.size() < 2) continue;
    PathAdvice a{.parallelism = "tensor",
                 .scope = g.name,
                 .max_devices = static_cast<int>(g.devices.size()),
                 .bandwidth = g.min_bandwidth,
                 .kind = LinkKind::kNetwork};
    if (!g.spans_hosts) a.kind = SingleHostPairs(t, g).slowest.kind;
    a.message = fmt::format("Tensor parallel up to {} devices inside {} at {} ({}).", a.max_devices,
                            g.name, GBps(a.bandwidth), LinkKindName(a.kind));
    slowest_group = std::min(slowest_group, g.min_bandwidth);
    r.paths.push_back(std::move(a));
  }
  if (t.num_devices() < 2) return;

  std::vector<int> all(t.num_devices());
  for (int d = 0; d < t.num_devices(); ++d) all[d] = d;
  AllreduceEstimate e{.bytes = options.allreduce_bytes};
  auto cost = [&](CollectiveAlgo algo) {
    return t.Collective(CollectiveOp::kAllreduce, all, e.bytes, algo, r.groups);
  };
  e.ring_seconds = cost(CollectiveAlgo::kRing).seconds;
  e.tree_seconds = cost(CollectiveAlgo::kTree).seconds;
  e.hierarchical_seconds = cost(CollectiveAlgo::kHierarchical).seconds;
  e.best = cost(CollectiveAlgo::kAuto).algo;
  r.allreduce = e;
  if (r.groups.size() < 2) return;

  // A ring over the group leaders: what data parallelism across groups runs on.
  PathCost slowest_hop;
  slowest_hop.bandwidth = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < r.groups.size(); ++i) {
    const PathCost p =
        t.Path(r.groups[i].devices.front(), r.groups[(i + 1) % r.groups.size()].devices.front());
    if (p.bandwidth < slowest_hop.bandwidth) slowest_hop = p;
  }
  r.inter_group_bandwidth = slowest_hop.bandwidth;
  PathAdvice dp{.parallelism = "data",
                .scope = "cluster",
                .max_devices = t.num_devices(),
                .bandwidth = slowest_hop.bandwidth,
                .kind = slowest_hop.kind};
  dp.message = fmt::format(
      "Data parallel across {} groups over {} at {}: only gradients should cross these links.",
      Count(static_cast<int64_t>(r.groups.size())),
      slowest_hop.kind == LinkKind::kNetwork ? "the network" : LinkKindName(slowest_hop.kind),
      GBps(dp.bandwidth));
  e.recommend_hierarchical = std::isfinite(slowest_group) &&
                             slowest_group >= options.hierarchical_ratio * r.inter_group_bandwidth;
  if (e.recommend_hierarchical) {
    dp.message += fmt::format(
        " The groups are joined by links {:.0f}x slower than the slowest group: use "
        "hierarchical all-reduce ({} for {} over all devices, ring {}).",
        slowest_group / r.inter_group_bandwidth, Seconds(e.hierarchical_seconds), Bytes(e.bytes),
        Seconds(e.ring_seconds));
  }
  r.paths.push_back(std::move(dp));
  r.allreduce = e;
}

// The groups of one host as a line-independent signature, to collapse identical hosts.
std::string LayoutOf(const std::vector<const Group*>& groups) {
  std::string sig;
  for (const Group* g : groups) {
    sig += fmt::format("{}:{}:{};", g->devices.size(), GBps(g->min_bandwidth), g->spans_racks);
  }
  return sig;
}

std::string GroupLine(const TopologyReport& r, const Group& g) {
  std::string span = "-";
  if (g.spans_hosts) span = g.spans_racks ? "hosts, racks" : "hosts";
  // Members: "a .. z" for a run of consecutive devices, else the first few.
  const std::vector<int>& d = g.devices;
  std::string members = r.device_ids[d.front()];
  if (d.size() > 1 && d.back() - d.front() + 1 == static_cast<int>(d.size())) {
    members += " .. " + r.device_ids[d.back()];
  } else if (d.size() > 1) {
    for (size_t i = 1; i < d.size() && i < 3; ++i) members += ", " + r.device_ids[d[i]];
    if (d.size() > 3) members += fmt::format(", … ({} devices)", Count(d.size()));
  }
  // A single device has no path to another member.
  const std::string slowest = g.devices.size() == 1 ? "-" : GBps(g.min_bandwidth);
  return fmt::format("  {:<20} {:>6}  {:>12}  {:<12}  {}\n", g.name, Count(g.devices.size()),
                     slowest, span, members);
}

}  // namespace

std::string_view AnomalyKindName(AnomalyKind kind) {
  switch (kind) {
    case AnomalyKind::kSlowLink:
      return "slow_link";
    case AnomalyKind::kGroupSpansRacks:
      return "group_spans_racks";
    case AnomalyKind::kGroupSpansSlowLink:
      return "group_spans_slow_link";
    case AnomalyKind::kDeviceNotFound:
      return "device_not_found";
    case AnomalyKind::kDeviceNotDeclared:
      return "device_not_declared";
    case AnomalyKind::kInvalidGrouping:
      return "invalid_grouping";
  }
  return "unknown";
}

TopologyReport MakeReport(const Topology& topology, const ReportOptions& options) {
  TopologyReport r;
  r.name = topology.name();
  r.num_devices = topology.num_devices();
  r.num_hosts = static_cast<int>(topology.hosts().size());
  std::unordered_set<std::string_view> racks;
  for (const HostSpec& h : topology.hosts()) {
    r.host_names.push_back(h.name);
    if (!h.rack.empty()) racks.insert(h.rack);
  }
  r.num_racks = static_cast<int>(racks.size());
  r.device_ids.reserve(topology.num_devices());
  r.device_hosts.reserve(topology.num_devices());
  for (int d = 0; d < topology.num_devices(); ++d) {
    r.device_ids.push_back(topology.device(d).id);
    r.device_hosts.push_back(topology.host_of(d));
  }

  r.groups = topology.groups();
  r.user_groups = topology.has_user_groups();
  if (options.user_groups) {
    Result<std::vector<Group>> resolved = topology.ResolveGroups(*options.user_groups);
    if (resolved.ok()) {
      r.groups = std::move(resolved).value();
      r.user_groups = true;
    } else {
      r.anomalies.push_back(
          {AnomalyKind::kInvalidGrouping, "grouping",
           fmt::format("The user grouping was rejected ({}); showing the {} groups instead.",
                       resolved.status().message(),
                       topology.has_user_groups() ? "committed" : "suggested")});
    }
  }

  AddPathAdvice(topology, options, r);
  AddSlowLinkAnomalies(topology, options, r);
  AddGroupAnomalies(topology, options, r);
  if (options.probe) AddProbeAnomalies(topology, *options.probe, r);
  return r;
}

std::string RenderReportText(const TopologyReport& r) {
  std::string out =
      fmt::format("Topology {}: {} on {} {}; {} ({})\n", r.name.empty() ? "(unnamed)" : r.name,
                  Plural(r.num_devices, "device"), Plural(r.num_hosts, "host"),
                  r.num_racks == 0 ? "(no racks declared)" : "in " + Plural(r.num_racks, "rack"),
                  Plural(static_cast<int64_t>(r.groups.size()), "group"),
                  r.user_groups ? "user-edited" : "suggested");

  // Groups: host by host, hosts with the same layout as an earlier one collapsed after the
  // first few; groups spanning hosts afterwards.
  out += fmt::format("\nGroups\n  {:<20} {:>6}  {:>12}  {:<12}  {}\n", "group", "size",
                     "slowest path", "spans", "members");
  std::vector<std::vector<const Group*>> by_host(r.host_names.size());
  std::vector<const Group*> multi_host;
  for (const Group& g : r.groups) {
    if (g.spans_hosts) {
      multi_host.push_back(&g);
    } else {
      by_host[r.device_hosts[g.devices.front()]].push_back(&g);
    }
  }
  struct Layout {
    std::vector<int> hosts;
  };
  std::vector<std::string> layout_order;
  std::map<std::string, Layout> layouts;
  for (size_t h = 0; h < by_host.size(); ++h) {
    if (by_host[h].empty()) continue;
    const std::string sig = LayoutOf(by_host[h]);
    auto [it, inserted] = layouts.try_emplace(sig);
    if (inserted) layout_order.push_back(sig);
    it->second.hosts.push_back(static_cast<int>(h));
  }
  for (const std::string& sig : layout_order) {
    const std::vector<int>& hosts = layouts[sig].hosts;
    const size_t shown =
        hosts.size() <= kHostsShownPerLayout + 1 ? hosts.size() : kHostsShownPerLayout;
    for (size_t i = 0; i < shown; ++i) {
      for (const Group* g : by_host[hosts[i]]) out += GroupLine(r, *g);
    }
    if (shown < hosts.size()) {
      out += fmt::format("  … and {} more hosts with the same layout as {}\n",
                         Count(static_cast<int64_t>(hosts.size() - shown)), r.host_names[hosts[0]]);
    }
  }
  for (const Group* g : multi_host) out += GroupLine(r, *g);

  // Paths: identical tensor-parallel advice collapsed.
  out += "\nCommunication paths\n";
  for (size_t i = 0; i < r.paths.size();) {
    const PathAdvice& a = r.paths[i];
    size_t j = i + 1;
    while (a.parallelism == "tensor" && j < r.paths.size() &&
           r.paths[j].parallelism == a.parallelism && r.paths[j].max_devices == a.max_devices &&
           r.paths[j].kind == a.kind && GBps(r.paths[j].bandwidth) == GBps(a.bandwidth)) {
      ++j;
    }
    out += "  " + a.message;
    if (j - i > 1) {
      const int64_t more = static_cast<int64_t>(j - i - 1);
      out += fmt::format(" Same for {} more group{}.", Count(more), more == 1 ? "" : "s");
    }
    out += "\n";
    i = j;
  }
  if (r.paths.empty()) out += "  Single devices only: no collective communication inside groups.\n";
  if (r.allreduce) {
    const AllreduceEstimate& e = *r.allreduce;
    out += fmt::format(
        "  All-reduce of {} over all {} devices: ring {}, tree {}, hierarchical {}; best: {}.\n",
        Bytes(e.bytes), Count(r.num_devices), Seconds(e.ring_seconds), Seconds(e.tree_seconds),
        Seconds(e.hierarchical_seconds), CollectiveAlgoName(e.best));
  }

  out += "\nAnomalies\n";
  if (r.anomalies.empty()) out += "  none\n";
  for (size_t i = 0; i < r.anomalies.size() && i < kMaxAnomalyLines; ++i) {
    const Anomaly& a = r.anomalies[i];
    out += fmt::format("  WARNING {} {}: {}\n", AnomalyKindName(a.kind), a.subject, a.message);
  }
  if (r.anomalies.size() > kMaxAnomalyLines) {
    out += fmt::format("  … and {} more anomalies (see the JSON report)\n",
                       Count(static_cast<int64_t>(r.anomalies.size() - kMaxAnomalyLines)));
  }
  return out;
}

std::string RenderReportJson(const TopologyReport& r) {
  using json = nlohmann::ordered_json;  // fields in the order written here
  json groups = json::array();
  for (const Group& g : r.groups) {
    json devices = json::array();
    for (int d : g.devices) devices.push_back(r.device_ids[d]);
    groups.push_back({{"name", g.name},
                      {"size", g.devices.size()},
                      {"devices", std::move(devices)},
                      {"min_bandwidth", g.min_bandwidth},
                      {"spans_hosts", g.spans_hosts},
                      {"spans_racks", g.spans_racks}});
  }
  json paths = json::array();
  for (const PathAdvice& a : r.paths) {
    paths.push_back({{"parallelism", a.parallelism},
                     {"scope", a.scope},
                     {"max_devices", a.max_devices},
                     {"bandwidth", a.bandwidth},
                     {"link_kind", std::string(LinkKindName(a.kind))},
                     {"message", a.message}});
  }
  json allreduce = nullptr;
  if (r.allreduce) {
    const AllreduceEstimate& e = *r.allreduce;
    allreduce = {{"bytes", e.bytes},
                 {"ring_seconds", e.ring_seconds},
                 {"tree_seconds", e.tree_seconds},
                 {"hierarchical_seconds", e.hierarchical_seconds},
                 {"best", std::string(CollectiveAlgoName(e.best))},
                 {"recommend_hierarchical", e.recommend_hierarchical}};
  }
  json anomalies = json::array();
  for (const Anomaly& a : r.anomalies) {
    anomalies.push_back({{"kind", std::string(AnomalyKindName(a.kind))},
                         {"subject", a.subject},
                         {"message", a.message}});
  }
  json doc = {{"name", r.name},
              {"num_devices", r.num_devices},
              {"num_hosts", r.num_hosts},
              {"num_racks", r.num_racks},
              {"user_groups", r.user_groups},
              {"groups", std::move(groups)},
              {"paths", std::move(paths)},
              {"inter_group_bandwidth", r.inter_group_bandwidth},
              {"allreduce", std::move(allreduce)},
              {"anomalies", std::move(anomalies)}};
  return doc.dump(2) + "\n";
}

}  // namespace kc::hal
