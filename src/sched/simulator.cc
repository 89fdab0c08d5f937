#include "sched/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <queue>
#include <random>
#include <unordered_map>

namespace kc::sched {
namespace {

// One job's life in the simulation. Within a segment (a stretch on one set of devices) it
// computes for `interval`, checkpoints for `cost`, and so on; progress starts at seg_start.
struct SimJob {
  const TraceJob* row = nullptr;
  double work_total = 0;  // device-seconds
  double cost = 0;        // one checkpoint, and one restart
  bool running = false;
  int n = 0;
  double interval = 0;
  double seg_start = 0;  // progress starts (after any restart or reconfiguration)
  double w0 = 0;         // work done at seg_start
  double saved0 = 0;     // work saved in its last checkpoint as of seg_start
  double release = 0;    // when it let go of devices it gave up last
  double first_start = -1;
  double end = -1;
  double reported_ckpt = -1;
  bool exposed = false;  // runs preemptibly: class preemptible or on borrowed devices
  int gen = 0;           // bumps on every change, invalidating queued events
  std::mt19937_64 rng;

  int Cycles(double t) const {
    if (interval <= 0 || t <= seg_start) return 0;
    return static_cast<int>(std::floor((t - seg_start) / (interval + cost)));
  }
  double Done(double t) const {
    if (t <= seg_start) return w0;
    const double e = t - seg_start;
    if (interval <= 0) return std::min(work_total, w0 + n * e);
    const int k = Cycles(t);
    const double r = e - k * (interval + cost);
    return std::min(work_total, w0 + n * (k * interval + std::min(r, interval)));
  }
  double Saved(double t) const {
    const int k = Cycles(t);
    return k == 0 ? saved0 : std::min(work_total, w0 + n * k * interval);
  }
  double LastCheckpoint(double t) const {
    const int k = Cycles(t);
    return k == 0 ? -1 : seg_start + k * (interval + cost);
  }
  double End() const {
    const double compute = std::max(0.0, work_total - w0) / n;
    if (interval <= 0) return seg_start + compute;
    const double pieces = std::ceil(compute / interval - 1e-9);
    return seg_start + compute + cost * std::max(0.0, pieces - 1);
  }
};

enum class EventKind { kArrive, kEnd, kFault };
struct Event {
  double t;
  uint64_t seq;
  EventKind kind;
  int job;
  int gen;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

TimeStats Stats(const std::vector<double>& v) {
  TimeStats s;
  s.jobs = static_cast<int>(v.size());
  if (v.empty()) return s;
  double total = 0;
  for (double x : v) total += x;
  s.mean_s = total / static_cast<double>(v.size());
  s.p50_s = Percentile(v, 0.5);
  s.p95_s = Percentile(v, 0.95);
  s.max_s = *std::max_element(v.begin(), v.end());
  return s;
}

}  // namespace

Result<SimReport> Simulate(const hal::Topology& topology, const PoolConfig& pools,
                           const std::vector<TraceJob>& trace, const SimOptions& options,
                           const std::function<void(const Decision&)>& on_decision) {
  KC_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> sched,
                      Scheduler::Create(&topology, pools, options.scheduler));
  const SchedulerSettings& settings = pools.settings;
  const int num_devices = topology.num_devices();
  SimReport rep;
  rep.jobs = static_cast<int>(trace.size());

  std::vector<SimJob> jobs(trace.size());
  std::unordered_map<std::string, int> index;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  uint64_t seq = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    SimJob& j = jobs[i];
    j.row = &trace[i];
    j.work_total = trace[i].duration_s * trace[i].max_devices;
    j.cost = trace[i].checkpoint_s >= 0 ? trace[i].checkpoint_s : options.checkpoint_cost_s;
    j.rng.seed(options.seed * 1000003 + i);
    index.emplace(trace[i].job, static_cast<int>(i));
    events.push({trace[i].submit_s, seq++, EventKind::kArrive, static_cast<int>(i), 0});
    rep.arrivals_end_s = std::max(rep.arrivals_end_s, trace[i].submit_s);
  }
  const double restart_s = settings.restart_s;
  auto restart_of = [&](const SimJob& j) { return restart_s >= 0 ? restart_s : j.cost; };

  // Devices held over time, as (time, +/- devices); and who holds what, for fragmentation.
  std::vector<std::pair<double, int>> held;
  std::vector<int> owner(num_devices, -1);
  double lost_preempt = 0, lost_fault = 0, ckpt = 0, ckpt_exposed = 0, restart = 0;  // device-s

