#include "hal/host_probe.h"

#include <hwloc.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <climits>
#include <memory>

#include "base/layer_guard.h"

namespace kc::hal {
namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using Topology = std::unique_ptr<hwloc_topology, TopologyDeleter>;

int Count(hwloc_topology_t topo, hwloc_obj_type_t type) {
  const int n = hwloc_get_nbobjs_by_type(topo, type);
  return n < 0 ? 0 : n;
}

}  // namespace

Result<HostInfo> ProbeHost() {
  KC_LAYER_ENTRY(Layer::kHal, "probe");
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return UnavailableError("hwloc: topology init failed");
  Topology topo(raw);
  if (hwloc_topology_load(topo.get()) != 0) {
    return UnavailableError("hwloc: topology load failed");
  }
  HostInfo info;
  char host[HOST_NAME_MAX + 1] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) info.hostname = host;
  info.packages = Count(topo.get(), HWLOC_OBJ_PACKAGE);
  info.cores = Count(topo.get(), HWLOC_OBJ_CORE);
  info.pus = Count(topo.get(), HWLOC_OBJ_PU);
  hwloc_obj_t root = hwloc_get_root_obj(topo.get());
  info.memory_bytes = static_cast<int64_t>(root->total_memory);
  if (hwloc_obj_t pkg = hwloc_get_obj_by_type(topo.get(), HWLOC_OBJ_PACKAGE, 0)) {
    if (const char* model = hwloc_obj_get_info_by_name(pkg, "CPUModel")) info.cpu_model = model;
    while (!info.cpu_model.empty() && info.cpu_model.back() == ' ') info.cpu_model.pop_back();
  }
  for (int i = 0; i < Count(topo.get(), HWLOC_OBJ_NUMANODE); ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(topo.get(), HWLOC_OBJ_NUMANODE, i);
    NumaNode n;
    n.os_index = static_cast<int>(node->os_index);
    n.memory_bytes = static_cast<int64_t>(node->attr->numanode.local_memory);
    unsigned cpu;
    hwloc_bitmap_foreach_begin(cpu, node->cpuset) { n.cpus.push_back(static_cast<int>(cpu)); }
    hwloc_bitmap_foreach_end();
    info.numa_nodes.push_back(std::move(n));
  }
  // Virtual machines with hot-plugged memory report less per node in sysfs than the kernel
  // manages; the kernel's total is the truth for the host, and for its only node.
  struct sysinfo si;
  if (sysinfo(&si) == 0) {
    const int64_t kernel_total = static_cast<int64_t>(si.totalram) * si.mem_unit;
    if (kernel_total > info.memory_bytes) info.memory_bytes = kernel_total;
    if (info.numa_nodes.size() == 1) info.numa_nodes[0].memory_bytes = info.memory_bytes;
  }
  const hwloc_obj_type_t kCaches[] = {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE};
  for (int level = 1; level <= 3; ++level) {
    const int count = Count(topo.get(), kCaches[level - 1]);
    if (count == 0) continue;
    hwloc_obj_t c = hwloc_get_obj_by_type(topo.get(), kCaches[level - 1], 0);
    info.caches.push_back(
        {.level = level, .size_bytes = static_cast<int64_t>(c->attr->cache.size), .count = count});
  }
  return info;
}

}  // namespace kc::hal
