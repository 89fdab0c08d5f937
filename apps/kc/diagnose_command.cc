// `kc diagnose RUN`: the seed's bottom-up troubleshooting (L1 devices, L2 communication, L3
// the plan's execution, L4 the scheduler and faults) over what a local run recorded: its
// metrics.jsonl (the header, steps, summary) and faults.jsonl. Each finding names its layer,
// the evidence and the fix; faults first, then warnings, bottom-up within each.
// Docs: docs/user-guide/diagnose.md.
#include "apps/kc/diagnose_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/kc/train_setup.h"
#include "parallel/plan.h"

namespace kc::app {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

struct DiagnoseArgs {
  std::string run;
  bool json = false;
};

struct Finding {
  int layer = 1;         // 1..4: L1 devices, L2 comm, L3 plan, L4 scheduler and faults
  bool fault = false;    // a cause found (else a warning worth a look)
  std::string what;      // the verdict, one line
  std::string evidence;  // the numbers behind it
  std::string fix;
};

// What the run recorded.
struct RunRecords {
  Json header;               // the "run" record
  Json summary;              // the "summary" record, or null (the run did not finish)
  std::vector<Json> steps;   // "step" records, the last of each step
  std::vector<Json> faults;  // faults.jsonl
};

Result<RunRecords> ReadRun(const std::string& run) {
  const fs::path metrics = fs::is_directory(run) ? fs::path(run) / "metrics.jsonl" : fs::path(run);
  std::ifstream in(metrics);
  if (!in) {
    return NotFoundError(
        fmt::format("{}: no metrics.jsonl (give a run's --out directory or its "
                    "metrics file)",
                    metrics.string()));
  }
  RunRecords r;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
      return InvalidArgumentError(
          fmt::format("{}:{}: not a metrics record", metrics.string(), line_no));
    }
    const std::string type = j["type"];
    if (type == "run") r.header = std::move(j);
    if (type == "summary") r.summary = std::move(j);
    if (type == "step" && j.contains("step") && j["step"].is_number_integer()) {
      // After a recovery the steps since the restored state come again: the later ones count.
      const int64_t step = j["step"];
      while (!r.steps.empty() && r.steps.back()["step"].get<int64_t>() >= step) r.steps.pop_back();
      r.steps.push_back(std::move(j));
    }
  }
  if (!r.header.is_object()) {
    return InvalidArgumentError(
        fmt::format("{}: no run record (the first line kc train writes)", metrics.string()));
  }
  std::ifstream faults(metrics.parent_path() / "faults.jsonl");
  for (std::string line; std::getline(faults, line);) {
    Json j = Json::parse(line, nullptr, false);
    if (j.is_object()) r.faults.push_back(std::move(j));
  }
  return r;
}

double Number(const Json& j, const char* key, double fallback = -1) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

