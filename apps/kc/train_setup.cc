#include "apps/kc/train_setup.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <string_view>

#include "api/train_job.h"
#include "apps/kc/command.h"
#include "fault/checkpoint.h"
#include "fault/heartbeat.h"
#include "hal/cuda/cuda_device.h"
#include "hal/host_probe.h"
#include "hal/inventory.h"
#include "parallel/batch_share.h"
#include "parallel/engine_support.h"
#include "parallel/planner/local_host.h"
#include "parallel/planner/search.h"

namespace kc::app {

namespace fs = std::filesystem;

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &set)) cpus.push_back(i);
    }
  }
  if (cpus.empty()) cpus.push_back(0);
  // NUMA node by node (L1's probe), so that consecutive ranks, a tensor-parallel group
  // among them, share a node's memory and caches where they fit in one.
  if (Result<hal::HostInfo> host = hal::ProbeHost(); host.ok()) {
    auto node_of = [&](int cpu) {
      for (size_t n = 0; n < host->numa_nodes.size(); ++n) {
        const std::vector<int>& in = host->numa_nodes[n].cpus;
        if (std::find(in.begin(), in.end(), cpu) != in.end()) return n;
      }
      return host->numa_nodes.size();
    };
    std::stable_sort(cpus.begin(), cpus.end(),
                     [&](int x, int y) { return node_of(x) < node_of(y); });
  }
  return cpus;
}

parallel::LoaderOptions DataOptions(const TrainArgs& a, const std::string& split) {
  parallel::LoaderOptions o;
  o.manifest = a.data;
  o.split = split;
  return o;
}

Status ApplyTrainRun(TrainArgs* args) {
  TrainArgs& a = *args;
  if (a.job_file.empty()) return OkStatus();
  if (!a.job_flags_given.empty()) {
    return InvalidArgumentError(
        fmt::format("{}: set by the run file --job {}; give one or the other",
                    fmt::join(a.job_flags_given, ", "), a.job_file));
  }
  Result<kc::v1::TrainRun> run = api::ReadTrainRun(a.job_file);
  if (!run.ok()) return run.status().WithContext("--job");
  const kc::v1::TrainJob& job = run->job();
  const kc::v1::RunAssignment& as = run->assignment();
  if (!job.command().empty() || job.model_yaml().empty()) {
    return InvalidArgumentError("--job " + a.job_file +
                                ": a command job (kc run runs it), not a model to train");
  }
  const std::string where = "--job " + a.job_file;
  a.config = a.job_file + ": model_yaml";
  a.model_yaml = job.model_yaml();
  a.run_id = as.run_id();
  a.store_token = as.rendezvous_token();
  a.ranks = as.ranks_size();
  if (a.ranks < 1) return InvalidArgumentError(where + ": the assignment names no rank");
  a.steps = job.steps();
  a.global_batch = as.global_batch();
  if (as.has_plan()) {
    Result<parallel::ParallelPlan> plan = api::FromTrainPlan(as.plan());
    if (!plan.ok()) return plan.status().WithContext(where);
    a.plan = parallel::PlanToString(*plan);  // as kcd shows it (kc job show)
  }
  // Elastic within [min_devices, max_devices]: the survivors of a loss go on, a replacement
  // starts for each loss, and the run grows and shrinks as asked (--resize-file).
  const kc::v1::ElasticPolicy& e = job.elastic();
  if (e.elastic() && e.min_devices() < e.max_devices()) {
    a.min_ranks = e.min_devices();
    a.max_ranks = std::max(e.max_devices(), a.ranks);
    a.max_restarts = e.max_replacements() > 0 ? e.max_replacements() : e.max_devices();
  }
  const kc::v1::CheckpointPolicy& c = job.checkpoint();
  if (c.scheduler_advised()) {
    a.checkpoint_every = "auto";
  } else {
    a.checkpoint_every = std::to_string(c.every_steps());
  }
  if (c.keep() > 0) a.checkpoint_keep = c.keep();
  // 0: the runtime's default (auto); -1: none.
  a.memory_copy_every = c.memory_copy_every() == 0  ? std::string("auto")
                        : c.memory_copy_every() < 0 ? std::string("0")
                                                    : std::to_string(c.memory_copy_every());
  a.checkpoint_compress = c.compress();
  if (job.heartbeat().period_s() > 0) a.heartbeat_period_s = job.heartbeat().period_s();
  if (job.heartbeat().timeout_s() > 0) a.heartbeat_timeout_s = job.heartbeat().timeout_s();
  if (!job.grad_wire().empty()) a.grad_wire = job.grad_wire();
  a.inventory_text = as.inventory();
  if (as.has_comm_limits()) {
    comm::RateLimit limit;
    KC_RETURN_IF_ERROR(
        api::FromCommLimits(as.comm_limits(), &limit, &a.job_lanes).WithContext(where));
    a.job_rate_limit = limit;
  }
  return OkStatus();
}

