#include "sched/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <numeric>
#include <unordered_map>

#include "base/layer_guard.h"

namespace kc::sched {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A decaying integral of a rate (devices in use): Slurm-style fair-share usage.
struct Meter {
  double value = 0;
  double rate = 0;
  double stamp = 0;
  void Advance(double now, double half_life) {
    const double dt = now - stamp;
    if (dt <= 0) return;
    const double d = std::exp2(-dt / half_life);
    value = value * d + rate * half_life / std::numbers::ln2 * (1 - d);
    stamp = now;
  }
};

std::string Seconds(double s) {
  if (!std::isfinite(s)) return "unknown";
  if (s < 120) return fmt::format("{:.0f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  return fmt::format("{:.1f} h", s / 3600);
}

}  // namespace

std::string_view DecisionKindName(DecisionKind kind) {
  switch (kind) {
    case DecisionKind::kStart:
      return "start";
    case DecisionKind::kPreempt:
      return "preempt";
    case DecisionKind::kShrink:
      return "shrink";
    case DecisionKind::kGrow:
      return "grow";
    case DecisionKind::kDemote:
      return "demote";
    case DecisionKind::kPromote:
      return "promote";
    case DecisionKind::kInterval:
      return "interval";
  }
  return "?";
}

struct Scheduler::Impl {
  struct PoolRt {
    Pool pool;
    std::vector<int> hosts;                   // topology host indices, in pool order
    std::vector<std::vector<int>> host_devs;  // this pool's devices on each of them
    int free = 0;                             // up and unowned devices
    // This pass: the reservation of the first blocked job, and the memo of failed
    // preemption searches (the smallest need that failed, per level).
    int reserved_for = -1;
    double shadow_s = kInf;
    int extra = 0;
    int preempt_failed[3] = {0, 0, 0};
    // The same for plans spanning the pools a job of this home pool may use, and for those
    // of its overdue high-priority jobs (normal jobs are victims too).
    int spread_failed[3] = {0, 0, 0};
    int overdue_failed[3] = {0, 0, 0};
  };

  struct Job {
    JobRequest req;
    JobClass job_class = JobClass::kNormal;
    int home = 0;
    int level = 0;
    JobState state = JobState::kPending;
    std::vector<int> devices;
    std::vector<int> in_pool;  // of its devices, how many each pool holds (SetDevices)
    int run_pool = -1;
    bool borrowed = false;
    double submit_s = 0;
    double seg_start_s = 0;
    double last_ckpt_s = 0;
    double work_total = kInf;
    double work_base = 0;  // estimated work done at seg_start_s
    double work_ckpt = 0;  // estimated work done at the last checkpoint
    double run_before_s = 0;
    double fault_window_s = 0;  // running time since the last demotion
    int faults_window = 0;
    int faults = 0;
    int preemptions = 0;
    bool started = false;
    double interval_s = 0;
    double placed_s = -1;        // when it was last started or reshaped
    int base = 0;                // devices it started with, or fewer after a shrink (ShrinkFloor)
    double pending_since_s = 0;  // when it last joined the queue
    double queued_s = 0;         // its time pending before that
    bool starving = false;       // pending starve_after_s in all (Starve)
    double advised_s = 0;        // when interval_s was last advised (Readvise)
    int team = 0;
    int user = 0;
    std::string reason;
  };

  const hal::Topology* topo = nullptr;  // outlives the scheduler (Create's contract)
  PoolConfig config;
  SchedulerOptions options;
  std::vector<PoolRt> pools;
  std::vector<int> pool_of;    // device -> pool
  std::vector<int> host_rack;  // host -> rack number
  std::vector<int> owner;      // device -> job index, -1 free
  std::vector<char> down;
  std::vector<Job> jobs;
  std::unordered_map<std::string, int> job_index;
  std::vector<int> pending;  // job indices, any order
  std::vector<int> running;
  std::vector<Decision> decisions;  // since the last pass
  CheckpointAdvisor advisor;
  std::map<CheckpointAdvisor::Key, std::pair<int, double>> exposure;  // running count, stamp
  std::unordered_map<std::string, int> team_index, user_index;
  std::vector<Meter> team_usage, user_usage;
  std::vector<int> users_in_team;
  std::vector<int> team_of_user;
  double now = 0;
  // While planning for an overdue high-priority job (SchedulerSettings::high_max_wait_s):
  // normal jobs are victims too.
  bool overdue_plan = false;

  // ---- bookkeeping -------------------------------------------------------------------------

  double HalfLife() const { return config.settings.fair_share_half_life_s; }

  void Advance(double t) {
    if (t > now) now = t;
    for (auto& [key, e] : exposure) {
      if (e.first > 0) advisor.AddExposure(key, e.first * (now - e.second));
      e.second = now;
    }
  }

  CheckpointAdvisor::Key KeyOf(const Job& j) const {
    return {.pool = j.run_pool, .job_class = static_cast<int>(j.job_class), .borrowed = j.borrowed};
  }

  void SetRate(Job& j, double delta) {
    Meter& tm = team_usage[j.team];
    tm.Advance(now, HalfLife());
    tm.rate += delta;
    Meter& um = user_usage[j.user];
    um.Advance(now, HalfLife());
    um.rate += delta;
  }

  bool KindMatches(int d, const std::string& kind) const {
    if (kind.empty()) return true;
    const hal::DeviceDescriptor& dev = topo->device(d);
    return dev.model == kind || hal::DeviceKindName(dev.kind) == kind;
  }

  bool IsFree(int d) const { return owner[d] < 0 && !down[d]; }

  void Take(int job, const std::vector<int>& devs) {
    for (int d : devs) {
      owner[d] = job;
      --pools[pool_of[d]].free;
    }
  }
  void Release(const std::vector<int>& devs) {
    for (int d : devs) {
      owner[d] = -1;
      if (!down[d]) ++pools[pool_of[d]].free;
    }
  }

  // Estimated progress rate of a job on n devices, its checkpoints' pauses included.
  double Rate(const Job& j, int n) const {
    double eff = 1;
    if (j.interval_s > 0) eff = j.interval_s / (j.interval_s + j.req.checkpoint_cost_s);
    return n * eff;
  }
  double WorkNow(const Job& j) const {
    return j.work_base +
           Rate(j, static_cast<int>(j.devices.size())) * std::max(0.0, now - j.seg_start_s);
  }
  double ExpectedEnd(const Job& j) const {
    if (!std::isfinite(j.work_total)) return kInf;
    return j.seg_start_s +
           std::max(0.0, j.work_total - j.work_base) / Rate(j, static_cast<int>(j.devices.size()));
  }
  double RestartS(const Job& j) const {
    return config.settings.restart_s >= 0 ? config.settings.restart_s : j.req.checkpoint_cost_s;
  }
  // Device-seconds a preemption now would cost the job.
  double PreemptCost(const Job& j) const {
    const double n = static_cast<double>(j.devices.size());
    const double grace = config.settings.preempt_grace_s;
    double lost = j.req.checkpoint_cost_s <= grace
                      ? j.req.checkpoint_cost_s
                      : std::max(0.0, now - std::max(j.last_ckpt_s, j.seg_start_s)) +
                            std::min(j.req.checkpoint_cost_s, grace);
    return (lost + RestartS(j)) * n;
  }

  double IntervalFor(const Job& j) const {
    CheckpointAdvisor::Key key = KeyOf(j);
    if (options.checkpoint == CheckpointPolicy::kSeedRule || options.policy == Policy::kFifo) {
      return SeedRuleInterval(CheckpointAdvisor::PreemptionLikely(key));
    }
    CheckpointAdvice a = advisor.Advise(key, j.req.checkpoint_cost_s);
    if (j.faults > 0) {
      // The job's own faults add to its pool's rate (an hour at least of running behind them).
      const double run = std::max(3600.0, j.run_before_s + std::max(0.0, now - j.seg_start_s));
      const double mtbi = 1 / (1 / a.mtbi_s + j.faults / run);
      return DalyInterval(j.req.checkpoint_cost_s, mtbi);
    }
    return a.interval_s;
  }

