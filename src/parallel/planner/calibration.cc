#include "parallel/planner/calibration.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "comm/bucket.h"
#include "comm/communicator.h"
#include "comm/hash_store.h"
#include "hal/compute.h"
#include "parallel/gpt_model.h"
#include "parallel/optimizer.h"
#include "parallel/tensor_parallel.h"

namespace kc::parallel::planner {
namespace {

using nlohmann::json;
using Seconds = std::chrono::duration<double>;

// Pins the calling thread to `cpus` (nothing when empty), before any thread it starts.
void PinTo(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Arithmetic the compiler cannot drop: `iterations` dependent multiply-adds.
void Spin(int64_t iterations) {
  volatile double sink = 1;
  double x = sink;
  for (int64_t i = 0; i < iterations; ++i) x = x * 0.999999 + 1e-6;
  sink = x;
}

// Least squares of y = a + c x over (x, y) points.
struct Line {
  double a = 0;  // intercept
  double c = 0;  // slope; 0 when the x do not vary
};
Line FitLine(const std::vector<std::pair<double, double>>& xy) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : xy) {
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  Line line;
  if (n == 0) return line;
  const double det = n * sxx - sx * sx;
  line.c = det > 0 ? (n * sxy - sx * sy) / det : 0;
  line.a = (sy - line.c * sx) / n;
  return line;
}

// A name no other calibration group of this process has.
std::string CalibrationGroup(std::string_view kind) {
  static std::atomic<int> groups{0};
  return fmt::format("kc-calibrate-{}{}-{}", kind, getpid(), groups++);
}

// Rank `rank` of `size` devices' communicator of `group` (this process's shared memory, as the
// trainer's). Operations time out after a minute: a rank that fails leaves the others waiting
// that long at most.
Result<std::unique_ptr<comm::Communicator>> CalibrationComm(comm::Store* store,
                                                            const std::string& group, int rank,
                                                            int size) {
  return comm::Communicator::Create({.store = store,
                                     .group = group,
                                     .rank = rank,
                                     .size = size,
                                     .host = "calibrate",
                                     .connect_timeout = std::chrono::seconds(60),
                                     .timeout = std::chrono::seconds(60)});
}

// Runs body(rank, comm) on a thread per entry of `device_cpus`, pinned to its cores, each
// rank with its communicator of one group (CalibrationComm); returns the first error.
Status OnRanks(const std::vector<std::vector<int>>& device_cpus, std::string_view what,
               const std::function<Status(int rank, comm::Communicator& comm)>& body) {
  const std::string group = CalibrationGroup("");
  const int k = static_cast<int>(device_cpus.size());
  comm::HashStore store;
  std::vector<Status> status(static_cast<size_t>(k));
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < k; ++r) {
      threads.emplace_back([&, r] {
        PinTo(device_cpus[static_cast<size_t>(r)]);
        Result<std::unique_ptr<comm::Communicator>> c = CalibrationComm(&store, group, r, k);
        status[static_cast<size_t>(r)] = c.ok() ? body(r, **c) : c.status();
      });
    }
  }
  for (const Status& st : status)
    KC_RETURN_IF_ERROR(st.WithContext(fmt::format("calibrate: {}", what)));
  return OkStatus();
}

// A tensor-parallel group that does not communicate: the device times its 1/t share of every
// layer's arithmetic alone (rank 0's shard; MeasureCommunication times the all-reduces).
class SilentGroup final : public TensorParallelGroup {
 public:
  explicit SilentGroup(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  Status AllReduce(std::span<std::byte>, size_t, hal::DataType, comm::ReduceOp) override {
    return OkStatus();
  }

 private:
  const int size_;
};

// A tensor-parallel group that does communicate, over a sub-communicator of the devices:
// the all-reduces as the trainer's ranks make them, among devices that compute beside them.
class CommGroup final : public TensorParallelGroup {
 public:
  explicit CommGroup(std::unique_ptr<comm::Communicator> comm) : comm_(std::move(comm)) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  Status AllReduce(std::span<std::byte> data, size_t count, hal::DataType type,
                   comm::ReduceOp op) override {
    KC_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> w, comm_->Allreduce(data, count, type, op));
    return w->Wait();
  }

