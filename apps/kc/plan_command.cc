// `kc plan MODEL --cluster CLUSTER --batch B`, `kc plan --cases FILE`, `kc plan MODEL
// --calibrate`. docs/user-guide/plan.md.
#include "apps/kc/plan_command.h"

#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "hal/host_probe.h"
#include "hal/inventory.h"
#include "hal/topology.h"
#include "parallel/engine_support.h"
#include "parallel/planner/approval.h"
#include "parallel/planner/calibration.h"
#include "parallel/planner/cases.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/hetero.h"
#include "parallel/planner/local_host.h"
#include "parallel/planner/search.h"

namespace kc::app {
namespace {

namespace fs = std::filesystem;
namespace pl = parallel::planner;
using nlohmann::json;

struct PlanArgs {
  std::string model;
  std::string cluster;  // inventory file, calibration file, or "local"
  int64_t batch = 0;
  int64_t steps = 0;
  int fixed_t = 0;
  int max_p = 0;
  double headroom = 0;
  int64_t max_micro_batch_size = 8;
  int top = 5;
  std::string approval_limits;
  std::string out;
  std::string cases;
  bool calibrate = false;
  int devices = 0;
  std::string save;
  bool no_save = false;
  bool quick = false;
  bool json = false;
};

std::string Gb(double bytes) { return fmt::format("{:.2f} GB", bytes / 1e9); }

// "12.3 ms", "4.56 s", "2.1 h".
std::string Time(double s) {
  if (s < 1) return fmt::format("{:.1f} ms", s * 1e3);
  if (s < 3600) return fmt::format("{:.2f} s", s);
  return fmt::format("{:.1f} h", s / 3600);
}

json PlanJson(const parallel::ParallelPlan& p) {
  return {{"t", p.t},
          {"p", p.p},
          {"d", p.d},
          {"micro_batch_size", p.micro_batch_size},
          {"micro_batches", p.micro_batches},
          {"schedule", parallel::ScheduleName(p.schedule)},
          {"v", p.v},
          {"recompute", p.recompute},
          {"zero_stage", p.zero_stage}};
}

json GroupJson(const pl::GroupTraffic& g) {
  return {{"size", g.size},
          {"link", pl::LinkName(g.link)},
          {"bytes_per_step", g.bytes_per_step},
          {"time_s", g.time_s},
          {"exposed_s", g.exposed_s}};
}

json EstimateJson(const pl::PlanEstimate& e) {
  const pl::MemoryEstimate& m = e.memory;
  return {{"step_time_s", e.step_time_s},
          {"compute_s", e.compute_s},
          {"tp_exposed_s", e.tp_exposed_s},
          {"pp_exposed_s", e.pp_exposed_s},
          {"dp_exposed_s", e.dp_exposed_s},
          {"bubble_s", e.bubble_s},
          {"optimizer_s", e.optimizer_s},
          {"bubble_fraction", e.bubble_fraction},
          {"matmul_efficiency", e.matmul_efficiency},
          {"flops_per_step", e.flops_per_step},
          {"tokens_per_s", e.tokens_per_s},
          {"model_tflops_per_device", e.model_tflops_per_device},
          {"memory",
           {{"weights", m.weights},
            {"gradients", m.gradients},
            {"optimizer_state", m.optimizer_state},
            {"activations", m.activations},
            {"communication_buffers", m.communication_buffers},
            {"total", m.total},
            {"capacity", m.capacity},
            {"fits", m.fits}}},
          {"communication",
           {{"tp", GroupJson(e.tp)}, {"pp", GroupJson(e.pp)}, {"dp", GroupJson(e.dp)}}}};
}

json ClusterJson(const pl::PlannerCluster& c) {
  const pl::ClusterSpec& s = c.spec;
  return {{"name", c.name},
          {"device_model", c.device_model},
          {"precision", c.fp32 ? "fp32" : "bf16 mixed"},
          {"devices", s.devices},
          {"devices_per_node", s.devices_per_node},
          {"peak_flops", s.peak_flops},
          {"memory_bytes", s.memory_bytes},
          {"memory_bandwidth", s.memory_bandwidth},
          {"intra_node_bandwidth", s.intra_node_bandwidth},
          {"inter_node_bandwidth", s.inter_node_bandwidth},
          {"notes", c.notes}};
}

// The plan on one line with the columns of the alternatives table.
std::string Row(int rank, const pl::RankedPlan& r) {
  const parallel::ParallelPlan& p = r.plan;
  const pl::PlanEstimate& e = r.estimate;
  return fmt::format(
      "{:>3} {:>3} {:>3} {:>5} {:>3} {:>5} {:<11} {:>2} {:>3} {:>4} {:>10} {:>8.3g} "
      "{:>8.3g}  {}",
      rank, p.t, p.p, p.d, p.micro_batch_size, p.micro_batches, parallel::ScheduleName(p.schedule),
      p.v, p.recompute ? "on" : "off", p.zero_stage, Time(e.step_time_s), e.model_tflops_per_device,
      e.memory.total / 1e9, r.reason);
}

std::string RowHeader() {
  return fmt::format(
      "{:>3} {:>3} {:>3} {:>5} {:>3} {:>5} {:<11} {:>2} {:>3} {:>4} {:>10} {:>8} "
      "{:>8}  {}",
      "#", "t", "p", "d", "b", "m", "schedule", "v", "rc", "zero", "step", "TFLOP/s", "mem GB",
      "why it lost");
}

void PrintEstimate(std::ostream& os, const pl::PlanEstimate& e) {
  os << fmt::format(
      "  step time       {}  (compute {}, tensor-parallel {}, pipeline {}, "
      "data-parallel {}, bubble {}, optimizer {})\n",
      Time(e.step_time_s), Time(e.compute_s), Time(e.tp_exposed_s), Time(e.pp_exposed_s),
      Time(e.dp_exposed_s), Time(e.bubble_s), Time(e.optimizer_s));
  os << fmt::format(
      "  throughput      {:.0f} tokens/s, {:.3g} TFLOP/s per device (model FLOPs; "
      "matmul efficiency {:.0f}%)\n",
      e.tokens_per_s, e.model_tflops_per_device, e.matmul_efficiency * 100);
  os << fmt::format("  bubble          {:.1f}% of the pipeline's busy time\n",
                    e.bubble_fraction * 100);
  const pl::MemoryEstimate& m = e.memory;
  os << fmt::format(
      "  memory/device   {} = weights {} + gradients {} + optimizer {} + "
      "activations {} + comm buffers {}; {} usable: {}\n",
      Gb(m.total), Gb(m.weights), Gb(m.gradients), Gb(m.optimizer_state), Gb(m.activations),
      Gb(m.communication_buffers), Gb(m.capacity), m.fits ? "fits" : "DOES NOT FIT");
  os << "  communication per step, per device:\n";
  for (const auto& [name, g] : {std::pair{"tensor-parallel", &e.tp}, std::pair{"pipeline", &e.pp},
                                std::pair{"data-parallel", &e.dp}}) {
    if (g->size <= 1) {
      os << fmt::format("    {:<16} -\n", name);
      continue;
    }
    os << fmt::format("    {:<16} {:>5} ranks over {:<10}  {:>12}  {} ({} exposed)\n", name,
                      g->size, pl::LinkName(g->link), Gb(g->bytes_per_step), Time(g->time_s),
                      Time(g->exposed_s));
  }
}

json DeviceEstimateJson(const pl::DeviceEstimate& e) {
  json stages = json::array();
  for (const pl::StageEstimate& s : e.stages) {
    stages.push_back({{"layers", s.layers},
                      {"device_model", s.device_model},
                      {"micro_batch_s", s.micro_batch_s},
                      {"tp_link_bandwidth", s.tp_link_bandwidth},
                      {"dp_link_bandwidth", s.dp_link_bandwidth},
                      {"dp_exposed_s", s.dp_exposed_s},
                      {"optimizer_s", s.optimizer_s},
                      {"memory_bytes", s.memory_bytes},
                      {"capacity", s.capacity}});
  }
  return {{"step_time_s", e.step_time_s},
          {"pipeline_s", e.pipeline_s},
          {"tokens_per_s", e.tokens_per_s},
          {"fits", e.fits},
          {"stages", stages}};
}

json DevicePlanJson(const pl::DevicePlan& d) {
  return {{"plan", PlanJson(d.plan)},
          {"sized", DeviceEstimateJson(d.sized)},
          {"balanced", DeviceEstimateJson(d.balanced)}};
}

// "12 A100-SXM4-80GB + 12 A100-PCIE-80GB": each stage's layers and devices.
std::string StageLayers(const pl::DeviceEstimate& e) {
  std::string out;
  for (const pl::StageEstimate& s : e.stages) {
    if (!out.empty()) out += " + ";
    out += fmt::format("{} on {}", s.layers, s.device_model);
  }
  return out;
}

void PrintDevicePlans(std::ostream& os, const pl::DeviceSearchResult& r) {
  os << "\nmixed cluster, each stage priced on its own devices and links (stages sized to them, "
        "as Metis does):\n";
  const pl::DevicePlan& h = r.homogeneous;
  os << fmt::format(
      "  the chosen plan        t={} p={} d={}: {} with the engine's split ({}), {} with its "
      "stages sized ({})\n",
      h.plan.t, h.plan.p, h.plan.d, Time(h.balanced.step_time_s), StageLayers(h.balanced),
      Time(h.sized.step_time_s), StageLayers(h.sized));
  const pl::DevicePlan& b = r.best;
  os << fmt::format(
      "  best on the devices    {}: {} with its stages sized ({}), {} with the engine's split\n",
      parallel::PlanToString(b.plan), Time(b.sized.step_time_s), StageLayers(b.sized),
      Time(b.balanced.step_time_s));
  os << fmt::format(
      "  gain                   {:.2f}x over the chosen plan as the engine runs it today "
      "(the engine does not take stage sizes yet; {} plans priced)\n",
      h.balanced.step_time_s / b.sized.step_time_s, r.evaluated);
}

// The cluster named by --cluster: an inventory (YAML), a calibration (JSON), or "local".
// An inventory's topology is kept in *topology (for a mixed cluster's per-device prices).
Result<pl::PlannerCluster> LoadCluster(const std::string& name, int local_devices,
                                       const std::string& model, std::string* source,
                                       std::optional<hal::Topology>* topology) {
  if (name == "local") {
    KC_ASSIGN_OR_RETURN(
        pl::LocalCluster local,
        pl::ProbeLocalCluster(local_devices, model, UserConfigPath("calibration.json")));
    *source = local.source;
    return local.cluster;
  }
  if (!fs::exists(name)) return NotFoundError("--cluster " + name + ": no such file");
  std::ifstream in(name);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  if (s.find("\"kc_calibration\"") != std::string::npos) {
    KC_ASSIGN_OR_RETURN(pl::Calibration c, pl::CalibrationFromJson(s, name));
    *source = "calibration " + name;
    return pl::FromCalibration(c, model);
  }
  KC_ASSIGN_OR_RETURN(hal::TopologySpec spec, hal::LoadInventory(name));
  KC_ASSIGN_OR_RETURN(hal::Topology built, hal::Topology::Build(std::move(spec)));
  *source = "inventory " + name;
  topology->emplace(std::move(built));
  return pl::ClusterFromTopology(**topology);
}

int Fail(const Status& s) {
  std::cerr << "kc plan: " << s.message() << "\n";
  return s.code() == ErrorCode::kInvalidArgument || s.code() == ErrorCode::kNotFound ||
                 s.code() == ErrorCode::kResourceExhausted
             ? kExitBadInput
             : kExitFailure;
}

int RunPlan(const PlanArgs& a) {
  Result<parallel::ModelSpec> spec = parallel::LoadModelSpec(a.model);
  if (!spec.ok()) return Fail(spec.status());
  pl::ApprovalLimits limits;
  if (!a.approval_limits.empty()) {
    Result<pl::ApprovalLimits> l = pl::LoadApprovalLimits(a.approval_limits);
    if (!l.ok()) return Fail(l.status());
    limits = *l;
  }
  std::string source;
  std::optional<hal::Topology> topology;
  Result<pl::PlannerCluster> cluster =
      LoadCluster(a.cluster, a.devices > 0 ? a.devices : 0, spec->name, &source, &topology);
  if (!cluster.ok()) return Fail(cluster.status());
  const bool local = !cluster->simulated;
  pl::SearchConstraints constraints;
  constraints.fixed_t = a.fixed_t;
  constraints.max_p = a.max_p;
  constraints.memory_headroom = a.headroom;
  constraints.max_micro_batch_size = a.max_micro_batch_size;
  const int n = cluster->spec.devices;
  const int64_t batch = a.batch > 0 ? a.batch : spec->batch_per_rank * n;
  Result<pl::SearchResult> found =
      pl::SearchPlans(*spec, cluster->spec, batch, constraints, cluster->options, a.top);
  if (!found.ok()) {
    std::string why = found.status().message();
    if (constraints.fixed_t > 0 || constraints.max_p > 0 || a.headroom > 0) {
      why += fmt::format(" (with the constraints{}{}{})",
                         constraints.fixed_t > 0 ? fmt::format(" t={}", constraints.fixed_t) : "",
                         constraints.max_p > 0 ? fmt::format(" p<={}", constraints.max_p) : "",
                         a.headroom > 0 ? fmt::format(" headroom {:.0f}%", a.headroom * 100) : "");
    }
    return Fail(Status(found.status().code(), why));
  }
  const pl::RankedPlan& best = found->ranked.front();
  Result<pl::RankedPlan> baseline = pl::BaselinePlan(*spec, cluster->spec, batch, cluster->options);
  std::optional<pl::DeviceSearchResult> on_devices;
  if (cluster->mixed && topology.has_value()) {
    Result<pl::DeviceSearchResult> r =
        pl::SearchOnDevices(*spec, *topology, cluster->spec, batch, constraints, cluster->options);
    if (r.ok()) {
      on_devices = std::move(*r);
    } else {
      cluster->notes.push_back("not priced per device: " + r.status().message());
    }
  }
  const pl::ApprovalVerdict approval = pl::CheckApproval(best.plan, best.estimate, a.steps, limits);
  // A gate: a plan that needs approval is not written for kc train to run.
  const bool write = !a.out.empty() && !approval.required;
  if (write) {
    if (Status s = WriteFileAtomically(a.out, parallel::PlanToYaml(best.plan)); !s.ok()) {
      return Fail(s);
    }
  }
  const int exit_code = approval.required ? kExitNeedsApproval : kExitOk;
  if (approval.required) {
    std::cerr << "kc plan: the chosen plan needs a resource admin's approval (the limits in "
              << a.approval_limits << ")" << (a.out.empty() ? "" : "; " + a.out + " not written")
              << "\n";
  }

  if (a.json) {
    json j = {
        {"model", spec->name},
        {"parameters", parallel::ParameterCount(*spec)},
        {"cluster", ClusterJson(*cluster)},
        {"cluster_source", source},
        {"global_batch", batch},
        {"seq_len", spec->seq_len},
        {"evaluated", found->evaluated},
        {"fitting", found->fitting},
        {"chosen", {{"plan", PlanJson(best.plan)}, {"estimate", EstimateJson(best.estimate)}}},
        {"alternatives", json::array()},
        {"approval",
         {{"required", approval.required},
          {"reasons", approval.reasons},
          {"devices", approval.devices},
          {"memory_bytes_per_device", approval.memory_bytes_per_device},
          {"comm_bytes_per_step", approval.comm_bytes_per_step},
          {"steps", approval.steps},
          {"runtime_s", approval.runtime_s}}}};
    for (size_t i = 1; i < found->ranked.size(); ++i) {
      const pl::RankedPlan& r = found->ranked[i];
      j["alternatives"].push_back({{"plan", PlanJson(r.plan)},
                                   {"estimate", EstimateJson(r.estimate)},
                                   {"reason", r.reason}});
    }
    if (found->fastest_unfit) {
      j["fastest_unfit"] = {{"plan", PlanJson(found->fastest_unfit->plan)},
                            {"estimate", EstimateJson(found->fastest_unfit->estimate)},
                            {"reason", found->fastest_unfit->reason}};
    } else {
      j["fastest_unfit"] = nullptr;
    }
    if (baseline.ok()) {
      j["baseline"] = {{"plan", PlanJson(baseline->plan)},
                       {"estimate", EstimateJson(baseline->estimate)},
                       {"speedup", baseline->estimate.step_time_s / best.estimate.step_time_s}};
    } else {
      j["baseline"] = {{"error", baseline.status().message()}};
    }
    if (on_devices) {
      j["on_devices"] = {{"chosen", DevicePlanJson(on_devices->homogeneous)},
                         {"best", DevicePlanJson(on_devices->best)},
                         {"evaluated", on_devices->evaluated}};
    }
    if (write) j["written"] = a.out;
    std::cout << j.dump(2) << "\n";
    return exit_code;
  }

  std::ostream& os = std::cout;
  const pl::ClusterSpec& c = cluster->spec;
  const double params = static_cast<double>(parallel::ParameterCount(*spec));
  os << fmt::format(
      "model    {} ({} parameters), {} layers, hidden {}, {} heads, seq {}\n", spec->name,
      params >= 1e9 ? fmt::format("{:.1f} B", params / 1e9) : fmt::format("{:.1f} M", params / 1e6),
      spec->layers, spec->hidden, spec->heads, spec->seq_len);
  os << fmt::format(
      "cluster  {}: {} x {}, {} per node, {:.3g} TFLOP/s {}, {:.3g} GB, intra-node "
      "{:.1f} GB/s, inter-node {:.1f} GB/s  [{}]\n",
      cluster->name, n, cluster->device_model, c.devices_per_node, c.peak_flops / 1e12,
      cluster->fp32 ? "fp32" : "bf16", c.memory_bytes / 1e9, c.intra_node_bandwidth / 1e9,
      c.inter_node_bandwidth / 1e9, source);
  for (const std::string& note : cluster->notes) os << "         note: " << note << "\n";
  os << fmt::format("batch    {} sequences x {} tokens per step{}\n\n", batch, spec->seq_len,
                    a.batch > 0 ? "" : " (batch_per_rank x devices; --batch to change)");
  os << "chosen plan: " << parallel::PlanToString(best.plan) << "\n";
  PrintEstimate(os, best.estimate);
  if (approval.required) {
    os << "  approval        REQUIRED: " << approval.reasons.front();
    for (size_t i = 1; i < approval.reasons.size(); ++i) os << "; " << approval.reasons[i];
    os << "\n";
    os << fmt::format(
        "                  for the resource admin: {} devices, {} per device, "
        "{} of communication per step, {}\n",
        approval.devices, Gb(approval.memory_bytes_per_device), Gb(approval.comm_bytes_per_step),
        approval.steps > 0
            ? fmt::format("{} expected for {} steps", Time(approval.runtime_s), approval.steps)
            : std::string("runtime unknown (--steps)"));
  } else {
    os << "  approval        not required"
       << (a.approval_limits.empty() ? " (no limits given)" : "") << "\n";
    if (approval.steps > 0) {
      os << fmt::format("  runtime         {} for {} steps\n", Time(approval.runtime_s),
                        approval.steps);
    }
  }
  os << fmt::format("\nalternatives ({} plans evaluated, {} fit in memory):\n", found->evaluated,
                    found->fitting);
  os << RowHeader() << "\n";
  for (size_t i = 0; i < found->ranked.size(); ++i) {
    os << Row(static_cast<int>(i + 1), found->ranked[i]) << "\n";
  }
  if (found->fastest_unfit) {
    os << "lost on memory: " << parallel::PlanToString(found->fastest_unfit->plan) << " -> "
       << Time(found->fastest_unfit->estimate.step_time_s) << "; " << found->fastest_unfit->reason
       << "\n";
  }
  if (baseline.ok()) {
    os << fmt::format("\nseed's rules: {} -> {} per step; the chosen plan is {:.2f}x as fast\n",
                      parallel::PlanToString(baseline->plan), Time(baseline->estimate.step_time_s),
                      baseline->estimate.step_time_s / best.estimate.step_time_s);
  } else {
    os << "\nseed's rules: " << baseline.status().message() << "\n";
  }
  if (on_devices) PrintDevicePlans(os, *on_devices);
  if (write) {
    os << "plan written to " << a.out
       << (local ? " (kc train --plan " + a.out + ")" : std::string(" (for this cluster)")) << "\n";
  }
  return exit_code;
}

// Every case of the file, each on its own: one that cannot be read or planned is reported
// and the rest go on. Exit status: 0 when every case planned, 2 when a case is malformed, else
// 1 when a well-formed case could not be planned.
int RunCases(const PlanArgs& a) {
  Result<std::vector<pl::LoadedCase>> cases = pl::LoadCases(a.cases);
  if (!cases.ok()) return Fail(cases.status());
  json records = json::array();
  if (!a.json) {
    std::cout << fmt::format("{:<32} {:>14} {:>9} {:>9} {:>7} {:>5}  {}\n", "case",
                             "published t/p/d", "TFLOP/s", "predicted", "error", "fits",
                             "chosen plan -> predicted TFLOP/s");
  }
  int malformed = 0, unplanned = 0;
  std::vector<std::string> assumed;
  for (const pl::LoadedCase& entry : *cases) {
    Status failed = entry.status;
    Result<pl::CaseResult> r =
        failed.ok() ? pl::EvaluateCase(entry.value) : Result<pl::CaseResult>(failed);
    if (failed.ok() && !r.ok()) {
      failed =
          r.status().WithContext(fmt::format("{}: case {} ({})", a.cases, entry.index, entry.id));
    }
    if (failed.ok() && !r->chosen) failed = r->search_status;
    if (!failed.ok()) {
      ++(entry.status.ok() ? unplanned : malformed);
      std::cerr << "kc plan: " << failed.message() << "\n";
    }
    if (!r.ok()) {
      if (a.json) {
        records.push_back({{"id", entry.id}, {"ok", false}, {"message", failed.message()}});
      } else {
        std::cout << fmt::format("{:<32} not planned: {}\n", entry.id, failed.message());
      }
      continue;
    }
    const pl::PublishedCase& c = entry.value;
    for (const std::string& what : c.assumed) assumed.push_back(c.id + ": " + what);
    const double error = r->published.model_tflops_per_device / c.published_tflops - 1;
    if (a.json) {
      json rec = {
          {"id", c.id},
          {"ok", failed.ok()},
          {"published", {{"plan", PlanJson(c.plan)}, {"tflops_per_device", c.published_tflops}}},
          {"assumed", c.assumed},
          {"predicted", EstimateJson(r->published)},
          {"error", error}};
      if (r->chosen) {
        rec["chosen"] = {{"plan", PlanJson(r->chosen->plan)},
                         {"estimate", EstimateJson(r->chosen->estimate)}};
      } else {
        rec["chosen"] = {{"error", r->search_status.message()}};
        rec["message"] = failed.message();
      }
      records.push_back(rec);
      continue;
    }
    std::cout << fmt::format(
        "{:<32} {:>14} {:>9.1f} {:>9.1f} {:>+6.1f}% {:>5}  {}\n", c.id,
        fmt::format("{}/{}/{}", c.plan.t, c.plan.p, c.plan.d), c.published_tflops,
        r->published.model_tflops_per_device, error * 100, r->published.memory.fits ? "yes" : "no",
        r->chosen ? fmt::format("{} -> {:.1f}{}", parallel::PlanToString(r->chosen->plan),
                                r->chosen->estimate.model_tflops_per_device,
                                r->chosen->estimate.memory.fits ? "" : " (does not fit)")
                  : "not planned: " + r->search_status.message());
  }
  if (a.json) {
    std::cout << records.dump(2) << "\n";
  } else {
    for (const std::string& what : assumed) std::cout << "assumed  " << what << "\n";
  }
  if (malformed + unplanned > 0) {
    std::cerr << fmt::format("kc plan: {} of {} cases not planned ({} malformed)\n",
                             malformed + unplanned, cases->size(), malformed);
  }
  return malformed > 0 ? kExitBadInput : unplanned > 0 ? kExitFailure : kExitOk;
}

// `kc plan MODEL --calibrate`: this machine measured for the model (CalibrateHost), saved,
// and every plan kc train runs predicted from it.
int RunCalibrate(const PlanArgs& a) {
  Result<parallel::ModelSpec> spec = parallel::LoadModelSpec(a.model);
  if (!spec.ok()) return Fail(spec.status());
  Result<hal::HostInfo> info = hal::ProbeHost();
  if (!info.ok()) return Fail(info.status());
  // As in kc train's workers (train_command.cc): the large blocks OpenBLAS allocates and frees
  // in every product stay in the heap rather than faulting in afresh, or the timings would
  // include page faults that training does not pay.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  Result<pl::HostCalibration> measured = pl::CalibrateHost(
      *spec, *info,
      {.devices = a.devices,
       .max_micro_batch_size = a.max_micro_batch_size,
       .quick = a.quick,
       .progress = [](const std::string& what) { std::cerr << "kc plan: " << what << "...\n"; }});
  if (!measured.ok()) return Fail(measured.status());
  const pl::Calibration& cal = measured->calibration;
  const int devices = measured->devices;
  const pl::LinkCalibration& links = measured->links;
  const pl::OverlapCalibration& overlap = measured->overlap;
  const std::string save = a.save.empty() ? UserConfigPath("calibration.json") : a.save;
  if (!a.no_save) {
    if (Status s = WriteFileAtomically(save, pl::CalibrationToJson(cal)); !s.ok()) return Fail(s);
  }