  auto schedule_end = [&](int ji) {
    SimJob& j = jobs[ji];
    events.push({j.End(), seq++, EventKind::kEnd, ji, j.gen});
    const double rate = j.row->faults_per_hour / 3600;
    if (rate > 0) {
      std::exponential_distribution<double> next(rate);
      events.push({j.seg_start + next(j.rng), seq++, EventKind::kFault, ji, j.gen});
    }
  };
  // Closes the current segment at t: counts its checkpoints; returns the work done by t.
  auto close_segment = [&](SimJob& j, double t) {
    const double c = static_cast<double>(j.Cycles(t)) * j.cost * j.n;
    ckpt += c;
    if (j.exposed) ckpt_exposed += c;
    return j.Done(t);
  };
  auto set_owner = [&](const std::vector<int>& devs, int ji) {
    for (int d : devs) owner[d] = ji;
  };
  std::vector<std::vector<int>> devices_of(trace.size());

  auto apply = [&](const Decision& d, double now) {
    if (on_decision) on_decision(d);
    auto it = index.find(d.job);
    if (it == index.end()) return;
    const int ji = it->second;
    SimJob& j = jobs[ji];
    switch (d.kind) {
      case DecisionKind::kStart: {
        double s = now;
        for (const std::string& a : d.after) s = std::max(s, jobs[index.at(a)].release);
        const int n = static_cast<int>(d.devices.size());
        const double r = d.resume ? restart_of(j) : 0;
        restart += r * n;
        j.running = true;
        j.n = n;
        j.interval = d.checkpoint_interval_s;
        j.seg_start = s + r;
        j.exposed = d.borrowed || j.row->job_class == "preemptible";
        held.emplace_back(s, n);
        if (j.first_start < 0) {
          j.first_start = s;
        }
        ++j.gen;
        set_owner(d.devices, ji);
        devices_of[ji] = d.devices;
        schedule_end(ji);
        break;
      }
      case DecisionKind::kPreempt: {
        if (!j.running) break;
        const double done = close_segment(j, now);
        const double saved = d.save ? done : j.Saved(now);
        const double hold = d.save ? j.cost : std::min(j.cost, settings.preempt_grace_s);
        lost_preempt += (done - saved) + hold * j.n;
        j.release = now + hold;
        held.emplace_back(j.release, -j.n);
        j.w0 = saved;
        j.saved0 = saved;
        j.running = false;
        ++j.gen;
        ++rep.preemptions;
        for (int dv : devices_of[ji]) {
          if (owner[dv] == ji) owner[dv] = -1;
        }
        devices_of[ji].clear();
        break;
      }
      case DecisionKind::kShrink:
      case DecisionKind::kGrow: {
        if (!j.running) break;
        double s = now;
        for (const std::string& a : d.after) s = std::max(s, jobs[index.at(a)].release);
        const int n = static_cast<int>(d.devices.size());
        const double done = close_segment(j, s);
        const double saved = j.Saved(s);
        const double pause = settings.reconfigure_s;
        if (d.kind == DecisionKind::kShrink) {
          ++rep.shrinks;
          lost_preempt += pause * n;
          j.release = now + pause;
          held.emplace_back(j.release, n - j.n);
        } else {
          ++rep.grows;
          held.emplace_back(s, n - j.n);
        }
        j.n = n;
        j.w0 = done;
        j.saved0 = saved;
        j.seg_start = s + pause;
        j.interval = d.checkpoint_interval_s;
        j.exposed = d.borrowed || j.row->job_class == "preemptible";
        ++j.gen;
        for (int dv : devices_of[ji]) {
          if (owner[dv] == ji) owner[dv] = -1;
        }
        set_owner(d.devices, ji);
        devices_of[ji] = d.devices;
        schedule_end(ji);
        break;
      }
      case DecisionKind::kDemote:
        ++rep.demotions;
        break;
      case DecisionKind::kPromote:
        ++rep.promotions;
        break;
      case DecisionKind::kInterval: {
        if (!j.running) break;
        // Applied from the next segment on; a job restarting after a fault starts one now.
        if (j.seg_start < now) {
          const double done = close_segment(j, now);
          j.saved0 = j.Saved(now);
          j.w0 = done;
          j.seg_start = now;
        }
        j.interval = d.checkpoint_interval_s;
        ++j.gen;
        schedule_end(ji);
        break;
      }
    }
  };