 private:
  std::unique_ptr<comm::Communicator> comm_;
};

// What is timed: one (t, micro-batch size) in one of four ways.
enum class Probe : uint8_t {
  kWhole,   // every layer: forward, then backward
  kSplit,   // every layer, the backward split: forward, input pass, weight pass
  kBlock,   // one transformer block alone (layer 1): forward, then backward
  kTpComm,  // as kWhole, the t > 1 group communicating (CommGroup)
};
struct Job {
  size_t config = 0;  // index into the (t, b) configurations
  Probe probe = Probe::kWhole;
};

// One device's medians, per job, of each timed part of the pass (forward, backward; or
// forward, input pass, weight pass), and of the optimizer step.
struct DeviceTimes {
  std::vector<std::vector<double>> parts;
  double optimizer = 0;
  Status status;
};

struct Config {
  int t = 1;
  int64_t b = 1;
};

// Runs on the device's own thread (pinned to `cpus`); `sync` lines the devices up so that
// every timed pass runs while the others do, as in training. Every device arrives at the
// barrier as often as the others whatever fails, so that none waits for ever.
// `tp_groups`: this device's communicating group of each t > 1 (kTpComm); a job whose group
// is missing fails.
DeviceTimes TimeDevice(const ModelSpec& spec, const CalibrationOptions& o,
                       const std::vector<Config>& configs, const std::vector<Job>& jobs, int index,
                       const std::vector<int>& cpus, std::map<int, CommGroup*> tp_groups,
                       std::barrier<>& sync) {
  DeviceTimes out;
  out.parts.assign(jobs.size(), {});
  const int passes = 1 + o.repetitions;
  hal::DeviceDescriptor d;
  d.id = fmt::format("calibrate/cpu{}", index);
  d.kind = hal::DeviceKind::kCpu;
  d.host = "calibrate";
  d.index_on_host = index;
  d.cpus = cpus;
  std::mt19937 rng(static_cast<uint32_t>(17 + index));
  const int cores = std::max<int>(1, static_cast<int>(cpus.size()));
  // Declared before the models, so destroyed after them.
  std::unique_ptr<hal::ComputeDevice> device;
  std::unique_ptr<SilentGroup> group;
  std::unique_ptr<Gpt<float>> model;
  std::unique_ptr<Gpt<float>> last;  // the whole t = 1 model timed last: the optimizer's
  std::vector<int32_t> tokens;
  size_t open_config = configs.size();
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Config& c = configs[jobs[j].config];
    const Probe probe = jobs[j].probe;
    if (out.status.ok()) {
      // The trainer's split (kc train): a thread per core taking whole sequences when the
      // batch has a sequence for each, else one thread and a BLAS of every core. BLAS
      // threads are process-wide, so with several devices at once they stay at one per call.
      const bool split = c.b >= cores || o.device_cpus.size() > 1;
      const int threads = split ? static_cast<int>(std::min<int64_t>(c.b, cores)) : 1;
      model.reset();
      if (open_config != jobs[j].config) {
        last.reset();
        device.reset();
        Result<std::unique_ptr<hal::ComputeDevice>> opened =
            hal::OpenComputeDevice(d, {.threads = split ? 1 : cores});
        if (opened.ok()) {
          device = std::move(*opened);
          group = c.t > 1 ? std::make_unique<SilentGroup>(c.t) : nullptr;
          open_config = jobs[j].config;
        } else {
          out.status = opened.status();
        }
      }
      TensorParallelGroup* tp = group.get();
      if (out.status.ok() && probe == Probe::kTpComm) {
        tp = tp_groups[c.t];
        if (tp == nullptr) {
          out.status = InternalError(fmt::format("calibrate: no t = {} group to time", c.t));
        }
      }
      if (out.status.ok()) {
        GptOptions g{.batch = c.b, .threads = threads, .tensor_parallel = tp};
        if (probe == Probe::kSplit) g.split_backward = true;
        if (probe == Probe::kBlock) {
          g.first_layer = 1;
          g.end_layer = 2;
        }
        Result<std::unique_ptr<Gpt<float>>> made = Gpt<float>::Create(spec, device.get(), g);
        if (made.ok()) {
          model = std::move(*made);
          model->InitParameters(spec.training.seed);
        } else {
          out.status = made.status();
        }
      }
    }
    std::vector<std::vector<double>> times;
    for (int pass = 0; pass < passes; ++pass) {
      sync.arrive_and_wait();
      if (!out.status.ok()) continue;
      std::span<const int32_t> inputs, targets;
      if (probe == Probe::kBlock) {
        std::normal_distribution<float> x(0, 1);
        for (float& v : model->stage_input(0)) v = x(rng);
        for (float& v : model->grad_output()) v = 1e-3f * x(rng);
      } else {
        tokens.resize(static_cast<size_t>(c.b * spec.seq_len + 1));
        std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(spec.vocab - 1));
        for (int32_t& t : tokens) t = pick(rng);
        const std::span<const int32_t> all(tokens);
        inputs = all.first(tokens.size() - 1);
        targets = all.subspan(1);
      }
      const auto ready = [](int) { return OkStatus(); };
      std::vector<double> parts;
      auto t0 = std::chrono::steady_clock::now();
      auto lap = [&] {
        const auto now = std::chrono::steady_clock::now();
        parts.push_back(Seconds(now - t0).count());
        t0 = now;
      };
      Result<double> loss = model->Forward(0, inputs, targets, 1.0 / model->tokens());
      Status s = loss.status();
      lap();
      if (s.ok() && probe == Probe::kSplit) {
        s = model->BackwardInput(0);
        lap();
        if (s.ok()) s = model->BackwardWeight(0, false, ready);
      } else if (s.ok()) {
        s = model->Backward(0, false, ready);
      }
      lap();
      if (!s.ok()) {
        out.status = s;
        continue;
      }
      if (pass > 0) times.push_back(std::move(parts));
    }
    if (!out.status.ok()) continue;
    for (size_t k = 0; k < times.front().size(); ++k) {
      std::vector<double> part;
      for (const std::vector<double>& t : times) part.push_back(t[k]);
      out.parts[j].push_back(Median(part));
    }
    if (probe == Probe::kWhole && c.t == 1) last = std::move(model);
  }

  // The optimizer step the trainer makes: the clipping norm, then AdamW over every tensor.
  std::unique_ptr<AdamW<float>> adam;
  if (out.status.ok() && last == nullptr) {
    out.status = InvalidArgumentError("calibrate: the optimizer is timed on t = 1: time it too");
  }
  if (out.status.ok()) {
    std::vector<OptimizerSlot<float>> slots;
    for (size_t i = 0; i < last->tensors().size(); ++i) {
      const int tensor = static_cast<int>(i);
      slots.push_back(
          {last->param(tensor), last->grad(tensor), last->tensors()[i].shape.size() == 2});
    }
    Result<std::unique_ptr<AdamW<float>>> made =
        AdamW<float>::Create(spec.training, std::move(slots), device.get());
    if (made.ok()) {
      adam = std::move(*made);
    } else {
      out.status = made.status();
    }
  }
  std::vector<double> times;
  for (int pass = 0; pass < passes; ++pass) {
    sync.arrive_and_wait();
    if (!out.status.ok()) continue;
    const auto start = std::chrono::steady_clock::now();
    const double norm = adam->GradNorm();
    adam->Step(1e-6, ClipScale(spec.training, norm));
    if (pass > 0) times.push_back(Seconds(std::chrono::steady_clock::now() - start).count());
  }
  if (out.status.ok()) out.optimizer = Median(times);
  return out;
}

}  // namespace