Result<parallel::ModelSpec> LoadTrainModel(const TrainArgs& a) {
  return a.model_yaml.empty() ? parallel::LoadModelSpec(a.config)
                              : parallel::LoadModelSpecFromString(a.model_yaml, a.config);
}

Result<TrainSetup> CheckTrainArgs(TrainArgs* args) {
  TrainSetup p;
  if (!args->inventory.empty() || !args->inventory_text.empty()) {
    // The run file's (kcd's cluster) over the flag's.
    const bool from_run = !args->inventory_text.empty();
    const std::string where =
        from_run ? "--job " + args->job_file + ": inventory" : "--inventory " + args->inventory;
    if (!from_run && args->hosts.empty() && args->share.empty() && args->worker_host.empty()) {
      return InvalidArgumentError(
          "--inventory is for a run across hosts (--hosts or --share): one host's ranks talk "
          "over shared memory whatever the inventory says");
    }
    Result<hal::TopologySpec> spec = from_run
                                         ? hal::LoadInventoryString(args->inventory_text, where)
                                         : hal::LoadInventory(args->inventory);
    if (!spec.ok()) return spec.status().WithContext(where);
    Result<hal::Topology> topology = hal::Topology::Build(*std::move(spec));
    if (!topology.ok()) return topology.status().WithContext(where);
    p.topology = std::make_shared<const hal::Topology>(*std::move(topology));
  }
  // The plan, if any, decides the rank count when --ranks does not.
  parallel::ParallelPlan plan;
  parallel::PlanKeys stated;
  if (!args->plan.empty()) {
    Result<parallel::ParallelPlan> r = fs::is_regular_file(args->plan)
                                           ? parallel::LoadPlan(args->plan, &stated)
                                           : parallel::ParsePlanFlag(args->plan, &stated);
    KC_RETURN_IF_ERROR(r.status());
    plan = *r;
    if (args->ranks == 0) args->ranks = plan.world();
  }
  if (args->ranks == 0) args->ranks = 1;
  const TrainArgs& a = *args;
  if (a.ranks < 1)
    return InvalidArgumentError("--ranks " + std::to_string(a.ranks) + ": must be at least 1");
  if (a.steps < 1)
    return InvalidArgumentError("--steps " + std::to_string(a.steps) + ": must be at least 1");
  if (a.eval_batches < 1) {
    return InvalidArgumentError("--eval-batches " + std::to_string(a.eval_batches) +
                                ": must be at least 1");
  }
  if (!(a.bucket_mb > 0)) return InvalidArgumentError("--bucket-mb: must be positive");
  if (!a.advice_file.empty() && a.mtbf_hours > 0) {
    return InvalidArgumentError("--mtbf and --advice-file: give one (a fixed MTBF, or advice)");
  }
  if (a.checkpoint_every == "auto") {
    if ((!(a.mtbf_hours > 0) && a.advice_file.empty()) || a.checkpoint_dir.empty()) {
      return InvalidArgumentError(
          "--checkpoint-every auto: needs --mtbf HOURS (the mean time between failures or "
          "preemptions, above 0) or --advice-file, and --checkpoint-dir");
    }
    p.mtbf_s = a.mtbf_hours * 3600;
  } else if (!a.advice_file.empty()) {
    return InvalidArgumentError("--advice-file: only with --checkpoint-every auto");
  } else {
    char* end = nullptr;
    const long long every = std::strtoll(a.checkpoint_every.c_str(), &end, 10);
    if (a.checkpoint_every.empty() || *end != '\0' || every < 0) {
      return InvalidArgumentError("--checkpoint-every " + a.checkpoint_every +
                                  ": expected a number of steps (0: after the last step only) "
                                  "or auto");
    }
    p.checkpoint_every = every;
  }
  if (a.mtbf_hours < 0) return InvalidArgumentError("--mtbf: must be positive (hours)");
  if (a.checkpoint_keep < 1) {
    return InvalidArgumentError("--checkpoint-keep " + std::to_string(a.checkpoint_keep) +
                                ": must be at least 1");
  }
  if (a.checkpoint_full_every < 1) {
    return InvalidArgumentError("--checkpoint-full-every " +
                                std::to_string(a.checkpoint_full_every) +
                                ": must be at least 1 (1: every checkpoint whole)");
  }

  if (a.memory_copy_every != "auto") {
    char* end = nullptr;
    const long long every = std::strtoll(a.memory_copy_every.c_str(), &end, 10);
    if (a.memory_copy_every.empty() || *end != '\0' || every < 0) {
      return InvalidArgumentError("--memory-copy-every " + a.memory_copy_every +
                                  ": expected a number of steps (0: no copies) or auto");
    }
    p.memory_copy_every = every;
  }
  if (a.progress != "auto" && a.progress != "bar" && a.progress != "lines" &&
      a.progress != "none") {
    return InvalidArgumentError("--progress " + a.progress + ": expected auto, bar, lines or none");
  }
  KC_ASSIGN_OR_RETURN(p.grad_sync, parallel::ParseGradSync(a.grad_sync));
  if (a.grad_wire != "fp32" && a.grad_wire != "bf16") {
    return InvalidArgumentError("--grad-wire " + a.grad_wire + ": expected fp32 or bf16");
  }
  p.grad_wire = a.grad_wire == "bf16" ? comm::WireFormat::kBf16 : comm::WireFormat::kNative;
  const std::optional<comm::TransportKind> transport = comm::TransportKindFromName(a.transport);
  if (!transport)
    return InvalidArgumentError("--transport " + a.transport + ": expected auto, shm or tcp");
  p.transport = *transport;
  if (a.device != "cpu" && a.device != "cuda") {
    return InvalidArgumentError("--device " + a.device + ": expected cpu or cuda");
  }
  p.cuda = a.device == "cuda";
  Result<parallel::Precision> precision = parallel::ParsePrecision(a.precision);
  if (!precision.ok())
    return InvalidArgumentError("--precision " + a.precision + ": expected fp32 or bf16");
  p.precision = *precision;
  if (p.precision == parallel::Precision::kBf16 && !p.cuda) {
    return InvalidArgumentError(
        "--precision bf16 trains on CUDA devices only; add --device cuda (the CPU engine trains "
        "in fp32)");
  }
  if (p.cuda && !a.export_dir.empty()) {
    return UnimplementedError(
        "--export with --device cuda is not built yet (export from a CPU run)");
  }
  if (!a.inject_fault.empty()) {
    long long rank = -1, step = 0;
    char how[32] = {0};
    const int n = std::sscanf(a.inject_fault.c_str(), "%lld:%lld:%31s", &rank, &step, how);
    const std::string h = n == 3 ? how : "exit";
    const bool shape_ok =
        n == 2 ? a.inject_fault.find_first_not_of("0123456789:") == std::string::npos : n == 3;
    const bool how_ok = h == "exit" || h == "kill" || h == "stop" || h == "kill-in-forward" ||
                        h == "kill-in-allreduce" || h == "kill-in-persist";
    if (!shape_ok || rank < 0 || rank >= a.ranks || step < 1 || step > a.steps || !how_ok) {
      return InvalidArgumentError(
          "--inject-fault " + a.inject_fault +
          ": expected RANK:STEP[:HOW] with a rank below --ranks, a step in 1..--steps and HOW "
          "one of exit, kill, stop, kill-in-forward, kill-in-allreduce, kill-in-persist");
    }
    if (h == "kill-in-persist" && a.checkpoint_dir.empty()) {
      return InvalidArgumentError("--inject-fault " + a.inject_fault +
                                  ": kill-in-persist needs --checkpoint-dir");
    }
    p.fault_rank = static_cast<int>(rank);
    p.fault_step = step;
    p.fault_how = h;
  }
  if (Status s = fault::ValidateHeartbeat({.period = fault::Seconds(a.heartbeat_period_s),
                                           .timeout = fault::Seconds(a.heartbeat_timeout_s)});
      !s.ok()) {
    return InvalidArgumentError("--heartbeat-period/--heartbeat-timeout: " + s.message());
  }
  KC_ASSIGN_OR_RETURN(p.spec, LoadTrainModel(a));
  if (a.job_rate_limit) {
    p.rate_limit = a.job_rate_limit;
    p.lanes = a.job_lanes;
  } else if (!a.comm_limits.empty()) {
    Result<comm::CommLimits> limits = comm::LoadCommLimits(a.comm_limits);
    if (!limits.ok()) return limits.status().WithContext("--comm-limits");
    p.rate_limit = limits->ForJob(p.spec.name);
    p.lanes = limits->lanes;
  }
  if (!a.plan.empty()) {
    // A plan that states its micro-batch size says the global batch; else it is the one
    // without a plan (--global-batch, or batch_per_rank per rank) and the plan follows it.
    const int64_t global = a.global_batch != 0       ? a.global_batch
                           : stated.micro_batch_size ? plan.global_batch()
                                                     : p.spec.batch_per_rank * a.ranks;
    plan = parallel::FillBatchDefaults(plan, stated, global);
    KC_RETURN_IF_ERROR(
        parallel::ValidatePlan(plan, p.spec, a.ranks, global).WithContext("--plan " + a.plan));
    if (plan.p > 1 && !a.export_dir.empty()) {
      return UnimplementedError("--export with a pipeline (p > 1): each rank holds a stage only");
    }
    if (plan.t > 1 && !a.export_dir.empty()) {
      return UnimplementedError(
          "--export with tensor parallelism (t > 1): each rank holds a shard of every layer only");
    }
    p.tensor_parallel = plan.t;
    p.pipeline_stages = plan.p;
    p.schedule = plan.schedule;
    p.virtual_stages = plan.v;
    p.recompute = plan.recompute;
    p.spec.batch_per_rank = plan.micro_batch_size;
    p.micro_batches = plan.micro_batches;
    p.zero_stage = plan.zero_stage;
  } else if (a.global_batch != 0) {
    // Any global batch of at least a sequence per rank: the first G mod N ranks take one more.
    if (a.global_batch < a.ranks) {
      return InvalidArgumentError(fmt::format(
          "--global-batch {} cannot be split over {} ranks: each needs at least one sequence "
          "(--global-batch {} or more)",
          a.global_batch, a.ranks, a.ranks));
    }
    p.spec.batch_per_rank = a.global_batch / a.ranks;
  }
  const int replicas = a.ranks / (p.pipeline_stages * p.tensor_parallel);
  p.global_batch = a.plan.empty() && a.global_batch != 0
                       ? a.global_batch
                       : p.spec.batch_per_rank * p.micro_batches * replicas;
  // What the engine runs: the trainer asks the same.
  if (Status s = parallel::EngineSupports(p.ParallelPlanFor(a.ranks),
                                          p.cuda ? hal::DeviceKind::kCuda : hal::DeviceKind::kCpu);
      !s.ok()) {
    return s.WithContext(a.plan.empty() ? "--device " + a.device
                                        : "--plan " + a.plan + " with --device " + a.device);
  }
  if (p.cuda && a.worker_rank < 0) {
    Result<int> gpus = hal::cuda::CudaDeviceCount();
    if (!gpus.ok()) return gpus.status().WithContext("--device cuda");
    p.gpus = *gpus;
  }
  if (a.min_ranks < 0 || a.min_ranks > a.ranks) {
    return InvalidArgumentError(
        fmt::format("--min-ranks {}: must be between 1 and --ranks ({})", a.min_ranks, a.ranks));
  }
  if (a.max_ranks != 0 && a.max_ranks < a.ranks) {
    return InvalidArgumentError(
        fmt::format("--max-ranks {}: must be at least --ranks ({}), the size the run starts at",
                    a.max_ranks, a.ranks));
  }
  const int most = std::max(a.ranks, a.max_ranks);
  if (a.max_ranks > a.ranks && !(a.min_ranks > 0)) {
    return InvalidArgumentError(fmt::format(
        "--max-ranks {}: a run grows within [--min-ranks, --max-ranks]; give --min-ranks",
        a.max_ranks));
  }
  p.elastic = a.min_ranks > 0 && a.min_ranks < most;
  if (a.memory_copy_every == "auto") {
    // Where a loss can take every replica of a position: replicas cannot bring it back.
    p.memory_copy_every =
        p.elastic && p.tensor_parallel * p.pipeline_stages > 1 && p.zero_stage == 0 ? 10 : 0;
  }
  if (!a.resize_file.empty() && !p.elastic) {
    return InvalidArgumentError(
        "--resize-file: only for an elastic run (--min-ranks below --ranks or --max-ranks)");
  }
  if (a.max_restarts < 0) {
    return InvalidArgumentError(
        fmt::format("--max-restarts {}: must be 0 or more", a.max_restarts));
  }
  if (a.max_restarts > 0 && !p.elastic) {
    return InvalidArgumentError(fmt::format(
        "--max-restarts {}: replacements join an elastic job; set --min-ranks below --ranks ({})",
        a.max_restarts, a.ranks));
  }
  if (p.elastic && !a.trace.empty()) {
    return UnimplementedError("--trace with --min-ranks is not built yet (a trace per generation)");
  }
  if (p.elastic && p.zero_stage == 1 && a.checkpoint_dir.empty()) {
    return InvalidArgumentError(
        "--min-ranks with zero_stage 1: the optimizer state is sharded over the replicas, so a "
        "lost rank's part can only come back from a checkpoint; give --checkpoint-dir");
  }
  p.cpus = AllowedCpus();
  const int ncpu = static_cast<int>(p.cpus.size());
  // Cores for as many ranks as the run may grow to.
  p.threads = a.threads_per_rank > 0 ? a.threads_per_rank : std::max(1, ncpu / most);
  p.pin = most * p.threads <= ncpu;
  if (p.cuda) {  // the GPU computes; one host thread drives it
    p.compute_threads = 1;
    p.blas_threads = 1;
  } else if (p.spec.batch_per_rank >= p.threads) {
    p.compute_threads = p.threads;
    p.blas_threads = 1;
  } else {
    p.compute_threads = 1;
    p.blas_threads = p.threads;
  }
  p.eval_every = a.eval_every >= 0 ? a.eval_every : std::max<int64_t>(1, a.steps / 5);
  if (a.worker_rank >= 0) {
    // A worker: the launcher checked the data (each rank's loader reads it again anyway).
    p.validation = a.has_validation == 1;
    return p;
  }
  if (a.data.empty()) return InvalidArgumentError("--data: empty path");
  if (!fs::exists(a.data)) {
    return NotFoundError("--data " + a.data +
                         ": no such manifest (make one with `kc data prepare --out DIR FILES...`; "
                         "scripts/setup.sh makes data/fortunes)");
  }
  // Open rank 0's loader: a missing or corrupt shard, a sequence longer than the data or too
  // little data for one global batch fail here, before anything starts.
  parallel::LoaderOptions data = DataOptions(a, "train");
  data.seq_len = p.spec.seq_len;
  KC_ASSIGN_OR_RETURN(
      parallel::BatchShare share,
      parallel::ShareOfBatch(p.global_batch, replicas, 0, p.spec.batch_per_rank, p.micro_batches));
  data.batch = share.sequences;
  data.world_size = replicas;
  data.global_batch = p.global_batch;
  data.seed = p.spec.training.seed;
  Result<std::unique_ptr<parallel::DataLoader>> loader = parallel::OpenDataLoader(data);
  if (!loader.ok()) return loader.status().WithContext("--data " + a.data);
  if ((*loader)->vocab_size() > static_cast<uint32_t>(p.spec.vocab)) {
    return InvalidArgumentError(fmt::format(
        "{}: vocab {} is smaller than the data's vocab_size {} ({}); set vocab: {} or more",
        a.config, p.spec.vocab, (*loader)->vocab_size(), a.data, (*loader)->vocab_size()));
  }
  parallel::LoaderOptions val = data;
  val.split = "val";
  p.validation = parallel::OpenDataLoader(val).ok();
  if (!a.export_dir.empty() && fs::exists(a.export_dir) && !fs::is_directory(a.export_dir)) {
    return InvalidArgumentError("--export " + a.export_dir + ": not a directory");
  }
  return p;
}

