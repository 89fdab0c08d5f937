// `kc sim` and `kc sim generate`.
#include "apps/kc/sim_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hal/inventory.h"
#include "hal/topology.h"
#include "sched/pools.h"
#include "sched/simulator.h"
#include "sched/trace.h"
#include "sched/trace_gen.h"

namespace kc::app {
namespace {

using Json = nlohmann::json;

struct SimArgs {
  std::string inventory;
  std::string trace;
  std::string pools;
  std::string policy = "kuangchao";
  std::string checkpoint = "advised";
  bool compare = true;
  double checkpoint_cost_s = 60;
  uint64_t seed = 1;
  bool json = false;
  std::string plot;
  std::string decisions;
};

struct Run {
  std::string name;
  sched::SimReport report;
};

int Fail(const Status& s, int code = kExitBadInput) {
  std::cerr << "kc sim: " << s.message() << "\n";
  return code;
}

std::string Hours(double s) { return fmt::format("{:.2f} h", s / 3600); }
std::string Short(double s) {
  if (s < 120) return fmt::format("{:.0f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  return fmt::format("{:.1f} h", s / 3600);
}
std::string Pct(double x) { return fmt::format("{:.1f}%", 100 * x); }

Json ReportJson(const Run& run) {
  const sched::SimReport& r = run.report;
  auto by_class = [](const std::map<std::string, sched::TimeStats>& stats) {
    Json out = Json::object();
    for (const auto& [cls, d] : stats) {
      out[cls] = {{"jobs", d.jobs},
                  {"mean_s", d.mean_s},
                  {"p50_s", d.p50_s},
                  {"p95_s", d.p95_s},
                  {"max_s", d.max_s}};
    }
    return out;
  };
  Json curve = Json::array();
  for (auto [t, u] : r.curve) curve.push_back({t, u});
  Json by_pending = Json::array();
  for (const auto& b : r.latency_by_pending) {
    by_pending.push_back({{"min_pending", b.min_pending},
                          {"passes", b.passes},
                          {"p50", b.p50_ms},
                          {"p99", b.p99_ms},
                          {"max", b.max_ms}});
  }
  Json advice = Json::array();
  for (const sched::AdviceRow& a : r.advice) {
    advice.push_back({{"pool", a.pool},
                      {"class", a.job_class},
                      {"borrowed", a.borrowed},
                      {"interruptions", a.advice.interruptions},
                      {"running_h", a.advice.exposure_s / 3600},
                      {"mtbi_s", a.advice.mtbi_s},
                      {"interval_s", a.advice.interval_s}});
  }
  return {{"policy", run.name},
          {"jobs", r.jobs},
          {"finished", r.finished},
          {"refused", r.refused},
          {"unfinished", r.unfinished},
          {"hit_time_limit", r.hit_time_limit},
          {"makespan_s", r.makespan_s},
          {"arrivals_end_s", r.arrivals_end_s},
          {"utilisation", r.utilisation},
          {"utilisation_arrivals", r.utilisation_arrivals},
          {"useful_utilisation", r.useful_utilisation},
          {"queue_delay", by_class(r.delay)},
          {"completion", by_class(r.completion)},
          {"preemptions", r.preemptions},
          {"shrinks", r.shrinks},
          {"grows", r.grows},
          {"demotions", r.demotions},
          {"promotions", r.promotions},
          {"faults", r.faults},
          {"lost_preemption_device_h", r.lost_preemption_h},
          {"lost_fault_device_h", r.lost_fault_h},
          {"checkpoint_device_h", r.checkpoint_h},
          {"checkpoint_preemptible_device_h", r.checkpoint_exposed_h},
          {"restart_device_h", r.restart_h},
          {"fragmentation", r.fragmentation},
          {"fairness", r.fairness},
          {"passes", r.passes},
          {"max_pending", r.max_pending},
          {"decision_ms",
           {{"p50", r.decision_p50_ms}, {"p99", r.decision_p99_ms}, {"max", r.decision_max_ms}}},
          {"decision_ms_by_pending", by_pending},
          {"utilisation_curve", curve},
          {"checkpoint_advice", advice}};
}

// Utilisation over time as text: one column per time bin, one mark per run.
std::string AsciiPlot(const std::vector<Run>& runs, double span_s) {
  constexpr int kCols = 64, kRows = 10;
  const char marks[] = {'#', '+', '.'};
  std::vector<std::string> grid(kRows, std::string(kCols, ' '));
  for (size_t ri = runs.size(); ri-- > 0;) {
    const auto& curve = runs[ri].report.curve;
    if (curve.empty()) continue;
    for (int c = 0; c < kCols; ++c) {
      const double t = span_s * (c + 0.5) / kCols;
      double u = 0;
      for (auto [ct, cu] : curve) {
        if (ct <= t) u = cu;
      }
      const int row = std::clamp(static_cast<int>(std::lround(u * kRows)), 0, kRows);
      if (row > 0) grid[kRows - row][c] = marks[std::min<size_t>(ri, 2)];
    }
  }
  std::string out = "utilisation over time";
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    out += fmt::format("{} {} = '{}'", ri == 0 ? ":" : ",", runs[ri].name,
                       marks[std::min<size_t>(ri, 2)]);
  }
  out += "\n";
  for (int r = 0; r < kRows; ++r) {
    out += fmt::format("{:>4}% |{}\n", (kRows - r) * 100 / kRows, grid[r]);
  }
  out +=
      fmt::format("      +{}\n       0{:>{}}\n", std::string(kCols, '-'), Short(span_s), kCols - 1);
  return out;
}

std::string SvgPlot(const std::vector<Run>& runs, double span_s) {
  constexpr double kW = 800, kH = 300, kPad = 40;
  const char* colors[] = {"#d62728", "#1f77b4", "#7f7f7f"};
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n"
      "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n"
      "<text x=\"5\" y=\"{}\">100%</text><text x=\"5\" y=\"{}\">0%</text>\n"
      "<text x=\"{}\" y=\"{}\">{}</text>\n",
      kW, kH + 2 * kPad, kPad, kPad, kPad, kH + kPad, kPad, kH + kPad, kW - 10, kH + kPad, kPad + 4,
      kH + kPad, kW - 80, kH + kPad + 20, Short(span_s));
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    std::string points;
    for (auto [t, u] : runs[ri].report.curve) {
      points +=
          fmt::format("{:.1f},{:.1f} ", kPad + (kW - kPad - 10) * t / span_s, kPad + kH * (1 - u));
    }
    out += fmt::format(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n"
        "<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n",
        colors[std::min<size_t>(ri, 2)], points, kPad + 10 + 220 * ri, kPad - 10,
        colors[std::min<size_t>(ri, 2)], runs[ri].name);
  }
  return out + "</svg>\n";
}