EfficiencyFit FitEfficiency(std::span<const EfficiencyPoint> points) {
  // Least squares of y = 1/eff on x = 1/size: y = a + c x, E = 1/a, H = c/a.
  std::vector<std::pair<double, double>> xy;
  double mean_eff = 0;
  for (const EfficiencyPoint& p : points) {
    if (p.efficiency <= 0 || p.size <= 0) continue;
    xy.emplace_back(1 / p.size, 1 / p.efficiency);
    mean_eff += p.efficiency;
  }
  EfficiencyFit fit;
  if (xy.empty()) return fit;
  mean_eff /= static_cast<double>(xy.size());
  const auto [a, c] = FitLine(xy);
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
    if (p.t == 1 && p.size > 0 && p.efficiency > 0) table.emplace_back(p.size, p.efficiency);
  }
  std::stable_sort(table.begin(), table.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  table.erase(std::unique(table.begin(), table.end(),
                          [](const auto& a, const auto& b) { return a.first == b.first; }),
              table.end());
  return table;
}

std::vector<MeasuredPass> PassTable(std::span<const EfficiencyPoint> points) {
  std::vector<MeasuredPass> table;
  for (const EfficiencyPoint& p : points) {
    if (!(p.seconds > 0)) continue;
    table.push_back({.t = p.t,
                     .micro_batch_size = p.micro_batch_size,
                     .seconds = p.seconds,
                     .block_seconds = p.block_seconds,
                     .forward_share = p.forward_share,
                     .weight_share = p.weight_share,
                     .tp_comm_seconds = p.tp_comm_seconds});
  }
  return table;
}