  // The predictions: every plan kc train runs for this batch on these devices.
  const int64_t batch = a.batch > 0 ? a.batch : spec->batch_per_rank * devices;
  pl::SearchConstraints constraints;
  constraints.max_micro_batch_size = a.max_micro_batch_size;
  Result<pl::SearchResult> found =
      pl::SearchPlans(*spec, cal.cluster, batch, constraints, cal.options, 1000);
  if (!found.ok()) return Fail(found.status());

  if (a.json) {
    json j = {{"host", cal.host},
              {"model", cal.model},
              {"devices", devices},
              {"cpus_per_device", cal.cpus_per_device},
              {"peak_flops_per_device", cal.cluster.peak_flops},
              {"memory_bandwidth_per_device", cal.cluster.memory_bandwidth},
              {"oversubscription", cal.cluster.oversubscription},
              {"shm_bandwidth", cal.cluster.intra_node_bandwidth},
              {"shm_latency", cal.cluster.intra_node_latency},
              {"allreduce", links.allreduce},
              {"rendezvous_s", links.rendezvous_s},
              {"dp_overlap",
               {{"backward_s", overlap.backward_s},
                {"allreduce_s", overlap.allreduce_s},
                {"together_s", overlap.together_s},
                {"fraction", overlap.fraction}}},
              {"matmul_efficiency", cal.options.matmul_efficiency},
              {"efficiency_half_size", cal.options.efficiency_half_size},
              {"optimizer_seconds", measured->optimizer_seconds},
              {"optimizer_step_bytes", cal.options.optimizer_step_bytes},
              {"points", json::array()},
              {"global_batch", batch},
              {"predictions", json::array()}};
    for (const pl::EfficiencyPoint& p : cal.points) {
      j["points"].push_back({{"micro_batch_size", p.micro_batch_size},
                             {"t", p.t},
                             {"seconds", p.seconds},
                             {"efficiency", p.efficiency},
                             {"forward_share", p.forward_share},
                             {"weight_share", p.weight_share},
                             {"block_seconds", p.block_seconds},
                             {"tp_comm_seconds", p.tp_comm_seconds}});
    }
    for (const pl::RankedPlan& r : found->ranked) {
      j["predictions"].push_back({{"plan", PlanJson(r.plan)},
                                  {"plan_flag", parallel::PlanToString(r.plan)},
                                  {"estimate", EstimateJson(r.estimate)}});
    }
    if (!a.no_save) j["written"] = save;
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::ostream& os = std::cout;
  os << fmt::format("host     {}: {} device{} of {} core{}\n", cal.host, devices,
                    devices == 1 ? "" : "s", cal.cpus_per_device,
                    cal.cpus_per_device == 1 ? "" : "s");
  os << fmt::format(
      "peak     {:.1f} GFLOP/s fp32 per device (sgemm), memory {:.1f} GB/s; all-reduce "
      "between the devices {:.2f} GB/s, {:.1f} us per ring step (a collective between "
      "computing devices: {})\n",
      cal.cluster.peak_flops / 1e9, cal.cluster.memory_bandwidth / 1e9,
      cal.cluster.intra_node_bandwidth / 1e9, cal.cluster.intra_node_latency * 1e6,
      Time(links.rendezvous_s));
  for (const std::string& note : measured->notes) os << "         note: " << note << "\n";
  if (devices > 1) {
    os << fmt::format(
        "overlap  the gradient buckets hide {:.0f}% of the all-reduce behind the backward "
        "(backward {}, all-reduce {}, together {})\n",
        overlap.fraction * 100, Time(overlap.backward_s), Time(overlap.allreduce_s),
        Time(overlap.together_s));
  }
  os << fmt::format("model    {} forward + backward, every device at once:\n", cal.model);
  for (const pl::EfficiencyPoint& p : cal.points) {
    os << fmt::format(
        "  t={} micro-batch {:>2}: {:>9} per micro-batch, {:5.1f}% of peak; forward {:.0f}%, "
        "weight pass {:.0f}%, one block {}{}\n",
        p.t, p.micro_batch_size, Time(p.seconds), p.efficiency * 100, p.forward_share * 100,
        p.weight_share * 100, p.block_seconds > 0 ? Time(p.block_seconds) : "-",
        p.tp_comm_seconds > 0
            ? fmt::format("; the groups communicating {}", Time(p.tp_comm_seconds))
            : "");
  }
  os << fmt::format(
      "fit      efficiency = {:.3f} * size / (size + {:.0f}), size = b * seq * "
      "hidden / t; the measured points win inside their range\n",
      cal.options.matmul_efficiency, cal.options.efficiency_half_size);
  if (cal.options.efficiency_half_size == 0) {
    os << "         note: the efficiency does not rise with the micro-batch (a busy host, or a "
          "model too small to tell); the curve is flat, the measured points still hold\n";
  }
  os << fmt::format(
      "optimizer {} per step (clip norm + AdamW): the time of {:.1f} bytes per "
      "parameter at the memory bandwidth\n",
      Time(measured->optimizer_seconds), cal.options.optimizer_step_bytes);
  if (!a.no_save) os << "saved    " << save << " (kc plan --cluster local, kc train --plan auto)\n";
  os << fmt::format("\npredicted step time of each plan kc train runs, global batch {}:\n", batch);
  os << fmt::format("{:<96} {:>10} {:>10}\n", "plan", "step", "tokens/s");
  for (const pl::RankedPlan& r : found->ranked) {
    os << fmt::format("{:<96} {:>10} {:>10.0f}\n", parallel::PlanToString(r.plan),
                      Time(r.estimate.step_time_s), r.estimate.tokens_per_s);
  }
  return kExitOk;
}

}  // namespace

void AddPlanCommand(CLI::App& app, Action* action) {
  auto a = std::make_shared<PlanArgs>();
  a->cluster = "local";
  CLI::App* c = app.add_subcommand(
      "plan",
      "Choose a parallel plan for a model on a cluster, explained; or calibrate the cost "
      "model on this machine");
  c->add_option("model", a->model, "Model file (YAML), as for kc train");
  c->add_option("--cluster", a->cluster,
                "An inventory file (docs/user-guide/inventory.md), a calibration file, or "
                "\"local\" (this machine: its calibration, else a quick probe)")
      ->capture_default_str();
  c->add_option("--batch", a->batch,
                "Global batch in sequences (default: the model's batch_per_rank x devices)")
      ->check(CLI::PositiveNumber);
  c->add_option("--steps", a->steps, "Steps the job will run (for its expected runtime)")
      ->check(CLI::PositiveNumber);
  c->add_option("--fixed-t", a->fixed_t, "Only plans with this tensor-parallel size")
      ->check(CLI::PositiveNumber);
  c->add_option("--max-p", a->max_p, "Only plans with at most this many pipeline stages")
      ->check(CLI::PositiveNumber);
  c->add_option("--headroom", a->headroom,
                "Keep this fraction of usable device memory free, 0 to 0.9")
      ->check(CLI::Range(0.0, 0.9));
  c->add_option("--max-micro-batch", a->max_micro_batch_size, "Largest micro-batch size to try")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  c->add_option("--top", a->top, "Plans to list, the chosen one first")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  c->add_option("--approval-limits", a->approval_limits,
                "Limits past which a plan needs a resource admin's approval (YAML)");
  c->add_option("--out", a->out, "Write the chosen plan to this file (for kc train --plan)");
  c->add_option("--cases", a->cases,
                "Check the planner against published runs in this JSON file instead");
  c->add_flag("--calibrate", a->calibrate,
              "Measure this machine and the model's kernels; save the calibration and print "
              "the predicted step time of every plan kc train runs");
  c->add_option("--devices", a->devices,
                "Devices of this machine (--calibrate, --cluster local): its cores split evenly; "
                "default one per core")
      ->check(CLI::PositiveNumber);
  c->add_option("--save", a->save,
                "Where --calibrate saves (default: " + UserConfigPath("calibration.json") + ")");
  c->add_flag("--no-save", a->no_save, "--calibrate: measure and print only");
  c->add_flag("--quick", a->quick, "--calibrate: shorter measurements, less accurate");
  c->add_flag("--json", a->json, "Print JSON instead of text");
  c->callback([action, a] {
    *action = [a] {
      if (!a->cases.empty()) {
        if (!a->model.empty() || a->calibrate) {
          return Fail(InvalidArgumentError("--cases takes no model and no --calibrate"));
        }
        return RunCases(*a);
      }
      if (a->model.empty()) {
        return Fail(InvalidArgumentError("a model file is required (or --cases FILE)"));
      }
      if (a->calibrate) {
        if (a->cluster != "local") {
          return Fail(InvalidArgumentError("--calibrate measures this machine: drop --cluster"));
        }
        return RunCalibrate(*a);
      }
      return RunPlan(*a);
    };
  });
}

}  // namespace kc::app