  void StartRunning(int ji, std::vector<int> devs, int pool, bool borrowed, double delay_s) {
    Job& j = jobs[ji];
    Take(ji, devs);
    SetDevices(j, std::move(devs));
    j.state = JobState::kRunning;
    j.run_pool = pool;
    j.borrowed = borrowed;
    j.seg_start_s = now + delay_s;
    j.last_ckpt_s = j.seg_start_s;
    j.work_ckpt = j.work_base;
    j.interval_s = IntervalFor(j);
    j.advised_s = now;
    j.started = true;
    j.placed_s = now;
    j.base = static_cast<int>(j.devices.size());
    j.queued_s += now - j.pending_since_s;
    j.reason.clear();
    running.push_back(ji);
    SetRate(j, static_cast<double>(j.devices.size()));
    exposure[KeyOf(j)].first += 1;
  }

  // Takes a running job off its devices (they stay owned by nobody; the caller gives them
  // on). `saved`: its work up to now survives, else it rolls back to its last checkpoint.
  void StopRunning(int ji, bool saved, JobState next) {
    Job& j = jobs[ji];
    const double work = WorkNow(j);
    j.run_before_s += std::max(0.0, now - j.seg_start_s);
    j.fault_window_s += std::max(0.0, now - j.seg_start_s);
    exposure[KeyOf(j)].first -= 1;
    SetRate(j, -static_cast<double>(j.devices.size()));
    Release(j.devices);
    SetDevices(j, {});
    j.work_base = saved ? work : j.work_ckpt;
    j.state = next;
    j.run_pool = -1;
    j.borrowed = false;
    running.erase(std::find(running.begin(), running.end(), ji));
    if (next == JobState::kPending) {
      pending.push_back(ji);
      j.pending_since_s = now;
    }
  }

  // Changes a running job's devices in place (shrink, grow), keeping its work.
  void Reshape(int ji, std::vector<int> devs, double delay_s) {
    Job& j = jobs[ji];
    const double work = WorkNow(j);
    const double old_n = static_cast<double>(j.devices.size());
    std::vector<int> keep_sorted = devs;
    std::sort(keep_sorted.begin(), keep_sorted.end());
    std::vector<int> dropped;
    for (int d : j.devices) {
      if (!std::binary_search(keep_sorted.begin(), keep_sorted.end(), d)) dropped.push_back(d);
    }
    Release(dropped);
    std::vector<int> added;
    for (int d : devs) {
      if (owner[d] != ji) added.push_back(d);
    }
    Take(ji, added);
    j.run_before_s += std::max(0.0, now - j.seg_start_s);
    j.fault_window_s += std::max(0.0, now - j.seg_start_s);
    SetDevices(j, std::move(devs));
    j.base = std::min(j.base, static_cast<int>(j.devices.size()));
    j.work_base = work;
    j.seg_start_s = now + delay_s;
    j.placed_s = now;
    SetRate(j, static_cast<double>(j.devices.size()) - old_n);
    // Growing onto lent devices, or shrinking off them, changes whether it borrows.
    const auto [pool, borrowed] = RunPool(j.devices, j.home);
    if (pool != j.run_pool || borrowed != j.borrowed) {
      exposure[KeyOf(j)].first -= 1;
      j.run_pool = pool;
      j.borrowed = borrowed;
      exposure[KeyOf(j)].first += 1;
      j.interval_s = IntervalFor(j);
      j.advised_s = now;
    }
  }

  // The pool a job on `devs` runs on: the one holding most of them (`home` on a tie), and
  // whether it borrows (any device is another pool's).
  std::pair<int, bool> RunPool(const std::vector<int>& devs, int home) const {
    std::map<int, int> per_pool;
    for (int d : devs) ++per_pool[pool_of[d]];
    int primary = home;
    for (auto [pi, c] : per_pool) {
      if (c > per_pool[primary]) primary = pi;
    }
    return {primary, per_pool.size() > 1 || primary != home};
  }

  // ---- placement ---------------------------------------------------------------------------

  // How many of job j's devices are in pool pi.
  int CountIn(const Job& j, int pi) const { return j.in_pool.empty() ? 0 : j.in_pool[pi]; }
  // The only way a job's devices change: keeps in_pool (CountIn, a hot path of PlanPreempt)
  // in step with them.
  void SetDevices(Job& j, std::vector<int> devs) const {
    j.devices = std::move(devs);
    j.in_pool.assign(pools.size(), 0);
    for (int d : j.devices) ++j.in_pool[pool_of[d]];
  }

  // Picks devices for a job from the pools `ps`: between min and max (multiples of tp), all of
  // `kind`, among those free(d) allows. Fills one host (best fit, one fast group inside it
  // when possible) before spanning hosts, and one rack (best fit) before spanning racks;
  // every host contributes a multiple of tp, so tensor-parallel groups stay inside hosts.
  // `one_host`: never spans hosts. Empty when fewer than min fit.
  template <typename FreeFn>
  std::vector<int> Place(const std::vector<int>& ps, int min, int max, int tp, bool one_host,
                         const std::string& kind, const FreeFn& free) const {
    struct Avail {
      int host = 0;
      std::vector<int> devs;
      int usable = 0;
    };
    std::map<int, Avail> by_host;
    for (int pi : ps) {
      const PoolRt& p = pools[pi];
      for (size_t e = 0; e < p.hosts.size(); ++e) {
        Avail* a = nullptr;
        for (int d : p.host_devs[e]) {
          if (!free(d) || !KindMatches(d, kind)) continue;
          if (a == nullptr) {
            a = &by_host[p.hosts[e]];
            a->host = p.hosts[e];
          }
          a->devs.push_back(d);
        }
      }
    }
    std::vector<Avail> avail;
    int total = 0;
    for (auto& [h, a] : by_host) {
      a.usable = static_cast<int>(a.devs.size()) - static_cast<int>(a.devs.size()) % tp;
      if (a.usable == 0) continue;
      std::sort(a.devs.begin(), a.devs.end());
      total = one_host ? std::max(total, a.usable) : total + a.usable;
      avail.push_back(std::move(a));
    }
    int n = std::min(max, total);
    n -= n % tp;
    if (n < min || n <= 0) return {};
    // One host: the fullest one that fits (best fit).
    const Avail* best = nullptr;
    for (const Avail& a : avail) {
      if (a.usable >= n && (best == nullptr || a.usable < best->usable)) best = &a;
    }
    if (best != nullptr) return PickOnHost(best->devs, n);
    // Several hosts: the rack that fits best, else racks from the largest.
    std::map<int, std::pair<int, std::vector<const Avail*>>> racks;
    for (const Avail& a : avail) {
      auto& r = racks[host_rack[a.host]];
      r.first += a.usable;
      r.second.push_back(&a);
    }
    std::vector<std::pair<int, std::vector<const Avail*>>*> order;
    for (auto& [rack, r] : racks) order.push_back(&r);
    std::stable_sort(order.begin(), order.end(),
                     [](auto* a, auto* b) { return a->first > b->first; });
    auto fit = std::find_if(order.rbegin(), order.rend(), [n](auto* r) { return r->first >= n; });
    if (fit != order.rend()) order = {*fit};
    std::vector<int> out;
    for (auto* r : order) {
      std::vector<const Avail*> hosts = r->second;
      std::stable_sort(hosts.begin(), hosts.end(),
                       [](const Avail* a, const Avail* b) { return a->usable > b->usable; });
      for (const Avail* a : hosts) {
        int take = std::min(a->usable, n - static_cast<int>(out.size()));
        take -= take % tp;
        std::vector<int> picked = PickOnHost(a->devs, take);
        out.insert(out.end(), picked.begin(), picked.end());
        if (static_cast<int>(out.size()) == n) return out;
      }
    }
    return out;
  }

