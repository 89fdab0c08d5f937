// `kc diagnose JOB|RUN`: the seed's bottom-up troubleshooting (L1 devices, L2 communication, L3
// the plan's execution, L4 the scheduler and faults) over what a run recorded (a local run's
// metrics.jsonl and faults.jsonl, a kcd job's records and history) and, with --live, what the
// running run and its hosts say now (apps/kc/diagnose_live.h). Each finding names its layer,
// the evidence and the fix; faults first, then warnings, bottom-up within each.
// Docs: docs/user-guide/diagnose.md.
#include "apps/kc/diagnose_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/train_job.h"
#include "apps/kc/diagnose_live.h"
#include "apps/kc/diagnose_records.h"
#include "apps/kc/kcd_client.h"
#include "apps/kc/train_setup.h"
#include "base/clock.h"
#include "comm/lanes.h"
#include "hal/host_load.h"
#include "hal/inventory.h"
#include "kc/v1/jobs.grpc.pb.h"
#include "kc/v1/topology.grpc.pb.h"
#include "parallel/plan.h"

namespace kc::app {
namespace {

namespace fs = std::filesystem;
using diagnose::Finding;
using diagnose::InspectJob;
using diagnose::InspectRun;
using diagnose::Json;
using diagnose::Live;
using diagnose::LiveLines;
using diagnose::LoadFindings;
using diagnose::LoadLines;
using diagnose::Median;
using diagnose::Number;
using diagnose::RunRecords;

struct DiagnoseArgs {
  std::string run;
  bool json = false;
  std::string login;
  bool live = false;   // ask the running run where every rank is
  double wait_s = 15;  // for its answer
};

// A step record, keeping the last of each step: after a recovery the steps since the
// restored state come again, and the later ones count.
void AddStep(RunRecords* r, Json step) {
  const int64_t n = step["step"];
  while (!r->steps.empty() && r->steps.back()["step"].get<int64_t>() >= n) r->steps.pop_back();
  r->steps.push_back(std::move(step));
}

std::vector<double> Millis(const google::protobuf::RepeatedField<double>& seconds) {
  std::vector<double> out;
  for (double s : seconds) out.push_back(s * 1e3);
  return out;
}

// What kcd keeps of job `id`: its history and its runs' typed reports (JobService.Records), as
// the records a local run writes; the newest run that reported its start is the one looked at.
Result<RunRecords> ReadJob(int64_t id, const std::string& login) {
  KC_ASSIGN_OR_RETURN(Session s, Session::Open(login));
  kc::v1::GetJobRequest get;
  get.set_id(id);
  kc::v1::JobInfo job;
  KC_RETURN_IF_ERROR(s.Call(&kc::v1::JobService::Stub::Get, get, &job));
  kc::v1::JobRecordsRequest req;
  req.set_id(id);
  kc::v1::JobRecordsResponse resp;
  KC_RETURN_IF_ERROR(s.Call(&kc::v1::JobService::Stub::Records, req, &resp));
  std::string run_id;
  for (const kc::v1::TrainReport& t : resp.reports()) {
    if (t.has_run()) run_id = t.run_id();
  }
  if (run_id.empty()) {
    return NotFoundError(fmt::format(
        "job {}: no run of it has reported yet (phase {}: {}); a command job reports none", id,
        job.phase(), job.reason()));
  }
  RunRecords r;
  r.here = false;
  for (const kc::v1::JobEvent& e : job.history()) {
    r.history.push_back({{"phase", e.phase()}, {"reason", e.reason()}});
  }
  for (const kc::v1::TrainReport& t : resp.reports()) {
    if (t.has_fault()) {
      r.faults.push_back({{"event", t.fault().event()},
                          {"worker", t.fault().worker()},
                          {"reason", t.fault().reason()}});
    }
    if (t.run_id() != run_id) continue;
    if (t.has_run()) {
      const kc::v1::RunReport& h = t.run();
      r.header = {{"type", "run"},
                  {"model", h.model()},
                  {"ranks", h.ranks()},
                  {"threads_per_rank", h.threads_per_rank()},
                  {"steps", h.steps()}};
      if (h.has_start()) r.start = h.start();
      if (!h.plan().empty()) r.header["plan"] = h.plan();
      if (h.predicted_step_s() > 0) r.header["predicted_step_s"] = h.predicted_step_s();
      if (h.has_comm_limits()) {
        const kc::v1::CommLimits& c = h.comm_limits();
        r.header["comm_limits"] = {
            {"ops_per_second", c.ops_per_second()},
            {"bytes_per_second", c.bytes_per_second()},
            {"lanes",
             {{"priority",
               std::vector<std::string>(c.lane_priority().begin(), c.lane_priority().end())}}}};
      }
    } else if (t.has_step()) {
      AddStep(&r, {{"step", t.step().step()},
                   {"step_ms", t.step().step_s() * 1e3},
                   {"rate_limit_wait_ms", t.step().rate_limit_wait_s() * 1e3},
                   {"lane_wait_ms", Millis(t.step().lane_wait_s())},
                   {"lane_backlog", std::vector<int64_t>(t.step().lane_backlog().begin(),
                                                         t.step().lane_backlog().end())},
                   {"retransmits", t.step().retransmits()},
                   {"rtt_ms", t.step().rtt_s() * 1e3}});
    } else if (t.has_ranks()) {
      std::vector<double> ms;
      for (double seconds : t.ranks().compute_s()) ms.push_back(seconds * 1e3);
      r.ranks.push_back(
          {{"workers", std::vector<int>(t.ranks().workers().begin(), t.ranks().workers().end())},
           {"compute_ms", ms}});
    } else if (t.has_summary()) {
      const kc::v1::SummaryReport& m = t.summary();
      r.summary = {{"type", "summary"},
                   {"step_ms", m.median_step_s() * 1e3},
                   {"exposed_comm_share", m.exposed_comm_share()}};
      if (m.bubble() > 0) {
        r.summary["bubble"] = m.bubble();
        r.summary["bubble_ideal"] = m.bubble_ideal();
      }
    }
  }
  return r;
}

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
      AddStep(&r, std::move(j));
    }
    if (type == "ranks") r.ranks.push_back(std::move(j));
  }
  if (!r.header.is_object()) {
    return InvalidArgumentError(
        fmt::format("{}: no run record (the first line kc train writes)", metrics.string()));
  }
  if (r.header.contains("start") && r.header["start"].is_object()) {
    kc::v1::HostLoadReport start;
    if (google::protobuf::util::JsonStringToMessage(r.header["start"].dump(), &start).ok()) {
      r.start = std::move(start);
    }
  }
  std::ifstream faults(metrics.parent_path() / "faults.jsonl");
  for (std::string line; std::getline(faults, line);) {
    Json j = Json::parse(line, nullptr, false);
    if (j.is_object()) r.faults.push_back(std::move(j));
  }
  return r;
}

