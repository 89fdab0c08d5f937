// `kc topo probe | report | serve`.
#include "apps/kc/topo_command.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/train_job.h"
#include "base/log.h"
#include "hal/cpu_devices.h"
#include "hal/cuda_probe.h"
#include "hal/grouping.h"
#include "hal/host_load.h"
#include "hal/host_probe.h"
#include "hal/inventory.h"
#include "hal/measure.h"
#include "hal/probe_server.h"
#include "hal/report.h"
#include "hal/topology.h"

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

std::string GBs(double bytes_per_second) {
  return fmt::format("{:.2f} GB/s", bytes_per_second / 1e9);
}
std::string Micros(double seconds) { return fmt::format("{:.2f} us", seconds * 1e6); }

// Progress on stderr: a redrawn bar on a terminal, one line per phase otherwise.
class Progress {
 public:
  explicit Progress(int phases) : phases_(phases), tty_(isatty(STDERR_FILENO) == 1) {}
  // `fraction` of phase `phase` (0-based) is done.
  void Update(int phase, double fraction, std::string_view what) {
    const double overall = (phase + std::clamp(fraction, 0.0, 1.0)) / phases_;
    if (tty_) {
      const int filled = static_cast<int>(overall * 30);
      std::cerr << fmt::format("\r[{}{}] {:3.0f}% {:<48}", std::string(filled, '#'),
                               std::string(30 - filled, '.'), overall * 100, what)
                << std::flush;
    } else if (what != last_) {
      std::cerr << fmt::format("[{:3.0f}%] {}\n", overall * 100, what);
    }
    last_ = std::string(what);
  }
  void Done() {
    if (tty_) std::cerr << "\r" << std::string(90, ' ') << "\r" << std::flush;
  }

 private:
  const int phases_;
  const bool tty_;
  std::string last_;
};

struct ProbeArgs {
  int cpu_devices = 0;
  std::vector<std::string> peers;  // host:port
  std::string out;
  bool json = false;
  bool quick = false;
  bool no_write = false;
};

struct PeerResult {
  std::string address;
  Result<hal::TcpMeasurement> measurement;
};

Status ParsePeer(const std::string& peer, std::string* host, int* port) {
  const size_t colon = peer.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == peer.size()) {
    return InvalidArgumentError("--peers: expected host:port, got \"" + peer + "\"");
  }
  *host = peer.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);  // [::1]:7070
  }
  const std::string p = peer.substr(colon + 1);
  char* end = nullptr;
  const long value = std::strtol(p.c_str(), &end, 10);
  if (*end != '\0' || value <= 0 || value > 65535) {
    return InvalidArgumentError("--peers: port must be 1-65535 in \"" + peer + "\"");
  }
  *port = static_cast<int>(value);
  return OkStatus();
}