fault::ElasticShape ShapeOf(const TrainArgs& a, const TrainSetup& p) {
  return {.t = p.tensor_parallel,
          .p = p.pipeline_stages,
          .global_batch = p.global_batch,
          .micro_batch_size = p.spec.batch_per_rank,
          .micro_batches = p.micro_batches,
          .min_ranks = a.min_ranks > 0 ? a.min_ranks : a.ranks,
          .max_ranks = std::max(a.ranks, a.max_ranks)};
}

std::vector<std::string> WorkerArgv(const TrainArgs& a, const TrainSetup& p, int rank,
                                    const std::string& store, const std::string& group) {
  std::vector<std::string> v = {
      "kc",
      "train",
      a.config,
      "--ranks",
      std::to_string(a.ranks),
      "--threads-per-rank",
      std::to_string(p.threads),  // resolved: workers see only their cores
      "--steps",
      std::to_string(a.steps),
      "--global-batch",
      std::to_string(a.global_batch),
      "--data",
      a.data,
      "--eval-every",
      std::to_string(a.eval_every),
      "--eval-batches",
      std::to_string(a.eval_batches),
      "--grad-sync",
      a.grad_sync,
      "--grad-wire",
      a.grad_wire,
      "--bucket-mb",
      fmt::format("{}", a.bucket_mb),
      "--transport",
      a.transport,
      "--device",
      a.device,
      "--precision",
      a.precision,

      "--timeout",
      fmt::format("{}", a.timeout_s),
      "--worker-rank",
      std::to_string(rank),
      "--store",
      store,
      "--group",
      group,
      "--has-validation",
      p.validation ? "1" : "0"};
  if (!a.export_dir.empty()) {
    v.push_back("--export");
    v.push_back(a.export_dir);
  }
  if (!a.inventory.empty()) {
    v.push_back("--inventory");
    v.push_back(a.inventory);
  }
  if (!a.trace.empty()) {
    v.push_back("--trace");
    v.push_back(a.trace);
  }
  if (!a.plan.empty()) {
    v.push_back("--plan");
    v.push_back(a.plan);
  }
  if (!a.inject_fault.empty()) {
    v.push_back("--inject-fault");
    v.push_back(a.inject_fault);
  }
  v.push_back("--memory-copy-every");
  v.push_back(a.memory_copy_every);
  if (a.min_ranks > 0) {
    v.push_back("--min-ranks");
    v.push_back(std::to_string(a.min_ranks));
  }
  if (a.max_ranks > 0) {
    v.push_back("--max-ranks");
    v.push_back(std::to_string(a.max_ranks));
  }
  v.push_back("--heartbeat-period");
  v.push_back(fmt::format("{}", a.heartbeat_period_s));
  v.push_back("--heartbeat-timeout");
  v.push_back(fmt::format("{}", a.heartbeat_timeout_s));
  if (!a.checkpoint_dir.empty()) {
    for (std::string x :
         {std::string("--checkpoint-dir"), a.checkpoint_dir, std::string("--checkpoint-every"),
          a.checkpoint_every, std::string("--mtbf"), fmt::format("{}", a.mtbf_hours),
          std::string("--checkpoint-keep"), std::to_string(a.checkpoint_keep),
          std::string("--checkpoint-full-every"), std::to_string(a.checkpoint_full_every)}) {
      v.push_back(std::move(x));
    }
    if (a.checkpoint_compress) v.push_back("--checkpoint-compress");
    if (!a.advice_file.empty()) {
      v.push_back("--advice-file");
      v.push_back(a.advice_file);
    }
  }
  if (!a.comm_limits.empty()) {
    v.push_back("--comm-limits");
    v.push_back(a.comm_limits);
  }
  v.push_back("--resume");  // the launcher's choice: never, or a checkpoint
  v.push_back(a.resume);
  if (!a.job_file.empty()) {
    // The run file says the same to every worker: what it sets is not repeated as flags.
    std::vector<std::string> w = {v[0], v[1], "--job", a.job_file};
    for (size_t i = 3; i < v.size(); ++i) {  // v[2] is the model file
      const auto set = std::find_if(std::begin(kRunFileFlags), std::end(kRunFileFlags),
                                    [&](const RunFileFlag& f) { return f.name == v[i]; });
      if (set == std::end(kRunFileFlags)) {
        w.push_back(std::move(v[i]));
      } else if (set->value) {
        ++i;  // and its value
      }
    }
    return w;
  }
  return v;
}