constexpr const char* kDidNotFinish = "the run did not finish";

// L2 from rank 0's TCP links, as its steps recorded them (the steps over shared memory record
// none): retransmits, round trips, and the lanes' send queues.
std::vector<Finding> LinkFindings(const RunRecords& r) {
  std::vector<Finding> out;
  std::vector<const Json*> steps;
  for (const Json& st : r.steps) {
    if (st.contains("lane_wait_ms") && st["lane_wait_ms"].is_array() &&
        st["lane_wait_ms"].size() == static_cast<size_t>(comm::kNumLanes)) {
      steps.push_back(&st);
    }
  }
  if (steps.empty()) return out;
  // Retransmits: each step says its generation's count so far; a drop is a new communicator.
  double retransmits = 0, last = 0;
  std::vector<double> rtt, step_ms;
  std::array<std::vector<double>, comm::kNumLanes> wait;
  int64_t deepest[comm::kNumLanes] = {};
  for (const Json* st : steps) {
    const double n = Number(*st, "retransmits", 0);
    retransmits += n >= last ? n - last : n;
    last = n;
    rtt.push_back(Number(*st, "rtt_ms", 0));
    step_ms.push_back(Number(*st, "step_ms", 0));
    for (int l = 0; l < comm::kNumLanes; ++l) {
      wait[l].push_back((*st)["lane_wait_ms"][l].get<double>());
      if ((*st).contains("lane_backlog") && (*st)["lane_backlog"].size() > static_cast<size_t>(l)) {
        deepest[l] = std::max(deepest[l], (*st)["lane_backlog"][l].get<int64_t>());
      }
    }
  }
  const double per_step = retransmits / static_cast<double>(steps.size());
  if (retransmits >= 10 && per_step >= 0.5) {
    out.push_back(
        {.layer = 2,
         .fault = true,
         .what = "the links between hosts retransmit: a lossy or congested link",
         .evidence = fmt::format("{:.0f} TCP segments retransmitted over {} steps ({:.1f} a "
                                 "step) on rank 0's links; round trip {:.2f} ms (median)",
                                 retransmits, steps.size(), per_step, Median(rtt)),
         .fix = "look at the link: its NICs' error and drop counters (ip -s link), the "
                "switch port, a shaping or loss rule (tc qdisc show); kc bench comm measures "
                "it"});
  }
  if (Median(rtt) > 5) {
    out.push_back({.layer = 2,
                   .fault = false,
                   .what = "a slow link: the round trip between hosts is long for a cluster",
                   .evidence = fmt::format("smoothed round trip {:.1f} ms (median over {} "
                                           "steps) on rank 0's links",
                                           Median(rtt), steps.size()),
                   .fix = "hosts far apart or a congested path: place the job's hosts closer "
                          "(one rack), or look at the path's queues"});
  }
  const double step = Median(step_ms);
  for (comm::Lane lane : comm::kAllLanes) {
    const int l = static_cast<int>(lane);
    const double w = Median(wait[static_cast<size_t>(l)]);
    if (step <= 0 || w < 0.2 * step) continue;
    out.push_back(
        {.layer = 2,
         .fault = lane == comm::Lane::kGradient || lane == comm::Lane::kActivation,
         .what = fmt::format("{} traffic waits in its send queue", comm::LaneName(lane)),
         .evidence = fmt::format("its chunks queued {:.1f} ms a step together (median; the step "
                                 "{:.1f} ms), at most {} chunks queued at once, on rank 0's "
                                 "links",
                                 w, step, deepest[l]),
         .fix = "if the lanes' priority puts another lane first, put gradient first (the seed's "
                "incident); else the link is the bottleneck: a faster link, fewer bytes (larger "
                "buckets, --bucket-mb), or fewer ranks a host"});
  }
  return out;
}