Result<ComputeCalibration> MeasureCompute(const ModelSpec& spec,
                                          const CalibrationOptions& options) {
  KC_RETURN_IF_ERROR(ValidateModelSpec(spec));
  if (options.device_cpus.empty() || options.micro_batch_sizes.empty() || options.repetitions < 1 ||
      options.tensor_parallel.empty() || !(options.peak_flops > 0)) {
    return InvalidArgumentError(
        "calibrate: needs at least one device, one micro-batch size, one tensor-parallel size, "
        "one repetition and a positive peak FLOP/s");
  }
  for (int64_t b : options.micro_batch_sizes) {
    if (b < 1) return InvalidArgumentError(fmt::format("calibrate: micro-batch size {} < 1", b));
  }
  for (int t : options.tensor_parallel) {
    KC_RETURN_IF_ERROR(ValidateTensorParallel(spec, t).WithContext("calibrate"));
  }
  // Largest micro-batch first (a multi-threaded BLAS started for a small batch keeps its
  // threads, which would slow the split runs after it), t = 1 last at each size: the whole
  // t = 1 model of the smallest size is the one the optimizer is timed on.
  std::vector<Config> configs;
  std::vector<int64_t> sizes = options.micro_batch_sizes;
  std::sort(sizes.rbegin(), sizes.rend());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::vector<int> ts = options.tensor_parallel;
  std::sort(ts.rbegin(), ts.rend());
  ts.erase(std::unique(ts.begin(), ts.end()), ts.end());
  if (ts.back() != 1) ts.push_back(1);
  for (int64_t b : sizes) {
    for (int t : ts) configs.push_back({t, b});
  }
  std::vector<Job> jobs;
  const size_t n = options.device_cpus.size();
  // The groups of t that communicate: the devices split into n / t groups of t, every group
  // at once (as a plan's tensor-parallel groups run beside each other).
  std::vector<int> comm_ts;
  for (int t : ts) {
    if (t > 1 && options.tensor_parallel_comm && n % static_cast<size_t>(t) == 0) {
      comm_ts.push_back(t);
    }
  }
  for (size_t k = 0; k < configs.size(); ++k) {
    if (options.block && spec.layers >= 3) jobs.push_back({k, Probe::kBlock});
    if (options.split_backward && spec.layers >= 2) jobs.push_back({k, Probe::kSplit});
    jobs.push_back({k, Probe::kWhole});
    if (std::find(comm_ts.begin(), comm_ts.end(), configs[k].t) != comm_ts.end()) {
      jobs.push_back({k, Probe::kTpComm});
    }
  }

  const std::string group_name = CalibrationGroup("tp-");
  comm::HashStore store;
  std::barrier<> sync(static_cast<std::ptrdiff_t>(n));
  std::vector<DeviceTimes> times(n);
  {
    std::vector<std::jthread> threads;
    for (size_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        const std::vector<int>& cpus = options.device_cpus[i];
        PinTo(cpus);  // before the model's worker threads are born
        const int r = static_cast<int>(i);
        std::unique_ptr<comm::Communicator> whole;
        std::vector<std::unique_ptr<CommGroup>> owned;
        std::map<int, CommGroup*> tp_groups;
        Status made;
        if (!comm_ts.empty()) {
          Result<std::unique_ptr<comm::Communicator>> c =
              CalibrationComm(&store, group_name, r, static_cast<int>(n));
          if (c.ok()) {
            whole = std::move(*c);
          } else {
            made = c.status();
          }
          for (int t : comm_ts) {
            if (!made.ok()) break;
            Result<std::unique_ptr<comm::Communicator>> split = whole->Split(r / t, r);
            if (!split.ok()) {
              made = split.status();
              break;
            }
            owned.push_back(std::make_unique<CommGroup>(std::move(*split)));
            tp_groups[t] = owned.back().get();
          }
        }
        // A device whose groups failed still takes its turns at the barrier (TimeDevice
        // fails each job it has no group for), so that none waits for ever.
        times[i] = TimeDevice(spec, options, configs, jobs, r, cpus, tp_groups, sync);
        if (!made.ok()) times[i].status = made.WithContext("calibrate: tensor-parallel groups");
      });
    }
  }
  for (const DeviceTimes& t : times) KC_RETURN_IF_ERROR(t.status);

  // A part's mean over the devices.
  auto mean = [&](size_t job, size_t part) {
    double sum = 0;
    for (const DeviceTimes& t : times) sum += t.parts[job][part];
    return sum / static_cast<double>(n);
  };
  ComputeCalibration c;
  for (size_t k = 0; k < configs.size(); ++k) {
    EfficiencyPoint p;
    p.t = configs[k].t;
    p.micro_batch_size = configs[k].b;
    p.size = static_cast<double>(p.micro_batch_size * spec.seq_len * spec.hidden) / p.t;
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (jobs[j].config != k) continue;
      switch (jobs[j].probe) {
        case Probe::kWhole:
          p.seconds = mean(j, 0) + mean(j, 1);
          p.forward_share = mean(j, 0) / p.seconds;
          break;
        case Probe::kSplit:
          p.weight_share = mean(j, 2) / (mean(j, 0) + mean(j, 1) + mean(j, 2));
          break;
        case Probe::kBlock:
          p.block_seconds = mean(j, 0) + mean(j, 1);
          break;
        case Probe::kTpComm:
          p.tp_comm_seconds = mean(j, 0) + mean(j, 1);
          break;
      }
    }

    p.efficiency =
        StepFlops(spec, p.micro_batch_size, false) / p.t / p.seconds / options.peak_flops;
    c.points.push_back(p);
  }
  for (const DeviceTimes& t : times) c.optimizer_seconds += t.optimizer / static_cast<double>(n);
  std::vector<EfficiencyPoint> whole;  // the curve is fitted to the t = 1 points
  for (const EfficiencyPoint& p : c.points) {
    if (p.t == 1) whole.push_back(p);
  }
  c.fit = FitEfficiency(whole);
  return c;
}

