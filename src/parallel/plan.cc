// Reading, writing and checking parallel plans (docs/user-guide/plans.md).
#include "parallel/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <utility>

#include "base/config.h"

namespace kc::parallel {
namespace {

constexpr double kMaxWays = 1 << 20;  // any of t, p, d, v: far beyond a real cluster

Result<ParallelPlan> ParsePlan(config::Document doc, PlanKeys* stated) {
  config::Map root = doc.root();
  if (stated != nullptr) {
    stated->micro_batch_size = root.Has("micro_batch_size");
    stated->micro_batches = root.Has("micro_batches");
  }
  ParallelPlan plan;
  const ParallelPlan d;
  plan.t = static_cast<int>(root.OptionalInt("t", d.t, {.min = 1, .max = kMaxWays}));
  plan.p = static_cast<int>(root.OptionalInt("p", d.p, {.min = 1, .max = kMaxWays}));
  plan.d = static_cast<int>(root.OptionalInt("d", d.d, {.min = 1, .max = kMaxWays}));
  plan.micro_batch_size =
      root.OptionalInt("micro_batch_size", d.micro_batch_size, {.min = 1, .max = 1 << 24});
  plan.micro_batches =
      root.OptionalInt("micro_batches", d.micro_batches, {.min = 1, .max = 1 << 24});
  const std::string schedule = root.OptionalChoice("schedule", ScheduleName(d.schedule),
                                                   {"gpipe", "1f1b", "interleaved", "zb-h1"});
  for (Schedule s :
       {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZeroBubbleH1}) {
    if (ScheduleName(s) == schedule) plan.schedule = s;
  }
  plan.v = static_cast<int>(root.OptionalInt("v", d.v, {.min = 1, .max = kMaxWays}));
  plan.recompute = root.OptionalBool("recompute", d.recompute);
  plan.zero_stage =
      static_cast<int>(root.OptionalInt("zero_stage", d.zero_stage, {.min = 0, .max = 3}));
  KC_RETURN_IF_ERROR(doc.Finish());
  return plan;
}

// "a, b or c".
std::string Alternatives(const std::vector<int64_t>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += i + 1 == values.size() ? " or " : ", ";
    out += std::to_string(values[i]);
  }
  return out;
}

Status Broken(const std::string& rule, const std::string& fix) {
  return InvalidArgumentError("plan: " + rule + "; " + fix);
}

}  // namespace

std::string_view ScheduleName(Schedule s) {
  switch (s) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
    case Schedule::kZeroBubbleH1:
      return "zb-h1";
  }
  return "unknown";
}

Result<ParallelPlan> LoadPlan(const std::string& path, PlanKeys* stated) {
  KC_ASSIGN_OR_RETURN(config::Document doc, config::Document::LoadFile(path));
  return ParsePlan(std::move(doc), stated);
}

Result<ParallelPlan> LoadPlanFromString(std::string_view text, std::string display_name,
                                        PlanKeys* stated) {
  KC_ASSIGN_OR_RETURN(config::Document doc,
                      config::Document::LoadString(text, std::move(display_name)));
  return ParsePlan(std::move(doc), stated);
}

Result<ParallelPlan> ParsePlanFlag(std::string_view text, PlanKeys* stated) {
  // key=value,key=value becomes the YAML flow map {key: value, key: value}, so the flag and
  // the file share one reader and its errors.
  // Pairs are separated by commas or spaces, so PlanToString's line reads back as it is.
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  std::string yaml = "{";
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find_first_of(", ", start), text.size());
    const std::string_view pair = text.substr(start, comma - start);
    if (pair.empty() && comma < text.size() && text[comma] == ' ') {  // runs of spaces
      start = comma + 1;
      continue;
    }
    const size_t eq = pair.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return InvalidArgumentError("--plan: \"" + std::string(pair) +
                                  "\" is not key=value (e.g. t=2,p=2,d=1,micro_batches=8)");
    }
    if (yaml.size() > 1) yaml += ", ";
    yaml += std::string(pair.substr(0, eq)) + ": " + std::string(pair.substr(eq + 1));
    start = comma + 1;
  }
  yaml += "}";
  return LoadPlanFromString(yaml, "--plan", stated);
}