  // n devices of one host: the smallest fast group that holds them, else groups largest first.
  std::vector<int> PickOnHost(const std::vector<int>& devs, int n) const {
    std::map<int, std::vector<int>> groups;
    for (int d : devs) groups[topo->group_of(d)].push_back(d);
    const std::vector<int>* best = nullptr;
    for (auto& [g, members] : groups) {
      if (static_cast<int>(members.size()) >= n &&
          (best == nullptr || members.size() < best->size())) {
        best = &members;
      }
    }
    if (best != nullptr) return {best->begin(), best->begin() + n};
    std::vector<const std::vector<int>*> order;
    for (auto& [g, members] : groups) order.push_back(&members);
    std::stable_sort(order.begin(), order.end(),
                     [](auto* a, auto* b) { return a->size() > b->size(); });
    std::vector<int> out;
    for (auto* m : order) {
      for (int d : *m) {
        if (static_cast<int>(out.size()) == n) break;
        out.push_back(d);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string Where(const std::vector<int>& devs) const {
    std::vector<int> hosts, racks;
    for (int d : devs) hosts.push_back(topo->host_of(d));
    std::sort(hosts.begin(), hosts.end());
    hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
    std::vector<std::string> rack_names;
    for (int h : hosts) rack_names.push_back(topo->hosts()[h].rack);
    std::sort(rack_names.begin(), rack_names.end());
    rack_names.erase(std::unique(rack_names.begin(), rack_names.end()), rack_names.end());
    return fmt::format("{} devices on {} host{}{}", devs.size(), hosts.size(),
                       hosts.size() == 1 ? "" : "s",
                       rack_names.size() > 1 ? fmt::format(" in {} racks", rack_names.size()) : "");
  }

  // ---- the pass ----------------------------------------------------------------------------

  int FreeOfKind(const PoolRt& p, const std::string& kind) const {
    if (kind.empty()) return p.free;
    int n = 0;
    for (int d : p.pool.devices) n += IsFree(d) && KindMatches(d, kind);
    return n;
  }
  int CapacityOfKind(const PoolRt& p, const std::string& kind) const {
    int n = 0;
    for (int d : p.pool.devices) n += !down[d] && KindMatches(d, kind);
    return n;
  }
  std::vector<int> Lenders(int home) const {
    std::vector<int> out;
    for (size_t pi = 0; pi < pools.size(); ++pi) {
      if (static_cast<int>(pi) != home && pools[pi].pool.spec.lend) {
        out.push_back(static_cast<int>(pi));
      }
    }
    return out;
  }

  // Sets job ji's reservation (it is its home pool's first blocked job): when enough running
  // jobs will have ended for its minimum, and how many devices are spare then on each pool.
  // A job larger than its home pool reserves the lending pools too, those no job ahead of it
  // has reserved this pass: nothing new starts on them that would delay it (EASY backfill
  // across pools). The spare devices of each pool are what the job will not need from it,
  // taking from its home pool first.
  void Reserve(int ji) {
    const Job& j = jobs[ji];
    std::vector<int> ps = {j.home};
    if (j.starving || j.req.min_devices > CapacityOfKind(pools[j.home], j.req.kind)) {
      for (int pi : Lenders(j.home)) {
        if (pools[pi].reserved_for < 0) ps.push_back(pi);
      }
    }
    std::vector<int> avail(pools.size(), 0);
    int have = 0;
    for (int pi : ps) {
      avail[pi] = FreeOfKind(pools[pi], j.req.kind);
      have += avail[pi];
    }
    struct End {
      double time_s;
      int job;
    };
    std::vector<End> ends;
    for (int ri : running) {
      const Job& r = jobs[ri];
      if (std::any_of(r.devices.begin(), r.devices.end(), [&](int d) {
            return std::find(ps.begin(), ps.end(), pool_of[d]) != ps.end();
          })) {
        ends.push_back({ExpectedEnd(r), ri});
      }
    }
    std::sort(ends.begin(), ends.end(), [](const End& a, const End& b) {
      return a.time_s != b.time_s ? a.time_s < b.time_s : a.job < b.job;
    });
    double shadow = kInf;
    for (const End& e : ends) {
      if (have >= j.req.min_devices) break;
      for (int d : jobs[e.job].devices) {
        if (!down[d] && KindMatches(d, j.req.kind) &&
            std::find(ps.begin(), ps.end(), pool_of[d]) != ps.end()) {
          ++avail[pool_of[d]];
          ++have;
        }
      }
      shadow = e.time_s;
    }
    if (have < j.req.min_devices) shadow = kInf;
    int need = j.req.min_devices;
    for (int pi : ps) {
      PoolRt& p = pools[pi];
      const int take = std::min(need, avail[pi]);
      need -= take;
      p.reserved_for = ji;
      p.shadow_s = shadow;
      p.extra = std::isfinite(shadow) ? avail[pi] - take : 0;
    }
  }

  // A decision about job j as it is now (devices, pool, interval, level).
  Decision MakeDecision(DecisionKind kind, const Job& j, std::string reason,
                        bool resume = false) const {
    return {.kind = kind,
            .time_s = now,
            .job = j.req.id,
            .devices = j.devices,
            .after = {},
            .resume = resume,
            .borrowed = j.borrowed,
            .pool = j.run_pool >= 0 ? pools[j.run_pool].pool.spec.name : "",
            .save = false,
            .checkpoint_interval_s = j.interval_s,
            .level = j.level,
            .reason = std::move(reason)};
  }

  // Drops job ji's reservations of this pass (it starts after all).
  void Unreserve(int ji) {
    for (PoolRt& p : pools) {
      if (p.reserved_for != ji) continue;
      p.reserved_for = -1;
      p.shadow_s = kInf;
      p.extra = 0;
    }
  }

  // The devices job j needs to end within `s` seconds of running; INT_MAX when no count
  // does (unknown duration, or no time).
  int DevicesToEndWithin(const Job& j, double s) const {
    if (!std::isfinite(j.work_total) || s <= 0) return std::numeric_limits<int>::max();
    const double per_device = Rate(j, 1) * s;
    const double n = std::ceil((j.work_total - j.work_base) / per_device - 1e-9);
    return n > j.req.max_devices ? std::numeric_limits<int>::max()
                                 : std::max(1, static_cast<int>(n));
  }

  // Tries to place job ji on the pools `ps` now, respecting their reservations: a reserved
  // pool is used only by a job that ends before its shadow time (given enough devices), or,
  // when the job runs on that one pool, on its spare devices; when borrowing, a reserved pool
  // it would delay is left out. Appends the start decision and returns true on success.
  bool TryStart(int ji, const std::vector<int>& ps) {
    Job& j = jobs[ji];
    const int tp = j.req.tp;
    const double delay = j.started ? RestartS(j) : 0;
    int need = j.req.min_devices;
    int max = j.req.max_devices;
    PoolRt* spare_of = nullptr;
    std::string note;
    std::vector<int> use;
    for (int pi : ps) {
      PoolRt& p = pools[pi];
      if (p.reserved_for < 0) {
        use.push_back(pi);
        continue;
      }
      const int k = DevicesToEndWithin(j, p.shadow_s - now - delay);
      if (k <= max) {
        need = std::max(need, (k + tp - 1) / tp * tp);
        use.push_back(pi);
        note += fmt::format("; backfilled: ends before {}'s reservation at {}",
                            jobs[p.reserved_for].req.id, Seconds(p.shadow_s - now));
        continue;
      }
      if (ps.size() > 1) continue;
      max = std::min(max, p.extra - p.extra % tp);
      spare_of = &p;
      use.push_back(pi);
      note += fmt::format("; backfilled on the spare devices of {}'s reservation",
                          jobs[p.reserved_for].req.id);
    }
    if (use.empty() || need > max) return false;
    int free = 0;
    for (int pi : use) free += FreeOfKind(pools[pi], j.req.kind);
    if (free < need) return false;
    std::vector<int> devs =
        Place(use, need, max, tp, j.req.one_host, j.req.kind, [this](int d) { return IsFree(d); });
    if (devs.empty()) return false;
    if (spare_of != nullptr) spare_of->extra -= static_cast<int>(devs.size());
    std::map<int, int> per_pool;
    for (int d : devs) ++per_pool[pool_of[d]];
    const auto [primary, borrowed] = RunPool(devs, j.home);
    const bool resume = j.started;
    const double queued = now - j.submit_s;
    StartRunning(ji, std::move(devs), primary, borrowed, delay);
    std::string lent;
    for (auto [pi, c] : per_pool) {
      if (pi != j.home)
        lent += fmt::format("{}{} lent by pool {}", lent.empty() ? "" : ", ", c,
                            pools[pi].pool.spec.name);
    }
    decisions.push_back(MakeDecision(
        DecisionKind::kStart, j,
        fmt::format("pool {}: {}{}{}{}", pools[j.home].pool.spec.name, Where(j.devices),
                    lent.empty() ? "" : fmt::format(" ({}; preemptible while lent)", lent),
                    resume ? "; resumed from its checkpoint" : "",
                    note.empty() ? fmt::format("; waited {}", Seconds(queued)) : note),
        resume));
    return true;
  }

  // May job `victim` be preempted for job `j`, which would run on pool pi?
  // A lending pool's job takes its devices back from borrowers of its level or below, except
  // from a starving job of its level: that one borrowed what its reservation held for it.
  bool Preemptible(const Job& victim, const Job& j, int pi) const {
    if (victim.placed_s == now || CountIn(victim, pi) == 0) return false;  // not in its own pass
    if (victim.home != pi && j.home == pi &&
        (victim.level < j.level || (victim.level == j.level && !victim.starving))) {
      return true;  // reclaim
    }
    if (overdue_plan && victim.level < j.level) return true;
    return victim.level == 0 && j.level > 0;
  }
  // How far job j may shrink `victim` on pool pi instead: to its minimum for a job of a
  // higher level, or of the pool that lent it devices there (an elastic job gives back what it
  // borrowed whatever the taker's level); for a job of its own level, only the devices it grew
  // onto while no one waited, above those it started with. Its size when not at all.
  int ShrinkFloor(const Job& victim, const Job& j, int pi) const {
    const int n = static_cast<int>(victim.devices.size());
    if (victim.placed_s == now || n <= victim.req.min_devices || CountIn(victim, pi) == 0 ||
        !victim.req.resizable) {
      return n;
    }
    if ((victim.home != pi && j.home == pi) || victim.level < j.level) {
      return victim.req.min_devices;
    }
    if (victim.level == j.level) return std::min(n, std::max(victim.req.min_devices, victim.base));
    return n;
  }

  struct Option {
    int job;
    bool shrink;
    std::vector<int> freed;
    double cost;  // device-seconds lost
  };
  // How job ji could start by preempting or shrinking jobs on some pools.
  struct Plan {
    int pool = -1;  // the one it would run on (RunPool)
    std::vector<int> devices;
    std::vector<Option> victims;  // only those whose devices the placement uses
    int options = 0;              // candidates considered
    double cost = 0;              // device-seconds lost, estimated
  };

  // The cheapest plan on the pools `ps` together, greedy by lost work per freed device;
  // nullopt when even every candidate would not make room. `failed` memoises, per level, the
  // smallest need that failed on these pools this pass.
  std::optional<Plan> PlanPreempt(int ji, const std::vector<int>& ps, int (&failed)[3]) {
    Job& j = jobs[ji];
    const int need = j.req.min_devices;
    if (failed[j.level] > 0 && need >= failed[j.level]) return std::nullopt;
    std::vector<char> in(pools.size(), 0);
    for (int pi : ps) in[pi] = 1;
    std::vector<Option> cands;
    std::vector<char> shrink_in(pools.size(), 0);
    for (int ri : running) {
      const Job& r = jobs[ri];
      if (ri == ji) continue;
      const int n = static_cast<int>(r.devices.size());
      std::fill(shrink_in.begin(), shrink_in.end(), 0);
      int floor = n;
      for (int pi : ps) {
        const int f = ShrinkFloor(r, j, pi);
        shrink_in[pi] = f < n;
        floor = std::min(floor, f);
      }
      if (floor < n) {
        // Free whole tp groups from the hosts it uses least, in the pools where it may shrink.
        std::map<int, std::vector<int>> by_host;
        for (int d : r.devices) {
          if (shrink_in[pool_of[d]]) by_host[topo->host_of(d)].push_back(d);
        }
        std::vector<std::vector<int>> hosts;
        for (auto& [h, devs] : by_host) hosts.push_back(devs);
        std::stable_sort(hosts.begin(), hosts.end(),
                         [](auto& a, auto& b) { return a.size() < b.size(); });
        std::vector<int> freed;
        const int can = n - floor;
        for (auto& devs : hosts) {
          int k = std::min(static_cast<int>(devs.size()), can - static_cast<int>(freed.size()));
          k -= k % r.req.tp;
          freed.insert(freed.end(), devs.end() - k, devs.end());
          if (static_cast<int>(freed.size()) + r.req.tp > can) break;
        }
        if (!freed.empty()) {
          cands.push_back({ri, true, freed, config.settings.reconfigure_s * n});
        }
      }
      // Not a job that would at once take back, from its own pool, what j borrows there: the
      // two would preempt each other in turn.
      const bool takes_back = r.home != j.home && in[r.home] && r.level >= j.level;
      if (!takes_back &&
          std::any_of(ps.begin(), ps.end(), [&](int pi) { return Preemptible(r, j, pi); })) {
        cands.push_back({ri, false, r.devices, PreemptCost(r)});
      }
    }
    if (cands.empty()) {
      failed[j.level] = need;
      return std::nullopt;
    }
    // Shrinks first (they lose no work), then preemptions of the lowest levels: a preempted
    // job of j's level would go back to the queue and displace someone else in turn. Within
    // each, jobs that once starved last (they waited long already), then by lost work per
    // freed device.
    std::stable_sort(cands.begin(), cands.end(), [this](const Option& a, const Option& b) {
      if (a.shrink != b.shrink) return a.shrink;
      if (!a.shrink && jobs[a.job].level != jobs[b.job].level) {
        return jobs[a.job].level < jobs[b.job].level;
      }
      if (!a.shrink && jobs[a.job].starving != jobs[b.job].starving) return !jobs[a.job].starving;
      return a.cost / static_cast<double>(a.freed.size()) <
             b.cost / static_cast<double>(b.freed.size());
    });
    // Greedy in that order; a job is shrunk or preempted, not both (a preemption
    // replaces a shrink chosen earlier). Stop once the job can be placed.
    std::vector<char> freed_mark(owner.size(), 0);
    std::map<int, size_t> chosen;  // victim job -> index into cands
    int have = 0;
    for (int pi : ps) have += FreeOfKind(pools[pi], j.req.kind);
    std::vector<int> devs;
    for (size_t i = 0; i < cands.size(); ++i) {
      const Option& o = cands[i];
      auto it = chosen.find(o.job);
      if (it != chosen.end()) {
        if (!cands[it->second].shrink || o.shrink) continue;
        for (int d : cands[it->second].freed) {
          have -= in[pool_of[d]] && KindMatches(d, j.req.kind) && !down[d];
          freed_mark[d] = 0;
        }
      }
      chosen[o.job] = i;
      for (int d : o.freed) {
        have += in[pool_of[d]] && KindMatches(d, j.req.kind) && !down[d];
        freed_mark[d] = 1;
      }
      if (have < need) continue;
      // At its minimum: it grows later if devices are idle, instead of costing more work.
      devs = Place(ps, j.req.min_devices, j.req.min_devices, j.req.tp, j.req.one_host, j.req.kind,
                   [&](int d) { return !down[d] && (owner[d] < 0 || freed_mark[d]); });
      if (!devs.empty()) break;
    }
    if (devs.empty()) {
      failed[j.level] = need;
      return std::nullopt;
    }
    // Only the victims whose devices the placement uses.
    std::vector<char> used(owner.size(), 0);
    for (int d : devs) used[d] = 1;
    Plan plan{.pool = RunPool(devs, j.home).first,
              .devices = devs,
              .victims = {},
              .options = static_cast<int>(cands.size()),
              .cost = 0};
    for (auto& [vi, oi] : chosen) {
      Option o = cands[oi];
      if (std::none_of(o.freed.begin(), o.freed.end(), [&](int d) { return used[d]; })) continue;
      if (o.shrink) {
        // A shrink gives up only the devices the placement takes (whole tp groups per host
        // of the victim, as placement takes whole tp groups of the job: round up per host).
        std::map<int, std::vector<int>> by_host;
        for (int d : o.freed) by_host[topo->host_of(d)].push_back(d);
        std::vector<int> give;
        const int tp = jobs[vi].req.tp;
        for (auto& [h, mine] : by_host) {
          int k = static_cast<int>(
              std::count_if(mine.begin(), mine.end(), [&](int d) { return used[d] != 0; }));
          k = (k + tp - 1) / tp * tp;
          std::stable_partition(mine.begin(), mine.end(), [&](int d) { return used[d] != 0; });
          give.insert(give.end(), mine.begin(), mine.begin() + k);
        }
        o.cost *= static_cast<double>(give.size()) / static_cast<double>(o.freed.size());
        o.freed = std::move(give);
      }
      plan.victims.push_back(o);
      plan.cost += o.cost;
    }
    return plan;
  }

  // Carries out a plan: the victims' decisions, then the job's start after them.
  void ApplyPlan(int ji, const Plan& plan) {
    Job& j = jobs[ji];
    const int pi = plan.pool;
    PoolRt& p = pools[pi];
    std::vector<std::string> after;
    for (const Option& o : plan.victims) {
      const int vi = o.job;
      Job& v = jobs[vi];
      after.push_back(v.req.id);
      const std::string why = fmt::format(
          "for job {} ({}, level {}, pool {}): the least work lost among {} options, "
          "estimated {:.0f} device-s",
          j.req.id, JobClassName(j.job_class), j.level, p.pool.spec.name, plan.options, o.cost);
      if (o.shrink) {
        std::vector<int> freed = o.freed;
        std::sort(freed.begin(), freed.end());
        std::vector<int> keep;
        for (int d : v.devices) {
          if (!std::binary_search(freed.begin(), freed.end(), d)) keep.push_back(d);
        }
        const int before = static_cast<int>(v.devices.size());
        Reshape(vi, keep, config.settings.reconfigure_s);
        decisions.push_back(MakeDecision(
            DecisionKind::kShrink, v,
            fmt::format("shrunk from {} to {} devices {}", before, v.devices.size(), why)));
      } else {
        ++v.preemptions;
        advisor.AddInterruption(KeyOf(v));
        const bool save = v.req.checkpoint_cost_s <= config.settings.preempt_grace_s;
        Decision d = MakeDecision(DecisionKind::kPreempt, v,
                                  fmt::format("checkpoint and pause {}{}", why,
                                              v.borrowed ? "; it ran on borrowed devices" : ""));
        d.devices.clear();
        d.save = save;
        d.checkpoint_interval_s = 0;
        StopRunning(vi, save, JobState::kPending);
        v.reason = fmt::format(
            "pending: reason=Preempted (by job {}; resumes when devices are free)", j.req.id);
        decisions.push_back(std::move(d));
      }
    }
    const bool resume = j.started;
    StartRunning(ji, plan.devices, pi, RunPool(plan.devices, j.home).second,
                 j.started ? RestartS(j) : 0);
    Decision d = MakeDecision(
        DecisionKind::kStart, j,
        fmt::format("pool {}: {} after preempting or shrinking {} (estimated {:.0f} device-s "
                    "lost)",
                    p.pool.spec.name, Where(j.devices), fmt::join(after, ", "), plan.cost),
        resume);
    d.after = std::move(after);
    decisions.push_back(std::move(d));
  }

  // Fair-share factor in (0, 1]: 2^-(usage share / entitled share), Slurm's classic formula.
  double FairShare(double usage, double total, double entitled) const {
    if (total <= 0) return 1;
    return std::exp2(-(usage / total) / entitled);
  }

  std::vector<int> Order() {
    double team_total = 0;
    for (Meter& m : team_usage) {
      m.Advance(now, HalfLife());
      team_total += m.value;
    }
    std::vector<double> team_total_users(team_usage.size(), 0);
    for (size_t u = 0; u < user_usage.size(); ++u) {
      user_usage[u].Advance(now, HalfLife());
      team_total_users[team_of_user[u]] += user_usage[u].value;
    }
    std::vector<std::pair<double, int>> keyed;
    keyed.reserve(pending.size());
    const double teams = static_cast<double>(std::max<size_t>(1, team_usage.size()));
    for (int ji : pending) {
      const Job& j = jobs[ji];
      double score = 0;
      if (options.policy == Policy::kKuangchao) {
        const double ft = FairShare(team_usage[j.team].value, team_total, 1 / teams);
        const double fu = FairShare(user_usage[j.user].value, team_total_users[j.team],
                                    1.0 / std::max(1, users_in_team[j.team]));
        // Age adds a point a day without bound: a job outwaits any fair-share difference.
        const double age = (now - j.submit_s) / 86400;
        // Starving jobs come first within their level, oldest first whatever their share
        // (PBS's starving jobs).
        score = j.level * 1e6 + (j.starving ? 1e3 + age : 0.5 * ft + 0.5 * fu + age);
      }
      keyed.emplace_back(score, ji);
    }
    std::sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      if (a.first != b.first) return a.first > b.first;
      const Job& x = jobs[a.second];
      const Job& y = jobs[b.second];
      if (x.submit_s != y.submit_s) return x.submit_s < y.submit_s;
      return a.second < b.second;
    });
    std::vector<int> order;
    order.reserve(keyed.size());
    for (auto& [s, ji] : keyed) order.push_back(ji);
    return order;
  }

  void PassFifo() {
    PoolRt& p = pools[0];
    std::vector<int> order = Order();
    int blocked = -1;
    for (int ji : order) {
      Job& j = jobs[ji];
      if (blocked >= 0) {
        j.reason =
            fmt::format("pending: reason=Priority (FIFO: behind job {})", jobs[blocked].req.id);
        continue;
      }
      int n = std::min(j.req.max_devices, static_cast<int>(p.pool.devices.size()));
      n -= n % j.req.tp;
      std::vector<int> devs;
      if (p.free >= n) {
        devs = Place({0}, n, n, j.req.tp, j.req.one_host, j.req.kind,
                     [this](int d) { return IsFree(d); });
      }
      if (devs.empty()) {
        blocked = ji;
        j.reason = fmt::format("pending: reason=Resources (FIFO: {} of {} devices free, needs {})",
                               p.free, p.pool.devices.size(), n);
        continue;
      }
      const double queued = now - j.submit_s;
      const bool resume = j.started;
      StartRunning(ji, std::move(devs), 0, false, resume ? RestartS(j) : 0);
      decisions.push_back(MakeDecision(
          DecisionKind::kStart, j,
          fmt::format("FIFO: {}; waited {}", Where(j.devices), Seconds(queued)), resume));
    }
  }

  void Pass() {
    for (PoolRt& p : pools) {
      p.reserved_for = -1;
      p.shadow_s = kInf;
      p.extra = 0;
      std::fill(std::begin(p.preempt_failed), std::end(p.preempt_failed), 0);
      std::fill(std::begin(p.spread_failed), std::end(p.spread_failed), 0);
      std::fill(std::begin(p.overdue_failed), std::end(p.overdue_failed), 0);
    }
    Starve();
    std::vector<int> order = Order();
    int blocked = 0;
    for (int ji : order) {
      Job& j = jobs[ji];
      PoolRt& home = pools[j.home];
      if (j.state != JobState::kPending) continue;
      if (blocked >= config.settings.backfill_depth) {
        j.reason = fmt::format("pending: reason=Priority (behind {} blocked jobs)", blocked);
        continue;
      }
      if (TryStart(ji, {j.home})) continue;
      // Borrow: the home pool and the lending pools together.
      std::vector<int> ps = {j.home};
      for (int pi : Lenders(j.home)) {
        if (pools[pi].free > 0) ps.push_back(pi);
      }
      if (ps.size() > 1 && TryStart(ji, ps)) continue;
      // Preempt or shrink: in the home pool (reclaiming lent devices, elastic jobs' devices
      // above their minimum, preemptible jobs for a higher level), then, for levels above
      // preemptible, in the lending pools; a pool is used only when that does not delay its
      // reservation: none yet, a lower level holds it, or the job ends before it.
      auto may_use = [&](int pi) {
        const PoolRt& p = pools[pi];
        if (p.reserved_for < 0 || j.level > jobs[p.reserved_for].level) return true;
        const double delay = j.started ? RestartS(j) : 0;
        return DevicesToEndWithin(j, p.shadow_s - now - delay) <= j.req.min_devices;
      };
      // The plan that loses the least work wins.
      std::optional<Plan> best;
      auto consider = [&](const std::vector<int>& on, int(&failed)[3]) {
        std::optional<Plan> plan = PlanPreempt(ji, on, failed);
        if (plan && (!best || plan->cost < best->cost)) best = std::move(plan);
      };
      std::vector<int> spread;  // every pool it may use, for a job no single one can hold
      if (may_use(j.home)) {
        consider({j.home}, home.preempt_failed);
        spread.push_back(j.home);
      }
      if (j.level > 0) {
        for (int pi : Lenders(j.home)) {
          if (!may_use(pi)) continue;
          consider({pi}, pools[pi].preempt_failed);
          spread.push_back(pi);
        }
      }
      if (!best && spread.size() > 1) consider(spread, home.spread_failed);
      if (best) {
        ApplyPlan(ji, *best);
        continue;
      }
      // A high-priority job that waited, or would wait, longer than high_max_wait_s also
      // preempts normal jobs; otherwise its reservation holds the devices for it.
      const bool reserved_before = home.reserved_for >= 0;
      if (!reserved_before) Reserve(ji);
      if (j.level == static_cast<int>(JobClass::kHigh) && !spread.empty() &&
          config.settings.high_max_wait_s > 0) {
        const double waited = j.queued_s + (now - j.pending_since_s);
        const double start_s = home.reserved_for == ji ? home.shadow_s : kInf;
        if (waited >= config.settings.high_max_wait_s ||
            start_s - now > config.settings.high_max_wait_s) {
          overdue_plan = true;
          std::optional<Plan> plan = PlanPreempt(ji, spread, home.overdue_failed);
          overdue_plan = false;
          if (plan) {
            if (!reserved_before) Unreserve(ji);
            ApplyPlan(ji, *plan);
            continue;
          }
        }
      }
      ++blocked;
      if (!reserved_before) {
        j.reason = fmt::format(
            "pending: reason=Resources (pool {}: {} of {} devices free, needs {}; expected to "
            "start {})",
            home.pool.spec.name, home.free, home.pool.devices.size(), j.req.min_devices,
            std::isfinite(home.shadow_s) ? "in " + Seconds(home.shadow_s - now)
                                         : "when running jobs end");
      } else {
        j.reason = fmt::format(
            "pending: reason=Reservation (pool {}: {} of {} devices free, needs {}; the free "
            "devices are held for job {})",
            home.pool.spec.name, home.free, home.pool.devices.size(), j.req.min_devices,
            jobs[home.reserved_for].req.id);
      }
    }
    Grow();
    Readvise();
  }

  // A running job's checkpoint interval follows the history of its kind (pool, class,
  // borrowing) as it grows: looked at again once per interval, changed when the advice moved
  // by more than a fifth. Without it a job started on a key with little history keeps the
  // prior's short interval for its whole run.
  void Readvise() {
    if (options.checkpoint == CheckpointPolicy::kSeedRule) return;
    for (int ji : running) {
      Job& j = jobs[ji];
      if (now - j.advised_s < j.interval_s) continue;
      j.advised_s = now;
      const double interval = IntervalFor(j);
      if (std::abs(interval - j.interval_s) <= 0.2 * j.interval_s) continue;
      j.interval_s = interval;
      const CheckpointAdvice a = advisor.Advise(KeyOf(j), j.req.checkpoint_cost_s);
      decisions.push_back(
          MakeDecision(DecisionKind::kInterval, j,
                       fmt::format("checkpoint every {}: jobs like it ran {} with {} interruptions",
                                   Seconds(interval), Seconds(a.exposure_s), a.interruptions)));
    }
  }

  // Jobs pending starve_after_s in all are starving (PBS's max_starve): they go first within
  // their level, oldest first, so the reservation of their pool is theirs and no job of their
  // level that arrives later overtakes them; a preemptible one goes up to the normal level,
  // which normal work neither overtakes nor preempts. Without it a large job waits until the
  // jobs that outrank it stop arriving, and then bounds when the work is done. Demoted jobs
  // stay where their faults put them.
  void Starve() {
    const double after = config.settings.starve_after_s;
    if (after <= 0) return;
    for (int ji : pending) {
      Job& j = jobs[ji];
      const double waited = j.queued_s + (now - j.pending_since_s);
      if (j.starving || j.level != static_cast<int>(j.job_class) || waited < after) continue;
      j.starving = true;
      if (j.level >= static_cast<int>(JobClass::kNormal)) continue;
      j.level = static_cast<int>(JobClass::kNormal);
      decisions.push_back(MakeDecision(
          DecisionKind::kPromote, j,
          fmt::format("starving: pending {} in all, longer than starve_after_h ({}): scheduled "
                      "at level {} from now on",
                      Seconds(waited), Seconds(after), j.level)));
    }
  }

  // Elastic jobs grow toward their maximum on idle devices: their home pool's, then those
  // the other pools lend (preemptibly, as any borrowing), never the devices a reservation is
  // draining (only its spare ones). The job expected to end last grows first: it bounds when
  // the work is done. Devices above a job's minimum stay shrinkable: a job that needs them
  // takes them back.
  void Grow() {
    std::vector<std::pair<double, int>> order;
    for (int ji : running) {
      const Job& j = jobs[ji];
      const double end = ExpectedEnd(j);
      if (static_cast<int>(j.devices.size()) >= j.req.max_devices || j.placed_s == now ||
          !j.req.resizable || end - now < config.settings.grow_min_remaining_s) {
        continue;
      }
      order.emplace_back(end, ji);
    }
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (auto [end, ji] : order) {
      Job& j = jobs[ji];
      const int n = static_cast<int>(j.devices.size());
      std::vector<int> ps = {j.home};
      for (int pi : Lenders(j.home)) ps.push_back(pi);
      std::vector<int> spare(pools.size(), 0);
      int idle = 0;
      for (int pi : ps) {
        const PoolRt& p = pools[pi];
        spare[pi] = p.reserved_for >= 0 ? std::min(p.extra, p.free) : p.free;
        idle += spare[pi];
      }
      if (idle < j.req.tp) continue;
      // Its own devices may lie in pools that neither are its home nor lend (named pools).
      for (int d : j.devices) {
        if (std::find(ps.begin(), ps.end(), pool_of[d]) == ps.end()) ps.push_back(pool_of[d]);
      }
      std::vector<char> mine(owner.size(), 0);
      for (int d : j.devices) mine[d] = 1;
      // A job on one host grows on that host only.
      const int host = j.req.one_host && !j.devices.empty() ? topo->host_of(j.devices.front()) : -1;
      std::vector<int> devs = Place(ps, n + j.req.tp, j.req.max_devices, j.req.tp, j.req.one_host,
                                    j.req.kind, [&](int d) {
                                      return !down[d] && (host < 0 || topo->host_of(d) == host) &&
                                             (mine[d] || (owner[d] < 0 && spare[pool_of[d]] > 0));
                                    });
      // Keep all of its devices and add whole tp groups per host from what placement found,
      // within each pool's spare devices.
      std::map<int, std::vector<int>> added;
      for (int d : devs) {
        if (!mine[d]) added[topo->host_of(d)].push_back(d);
      }
      std::vector<int> next = j.devices;
      for (auto& [h, more] : added) {
        std::vector<int> ok;
        for (int d : more) {
          if (spare[pool_of[d]] > 0) {
            --spare[pool_of[d]];
            ok.push_back(d);
          }
        }
        int k = std::min(static_cast<int>(ok.size()),
                         j.req.max_devices - static_cast<int>(next.size()));
        k -= k % j.req.tp;
        for (int x = k; x < static_cast<int>(ok.size()); ++x) ++spare[pool_of[ok[x]]];
        next.insert(next.end(), ok.begin(), ok.begin() + k);
      }
      if (static_cast<int>(next.size()) <= n) continue;
      for (auto d = next.begin() + n; d != next.end(); ++d) {
        if (PoolRt& p = pools[pool_of[*d]]; p.reserved_for >= 0) --p.extra;
      }
      Reshape(ji, next, config.settings.reconfigure_s);
      decisions.push_back(MakeDecision(
          DecisionKind::kGrow, j,
          fmt::format("grown from {} to {} devices: idle devices no waiting job can use now{}", n,
                      j.devices.size(), j.borrowed ? " (borrowed ones preemptibly)" : "")));
    }
  }
};

Scheduler::Scheduler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Scheduler::~Scheduler() = default;

Result<std::unique_ptr<Scheduler>> Scheduler::Create(const hal::Topology* topology,
                                                     const PoolConfig& config,
                                                     const SchedulerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->topo = topology;
  impl->config = config;
  impl->options = options;
  std::vector<Pool> pools;
  if (options.policy == Policy::kFifo) {
    Pool all;
    all.spec = {.name = "all",
                .classes = {JobClass::kPreemptible, JobClass::kNormal, JobClass::kHigh},
                .rest = true};
    for (int d = 0; d < topology->num_devices(); ++d) all.devices.push_back(d);
    pools.push_back(std::move(all));
  } else {
    KC_ASSIGN_OR_RETURN(pools, PartitionPools(*topology, config));
  }
  const int n = topology->num_devices();
  impl->pool_of.assign(n, -1);
  impl->owner.assign(n, -1);
  impl->down.assign(n, 0);
  std::map<std::string, int> rack_number;
  for (const hal::HostSpec& h : topology->hosts()) {
    impl->host_rack.push_back(
        rack_number.emplace(h.rack, static_cast<int>(rack_number.size())).first->second);
  }
  for (size_t pi = 0; pi < pools.size(); ++pi) {
    Impl::PoolRt rt;
    rt.pool = std::move(pools[pi]);
    std::map<int, size_t> entry_of_host;
    for (int d : rt.pool.devices) {
      impl->pool_of[d] = static_cast<int>(pi);
      const int h = topology->host_of(d);
      auto [it, fresh] = entry_of_host.emplace(h, rt.hosts.size());
      if (fresh) {
        rt.hosts.push_back(h);
        rt.host_devs.emplace_back();
      }
      rt.host_devs[it->second].push_back(d);
    }
    rt.free = static_cast<int>(rt.pool.devices.size());
    impl->pools.push_back(std::move(rt));
  }
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(impl)));
}