std::string TextReport(const SimArgs& a, const hal::Topology& topo,
                       const std::vector<sched::TraceJob>& trace, const std::vector<Run>& runs) {
  std::string out = fmt::format("# kc sim: {} ({} jobs), cluster {} ({} devices), pools {}\n",
                                a.trace, trace.size(), topo.name(), topo.num_devices(),
                                a.pools.empty() ? "default" : a.pools);
  std::string header = fmt::format("{:<34}", "");
  for (const Run& r : runs) header += fmt::format("{:>22}", r.name);
  out += header + "\n";
  auto row = [&](std::string_view label, auto&& cell) {
    std::string line = fmt::format("{:<34}", label);
    for (const Run& r : runs) line += fmt::format("{:>22}", cell(r.report));
    out += line + "\n";
  };
  using R = const sched::SimReport&;
  row("utilisation while jobs arrive",
      [](R r) { return r.arrivals_end_s > 0 ? Pct(r.utilisation_arrivals) : std::string("-"); });
  row("utilisation to the last end", [](R r) { return Pct(r.utilisation); });
  row("useful work / device time", [](R r) { return Pct(r.useful_utilisation); });
  row("last job ends", [](R r) { return Hours(r.makespan_s); });
  // One row per class that some run has: "LABEL CLASS mean/p95" of a TimeStats map.
  using Stats = std::map<std::string, sched::TimeStats> sched::SimReport::*;
  auto stats_rows = [&](std::string_view label, Stats stats, std::string_view which,
                        std::vector<const char*> classes) {
    for (const char* cls : classes) {
      bool any = false;
      for (const Run& r : runs) any |= (r.report.*stats).contains(cls);
      if (!any) continue;
      row(fmt::format("{} {} {}", label, cls, which), [&](R r) {
        auto it = (r.*stats).find(cls);
        if (it == (r.*stats).end()) return std::string("-");
        const double first = which == "p50/p95" ? it->second.p50_s : it->second.mean_s;
        return Short(first) + " / " + Short(it->second.p95_s);
      });
    }
  };
  stats_rows("queueing delay", &sched::SimReport::delay, "p50/p95",
             {"high", "normal", "preemptible"});
  stats_rows("completion time", &sched::SimReport::completion, "mean/p95",
             {"all", "high", "normal", "preemptible"});
  row("preemptions / shrinks / grows",
      [](R r) { return fmt::format("{} / {} / {}", r.preemptions, r.shrinks, r.grows); });
  row("faults / demotions / promotions",
      [](R r) { return fmt::format("{} / {} / {}", r.faults, r.demotions, r.promotions); });
  row("work lost to preemption (dev-h)",
      [](R r) { return fmt::format("{:.1f}", r.lost_preemption_h); });
  row("checkpoints while preemptible",
      [](R r) { return fmt::format("{:.1f}", r.checkpoint_exposed_h); });
  row("preemption cost (dev-h)",
      [](R r) { return fmt::format("{:.1f}", r.lost_preemption_h + r.checkpoint_exposed_h); });
  row("work lost to faults (dev-h)", [](R r) { return fmt::format("{:.1f}", r.lost_fault_h); });
  row("checkpoints (dev-h)", [](R r) { return fmt::format("{:.1f}", r.checkpoint_h); });
  row("restarts (dev-h)", [](R r) { return fmt::format("{:.1f}", r.restart_h); });
  row("lost + checkpoints (dev-h)", [](R r) {
    return fmt::format("{:.1f}", r.lost_preemption_h + r.lost_fault_h + r.checkpoint_h);
  });
  row("fragmentation (free on used hosts)", [](R r) { return Pct(r.fragmentation); });
  row("fairness (Jain over teams)", [](R r) { return fmt::format("{:.3f}", r.fairness); });
  row("decision p50 / p99 (ms)",
      [](R r) { return fmt::format("{:.2f} / {:.2f}", r.decision_p50_ms, r.decision_p99_ms); });
  row("most jobs pending at once", [](R r) { return fmt::format("{}", r.max_pending); });
  row("refused / unfinished",
      [](R r) { return fmt::format("{} / {}", r.refused.size(), r.unfinished.size()); });
  double span = 0;
  for (const Run& r : runs) span = std::max(span, r.report.makespan_s);
  out += "\n" + AsciiPlot(runs, span);
  const sched::SimReport& main = runs.front().report;
  if (!main.advice.empty()) {
    out += fmt::format(
        "\ncheckpoint advice from {}'s history (a {:.0f} s checkpoint; "
        "`kc train --checkpoint-every auto --mtbf H` applies it):\n",
        runs.front().name, a.checkpoint_cost_s);
    out += fmt::format("  {:<14} {:<12} {:<9} {:>13} {:>11} {:>10} {:>10}\n", "pool", "class",
                       "borrowed", "interruptions", "running", "mtbi", "interval");
    for (const sched::AdviceRow& r : main.advice) {
      out +=
          fmt::format("  {:<14} {:<12} {:<9} {:>13} {:>11} {:>10} {:>10}\n", r.pool, r.job_class,
                      r.borrowed ? "yes" : "no", r.advice.interruptions, Hours(r.advice.exposure_s),
                      Short(r.advice.mtbi_s), Short(r.advice.interval_s));
    }
    out += "\n";
  }
  for (const Run& r : runs) {
    if (r.report.hit_time_limit) {
      out += fmt::format("{}: stopped at its time limit with jobs unfinished\n", r.name);
    }
  }
  for (const std::string& r : main.refused) out += "refused: " + r + "\n";
  size_t shown = 0;
  for (const std::string& u : main.unfinished) {
    if (shown++ == 10) {
      out += fmt::format("... and {} more unfinished\n", main.unfinished.size() - 10);
      break;
    }
    out += "unfinished: " + u + "\n";
  }
  return out;
}

