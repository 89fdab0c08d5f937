// Topology: validation and indexing, path costs, alpha-beta collective estimates, and the
// suggested groups (docs/design/topology.md).
#include "hal/topology.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "base/layer_guard.h"

namespace kc::hal {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool Positive(double x) { return std::isfinite(x) && x > 0; }
bool NonNegative(double x) { return std::isfinite(x) && x >= 0; }

int64_t PairKey(int a, int b, int n) {
  if (a > b) std::swap(a, b);
  return static_cast<int64_t>(a) * n + b;
}

// Union-find over [0, n) with path halving.
class DisjointSets {
 public:
  explicit DisjointSets(int n) : parent_(n) { std::iota(parent_.begin(), parent_.end(), 0); }
  int Find(int x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  void Union(int a, int b) {
    a = Find(a);
    b = Find(b);
    if (a != b) parent_[std::max(a, b)] = std::min(a, b);
  }

 private:
  std::vector<int> parent_;
};

// The slowest hop and the largest latency of a set of device pairs.
struct HopBound {
  double bandwidth = kInf;
  double latency = 0;
  void Add(const PathCost& p) {
    bandwidth = std::min(bandwidth, p.bandwidth);
    latency = std::max(latency, p.latency);
  }
};

// The ring through `ring` in order, closing back to the first device.
HopBound RingHops(const Topology& t, std::span<const int> ring) {
  HopBound h;
  const size_t n = ring.size();
  if (n < 2) return h;
  for (size_t i = 0; i < n; ++i) h.Add(t.Path(ring[i], ring[(i + 1) % n]));
  return h;
}

// Ring algorithms over n devices whose slowest hop is `h` (Patarasuk & Yuan 2009; Thakur,
// Rabenseifner & Gropp 2005). Broadcast and reduce are pipelined along the ring (chain) in
// small segments: (n-1) latencies to fill the pipe, then S / B to stream the message.
double RingSeconds(CollectiveOp op, size_t n, double bytes, const HopBound& h) {
  if (n < 2 || bytes <= 0) return 0;
  const double steps = static_cast<double>(n - 1);
  const double chunk = bytes / static_cast<double>(n);
  switch (op) {
    case CollectiveOp::kAllreduce:
      return 2 * steps * (h.latency + chunk / h.bandwidth);
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllgather:
      return steps * (h.latency + chunk / h.bandwidth);
    case CollectiveOp::kBroadcast:
    case CollectiveOp::kReduce:
      return steps * h.latency + bytes / h.bandwidth;
  }
  return 0;
}

// Tree algorithms over `order` (ranks = positions), ceil(log2 n) steps, each costing the
// largest latency plus its bytes over the slowest pair that exchanges in that step:
//   all-reduce: recursive doubling, S per step, partner rank ^ 2^k;
//   all-gather: recursive doubling, 2^k blocks of S/n at step k, partner rank ^ 2^k;
//   reduce-scatter: recursive halving, the same steps in reverse;
//   broadcast/reduce: binomial tree, S per step, rank i < 2^k with i + 2^k.
// A non-power-of-two n costs as the pairs that exist in the next power of two.
double TreeSeconds(const Topology& t, CollectiveOp op, std::span<const int> order, double bytes) {
  const size_t n = order.size();
  if (n < 2 || bytes <= 0) return 0;
  const int steps = std::bit_width(n - 1);  // ceil(log2 n)
  const double block = bytes / static_cast<double>(n);
  double seconds = 0;
  for (int k = 0; k < steps; ++k) {
    const size_t dist = size_t{1} << k;
    HopBound h;
    if (op == CollectiveOp::kBroadcast || op == CollectiveOp::kReduce) {
      for (size_t i = 0; i < dist && i + dist < n; ++i) h.Add(t.Path(order[i], order[i + dist]));
    } else {
      for (size_t i = 0; i < n; ++i) {
        const size_t j = i ^ dist;
        if (j > i && j < n) h.Add(t.Path(order[i], order[j]));
      }
    }
    double step_bytes = bytes;
    if (op == CollectiveOp::kAllgather || op == CollectiveOp::kReduceScatter) {
      // Step k of all-gather moves 2^k blocks; reduce-scatter runs the steps backwards.
      step_bytes = static_cast<double>(dist) * block;
    }
    seconds += h.latency + step_bytes / h.bandwidth;
  }
  return seconds;
}

// Hierarchical: `parts` are the devices of each group (ring order kept), leaders the first
// of each. All-reduce = reduce-scatter inside every group, all-reduce of the S/g shards
// among groups (each member j with the j-th members of the others, in parallel; costed on
// the leaders' ring and the smallest g, whose shard is largest), all-gather inside groups.
// Phases inside groups run in parallel: each costs its slowest group.
double HierarchicalSeconds(const Topology& t, CollectiveOp op,
                           const std::vector<std::vector<int>>& parts, double bytes) {
  std::vector<int> leaders;
  size_t g_min = std::numeric_limits<size_t>::max();
  double reduce_scatter = 0, allgather = 0, bcast = 0, reduce = 0;
  for (const std::vector<int>& part : parts) {
    leaders.push_back(part.front());
    g_min = std::min(g_min, part.size());
    const HopBound h = RingHops(t, part);
    reduce_scatter =
        std::max(reduce_scatter, RingSeconds(CollectiveOp::kReduceScatter, part.size(), bytes, h));
    allgather = std::max(allgather, RingSeconds(CollectiveOp::kAllgather, part.size(), bytes, h));
    bcast = std::max(bcast, RingSeconds(CollectiveOp::kBroadcast, part.size(), bytes, h));
    reduce = std::max(reduce, RingSeconds(CollectiveOp::kReduce, part.size(), bytes, h));
  }
  const HopBound inter = RingHops(t, leaders);
  const size_t m = leaders.size();
  const double shard = bytes / static_cast<double>(g_min);
  switch (op) {
    case CollectiveOp::kAllreduce:
      return reduce_scatter + RingSeconds(CollectiveOp::kAllreduce, m, shard, inter) + allgather;
    case CollectiveOp::kReduceScatter:
      return reduce_scatter + RingSeconds(CollectiveOp::kReduceScatter, m, shard, inter);
    case CollectiveOp::kAllgather:
      return RingSeconds(CollectiveOp::kAllgather, m, shard, inter) + allgather;
    case CollectiveOp::kBroadcast:
      return RingSeconds(CollectiveOp::kBroadcast, m, bytes, inter) + bcast;
    case CollectiveOp::kReduce:
      return reduce + RingSeconds(CollectiveOp::kReduce, m, bytes, inter);
  }
  return 0;
}

// `group_of[d]` is the group of device d, or -1 when d is in none (then d is alone).
CollectiveCost EstimateCollective(const Topology& t, CollectiveOp op, std::span<const int> devices,
                                  int64_t bytes, CollectiveAlgo algo,
                                  std::span<const int> group_of) {
  // Ring order: by rack, host, then index on the host, so that each host (and rack)
  // boundary is crossed once.
  std::vector<int> order(devices.begin(), devices.end());
  for (int d : order) KC_CHECK(d >= 0 && d < t.num_devices()) << "device index " << d;
  std::sort(order.begin(), order.end());
  order.erase(std::unique(order.begin(), order.end()), order.end());
  std::stable_sort(order.begin(), order.end(), [&t](int a, int b) {
    const int ha = t.host_of(a), hb = t.host_of(b);
    if (ha != hb) {
      const std::string& ra = t.hosts()[ha].rack;
      const std::string& rb = t.hosts()[hb].rack;
      if (ra != rb) return ra < rb;
      return ha < hb;
    }
    return t.device(a).index_on_host < t.device(b).index_on_host;
  });

  // Split the ring order by group, keeping each group's devices in ring order.
  std::vector<std::vector<int>> parts;
  std::unordered_map<int64_t, size_t> part_of_group;
  for (int d : order) {
    const int64_t g = group_of[d] >= 0 ? group_of[d] : -1 - static_cast<int64_t>(d);
    auto [it, inserted] = part_of_group.try_emplace(g, parts.size());
    if (inserted) parts.emplace_back();
    parts[it->second].push_back(d);
  }

  CollectiveCost cost;
  cost.algo = algo == CollectiveAlgo::kAuto ? CollectiveAlgo::kRing : algo;
  cost.crosses_slow_link = parts.size() > 1;
  if (order.size() < 2 || bytes <= 0) return cost;

  const double s = static_cast<double>(bytes);
  auto seconds_of = [&](CollectiveAlgo a) {
    switch (a) {
      case CollectiveAlgo::kRing:
        return RingSeconds(op, order.size(), s, RingHops(t, order));
      case CollectiveAlgo::kTree:
        return TreeSeconds(t, op, order, s);
      case CollectiveAlgo::kHierarchical:
        if (parts.size() == 1 || parts.size() == order.size()) {
          return RingSeconds(op, order.size(), s, RingHops(t, order));  // one level only
        }
        return HierarchicalSeconds(t, op, parts, s);
      case CollectiveAlgo::kAuto:
        break;
    }
    return kInf;
  };
  if (algo != CollectiveAlgo::kAuto) {
    cost.seconds = seconds_of(algo);
    return cost;
  }
  cost.seconds = kInf;
  for (CollectiveAlgo a :
       {CollectiveAlgo::kRing, CollectiveAlgo::kHierarchical, CollectiveAlgo::kTree}) {
    const double sec = seconds_of(a);
    if (sec < cost.seconds) {
      cost.seconds = sec;
      cost.algo = a;
    }
  }
  return cost;
}

}  // namespace

std::string_view CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce:
      return "allreduce";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kAllgather:
      return "allgather";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kReduce:
      return "reduce";
  }
  return "unknown";
}