// Faults first, bottom-up; then warnings, bottom-up.
void SortFindings(std::vector<Finding>* findings) {
  std::stable_sort(findings->begin(), findings->end(), [](const Finding& a, const Finding& b) {
    return a.fault != b.fault ? a.fault : a.layer < b.layer;
  });
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
  if (r.here && ranks * threads > cores) {
    out.push_back(
        {.layer = 1,
         .fault = false,
         .what = "the ranks share cores",
         .evidence = fmt::format("{} ranks x {} thread{} on {} core{} here", ranks, threads,
                                 threads == 1 ? "" : "s", cores, cores == 1 ? "" : "s"),
         .fix = "run fewer ranks or threads per rank than there are cores"});
  }
  // L1: a straggler, one rank computing much slower than the others (a throttled device, or
  // other work on its cores), from each rank's compute time per step over the run.
  {
    std::map<int, std::vector<double>> per_worker;
    std::map<int, int> rank_of;
    for (const Json& k : r.ranks) {
      if (!k.contains("workers") || !k.contains("compute_ms")) continue;
      const std::vector<int> workers = k["workers"].get<std::vector<int>>();
      const std::vector<double> ms = k["compute_ms"].get<std::vector<double>>();
      for (size_t i = 0; i < workers.size() && i < ms.size(); ++i) {
        per_worker[workers[i]].push_back(ms[i]);
        rank_of[workers[i]] = static_cast<int>(i);
      }
    }
    if (per_worker.size() >= 2) {
      int slowest = -1;
      double worst = 0;
      std::map<int, double> median;
      for (auto& [w, v] : per_worker) {
        median[w] = Median(v);
        if (median[w] > worst) {
          worst = median[w];
          slowest = w;
        }
      }
      std::vector<double> others;
      for (const auto& [w, m] : median) {
        if (w != slowest) others.push_back(m);
      }
      const double typical = Median(others);
      if (typical > 0 && worst > 1.5 * typical) {
        const int rank = rank_of[slowest];
        out.push_back(
            {.layer = 1,
             .fault = true,
             .what = fmt::format("rank {}{} is a straggler: the others wait for it at every "
                                 "step",
                                 rank, rank == slowest ? "" : fmt::format(" (worker {})", slowest)),
             .evidence = fmt::format("it computes {:.1f} ms a step, the others {:.1f} ms "
                                     "({:.1f}x; median over {} samples)",
                                     worst, typical, worst / typical, per_worker[slowest].size()),
             .fix = "a throttled device, or other work on its cores: compare kc topo probe's "
                    "rates on its host with the inventory's; look for other processes on its "
                    "cores (top)"});
      }
    }
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
  for (Finding& f : LinkFindings(r)) out.push_back(std::move(f));
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
         .fix = r.here ? "read faults.jsonl; a rank killed from outside (OOM killer, "
                         "preemption) is in the host's logs"
                       : "kc audit query --action fault. has every event; a rank killed from "
                         "outside (OOM killer) is in its host's logs"});
  }
  // L4: what kcd's scheduler and its users did to the job (a kcd job's history).
  int preempted = 0, paused = 0, requeued = 0;
  std::string first_preempt, flagged;
  for (size_t i = 1; i < r.history.size(); ++i) {
    const std::string from = r.history[i - 1].value("phase", ""),
                      to = r.history[i].value("phase", ""), why = r.history[i].value("reason", "");
    if (why.starts_with("flagged:")) flagged = why;
    if (from != "running") continue;
    if (to == "paused") ++paused;
    if (to != "queued") continue;
    if (why.find("preempt") != std::string::npos) {
      if (preempted++ == 0) first_preempt = why;
    } else {
      ++requeued;
    }
  }
  if (preempted > 0) {
    out.push_back(
        {.layer = 4,
         .fault = true,
         .what = fmt::format("the scheduler stopped the job {} time{} for other work (preempted)",
                             preempted, preempted == 1 ? "" : "s"),
         .evidence = "first: " + first_preempt,
         .fix = "submit it in a higher class, or to a pool that does not lend its devices (kc "
                "pools); checkpoint_every: auto keeps what each preemption costs small"});
  }
  if (paused > 0 || requeued > 0) {
    out.push_back(
        {.layer = 4,
         .fault = false,
         .what = fmt::format("the job was paused {} time{} and requeued {} time{}", paused,
                             paused == 1 ? "" : "s", requeued, requeued == 1 ? "" : "s"),
         .evidence = "its history (kc job show)",
         .fix = "each resumes from its newest checkpoint: steps since it are done again"});
  }
  if (!flagged.empty()) {
    out.push_back({.layer = 4,
                   .fault = false,
                   .what = "the cluster's pools or topology changed under the job",
                   .evidence = flagged,
                   .fix = "nothing while it runs; its next run is placed by the new pools"});
  }
  if (r.summary.is_null()) {
    out.push_back({.layer = 4,
                   .fault = true,
                   .what = kDidNotFinish,
                   .evidence = fmt::format("{} steps recorded of {}", r.steps.size(),
                                           static_cast<int64_t>(Number(h, "steps", 0))),
                   .fix = r.here ? "kc train's output says why; with --checkpoint-dir the same "
                                   "command resumes"
                                 : "its history (kc job show) and output (kc job logs) say why"});
  }
  SortFindings(&out);
  return out;
}

