#include "parallel/planner/cases.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

namespace kc::parallel::planner {
namespace {

using nlohmann::json;

// Datasheet HBM bandwidths (bytes/s) of the GPUs published runs used, by a substring of
// gpu_type; the first match wins, so the more specific names come first.
double DatasheetMemoryBandwidth(const std::string& gpu_type) {
  static const std::pair<const char*, double> kKnown[] = {
      {"A100-SXM4-80GB", 2039e9}, {"A100-SXM4-40GB", 1555e9}, {"A100", 1555e9},
      {"H100-SXM", 3350e9},       {"H100", 2000e9},           {"V100", 900e9}};
  for (const auto& [name, bandwidth] : kKnown) {
    if (gpu_type.find(name) != std::string::npos) return bandwidth;
  }
  return 0;
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

// As Get, but a missing key or null leaves *out alone.
template <typename T>
Status GetOptional(const json& object, const std::string& path, const char* key, T* out) {
  if (!object.is_object() || !object.contains(key) || object.at(key).is_null()) return OkStatus();
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
  double tflops = 0, mem_gb = 0, intra = 0, inter = 0;
  KC_RETURN_IF_ERROR(Get(cl, "cluster", "gpus", &k.devices));
  KC_RETURN_IF_ERROR(Get(cl, "cluster", "gpus_per_node", &k.devices_per_node));
  KC_RETURN_IF_ERROR(Get(cl, "cluster", "peak_tflops", &tflops));
  KC_RETURN_IF_ERROR(Get(cl, "cluster", "mem_gb", &mem_gb));
  KC_RETURN_IF_ERROR(Get(cl, "cluster", "intra_node_GBps", &intra));
  KC_RETURN_IF_ERROR(Get(cl, "cluster", "inter_node_GBps_per_gpu", &inter));
  k.peak_flops = tflops * 1e12;
  k.memory_bytes = mem_gb * 1e9;
  k.intra_node_bandwidth = intra * 1e9;
  k.inter_node_bandwidth = inter * 1e9;
  std::string gpu_type;
  KC_RETURN_IF_ERROR(GetOptional(cl, "cluster", "gpu_type", &gpu_type));
  double memory_gbps = DatasheetMemoryBandwidth(gpu_type) / 1e9;
  KC_RETURN_IF_ERROR(GetOptional(cl, "cluster", "memory_GBps", &memory_gbps));
  k.memory_bandwidth = memory_gbps * 1e9;

  KC_RETURN_IF_ERROR(Get(c, "case", "global_batch", &out.global_batch));
  const json& pub = c.contains("published") ? c["published"] : json();
  ParallelPlan& p = out.plan;
  KC_RETURN_IF_ERROR(Get(pub, "published", "tp", &p.t));
  KC_RETURN_IF_ERROR(Get(pub, "published", "pp", &p.p));
  KC_RETURN_IF_ERROR(Get(pub, "published", "dp", &p.d));
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
    if (pub.is_object() && pub.contains("interleave") && !pub["interleave"].is_null()) {
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

  // Korthikanti et al. publish MFU, not TFLOP/s; such files derive model TFLOP/s from it.
  if (pub.contains("tflops_per_gpu") && !pub["tflops_per_gpu"].is_null()) {
    KC_RETURN_IF_ERROR(Get(pub, "published", "tflops_per_gpu", &out.published_tflops));
  } else {
    const json& derived = c.contains("derived") ? c["derived"] : json();
    KC_RETURN_IF_ERROR(Get(derived, "derived", "model_tflops_per_gpu", &out.published_tflops));
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
