#include "hal/host_load.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "base/layer_guard.h"
#include "hal/measure.h"

namespace kc::hal {
namespace {

// The numeric entries of a /proc directory.
std::vector<int> NumericEntries(const std::string& dir) {
  std::vector<int> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long v = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && v > 0) out.push_back(static_cast<int>(v));
  }
  closedir(d);
  return out;
}

// The fields of a /proc/.../stat line after the command (field 3 onwards: state, ppid, ...).
std::vector<std::string> StatFields(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return {};
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream rest(line.substr(close + 1));
  std::vector<std::string> out;
  for (std::string f; rest >> f;) out.push_back(f);
  return out;
}

struct Task {
  int pid = 0;          // its process
  long long ticks = 0;  // utime + stime
  int cpu = -1;         // last ran on
};

// Every thread of every process: tid -> its process, CPU time and last core.
std::map<int, Task> ReadTasks() {
  std::map<int, Task> out;
  for (int pid : NumericEntries("/proc")) {
    const std::string task_dir = "/proc/" + std::to_string(pid) + "/task";
    for (int tid : NumericEntries(task_dir)) {
      const std::vector<std::string> f = StatFields(task_dir + "/" + std::to_string(tid) + "/stat");
      if (f.size() < 37) continue;  // gone meanwhile
      out[tid] = {.pid = pid,
                  .ticks = std::atoll(f[11].c_str()) + std::atoll(f[12].c_str()),
                  .cpu = std::atoi(f[36].c_str())};
    }
  }
  return out;
}

// pid -> parent pid, for every process.
std::map<int, int> ReadParents() {
  std::map<int, int> out;
  for (int pid : NumericEntries("/proc")) {
    const std::vector<std::string> f = StatFields("/proc/" + std::to_string(pid) + "/stat");
    if (f.size() >= 2) out[pid] = std::atoi(f[1].c_str());
  }
  return out;
}

struct CpuTimes {
  long long total = 0, idle = 0, steal = 0;
};

// /proc/stat's per-CPU lines.
std::map<int, CpuTimes> ReadCpuTimes() {
  std::map<int, CpuTimes> out;
  std::ifstream in("/proc/stat");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || line[3] < '0' || line[3] > '9') continue;
    std::istringstream s(line.substr(3));
    int cpu = 0;
    long long v[8] = {};  // user nice system idle iowait irq softirq steal
    s >> cpu;
    for (long long& x : v) s >> x;
    CpuTimes t;
    for (long long x : v) t.total += x;
    t.idle = v[3] + v[4];
    t.steal = v[7];
    out[cpu] = t;
  }
  return out;
}

std::string Comm(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string c;
  std::getline(in, c);
  return c;
}

std::vector<int> CpusOf(const cpu_set_t& set) {
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

// The sgemm rate of core `cpu` now, this thread pinned to it meanwhile; 0 when it may not
// run there.
double RateOn(int cpu, const cpu_set_t& mine) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof one, &one) != 0) return 0;
  // The device's threads are made inside, pinned as this thread is.
  Result<double> r = MeasureSgemmFlops({.n = 256, .threads = 1, .repetitions = 5});
  sched_setaffinity(0, sizeof mine, &mine);
  return r.ok() ? *r : 0;
}

// Bytes per second of a copy between two 8 MiB arrays (past most per-core caches) on this
// thread, where the scheduler puts it (pinned to a loaded core, a thread can wait long for its
// slices): the best of up to 8 passes, each a few milliseconds, within about a second. 0 when
// the arrays cannot be had.
double CopyRate() {
  constexpr size_t kBytes = 8 << 20;
  double best = 0;
  std::vector<char> a(kBytes, 1), b(kBytes, 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (int pass = 0; pass < 8 && (pass < 2 || std::chrono::steady_clock::now() < until); ++pass) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), kBytes);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s > 0) best = std::max(best, static_cast<double>(kBytes) / s);
    a[static_cast<size_t>(pass)] = b[kBytes - 1 - static_cast<size_t>(pass)];  // kept
  }
  return best;
}

}  // namespace

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