Status Scheduler::Submit(const JobRequest& r, double now_s) {
  KC_LAYER_ENTRY(Layer::kSched, "scheduler");
  Impl& m = *impl_;
  m.Advance(now_s);
  auto refuse = [&](std::string_view why) {
    return InvalidArgumentError(fmt::format("job {}: refused: {}", r.id, why));
  };
  if (r.id.empty()) return InvalidArgumentError("job: refused: an empty job id");
  if (m.job_index.contains(r.id)) return refuse("the id is in use");
  if (r.min_devices < 1) return refuse("min_devices must be at least 1");
  if (r.min_devices > r.max_devices) {
    return refuse(
        fmt::format("min_devices {} is above max_devices {}", r.min_devices, r.max_devices));
  }
  if (r.tp < 1 || r.min_devices % r.tp != 0 || r.max_devices % r.tp != 0) {
    return refuse(fmt::format("tp {} must divide min_devices {} and max_devices {}", r.tp,
                              r.min_devices, r.max_devices));
  }
  if (!r.kind.empty()) {
    bool known = false;
    for (int d = 0; d < m.topo->num_devices() && !known; ++d) known = m.KindMatches(d, r.kind);
    if (!known) {
      return refuse(
          fmt::format("unknown device kind \"{}\": cluster \"{}\" has no such model "
                      "or kind",
                      r.kind, m.topo->name()));
    }
  }
  int home = -1;
  if (m.options.policy == Policy::kFifo) {
    home = 0;
  } else if (!r.pool.empty()) {
    for (size_t pi = 0; pi < m.pools.size(); ++pi) {
      if (m.pools[pi].pool.spec.name == r.pool) home = static_cast<int>(pi);
    }
    if (home < 0) {
      std::vector<std::string> names;
      for (auto& p : m.pools) names.push_back(p.pool.spec.name);
      return refuse(fmt::format("unknown pool \"{}\" (pools: {})", r.pool, fmt::join(names, ", ")));
    }
  } else {
    for (size_t pi = 0; pi < m.pools.size() && home < 0; ++pi) {
      const PoolSpec& s = m.pools[pi].pool.spec;
      bool cls = std::find(s.classes.begin(), s.classes.end(), r.job_class) != s.classes.end();
      bool team =
          s.teams.empty() || std::find(s.teams.begin(), s.teams.end(), r.team) != s.teams.end();
      if (cls && team) home = static_cast<int>(pi);
    }
    if (home < 0) {
      return refuse(
          fmt::format("no pool takes class {} for team {}", JobClassName(r.job_class), r.team));
    }
  }
  // The largest pool it may run in: its own, or (Kuangchao) one that lends.
  int largest = 0;
  std::string largest_name;
  for (size_t pi = 0; pi < m.pools.size(); ++pi) {
    const auto& p = m.pools[pi];
    if (static_cast<int>(pi) != home && !p.pool.spec.lend) continue;
    int n = 0;
    for (int d : p.pool.devices) n += m.KindMatches(d, r.kind);
    if (n > largest) {
      largest = n;
      largest_name = p.pool.spec.name;
    }
  }
  if (r.min_devices > largest) {
    return refuse(fmt::format(
        "asks for at least {} devices{}, above the capacity of every pool "
        "it may use (the largest, {}, has {})",
        r.min_devices, r.kind.empty() ? "" : " of kind " + r.kind, largest_name, largest));
  }
  if (r.one_host) {
    std::map<int, int> on_host;  // devices of its kind per host, in the pools it may use
    for (size_t pi = 0; pi < m.pools.size(); ++pi) {
      const auto& p = m.pools[pi];
      if (static_cast<int>(pi) != home && !p.pool.spec.lend) continue;
      for (int d : p.pool.devices) on_host[m.topo->host_of(d)] += m.KindMatches(d, r.kind);
    }
    int most = 0;
    for (auto [h, n] : on_host) most = std::max(most, n);
    if (r.min_devices > most) {
      return refuse(fmt::format(
          "asks for at least {} devices{} on one host, and no host of the pools it may use has "
          "that many (the largest has {})",
          r.min_devices, r.kind.empty() ? "" : " of kind " + r.kind, most));
    }
  }
  Impl::Job j;
  j.req = r;
  j.job_class = r.job_class;
  j.level = static_cast<int>(r.job_class);
  j.home = home;
  j.submit_s = now_s;
  if (r.duration_s > 0) j.work_total = r.duration_s * r.max_devices;
  auto [t, tnew] = m.team_index.emplace(r.team, static_cast<int>(m.team_index.size()));
  if (tnew) {
    m.team_usage.push_back({.value = 0, .rate = 0, .stamp = m.now});
    m.users_in_team.push_back(0);
  }
  auto [u, unew] =
      m.user_index.emplace(r.team + "/" + r.user, static_cast<int>(m.user_index.size()));
  if (unew) {
    m.user_usage.push_back({.value = 0, .rate = 0, .stamp = m.now});
    m.team_of_user.push_back(t->second);
    ++m.users_in_team[t->second];
  }
  j.team = t->second;
  j.user = u->second;
  j.reason = "pending: reason=None (not yet scheduled)";
  j.pending_since_s = now_s;
  const int ji = static_cast<int>(m.jobs.size());
  m.jobs.push_back(std::move(j));
  m.job_index.emplace(r.id, ji);
  m.pending.push_back(ji);
  return OkStatus();
}