std::string_view CollectiveAlgoName(CollectiveAlgo algo) {
  switch (algo) {
    case CollectiveAlgo::kAuto:
      return "auto";
    case CollectiveAlgo::kRing:
      return "ring";
    case CollectiveAlgo::kTree:
      return "tree";
    case CollectiveAlgo::kHierarchical:
      return "hierarchical";
  }
  return "unknown";
}

Result<Topology> Topology::Build(TopologySpec spec) {
  KC_LAYER_ENTRY(Layer::kHal, "topology");
  Topology t;
  t.spec_ = std::move(spec);
  KC_RETURN_IF_ERROR(t.Validate());
  t.SuggestGroups();
  return t;
}

Result<Topology> Topology::BuildWithGroups(TopologySpec spec, std::vector<Group> user_groups) {
  KC_ASSIGN_OR_RETURN(Topology t, Build(std::move(spec)));
  if (user_groups.empty()) return t;
  KC_ASSIGN_OR_RETURN(std::vector<Group> groups, t.ResolveGroups(std::move(user_groups)));
  t.suggested_groups_ = std::move(t.groups_);
  t.UseGroups(std::move(groups));
  t.has_user_groups_ = true;
  return t;
}

// Validates spec_ and builds index_, host_of_, host_devices_ and link_index_ on the way.
Status Topology::Validate() {
  const NetworkSpec& net = spec_.network;
  if (!Positive(net.cross_rack_bandwidth_factor) || net.cross_rack_bandwidth_factor > 1) {
    return InvalidArgumentError(
        fmt::format("network: cross_rack_bandwidth_factor must be in (0, 1], got {}",
                    net.cross_rack_bandwidth_factor));
  }
  if (!NonNegative(net.cross_rack_latency)) {
    return InvalidArgumentError(
        fmt::format("network: cross_rack_latency must be >= 0, got {}", net.cross_rack_latency));
  }

  std::unordered_map<std::string_view, int> host_index;
  host_index.reserve(spec_.hosts.size());
  for (size_t h = 0; h < spec_.hosts.size(); ++h) {
    const HostSpec& host = spec_.hosts[h];
    if (host.name.empty()) {
      return InvalidArgumentError(fmt::format("host #{}: empty name", h));
    }
    if (!host_index.try_emplace(host.name, static_cast<int>(h)).second) {
      return InvalidArgumentError(fmt::format("host '{}': declared twice", host.name));
    }
    if (host.intra_host_default) {
      const IntraHostDefault& d = *host.intra_host_default;
      if (!Positive(d.bandwidth) || (d.measured_bandwidth && !Positive(*d.measured_bandwidth))) {
        return InvalidArgumentError(
            fmt::format("host '{}': intra-host default bandwidth must be > 0, got {}", host.name,
                        Positive(d.bandwidth) ? *d.measured_bandwidth : d.bandwidth));
      }
      if (!NonNegative(d.latency) || (d.measured_latency && !NonNegative(*d.measured_latency))) {
        return InvalidArgumentError(
            fmt::format("host '{}': intra-host default latency must be >= 0", host.name));
      }
    }
  }

  const int n = num_devices();
  const bool multi_host = spec_.hosts.size() > 1;
  index_.clear();
  index_.reserve(spec_.devices.size());
  host_of_.assign(spec_.devices.size(), -1);
  host_devices_.assign(spec_.hosts.size(), {});
  for (int i = 0; i < n; ++i) {
    DeviceDescriptor& d = spec_.devices[i];
    if (d.id.empty()) return InvalidArgumentError(fmt::format("device #{}: empty id", i));
    if (!index_.try_emplace(d.id, i).second) {
      return InvalidArgumentError(fmt::format("device '{}': duplicate id", d.id));
    }
    auto host = host_index.find(d.host);
    if (host == host_index.end()) {
      return InvalidArgumentError(
          fmt::format("device '{}': host '{}' is not among the hosts", d.id, d.host));
    }
    auto positive = [&d](double v, std::string_view what) {
      return Positive(v) ? OkStatus()
                         : InvalidArgumentError(
                               fmt::format("device '{}': {} must be > 0, got {}", d.id, what, v));
    };
    if (d.memory_bytes <= 0) {
      return InvalidArgumentError(
          fmt::format("device '{}': memory_bytes must be > 0, got {}", d.id, d.memory_bytes));
    }
    KC_RETURN_IF_ERROR(positive(d.peak_flops_fp32, "peak_flops_fp32"));
    if (!NonNegative(d.peak_flops_bf16)) {
      return InvalidArgumentError(fmt::format("device '{}': peak_flops_bf16 must be >= 0, got {}",
                                              d.id, d.peak_flops_bf16));
    }
    KC_RETURN_IF_ERROR(positive(d.memory_bandwidth, "memory_bandwidth"));
    if (multi_host) {
      KC_RETURN_IF_ERROR(positive(d.network_bandwidth, "network_bandwidth"));
    } else if (!NonNegative(d.network_bandwidth)) {
      return InvalidArgumentError(fmt::format("device '{}': network_bandwidth must be >= 0, got {}",
                                              d.id, d.network_bandwidth));
    }
    if (!NonNegative(d.network_latency)) {
      return InvalidArgumentError(fmt::format("device '{}': network_latency must be >= 0, got {}",
                                              d.id, d.network_latency));
    }
    // One rack per host: the device's and the host's, whichever is declared.
    HostSpec& h = spec_.hosts[host->second];
    if (!d.rack.empty() && h.rack.empty()) h.rack = d.rack;
    if (!d.rack.empty() && d.rack != h.rack) {
      return InvalidArgumentError(fmt::format(
          "device '{}': rack '{}' differs from host '{}' rack '{}'", d.id, d.rack, h.name, h.rack));
    }
    host_of_[i] = host->second;
    host_devices_[host->second].push_back(i);
  }
  for (int i = 0; i < n; ++i) spec_.devices[i].rack = spec_.hosts[host_of_[i]].rack;

  link_index_.clear();
  link_index_.reserve(spec_.links.size());
  for (size_t l = 0; l < spec_.links.size(); ++l) {
    Link& link = spec_.links[l];
    if (link.a < 0 || link.a >= n || link.b < 0 || link.b >= n) {
      return InvalidArgumentError(fmt::format(
          "link #{} ({}, {}): device index out of range [0, {})", l, link.a, link.b, n));
    }
    if (link.a > link.b) std::swap(link.a, link.b);
    const std::string& a = spec_.devices[link.a].id;
    const std::string& b = spec_.devices[link.b].id;
    if (link.a == link.b) {
      return InvalidArgumentError(fmt::format("link #{} '{}' <-> '{}': a link to itself", l, a, b));
    }
    if (host_of_[link.a] != host_of_[link.b]) {
      return InvalidArgumentError(fmt::format(
          "link #{} '{}' <-> '{}': devices of different hosts (the network joins hosts)", l, a, b));
    }
    if (!Positive(link.declared_bandwidth) ||
        (link.measured_bandwidth && !Positive(*link.measured_bandwidth))) {
      return InvalidArgumentError(
          fmt::format("link #{} '{}' <-> '{}': bandwidth must be > 0", l, a, b));
    }
    if (!NonNegative(link.declared_latency) ||
        (link.measured_latency && !NonNegative(*link.measured_latency))) {
      return InvalidArgumentError(
          fmt::format("link #{} '{}' <-> '{}': latency must be >= 0", l, a, b));
    }
    if (!link_index_.try_emplace(PairKey(link.a, link.b, n), static_cast<int>(l)).second) {
      return InvalidArgumentError(fmt::format("link #{} '{}' <-> '{}': duplicate link", l, a, b));
    }
  }
  return OkStatus();
}