int RunProbe(const ProbeArgs& args) {
  // Validate every argument before measuring anything.
  std::vector<std::pair<std::string, int>> peers;
  for (const std::string& peer : args.peers) {
    std::string host;
    int port = 0;
    if (Status s = ParsePeer(peer, &host, &port); !s.ok()) {
      std::cerr << "kc: " << s.message() << "\n";
      return kExitBadInput;
    }
    peers.emplace_back(host, port);
  }
  Result<hal::HostInfo> info = hal::ProbeHost();
  if (!info.ok()) {
    std::cerr << "kc: topo probe: " << info.status().message() << "\n";
    return kExitFailure;
  }
  if (args.cpu_devices > info->pus) {
    std::cerr << fmt::format(
        "kc: --cpu-devices: {} is more than the {} cores this process may use\n", args.cpu_devices,
        info->pus);
    return kExitBadInput;
  }

  const int phases = 1 + static_cast<int>(peers.size());
  Progress progress(phases);
  Result<hal::HostMeasurement> host = hal::MeasureHost(
      *info, {.quick = args.quick,
              .progress = [&](double f, std::string_view what) { progress.Update(0, f, what); }});
  if (!host.ok()) {
    progress.Done();
    std::cerr << "kc: topo probe: " << host.status().message() << "\n";
    return kExitFailure;
  }
  const hal::StreamMeasurement& stream = host->stream;
  const std::optional<hal::ShmMeasurement>& shm = host->shm;

  std::vector<PeerResult> peer_results;
  for (size_t i = 0; i < peers.size(); ++i) {
    const std::string address = fmt::format("{}:{}", peers[i].first, peers[i].second);
    hal::TcpProbeOptions opts;
    opts.bandwidth_bytes = args.quick ? 16 * hal::kMiB : 64 * hal::kMiB;
    opts.progress = [&, i](double f, std::string_view) {
      progress.Update(1 + static_cast<int>(i), f, "TCP to " + address);
    };
    peer_results.push_back({address, hal::MeasureTcpPeer(peers[i].first, peers[i].second, opts)});
  }
  progress.Done();

  Result<hal::TopologySpec> spec =
      hal::MakeCpuTopologySpec(*info, {.num_devices = args.cpu_devices, .measured = host->cpu});
  if (!spec.ok()) {
    std::cerr << "kc: " << spec.status().message() << "\n";
    return kExitBadInput;
  }
  // GPUs of this host, when the CUDA driver is present (one log line when it is not). On a
  // GPU host the GPUs are the devices jobs run on, so they replace the CPU slices in the
  // topology written (an inventory host holds one device model).
  if (Result<hal::CudaProbeResult> cuda = hal::ProbeCuda(info->hostname); !cuda.ok()) {
    KC_LOG(WARNING) << "CUDA probe failed " << log::KV("status", cuda.status());
  } else if (!cuda->devices.empty()) {
    spec->devices = std::move(cuda->devices);
    spec->links = std::move(cuda->links);
    spec->hosts[0].intra_host_default = cuda->host_default;
  }
  // The slowest peer bounds what this host's devices can count on over the network.
  double net_bw = 0, net_lat = 0;
  for (const PeerResult& p : peer_results) {
    if (!p.measurement.ok()) continue;
    net_bw = net_bw == 0 ? p.measurement->bandwidth : std::min(net_bw, p.measurement->bandwidth);
    net_lat = std::max(net_lat, p.measurement->latency);
  }
  if (net_bw > 0) {
    for (hal::DeviceDescriptor& d : spec->devices) {
      d.network_bandwidth = net_bw;
      d.network_latency = net_lat;
    }
  }

  const std::string out = args.out.empty() ? UserConfigPath("topology.yaml") : args.out;
  std::string written;
  if (!args.no_write) {
    Result<std::string> yaml = hal::InventoryToYaml(*spec);
    Status s = yaml.ok() ? WriteFileAtomically(out, *yaml) : yaml.status();
    if (!s.ok()) {
      std::cerr << "kc: topo probe: " << s.message() << "\n";
      return kExitFailure;
    }
    written = out;
  }

  const double ratio =
      shm && stream.copy_bytes_per_second > 0 ? shm->bandwidth / stream.copy_bytes_per_second : 0;
  if (args.json) {
    nlohmann::json j = {{"hostname", info->hostname},
                        {"cpu_model", info->cpu_model},
                        {"packages", info->packages},
                        {"cores", info->cores},
                        {"pus", info->pus},
                        {"memory_bytes", info->memory_bytes},
                        {"numa_nodes", nlohmann::json::array()},
                        {"caches", nlohmann::json::array()},
                        {"devices", nlohmann::json::array()},
                        {"stream_copy_bytes_per_second", stream.copy_bytes_per_second},
                        {"sgemm_flops_per_core", host->sgemm_flops_per_core},
                        {"peers", nlohmann::json::array()}};
    for (const hal::NumaNode& n : info->numa_nodes) {
      j["numa_nodes"].push_back(
          {{"os_index", n.os_index}, {"memory_bytes", n.memory_bytes}, {"cpus", n.cpus}});
    }
    for (const hal::CacheLevel& c : info->caches) {
      j["caches"].push_back({{"level", c.level}, {"size_bytes", c.size_bytes}, {"count", c.count}});
    }
    for (const hal::DeviceDescriptor& d : spec->devices) {
      j["devices"].push_back({{"id", d.id},
                              {"kind", hal::DeviceKindName(d.kind)},
                              {"model", d.model},
                              {"cpus", d.cpus},
                              {"numa_node", d.numa_node},
                              {"memory_bytes", d.memory_bytes}});
    }
    if (shm) {
      j["shm"] = {{"bandwidth_bytes_per_second", shm->bandwidth},
                  {"latency_seconds", shm->latency},
                  {"ratio_to_stream_copy", ratio}};
    }
    for (const PeerResult& p : peer_results) {
      nlohmann::json pj = {{"address", p.address}};
      if (p.measurement.ok()) {
        pj["bandwidth_bytes_per_second"] = p.measurement->bandwidth;
        pj["latency_seconds"] = p.measurement->latency;
      } else {
        pj["error"] = p.measurement.status().ToString();
      }
      j["peers"].push_back(pj);
    }
    if (!written.empty()) j["written"] = written;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << fmt::format("host     {}\n", info->hostname);
    std::cout << fmt::format("cpu      {} ({} package{}, {} cores, {} hardware threads)\n",
                             info->cpu_model.empty() ? "unknown model" : info->cpu_model,
                             info->packages, info->packages == 1 ? "" : "s", info->cores,
                             info->pus);
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
    for (const hal::DeviceDescriptor& d : spec->devices) {
      std::cout << fmt::format("device   {:<16} {:<9} {}{}\n", d.id, hal::DeviceKindName(d.kind),
                               d.cpus.empty() ? d.model : "cpus " + CpuList(d.cpus),
                               d.memory_bytes > 0 ? ", " + Bytes(d.memory_bytes) : "");
    }
    std::cout << fmt::format("measured STREAM copy {} (one core)\n",
                             GBs(stream.copy_bytes_per_second));
    std::cout << fmt::format("measured sgemm {:.1f} GFLOP/s (one core, fp32)\n",
                             host->sgemm_flops_per_core / 1e9);
    if (shm) {
      std::cout << fmt::format(
          "measured shared memory {} process to process ({:.0f}% of STREAM copy), latency {}\n",
          GBs(shm->bandwidth), ratio * 100, Micros(shm->latency));
    } else {
      std::cout << "measured shared memory: skipped (one core only)\n";
    }
    for (const PeerResult& p : peer_results) {
      if (p.measurement.ok()) {
        std::cout << fmt::format("peer     {} {}, latency {}\n", p.address,
                                 GBs(p.measurement->bandwidth), Micros(p.measurement->latency));
      } else {
        std::cout << fmt::format("peer     {} FAILED: {}\n", p.address,
                                 p.measurement.status().message());
      }
    }
    if (!written.empty()) std::cout << fmt::format("wrote    {}\n", written);
  }
  for (const PeerResult& p : peer_results) {
    if (!p.measurement.ok()) return kExitFailure;
  }
  return kExitOk;
}