namespace {
template <typename M>
Result<int> Find(const M& m, std::string_view job) {
  auto it = m.job_index.find(std::string(job));
  if (it == m.job_index.end()) return NotFoundError(fmt::format("job {}: unknown", job));
  return it->second;
}
}  // namespace

Status Scheduler::Finished(std::string_view job, double now_s) {
  KC_LAYER_ENTRY(Layer::kSched, "scheduler");
  Impl& m = *impl_;
  m.Advance(now_s);
  KC_ASSIGN_OR_RETURN(int ji, Find(m, job));
  Impl::Job& j = m.jobs[ji];
  if (j.state == JobState::kRunning) {
    m.StopRunning(ji, true, JobState::kDone);
  } else if (j.state == JobState::kPending) {
    m.pending.erase(std::find(m.pending.begin(), m.pending.end(), ji));
    j.state = JobState::kDone;
  }
  return OkStatus();
}

Status Scheduler::Checkpointed(std::string_view job, double now_s) {
  Impl& m = *impl_;
  m.Advance(now_s);
  KC_ASSIGN_OR_RETURN(int ji, Find(m, job));
  Impl::Job& j = m.jobs[ji];
  if (j.state != JobState::kRunning || now_s < j.last_ckpt_s) return OkStatus();
  const double at = std::min(now_s, m.now);
  j.work_ckpt = j.work_base +
                m.Rate(j, static_cast<int>(j.devices.size())) * std::max(0.0, at - j.seg_start_s);
  j.last_ckpt_s = at;
  return OkStatus();
}

