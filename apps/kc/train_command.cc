// `kc train CONFIG`: checks the model, the data and the layout, starts one worker process per
// rank on this machine (the embedded launcher: no daemon), shows their progress, and at the
// end prints the summary and writes the metrics (JSON Lines) and the loss plot (SVG).
//
// Workers are this same binary run with --worker-rank. Rank 0 reports each step on file
// descriptor 3 (a pipe to the launcher), one JSON object per line; every rank's stderr comes
// through the launcher, prefixed with its rank. A worker that fails makes the launcher stop
// the others and exit non-zero with that worker's error.
#include "apps/kc/train_command.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <malloc.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/kc/plan_command.h"
#include "apps/kc/train_report.h"
#include "base/clock.h"
#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "fault/checkpoint.h"
#include "fault/heartbeat.h"
#include "fault/runner.h"
#include "hal/compute.h"
#include "hal/host_probe.h"
#include "hal/measure.h"
#include "parallel/data/loader.h"
#include "parallel/model_spec.h"
#include "parallel/plan.h"
#include "parallel/timeline.h"
#include "parallel/trainer.h"

namespace kc::app {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr int kMetricsFd = 3;  // rank 0's step reports, in the worker

struct TrainArgs {
  std::string config;
  int ranks = 0;             // 0: the plan's t*p*d, else 1
  std::string plan;          // a plan file or its flag form
  int threads_per_rank = 0;  // 0: the allowed cores / ranks
  int64_t steps = 300;
  int64_t global_batch = 0;  // sequences; 0: ranks * batch_per_rank
  std::string data = "data/fortunes/manifest.json";
  std::string out;  // default runs/<model name>
  std::string metrics;
  std::string plot;
  int64_t eval_every = -1;  // -1: steps / 5; 0: only at the end
  int64_t eval_batches = 4;
  std::string grad_sync = "bucketed";
  double bucket_mb = 2;
  std::string transport = "auto";
  std::string trace;
  std::string export_dir;
  std::string progress = "auto";
  double timeout_s = 300;
  // "RANK:STEP": that rank dies (exit 86, no clean-up) before that step (1-based): how tests
  // and drills check that one worker's death stops the job.
  std::string inject_fault;
  // Checkpoints (docs/user-guide/checkpoints.md).
  std::string checkpoint_dir;
  std::string checkpoint_every = "0";  // steps (0: after the last step only), or auto
  double mtbf_hours = 0;               // for auto: mean time between failures or preemptions
  int checkpoint_keep = 3;
  bool checkpoint_compress = false;
  std::string resume = "auto";  // auto, never, or a checkpoint's directory
  // Failure detection: a rank silent this long (no heartbeat) is declared failed.
  double heartbeat_period_s = 1;
  double heartbeat_timeout_s = 30;
  // Internal: set by the launcher for its workers.
  int worker_rank = -1;
  std::string store;
  std::string group;
  int has_validation = -1;  // the launcher found a val split (1) or not (0)
};

// Everything checked before a worker starts.
struct Plan {
  parallel::ModelSpec spec;   // batch_per_rank: the micro-batch, sequences per pass
  int64_t micro_batches = 1;  // per step per rank
  int zero_stage = 0;
  int tensor_parallel = 1;  // the plan's t
  int pipeline_stages = 1;  // the plan's p
  parallel::Schedule schedule = parallel::Schedule::k1F1B;
  int virtual_stages = 1;                  // the plan's v
  bool recompute = false;                  // the plan's activation recompute
  int64_t global_batch = 0;                // sequences per step over all ranks
  std::optional<double> predicted_step_s;  // --plan auto: the planner's prediction
  int threads = 1;                         // cores per rank
  // How a rank uses its cores: threads that each take whole sequences of the batch, with
  // single-threaded products (the default when the batch has a sequence per thread), or one
  // thread whose products use all the cores.
  int compute_threads = 1;
  int blas_threads = 1;
  std::vector<int> cpus;  // the cores this process may use
  bool pin = false;       // ranks * threads fit the cores: each rank gets its own
  bool validation = false;
  int64_t eval_every = 0;
  int64_t checkpoint_every = 0;  // steps; 0 with mtbf_s: Young/Daly
  double mtbf_s = 0;
  int fault_rank = -1;  // --inject-fault
  int64_t fault_step = 0;
  std::string fault_how = "exit";  // exit (status 86), kill (SIGKILL), stop (SIGSTOP: silent)
  parallel::GradSync grad_sync = parallel::GradSync::kBucketed;
  comm::TransportKind transport = comm::TransportKind::kAuto;
};

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

// The checks of `kc train` that need no worker: the model file, the layout, the data.
Result<Plan> Check(TrainArgs* args) {
  Plan p;
  // The plan, if any, decides the rank count when --ranks does not.
  parallel::ParallelPlan plan;
  if (!args->plan.empty()) {
    Result<parallel::ParallelPlan> r = fs::is_regular_file(args->plan)
                                           ? parallel::LoadPlan(args->plan)
                                           : parallel::ParsePlanFlag(args->plan);
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
  if (a.checkpoint_every == "auto") {
    if (!(a.mtbf_hours > 0) || a.checkpoint_dir.empty()) {
      return InvalidArgumentError(
          "--checkpoint-every auto: needs --mtbf HOURS (the mean time between failures or "
          "preemptions, above 0) and --checkpoint-dir");
    }
    p.mtbf_s = a.mtbf_hours * 3600;
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

  if (a.progress != "auto" && a.progress != "bar" && a.progress != "lines" &&
      a.progress != "none") {
    return InvalidArgumentError("--progress " + a.progress + ": expected auto, bar, lines or none");
  }
  KC_ASSIGN_OR_RETURN(p.grad_sync, parallel::ParseGradSync(a.grad_sync));
  const std::optional<comm::TransportKind> transport = comm::TransportKindFromName(a.transport);
  if (!transport)
    return InvalidArgumentError("--transport " + a.transport + ": expected auto, shm or tcp");
  p.transport = *transport;
  if (!a.inject_fault.empty()) {
    long long rank = -1, step = 0;
    char how[16] = {0};
    const int n = std::sscanf(a.inject_fault.c_str(), "%lld:%lld:%15s", &rank, &step, how);
    const std::string h = n == 3 ? how : "exit";
    const bool shape_ok =
        n == 2 ? a.inject_fault.find_first_not_of("0123456789:") == std::string::npos : n == 3;
    if (!shape_ok || rank < 0 || rank >= a.ranks || step < 1 || step > a.steps ||
        (h != "exit" && h != "kill" && h != "stop")) {
      return InvalidArgumentError("--inject-fault " + a.inject_fault +
                                  ": expected RANK:STEP[:exit|kill|stop] with a rank below "
                                  "--ranks and a step in 1..--steps");
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
  KC_ASSIGN_OR_RETURN(p.spec, parallel::LoadModelSpec(a.config));
  if (!a.plan.empty()) {
    const int64_t global = a.global_batch != 0 ? a.global_batch : plan.global_batch();
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
    if (plan.zero_stage > 1) {
      return UnimplementedError("--plan " + a.plan + ": zero_stage above 1 is not built yet");
    }
    if (plan.recompute && plan.p > 1 && plan.schedule == parallel::Schedule::kZeroBubbleH1) {
      return UnimplementedError("--plan " + a.plan +
                                ": recompute with zb-h1 is not built yet (the weight passes "
                                "need the activations recompute drops)");
    }
    p.recompute = plan.recompute;
    p.spec.batch_per_rank = plan.micro_batch_size;
    p.micro_batches = plan.micro_batches;
    p.zero_stage = plan.zero_stage;
  } else if (a.global_batch != 0) {
    if (a.global_batch < a.ranks || a.global_batch % a.ranks != 0) {
      return InvalidArgumentError(fmt::format(
          "--global-batch {} cannot be split over {} ranks: it must be a multiple of the rank "
          "count (for example {} or {})",
          a.global_batch, a.ranks, a.ranks * std::max<int64_t>(1, a.global_batch / a.ranks),
          a.ranks * (a.global_batch / a.ranks + 1)));
    }
    p.spec.batch_per_rank = a.global_batch / a.ranks;
  }
  p.global_batch =
      p.spec.batch_per_rank * p.micro_batches * (a.ranks / (p.pipeline_stages * p.tensor_parallel));
  p.cpus = AllowedCpus();
  const int ncpu = static_cast<int>(p.cpus.size());
  p.threads = a.threads_per_rank > 0 ? a.threads_per_rank : std::max(1, ncpu / a.ranks);
  p.pin = a.ranks * p.threads <= ncpu;
  if (p.spec.batch_per_rank >= p.threads) {
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
  data.batch = p.spec.batch_per_rank * p.micro_batches;
  data.world_size = a.ranks;
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

// ---------------------------------------------------------------------------------------
// Worker.

Status WriteFile(const fs::path& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  out.close();
  if (!out) return InternalError("cannot write " + path.string());
  return OkStatus();
}

// What bench/train/compare_losses.py needs to run the same model in PyTorch: the model,
// the initial parameters and every step's global batch.
Status Export(const TrainArgs& a, const Plan& p, parallel::Trainer& trainer) {
  const fs::path dir = a.export_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("--export " + dir.string() + ": " + ec.message());
  const parallel::ModelSpec& s = p.spec;
  const int64_t global = p.global_batch;
  Json model = {{"name", s.name},
                {"layers", s.layers},
                {"hidden", s.hidden},
                {"heads", s.heads},
                {"ffn_hidden", s.ffn_hidden},
                {"vocab", s.vocab},
                {"seq_len", s.seq_len},
                {"batch", global},
                {"tied_embeddings", s.tied_embeddings},
                {"layernorm_eps", s.layernorm_eps},
                {"steps", a.steps},
                {"training",
                 {{"lr", s.training.lr},
                  {"warmup_steps", s.training.warmup_steps},
                  {"min_lr_fraction", s.training.min_lr_fraction},
                  {"weight_decay", s.training.weight_decay},
                  {"grad_clip", s.training.grad_clip},
                  {"beta1", s.training.beta1},
                  {"beta2", s.training.beta2},
                  {"eps", s.training.eps}}}};
  Json tensors = Json::array();
  for (const parallel::TensorSpec& t : trainer.model().tensors()) {
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}});
  }
  model["tensors"] = tensors;
  const std::string text = model.dump(2) + "\n";
  KC_RETURN_IF_ERROR(WriteFile(dir / "model.json", text.data(), text.size()));
  std::span<const float> params = trainer.model().params();
  KC_RETURN_IF_ERROR(WriteFile(dir / "params.bin", params.data(), params.size_bytes()));
  // A one-rank loader with the global batch hands out exactly the windows the ranks get, in
  // rank order (parallel/data/loader.h).
  parallel::LoaderOptions o = DataOptions(a, "train");
  o.seq_len = s.seq_len;
  o.batch = global;
  o.seed = s.training.seed;
  KC_ASSIGN_OR_RETURN(auto loader, parallel::OpenDataLoader(o));
  std::ofstream out(dir / "batches.bin", std::ios::binary | std::ios::trunc);
  parallel::Batch batch;
  for (int64_t i = 0; i < a.steps; ++i) {
    loader->Next(&batch);
    out.write(reinterpret_cast<const char*>(batch.inputs.data()),
              static_cast<std::streamsize>(batch.inputs.size() * sizeof(int32_t)));
    out.write(reinterpret_cast<const char*>(batch.targets.data()),
              static_cast<std::streamsize>(batch.targets.size() * sizeof(int32_t)));
  }
  out.close();
  if (!out) return InternalError("cannot write " + (dir / "batches.bin").string());
  return OkStatus();
}

// Where rank `rank` leaves its trace events for the launcher to join.
std::string TracePart(const std::string& trace, int rank) {
  return fmt::format("{}.rank{}.part", trace, rank);
}

class MetricsPipe {
 public:
  // Rank 0 writes to the launcher's pipe; other ranks, or a worker run by hand, write nowhere.
  explicit MetricsPipe(bool enabled) {
    if (enabled && fcntl(kMetricsFd, F_GETFD) != -1) file_ = fdopen(kMetricsFd, "w");
  }
  ~MetricsPipe() {
    if (file_ != nullptr) fclose(file_);
  }
  void Write(const Json& j) {
    if (file_ == nullptr) return;
    const std::string line = j.dump() + "\n";
    fwrite(line.data(), 1, line.size(), file_);
    fflush(file_);
  }

 private:
  FILE* file_ = nullptr;
};

Status RunWorkerRank(const TrainArgs& a, const Plan& p) {
  const int rank = a.worker_rank;
  // Large blocks that libraries (OpenBLAS's packing buffers among them) allocate and free
  // every step stay in the heap instead of going back to the kernel and faulting in again:
  // fresh pages are slow to fault in on virtual machines.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  hal::DeviceDescriptor d;
  d.id = fmt::format("local/rank{}", rank);
  d.kind = hal::DeviceKind::kCpu;
  d.host = "local";
  d.index_on_host = rank;
  d.cpus = AllowedCpus();
  // Pinning is done: the launcher bound this process to its cores before exec, so every
  // thread (BLAS, communicator, the model's workers) is born on them.
  KC_ASSIGN_OR_RETURN(auto device, hal::OpenComputeDevice(d, {.threads = p.blas_threads}));

  const Duration timeout =
      std::chrono::duration_cast<Duration>(std::chrono::duration<double>(a.timeout_s));
  std::unique_ptr<comm::TcpStoreClient> store;
  std::unique_ptr<comm::TcpStoreClient> heartbeat_store;
  std::unique_ptr<fault::Heartbeat> heartbeat;
  std::unique_ptr<comm::Communicator> comm;
  if (a.ranks > 1) {
    std::string host;
    int port = 0;
    KC_RETURN_IF_ERROR(ParseHostPort(a.store, &host, &port));
    KC_ASSIGN_OR_RETURN(store,
                        comm::TcpStoreClient::Connect(host, port, Clock::Real()->Now() + timeout));
    // Heartbeats first, on a connection of their own: the launcher hears from this rank
    // while it rendezvouses and builds its model.
    KC_ASSIGN_OR_RETURN(heartbeat_store,
                        comm::TcpStoreClient::Connect(host, port, Clock::Real()->Now() + timeout));
    KC_ASSIGN_OR_RETURN(heartbeat, fault::Heartbeat::Start(heartbeat_store.get(), rank,
                                                           fault::Seconds(a.heartbeat_period_s)));
    KC_ASSIGN_OR_RETURN(comm, comm::Communicator::Create({.store = store.get(),
                                                          .group = a.group,
                                                          .rank = rank,
                                                          .size = a.ranks,
                                                          .transport = p.transport,
                                                          .connect_timeout = timeout,
                                                          .timeout = timeout}));
  }
  parallel::TrainerOptions o;
  o.spec = p.spec;
  o.data = DataOptions(a, "train");
  if (p.validation) o.validation = DataOptions(a, "val");
  o.total_steps = a.steps;
  o.device = device.get();
  o.comm = comm.get();
  o.compute_threads = p.compute_threads;
  o.micro_batches = p.micro_batches;
  o.zero_stage = p.zero_stage;
  o.tensor_parallel = p.tensor_parallel;
  o.pipeline_stages = p.pipeline_stages;
  o.schedule = p.schedule;
  o.virtual_stages = p.virtual_stages;
  o.recompute = p.recompute;
  o.grad_sync = p.grad_sync;
  o.bucket_bytes = static_cast<int64_t>(a.bucket_mb * (1 << 20));
  // About 60 spans a step (most are the backward's bucket hand-offs), reserved up front.
  std::unique_ptr<parallel::Timeline> timeline;
  if (!a.trace.empty()) {
    timeline = std::make_unique<parallel::Timeline>(static_cast<size_t>(a.steps) *
                                                    static_cast<size_t>(64 + 8 * p.micro_batches));
    o.timeline = timeline.get();
  }
  KC_ASSIGN_OR_RETURN(auto trainer, parallel::Trainer::Create(o));
  if (!a.export_dir.empty() && rank == 0) KC_RETURN_IF_ERROR(Export(a, p, *trainer));

  MetricsPipe metrics(rank == 0);
  metrics.Write({{"type", "start"},
                 {"parameters", parallel::ParameterCount(p.spec)},
                 {"flops_per_token", parallel::TrainingFlopsPerToken(p.spec)},
                 {"grad_buckets", trainer->grad_buckets()},
                 {"arena_bytes", trainer->arena_bytes()},
                 {"stage_activation_bytes", trainer->stage_activation_bytes()}});
  auto evaluate = [&](int64_t step) -> Status {
    if (!p.validation) return OkStatus();
    KC_ASSIGN_OR_RETURN(double val, trainer->Evaluate(a.eval_batches));
    metrics.Write({{"type", "val"}, {"step", step}, {"loss", val}});
    return OkStatus();
  };
  auto inject_fault = [&](int64_t next_step) {
    if (rank != p.fault_rank || next_step != p.fault_step) return;
    std::cerr << "kc train: rank " << rank << ": injected fault before step " << next_step
              << " (--inject-fault, " << p.fault_how << ")" << std::endl;
    if (p.fault_how == "kill") raise(SIGKILL);
    if (p.fault_how == "stop") raise(SIGSTOP);  // silent until killed
    _exit(86);
  };
  // The loop is L5's resilient runner: checkpoints on the cadence, resuming from one.
  std::unique_ptr<comm::Store> checkpoint_store;  // a connection of its own: it blocks
  if (!a.checkpoint_dir.empty() && a.ranks > 1) {
    std::string host;
    int port = 0;
    KC_RETURN_IF_ERROR(ParseHostPort(a.store, &host, &port));
    KC_ASSIGN_OR_RETURN(
        checkpoint_store,
        comm::TcpStoreClient::Connect(host, port, Clock::Real()->Now() + std::chrono::seconds(30)));
  }
  fault::RunnerOptions ro{.steps = a.steps,
                          .checkpoint = {.dir = a.checkpoint_dir,
                                         .keep = a.checkpoint_keep,
                                         .compress = a.checkpoint_compress},
                          .checkpoint_every = p.checkpoint_every,
                          .mtbf_s = p.mtbf_s,
                          .resume_from = a.resume == "auto" || a.resume == "never" ? "" : a.resume,
                          .plan = {{"t", p.tensor_parallel},
                                   {"p", p.pipeline_stages},
                                   {"d", a.ranks / (p.tensor_parallel * p.pipeline_stages)},
                                   {"micro_batch_size", p.spec.batch_per_rank},
                                   {"micro_batches", p.micro_batches},
                                   {"schedule", std::string(parallel::ScheduleName(p.schedule))},
                                   {"v", p.virtual_stages},
                                   {"recompute", p.recompute},
                                   {"zero_stage", p.zero_stage}},
                          .model = fault::ModelFingerprint(p.spec),
                          .rank = rank,
                          .ranks = a.ranks,
                          .store = checkpoint_store.get()};
  KC_ASSIGN_OR_RETURN(auto runner, fault::ResilientRunner::Create(trainer.get(), ro));
  if (!ro.resume_from.empty()) {
    KC_ASSIGN_OR_RETURN(int64_t step, runner->Restore());
    metrics.Write({{"type", "resume"}, {"step", step}, {"checkpoint", ro.resume_from}});
  }
  inject_fault(trainer->steps_done() + 1);
  fault::RunnerCallbacks callbacks;
  callbacks.on_step = [&](const parallel::StepStats& s) {
    metrics.Write({{"type", "step"},
                   {"step", s.step + 1},
                   {"loss", s.loss},
                   {"lr", s.lr},
                   {"grad_norm", s.grad_norm},
                   {"step_ms", s.step_s * 1e3},
                   {"compute_ms", s.compute_s * 1e3},
                   {"comm_exposed_ms", s.comm_exposed_s * 1e3},
                   {"tp_comm_ms", s.tp_comm_s * 1e3},
                   {"stage_bubble", s.stage_bubble},
                   {"tokens", s.tokens},
                   {"tokens_per_s", s.tokens / s.step_s}});
    return OkStatus();
  };
  callbacks.after_step = [&](int64_t done) -> Status {
    if ((p.eval_every > 0 && done % p.eval_every == 0) || done == a.steps) {
      KC_RETURN_IF_ERROR(evaluate(done));
    }
    inject_fault(done + 1);
    return OkStatus();
  };
  callbacks.on_checkpoint = [&](const fault::SaveStats& c) {
    metrics.Write({{"type", "checkpoint"},
                   {"step", c.step},
                   {"stall_ms", c.stall_s * 1e3},
                   {"persist_ms", c.persist_s * 1e3},
                   {"raw_bytes", c.raw_bytes},
                   {"bytes_written", c.bytes_written},
                   {"chunks_written", c.chunks_written},
                   {"chunks_reused", c.chunks_reused}});
  };
  callbacks.on_interval = [&](int64_t steps, double cost_s, double interval_s) {
    metrics.Write({{"type", "checkpoint_interval"},
                   {"step", trainer->steps_done()},
                   {"every_steps", steps},
                   {"cost_s", cost_s},
                   {"interval_s", interval_s},
                   {"mtbf_s", p.mtbf_s}});
  };
  KC_RETURN_IF_ERROR(runner->Run(callbacks));
  if (timeline != nullptr) {
    const std::string events = timeline->ChromeTraceEvents(rank);
    KC_RETURN_IF_ERROR(WriteFile(TracePart(a.trace, rank), events.data(), events.size()));
  }
  return OkStatus();
}

int RunWorker(const TrainArgs& a, const Plan& p) {
  if (Status s = RunWorkerRank(a, p); !s.ok()) {
    std::cerr << "kc train: rank " << a.worker_rank << ": " << s << "\n";
    return kExitFailure;
  }
  return kExitOk;
}

// ---------------------------------------------------------------------------------------
// Launcher.

std::vector<std::string> WorkerArgv(const TrainArgs& a, const Plan& p, int rank,
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
      "--bucket-mb",
      fmt::format("{}", a.bucket_mb),
      "--transport",
      a.transport,

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
  v.push_back("--heartbeat-period");
  v.push_back(fmt::format("{}", a.heartbeat_period_s));
  v.push_back("--heartbeat-timeout");
  v.push_back(fmt::format("{}", a.heartbeat_timeout_s));
  if (!a.checkpoint_dir.empty()) {
    for (std::string x :
         {std::string("--checkpoint-dir"), a.checkpoint_dir, std::string("--checkpoint-every"),
          a.checkpoint_every, std::string("--mtbf"), fmt::format("{}", a.mtbf_hours),
          std::string("--checkpoint-keep"), std::to_string(a.checkpoint_keep)}) {
      v.push_back(std::move(x));
    }
    if (a.checkpoint_compress) v.push_back("--checkpoint-compress");
  }
  v.push_back("--resume");  // the launcher's choice: never, or a checkpoint
  v.push_back(a.resume);
  return v;
}

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int pid_fd = -1;      // readable once it exits (pidfd_open)
  int err_fd = -1;      // its stderr
  std::string partial;  // an unfinished stderr line
  std::string last_error;
  bool exited = false;
  int status = 0;
};

// Starts rank `rank`: stderr to a pipe, rank 0's fd 3 to `metrics_write`, pinned to its
// cores when they fit, OpenBLAS limited to its threads.
Result<Child> Spawn(const TrainArgs& a, const Plan& p, int rank, const std::string& store,
                    const std::string& group, int metrics_write) {
  int err[2];
  if (pipe2(err, O_CLOEXEC) != 0)
    return InternalError(std::string("pipe: ") + std::strerror(errno));
  std::vector<std::string> args = WorkerArgv(a, p, rank, store, group);
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int i = 0; i < p.threads; ++i) {
    CPU_SET(p.cpus[static_cast<size_t>(rank * p.threads + i) % p.cpus.size()], &set);
  }
  const std::string blas_threads = std::to_string(p.blas_threads);
  const pid_t pid = fork();
  if (pid < 0) return InternalError(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec.
    dup2(err[1], STDERR_FILENO);
    if (rank == 0) {
      dup2(metrics_write, kMetricsFd);
    } else {
      close(kMetricsFd);
    }
    if (p.pin) sched_setaffinity(0, sizeof(set), &set);
    setenv("OPENBLAS_NUM_THREADS", blas_threads.c_str(), 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(err[1]);
  Child c;
  c.rank = rank;
  c.pid = pid;
  c.err_fd = err[0];
  c.pid_fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (c.pid_fd < 0) {
    const int e = errno;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    close(c.err_fd);
    return InternalError(std::string("pidfd_open: ") + std::strerror(e));
  }
  return c;
}

// Reads the launcher's inputs: rank 0's step lines and every rank's stderr.
class Monitor {
 public:
  Monitor(const TrainArgs& a, std::ofstream* metrics) : a_(a), metrics_(metrics) {
    const bool tty = isatty(STDERR_FILENO) == 1;
    mode_ = a.progress == "auto" ? (tty ? "bar" : "lines") : a.progress;
    every_ = std::max<int64_t>(1, a.steps / 20);
  }

  void OnMetricsLine(const std::string& line) {
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return;
    *metrics_ << line << "\n";
    const std::string type = j.value("type", "");
    if (type == "step") {
      StepRecord r;
      r.step = j.value("step", int64_t{0});
      r.loss = j.value("loss", 0.0);
      r.lr = j.value("lr", 0.0);
      r.grad_norm = j.value("grad_norm", 0.0);
      r.step_s = j.value("step_ms", 0.0) / 1e3;
      r.compute_s = j.value("compute_ms", 0.0) / 1e3;
      r.comm_exposed_s = j.value("comm_exposed_ms", 0.0) / 1e3;
      r.tp_comm_s = j.value("tp_comm_ms", 0.0) / 1e3;
      r.tokens = j.value("tokens", int64_t{0});
      if (j.contains("stage_bubble") && j["stage_bubble"].is_array()) {
        r.stage_bubble = j["stage_bubble"].get<std::vector<double>>();
      }
      steps_.push_back(r);
      Show(r.step == a_.steps || r.step % every_ == 0);
    } else if (type == "start" && j.contains("stage_activation_bytes")) {
      stage_activation_bytes_ = j["stage_activation_bytes"].get<std::vector<int64_t>>();
    } else if (type == "checkpoint") {
      checkpoints_.push_back(j);
    } else if (type == "resume") {
      resumed_from_ = j.value("step", int64_t{0});
    } else if (type == "val") {
      val_.push_back({j.value("step", int64_t{0}), j.value("loss", 0.0)});
      if (mode_ == "lines") {
        std::cerr << fmt::format("step {}: validation loss {:.4f}\n", val_.back().step,
                                 val_.back().loss);
      }
      Show(false);
    }
  }

  // A worker's stderr line: shown above the progress bar, prefixed with its rank.
  void OnWorkerLine(int rank, const std::string& line) {
    ClearBar();
    std::cerr << "[rank " << rank << "] " << line << "\n";
    Show(false);
  }

  void Finish() { ClearBar(); }

  const std::vector<StepRecord>& steps() const { return steps_; }
  const std::vector<ValRecord>& val() const { return val_; }
  const std::vector<int64_t>& stage_activation_bytes() const { return stage_activation_bytes_; }
  const std::vector<Json>& checkpoints() const { return checkpoints_; }
  int64_t resumed_from() const { return resumed_from_; }

 private:
  void Show(bool line_due) {
    if (steps_.empty() || mode_ == "none") return;
    const StepRecord& r = steps_.back();
    // Rate over the last (up to) 20 steps.
    double time = 0, tokens = 0;
    for (size_t i = steps_.size() > 20 ? steps_.size() - 20 : 0; i < steps_.size(); ++i) {
      time += steps_[i].step_s;
      tokens += static_cast<double>(steps_[i].tokens);
    }
    const double rate = time > 0 ? tokens / time : 0;
    const double per_step = time / static_cast<double>(std::min<size_t>(20, steps_.size()));
    const double eta = per_step * static_cast<double>(a_.steps - r.step);
    const double val = val_.empty() ? -1 : val_.back().loss;
    if (mode_ == "bar") {
      winsize ws{};
      const int width =
          ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20 ? ws.ws_col : 100;
      std::cerr << "\r\033[K" << ProgressLine(r.step, a_.steps, r.loss, val, rate, eta, width - 1)
                << std::flush;
      bar_shown_ = true;
    } else if (mode_ == "lines" && line_due) {
      std::cerr << ProgressLine(r.step, a_.steps, r.loss, val, rate, eta, 120) << "\n";
    }
  }
  void ClearBar() {
    if (bar_shown_) std::cerr << "\r\033[K" << std::flush;
    bar_shown_ = false;
  }

  const TrainArgs& a_;
  std::ofstream* metrics_;
  std::string mode_;
  int64_t every_ = 1;
  bool bar_shown_ = false;
  std::vector<StepRecord> steps_;
  std::vector<ValRecord> val_;
  std::vector<int64_t> stage_activation_bytes_;
  std::vector<Json> checkpoints_;  // rank 0's "checkpoint" records
  int64_t resumed_from_ = -1;      // the checkpoint's step, when resumed
};

// Splits what arrived on a pipe into lines; returns false at end of file.
bool ReadLines(int fd, std::string* partial, const std::function<void(const std::string&)>& f) {
  char buf[65536];
  const ssize_t n = read(fd, buf, sizeof(buf));
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) {
    if (!partial->empty()) f(*partial);
    partial->clear();
    return false;
  }
  partial->append(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = partial->find('\n', start)) != std::string::npos; start = nl + 1) {
    f(partial->substr(start, nl - start));
  }
  partial->erase(0, start);
  return true;
}

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

// Joins the ranks' trace events into one Chrome-trace / Perfetto file and removes the parts.
Status JoinTrace(const std::string& trace, int ranks) {
  std::ofstream out(trace, std::ios::trunc);
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  for (int r = 0; r < ranks; ++r) {
    const std::string part = TracePart(trace, r);
    std::ifstream in(part);
    if (!in) return NotFoundError("rank " + std::to_string(r) + " wrote no trace (" + part + ")");
    if (r > 0) out << ",\n";
    out << in.rdbuf();
    in.close();
    fs::remove(part);
  }
  out << "\n]}\n";
  out.close();
  if (!out) return InternalError("cannot write " + trace);
  return OkStatus();
}

void PrintSummary(const TrainArgs& a, const Plan& p, const Monitor& m, double peak_per_core,
                  const fs::path& metrics_path, const fs::path& plot_path, Json* summary_json) {
  const TrainSummary s = Summarise(m.steps());
  const double flops_per_token = parallel::TrainingFlopsPerToken(p.spec);
  const int cores = a.ranks * p.threads;
  const double achieved = s.tokens_per_s * flops_per_token;
  const double mfu = peak_per_core > 0 ? achieved / (cores * peak_per_core) : 0;
  const int64_t global = p.global_batch;
  std::string val;
  if (!m.val().empty()) val = fmt::format(" (validation {:.4f})", m.val().back().loss);
  std::cout << fmt::format(
      "kc train: {} ({:.2f} M parameters), {} rank{} x {} thread{}, {} steps, global batch {} x {} "
      "= {} tokens, {}\n",
      p.spec.name, parallel::ParameterCount(p.spec) / 1e6, a.ranks, a.ranks == 1 ? "" : "s",
      p.threads, p.threads == 1 ? "" : "s", s.steps, global, p.spec.seq_len,
      global * p.spec.seq_len, a.ranks > 1 ? fmt::format("grad sync {}", a.grad_sync) : "one rank");
  std::cout << fmt::format("  loss            {:.4f} -> {:.4f}{}\n", s.first_loss, s.last_loss,
                           val);
  std::cout << fmt::format("  throughput      {:.0f} tokens/s (steady state: steps {}-{})\n",
                           s.tokens_per_s, s.steps - s.measured_steps + 1, s.steps);
  std::cout << fmt::format("  step time       {:.1f} ms (median){}\n", s.step_ms_median,
                           p.predicted_step_s ? fmt::format("; the planner predicted {:.1f} ms",
                                                            *p.predicted_step_s * 1e3)
                                              : "");
  std::cout << fmt::format(
      "  device util     {:.1f}% (compute time / step time; the seed asks for >= 80%)\n",
      100 * s.device_utilisation);
  std::cout << fmt::format(
      "  exposed comm    {:.1f}% of step time, {:.2f} ms per step (median {:.2f}; the seed flags "
      "> 40%)\n",
      100 * s.exposed_comm_share, s.comm_exposed_ms, s.comm_exposed_ms_median);
  if (p.tensor_parallel > 1) {
    std::cout << fmt::format(
        "  tensor parallel t={}: {:.2f} ms per step in its all-reduces (median; 2 per block each "
        "way, plus the embeddings', the loss's and the head's)\n",
        p.tensor_parallel, s.tp_comm_ms_median);
  }
  // GPipe and 1F1B idle (p - 1) / (m + p - 1) of the time; interleaving divides the idle
  // part by v; ZB-H1 by 3 when the forward and the two backward halves cost the same.
  const bool interleaved = p.schedule == parallel::Schedule::kInterleaved;
  const bool zero_bubble = p.schedule == parallel::Schedule::kZeroBubbleH1;
  const int64_t v = interleaved ? p.virtual_stages : zero_bubble ? 3 : 1;
  const double ideal_bubble = static_cast<double>(p.pipeline_stages - 1) /
                              static_cast<double>(v * p.micro_batches + p.pipeline_stages - 1);
  double mean_bubble = 0;
  if (!s.stage_bubble.empty()) {
    std::string stages;
    for (size_t i = 0; i < s.stage_bubble.size(); ++i) {
      stages += fmt::format(", stage {} {:.1f}%", i, 100 * s.stage_bubble[i]);
      mean_bubble += s.stage_bubble[i] / static_cast<double>(s.stage_bubble.size());
    }
    std::cout << fmt::format(
        "  pipeline bubble {:.1f}%{} (median per stage; {} = {:.1f}% with p={} m={}{})\n",
        100 * mean_bubble, stages,
        interleaved   ? "(p-1)/(vm+p-1)"
        : zero_bubble ? "(p-1)/(3m+p-1), equal passes"
                      : "(p-1)/(m+p-1)",
        100 * ideal_bubble, p.pipeline_stages, p.micro_batches,
        interleaved ? fmt::format(" v={}", v) : "");
  }
  if (m.stage_activation_bytes().size() > 1) {
    std::string stages;
    for (size_t i = 0; i < m.stage_activation_bytes().size(); ++i) {
      stages += fmt::format("{}stage {} {:.1f} MiB", i == 0 ? "" : ", ", i,
                            static_cast<double>(m.stage_activation_bytes()[i]) / (1 << 20));
    }
    std::cout << fmt::format("  activations     {} (the micro-batches each stage holds at once)\n",
                             stages);
  }
  if (peak_per_core > 0) {
    std::cout << fmt::format(
        "  MFU             {:.1f}% ({:.1f} GFLOP/s of {} core{} x {:.1f} GFLOP/s sgemm measured "
        "now)\n",
        100 * mfu, achieved / 1e9, cores, cores == 1 ? "" : "s", peak_per_core / 1e9);
  }
  // Checkpoints: the step's stall (the copy to memory) against the step, and what the
  // background persist wrote.
  std::vector<double> stalls;
  double written = 0, persist_ms = 0;
  int64_t reused = 0, chunks = 0;
  std::string at;
  for (const Json& c : m.checkpoints()) {
    stalls.push_back(c.value("stall_ms", 0.0));
    written += c.value("bytes_written", 0.0);
    persist_ms = std::max(persist_ms, c.value("persist_ms", 0.0));
    reused += c.value("chunks_reused", int64_t{0});
    chunks += c.value("chunks_written", int64_t{0}) + c.value("chunks_reused", int64_t{0});
    at += (at.empty() ? "" : ", ") + std::to_string(c.value("step", int64_t{0}));
  }
  std::sort(stalls.begin(), stalls.end());
  const double stall_ms = stalls.empty() ? 0 : stalls[stalls.size() / 2];
  if (m.resumed_from() >= 0) {
    std::cout << fmt::format("  resumed         from step {} ({})\n", m.resumed_from(), a.resume);
  }
  if (!stalls.empty()) {
    std::cout << fmt::format(
        "  checkpoints     {} (steps {}) in {}: step stall {:.1f} ms median ({:.1f}% of a step), "
        "persist up to {:.0f} ms in the background, {:.1f} MiB written, {} of {} chunks "
        "unchanged\n",
        stalls.size(), at, a.checkpoint_dir, stall_ms,
        s.step_ms_median > 0 ? 100 * stall_ms / s.step_ms_median : 0.0, persist_ms,
        written / (1 << 20), reused, chunks);
  }
  std::cout << fmt::format("  wall time       {}\n", FormatDuration(s.total_s));
  std::cout << fmt::format("  metrics         {}\n  plot            {}\n", metrics_path.string(),
                           plot_path.string());
  if (!a.trace.empty()) std::cout << fmt::format("  trace           {}\n", a.trace);
  *summary_json = {
      {"type", "summary"},
      {"model", p.spec.name},
      {"ranks", a.ranks},
      {"threads_per_rank", p.threads},
      {"steps", s.steps},
      {"global_batch", global},
      {"grad_sync", a.grad_sync},
      {"first_loss", s.first_loss},
      {"last_loss", s.last_loss},
      {"val_loss", m.val().empty() ? Json(nullptr) : Json(m.val().back().loss)},
      {"tokens_per_s", s.tokens_per_s},
      {"step_ms", s.step_ms_median},
      {"device_utilisation", s.device_utilisation},
      {"exposed_comm_share", s.exposed_comm_share},
      {"comm_exposed_ms", s.comm_exposed_ms},
      {"comm_exposed_ms_median", s.comm_exposed_ms_median},
      {"tp_comm_ms_median", p.tensor_parallel > 1 ? Json(s.tp_comm_ms_median) : Json()},
      {"stage_bubble", s.stage_bubble},
      {"bubble", p.pipeline_stages > 1 ? Json(mean_bubble) : Json()},
      {"bubble_ideal", p.pipeline_stages > 1 ? Json(ideal_bubble) : Json()},
      {"flops_per_token", flops_per_token},
      {"sgemm_flops_per_core", peak_per_core},
      {"mfu", mfu},
      {"measured_steps", s.measured_steps},
      {"checkpoints", static_cast<int64_t>(stalls.size())},
      {"checkpoint_stall_ms", stalls.empty() ? Json() : Json(stall_ms)},
      {"resumed_from", m.resumed_from() >= 0 ? Json(m.resumed_from()) : Json()},
      {"wall_s", s.total_s}};
}

// `--plan auto`: the planner's choice for this machine, among the plans kc train runs, written
// back into a.plan in the flag form (the workers get that plan, not "auto"). Returns the
// predicted step time.
Result<double> ResolveAutoPlan(TrainArgs* args) {
  TrainArgs& a = *args;
  KC_ASSIGN_OR_RETURN(parallel::ModelSpec spec, parallel::LoadModelSpec(a.config));
  const int ncpu = static_cast<int>(AllowedCpus().size());
  if (a.ranks == 0)
    a.ranks = std::max(1, a.threads_per_rank > 0 ? ncpu / a.threads_per_rank : ncpu);
  const int64_t batch = a.global_batch != 0 ? a.global_batch : spec.batch_per_rank * a.ranks;
  KC_ASSIGN_OR_RETURN(LocalCluster local,
                      ProbeLocalCluster(a.ranks, spec.name, UserConfigPath("calibration.json")));
  Result<parallel::planner::SearchResult> found = parallel::planner::SearchPlans(
      spec, local.cluster.spec, batch, EngineConstraints(), local.cluster.options, 1);
  KC_RETURN_IF_ERROR(found.status().WithContext("--plan auto"));
  const parallel::planner::RankedPlan& best = found->ranked.front();
  std::string flag = parallel::PlanToString(best.plan);
  std::replace(flag.begin(), flag.end(), ' ', ',');
  std::cerr << fmt::format("kc train: --plan auto: {} (predicted {:.1f} ms per step; {})\n", flag,
                           best.estimate.step_time_s * 1e3, local.source);
  a.plan = flag;
  return best.estimate.step_time_s;
}

// Picks the checkpoint to start from: with --resume auto the newest in --checkpoint-dir that
// verifies (saying which newer ones are corrupt), with a path that one (verified). Leaves
// a.resume "never" or a checkpoint directory, for the workers.
Status ResolveResume(TrainArgs* a) {
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
  std::cerr << "kc train: resuming from " << good->path << " (step " << good->step << ")"
            << (skipped.empty() ? "" : ", the newest good one") << "\n";
  a->resume = good->path;
  return OkStatus();
}

int RunLauncher(TrainArgs a) {
  std::optional<double> predicted_step_s;
  if (a.plan == "auto") {
    Result<double> predicted = ResolveAutoPlan(&a);
    if (!predicted.ok()) {
      std::cerr << "kc train: " << predicted.status().message() << "\n";
      return kExitBadInput;
    }
    predicted_step_s = *predicted;
  }
  Result<Plan> plan = Check(&a);
  if (!plan.ok()) {
    std::cerr << "kc train: " << plan.status().message() << "\n";
    return kExitBadInput;
  }
  plan->predicted_step_s = predicted_step_s;
  const Plan& p = *plan;
  if (Status s = ResolveResume(&a); !s.ok()) {
    std::cerr << "kc train: " << s.message() << "\n";
    return kExitBadInput;
  }
  const fs::path out = a.out.empty() ? fs::path("runs") / p.spec.name : fs::path(a.out);
  const fs::path metrics_path = a.metrics.empty() ? out / "metrics.jsonl" : fs::path(a.metrics);
  const fs::path plot_path = a.plot.empty() ? out / "loss.svg" : fs::path(a.plot);
  std::error_code ec;
  for (const fs::path& f : {metrics_path, plot_path, fs::path(a.trace)}) {
    if (f.has_parent_path()) fs::create_directories(f.parent_path(), ec);
    if (ec) {
      std::cerr << "kc train: " << f.parent_path().string() << ": " << ec.message() << "\n";
      return kExitBadInput;
    }
  }
  std::ofstream metrics(metrics_path, std::ios::trunc);
  if (!metrics) {
    std::cerr << "kc train: cannot write " << metrics_path.string() << "\n";
    return kExitBadInput;
  }
  metrics << Json{{"type", "run"},
                  {"model", p.spec.name},
                  {"config", a.config},
                  {"ranks", a.ranks},
                  {"threads_per_rank", p.threads},
                  {"steps", a.steps},
                  {"global_batch", p.global_batch},
                  {"micro_batches", p.micro_batches},
                  {"zero_stage", p.zero_stage},
                  {"seq_len", p.spec.seq_len},
                  {"grad_sync", a.grad_sync},
                  {"data", a.data},
                  {"plan", a.plan.empty() ? Json() : Json(a.plan)},
                  {"predicted_step_s", p.predicted_step_s ? Json(*p.predicted_step_s) : Json()}}
                 .dump()
          << "\n";

  std::unique_ptr<comm::TcpStoreServer> server;
  std::string store;
  if (a.ranks > 1) {
    Result<std::unique_ptr<comm::TcpStoreServer>> s =
        comm::TcpStoreServer::Start({.bind_address = "127.0.0.1", .port = 0});
    if (!s.ok()) {
      std::cerr << "kc train: rendezvous store: " << s.status() << "\n";
      return kExitFailure;
    }
    server = *std::move(s);
    store = fmt::format("127.0.0.1:{}", server->port());
  }
  const std::string group = fmt::format("kc-train-{}", getpid());
  int mpipe[2];
  if (pipe2(mpipe, O_CLOEXEC) != 0) {
    std::cerr << "kc train: pipe: " << std::strerror(errno) << "\n";
    return kExitFailure;
  }
  // A worker that dies must not take the launcher with it when its pipe closes.
  signal(SIGPIPE, SIG_IGN);
  std::vector<Child> children;
  for (int r = 0; r < a.ranks; ++r) {
    Result<Child> c = Spawn(a, p, r, store, group, mpipe[1]);
    if (!c.ok()) {
      std::cerr << "kc train: cannot start rank " << r << ": " << c.status().message() << "\n";
      for (Child& k : children) kill(k.pid, SIGKILL);
      for (Child& k : children) waitpid(k.pid, nullptr, 0);
      if (server != nullptr) server->Stop();
      return kExitFailure;
    }
    children.push_back(*std::move(c));
  }
  close(mpipe[1]);

  // Heartbeats: a rank silent for --heartbeat-timeout is declared failed (checked every half
  // period, so within the timeout and one period of its last beat).
  std::unique_ptr<comm::TcpStoreClient> beat_client;
  std::optional<fault::HeartbeatMonitor> beats;
  const auto check_every = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      fault::Seconds(a.heartbeat_period_s / 2));
  auto next_check = std::chrono::steady_clock::now() + check_every;
  if (server != nullptr) {
    Result<std::unique_ptr<comm::TcpStoreClient>> c = comm::TcpStoreClient::Connect(
        "127.0.0.1", server->port(), Clock::Real()->Now() + std::chrono::seconds(10));
    if (c.ok()) {
      beat_client = *std::move(c);
      beats.emplace(beat_client.get(), a.ranks,
                    fault::HeartbeatOptions{.period = fault::Seconds(a.heartbeat_period_s),
                                            .timeout = fault::Seconds(a.heartbeat_timeout_s),
                                            .first_beat = fault::Seconds(a.timeout_s)},
                    std::chrono::steady_clock::now());
    } else {
      std::cerr << "kc train: warning: no heartbeat monitor: " << c.status().message() << "\n";
    }
  }

  Monitor monitor(a, &metrics);
  std::string metrics_partial;
  int metrics_fd = mpipe[0];
  std::optional<std::string> failure;
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  size_t running = children.size();
  auto stop_others = [&] {
    for (Child& c : children) {
      if (!c.exited) kill(c.pid, SIGTERM);
    }
    kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  };
  auto read_stderr = [&](Child& c) {
    if (!ReadLines(c.err_fd, &c.partial, [&](const std::string& l) {
          if (!l.empty()) c.last_error = l;
          monitor.OnWorkerLine(c.rank, l);
        })) {
      close(c.err_fd);
      c.err_fd = -1;
    }
  };
  // A child's exit is seen the moment it happens (its pidfd), so the first rank to fail is
  // the one named, not a peer that failed because of it.
  auto on_exit = [&](Child& c) {
    while (c.err_fd >= 0) read_stderr(c);  // the writer is gone: reads end at EOF
    waitpid(c.pid, &c.status, 0);
    close(c.pid_fd);
    c.pid_fd = -1;
    c.exited = true;
    if (beats) beats->Forget(c.rank);
    --running;
    const bool ok = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0;
    if (!ok && !failure) {
      std::string why = c.last_error.empty() ? DescribeExit(c.status) : c.last_error;
      if (!c.last_error.empty() && WIFSIGNALED(c.status))
        why += " (" + DescribeExit(c.status) + ")";
      failure = fmt::format("rank {} failed: {}", c.rank, why);
      stop_others();
    }
  };
  while (running > 0) {
    std::vector<pollfd> fds;
    std::vector<std::pair<int, bool>> owner;  // (child index or -1 for metrics, is pidfd)
    if (metrics_fd >= 0) {
      fds.push_back({metrics_fd, POLLIN, 0});
      owner.emplace_back(-1, false);
    }
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i].err_fd >= 0) {
        fds.push_back({children[i].err_fd, POLLIN, 0});
        owner.emplace_back(static_cast<int>(i), false);
      }
      if (!children[i].exited) {
        fds.push_back({children[i].pid_fd, POLLIN, 0});
        owner.emplace_back(static_cast<int>(i), true);
      }
    }
    // The timeout matters for heartbeats and for escalating to SIGKILL.
    poll(fds.data(), fds.size(),
         static_cast<int>(std::clamp<double>(a.heartbeat_period_s * 500, 1, 500)));
    for (size_t k = 0; k < fds.size(); ++k) {
      if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const auto [index, is_pid] = owner[k];
      if (index < 0) {
        if (!ReadLines(metrics_fd, &metrics_partial,
                       [&](const std::string& l) { monitor.OnMetricsLine(l); })) {
          close(metrics_fd);
          metrics_fd = -1;
        }
      } else if (is_pid) {
        if (!children[index].exited) on_exit(children[index]);
      } else if (children[index].err_fd >= 0) {
        read_stderr(children[index]);
      }
    }
    if (beats && std::chrono::steady_clock::now() >= next_check) {
      const auto now = std::chrono::steady_clock::now();
      for (int r : beats->Check(now)) {
        Child& c = children[static_cast<size_t>(r)];
        if (c.exited) continue;
        if (!failure) {
          failure = fmt::format(
              "rank {} sent no heartbeat for {:.1f} s (--heartbeat-timeout {} s): declared failed "
              "and killed",
              r, beats->silent_for(r).count(), a.heartbeat_timeout_s);
        }
        kill(c.pid, SIGKILL);  // a stopped or wedged process does not act on SIGTERM
        stop_others();
      }
      next_check = now + check_every;
    }
    if (kill_at && std::chrono::steady_clock::now() > *kill_at) {
      for (Child& c : children) {
        if (!c.exited) kill(c.pid, SIGKILL);
      }
      kill_at.reset();
    }
  }
  if (metrics_fd >= 0) {
    while (ReadLines(metrics_fd, &metrics_partial,
                     [&](const std::string& l) { monitor.OnMetricsLine(l); })) {
    }
    close(metrics_fd);
  }
  monitor.Finish();
  if (server != nullptr) server->Stop();
  if (failure) {
    for (int r = 0; r < a.ranks && !a.trace.empty(); ++r) fs::remove(TracePart(a.trace, r), ec);
    metrics.flush();
    std::cerr << "kc train: " << *failure << "; the other ranks were stopped\n";
    return kExitFailure;
  }
  // A resumed run takes the steps after its checkpoint's.
  const int64_t expected = a.steps - std::max<int64_t>(0, monitor.resumed_from());
  if (static_cast<int64_t>(monitor.steps().size()) != expected) {
    std::cerr << "kc train: rank 0 reported " << monitor.steps().size() << " of " << expected
              << " steps\n";
    return kExitFailure;
  }
  if (!a.trace.empty()) {
    if (Status st = JoinTrace(a.trace, a.ranks); !st.ok()) {
      std::cerr << "kc train: --trace: " << st.message() << "\n";
      return kExitFailure;
    }
  }
  // The peak MFU is measured against: one core's sgemm, now that the workers are done.
  Result<double> peak = hal::MeasureSgemmFlops({.n = 512, .threads = 1, .repetitions = 6});
  Json summary;
  PrintSummary(a, p, monitor, peak.ok() ? *peak : 0, metrics_path, plot_path, &summary);
  metrics << summary.dump() << "\n";
  metrics.close();
  std::ofstream plot(plot_path, std::ios::trunc);
  plot << LossCurveSvg(fmt::format("{}: {} rank{}, global batch {}", p.spec.name, a.ranks,
                                   a.ranks == 1 ? "" : "s", p.global_batch),
                       monitor.steps(), monitor.val());
  plot.close();
  if (!metrics || !plot) {
    std::cerr << "kc train: cannot write " << metrics_path.string() << " or " << plot_path.string()
              << "\n";
    return kExitFailure;
  }
  return kExitOk;
}

