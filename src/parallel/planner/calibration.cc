#include "parallel/planner/calibration.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "hal/compute.h"
#include "parallel/gpt_model.h"
#include "parallel/optimizer.h"

namespace kc::parallel::planner {
namespace {

using nlohmann::json;
using Seconds = std::chrono::duration<double>;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// What one device measured: per micro-batch size the median forward + backward, and the
// median optimizer step.
struct DeviceTimes {
  std::vector<double> forward_backward;
  double optimizer = 0;
  Status status;
};

// Runs on the device's own thread (pinned to `cpus`); `sync` lines the devices up so that
// every timed pass runs while the others do, as in training.
DeviceTimes TimeDevice(const ModelSpec& spec, const CalibrationOptions& o, int index,
                       const std::vector<int>& cpus, std::barrier<>& sync) {
  DeviceTimes out;
  auto fail = [&](Status s) {
    out.status = std::move(s);
    return out;
  };
  // Every pass waits at the barrier: a device that failed keeps arriving so the others
  // finish (and returns its error at the end).
  const int passes = 1 + o.repetitions;
  auto arrive_rest = [&](size_t sizes_done, int passes_done, bool optimizer_done) {
    const size_t remaining = (o.micro_batch_sizes.size() - sizes_done) * passes - passes_done +
                             (optimizer_done ? 0 : passes);
    for (size_t i = 0; i < remaining; ++i) sync.arrive_and_wait();
  };

  hal::DeviceDescriptor d;
  d.id = fmt::format("calibrate/cpu{}", index);
  d.kind = hal::DeviceKind::kCpu;
  d.host = "calibrate";
  d.index_on_host = index;
  d.cpus = cpus;
  std::mt19937 rng(static_cast<uint32_t>(17 + index));
  const int cores = std::max<int>(1, static_cast<int>(cpus.size()));
  // Declared before the model, so destroyed after it.
  std::unique_ptr<hal::ComputeDevice> device;
  std::unique_ptr<Gpt<float>> last;
  out.forward_backward.assign(o.micro_batch_sizes.size(), 0);
  // Largest first: a multi-threaded BLAS started for a small batch keeps its threads, which
  // would slow the split runs after it.
  size_t done = 0;
  for (size_t k = o.micro_batch_sizes.size(); k-- > 0; ++done) {
    const int64_t b = o.micro_batch_sizes[k];
    // The trainer's split (kc train): a thread per core taking whole sequences when the batch
    // has a sequence for each, else one thread and a BLAS of every core. BLAS threads are
    // process-wide, so with several devices at once they stay at one per call.
    const bool split = b >= cores || o.device_cpus.size() > 1;
    const int threads = split ? static_cast<int>(std::min<int64_t>(b, cores)) : 1;
    last.reset();
    device.reset();
    Result<std::unique_ptr<hal::ComputeDevice>> opened =
        hal::OpenComputeDevice(d, {.threads = split ? 1 : cores});
    if (!opened.ok()) {
      arrive_rest(done, 0, false);
      return fail(opened.status());
    }
    device = std::move(*opened);
    Result<std::unique_ptr<Gpt<float>>> model =
        Gpt<float>::Create(spec, device.get(), {.batch = b, .threads = threads});
    if (!model.ok()) {
      arrive_rest(done, 0, false);
      return fail(model.status());
    }
    (*model)->InitParameters(spec.training.seed);
    std::vector<int32_t> tokens(static_cast<size_t>(b * spec.seq_len + 1));
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(spec.vocab - 1));
    for (int32_t& t : tokens) t = pick(rng);
    const std::span<const int32_t> all(tokens);
    const auto inputs = all.first(tokens.size() - 1);
    const auto targets = all.subspan(1);
    std::vector<double> times;
    for (int pass = 0; pass < passes; ++pass) {
      sync.arrive_and_wait();
      const auto start = std::chrono::steady_clock::now();
      Result<double> loss = (*model)->Forward(inputs, targets, 1.0 / (*model)->tokens());
      Status s =
          loss.ok() ? (*model)->Backward(false, [](int) { return OkStatus(); }) : loss.status();
      if (!s.ok()) {
        arrive_rest(done, pass + 1, false);
        return fail(s);
      }
      if (pass > 0) times.push_back(Seconds(std::chrono::steady_clock::now() - start).count());
    }
    out.forward_backward[k] = Median(times);
    last = std::move(*model);  // the optimizer step needs one model: the last
  }