Status Scheduler::Faulted(std::string_view job, double now_s) {
  KC_LAYER_ENTRY(Layer::kSched, "scheduler");
  Impl& m = *impl_;
  m.Advance(now_s);
  KC_ASSIGN_OR_RETURN(int ji, Find(m, job));
  Impl::Job& j = m.jobs[ji];
  if (j.state != JobState::kRunning) return OkStatus();
  ++j.faults;
  ++j.faults_window;
  // A job faulting often enough to be demoted has a bug of its own: its faults say nothing
  // about its pool (its own interval follows them).
  if (j.faults_window < m.config.settings.demote_min_faults &&
      j.level == static_cast<int>(j.job_class)) {
    m.advisor.AddInterruption(m.KeyOf(j));
  }
  // It restarts in place from its last checkpoint.
  j.run_before_s += std::max(0.0, m.now - j.seg_start_s);
  j.fault_window_s += std::max(0.0, m.now - j.seg_start_s);
  j.work_base = j.work_ckpt;
  j.seg_start_s = m.now + m.RestartS(j);
  j.last_ckpt_s = j.seg_start_s;
  if (const double interval = m.IntervalFor(j);
      std::abs(interval - j.interval_s) > 0.2 * j.interval_s) {
    j.interval_s = interval;
    m.decisions.push_back(
        m.MakeDecision(DecisionKind::kInterval, j,
                       fmt::format("checkpoint every {}: {} faults in {} of running",
                                   Seconds(interval), j.faults, Seconds(j.run_before_s))));
  }
  const SchedulerSettings& s = m.config.settings;
  const double hours = std::max(j.fault_window_s, 1.0) / 3600;
  const double rate = j.faults_window / hours;
  if (m.options.policy == Policy::kKuangchao && j.faults_window >= s.demote_min_faults &&
      rate > s.demote_faults_per_hour && j.level > 0) {
    const int before = j.level;
    --j.level;
    m.decisions.push_back(m.MakeDecision(
        DecisionKind::kDemote, j,
        fmt::format("fault rate {:.1f}/h ({} faults in {:.2f} h of running) passes the "
                    "threshold {}/h: priority level {} -> {} (frequent faults usually mean a bug "
                    "in the job's code or configuration)",
                    rate, j.faults_window, hours, s.demote_faults_per_hour, before, j.level)));
    j.faults_window = 0;
    j.fault_window_s = 0;
  }
  return OkStatus();
}