int RunTrain(TrainArgs a) {
  if (a.worker_rank >= 0) {
    Result<Plan> plan = Check(&a);
    if (!plan.ok()) {
      std::cerr << "kc train: rank " << a.worker_rank << ": " << plan.status().message() << "\n";
      return kExitBadInput;
    }
    return RunWorker(a, *plan);
  }
  return RunLauncher(a);
}

}  // namespace

void AddTrainCommand(CLI::App& app, Action* action) {
  CLI::App* c = app.add_subcommand(
      "train",
      "Train a model on this machine: N worker processes, data parallel, with a live progress "
      "bar, a summary, metrics (JSON Lines) and a loss plot (SVG)");
  auto a = std::make_shared<TrainArgs>();
  c->add_option("config", a->config, "Model file (YAML), e.g. examples/models/gpt-tiny.yaml")
      ->required();
  c->add_option("--ranks", a->ranks,
                "Worker processes (data-parallel ranks; default: the plan's t*p*d, else 1)");
  c->add_option("--plan", a->plan,
                "A parallel plan: a plan file, its keys as t=1,p=1,d=2,micro_batch_size=4,"
                "micro_batches=2,zero_stage=1, or auto: the planner's choice for this machine "
                "(docs/user-guide/plans.md)");
  c->add_option("--threads-per-rank", a->threads_per_rank,
                "Cores of each rank: threads that split its batch (default: the cores this "
                "process may use / ranks)");
  c->add_option("--steps", a->steps, "Training steps")->capture_default_str();
  c->add_option("--global-batch", a->global_batch,
                "Sequences per step over all ranks (default: ranks x the model's batch_per_rank)");
  c->add_option("--data", a->data, "manifest.json of `kc data prepare`")->capture_default_str();
  c->add_option("--out", a->out, "Directory for metrics.jsonl and loss.svg (default runs/MODEL)");
  c->add_option("--metrics", a->metrics, "Metrics file (JSON Lines; default OUT/metrics.jsonl)");
  c->add_option("--plot", a->plot, "Loss plot (SVG; default OUT/loss.svg)");
  c->add_option("--eval-every", a->eval_every,
                "Validation every N steps (default steps/5; 0: at the end only)");
  c->add_option("--eval-batches", a->eval_batches, "Validation batches per rank each time")
      ->capture_default_str();
  c->add_option("--grad-sync", a->grad_sync,
                "bucketed (fused buckets overlapped with the backward) or per-tensor (one "
                "all-reduce per tensor after the backward: the baseline)")
      ->capture_default_str();
  c->add_option("--bucket-mb", a->bucket_mb, "Gradient bucket size in MiB")->capture_default_str();
  c->add_option("--transport", a->transport,
                "How the ranks talk: auto (shared memory on one machine), shm or tcp (as between "
                "machines, over loopback)")
      ->capture_default_str();
  c->add_option("--trace", a->trace,
                "Write every rank's compute, communication and data spans here, as one "
                "Chrome-trace / Perfetto JSON file");
  c->add_option("--export", a->export_dir,
                "Also write the model, initial parameters and batches here "
                "(bench/train/compare_losses.py)");
  c->add_option("--progress", a->progress, "auto, bar, lines or none")->capture_default_str();
  c->add_option("--timeout", a->timeout_s, "Seconds a rendezvous or collective may take")
      ->capture_default_str();
  c->add_option("--inject-fault", a->inject_fault,
                "RANK:STEP: that worker dies before that step (checks that a failure stops the "
                "job)");
  c->add_option("--checkpoint-dir", a->checkpoint_dir,
                "Save checkpoints here (each rank its shards, rank 0 the manifest) and resume "
                "from the newest good one (docs/user-guide/checkpoints.md)");
  c->add_option("--checkpoint-every", a->checkpoint_every,
                "Steps between checkpoints (0: after the last step only), or auto: the "
                "Young/Daly interval sqrt(2 x measured checkpoint cost x --mtbf)")
      ->capture_default_str();
  c->add_option("--mtbf", a->mtbf_hours,
                "Mean time between failures or preemptions, in hours, for --checkpoint-every "
                "auto");
  c->add_option("--checkpoint-keep", a->checkpoint_keep, "Checkpoints kept (the newest)")
      ->capture_default_str();
  c->add_flag("--checkpoint-compress", a->checkpoint_compress, "Compress chunks with zstd");
  c->add_option("--resume", a->resume,
                "auto (the newest checkpoint in --checkpoint-dir that verifies, if any), never, "
                "or a checkpoint directory (DIR/step-N)")
      ->capture_default_str();
  c->add_option("--heartbeat-period", a->heartbeat_period_s,
                "Seconds between a rank's heartbeats (several ranks)")
      ->capture_default_str();
  c->add_option("--heartbeat-timeout", a->heartbeat_timeout_s,
                "Seconds without a heartbeat after which a rank is declared failed (at least two "
                "periods)")
      ->capture_default_str();
  c->add_option("--worker-rank", a->worker_rank)->group("");        // internal: run as this rank
  c->add_option("--store", a->store)->group("");                    // internal
  c->add_option("--group", a->group)->group("");                    // internal
  c->add_option("--has-validation", a->has_validation)->group("");  // internal
  c->callback([action, a] { *action = [a] { return RunTrain(*a); }; });
}

}  // namespace kc::app