std::vector<Finding> Diagnose(const RunRecords& r) {
  std::vector<Finding> out;
  const Json& h = r.header;
  const int ranks = static_cast<int>(Number(h, "ranks", 1));
  // L1: the devices the plan needs, and whether the ranks had them to themselves.
  if (h.contains("plan") && h["plan"].is_string()) {
    Result<parallel::ParallelPlan> plan = parallel::ParsePlanFlag(h["plan"].get<std::string>());
    if (plan.ok() && plan->world() != ranks) {
      out.push_back({.layer = 1,
                     .fault = true,
                     .what = "the run had fewer devices than its plan",
                     .evidence = fmt::format("plan {} needs {} ranks; the run had {}",
                                             h["plan"].get<std::string>(), plan->world(), ranks),
                     .fix = "find the lost devices (kc topo probe), or plan for the devices there "
                            "are (kc plan)"});
    }
  }
  const int threads = static_cast<int>(Number(h, "threads_per_rank", 1));
  const int cores = static_cast<int>(AllowedCpus().size());
  if (ranks * threads > cores) {
    out.push_back(
        {.layer = 1,
         .fault = false,
         .what = "the ranks share cores",
         .evidence = fmt::format("{} ranks x {} thread{} on {} core{} here", ranks, threads,
                                 threads == 1 ? "" : "s", cores, cores == 1 ? "" : "s"),
         .fix = "run fewer ranks or threads per rank than there are cores"});
  }
  // L1 or L4: a run that slowed down as it went (a throttled device, or another job on its
  // cores): the median step of its last quarter against its second.
  if (r.steps.size() >= 20) {
    const size_t q = r.steps.size() / 4;
    std::vector<double> early, late;
    for (size_t i = q; i < 2 * q; ++i) early.push_back(Number(r.steps[i], "step_ms", 0));
    for (size_t i = r.steps.size() - q; i < r.steps.size(); ++i) {
      late.push_back(Number(r.steps[i], "step_ms", 0));
    }
    const double e = Median(early), l = Median(late);
    if (e > 0 && l > 1.5 * e) {
      out.push_back({.layer = 1,
                     .fault = true,
                     .what = "steps slowed down during the run: a device throttled, or other work "
                             "on its cores (L4)",
                     .evidence = fmt::format("median step {:.1f} ms in the second quarter, {:.1f} "
                                             "ms in the last ({:.1f}x)",
                                             e, l, l / e),
                     .fix = "compare kc topo probe's rates with the inventory's; look for other "
                            "processes on the run's cores (top, kc jobs)"});
    }
  }
  // L2: communication the steps waited for, and the lanes' order.
  const Json& s = r.summary;
  const double exposed = Number(s, "exposed_comm_share");
  const double bubble = Number(s, "bubble"), ideal = Number(s, "bubble_ideal");
  // A pipeline's stages wait for each other inside their sends and receives: waits its bubble
  // explains are L3's, not the links'.
  const bool bubble_explains = bubble > 0.2 && exposed <= bubble + 0.1;
  // The admin's rate limit holding the collectives back (rank 0's wait for its token buckets).
  double limited = 0;  // the share of the step time spent waiting for the rate limiter
  {
    double waited = 0, stepped = 0;
    std::vector<double> per_step;
    for (const Json& st : r.steps) {
      const double w = Number(st, "rate_limit_wait_ms", 0), ms = Number(st, "step_ms", 0);
      waited += w;
      stepped += ms;
      per_step.push_back(w);
    }
    const double share = stepped > 0 ? waited / stepped : 0;
    limited = share;
    if (share > 0.05) {
      const Json& limits = h.contains("comm_limits") ? h["comm_limits"] : Json();
      out.push_back(
          {.layer = 2,
           .fault = share > 0.2,
           .what = "the job's comm limits hold its collectives back",
           .evidence = fmt::format(
               "{:.0f}% of the step time waiting for the rate limiter ({:.1f} ms a step, "
               "median); limit {:.0f} operations/s, {:.3g} GB/s",
               share * 100, Median(per_step), Number(limits, "ops_per_second", 0),
               Number(limits, "bytes_per_second", 0) / 1e9),
           .fix = "a cluster admin raises this job's entry (or the default) in the cluster's "
                  "comm-limits.yaml; or send fewer, larger messages (--bucket-mb)"});
    }
  }
  // Exposure the rate limiter explains is the limiter's finding, above.
  if (exposed > 0.4 && !bubble_explains && limited < 0.5 * exposed) {
    out.push_back({.layer = 2,
                   .fault = true,
                   .what = "the steps wait for communication",
                   .evidence = fmt::format("{:.0f}% of each step is exposed communication (the "
                                           "seed flags > 40%)",
                                           exposed * 100),
                   .fix = "larger gradient buckets (--bucket-mb), overlap (--grad-sync bucketed), "
                          "or fewer ranks per link; kc bench comm measures the links"});
  }
  if (h.contains("comm_limits") && h["comm_limits"].is_object()) {
    const Json& lanes = h["comm_limits"]["lanes"];
    if (lanes.is_object() && lanes.contains("priority") && lanes["priority"].is_array() &&
        !lanes["priority"].empty() && lanes["priority"][0] != "gradient") {
      out.push_back(
          {.layer = 2,
           .fault = true,
           .what = "the gradient lane is not first: gradient synchronisation waits behind "
                   "other traffic",
           .evidence = fmt::format("lane priority {} (recommended: gradient, activation, "
                                   "control, telemetry)",
                                   lanes["priority"].dump()),
           .fix = "put gradient first in the comm limits file's lanes.priority (the seed's "
                  "50% slowdown was telemetry above gradients)"});
    }
  }
  // L3: the pipeline's bubble against its schedule's ideal, and the plan's prediction.
  if (bubble > 0.2 && ideal >= 0) {
    out.push_back({.layer = 3,
                   .fault = true,
                   .what = "the pipeline is idle much of each step (its bubble)",
                   .evidence = fmt::format("bubble {:.0f}% of each stage's time (the schedule's "
                                           "ideal for this plan: {:.0f}%); {:.0f}% of each step "
                                           "waits in communication, the stages waiting for "
                                           "each other",
                                           bubble * 100, ideal * 100, exposed * 100),
                   .fix = "more micro-batches per step (micro_batches >= 4 x p), an interleaved "
                          "or zero-bubble schedule, or fewer stages (kc plan)"});
  }
  const double predicted = Number(h, "predicted_step_s"), step_ms = Number(s, "step_ms");
  if (predicted > 0 && step_ms > 0 && step_ms / 1000 > 1.3 * predicted) {
    out.push_back({.layer = 3,
                   .fault = false,
                   .what = "steps are slower than the plan predicted",
                   .evidence = fmt::format("median step {:.1f} ms, predicted {:.1f} ms", step_ms,
                                           predicted * 1000),
                   .fix = "recalibrate (kc plan --calibrate) on an idle machine, then look at "
                          "L1 and L2 above"});
  }
  // L4: ranks lost, recoveries, stops below the minimum.
  int detected = 0, recovered = 0, stopped = 0;
  std::string first;
  for (const Json& f : r.faults) {
    const std::string event = f.value("event", "");
    if (event == "detected") {
      if (detected++ == 0) {
        first = fmt::format("worker {}: {}", f.value("worker", -1), f.value("reason", ""));
      }
    }
    recovered += event == "recovered";
    stopped += event == "stopped";
  }
  if (detected > 0) {
    out.push_back(
        {.layer = 4,
         .fault = stopped > 0 || r.summary.is_null(),
         .what = fmt::format("{} rank{} failed during the run", detected, detected == 1 ? "" : "s"),
         .evidence = fmt::format("first: {}; {} recover{}{}", first, recovered,
                                 recovered == 1 ? "y" : "ies",
                                 stopped > 0 ? "; stopped below the minimum" : ""),
         .fix = "read faults.jsonl; a rank killed from outside (OOM killer, "
                "preemption) is in the host's logs"});
  }
  if (r.summary.is_null()) {
    out.push_back({.layer = 4,
                   .fault = true,
                   .what = "the run did not finish",
                   .evidence = fmt::format("{} steps recorded of {}", r.steps.size(),
                                           static_cast<int64_t>(Number(h, "steps", 0))),
                   .fix = "kc train's output says why; with --checkpoint-dir the same command "
                          "resumes"});
  }
  std::stable_sort(out.begin(), out.end(), [](const Finding& a, const Finding& b) {
    return a.fault != b.fault ? a.fault : a.layer < b.layer;
  });
  return out;
}