Status Scheduler::DevicesDown(const std::vector<int>& devices, double now_s) {
  KC_LAYER_ENTRY(Layer::kSched, "scheduler");
  Impl& m = *impl_;
  m.Advance(now_s);
  std::vector<int> hit;
  for (int d : devices) {
    if (d < 0 || d >= static_cast<int>(m.owner.size())) {
      return InvalidArgumentError(fmt::format("device index {} is not in the cluster", d));
    }
  }
  for (int d : devices) {
    if (m.down[d]) continue;
    m.down[d] = 1;
    if (m.owner[d] < 0) {
      --m.pools[m.pool_of[d]].free;
    } else {
      hit.push_back(m.owner[d]);
    }
  }
  std::sort(hit.begin(), hit.end());
  hit.erase(std::unique(hit.begin(), hit.end()), hit.end());
  for (int ji : hit) {
    Impl::Job& j = m.jobs[ji];
    std::map<int, std::vector<int>> by_host;
    for (int d : j.devices) {
      if (!m.down[d]) by_host[m.topo->host_of(d)].push_back(d);
    }
    std::vector<int> keep;
    for (auto& [h, devs] : by_host) {
      devs.resize(devs.size() - devs.size() % j.req.tp);
      keep.insert(keep.end(), devs.begin(), devs.end());
    }
    m.advisor.AddInterruption(m.KeyOf(j));
    if (static_cast<int>(keep.size()) >= j.req.min_devices && j.req.resizable) {
      const int before = static_cast<int>(j.devices.size());
      m.Reshape(ji, keep, m.config.settings.reconfigure_s);
      m.decisions.push_back(
          m.MakeDecision(DecisionKind::kShrink, j,
                         fmt::format("shrunk from {} to {} devices: devices went down", before,
                                     j.devices.size())));
    } else {
      Decision d = m.MakeDecision(
          DecisionKind::kPreempt, j,
          fmt::format("devices went down and {} of its {} devices are left, below its minimum "
                      "{}: back to the queue",
                      keep.size(), j.devices.size(), j.req.min_devices));
      d.devices.clear();
      d.checkpoint_interval_s = 0;
      m.StopRunning(ji, false, JobState::kPending);
      j.reason = "pending: reason=NodeFail (its devices went down; resumes from its checkpoint)";
      m.decisions.push_back(std::move(d));
    }
  }
  return OkStatus();
}