std::optional<int> Topology::Find(std::string_view id) const {
  auto it = index_.find(std::string(id));
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

PathCost Topology::Path(int a, int b) const {
  KC_DCHECK(a >= 0 && a < num_devices() && b >= 0 && b < num_devices());
  const DeviceDescriptor& da = spec_.devices[a];
  const DeviceDescriptor& db = spec_.devices[b];
  PathCost p;
  if (a == b) {
    p.bandwidth = da.memory_bandwidth;
    p.kind = LinkKind::kSharedMemory;
    return p;
  }
  const int ha = host_of_[a], hb = host_of_[b];
  if (ha == hb) {
    if (auto it = link_index_.find(PairKey(a, b, num_devices())); it != link_index_.end()) {
      const Link& link = spec_.links[it->second];
      p.bandwidth = link.bandwidth();
      p.latency = link.latency();
      p.kind = link.kind;
    } else if (const auto& d = spec_.hosts[ha].intra_host_default) {
      p.bandwidth = d->effective_bandwidth();
      p.latency = d->effective_latency();
      p.kind = d->kind;
    } else {
      p.bandwidth = kConservativeIntraHostBandwidth;
      p.latency = kConservativeIntraHostLatency;
      p.kind = da.kind == DeviceKind::kCpu && db.kind == DeviceKind::kCpu ? LinkKind::kSharedMemory
                                                                          : LinkKind::kPcie;
    }
    return p;
  }
  p.kind = LinkKind::kNetwork;
  p.crosses_host = true;
  p.bandwidth = std::min(da.network_bandwidth, db.network_bandwidth);
  p.latency = std::max(da.network_latency, db.network_latency);
  const std::string& ra = spec_.hosts[ha].rack;
  const std::string& rb = spec_.hosts[hb].rack;
  if (!ra.empty() && !rb.empty() && ra != rb) {
    p.crosses_rack = true;
    p.bandwidth *= spec_.network.cross_rack_bandwidth_factor;
    p.latency += spec_.network.cross_rack_latency;
  }
  return p;
}

double Topology::TransferSeconds(int a, int b, int64_t bytes) const {
  const PathCost p = Path(a, b);
  return p.latency + static_cast<double>(std::max<int64_t>(bytes, 0)) / p.bandwidth;
}

CollectiveCost Topology::Collective(CollectiveOp op, std::span<const int> devices, int64_t bytes,
                                    CollectiveAlgo algo) const {
  return EstimateCollective(*this, op, devices, bytes, algo, group_of_);
}

CollectiveCost Topology::Collective(CollectiveOp op, std::span<const int> devices, int64_t bytes,
                                    CollectiveAlgo algo, std::span<const Group> groups) const {
  std::vector<int> group_of(spec_.devices.size(), -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int d : groups[g].devices) {
      if (d >= 0 && d < num_devices()) group_of[d] = static_cast<int>(g);
    }
  }
  return EstimateCollective(*this, op, devices, bytes, algo, group_of);
}