  std::vector<double> pass_ms;
  std::vector<int> pass_pending;
  double frag_integral = 0, frag_last_t = 0, frag_value = 0;
  double now = 0;
  auto fragmentation = [&] {
    int free_total = 0, free_split = 0;
    const auto& hosts = topology.hosts();
    std::vector<int> used(hosts.size(), 0), total(hosts.size(), 0);
    for (int d = 0; d < num_devices; ++d) {
      ++total[topology.host_of(d)];
      used[topology.host_of(d)] += owner[d] >= 0;
    }
    for (size_t h = 0; h < hosts.size(); ++h) {
      const int f = total[h] - used[h];
      free_total += f;
      if (used[h] > 0) free_split += f;
    }
    return free_total == 0 ? 0.0 : static_cast<double>(free_split) / free_total;
  };

  // A job that can never finish (faults faster than its checkpoints) must not hang the run.
  double total_work = 0;
  for (const SimJob& j : jobs) total_work += j.work_total;
  const double limit = rep.arrivals_end_s + 20 * total_work / num_devices + 30 * 86400.0;
  while (!events.empty()) {
    now = events.top().t;
    if (now > limit) {
      rep.hit_time_limit = true;
      break;
    }
    while (!events.empty() && events.top().t == now) {
      Event e = events.top();
      events.pop();
      SimJob& j = jobs[e.job];
      const std::string& id = j.row->job;
      if (e.kind == EventKind::kArrive) {
        const TraceJob& r = *j.row;
        JobRequest req{.id = r.job,
                       .team = r.team,
                       .user = r.user,
                       .job_class = JobClassFromName(r.job_class).value_or(JobClass::kNormal),
                       .min_devices = r.min_devices,
                       .max_devices = r.max_devices,
                       .tp = r.tp,
                       .kind = r.kind,
                       .pool = r.pool,
                       .duration_s = r.duration_s,
                       .checkpoint_cost_s = j.cost};
        if (Status s = sched->Submit(req, now); !s.ok()) rep.refused.push_back(s.message());
        continue;
      }
      if (e.gen != j.gen || !j.running) continue;
      if (e.kind == EventKind::kEnd) {
        close_segment(j, now);
        j.running = false;
        j.end = now;
        ++j.gen;
        held.emplace_back(now, -j.n);
        for (int dv : devices_of[e.job]) {
          if (owner[dv] == e.job) owner[dv] = -1;
        }
        devices_of[e.job].clear();
        ++rep.finished;
        sched->Finished(id, now).IgnoreError();  // the scheduler knows every started job
      } else {
        // A fault: back to the last checkpoint, restart in place.
        const double done = close_segment(j, now);
        const double saved = j.Saved(now);
        lost_fault += done - saved;
        const double r = restart_of(j);
        restart += r * j.n;
        j.w0 = saved;
        j.saved0 = saved;
        j.seg_start = now + r;
        ++j.gen;
        ++rep.faults;
        sched->Faulted(id, now).IgnoreError();  // known and running: cannot fail
        schedule_end(e.job);
      }
    }
    // Tell the scheduler about checkpoints taken since the last pass.
    for (size_t ji = 0; ji < jobs.size(); ++ji) {
      SimJob& j = jobs[ji];
      if (!j.running) continue;
      const double c = j.LastCheckpoint(now);
      if (c > j.reported_ckpt) {
        j.reported_ckpt = c;
        sched->Checkpointed(j.row->job, c).IgnoreError();  // running: cannot fail
      }
    }
    frag_integral += frag_value * (now - frag_last_t);
    frag_last_t = now;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Decision> decisions = sched->Schedule(now);
    pass_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    pass_pending.push_back(sched->num_pending());
    rep.max_pending = std::max(rep.max_pending, sched->num_pending());
    for (const Decision& d : decisions) apply(d, now);
    frag_value = fragmentation();
  }
  rep.passes = static_cast<int>(pass_ms.size());
  rep.decision_p50_ms = Percentile(pass_ms, 0.5);
  rep.decision_p99_ms = Percentile(pass_ms, 0.99);
  rep.decision_max_ms = pass_ms.empty() ? 0 : *std::max_element(pass_ms.begin(), pass_ms.end());
  const int bounds[] = {0, 100, 1000, 5000, std::numeric_limits<int>::max()};
  for (int b = 0; b + 1 < 5; ++b) {
    std::vector<double> in;
    for (size_t i = 0; i < pass_ms.size(); ++i) {
      if (pass_pending[i] >= bounds[b] && pass_pending[i] < bounds[b + 1]) in.push_back(pass_ms[i]);
    }
    if (in.empty()) continue;
    rep.latency_by_pending.push_back({.min_pending = bounds[b],
                                      .passes = static_cast<int>(in.size()),
                                      .p50_ms = Percentile(in, 0.5),
                                      .p99_ms = Percentile(in, 0.99),
                                      .max_ms = *std::max_element(in.begin(), in.end())});
  }