Result<LinkCalibration> MeasureLinks(const LinkCalibrationOptions& options) {
  if (options.sizes_bytes.empty() || options.repetitions < 1 || options.rounds < 1) {
    return InvalidArgumentError(
        "calibrate: links need at least one size, one repetition and one round");
  }
  for (int64_t bytes : options.sizes_bytes) {
    if (bytes < 4) {
      return InvalidArgumentError(fmt::format("calibrate: all-reduce of {} bytes", bytes));
    }
  }
  LinkCalibration out;
  const int k = static_cast<int>(options.device_cpus.size());
  if (k < 2) return out;
  std::vector<std::vector<double>> seconds(static_cast<size_t>(k));  // per rank, per size
  std::vector<double> rendezvous(static_cast<size_t>(k));
  // The work between collectives: about options.work_seconds on this thread alone.
  const auto t0 = std::chrono::steady_clock::now();
  Spin(1 << 16);
  const double per_iteration =
      std::max(1e-12, Seconds(std::chrono::steady_clock::now() - t0).count() / (1 << 16));
  const int64_t work_iterations =
      std::max<int64_t>(1, static_cast<int64_t>(options.work_seconds / per_iteration));
  KC_RETURN_IF_ERROR(
      OnRanks(options.device_cpus, "all-reduce", [&](int r, comm::Communicator& c) -> Status {
        for (int64_t bytes : options.sizes_bytes) {
          std::vector<float> data(static_cast<size_t>(bytes / 4), 1.0f);
          std::vector<double> times;
          for (int rep = 0; rep <= options.repetitions; ++rep) {
            const auto start = std::chrono::steady_clock::now();
            KC_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> w,
                                c.Allreduce(std::as_writable_bytes(std::span(data)), data.size(),
                                            hal::DataType::kF32, comm::ReduceOp::kSum));
            KC_RETURN_IF_ERROR(w->Wait());
            if (rep > 0) times.push_back(Seconds(std::chrono::steady_clock::now() - start).count());
          }
          seconds[static_cast<size_t>(r)].push_back(Median(times));
        }
        // The rendezvous: work, then a tiny all-reduce, against the work alone (a barrier
        // lines the ranks up before each phase).
        float tiny = 1;
        auto phase = [&](bool collective) -> Result<double> {
          KC_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> b, c.Barrier());
          KC_RETURN_IF_ERROR(b->Wait());
          const auto start = std::chrono::steady_clock::now();
          for (int i = 0; i < options.rounds; ++i) {
            Spin(work_iterations);
            if (!collective) continue;
            KC_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> w,
                                c.Allreduce(std::as_writable_bytes(std::span(&tiny, 1)), 1,
                                            hal::DataType::kF32, comm::ReduceOp::kSum));
            KC_RETURN_IF_ERROR(w->Wait());
          }
          return Seconds(std::chrono::steady_clock::now() - start).count();
        };
        KC_ASSIGN_OR_RETURN(const double alone, phase(false));
        KC_ASSIGN_OR_RETURN(const double together, phase(true));
        rendezvous[static_cast<size_t>(r)] = std::max(0.0, together - alone) / options.rounds;
        return OkStatus();
      }));
  // The slowest rank's time per size: the collective is done when every rank is.
  for (size_t i = 0; i < options.sizes_bytes.size(); ++i) {
    double t = 0;
    for (const std::vector<double>& rank : seconds) t = std::max(t, rank[i]);
    out.allreduce.emplace_back(static_cast<double>(options.sizes_bytes[i]), t);
  }
  // time = a + c * bytes: c = 2(k-1)/(k BW), a = 2(k-1) latency; the rendezvous' cost is
  // the ring's 2(k-1) steps when it is the larger.
  const Line line = FitLine(out.allreduce);
  if (line.c > 0) out.bandwidth = 2.0 * (k - 1) / (k * line.c);
  for (double x : rendezvous) out.rendezvous_s = std::max(out.rendezvous_s, x);
  out.latency = std::max(std::max(0.0, line.a), out.rendezvous_s) / (2.0 * (k - 1));
  return out;
}