Status Scheduler::DevicesUp(const std::vector<int>& devices, double now_s) {
  KC_LAYER_ENTRY(Layer::kSched, "scheduler");
  Impl& m = *impl_;
  m.Advance(now_s);
  for (int d : devices) {
    if (d < 0 || d >= static_cast<int>(m.owner.size())) {
      return InvalidArgumentError(fmt::format("device index {} is not in the cluster", d));
    }
  }
  for (int d : devices) {
    if (!m.down[d]) continue;
    m.down[d] = 0;
    if (m.owner[d] < 0) ++m.pools[m.pool_of[d]].free;
  }
  return OkStatus();
}

std::vector<Decision> Scheduler::Schedule(double now_s) {
  ::kc::LayerScope scope(Layer::kSched, "scheduler", ::kc::EntryKind::kNonBlocking, nullptr,
                         __func__);
  if (!scope.ok()) return {};
  Impl& m = *impl_;
  m.Advance(now_s);
  if (m.options.policy == Policy::kFifo) {
    m.PassFifo();
  } else {
    m.Pass();
  }
  std::vector<int> still;
  for (int ji : m.pending) {
    if (m.jobs[ji].state == JobState::kPending) still.push_back(ji);
  }
  m.pending = std::move(still);
  return std::exchange(m.decisions, {});
}

Result<JobStatus> Scheduler::Query(std::string_view job) const {
  const Impl& m = *impl_;
  KC_ASSIGN_OR_RETURN(int ji, Find(m, job));
  const Impl::Job& j = m.jobs[ji];
  JobStatus s;
  s.state = j.state;
  s.devices = j.devices;
  s.pool = m.pools[j.home].pool.spec.name;
  s.run_pool = j.run_pool >= 0 ? m.pools[j.run_pool].pool.spec.name : "";
  s.borrowed = j.borrowed;
  s.level = j.level;
  s.preemptions = j.preemptions;
  s.faults = j.faults;
  s.reason = j.state == JobState::kPending ? j.reason : "";
  return s;
}

Result<CheckpointAdvice> Scheduler::Advice(std::string_view pool, JobClass job_class, bool borrowed,
                                           double cost_s) const {
  const Impl& m = *impl_;
  for (size_t pi = 0; pi < m.pools.size(); ++pi) {
    if (m.pools[pi].pool.spec.name == pool) {
      return m.advisor.Advise({.pool = static_cast<int>(pi),
                               .job_class = static_cast<int>(job_class),
                               .borrowed = borrowed},
                              cost_s);
    }
  }
  return NotFoundError(fmt::format("pool \"{}\": unknown", pool));
}

std::vector<Pool> Scheduler::pools() const {
  std::vector<Pool> out;
  for (const auto& p : impl_->pools) out.push_back(p.pool);
  return out;
}

int Scheduler::num_pending() const { return static_cast<int>(impl_->pending.size()); }
int Scheduler::num_running() const { return static_cast<int>(impl_->running.size()); }

}  // namespace kc::sched