// Per host: an edge joins two devices whose path is at least half the host's fastest
// intra-host path; the groups are the connected components. O(k^2) per host of k devices.
void Topology::SuggestGroups() {
  const int n = num_devices();
  std::vector<std::vector<int>> host_links(spec_.hosts.size());
  for (size_t l = 0; l < spec_.links.size(); ++l) {
    host_links[host_of_[spec_.links[l].a]].push_back(static_cast<int>(l));
  }
  groups_.clear();
  group_of_.assign(n, -1);
  std::vector<double> bw;  // k x k path bandwidths of the current host, by local index
  std::vector<int> local(n, -1);
  for (size_t h = 0; h < spec_.hosts.size(); ++h) {
    const std::vector<int>& devs = host_devices_[h];
    const size_t k = devs.size();
    if (k == 0) continue;
    for (size_t i = 0; i < k; ++i) local[devs[i]] = static_cast<int>(i);

    // Every unlinked pair goes through the host default (or the conservative one).
    const auto& host_default = spec_.hosts[h].intra_host_default;
    const double fallback =
        host_default ? host_default->effective_bandwidth() : kConservativeIntraHostBandwidth;
    bw.assign(k * k, fallback);
    for (size_t i = 0; i < k; ++i) bw[i * k + i] = spec_.devices[devs[i]].memory_bandwidth;
    for (int l : host_links[h]) {
      const Link& link = spec_.links[l];
      const size_t i = local[link.a], j = local[link.b];
      bw[i * k + j] = bw[j * k + i] = link.bandwidth();
    }
    double fastest = 0;
    for (size_t i = 0; i < k; ++i) {
      for (size_t j = i + 1; j < k; ++j) fastest = std::max(fastest, bw[i * k + j]);
    }

    DisjointSets sets(static_cast<int>(k));
    for (size_t i = 0; i < k; ++i) {
      for (size_t j = i + 1; j < k; ++j) {
        if (bw[i * k + j] >= 0.5 * fastest) sets.Union(static_cast<int>(i), static_cast<int>(j));
      }
    }
    // Components in order of their smallest member (the root, as Union keeps the minimum).
    std::vector<int> group_of_root(k, -1);
    const size_t first = groups_.size();
    for (size_t i = 0; i < k; ++i) {
      const int root = sets.Find(static_cast<int>(i));
      if (group_of_root[root] < 0) {
        group_of_root[root] = static_cast<int>(groups_.size());
        Group g;
        g.name = fmt::format("{}/g{}", spec_.hosts[h].name, groups_.size() - first);
        groups_.push_back(std::move(g));
      }
      groups_[group_of_root[root]].devices.push_back(devs[i]);
      group_of_[devs[i]] = group_of_root[root];
    }
    for (size_t g = first; g < groups_.size(); ++g) {
      Group& group = groups_[g];
      if (group.devices.size() == 1) {
        group.min_bandwidth = spec_.devices[group.devices[0]].memory_bandwidth;
        continue;
      }
      double slowest = kInf;
      for (size_t x = 0; x < group.devices.size(); ++x) {
        for (size_t y = x + 1; y < group.devices.size(); ++y) {
          slowest = std::min(slowest, bw[local[group.devices[x]] * k + local[group.devices[y]]]);
        }
      }
      group.min_bandwidth = slowest;
    }
  }
}

