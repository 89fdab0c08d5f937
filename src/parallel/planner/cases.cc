#include "parallel/planner/cases.h"

#include <fmt/format.h>

#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

namespace kc::parallel::planner {
namespace {

using nlohmann::json;

// Datasheet figures of the GPUs published runs used, found by the words of gpu_type
// (case-insensitive; the first entry whose words are all there wins, so the more specific
// come first): dense 16-bit peak, memory, HBM bandwidth, NVLink bandwidth per direction and
// the network per GPU of the usual node (DGX A100: 200 Gb/s HDR a GPU; DGX H100: 400 Gb/s).
struct Datasheet {
  std::vector<std::string_view> words;
  std::string_view name;
  double peak_tflops, mem_gb, memory_gbps, nvlink_gbps, network_gbps;
};

const Datasheet* FindDatasheet(const std::string& gpu_type) {
  static const Datasheet kKnown[] = {{{"A100", "80GB"}, "A100 80GB", 312, 80, 2039, 300, 25},
                                     {{"A100", "80 GB"}, "A100 80GB", 312, 80, 2039, 300, 25},
                                     {{"A100"}, "A100 40GB", 312, 40, 1555, 300, 25},
                                     {{"H100", "PCIE"}, "H100 PCIe", 756, 80, 2000, 300, 50},
                                     {{"H100"}, "H100 SXM", 989, 80, 3350, 450, 50},
                                     {{"H200"}, "H200", 989, 141, 4800, 450, 50},
                                     {{"V100"}, "V100", 125, 32, 900, 150, 12.5}};
  std::string upper = gpu_type;
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (const Datasheet& d : kKnown) {
    bool all = true;
    for (std::string_view w : d.words) all = all && upper.find(w) != std::string::npos;
    if (all) return &d;
  }
  return nullptr;
}

// Reads `key` of `object` as T; an error names the key path.
template <typename T>
Status Get(const json& object, const std::string& path, const char* key, T* out) {
  if (!object.is_object() || !object.contains(key)) {
    return InvalidArgumentError(fmt::format("{}.{}: missing", path, key));
  }
  try {
    *out = object.at(key).get<T>();
  } catch (const json::exception&) {
    return InvalidArgumentError(fmt::format("{}.{}: expected a {}, got {}", path, key,
                                            std::is_same_v<T, std::string> ? "string" : "number",
                                            object.at(key).dump()));
  }
  return OkStatus();
}

// Whether `object` has `key`, not null.
bool Given(const json& object, const char* key) {
  return object.is_object() && object.contains(key) && !object.at(key).is_null();
}

// As Get, but a missing key or null leaves *out alone.
template <typename T>
Status GetOptional(const json& object, const std::string& path, const char* key, T* out) {
  if (!Given(object, key)) return OkStatus();
  return Get(object, path, key, out);
}

// An unstated v for the interleaved `plan`: 2 when it fits the plan rules (the layers per
// stage divide into v chunks, the micro-batches into groups of p), else the smallest v that
// does, else 1F1B. Returns what was chosen and why, for the report.
std::string ChooseInterleaving(const ModelSpec& spec, ParallelPlan* plan) {
  const int64_t per_stage = spec.layers % plan->p == 0 ? spec.layers / plan->p : 0;
  const bool groups = plan->micro_batches % plan->p == 0;
  for (int64_t v : Divisors(per_stage)) {
    if (v < 2 || !groups) continue;
    plan->v = static_cast<int>(v);
    if (v == 2) return "v=2 (unstated)";
    return fmt::format("v={} (unstated; v=2 does not divide the {} layers per stage)", v,
                       per_stage);
  }
  plan->schedule = Schedule::k1F1B;
  plan->v = 1;
  if (!groups) {
    return fmt::format(
        "schedule 1f1b (interleaving unstated, and the {} micro-batches do not divide into "
        "groups of p={})",
        plan->micro_batches, plan->p);
  }
  return fmt::format(
      "schedule 1f1b (interleaving unstated, and no v >= 2 divides the {} layers over p={})",
      spec.layers, plan->p);
}

Result<PublishedCase> ParseCase(const json& c) {
  PublishedCase out;
  KC_RETURN_IF_ERROR(Get(c, "case", "id", &out.id));
  if (!c.contains("model") || !c["model"].is_object()) {
    return InvalidArgumentError("model: missing or not an object");
  }
  const json& md = c["model"];
  ModelSpec& s = out.spec;
  s.name = out.id;
  KC_RETURN_IF_ERROR(Get(md, "model", "layers", &s.layers));
  KC_RETURN_IF_ERROR(Get(md, "model", "hidden", &s.hidden));
  KC_RETURN_IF_ERROR(Get(md, "model", "heads", &s.heads));
  KC_RETURN_IF_ERROR(Get(md, "model", "seq_len", &s.seq_len));
  KC_RETURN_IF_ERROR(Get(md, "model", "vocab", &s.vocab));
  s.ffn_hidden = 4 * s.hidden;
  KC_RETURN_IF_ERROR(GetOptional(md, "model", "ffn_hidden", &s.ffn_hidden));
  s.batch_per_rank = 1;
  s.tied_embeddings = true;
  if (s.layers < 1 || s.hidden < 1 || s.heads < 1 || s.seq_len < 1 || s.vocab < 1 ||
      s.ffn_hidden < 1 || s.hidden % s.heads != 0) {
    return InvalidArgumentError(fmt::format(
        "model: layers {}, hidden {}, heads {}, ffn_hidden {}, seq_len {}, vocab {}: each must "
        "be positive and heads must divide hidden",
        s.layers, s.hidden, s.heads, s.ffn_hidden, s.seq_len, s.vocab));
  }

  const json& cl = c.contains("cluster") ? c["cluster"] : json();
  ClusterSpec& k = out.cluster;
  KC_RETURN_IF_ERROR(Get(cl, "cluster", "gpus", &k.devices));
  std::string gpu_type;
  KC_RETURN_IF_ERROR(GetOptional(cl, "cluster", "gpu_type", &gpu_type));
  const Datasheet* sheet = FindDatasheet(gpu_type);
  // A figure the case leaves out comes from the GPU's datasheet (noted as assumed); with no
  // known GPU, it is required.
  auto figure = [&](const char* key, double Datasheet::*field, double* value) -> Status {
    if (Given(cl, key)) {
      return Get(cl, "cluster", key, value);
    }
    if (sheet == nullptr) {
      return InvalidArgumentError(
          fmt::format("cluster.{}: missing (and gpu_type \"{}\" is not a GPU whose datasheet "
                      "kc knows: A100, H100, H200, V100)",
                      key, gpu_type));
    }
    *value = sheet->*field;
    out.assumed.push_back(
        fmt::format("cluster.{}={:g} (unstated; the {} datasheet)", key, *value, sheet->name));
    return OkStatus();
  };
  double tflops = 0, mem_gb = 0, intra = 0, inter = 0, per_node = 8;
  if (Given(cl, "gpus_per_node")) {
    KC_RETURN_IF_ERROR(Get(cl, "cluster", "gpus_per_node", &per_node));
  } else {
    out.assumed.push_back("cluster.gpus_per_node=8 (unstated)");
  }
  k.devices_per_node = static_cast<int64_t>(per_node);
  KC_RETURN_IF_ERROR(figure("peak_tflops", &Datasheet::peak_tflops, &tflops));
  KC_RETURN_IF_ERROR(figure("mem_gb", &Datasheet::mem_gb, &mem_gb));
  KC_RETURN_IF_ERROR(figure("intra_node_GBps", &Datasheet::nvlink_gbps, &intra));
  KC_RETURN_IF_ERROR(figure("inter_node_GBps_per_gpu", &Datasheet::network_gbps, &inter));
  if (!(tflops > 0) || !(mem_gb > 0) || !(intra > 0) || !(inter > 0) || per_node < 1 ||
      per_node != static_cast<double>(k.devices_per_node)) {
    return InvalidArgumentError(fmt::format(
        "cluster: peak_tflops {}, mem_gb {}, intra_node_GBps {}, inter_node_GBps_per_gpu {} "
        "must be positive and gpus_per_node {} a positive whole number",
        tflops, mem_gb, intra, inter, per_node));
  }
  k.peak_flops = tflops * 1e12;
  k.memory_bytes = mem_gb * 1e9;
  k.intra_node_bandwidth = intra * 1e9;
  k.inter_node_bandwidth = inter * 1e9;
  double memory_gbps = sheet != nullptr ? sheet->memory_gbps : 0;
  KC_RETURN_IF_ERROR(GetOptional(cl, "cluster", "memory_GBps", &memory_gbps));
  k.memory_bandwidth = memory_gbps * 1e9;

  KC_RETURN_IF_ERROR(Get(c, "case", "global_batch", &out.global_batch));
  const json& pub = c.contains("published") ? c["published"] : json();
  ParallelPlan& p = out.plan;
  KC_RETURN_IF_ERROR(Get(pub, "published", "tp", &p.t));
  KC_RETURN_IF_ERROR(Get(pub, "published", "pp", &p.p));
  if (Given(pub, "dp")) {
    KC_RETURN_IF_ERROR(Get(pub, "published", "dp", &p.d));
  } else if (p.t >= 1 && p.p >= 1 && k.devices % (int64_t{p.t} * p.p) == 0) {
    p.d = static_cast<int>(k.devices / (int64_t{p.t} * p.p));
    out.assumed.push_back(fmt::format("dp={} (unstated; gpus / (tp x pp))", p.d));
  } else {
    return InvalidArgumentError(
        fmt::format("published.dp: missing, and tp {} x pp {} does not divide the {} gpus", p.t,
                    p.p, k.devices));
  }
  KC_RETURN_IF_ERROR(GetOptional(pub, "published", "microbatch", &p.micro_batch_size));
  if (p.micro_batch_size < 1 || p.d < 1 || out.global_batch % (p.micro_batch_size * p.d) != 0) {
    return InvalidArgumentError(
        fmt::format("published: micro-batch {} times dp {} must divide global_batch {}",
                    p.micro_batch_size, p.d, out.global_batch));
  }
  p.micro_batches = out.global_batch / (p.micro_batch_size * p.d);
  // Megatron-LM's published pipelines ran the interleaved schedule (Narayanan et al. 2021,
  // Sec. 5.1).
  if (p.p > 1) {
    p.schedule = Schedule::kInterleaved;
    if (Given(pub, "interleave")) {
      KC_RETURN_IF_ERROR(Get(pub, "published", "interleave", &p.v));
      if (p.v == 1) p.schedule = Schedule::k1F1B;  // no model chunks: not interleaved
    } else {
      out.assumed.push_back(ChooseInterleaving(s, &p));
    }
  }
  std::string recompute;
  KC_RETURN_IF_ERROR(GetOptional(pub, "published", "activation_recompute", &recompute));
  p.recompute = recompute.starts_with("full");
  out.options.selective_recompute = recompute == "selective";
  KC_RETURN_IF_ERROR(
      GetOptional(pub, "published", "sequence_parallel", &out.options.sequence_parallel));

  // The achieved model TFLOP/s per device, from what the paper gives: the figure itself (Eq. 3
  // FLOPs with full recompute, as Narayanan et al. count), a file's derived figure, the MFU
  // (Korthikanti et al.), the aggregate PFLOP/s, or the iteration time (the step's FLOPs as
  // the cost model counts them, over the devices and the time).
  double value = 0;
  const json& derived = c.contains("derived") ? c["derived"] : json();
  if (Given(pub, "tflops_per_gpu")) {
    KC_RETURN_IF_ERROR(Get(pub, "published", "tflops_per_gpu", &out.published_tflops));
  } else if (Given(derived, "model_tflops_per_gpu")) {
    KC_RETURN_IF_ERROR(Get(derived, "derived", "model_tflops_per_gpu", &out.published_tflops));
  } else if (Given(pub, "mfu_pct")) {
    KC_RETURN_IF_ERROR(Get(pub, "published", "mfu_pct", &value));
    out.published_tflops = value / 100 * tflops;
  } else if (Given(pub, "aggregate_pflops")) {
    KC_RETURN_IF_ERROR(Get(pub, "published", "aggregate_pflops", &value));
    out.published_tflops = value * 1e3 / static_cast<double>(k.devices);
  } else if (Given(pub, "iter_time_s")) {
    KC_RETURN_IF_ERROR(Get(pub, "published", "iter_time_s", &value));
    if (value > 0) {
      out.published_tflops = StepFlops(s, out.global_batch, p.recompute) /
                             static_cast<double>(k.devices) / value / 1e12;
    }
  } else {
    return InvalidArgumentError(
        "published: no achieved throughput: give tflops_per_gpu, mfu_pct, aggregate_pflops or "
        "iter_time_s");
  }
  if (!(out.published_tflops > 0)) {
    return InvalidArgumentError(
        fmt::format("published: the achieved throughput must be positive, got {} TFLOP/s per GPU",
                    out.published_tflops));
  }
  KC_RETURN_IF_ERROR(ValidatePlan(p, s, k.devices, out.global_batch).WithContext("published"));
  return out;
}

}  // namespace

Result<std::vector<LoadedCase>> LoadCases(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError(fmt::format("{}: cannot open", path));
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::parse_error& e) {
    return InvalidArgumentError(fmt::format("{}: not JSON: {}", path, e.what()));
  }
  if (!doc.is_array()) {
    return InvalidArgumentError(fmt::format("{}: expected an array of cases", path));
  }
  std::vector<LoadedCase> cases;
  for (size_t i = 0; i < doc.size(); ++i) {
    const json& c = doc[i];
    LoadedCase& entry = cases.emplace_back();
    entry.index = static_cast<int>(i + 1);
    entry.id =
        c.is_object() && c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : "";
    if (!c.is_object()) {
      entry.status = InvalidArgumentError(fmt::format("{}: case {}: not an object", path, i + 1));
      continue;
    }
    Result<PublishedCase> parsed = ParseCase(c);
    if (!parsed.ok()) {
      entry.status = InvalidArgumentError(
          fmt::format("{}: case {} ({}): {}", path, i + 1, entry.id, parsed.status().message()));
      continue;
    }
    entry.value = std::move(*parsed);
  }
  return cases;
}

Result<CaseResult> EvaluateCase(const PublishedCase& c) {
  CaseResult r;
  KC_ASSIGN_OR_RETURN(r.published,
                      EstimatePlan(c.spec, c.plan, c.cluster, c.global_batch, c.options));
  // The search plans for Kuangchao's engine, which overlaps the gradient all-reduce with the
  // backward (the published runs did not).
  CostModelOptions engine = c.options;
  engine.dp_overlap_fraction = kEngineDpOverlap;
  Result<SearchResult> found = SearchPlans(c.spec, c.cluster, c.global_batch, {}, engine, 1);
  if (found.ok()) {
    r.chosen = found->ranked.front();
  } else {
    r.search_status = found.status();
  }
  if (Result<RankedPlan> b = BaselinePlan(c.spec, c.cluster, c.global_batch, engine); b.ok()) {
    r.baseline = *b;
  }
  return r;
}

}  // namespace kc::parallel::planner