struct ReportArgs {
  std::string inventory;
  std::string groups;
  std::string write_groups;
  int64_t allreduce_bytes = 0;  // 0: the report's default
  bool json = false;
};

int RunReport(const ReportArgs& args) {
  Result<hal::HostInfo> info = hal::ProbeHost();
  if (!info.ok()) {
    std::cerr << "kc: topo report: " << info.status().message() << "\n";
    return kExitFailure;
  }
  // What this machine has, to compare with what the inventory declares for it.
  Result<hal::TopologySpec> local = hal::MakeCpuTopologySpec(*info, {});
  if (!local.ok()) {
    std::cerr << "kc: topo report: " << local.status().message() << "\n";
    return kExitFailure;
  }
  hal::ProbeFindings findings{.host = info->hostname, .device_ids = {}};
  for (const hal::DeviceDescriptor& d : local->devices) findings.device_ids.push_back(d.id);
  if (Result<hal::CudaProbeResult> cuda = hal::ProbeCuda(info->hostname); cuda.ok()) {
    for (const hal::DeviceDescriptor& d : cuda->devices) findings.device_ids.push_back(d.id);
  }

  std::string source = args.inventory;
  if (source.empty() && std::filesystem::exists(UserConfigPath("topology.yaml"))) {
    source = UserConfigPath("topology.yaml");
  }
  Result<hal::TopologySpec> spec = source.empty() ? local : hal::LoadInventory(source);
  if (!spec.ok()) {
    std::cerr << "kc: " << spec.status().message() << "\n";
    return kExitBadInput;
  }
  Result<hal::Topology> topology = hal::Topology::Build(*spec);
  if (!topology.ok()) {
    std::cerr << "kc: " << (source.empty() ? "" : source + ": ") << topology.status().message()
              << "\n";
    return kExitBadInput;
  }
  hal::ReportOptions options;
  if (args.allreduce_bytes > 0) options.allreduce_bytes = args.allreduce_bytes;
  bool describes_this_host = false;
  for (const hal::HostSpec& h : spec->hosts) describes_this_host |= h.name == info->hostname;
  if (describes_this_host) options.probe = findings;
  if (!args.groups.empty()) {
    Result<std::vector<hal::Group>> groups = hal::LoadGrouping(args.groups, *spec);
    if (!groups.ok()) {
      std::cerr << "kc: " << groups.status().message() << "\n";
      return kExitBadInput;
    }
    options.user_groups = *std::move(groups);
  }
  const hal::TopologyReport report = hal::MakeReport(*topology, options);
  if (!args.write_groups.empty()) {
    if (Status s =
            WriteFileAtomically(args.write_groups, hal::GroupingToYaml(report.groups, *spec));
        !s.ok()) {
      std::cerr << "kc: topo report: " << s.message() << "\n";
      return kExitFailure;
    }
  }
  std::cout << (args.json ? hal::RenderReportJson(report) : hal::RenderReportText(report));
  if (!args.json && !source.empty()) std::cout << "source: " << source << "\n";
  if (!args.write_groups.empty() && !args.json) {
    std::cout << "wrote groups to " << args.write_groups << " (edit, then pass --groups)\n";
  }
  return kExitOk;
}