void Topology::DescribeGroup(Group& g) const {
  g.spans_hosts = g.spans_racks = false;
  if (g.devices.empty()) {
    g.min_bandwidth = 0;
    return;
  }
  if (g.devices.size() == 1) {
    g.min_bandwidth = spec_.devices[g.devices[0]].memory_bandwidth;
    return;
  }
  // Members by host: pairs on one host are looked up; pairs across hosts follow the network
  // rule, whose minimum is min over d of network_bandwidth(d) times the cross-rack factor
  // when d has a member in another declared rack.
  std::unordered_map<int, std::vector<int>> by_host;
  std::unordered_map<std::string_view, int> racks;
  for (int d : g.devices) {
    by_host[host_of_[d]].push_back(d);
    const std::string& rack = spec_.hosts[host_of_[d]].rack;
    if (!rack.empty()) ++racks[rack];
  }
  double slowest = kInf;
  for (const auto& [host, members] : by_host) {
    for (size_t x = 0; x < members.size(); ++x) {
      for (size_t y = x + 1; y < members.size(); ++y) {
        slowest = std::min(slowest, Path(members[x], members[y]).bandwidth);
      }
    }
  }
  if (by_host.size() > 1) {
    g.spans_hosts = true;
    g.spans_racks = racks.size() > 1;
    for (int d : g.devices) {
      double bw = spec_.devices[d].network_bandwidth;
      if (g.spans_racks && !spec_.hosts[host_of_[d]].rack.empty()) {
        bw *= spec_.network.cross_rack_bandwidth_factor;
      }
      slowest = std::min(slowest, bw);
    }
  }
  g.min_bandwidth = slowest;
}