int RunDiagnose(const DiagnoseArgs& a) {
  Result<RunRecords> r = ReadRun(a.run);
  if (!r.ok()) {
    std::cerr << "kc diagnose: " << r.status().message() << "\n";
    return kExitBadInput;
  }
  const std::vector<Finding> findings = Diagnose(*r);
  if (a.json) {
    Json out = Json::array();
    for (const Finding& f : findings) {
      out.push_back({{"layer", fmt::format("L{}", f.layer)},
                     {"kind", f.fault ? "fault" : "warning"},
                     {"what", f.what},
                     {"evidence", f.evidence},
                     {"fix", f.fix}});
    }
    std::cout << Json{{"run", a.run}, {"findings", out}}.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << fmt::format("kc diagnose {}: {} ({} rank{}, {} steps recorded)\n", a.run,
                           r->header.value("model", std::string("?")),
                           static_cast<int>(Number(r->header, "ranks", 1)),
                           Number(r->header, "ranks", 1) == 1 ? "" : "s", r->steps.size());
  if (findings.empty()) {
    std::cout << "  nothing found at L1 (devices), L2 (communication), L3 (the plan) or L4 "
                 "(faults)\n";
  }
  for (const Finding& f : findings) {
    std::cout << fmt::format("  L{} {:<7} {}\n            {}\n            fix: {}\n", f.layer,
                             f.fault ? "fault" : "warning", f.what, f.evidence, f.fix);
  }
  return kExitOk;
}

}  // namespace

void AddDiagnoseCommand(CLI::App& app, Action* action) {
  auto a = std::make_shared<DiagnoseArgs>();
  CLI::App* c = app.add_subcommand(
      "diagnose",
      "Look at a run bottom-up (L1 devices, L2 communication, L3 the plan, L4 faults) and say "
      "what is wrong, with the evidence and the fix");
  c->add_option("run", a->run, "A kc train run: its --out directory, or its metrics.jsonl")
      ->required();
  c->add_flag("--json", a->json, "The findings as JSON");
  c->callback([action, a] { *action = [a] { return RunDiagnose(*a); }; });
}

}  // namespace kc::app