ParallelPlan FillBatchDefaults(ParallelPlan plan, PlanKeys stated, int64_t global_batch) {
  if ((stated.micro_batch_size && stated.micro_batches) || plan.d < 1 || global_batch < 1 ||
      global_batch % plan.d != 0) {
    return plan;
  }
  const int64_t share = global_batch / plan.d;
  if (stated.micro_batches) {
    if (plan.micro_batches >= 1 && share % plan.micro_batches == 0) {
      plan.micro_batch_size = share / plan.micro_batches;
    }
    return plan;
  }
  if (stated.micro_batch_size) {
    if (plan.micro_batch_size >= 1 && share % plan.micro_batch_size == 0) {
      plan.micro_batches = share / plan.micro_batch_size;
    }
    return plan;
  }
  int64_t m = 1;
  if (plan.p > 1) {
    // 2p-4p micro-batches keep the bubble small (plans.md, "Choosing m"); fewer than p
    // leave a stage idle in 1F1B's steady state.
    auto fits = [&](int64_t x) {
      return x >= plan.p && (plan.schedule != Schedule::kInterleaved || x % plan.p == 0);
    };
    m = 0;
    for (int64_t x : Divisors(share)) {
      if (fits(x) && (x <= 4 * plan.p || m == 0)) m = x;
    }
    if (m == 0) return plan;
  }
  plan.micro_batches = m;
  plan.micro_batch_size = share / m;
  return plan;
}

std::string PlanToString(const ParallelPlan& plan) {
  return fmt::format(
      "t={} p={} d={} micro_batch_size={} micro_batches={} schedule={} v={} recompute={} "
      "zero_stage={}",
      plan.t, plan.p, plan.d, plan.micro_batch_size, plan.micro_batches,
      ScheduleName(plan.schedule), plan.v, plan.recompute ? "true" : "false", plan.zero_stage);
}

std::string PlanToYaml(const ParallelPlan& plan) {
  std::ostringstream out;
  out << "t: " << plan.t << "                 # tensor-parallel ranks per layer\n"
      << "p: " << plan.p << "                 # pipeline stages\n"
      << "d: " << plan.d << "                 # data-parallel replicas\n"
      << "micro_batch_size: " << plan.micro_batch_size << "  # sequences per micro-batch\n"
      << "micro_batches: " << plan.micro_batches << "     # per step per replica\n"
      << "schedule: " << ScheduleName(plan.schedule) << "\n"
      << "v: " << plan.v << "                 # model chunks per stage (interleaved)\n"
      << "recompute: " << (plan.recompute ? "true" : "false") << "\n"
      << "zero_stage: " << plan.zero_stage << "\n";
  return out.str();
}

