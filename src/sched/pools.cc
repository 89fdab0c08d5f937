#include "sched/pools.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "base/config.h"
#include "hal/inventory.h"

namespace kc::sched {

std::string_view JobClassName(JobClass c) {
  switch (c) {
    case JobClass::kPreemptible:
      return "preemptible";
    case JobClass::kNormal:
      return "normal";
    case JobClass::kHigh:
      return "high";
  }
  return "?";
}

std::optional<JobClass> JobClassFromName(std::string_view name) {
  if (name == "preemptible") return JobClass::kPreemptible;
  if (name == "normal") return JobClass::kNormal;
  if (name == "high") return JobClass::kHigh;
  return std::nullopt;
}

namespace {

Result<PoolConfig> ReadPoolConfig(config::Document doc) {
  PoolConfig out;
  config::Map root = doc.root();
  std::set<std::string> names;
  bool have_rest = false;
  for (config::Map m : root.RequiredMapList("pools")) {
    PoolSpec p;
    p.name = m.String("name");
    if (p.name.empty()) m.Reject("name", "expected a pool name");
    if (!names.insert(p.name).second) m.Reject("name", "used by an earlier pool");
    for (const std::string& c : m.StringList("classes")) {
      std::optional<JobClass> jc = JobClassFromName(c);
      if (!jc) {
        m.Reject("classes", fmt::format("expected classes among high, normal, preemptible; "
                                        "\"{}\" is none of them",
                                        c));
      } else {
        p.classes.push_back(*jc);
      }
    }
    p.teams = m.OptionalStringList("teams");
    int given = 0;
    if (m.Has("devices")) {
      p.devices = static_cast<int>(m.Int("devices", config::Positive()));
      ++given;
    }
    if (m.Has("share")) {
      p.share = m.Double("share", {.min = 0, .max = 1, .min_exclusive = true});
      ++given;
    }
    if (m.Has("hosts")) {
      p.hosts = m.String("hosts");
      ++given;
    }
    if (m.Has("rest")) {
      p.rest = m.Bool("rest");
      if (p.rest) {
        ++given;
        if (have_rest) m.Reject("rest", "only one pool may take the rest");
        have_rest = true;
      }
    }
    if (given != 1) {
      m.Reject("devices", "expected exactly one of devices, share, hosts, rest: true");
    }
    p.lend = m.OptionalBool("lend", true);
    out.pools.push_back(std::move(p));
  }
  config::Map s = root.OptionalMap("scheduler");
  SchedulerSettings& st = out.settings;
  st.fair_share_half_life_s =
      s.OptionalDouble("fair_share_half_life_h", st.fair_share_half_life_s / 3600,
                       config::Positive()) *
      3600;
  st.preempt_grace_s =
      s.OptionalDouble("preempt_grace_s", st.preempt_grace_s, config::NonNegative());
  st.reconfigure_s = s.OptionalDouble("reconfigure_s", st.reconfigure_s, config::NonNegative());
  st.restart_s = s.OptionalDouble("restart_s", st.restart_s, {.min = -1});
  st.demote_faults_per_hour =
      s.OptionalDouble("demote_faults_per_hour", st.demote_faults_per_hour, config::Positive());
  st.demote_min_faults =
      static_cast<int>(s.OptionalInt("demote_min_faults", st.demote_min_faults, {.min = 1}));
  st.backfill_depth =
      static_cast<int>(s.OptionalInt("backfill_depth", st.backfill_depth, {.min = 0}));
  st.grow_min_remaining_s =
      s.OptionalDouble("grow_min_remaining_s", st.grow_min_remaining_s, config::NonNegative());
  st.starve_after_s =
      s.OptionalDouble("starve_after_h", st.starve_after_s / 3600, config::NonNegative()) * 3600;
  st.high_max_wait_s =
      s.OptionalDouble("high_max_wait_s", st.high_max_wait_s, config::NonNegative());
  KC_RETURN_IF_ERROR(doc.Finish());
  if (out.pools.empty()) {
    return InvalidArgumentError(
        fmt::format("{}: pools: expected at least one pool", doc.file_name()));
  }
  return out;
}

}  // namespace

Result<PoolConfig> LoadPoolConfig(const std::string& path) {
  KC_ASSIGN_OR_RETURN(config::Document doc, config::Document::LoadFile(path));
  return ReadPoolConfig(std::move(doc));
}

Result<PoolConfig> LoadPoolConfigString(std::string_view text, std::string display_name) {
  KC_ASSIGN_OR_RETURN(config::Document doc,
                      config::Document::LoadString(text, std::move(display_name)));
  return ReadPoolConfig(std::move(doc));
}

PoolConfig DefaultPoolConfig() {
  PoolConfig c;
  c.pools.push_back({.name = "high", .classes = {JobClass::kHigh}, .share = 0.125});
  c.pools.push_back({.name = "preemptible", .classes = {JobClass::kPreemptible}, .share = 0.25});
  c.pools.push_back({.name = "normal", .classes = {JobClass::kNormal}, .rest = true});
  return c;
}

PoolConfig AllDevicesPoolConfig() {
  PoolConfig c;
  c.pools.push_back({.name = "all",
                     .classes = {JobClass::kHigh, JobClass::kNormal, JobClass::kPreemptible},
                     .rest = true});
  return c;
}

Result<std::vector<Pool>> PartitionPools(const hal::Topology& topology, const PoolConfig& config) {
  const int n = topology.num_devices();
  std::vector<Pool> pools;
  for (const PoolSpec& s : config.pools) pools.push_back({.spec = s, .devices = {}});
  std::vector<int> owner(n, -1);

  // Hosts in topology order: rack by rack (first appearance), file order within a rack.
  std::map<std::string, int> rack_rank;
  for (const hal::HostSpec& h : topology.hosts()) {
    rack_rank.emplace(h.rack, static_cast<int>(rack_rank.size()));
  }
  std::vector<std::vector<int>> host_devices(topology.hosts().size());
  for (int d = 0; d < n; ++d) host_devices[topology.host_of(d)].push_back(d);
  std::vector<int> host_order(topology.hosts().size());
  for (size_t i = 0; i < host_order.size(); ++i) host_order[i] = static_cast<int>(i);
  std::stable_sort(host_order.begin(), host_order.end(), [&](int a, int b) {
    return rack_rank[topology.hosts()[a].rack] < rack_rank[topology.hosts()[b].rack];
  });
  std::map<std::string, int, std::less<>> host_index;
  for (size_t i = 0; i < topology.hosts().size(); ++i) {
    host_index.emplace(topology.hosts()[i].name, static_cast<int>(i));
  }

  auto pool_error = [](const Pool& p, std::string_view what) {
    return InvalidArgumentError(fmt::format("pool \"{}\": {}", p.spec.name, what));
  };
  // Hostlist pools.
  for (size_t i = 0; i < pools.size(); ++i) {
    Pool& p = pools[i];
    if (p.spec.hosts.empty()) continue;
    Result<std::vector<std::string>> names = hal::ExpandHostlist(p.spec.hosts);
    if (!names.ok()) return pool_error(p, names.status().message());
    for (const std::string& h : *names) {
      auto it = host_index.find(h);
      if (it == host_index.end()) {
        return pool_error(p,
                          fmt::format("host \"{}\" is not in cluster \"{}\"", h, topology.name()));
      }
      for (int d : host_devices[it->second]) {
        if (owner[d] >= 0) {
          return pool_error(p, fmt::format("host \"{}\" is already in pool \"{}\"", h,
                                           pools[owner[d]].spec.name));
        }
        owner[d] = static_cast<int>(i);
      }
    }
  }
  // Count and share pools take devices in host order, skipping owned ones.
  std::vector<int> order;
  order.reserve(n);
  for (int h : host_order) {
    for (int d : host_devices[h]) order.push_back(d);
  }
  size_t cursor = 0;
  auto next_free = [&] {
    while (cursor < order.size() && owner[order[cursor]] >= 0) ++cursor;
    return cursor < order.size() ? order[cursor] : -1;
  };
  for (size_t i = 0; i < pools.size(); ++i) {
    const PoolSpec& s = pools[i].spec;
    int want = s.devices;
    if (s.share > 0) want = std::max(1, static_cast<int>(s.share * n + 0.5));
    if (want == 0) continue;
    for (int k = 0; k < want; ++k) {
      int d = next_free();
      if (d < 0) {
        return pool_error(pools[i], fmt::format("asks for {} devices, but only {} of the {} in "
                                                "cluster \"{}\" are left for it",
                                                want, k, n, topology.name()));
      }
      owner[d] = static_cast<int>(i);
    }
  }
  // The rest pool.
  for (size_t i = 0; i < pools.size(); ++i) {
    if (!pools[i].spec.rest) continue;
    for (int d = 0; d < n; ++d) {
      if (owner[d] < 0) owner[d] = static_cast<int>(i);
    }
  }
  for (int d = 0; d < n; ++d) {
    if (owner[d] < 0) {
      int left = static_cast<int>(std::count(owner.begin(), owner.end(), -1));
      return InvalidArgumentError(fmt::format(
          "pools: {} devices of cluster \"{}\" (the first {}) are in no pool; give one pool "
          "`rest: true`",
          left, topology.name(), topology.device(d).id));
    }
    pools[owner[d]].devices.push_back(d);
  }
  for (const Pool& p : pools) {
    if (p.devices.empty()) return pool_error(p, "has no devices left");
  }
  return pools;
}

}  // namespace kc::sched
