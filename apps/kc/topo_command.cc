#include "apps/kc/topo_command.h"

#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "base/log.h"
#include "hal/host_probe.h"

namespace kc::app {
namespace {

std::string Bytes(int64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string CpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? std::to_string(cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

int RunProbe(bool json) {
  Result<hal::HostInfo> info = hal::ProbeHost();
  if (!info.ok()) {
    KC_LOG(ERROR) << "topo probe failed " << log::KV("status", info.status());
    return kExitFailure;
  }
  if (json) {
    nlohmann::json j = {{"hostname", info->hostname}, {"cpu_model", info->cpu_model},
                        {"packages", info->packages}, {"cores", info->cores},
                        {"pus", info->pus},           {"memory_bytes", info->memory_bytes}};
    for (const hal::NumaNode& n : info->numa_nodes) {
      j["numa_nodes"].push_back(
          {{"os_index", n.os_index}, {"memory_bytes", n.memory_bytes}, {"cpus", n.cpus}});
    }
    for (const hal::CacheLevel& c : info->caches) {
      j["caches"].push_back({{"level", c.level}, {"size_bytes", c.size_bytes}, {"count", c.count}});
    }
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << fmt::format("host     {}\n", info->hostname);
  std::cout << fmt::format("cpu      {} ({} package{}, {} cores, {} hardware threads)\n",
                           info->cpu_model.empty() ? "unknown model" : info->cpu_model,
                           info->packages, info->packages == 1 ? "" : "s", info->cores, info->pus);
  std::cout << fmt::format("memory   {}\n", Bytes(info->memory_bytes));
  for (const hal::NumaNode& n : info->numa_nodes) {
    std::cout << fmt::format("numa     node {}: cpus {}, {}\n", n.os_index, CpuList(n.cpus),
                             Bytes(n.memory_bytes));
  }
  std::string caches;
  for (const hal::CacheLevel& c : info->caches) {
    if (!caches.empty()) caches += ", ";
    caches += fmt::format("L{} {} x{}", c.level, Bytes(c.size_bytes), c.count);
  }
  std::cout << fmt::format("caches   {}\n", caches.empty() ? "none reported" : caches);
  return kExitOk;
}

}  // namespace

void AddTopoCommand(CLI::App& app, Action* action) {
  CLI::App* topo = app.add_subcommand("topo", "Probe and report the device topology");
  topo->require_subcommand(1);
  CLI::App* probe = topo->add_subcommand("probe", "Probe this host's CPUs, caches, NUMA, memory");
  auto json = std::make_shared<bool>(false);
  probe->add_flag("--json", *json, "Print JSON instead of a table");
  probe->callback([action, json] { *action = [json] { return RunProbe(*json); }; });
}

}  // namespace kc::app