void Topology::UseGroups(std::vector<Group> groups) {
  groups_ = std::move(groups);
  group_of_.assign(spec_.devices.size(), -1);
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (int d : groups_[g].devices) group_of_[d] = static_cast<int>(g);
  }
}

Result<std::vector<Group>> Topology::ResolveGroups(std::vector<Group> user) const {
  KC_LAYER_ENTRY(Layer::kHal, "topology");
  const int n = num_devices();
  std::vector<int> owner(n, -1);
  std::unordered_map<std::string_view, int> names;
  for (size_t g = 0; g < user.size(); ++g) {
    Group& group = user[g];
    if (group.name.empty()) return InvalidArgumentError(fmt::format("group #{}: empty name", g));
    if (!names.try_emplace(group.name, static_cast<int>(g)).second) {
      return InvalidArgumentError(fmt::format("group '{}': duplicate name", group.name));
    }
    if (group.devices.empty()) {
      return InvalidArgumentError(fmt::format("group '{}': no devices", group.name));
    }
    for (int d : group.devices) {
      if (d < 0 || d >= n) {
        return InvalidArgumentError(
            fmt::format("group '{}': device index {} out of range [0, {})", group.name, d, n));
      }
      if (owner[d] >= 0) {
        return InvalidArgumentError(fmt::format("group '{}': device '{}' is already in group '{}'",
                                                group.name, spec_.devices[d].id,
                                                user[owner[d]].name));
      }
      owner[d] = static_cast<int>(g);
    }
    std::sort(group.devices.begin(), group.devices.end());
  }
  for (Group& group : user) DescribeGroup(group);

  // The devices no user group names keep their suggested group.
  std::vector<Group> kept;
  for (const Group& suggested : suggested_groups()) {
    Group rest;
    for (int d : suggested.devices) {
      if (owner[d] < 0) rest.devices.push_back(d);
    }
    if (rest.devices.empty()) continue;
    if (names.contains(suggested.name)) {
      return InvalidArgumentError(fmt::format(
          "group '{}': the name of the suggested group kept for {} unnamed device(s) such as "
          "'{}'; rename it or list those devices",
          suggested.name, rest.devices.size(), spec_.devices[rest.devices[0]].id));
    }
    rest.name = suggested.name;
    if (rest.devices.size() == suggested.devices.size()) {
      rest = suggested;
    } else {
      DescribeGroup(rest);
    }
    kept.push_back(std::move(rest));
  }
  user.insert(user.end(), std::make_move_iterator(kept.begin()),
              std::make_move_iterator(kept.end()));
  return user;
}

}  // namespace kc::hal