Result<OverlapCalibration> MeasureOverlap(const ModelSpec& spec,
                                          const OverlapCalibrationOptions& options) {
  KC_RETURN_IF_ERROR(ValidateModelSpec(spec));
  if (options.micro_batch_size < 1 || options.bucket_bytes < 1 || options.repetitions < 1) {
    return InvalidArgumentError(
        "calibrate: overlap needs a micro-batch, a bucket size and a repetition");
  }
  OverlapCalibration out;
  const int k = static_cast<int>(options.device_cpus.size());
  if (k < 2) return out;
  // Per rank, the medians of the backward alone, the all-reduce alone and the two together.
  std::vector<std::array<double, 3>> seconds(static_cast<size_t>(k));
  KC_RETURN_IF_ERROR(
      OnRanks(options.device_cpus, "overlap", [&](int r, comm::Communicator& comm) -> Status {
        comm::Communicator* c = &comm;
        const std::vector<int>& cpus = options.device_cpus[static_cast<size_t>(r)];
        hal::DeviceDescriptor d;
        d.id = fmt::format("calibrate/cpu{}", r);
        d.kind = hal::DeviceKind::kCpu;
        d.host = "calibrate";
        d.cpus = cpus;
        KC_ASSIGN_OR_RETURN(std::unique_ptr<hal::ComputeDevice> device,
                            hal::OpenComputeDevice(d, {.threads = 1}));
        const int threads = static_cast<int>(
            std::min<int64_t>(options.micro_batch_size, std::max<size_t>(1, cpus.size())));
        KC_ASSIGN_OR_RETURN(
            std::unique_ptr<Gpt<float>> model,
            Gpt<float>::Create(spec, device.get(),
                               {.batch = options.micro_batch_size, .threads = threads}));
        model->InitParameters(spec.training.seed);
        // The trainer's buckets: the gradients in backward order, written in place.
        const std::vector<TensorSpec>& tensors = model->tensors();
        std::vector<int> bucket_index(tensors.size(), -1);
        std::vector<std::span<std::byte>> spans;
        for (const TensorSpec& b : ParameterTensorsBackwardOrder(spec)) {
          for (size_t i = 0; i < tensors.size(); ++i) {
            if (tensors[i].name != b.name) continue;
            bucket_index[i] = static_cast<int>(spans.size());
            spans.push_back(std::as_writable_bytes(model->grad(static_cast<int>(i))));
          }
        }
        KC_ASSIGN_OR_RETURN(std::unique_ptr<comm::GradientBuckets> buckets,
                            comm::GradientBuckets::Create(c, spans,
                                                          {.bucket_bytes = options.bucket_bytes,
                                                           .dtype = hal::DataType::kF32,
                                                           .op = comm::ReduceOp::kAvg}));
        buckets->AdoptViews();
        std::vector<std::span<float>> storage;
        for (int index : bucket_index) {
          std::span<std::byte> v = buckets->view(index);
          storage.emplace_back(reinterpret_cast<float*>(v.data()), v.size() / sizeof(float));
        }
        model->SetGradientStorage(std::move(storage));
        std::vector<int32_t> tokens(
            static_cast<size_t>(options.micro_batch_size * spec.seq_len + 1));
        std::mt19937 rng(static_cast<uint32_t>(29 + r));
        std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(spec.vocab - 1));
        for (int32_t& t : tokens) t = pick(rng);
        const std::span<const int32_t> all(tokens);
        const auto none = [](int) { return OkStatus(); };
        const auto mark = [&](int i) {
          return buckets->MarkReady(bucket_index[static_cast<size_t>(i)]);
        };
        std::array<std::vector<double>, 3> times;
        for (int rep = 0; rep <= options.repetitions; ++rep) {
          // The backward alone, then its buckets all-reduced after it, then the two together.
          KC_RETURN_IF_ERROR(
              model->Forward(all.first(tokens.size() - 1), all.subspan(1), 1.0 / model->tokens())
                  .status());
          auto t0 = std::chrono::steady_clock::now();
          KC_RETURN_IF_ERROR(model->Backward(false, none));
          const double backward = Seconds(std::chrono::steady_clock::now() - t0).count();
          KC_ASSIGN_OR_RETURN(auto barrier, c->Barrier());
          KC_RETURN_IF_ERROR(barrier->Wait());
          t0 = std::chrono::steady_clock::now();
          for (size_t i = 0; i < tensors.size(); ++i) KC_RETURN_IF_ERROR(mark(static_cast<int>(i)));
          KC_RETURN_IF_ERROR(buckets->Finish());
          const double allreduce = Seconds(std::chrono::steady_clock::now() - t0).count();
          KC_RETURN_IF_ERROR(
              model->Forward(all.first(tokens.size() - 1), all.subspan(1), 1.0 / model->tokens())
                  .status());
          KC_ASSIGN_OR_RETURN(barrier, c->Barrier());
          KC_RETURN_IF_ERROR(barrier->Wait());
          t0 = std::chrono::steady_clock::now();
          KC_RETURN_IF_ERROR(model->Backward(false, mark));
          KC_RETURN_IF_ERROR(buckets->Finish());
          const double together = Seconds(std::chrono::steady_clock::now() - t0).count();
          if (rep == 0) continue;
          times[0].push_back(backward);
          times[1].push_back(allreduce);
          times[2].push_back(together);
        }
        for (size_t i = 0; i < 3; ++i) seconds[static_cast<size_t>(r)][i] = Median(times[i]);
        return OkStatus();
      }));
  for (const std::array<double, 3>& rank : seconds) {
    out.backward_s += rank[0] / k;
    out.allreduce_s += rank[1] / k;
    out.together_s += rank[2] / k;
  }
  if (out.allreduce_s > 0) {
    out.fraction =
        std::clamp((out.backward_s + out.allreduce_s - out.together_s) / out.allreduce_s, 0.0, 1.0);
  }
  return out;
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
              {"inter_node_latency", k.inter_node_latency},
              {"oversubscription", k.oversubscription}}},
            {"options",
             {{"activation_bytes", o.activation_bytes},
              {"param_bytes", o.param_bytes},
              {"gradient_bytes", o.gradient_bytes},
              {"optimizer_bytes", o.optimizer_bytes},
              {"matmul_efficiency", o.matmul_efficiency},
              {"efficiency_half_size", o.efficiency_half_size},
              {"efficiency_half_hidden", o.efficiency_half_hidden},
              {"dp_overlap_fraction", o.dp_overlap_fraction},
              {"optimizer_step_bytes", o.optimizer_step_bytes},
              {"usable_memory_fraction", o.usable_memory_fraction},
              {"dp_bucket_bytes", o.dp_bucket_bytes}}},
            {"points", json::array()}};
  for (const EfficiencyPoint& p : c.points) {
    j["points"].push_back({{"micro_batch_size", p.micro_batch_size},
                           {"t", p.t},
                           {"size", p.size},
                           {"seconds", p.seconds},
                           {"efficiency", p.efficiency},
                           {"forward_share", p.forward_share},
                           {"weight_share", p.weight_share},
                           {"block_seconds", p.block_seconds},
                           {"tp_comm_seconds", p.tp_comm_seconds}});
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
  c.cluster.oversubscription = k.value("oversubscription", 1.0);  // added later
  c.cluster.device = hal::DeviceKind::kCpu;
  const json& o = j.contains("options") ? j["options"] : json();
  CostModelOptions& opt = c.options;
  KC_RETURN_IF_ERROR(num(o, "options", "activation_bytes", &opt.activation_bytes));
  KC_RETURN_IF_ERROR(num(o, "options", "param_bytes", &opt.param_bytes));
  KC_RETURN_IF_ERROR(num(o, "options", "gradient_bytes", &opt.gradient_bytes));
  KC_RETURN_IF_ERROR(num(o, "options", "optimizer_bytes", &opt.optimizer_bytes));
  KC_RETURN_IF_ERROR(num(o, "options", "matmul_efficiency", &opt.matmul_efficiency));
  KC_RETURN_IF_ERROR(num(o, "options", "efficiency_half_size", &opt.efficiency_half_size));
  // Added later: a file without it was fitted with no width term.
  opt.efficiency_half_hidden = o.is_object() ? o.value("efficiency_half_hidden", 0.0) : 0.0;
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
      // Added later: a file without them has t = 1 points and no per-pass shares.
      e.t = p.value("t", 1);
      e.forward_share = p.value("forward_share", 0.0);
      e.weight_share = p.value("weight_share", 0.0);
      e.block_seconds = p.value("block_seconds", 0.0);
      e.tp_comm_seconds = p.value("tp_comm_seconds", 0.0);
      c.points.push_back(e);
    }
  }
  c.options.efficiency_points = EfficiencyTable(c.points);
  c.options.measured_passes = PassTable(c.points);
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