std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t i = 1; i * i <= n; ++i) {
    if (n % i != 0) continue;
    low.push_back(i);
    if (i != n / i) high.push_back(n / i);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

Status ValidatePlan(const ParallelPlan& plan, const ModelSpec& spec, int world_size,
                    int64_t global_batch) {
  if (plan.t < 1 || plan.p < 1 || plan.d < 1 || plan.v < 1 || plan.micro_batch_size < 1 ||
      plan.micro_batches < 1) {
    return Broken("t, p, d, v, micro_batch_size and micro_batches must be at least 1",
                  "got " + PlanToString(plan));
  }
  if (plan.world() != world_size) {
    // Keep t and p if they fit, and say which d would; else the factorisations that exist.
    const int tp = plan.t * plan.p;
    std::string fix;
    if (world_size % tp == 0) {
      fix = fmt::format("with t={} p={}, d={} fits {} ranks", plan.t, plan.p, world_size / tp,
                        world_size);
    } else {
      fix = fmt::format("t*p must divide {}: it is one of {}", world_size,
                        Alternatives(Divisors(world_size)));
    }
    return Broken(fmt::format("t*p*d = {}*{}*{} = {}, but there are {} ranks", plan.t, plan.p,
                              plan.d, plan.world(), world_size),
                  fix);
  }
  // Every t the model splits by (the rank count follows the plan's t*p*d).
  auto divisors_of_both = [&] {
    std::vector<int64_t> ok;
    for (int64_t x : Divisors(spec.heads)) {
      if (spec.ffn_hidden % x == 0) ok.push_back(x);
    }
    return ok;
  };
  if (spec.heads % plan.t != 0) {
    return Broken(
        fmt::format("t={} does not divide the {} heads of model {}", plan.t, spec.heads, spec.name),
        "t in " + Alternatives(divisors_of_both()) + " works");
  }
  if (spec.ffn_hidden % plan.t != 0) {
    return Broken(fmt::format("t={} does not divide ffn_hidden {} of model {}", plan.t,
                              spec.ffn_hidden, spec.name),
                  "t in " + Alternatives(divisors_of_both()) + " works");
  }
  if (static_cast<int64_t>(plan.p) * plan.v > spec.layers) {
    return Broken(fmt::format("p*v = {}*{} model chunks for the {} layers of model {}", plan.p,
                              plan.v, spec.layers, spec.name),
                  fmt::format("every chunk needs a layer: p*v <= {}", spec.layers));
  }
  if (plan.schedule != Schedule::kInterleaved && plan.v != 1) {
    return Broken(fmt::format("v={} with schedule {}", plan.v, ScheduleName(plan.schedule)),
                  "model chunks (v > 1) need schedule interleaved; else v=1");
  }
  if (plan.schedule == Schedule::kInterleaved) {
    if (plan.v < 2 || plan.p < 2) {
      return Broken(fmt::format("schedule interleaved with p={} v={}", plan.p, plan.v),
                    "interleaving needs p >= 2 and v >= 2; with v=1 use 1f1b");
    }
    if (spec.layers % (static_cast<int64_t>(plan.p) * plan.v) != 0) {
      if (spec.layers % plan.p != 0) {
        return Broken(
            fmt::format("p={} does not divide the {} layers (interleaved)", plan.p, spec.layers),
            fmt::format("interleaving needs layers divisible by p*v: p in {}",
                        Alternatives(Divisors(spec.layers))));
      }
      std::vector<int64_t> vs;
      for (int64_t x : Divisors(spec.layers / plan.p)) {
        if (x >= 2) vs.push_back(x);
      }
      return Broken(fmt::format("v={} does not divide the {} layers per stage ({} layers over "
                                "p={})",
                                plan.v, spec.layers / plan.p, spec.layers, plan.p),
                    vs.empty() ? fmt::format("with {} layer(s) per stage no v >= 2 does; use 1f1b",
                                             spec.layers / plan.p)
                               : "v in " + Alternatives(vs) + " works");
    }
    if (plan.micro_batches % plan.p != 0) {
      return Broken(
          fmt::format("micro_batches={} is not a multiple of p={} (interleaved)",
                      plan.micro_batches, plan.p),
          fmt::format("micro_batches in {}, {}, {}, ... works", plan.p, 2 * plan.p, 3 * plan.p));
    }
  }
  if (plan.schedule != Schedule::kGpipe && plan.micro_batches < plan.p) {
    return Broken(fmt::format("micro_batches={} < p={} with schedule {}", plan.micro_batches,
                              plan.p, ScheduleName(plan.schedule)),
                  fmt::format("{} needs at least one micro-batch per stage: micro_batches >= {} "
                              "(2p-4p = {}-{} keeps the bubble small), or schedule gpipe",
                              ScheduleName(plan.schedule), plan.p, 2 * plan.p, 4 * plan.p));
  }
  if (global_batch > 0 && plan.global_batch() != global_batch) {
    const int64_t per_replica = global_batch % plan.d == 0 ? global_batch / plan.d : 0;
    return Broken(
        fmt::format("micro_batch_size*micro_batches*d = {}*{}*{} = {}, but the global "
                    "batch is {} sequences",
                    plan.micro_batch_size, plan.micro_batches, plan.d, plan.global_batch(),
                    global_batch),
        per_replica > 0
            ? fmt::format("each of the d={} replicas takes {} sequences: "
                          "micro_batch_size*micro_batches = {} (micro_batch_size in {})",
                          plan.d, per_replica, per_replica, Alternatives(Divisors(per_replica)))
            : fmt::format("d={} must divide the global batch {}", plan.d, global_batch));
  }
  if (plan.zero_stage < 0 || plan.zero_stage > 3) {
    return Broken(fmt::format("zero_stage={}", plan.zero_stage), "ZeRO stages are 0, 1, 2 or 3");
  }
  return OkStatus();
}

}  // namespace kc::parallel