int RunSim(const SimArgs& a) {
  Result<hal::TopologySpec> spec = hal::LoadInventory(a.inventory);
  if (!spec.ok()) return Fail(spec.status());
  Result<hal::Topology> topo = hal::Topology::Build(std::move(*spec));
  if (!topo.ok()) return Fail(topo.status());
  Result<std::vector<sched::TraceJob>> trace = sched::LoadTrace(a.trace);
  if (!trace.ok()) return Fail(trace.status());
  // Without a pools file, what kcd's scheduler runs without DIR/pools.yaml: one pool of every
  // device, for every class.
  sched::PoolConfig pools = sched::AllDevicesPoolConfig();
  if (!a.pools.empty()) {
    Result<sched::PoolConfig> p = sched::LoadPoolConfig(a.pools);
    if (!p.ok()) return Fail(p.status());
    pools = std::move(*p);
  }
  if (a.policy != "fifo") {
    if (Result<std::vector<sched::Pool>> p = sched::PartitionPools(*topo, pools); !p.ok()) {
      return Fail(Status(p.status().code(),
                         fmt::format("{}: {}", a.pools.empty() ? "default pools" : a.pools,
                                     p.status().message())));
    }
  }
  struct Variant {
    std::string name;
    sched::Policy policy;
    sched::CheckpointPolicy checkpoint;
  };
  const auto ckpt = a.checkpoint == "seed" ? sched::CheckpointPolicy::kSeedRule
                                           : sched::CheckpointPolicy::kAdvised;
  std::vector<Variant> variants;
  if (a.policy == "fifo") {
    variants.push_back({"fifo", sched::Policy::kFifo, sched::CheckpointPolicy::kSeedRule});
  } else {
    variants.push_back({a.checkpoint == "seed" ? "kuangchao/seed-rule" : "kuangchao",
                        sched::Policy::kKuangchao, ckpt});
    if (a.compare) {
      if (a.checkpoint == "seed") {
        variants.push_back(
            {"kuangchao/advised", sched::Policy::kKuangchao, sched::CheckpointPolicy::kAdvised});
      } else {
        variants.push_back(
            {"kuangchao/seed-rule", sched::Policy::kKuangchao, sched::CheckpointPolicy::kSeedRule});
      }
      variants.push_back({"fifo", sched::Policy::kFifo, sched::CheckpointPolicy::kSeedRule});
    }
  }
  std::unique_ptr<std::ofstream> log;
  if (!a.decisions.empty()) {
    log = std::make_unique<std::ofstream>(a.decisions);
    if (!*log) return Fail(UnavailableError(a.decisions + ": cannot write"), kExitFailure);
  }
  std::vector<Run> runs;
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const Variant& v = variants[vi];
    sched::SimOptions o{.scheduler = {.policy = v.policy, .checkpoint = v.checkpoint},
                        .checkpoint_cost_s = a.checkpoint_cost_s,
                        .seed = a.seed,
                        .curve_points = 200};
    std::function<void(const sched::Decision&)> on_decision;
    if (log && vi == 0) {
      on_decision = [&log](const sched::Decision& d) {
        Json j = {{"t", d.time_s},    {"decision", sched::DecisionKindName(d.kind)},
                  {"job", d.job},     {"pool", d.pool},
                  {"level", d.level}, {"reason", d.reason}};
        if (!d.devices.empty()) j["devices"] = d.devices.size();
        if (!d.after.empty()) j["after"] = d.after;
        if (d.kind == sched::DecisionKind::kStart) {
          j["resume"] = d.resume;
          j["borrowed"] = d.borrowed;
        }
        if (d.checkpoint_interval_s > 0) j["checkpoint_interval_s"] = d.checkpoint_interval_s;
        if (d.kind == sched::DecisionKind::kPreempt) j["save"] = d.save;
        *log << j.dump() << "\n";
      };
    }
    Result<sched::SimReport> r = sched::Simulate(*topo, pools, *trace, o, on_decision);
    if (!r.ok()) return Fail(r.status());
    runs.push_back({v.name, std::move(*r)});
  }
  double span = 0;
  for (const Run& r : runs) span = std::max(span, r.report.makespan_s);
  if (!a.plot.empty()) {
    if (Status s = WriteFileAtomically(a.plot, SvgPlot(runs, span)); !s.ok()) {
      return Fail(s, kExitFailure);
    }
  }
  if (a.json) {
    Json out = {{"trace", a.trace},
                {"jobs", trace->size()},
                {"cluster", topo->name()},
                {"devices", topo->num_devices()},
                {"pools", a.pools.empty() ? "default" : a.pools},
                {"runs", Json::array()}};
    for (const Run& r : runs) out["runs"].push_back(ReportJson(r));
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << TextReport(a, *topo, *trace, runs);
  }
  return kExitOk;
}

}  // namespace