int RunDiagnose(const DiagnoseArgs& a) {
  // A job's id (digits, and no such file here), or a run's directory or metrics file.
  const bool job = !a.run.empty() && a.run.find_first_not_of("0123456789") == std::string::npos &&
                   !fs::exists(a.run);
  Result<RunRecords> r =
      job ? (a.run.size() > 18 ? Result<RunRecords>(InvalidArgumentError(
                                     "job " + a.run + ": not a job id (too large)"))
                               : ReadJob(std::stoll(a.run), a.login))
          : ReadRun(a.run);
  if (!r.ok()) {
    std::cerr << "kc diagnose: " << r.status().message() << "\n";
    return kExitBadInput;
  }
  std::vector<Finding> findings = Diagnose(*r);
  std::optional<Live> live;
  if (a.live) {
    Result<Live> got =
        job ? InspectJob(std::stoll(a.run), a.login, a.wait_s) : InspectRun(a.run, *r, a.wait_s);
    if (!got.ok()) {
      std::cerr << "kc diagnose: --live: " << got.status().message() << "\n";
      return kExitFailure;
    }
    live = *std::move(got);
    // It answered: it is still going, not a run that did not finish.
    std::erase_if(findings, [](const Finding& f) { return f.what == kDidNotFinish; });
    for (Finding& f : LoadFindings(*live, *r)) findings.push_back(std::move(f));
    SortFindings(&findings);
    if (!live->progress.hang().empty()) {
      findings.insert(
          findings.begin(),
          {.layer = 2,
           .fault = true,
           .what = "a hang: ranks wait in a collective that others have not entered",
           .evidence = live->progress.hang(),
           .fix = "look at the ranks that have not entered it: stopped, wedged or far slower (read "
                  "their stacks: gdb -p, py-spy); killing one lets an elastic run go on without "
                  "it"});
    }
  }
  if (a.json) {
    Json out = Json::array();
    for (const Finding& f : findings) {
      out.push_back({{"layer", fmt::format("L{}", f.layer)},
                     {"kind", f.fault ? "fault" : "warning"},
                     {"what", f.what},
                     {"evidence", f.evidence},
                     {"fix", f.fix}});
    }
    Json doc{{"run", a.run}, {"findings", out}};
    if (live) {
      doc["live"] = Json::parse(api::ReportJson(live->progress), nullptr, false);
      Json hosts = Json::array();
      for (const kc::v1::HostLoadReport& h : live->hosts) {
        hosts.push_back(Json::parse(api::ReportJson(h), nullptr, false));
      }
      doc["live"]["hosts"] = std::move(hosts);
      doc["live"]["notes"] = live->notes;
    }
    std::cout << doc.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << fmt::format("kc diagnose {}: {} ({} rank{}, {} steps recorded)\n", a.run,
                           r->header.value("model", std::string("?")),
                           static_cast<int>(Number(r->header, "ranks", 1)),
                           Number(r->header, "ranks", 1) == 1 ? "" : "s", r->steps.size());
  if (live) {
    std::cout << fmt::format("  live, request {}: where every rank is\n", live->progress.request());
    for (const std::string& line : LiveLines(live->progress)) std::cout << "    " << line << "\n";
    std::cout << "  live: what its hosts' cores do now\n";
    for (const std::string& line : LoadLines(*live, *r)) std::cout << "    " << line << "\n";
  }
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
  c->add_option("target", a->run,
                "A kcd job's id (what its runs reported to kcd), or a kc train run: its --out "
                "directory, or its metrics.jsonl")
      ->required();
  c->add_option("--login", a->login, "For a job: the login file (default CONFIG/kc/login.json)");
  c->add_flag("--json", a->json, "The findings as JSON");
  c->add_flag("--live", a->live,
              "Also ask the running run where every rank is in its collectives (its newest "
              "operations, and who holds up whom)");
  c->add_option("--wait", a->wait_s, "--live: seconds to wait for the run's answer")
      ->check(CLI::PositiveNumber);
  c->callback([action, a] { *action = [a] { return RunDiagnose(*a); }; });
}

}  // namespace kc::app