Result<double> ResolveAutoPlan(TrainArgs* args) {
  TrainArgs& a = *args;
  KC_ASSIGN_OR_RETURN(parallel::ModelSpec spec, LoadTrainModel(a));
  const int ncpu = static_cast<int>(AllowedCpus().size());
  if (a.ranks == 0)
    a.ranks = std::max(1, a.threads_per_rank > 0 ? ncpu / a.threads_per_rank : ncpu);
  const int64_t batch = a.global_batch != 0 ? a.global_batch : spec.batch_per_rank * a.ranks;
  KC_ASSIGN_OR_RETURN(
      parallel::planner::LocalCluster local,
      parallel::planner::ProbeLocalCluster(a.ranks, spec.name, UserConfigPath("calibration.json")));
  Result<parallel::planner::SearchResult> found =
      parallel::planner::SearchPlans(spec, local.cluster.spec, batch, {}, local.cluster.options, 1);
  KC_RETURN_IF_ERROR(found.status().WithContext("--plan auto"));
  const parallel::planner::RankedPlan& best = found->ranked.front();
  std::string flag = parallel::PlanToString(best.plan);
  std::replace(flag.begin(), flag.end(), ' ', ',');
  std::cerr << fmt::format("kc train: --plan auto: {} (predicted {:.1f} ms per step; {})\n", flag,
                           best.estimate.step_time_s * 1e3, local.source);
  a.plan = flag;
  return best.estimate.step_time_s;
}