Result<HostLoad> MeasureHostLoad(const HostLoadOptions& o) {
  KC_LAYER_ENTRY(Layer::kHal, "host_load");
  if (o.roots.empty()) return InvalidArgumentError("host load: no process of the run given");
  if (o.window < std::chrono::milliseconds(10) || o.window > std::chrono::seconds(10)) {
    return InvalidArgumentError("host load: the window must be within [10 ms, 10 s]");
  }
  // The run's processes: the roots alive, and their descendants.
  const std::map<int, int> parents = ReadParents();
  if (parents.empty()) return UnavailableError("host load: /proc cannot be read");
  std::set<int> run;
  for (int r : o.roots) {
    if (parents.count(r) != 0) run.insert(r);
  }
  if (run.empty()) {
    std::string pids;
    for (int r : o.roots) pids += (pids.empty() ? "" : ", ") + std::to_string(r);
    return NotFoundError("host load: no process of the run is alive on this host (pid " + pids +
                         ")");
  }
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& [pid, parent] : parents) {
      if (run.count(parent) != 0 && run.insert(pid).second) grew = true;
    }
  }
  // Its cores: where the descendants may run (the roots, launchers, are usually unpinned).
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) {
    return UnavailableError("host load: this process's CPUs cannot be read");
  }
  std::set<int> cores;
  for (int pid : run) {
    if (std::count(o.roots.begin(), o.roots.end(), pid) != 0) continue;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(pid, sizeof set, &set) != 0) continue;
    for (int c : CpusOf(set)) cores.insert(c);
  }
  if (cores.empty()) {
    for (int c : CpusOf(mine)) cores.insert(c);
  }

  const std::map<int, CpuTimes> cpu0 = ReadCpuTimes();
  const std::map<int, Task> tasks0 = ReadTasks();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(o.window);  // the window measured
  const std::map<int, CpuTimes> cpu1 = ReadCpuTimes();
  const std::map<int, Task> tasks1 = ReadTasks();
  const double window_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double tick = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));

  HostLoad out{.window_s = window_s, .run_processes = static_cast<int>(run.size())};
  std::map<int, double> run_on;        // core -> the run's CPU seconds there
  std::map<int, OtherProcess> others;  // pid -> its share
  for (const auto& [tid, t] : tasks1) {
    const auto before = tasks0.find(tid);
    const long long ticks = t.ticks - (before == tasks0.end() ? 0 : before->second.ticks);
    if (ticks <= 0 || cores.count(t.cpu) == 0) continue;
    const double seconds = static_cast<double>(ticks) * tick;
    if (run.count(t.pid) != 0) {
      run_on[t.cpu] += seconds;
    } else if (t.pid != getpid()) {
      OtherProcess& p = others[t.pid];
      p.pid = t.pid;
      p.cpu_share += seconds / window_s;
      p.cpu = t.cpu;
    }
  }
  for (int c : cores) {
    CoreLoad l{.cpu = c};
    const auto a = cpu0.find(c), b = cpu1.find(c);
    if (a != cpu0.end() && b != cpu1.end() && b->second.total > a->second.total) {
      const double total = static_cast<double>(b->second.total - a->second.total);
      l.busy = 1 - static_cast<double>(b->second.idle - a->second.idle) / total;
      l.steal = static_cast<double>(b->second.steal - a->second.steal) / total;
    }
    // (Two clocks, ticks apart: the run's share is held within what the core did.)
    l.run = std::min(std::max(l.busy, 0.0), run_on[c] / window_s);
    out.cores.push_back(l);
  }
  for (auto& [pid, p] : others) {
    if (p.cpu_share < 0.02) continue;
    p.command = Comm(pid);
    out.others.push_back(std::move(p));
  }
  std::sort(out.others.begin(), out.others.end(),
            [](const OtherProcess& a, const OtherProcess& b) { return a.cpu_share > b.cpu_share; });
  if (o.measure_rates) {
    int measured = 0;
    for (CoreLoad& l : out.cores) {
      if (measured++ >= o.max_rate_cores) break;
      l.sgemm_flops = RateOn(l.cpu, mine);
    }
    out.copy_bytes_per_s = CopyRate();
  }
  return out;
}

}  // namespace kc::hal