  // The optimizer step the trainer makes: the clipping norm, then AdamW over every tensor.
  std::vector<OptimizerSlot<float>> slots;
  for (size_t i = 0; i < last->tensors().size(); ++i) {
    const int tensor = static_cast<int>(i);
    slots.push_back(
        {last->param(tensor), last->grad(tensor), last->tensors()[i].shape.size() == 2});
  }
  Result<std::unique_ptr<AdamW<float>>> adam =
      AdamW<float>::Create(spec.training, std::move(slots), device.get());
  if (!adam.ok()) {
    arrive_rest(o.micro_batch_sizes.size(), 0, false);
    return fail(adam.status());
  }
  std::vector<double> times;
  for (int pass = 0; pass < passes; ++pass) {
    sync.arrive_and_wait();
    const auto start = std::chrono::steady_clock::now();
    const double norm = (*adam)->GradNorm();
    (*adam)->Step(1e-6, ClipScale(spec.training, norm));
    if (pass > 0) times.push_back(Seconds(std::chrono::steady_clock::now() - start).count());
  }
  out.optimizer = Median(times);
  return out;
}

}  // namespace

EfficiencyFit FitEfficiency(std::span<const EfficiencyPoint> points) {
  // Least squares of y = 1/eff on x = 1/size: y = a + c x, E = 1/a, H = c/a.
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0, mean_eff = 0;
  for (const EfficiencyPoint& p : points) {
    if (p.efficiency <= 0 || p.size <= 0) continue;
    const double x = 1 / p.size, y = 1 / p.efficiency;
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
    mean_eff += p.efficiency;
  }
  EfficiencyFit fit;
  if (n == 0) return fit;
  mean_eff /= n;
  const double det = n * sxx - sx * sx;
  const double c = det > 0 ? (n * sxy - sx * sy) / det : 0;
  const double a = (sy - c * sx) / n;
  if (c <= 0 || a <= 0) {  // flat or falling: no size dependence worth modelling
    fit.matmul_efficiency = mean_eff;
    fit.efficiency_half_size = 0;
    return fit;
  }
  fit.matmul_efficiency = std::min(1.0, 1 / a);
  fit.efficiency_half_size = c / a;
  return fit;
}