Status ResolveResume(TrainArgs* a, int64_t* done_at) {
  *done_at = -1;
  if (a->resume == "never") return OkStatus();
  if (a->resume != "auto") {
    Result<fault::VerifyReport> r = fault::VerifyCheckpoint(a->resume);
    if (!r.ok()) return r.status().WithContext("--resume " + a->resume);
    std::cerr << "kc train: resuming from " << a->resume << "\n";
    return OkStatus();
  }
  a->resume = "never";
  if (a->checkpoint_dir.empty()) return OkStatus();
  std::vector<std::string> skipped;
  Result<fault::CheckpointEntry> good = fault::LatestGoodCheckpoint(a->checkpoint_dir, &skipped);
  for (const std::string& s : skipped) {
    std::cerr << "kc train: warning: skipping corrupt checkpoint " << s << "\n";
  }
  if (!good.ok()) {
    if (good.status().code() != ErrorCode::kNotFound) return good.status();
    if (skipped.empty()) return OkStatus();  // none yet: a fresh start
    return FailedPreconditionError("--checkpoint-dir " + a->checkpoint_dir +
                                   ": no checkpoint there verifies; --resume never starts "
                                   "afresh (and overwrites them)");
  }
  if (good->step >= a->steps) {
    std::cerr << "kc train: the newest checkpoint, " << good->path << ", is at step " << good->step
              << ": the " << a->steps << " steps asked for are done\n";
    *done_at = good->step;
    return OkStatus();
  }
  std::cerr << "kc train: resuming from " << good->path << " (step " << good->step << ")"
            << (skipped.empty() ? "" : ", the newest good one") << "\n";
  a->resume = good->path;
  return OkStatus();
}

parallel::ParallelPlan TrainSetup::ParallelPlanFor(int ranks) const {
  return {.t = tensor_parallel,
          .p = pipeline_stages,
          .d = std::max(1, ranks / (tensor_parallel * pipeline_stages)),
          .micro_batch_size = spec.batch_per_rank,
          .micro_batches = micro_batches,
          .schedule = schedule,
          .v = virtual_stages,
          .recompute = recompute,
          .zero_stage = zero_stage};
}

}  // namespace kc::app