void AddSimCommand(CLI::App& app, Action* action) {
  CLI::App* sim = app.add_subcommand(
      "sim", "Replay a job trace through the scheduler on virtual time, beside FIFO");
  sim->require_subcommand(0, 1);
  auto a = std::make_shared<SimArgs>();
  sim->add_option("--inventory", a->inventory, "Cluster inventory (YAML)");
  sim->add_option("--trace", a->trace, "Job trace (CSV)");
  sim->add_option("--pools", a->pools,
                  "Pools and scheduler settings (YAML); default: one pool, all, of every device "
                  "for every class (as kcd without pools.yaml)");
  sim->add_option("--policy", a->policy, "kuangchao (default) or fifo")
      ->check(CLI::IsMember({"kuangchao", "fifo"}));
  sim->add_option("--checkpoint", a->checkpoint,
                  "Checkpoint intervals: advised (default, Young/Daly from the history) or seed "
                  "(7.5 min when preemption is likely, else 30 min)")
      ->check(CLI::IsMember({"advised", "seed"}));
  sim->add_flag("!--no-compare", a->compare,
                "Run only the chosen policy, not also the other checkpoint rule and FIFO");
  sim->add_option("--checkpoint-cost", a->checkpoint_cost_s,
                  "Seconds one checkpoint costs a job whose trace row gives none (default 60)")
      ->check(CLI::NonNegativeNumber);
  sim->add_option("--seed", a->seed, "Seed of the fault draws (default 1)");
  sim->add_flag("--json", a->json, "Print the report as JSON");
  sim->add_option("--plot", a->plot, "Write the utilisation over time as an SVG file");
  sim->add_option("--decisions", a->decisions,
                  "Write every decision of the first run, with its reason, as JSON lines");

  CLI::App* gen = sim->add_subcommand(
      "generate", "Write a synthetic trace shaped after the Microsoft Philly study");
  auto g = std::make_shared<sched::SyntheticTraceOptions>();
  auto out = std::make_shared<std::string>();
  auto size_mix = std::make_shared<std::vector<double>>();
  gen->add_option("--jobs", g->jobs, "Jobs (default 2000)");
  gen->add_option("--devices", g->devices, "Cluster size the load is computed for (default 256)");
  gen->add_option("--devices-per-host", g->devices_per_host, "Devices per host (default 8)");
  gen->add_option("--load", g->load, "Offered load (default 1.0)");
  gen->add_option("--seed", g->seed, "Seed (default 1)");
  gen->add_option("--teams", g->teams, "Teams (default 6)");
  gen->add_option("--high-fraction", g->high_fraction, "Share of high-priority jobs (0.05)");
  gen->add_option("--high-max-devices", g->high_max_devices,
                  "Largest high-priority job (default: one host)");
  gen->add_option("--high-max-hours", g->high_max_hours, "Longest high-priority job (24)");
  gen->add_option("--preemptible-fraction", g->preemptible_fraction,
                  "Share of preemptible jobs (0.30)");
  gen->add_option("--elastic-fraction", g->elastic_fraction,
                  "Share of multi-device jobs with min < max (0.30)");
  gen->add_option("--elastic-min-ratio", g->elastic_min_ratio,
                  "An elastic job's min as a share of its max, in [0, 1) (0: max/2 or max/4)");
  gen->add_option("--size-mix", *size_mix,
                  "Weights of the job sizes 1, 2..host/2, one host, several hosts "
                  "(0.8,0.1,0.07,0.03)")
      ->delimiter(',')
      ->expected(4);
  gen->add_option("--duration-sigma", g->duration_sigma,
                  "Spread of run times: sigma of their log-normal, ln seconds (3.0)");
  gen->add_option("--burstiness", g->burstiness,
                  "Squared coefficient of variation of the gaps between arrivals: 1 Poisson, "
                  "more bursty (1)");
  gen->add_option("--max-job-fraction", g->max_job_fraction,
                  "Largest job as a share of the devices (0.5)");
  gen->add_option("--diurnal-amplitude", g->diurnal_amplitude,
                  "Daily swing of the arrival rate, in [0, 1) (0.5)");
  gen->add_option("-o,--out", *out, "Output file (default: standard output)");
  gen->callback([action, g, out, size_mix] {
    if (!size_mix->empty()) std::copy_n(size_mix->begin(), g->size_mix.size(), g->size_mix.begin());
    *action = [g, out] {
      Result<std::vector<sched::TraceJob>> t = sched::GenerateSyntheticTrace(*g);
      if (!t.ok()) return Fail(t.status());
      std::string csv = fmt::format(
          "# synthetic trace after Microsoft Philly (Jeon et al., USENIX ATC 2019): {} jobs, {} "
          "devices, load {}, seed {}; classes high {} preemptible {}; elastic {} (min ratio {}); "
          "size mix {}; duration sigma {}; burstiness {}\n",
          g->jobs, g->devices, g->load, g->seed, g->high_fraction, g->preemptible_fraction,
          g->elastic_fraction, g->elastic_min_ratio, fmt::join(g->size_mix, ","), g->duration_sigma,
          g->burstiness);
      csv += sched::TraceToCsv(*t);
      if (out->empty()) {
        std::cout << csv;
      } else if (Status s = WriteFileAtomically(*out, csv); !s.ok()) {
        return Fail(s, kExitFailure);
      }
      return kExitOk;
    };
  });
  sim->callback([action, a, gen] {
    if (gen->parsed()) return;
    *action = [a] {
      if (a->inventory.empty()) return Fail(InvalidArgumentError("--inventory: required"));
      if (a->trace.empty()) return Fail(InvalidArgumentError("--trace: required"));
      return RunSim(*a);
    };
  });
}

}  // namespace kc::app