struct ServeArgs {
  std::string bind = "0.0.0.0";
  int port = 7070;
};

int RunServe(const ServeArgs& args) {
  // Block the stop signals before any thread starts, then wait for one with sigwait.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  Result<std::unique_ptr<hal::ProbeServer>> server =
      hal::ProbeServer::Start({.bind_address = args.bind, .port = args.port});
  if (!server.ok()) {
    std::cerr << "kc: topo serve: " << server.status().message() << "\n";
    return server.status().code() == ErrorCode::kInvalidArgument ? kExitBadInput : kExitFailure;
  }
  std::cout << fmt::format("kc topo serve: listening on {}:{} (Ctrl-C to stop)\n", args.bind,
                           (*server)->port())
            << std::flush;
  int sig = 0;
  sigwait(&stop, &sig);
  (*server)->Stop();
  std::cout << "kc topo serve: stopped\n";
  return kExitOk;
}

struct LoadArgs {
  std::vector<int> pids;
  double window_s = 0.5;
  std::string host;
  bool json = false;
};

// What the cores of some processes (a run: its launcher, with its ranks below it) do now.
int RunLoad(const LoadArgs& a) {
  Result<hal::HostLoad> load = hal::MeasureHostLoad(
      {.roots = a.pids,
       .window = std::chrono::milliseconds(static_cast<int64_t>(a.window_s * 1e3))});
  if (!load.ok()) {
    std::cerr << "kc topo load: " << load.status().message() << "\n";
    return load.status().code() == ErrorCode::kInvalidArgument ? kExitBadInput : kExitFailure;
  }
  const kc::v1::HostLoadReport r =
      api::ToHostLoadReport(*load, a.host.empty() ? hal::HostName() : a.host, 0);
  if (a.json) {
    std::cout << api::ReportJson(r) << "\n";
    return kExitOk;
  }
  std::cout << fmt::format("{}: {} process{} of the run, over {:.1f} s\n", r.host(),
                           load->run_processes, load->run_processes == 1 ? "" : "es", r.window_s());
  for (const kc::v1::HostLoadReport::Core& c : r.cores()) {
    std::cout << fmt::format(
        "  core {:>3}: busy {:>3.0f}%, the run {:>3.0f}%, stolen {:>2.0f}%, "
        "{:.1f} GFLOP/s\n",
        c.cpu(), 100 * c.busy(), 100 * c.run(), 100 * c.steal(), c.sgemm_flops() / 1e9);
  }
  std::cout << fmt::format("  copy: {:.1f} GB/s (8 MiB arrays)\n", r.copy_bytes_per_s() / 1e9);
  for (const kc::v1::HostLoadReport::Process& p : r.others()) {
    std::cout << fmt::format("  other: pid {} ({}) {:.0f}% of a core, on core {}\n", p.pid(),
                             p.command(), 100 * p.cpu_share(), p.cpu());
  }
  return kExitOk;
}

}  // namespace