std::vector<std::pair<double, double>> EfficiencyTable(std::span<const EfficiencyPoint> points) {
  std::vector<std::pair<double, double>> table;
  for (const EfficiencyPoint& p : points) {
    if (p.size > 0 && p.efficiency > 0) table.emplace_back(p.size, p.efficiency);
  }
  std::stable_sort(table.begin(), table.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  table.erase(std::unique(table.begin(), table.end(),
                          [](const auto& a, const auto& b) { return a.first == b.first; }),
              table.end());
  return table;
}

Result<ComputeCalibration> MeasureCompute(const ModelSpec& spec,
                                          const CalibrationOptions& options) {
  KC_RETURN_IF_ERROR(ValidateModelSpec(spec));
  if (options.device_cpus.empty() || options.micro_batch_sizes.empty() || options.repetitions < 1 ||
      !(options.peak_flops > 0)) {
    return InvalidArgumentError(
        "calibrate: needs at least one device, one micro-batch size, one repetition and a "
        "positive peak FLOP/s");
  }
  for (int64_t b : options.micro_batch_sizes) {
    if (b < 1) return InvalidArgumentError(fmt::format("calibrate: micro-batch size {} < 1", b));
  }
  const size_t n = options.device_cpus.size();
  std::barrier<> sync(static_cast<std::ptrdiff_t>(n));
  std::vector<DeviceTimes> times(n);
  {
    std::vector<std::jthread> threads;
    for (size_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        const std::vector<int>& cpus = options.device_cpus[i];
        if (!cpus.empty()) {  // pinned before the model's worker threads are born
          cpu_set_t set;
          CPU_ZERO(&set);
          for (int c : cpus) CPU_SET(c, &set);
          pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
        }
        times[i] = TimeDevice(spec, options, static_cast<int>(i), cpus, sync);
      });
    }
  }
  for (const DeviceTimes& t : times) KC_RETURN_IF_ERROR(t.status);

  ComputeCalibration c;
  for (size_t k = 0; k < options.micro_batch_sizes.size(); ++k) {
    EfficiencyPoint p;
    p.micro_batch_size = options.micro_batch_sizes[k];
    p.size = static_cast<double>(p.micro_batch_size * spec.seq_len * spec.hidden);
    for (const DeviceTimes& t : times) p.seconds += t.forward_backward[k] / static_cast<double>(n);
    p.efficiency = StepFlops(spec, p.micro_batch_size, false) / p.seconds / options.peak_flops;
    c.points.push_back(p);
  }
  for (const DeviceTimes& t : times) c.optimizer_seconds += t.optimizer / static_cast<double>(n);
  c.fit = FitEfficiency(c.points);
  return c;
}

std::string CalibrationToJson(const Calibration& c) {
  const ClusterSpec& k = c.cluster;
  const CostModelOptions& o = c.options;
  json j = {{"kc_calibration", 1},
            {"host", c.host},
            {"model", c.model},
            {"cpus_per_device", c.cpus_per_device},
            {"cluster",
             {{"devices", k.devices},
              {"devices_per_node", k.devices_per_node},
              {"peak_flops", k.peak_flops},
              {"memory_bytes", k.memory_bytes},
              {"memory_bandwidth", k.memory_bandwidth},
              {"intra_node_bandwidth", k.intra_node_bandwidth},
              {"intra_node_latency", k.intra_node_latency},
              {"inter_node_bandwidth", k.inter_node_bandwidth},
              {"inter_node_latency", k.inter_node_latency}}},
            {"options",
             {{"activation_bytes", o.activation_bytes},
              {"param_bytes", o.param_bytes},
              {"gradient_bytes", o.gradient_bytes},
              {"optimizer_bytes", o.optimizer_bytes},
              {"matmul_efficiency", o.matmul_efficiency},
              {"efficiency_half_size", o.efficiency_half_size},
              {"dp_overlap_fraction", o.dp_overlap_fraction},
              {"optimizer_step_bytes", o.optimizer_step_bytes},
              {"usable_memory_fraction", o.usable_memory_fraction},
              {"dp_bucket_bytes", o.dp_bucket_bytes}}},
            {"points", json::array()}};
  for (const EfficiencyPoint& p : c.points) {
    j["points"].push_back({{"micro_batch_size", p.micro_batch_size},
                           {"size", p.size},
                           {"seconds", p.seconds},
                           {"efficiency", p.efficiency}});
  }
  return j.dump(2) + "\n";
}

