#include "apps/kc/diagnose_live.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

#include "api/train_job.h"
#include "apps/kc/command.h"
#include "apps/kc/kcd_client.h"
#include "base/clock.h"
#include "hal/host_load.h"
#include "hal/inventory.h"
#include "kc/v1/jobs.grpc.pb.h"
#include "kc/v1/topology.grpc.pb.h"

namespace kc::app::diagnose {
namespace {

namespace fs = std::filesystem;

// --live: where every rank of a running run is, from its supervisor.

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Per host, the mean per-core figures of the run's devices there (HostLoadReport.devices), as
// the cluster's inventory declares or kc topo probe measured them.
Result<std::map<std::string, InventoryRates>> InventoryOf(Session& s, const Live& live) {
  kc::v1::TopologyInfo topo;
  KC_RETURN_IF_ERROR(
      s.Call(&kc::v1::TopologyService::Stub::Get, kc::v1::GetTopologyRequest(), &topo));
  KC_ASSIGN_OR_RETURN(hal::TopologySpec spec,
                      hal::LoadInventoryString(topo.inventory(), "topology.yaml"));
  std::map<std::string, InventoryRates> out;
  for (const kc::v1::HostLoadReport& h : live.hosts) {
    double flops = 0, cores = 0;
    for (const std::string& id : h.devices()) {
      for (const hal::DeviceDescriptor& d : spec.devices) {
        if (d.id != id || d.cpus.empty()) continue;
        flops += d.peak_flops_fp32;
        cores += static_cast<double>(d.cpus.size());
      }
    }
    if (cores > 0) out[h.host()] = {.flops = flops / cores};
  }
  return out;
}

// What the launcher measured as the run started, when `now` is of the same host: a local run's,
// or a kcd run's on one host (the launcher of a run across hosts is on a supervisor agent, a
// machine of its own). Null: nothing to compare with.
const kc::v1::HostLoadReport* StartOf(const RunRecords& r, const Live& live,
                                      const kc::v1::HostLoadReport& now) {
  if (!r.start) return nullptr;
  if (r.here ? r.start->host() != now.host() : live.hosts.size() != 1) return nullptr;
  return &*r.start;
}

// The sgemm rate of core `cpu` in `start` (StartOf); 0: unknown.
double StartRate(const kc::v1::HostLoadReport* start, int cpu) {
  if (start == nullptr) return 0;
  for (const kc::v1::HostLoadReport::Core& c : start->cores()) {
    if (c.cpu() == cpu) return c.sgemm_flops();
  }
  return 0;
}

Duration SecondsOf(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

}  // namespace

// A local run: the request beside its metrics, the answer waited for there; its host's load
// measured here when the run is on this machine.
Result<Live> InspectRun(const std::string& run, const RunRecords& r, double wait_s) {
  const fs::path dir = fs::is_directory(run) ? fs::path(run) : fs::path(run).parent_path();
  if (r.summary.is_object()) {
    return FailedPreconditionError(
        fmt::format("{}: the run has ended (its summary is recorded): nothing live to ask", run));
  }
  const int64_t request = static_cast<int64_t>(UnixNow() * 1e3);
  KC_RETURN_IF_ERROR(api::WriteInspectRequest(dir.string(), request));
  const TimePoint until = Clock::Real()->Now() + SecondsOf(wait_s);
  const fs::path answer = dir / api::kInspectAnswerFile;
  Live live;
  for (;;) {
    std::ifstream in(answer);
    const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in && google::protobuf::util::JsonStringToMessage(got, &live.progress).ok() &&
        live.progress.request() == request) {
      break;
    }
    if (Clock::Real()->Now() >= until) {
      return DeadlineExceededError(fmt::format(
          "{}: no answer within {:g} s (--wait): its kc train is not running (a run killed "
          "leaves no summary), or its launcher is stuck",
          run, wait_s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the answer is a file
  }
  const std::string host = r.header.value("host", std::string());
  const int pid = static_cast<int>(r.header.value("pid", int64_t{0}));
  if (host != hal::HostName() || pid <= 0) {
    live.notes.push_back(
        fmt::format("the run's host ({}) is not this machine: its load is not "
                    "measured from here",
                    host.empty() ? "not recorded" : host));
  } else if (Result<hal::HostLoad> load = hal::MeasureHostLoad({.roots = {pid}}); load.ok()) {
    live.hosts.push_back(api::ToHostLoadReport(*load, host, request));
  } else {
    live.notes.push_back(fmt::format("host load: {}", load.status().message()));
  }
  return live;
}

// A kcd job: JobService.Inspect, then its records until the answers are among them: the
// supervisor's, and each host's load (or the wait is over: those missing are noted).
Result<Live> InspectJob(int64_t id, const std::string& login, double wait_s) {
  KC_ASSIGN_OR_RETURN(Session s, Session::Open(login));
  kc::v1::InspectJobRequest ask;
  ask.set_id(id);
  kc::v1::InspectJobResponse asked;
  KC_RETURN_IF_ERROR(s.Call(&kc::v1::JobService::Stub::Inspect, ask, &asked));
  const TimePoint until = Clock::Real()->Now() + SecondsOf(wait_s);
  Live live;
  bool answered = false;
  std::set<std::string> measured;
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the answers ride heartbeats
    kc::v1::JobRecordsRequest req;
    req.set_id(id);
    kc::v1::JobRecordsResponse resp;
    KC_RETURN_IF_ERROR(s.Call(&kc::v1::JobService::Stub::Records, req, &resp));
    for (const kc::v1::TrainReport& t : resp.reports()) {
      if (t.run_id() != asked.run_id()) continue;
      if (t.has_progress() && t.progress().request() == asked.request() && !answered) {
        live.progress = t.progress();
        answered = true;
      }
      if (t.has_host() && t.host().request() == asked.request() &&
          measured.insert(t.host().host()).second) {
        live.hosts.push_back(t.host());
      }
    }
  } while ((!answered || measured.size() < static_cast<size_t>(asked.hosts_size())) &&
           Clock::Real()->Now() < until);
  if (!answered) {
    return DeadlineExceededError(fmt::format(
        "job {}: no answer from {} within {:g} s (--wait): its agent or launcher did not answer "
        "(is the agent up?)",
        id, asked.run_id(), wait_s));
  }
  for (const std::string& h : asked.hosts()) {
    if (measured.count(h) == 0) {
      live.notes.push_back(fmt::format("host {}: its agent sent no load within --wait", h));
    }
  }
  if (Result<std::map<std::string, InventoryRates>> inv = InventoryOf(s, live); inv.ok()) {
    live.inventory = *std::move(inv);
  } else {
    live.notes.push_back(
        fmt::format("the inventory's figures are not compared: {}", inv.status().message()));
  }
  return live;
}

// The answer for people: who holds up whom, then each rank's newest operations per group.
std::vector<std::string> LiveLines(const kc::v1::ProgressReport& p) {
  std::vector<std::string> out;
  out.push_back(p.hang().empty() ? "no rank waits in a collective: every one is between them"
                                 : p.hang());
  for (const kc::v1::ProgressReport::Rank& rank : p.ranks()) {
    if (!rank.published()) {
      out.push_back(fmt::format("worker {}: nothing published yet (no heartbeat since it started)",
                                rank.worker()));
      continue;
    }
    if (rank.groups().empty()) {
      out.push_back(fmt::format("worker {}: no communicator (between generations, or starting)",
                                rank.worker()));
    }
    for (const kc::v1::ProgressReport::Group& g : rank.groups()) {
      std::vector<std::string> ops;
      const int shown = std::min(g.ops_size(), 4);
      for (int i = g.ops_size() - shown; i < g.ops_size(); ++i) {
        const kc::v1::ProgressReport::Op& o = g.ops(i);
        ops.push_back(fmt::format(
            "{} #{} ({:.1f} MB) {}", o.op(), o.seq(), static_cast<double>(o.bytes()) / 1e6,
            o.took_s() < 0    ? fmt::format("in it for {:.1f} s", o.ago_s())
            : o.took_s() == 0 ? std::string("finished")  // within a tick of the coarse clock
                              : fmt::format("took {:.0f} ms", o.took_s() * 1e3)));
      }
      out.push_back(fmt::format("worker {} {}: {}", rank.worker(), g.group(),
                                ops.empty() ? std::string("no operation yet")
                                            : fmt::format("{}", fmt::join(ops, " | "))));
    }
  }
  return out;
}

// Each host's load for people: its cores (busy, the run's share, the rate now and at the
// start), then the processes outside the run on them.
std::vector<std::string> LoadLines(const Live& live, const RunRecords& r) {
  std::vector<std::string> out;
  for (const kc::v1::HostLoadReport& h : live.hosts) {
    const kc::v1::HostLoadReport* start = StartOf(r, live, h);
    std::vector<std::string> cores;
    for (const kc::v1::HostLoadReport::Core& c : h.cores()) {
      std::string rate;
      if (c.sgemm_flops() > 0) {
        rate = fmt::format(", {:.1f} GFLOP/s", c.sgemm_flops() / 1e9);
        if (const double then = StartRate(start, c.cpu()); then > 0) {
          rate += fmt::format(" ({:.1f} at the start)", then / 1e9);
        }
      }
      cores.push_back(fmt::format(
          "core {} busy {:.0f}% (the run {:.0f}%){}{}", c.cpu(), 100 * c.busy(), 100 * c.run(),
          rate,
          c.steal() >= 0.01 ? fmt::format(", stolen {:.0f}%", 100 * c.steal()) : std::string()));
    }
    out.push_back(
        fmt::format("host {} ({:.1f} s): {}", h.host(), h.window_s(), fmt::join(cores, " | ")));
    if (h.copy_bytes_per_s() > 0) {
      std::string then;
      if (start != nullptr && start->copy_bytes_per_s() > 0) {
        then = fmt::format(" ({:.1f} at the start)", start->copy_bytes_per_s() / 1e9);
      }
      out.push_back(fmt::format("  copy {:.1f} GB/s{} (8 MiB arrays){}", h.copy_bytes_per_s() / 1e9,
                                then,
                                live.inventory.count(h.host()) != 0
                                    ? fmt::format("; the inventory: {:.1f} GFLOP/s a core",
                                                  live.inventory.at(h.host()).flops / 1e9)
                                    : std::string()));
    }
    std::vector<std::string> others;
    for (const kc::v1::HostLoadReport::Process& p : h.others()) {
      others.push_back(fmt::format("pid {} ({}) {:.0f}% of a core, on core {}", p.pid(),
                                   p.command(), 100 * p.cpu_share(), p.cpu()));
    }
    if (!others.empty()) {
      out.push_back(fmt::format("  others on its cores: {}", fmt::join(others, "; ")));
    }
  }
  for (const std::string& n : live.notes) out.push_back(n);
  return out;
}

// What the hosts' loads say: other work on the run's cores (L4), a core computing slower than
// at the run's start (L1), a hypervisor taking the cores (L1).
std::vector<Finding> LoadFindings(const Live& live, const RunRecords& r) {
  std::vector<Finding> out;
  for (const kc::v1::HostLoadReport& h : live.hosts) {
    const kc::v1::HostLoadReport* start = StartOf(r, live, h);
    double others = 0;
    std::vector<std::string> who;
    for (const kc::v1::HostLoadReport::Process& p : h.others()) {
      others += p.cpu_share();
      if (who.size() < 3) {
        who.push_back(fmt::format("pid {} ({}) {:.0f}% of core {}", p.pid(), p.command(),
                                  100 * p.cpu_share(), p.cpu()));
      }
    }
    if (others >= 0.2) {
      out.push_back(
          {.layer = 4,
           .fault = true,
           .what = fmt::format("other work on the run's cores on {}: {:.0f}% of a core", h.host(),
                               100 * others),
           .evidence =
               fmt::format("measured now over {:.1f} s: {}", h.window_s(), fmt::join(who, "; ")),
           .fix = "move that work (or the run) off these cores: on a kc cluster, jobs get cores "
                  "of their own, so this is a process outside kc, or a job pinned by hand"});
    }
    std::vector<std::string> slow;
    double worst = 1;
    for (const kc::v1::HostLoadReport::Core& c : h.cores()) {
      const double then = StartRate(start, c.cpu());
      if (then <= 0 || c.sgemm_flops() <= 0) continue;
      const double ratio = c.sgemm_flops() / then;
      if (ratio < 0.7) {
        slow.push_back(fmt::format("core {}: {:.1f} GFLOP/s, {:.1f} at the start ({:.2f}x)",
                                   c.cpu(), c.sgemm_flops() / 1e9, then / 1e9, ratio));
        worst = std::min(worst, ratio);
      }
    }
    if (!slow.empty()) {
      out.push_back({.layer = 1,
                     .fault = true,
                     .what = fmt::format("a core computes {:.2f}x what it did at the run's start "
                                         "on {}: throttled",
                                         worst, h.host()),
                     .evidence = fmt::format("{} (a short sgemm pinned to each, now and as the "
                                             "run started)",
                                             fmt::join(slow, "; ")),
                     .fix = "a core slowed by heat or a power cap: look at its frequency "
                            "(cpupower frequency-info) and temperature; kc topo probe measures "
                            "the host again"});
    }
    // Memory: the copy now against the start's (the same host) and the inventory's.
    if (start != nullptr && start->copy_bytes_per_s() > 0 && h.copy_bytes_per_s() > 0 &&
        h.copy_bytes_per_s() < 0.5 * start->copy_bytes_per_s()) {
      out.push_back(
          {.layer = 1,
           .fault = true,
           .what = fmt::format("memory copies at {:.2f}x the run's start on {}",
                               h.copy_bytes_per_s() / start->copy_bytes_per_s(), h.host()),
           .evidence = fmt::format("{:.1f} GB/s now, {:.1f} GB/s as the run started (a copy of "
                                   "8 MiB arrays)",
                                   h.copy_bytes_per_s() / 1e9, start->copy_bytes_per_s() / 1e9),
           .fix = "memory bandwidth taken by other work on the host (another job's copies), or "
                  "a throttled memory controller: look at what else runs there"});
    }
    if (const auto inv = live.inventory.find(h.host()); inv != live.inventory.end()) {
      std::vector<double> rates;
      for (const kc::v1::HostLoadReport::Core& c : h.cores()) {
        if (c.sgemm_flops() > 0) rates.push_back(c.sgemm_flops());
      }
      const double now = Median(rates);
      std::vector<std::string> below;
      if (inv->second.flops > 0 && now > 0 && now < 0.7 * inv->second.flops) {
        below.push_back(
            fmt::format("compute {:.1f} GFLOP/s a core (the median), the inventory "
                        "{:.1f}",
                        now / 1e9, inv->second.flops / 1e9));
      }
      if (!below.empty()) {
        out.push_back({.layer = 1,
                       .fault = false,
                       .what = fmt::format("the run's devices on {} do less than the inventory "
                                           "says",
                                           h.host()),
                       .evidence = fmt::format("{} (measured now)", fmt::join(below, "; ")),
                       .fix = "a throttled device, or an inventory whose figures are not this "
                              "machine's: kc topo probe measures them and writes what it "
                              "finds"});
      }
    }
    for (const kc::v1::HostLoadReport::Core& c : h.cores()) {
      if (c.steal() < 0.1) continue;
      out.push_back({.layer = 1,
                     .fault = false,
                     .what = fmt::format("the hypervisor takes {:.0f}% of core {} on {}",
                                         100 * c.steal(), c.cpu(), h.host()),
                     .evidence = "steal time in /proc/stat over the window",
                     .fix = "the virtual machine's cores are shared with other machines: ask for "
                            "dedicated cores, or expect the steps to vary"});
    }
  }
  return out;
}

}  // namespace kc::app::diagnose