void AddTopoCommand(CLI::App& app, Action* action) {
  CLI::App* topo = app.add_subcommand("topo", "Probe, measure and report the device topology");
  topo->require_subcommand(1);

  CLI::App* probe = topo->add_subcommand(
      "probe", "Probe this host, measure its links and write the topology file");
  auto pa = std::make_shared<ProbeArgs>();
  probe
      ->add_option("--cpu-devices", pa->cpu_devices,
                   "Split the cores into N CPU devices (default: one per NUMA node)")
      ->check(CLI::NonNegativeNumber);
  probe->add_option("--peers", pa->peers, "Measure TCP to these `kc topo serve` peers (host:port)")
      ->delimiter(',');
  probe->add_option("--out", pa->out,
                    "Topology file to write (default: " + UserConfigPath("topology.yaml") + ")");
  probe->add_flag("--no-write", pa->no_write, "Measure and print only");
  probe->add_flag("--quick", pa->quick, "Smaller measurements (less accurate, about 1 s)");
  probe->add_flag("--json", pa->json, "Print JSON instead of a table");
  probe->callback([action, pa] { *action = [pa] { return RunProbe(*pa); }; });

  CLI::App* report =
      topo->add_subcommand("report", "Suggest groups and communication paths; flag anomalies");
  auto ra = std::make_shared<ReportArgs>();
  report->add_option(
      "--inventory", ra->inventory,
      "Inventory or topology file (default: the probed topology file, else this host)");
  report->add_option("--groups", ra->groups,
                     "Your grouping file to check instead of the suggested groups");
  report->add_option("--write-groups", ra->write_groups, "Write the groups in use to this file");
  report
      ->add_option("--allreduce-bytes", ra->allreduce_bytes,
                   "Size of the all-reduce the advice estimates, in bytes (default 1 GiB); "
                   "kc bench comm --inventory chooses by the same estimate")
      ->check(CLI::PositiveNumber);
  report->add_flag("--json", ra->json, "Print JSON instead of text");
  report->callback([action, ra] { *action = [ra] { return RunReport(*ra); }; });

  CLI::App* load = topo->add_subcommand(
      "load",
      "What the cores of a run's processes do now: how busy, with whose work, and each core's "
      "rate (kc diagnose --live runs it on each of a run's hosts)");
  auto la = std::make_shared<LoadArgs>();
  load->add_option("pids", la->pids, "The run's processes (its launcher): these and below them")
      ->required();
  load->add_option("--window", la->window_s, "Seconds the load is measured over")
      ->check(CLI::Range(0.01, 10.0));
  load->add_option("--host", la->host, "The host's name in the report (default: this machine's)");
  load->add_flag("--json", la->json, "Print the report as JSON (kc.v1.HostLoadReport)");
  load->callback([action, la] { *action = [la] { return RunLoad(*la); }; });

  CLI::App* serve = topo->add_subcommand("serve", "Answer other hosts' `kc topo probe --peers`");
  auto sa = std::make_shared<ServeArgs>();
  serve->add_option("--bind", sa->bind, "Address to listen on");
  serve->add_option("--port", sa->port, "TCP port (0: any free port)")->check(CLI::Range(0, 65535));
  serve->callback([action, sa] { *action = [sa] { return RunServe(*sa); }; });
}

}  // namespace kc::app