  // Utilisation from the step function of devices held.
  std::sort(held.begin(), held.end());
  double makespan = 0;
  for (const SimJob& j : jobs) makespan = std::max(makespan, j.end);
  rep.makespan_s = makespan;
  auto held_integral = [&](double from, double to) {
    double area = 0, level = 0, t = 0;
    for (auto [time, delta] : held) {
      const double a = std::clamp(t, from, to), b = std::clamp(time, from, to);
      area += level * (b - a);
      level += delta;
      t = time;
    }
    area += level * std::max(0.0, to - std::clamp(t, from, to));
    return area;
  };
  const double span = std::max(makespan, 1e-9);
  rep.utilisation = held_integral(0, span) / (num_devices * span);
  if (rep.arrivals_end_s > 0) {
    rep.utilisation_arrivals =
        held_integral(0, rep.arrivals_end_s) / (num_devices * rep.arrivals_end_s);
  }
  double useful = 0;
  for (const SimJob& j : jobs) {
    if (j.end >= 0) useful += j.work_total;
  }
  rep.useful_utilisation = useful / (num_devices * span);
  const int points = std::max(1, options.curve_points);
  for (int b = 0; b < points; ++b) {
    const double a = span * b / points, z = span * (b + 1) / points;
    rep.curve.emplace_back(a, held_integral(a, z) / (num_devices * (z - a)));
  }
  rep.fragmentation = frag_last_t > 0 ? frag_integral / frag_last_t : 0;
  rep.lost_preemption_h = lost_preempt / 3600;
  rep.lost_fault_h = lost_fault / 3600;
  rep.checkpoint_h = ckpt / 3600;
  rep.checkpoint_exposed_h = ckpt_exposed / 3600;
  rep.restart_h = restart / 3600;

  std::map<std::string, std::vector<double>> delays, completions;
  std::map<std::string, std::pair<double, int>> team_x;
  for (const SimJob& j : jobs) {
    if (j.first_start >= 0) delays[j.row->job_class].push_back(j.first_start - j.row->submit_s);
    if (j.end >= 0) {
      auto& [sum, count] = team_x[j.row->team];
      sum += j.row->duration_s / std::max(j.end - j.row->submit_s, 1e-9);
      ++count;
      completions[j.row->job_class].push_back(j.end - j.row->submit_s);
      completions["all"].push_back(j.end - j.row->submit_s);
    }
  }
  for (auto& [cls, v] : delays) rep.delay[cls] = Stats(v);
  for (auto& [cls, v] : completions) rep.completion[cls] = Stats(v);
  double sum = 0, sum_sq = 0;
  for (auto& [team, x] : team_x) {
    const double mean = x.first / x.second;
    sum += mean;
    sum_sq += mean * mean;
  }
  rep.fairness = team_x.empty() ? 1 : sum * sum / (static_cast<double>(team_x.size()) * sum_sq);
  for (const Pool& p : sched->pools()) {
    for (JobClass c : {JobClass::kHigh, JobClass::kNormal, JobClass::kPreemptible}) {
      for (bool borrowed : {false, true}) {
        Result<CheckpointAdvice> a =
            sched->Advice(p.spec.name, c, borrowed, options.checkpoint_cost_s);
        if (a.ok() && a->exposure_s > 0) {
          rep.advice.push_back({.pool = p.spec.name,
                                .job_class = std::string(JobClassName(c)),
                                .borrowed = borrowed,
                                .advice = *a});
        }
      }
    }
  }
  for (const SimJob& j : jobs) {
    if (j.end >= 0) continue;
    Result<JobStatus> s = sched->Query(j.row->job);
    if (!s.ok()) continue;  // refused
    rep.unfinished.push_back(fmt::format(
        "{}: {}", j.row->job,
        s->state == JobState::kRunning ? "still running when the simulation stopped" : s->reason));
  }
  return rep;
}

}  // namespace kc::sched