Result<Calibration> CalibrationFromJson(std::string_view text, const std::string& display_name) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    return InvalidArgumentError(fmt::format("{}: not JSON: {}", display_name, e.what()));
  }
  std::string where;
  auto num = [&](const json& obj, const char* section, const char* key, auto* out) -> Status {
    where = fmt::format("{}{}{}", section, *section ? "." : "", key);
    if (!obj.is_object() || !obj.contains(key) || !obj[key].is_number()) {
      return InvalidArgumentError(
          fmt::format("{}: {}: missing or not a number", display_name, where));
    }
    *out = obj[key].get<std::remove_pointer_t<decltype(out)>>();
    return OkStatus();
  };
  if (!j.is_object() || j.value("kc_calibration", 0) != 1) {
    return InvalidArgumentError(
        fmt::format("{}: not a calibration file (no \"kc_calibration\": 1)", display_name));
  }
  Calibration c;
  c.host = j.value("host", "");
  c.model = j.value("model", "");
  KC_RETURN_IF_ERROR(num(j, "", "cpus_per_device", &c.cpus_per_device));
  const json& k = j.contains("cluster") ? j["cluster"] : json();
  KC_RETURN_IF_ERROR(num(k, "cluster", "devices", &c.cluster.devices));
  KC_RETURN_IF_ERROR(num(k, "cluster", "devices_per_node", &c.cluster.devices_per_node));
  KC_RETURN_IF_ERROR(num(k, "cluster", "peak_flops", &c.cluster.peak_flops));
  KC_RETURN_IF_ERROR(num(k, "cluster", "memory_bytes", &c.cluster.memory_bytes));
  KC_RETURN_IF_ERROR(num(k, "cluster", "memory_bandwidth", &c.cluster.memory_bandwidth));
  KC_RETURN_IF_ERROR(num(k, "cluster", "intra_node_bandwidth", &c.cluster.intra_node_bandwidth));
  KC_RETURN_IF_ERROR(num(k, "cluster", "intra_node_latency", &c.cluster.intra_node_latency));
  KC_RETURN_IF_ERROR(num(k, "cluster", "inter_node_bandwidth", &c.cluster.inter_node_bandwidth));
  KC_RETURN_IF_ERROR(num(k, "cluster", "inter_node_latency", &c.cluster.inter_node_latency));
  const json& o = j.contains("options") ? j["options"] : json();
  CostModelOptions& opt = c.options;
  KC_RETURN_IF_ERROR(num(o, "options", "activation_bytes", &opt.activation_bytes));
  KC_RETURN_IF_ERROR(num(o, "options", "param_bytes", &opt.param_bytes));
  KC_RETURN_IF_ERROR(num(o, "options", "gradient_bytes", &opt.gradient_bytes));
  KC_RETURN_IF_ERROR(num(o, "options", "optimizer_bytes", &opt.optimizer_bytes));
  KC_RETURN_IF_ERROR(num(o, "options", "matmul_efficiency", &opt.matmul_efficiency));
  KC_RETURN_IF_ERROR(num(o, "options", "efficiency_half_size", &opt.efficiency_half_size));
  KC_RETURN_IF_ERROR(num(o, "options", "dp_overlap_fraction", &opt.dp_overlap_fraction));
  KC_RETURN_IF_ERROR(num(o, "options", "optimizer_step_bytes", &opt.optimizer_step_bytes));
  KC_RETURN_IF_ERROR(num(o, "options", "usable_memory_fraction", &opt.usable_memory_fraction));
  KC_RETURN_IF_ERROR(num(o, "options", "dp_bucket_bytes", &opt.dp_bucket_bytes));
  if (j.contains("points") && j["points"].is_array()) {
    for (const json& p : j["points"]) {
      EfficiencyPoint e;
      KC_RETURN_IF_ERROR(num(p, "points[]", "micro_batch_size", &e.micro_batch_size));
      KC_RETURN_IF_ERROR(num(p, "points[]", "size", &e.size));
      KC_RETURN_IF_ERROR(num(p, "points[]", "seconds", &e.seconds));
      KC_RETURN_IF_ERROR(num(p, "points[]", "efficiency", &e.efficiency));
      c.points.push_back(e);
    }
  }
  c.options.efficiency_points = EfficiencyTable(c.points);
  return c;
}

Result<Calibration> LoadCalibration(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError(fmt::format("{}: cannot open", path));
  std::stringstream text;
  text << in.rdbuf();
  return CalibrationFromJson(text.str(), path);
}

}  // namespace kc::parallel::planner
