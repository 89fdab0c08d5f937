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
#include <functional>
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
#include "comm/rendezvous.h"
#include "comm/tcp_store.h"
#include "fault/checkpoint.h"
#include "fault/elastic.h"
#include "fault/heartbeat.h"
#include "fault/runner.h"
#include "hal/compute.h"
#include "hal/cuda/cuda_device.h"
#include "hal/host_probe.h"
#include "hal/measure.h"
#include "parallel/data/loader.h"
#include "parallel/model_spec.h"
#include "parallel/plan.h"
#include "parallel/precision.h"
#include "parallel/timeline.h"
#include "parallel/trainer.h"

namespace kc::app {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr int kMetricsFd = 3;  // rank 0's step reports, in the worker
// The launcher's exit code when SIGTERM stopped the run short (128 + SIGTERM, as a shell
// reports a process SIGTERM ended).
constexpr int kExitStopped = 128 + SIGTERM;

// SIGTERM asks a run to stop: the workers stop after a step they all agree on, with a
// checkpoint of it, and the launcher, which passes the request on to them, reports the stop.
volatile sig_atomic_t g_stop_requested = 0;
extern "C" void OnStopRequest(int) { g_stop_requested = 1; }
void CatchStopRequests() {
  struct sigaction sa {};
  sa.sa_handler = OnStopRequest;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

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
  std::string device = "cpu";      // cpu, or cuda: one GPU per rank
  std::string precision = "fp32";  // fp32, or bf16 (cuda)
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
  // Elasticity (docs/user-guide/elastic.md): below --ranks down to min_ranks the survivors of
  // a failure go on; max_restarts replacement workers may be started to grow back.
  int min_ranks = 0;  // 0: --ranks (not elastic)
  int max_restarts = 0;
  std::string fault_log;  // fault events, JSONL; default <out>/faults.jsonl
  // Internal: set by the launcher for its workers.
  bool elastic_join = false;  // a replacement: joins a later generation
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
  // exit (status 86), kill (SIGKILL), stop (SIGSTOP: silent), or kill-in-forward,
  // kill-in-allreduce, kill-in-persist (SIGKILL at that point of the step)
  std::string fault_how = "exit";
  bool elastic = false;  // --min-ranks below --ranks
  bool cuda = false;     // --device cuda
  int gpus = 0;  // CUDA devices visible (the launcher's count; ranks share them round robin)
  parallel::Precision precision = parallel::Precision::kFp32;
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
  if (p.cuda &&
      (p.tensor_parallel != 1 || p.pipeline_stages != 1 || p.zero_stage != 0 || p.recompute)) {
    return UnimplementedError(fmt::format(
        "--plan {} with --device cuda: on GPUs the engine runs data-parallel plans only (t=1, "
        "p=1, zero_stage 0, no recompute)",
        a.plan));
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
  p.elastic = a.min_ranks > 0 && a.min_ranks < a.ranks;
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
  p.threads = a.threads_per_rank > 0 ? a.threads_per_rank : std::max(1, ncpu / a.ranks);
  p.pin = a.ranks * p.threads <= ncpu;
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
  // The launcher's pipe, when it gave this worker one (a worker run by hand has none).
  MetricsPipe() {
    if (fcntl(kMetricsFd, F_GETFD) != -1) file_ = fdopen(kMetricsFd, "w");
  }
  ~MetricsPipe() {
    if (file_ != nullptr) fclose(file_);
  }
  // Only rank 0 of a generation writes.
  void set_enabled(bool enabled) { enabled_ = enabled; }
  void Write(const Json& j) {
    if (file_ == nullptr || !enabled_) return;
    const std::string line = j.dump() + "\n";
    fwrite(line.data(), 1, line.size(), file_);
    fflush(file_);
  }

 private:
  FILE* file_ = nullptr;
  bool enabled_ = false;
};

// The elastic shape of this run: what stays when generations change.
fault::ElasticShape ShapeOf(const TrainArgs& a, const Plan& p) {
  return {.t = p.tensor_parallel,
          .p = p.pipeline_stages,
          .global_batch = p.global_batch,
          .micro_batch_size = p.spec.batch_per_rank,
          .micro_batches = p.micro_batches,
          .min_ranks = a.min_ranks > 0 ? a.min_ranks : a.ranks,
          .max_ranks = a.ranks};
}

// A worker: one process, a rank of every generation it is a member of. Without elasticity
// there is one generation, ranks 0..N-1. With it (--min-ranks below --ranks), a generation
// that fails is followed by the one the launcher announces: the worker keeps its own state
// (copied out of the failed generation's engine), rebuilds its communicator and engine as
// its rank there, and continues from the newest state a replica holds.
Status RunWorkerRank(const TrainArgs& a, const Plan& p) {
  const int worker = a.worker_rank;
  // Large blocks that libraries (OpenBLAS's packing buffers among them) allocate and free
  // every step stay in the heap instead of going back to the kernel and faulting in again:
  // fresh pages are slow to fault in on virtual machines.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  hal::DeviceDescriptor d;
  d.id = fmt::format("local/rank{}", worker);
  d.kind = hal::DeviceKind::kCpu;
  d.host = "local";
  d.index_on_host = worker;
  d.cpus = AllowedCpus();
  if (p.cuda) {
    // One GPU per rank, round robin over those visible (the launcher warned if they are shared).
    KC_ASSIGN_OR_RETURN(const int gpus, hal::cuda::CudaDeviceCount());
    d.kind = hal::DeviceKind::kCuda;
    d.index_on_host = worker % gpus;
    d.id = fmt::format("local/gpu{}", d.index_on_host);
    d.cpus.clear();
  }
  // Pinning is done: the launcher bound this process to its cores before exec, so every
  // thread (BLAS, communicator, the model's workers) is born on them.
  KC_ASSIGN_OR_RETURN(auto device, hal::OpenComputeDevice(d, {.threads = p.blas_threads}));

  const Duration timeout =
      std::chrono::duration_cast<Duration>(std::chrono::duration<double>(a.timeout_s));
  const bool elastic = p.elastic;
  // Store connections, each for one user (a call blocks its connection): the communicators,
  // the heartbeats, checkpoints, and the watch for the next generation.
  std::unique_ptr<comm::TcpStoreClient> store, heartbeat_store, checkpoint_store, watch_store,
      stop_store;
  std::unique_ptr<fault::Heartbeat> heartbeat;
  if (a.ranks > 1) {
    std::string host;
    int port = 0;
    KC_RETURN_IF_ERROR(ParseHostPort(a.store, &host, &port));
    auto connect = [&]() {
      return comm::TcpStoreClient::Connect(host, port, Clock::Real()->Now() + timeout);
    };
    KC_ASSIGN_OR_RETURN(store, connect());
    // Heartbeats first: the launcher hears from this worker while it rendezvouses and builds
    // its model.
    KC_ASSIGN_OR_RETURN(heartbeat_store, connect());
    KC_ASSIGN_OR_RETURN(heartbeat, fault::Heartbeat::Start(heartbeat_store.get(), worker,
                                                           fault::Seconds(a.heartbeat_period_s)));
    if (!a.checkpoint_dir.empty()) {
      KC_ASSIGN_OR_RETURN(checkpoint_store, connect());
    }
    if (elastic) {
      KC_ASSIGN_OR_RETURN(watch_store, connect());
    }
    KC_ASSIGN_OR_RETURN(stop_store, connect());
  }
  // A stop asked for (SIGTERM, see CatchStopRequests): the step every rank stops after, once
  // known. Generation rank 0 names it, the step after the one it has just done: every other
  // rank is then at most inside that step (it cannot end it without rank 0), so each one,
  // asking after every step once it too was asked to stop, finds it in time.
  int64_t stop_after = -1;
  const std::string stop_key = a.group + "/stop-after";
  const fault::ElasticShape shape = ShapeOf(a, p);
  fault::Generation gen = fault::FirstGeneration(shape, a.ranks);
  if (a.elastic_join) {
    // A newcomer: it says it is ready and waits (as a spare) for a generation that takes it in.
    KC_ASSIGN_OR_RETURN(std::string current,
                        store->Get(fault::kCurrentGenerationKey, Clock::Real()->Now() + timeout));
    KC_ASSIGN_OR_RETURN(
        gen, fault::AwaitGeneration(*store, std::stoll(current), Clock::Real()->Now() + timeout));
    KC_RETURN_IF_ERROR(store->Set(fault::ReadyKey(worker), "1"));
  }

  MetricsPipe metrics;  // the leader of each generation (its rank 0) writes
  // When --inject-fault names a point inside a step, a timeline tells when it is reached.
  const bool in_step = p.fault_how == "kill-in-forward" || p.fault_how == "kill-in-allreduce";
  auto injected = [&](int64_t next_step) {
    std::cerr << "kc train: rank " << worker << ": injected fault before step " << next_step
              << " (--inject-fault, " << p.fault_how << ")" << std::endl;
  };
  auto inject_fault = [&](int64_t next_step) {
    if (worker != p.fault_rank || next_step != p.fault_step || p.fault_how.starts_with("kill-in"))
      return;
    injected(next_step);
    if (p.fault_how == "kill") raise(SIGKILL);
    if (p.fault_how == "stop") raise(SIGSTOP);  // silent until killed
    _exit(86);
  };

  fault::StateSnapshot snapshot;       // this worker's state when its last generation ended
  parallel::LoaderState loader_after;  // the loader after the current trainer's last step
  std::unique_ptr<parallel::Timeline> timeline;
  for (;;) {
    const int rank = gen.rank_of(worker);
    if (gen.done || (rank < 0 && gen.stop)) return OkStatus();
    if (rank < 0) {  // a spare: wait for a generation that takes it in
      KC_ASSIGN_OR_RETURN(
          gen, fault::AwaitGeneration(*watch_store, gen.number + 1,
                                      Clock::Real()->Now() + std::chrono::hours(24 * 365)));
      continue;
    }
    const int world = static_cast<int>(gen.members.size());
    const auto rebuild_start = std::chrono::steady_clock::now();
    // Everything of this generation, destroyed (communicators last) before the next begins.
    std::atomic<comm::Communicator*> live_comm{nullptr};
    std::atomic<fault::ResilientRunner*> live_runner{nullptr};
    std::unique_ptr<comm::Communicator> comm;
    std::unique_ptr<comm::Store> checkpoint_view;  // outlives the runner's persist thread
    std::unique_ptr<parallel::Trainer> trainer;
    std::unique_ptr<fault::ResilientRunner> runner;
    std::unique_ptr<fault::GenerationWatch> watch;  // destroyed first: it uses the others
    bool state_ready = false;  // the trainer holds a whole state (initialised or restored)
    auto abort_generation = [&] {
      if (comm::Communicator* c = live_comm.load()) {
        c->Abort(AbortedError(fmt::format("generation {} ended", gen.number)));
      }
      if (fault::ResilientRunner* r = live_runner.load()) r->Abandon();
    };
    if (elastic) {
      KC_ASSIGN_OR_RETURN(
          watch, fault::GenerationWatch::Start(watch_store.get(), gen.number, abort_generation));
    }
    metrics.set_enabled(rank == 0);
    // Survivors come to a new generation's rendezvous within a second or so; one that does not
    // come is dead or silent, which the launcher turns into a later generation within the
    // heartbeat timeout: waiting longer than that is waiting for nothing.
    const Duration connect_timeout =
        gen.number == 0 ? timeout
                        : std::min(timeout, std::chrono::duration_cast<Duration>(
                                                fault::Seconds(2 * a.heartbeat_timeout_s + 10)));
    auto run_generation = [&]() -> Status {
      if (world > 1) {
        KC_ASSIGN_OR_RETURN(
            comm, comm::Communicator::Create({.store = store.get(),
                                              .group = fmt::format("{}/g{}", a.group, gen.number),
                                              .rank = rank,
                                              .size = world,
                                              .transport = p.transport,
                                              .connect_timeout = connect_timeout,
                                              .timeout = timeout}));
        live_comm.store(comm.get());
        if (watch != nullptr && watch->fired()) abort_generation();
      }
      parallel::TrainerOptions o;
      o.spec = p.spec;
      o.spec.batch_per_rank = gen.micro_batch_size;
      o.data = DataOptions(a, "train");
      if (p.validation) o.validation = DataOptions(a, "val");
      o.total_steps = a.steps;
      o.device = device.get();
      o.comm = comm.get();
      o.compute_threads =
          static_cast<int>(std::min<int64_t>(p.compute_threads, gen.micro_batch_size));
      o.micro_batches = gen.micro_batches;
      o.zero_stage = p.zero_stage;
      o.tensor_parallel = p.tensor_parallel;
      o.pipeline_stages = p.pipeline_stages;
      o.schedule = p.schedule;
      o.virtual_stages = p.virtual_stages;
      o.recompute = p.recompute;
      o.grad_sync = p.grad_sync;
      o.precision = p.precision;
      o.bucket_bytes = static_cast<int64_t>(a.bucket_mb * (1 << 20));
      // About 60 spans a step (most are the backward's bucket hand-offs), reserved up front.
      if (!a.trace.empty() || in_step) {
        timeline = std::make_unique<parallel::Timeline>(
            a.trace.empty()
                ? 4096
                : static_cast<size_t>(a.steps) * static_cast<size_t>(64 + 8 * p.micro_batches));
        o.timeline = timeline.get();
        if (in_step && worker == p.fault_rank) {
          const char* at = p.fault_how == "kill-in-forward" ? "data" : "backward";
          timeline->set_observer([&, at](const char* name, int64_t step) {
            if (step + 1 == p.fault_step && std::strcmp(name, at) == 0) {
              injected(p.fault_step);
              raise(SIGKILL);
            }
          });
        }
      }
      KC_ASSIGN_OR_RETURN(trainer, parallel::Trainer::Create(o));
      if (!a.export_dir.empty() && rank == 0) KC_RETURN_IF_ERROR(Export(a, p, *trainer));

      fault::RunnerOptions ro{
          .steps = a.steps,
          .checkpoint = {.dir = a.checkpoint_dir,
                         .keep = a.checkpoint_keep,
                         .compress = a.checkpoint_compress},
          .checkpoint_every = p.checkpoint_every,
          .mtbf_s = p.mtbf_s,
          .resume_from =
              gen.number == 0 && a.resume != "auto" && a.resume != "never" ? a.resume : "",
          .plan = {{"t", p.tensor_parallel},
                   {"p", p.pipeline_stages},
                   {"d", gen.d},
                   {"micro_batch_size", gen.micro_batch_size},
                   {"micro_batches", gen.micro_batches},
                   {"schedule", std::string(parallel::ScheduleName(p.schedule))},
                   {"v", p.virtual_stages},
                   {"recompute", p.recompute},
                   {"zero_stage", p.zero_stage}},
          .model = fault::ModelFingerprint(p.spec),
          .rank = rank,
          .ranks = world};
      if (worker == p.fault_rank && p.fault_how == "kill-in-persist") {
        ro.checkpoint.on_persist = [&](int64_t step) {
          if (step + 1 == p.fault_step) {
            injected(p.fault_step);
            raise(SIGKILL);
          }
        };
      }
      if (checkpoint_store != nullptr) {
        // Each generation's commits in a key space of its own.
        checkpoint_view =
            comm::WithPrefix(checkpoint_store.get(), comm::GenerationPrefix(gen.number));
        ro.store = checkpoint_view.get();
      }
      // The state: from the checkpoint asked for (the first generation), else from this
      // worker's own copy and the replicas (later ones), else the newest good checkpoint.
      std::string source;
      int64_t state_bytes = 0;
      bool need_checkpoint = gen.number > 0 && gen.from_checkpoint;
      if (gen.number > 0 && !gen.from_checkpoint) {
        const fault::Member& me = gen.members[static_cast<size_t>(rank)];
        const bool has_state =
            me.has_state && snapshot.valid && fault::ApplySnapshot(snapshot, trainer.get()).ok();
        Result<fault::ReplicaRestore> r =
            fault::RestoreFromReplicas(trainer.get(), comm.get(), has_state);
        if (r.ok()) {
          source = "replica";
          state_bytes = r->bytes;
        } else if (r.status().code() == ErrorCode::kFailedPrecondition) {
          need_checkpoint = true;
        } else {
          return r.status();
        }
      }
      if (need_checkpoint) {
        if (a.checkpoint_dir.empty()) {
          return FailedPreconditionError(
              "no data-parallel replica of the lost ranks survived whole and there is no "
              "--checkpoint-dir to restore from");
        }
        KC_ASSIGN_OR_RETURN(fault::CheckpointEntry e,
                            fault::LatestGoodCheckpoint(a.checkpoint_dir, nullptr));
        ro.resume_from = e.path;
        source = "checkpoint";
      }
      KC_ASSIGN_OR_RETURN(runner, fault::ResilientRunner::Create(trainer.get(), ro));
      live_runner.store(runner.get());
      if (watch != nullptr && watch->fired()) abort_generation();
      if (!ro.resume_from.empty()) {
        KC_ASSIGN_OR_RETURN(int64_t step, runner->Restore());
        if (gen.number == 0) {
          metrics.Write({{"type", "resume"}, {"step", step}, {"checkpoint", ro.resume_from}});
        }
      }
      loader_after = trainer->loader().state();
      state_ready = true;
      if (gen.number == 0) {
        metrics.Write({{"type", "start"},
                       {"parameters", parallel::ParameterCount(p.spec)},
                       {"flops_per_token", parallel::TrainingFlopsPerToken(p.spec)},
                       {"grad_buckets", trainer->grad_buckets()},
                       {"arena_bytes", trainer->arena_bytes()},
                       {"stage_activation_bytes", trainer->stage_activation_bytes()}});
      } else {
        metrics.Write({{"type", "recovery"},
                       {"generation", gen.number},
                       {"ranks", world},
                       {"d", gen.d},
                       {"micro_batch_size", gen.micro_batch_size},
                       {"micro_batches", gen.micro_batches},
                       {"step", trainer->steps_done()},
                       {"source", source},
                       {"state_bytes_received", state_bytes},
                       {"rebuild_s", std::chrono::duration<double>(
                                         std::chrono::steady_clock::now() - rebuild_start)
                                         .count()},
                       {"reason", gen.reason},
                       {"stop", gen.stop}});
      }
      fault::RunnerCallbacks callbacks;
      callbacks.on_step = [&](const parallel::StepStats& s) {
        loader_after = trainer->loader().state();
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
        if (timeline != nullptr && a.trace.empty()) timeline->Clear();
        if (p.validation && ((p.eval_every > 0 && done % p.eval_every == 0) || done == a.steps)) {
          KC_ASSIGN_OR_RETURN(double val, trainer->Evaluate(a.eval_batches));
          metrics.Write({{"type", "val"}, {"step", done}, {"loss", val}});
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
      callbacks.stop_after = [&](int64_t done) -> bool {
        if (g_stop_requested == 0) return false;
        if (world == 1) return true;
        if (stop_after < 0 && rank == 0) {
          stop_after = done + 1;
          if (Status s = stop_store->Set(stop_key, std::to_string(stop_after)); !s.ok()) {
            std::cerr << "kc train: rank 0: cannot ask the others to stop: " << s << std::endl;
          }
        } else if (stop_after < 0) {
          const std::string keys[1] = {stop_key};
          Result<bool> named = stop_store->Check(keys);
          if (named.ok() && *named) {
            Result<std::string> v = stop_store->Get(stop_key, Clock::Real()->Now() + timeout);
            if (v.ok()) stop_after = std::stoll(*v);
          }
        }
        return stop_after >= 0 && done >= stop_after;
      };
      callbacks.on_interval = [&](int64_t steps, double cost_s, double interval_s) {
        metrics.Write({{"type", "checkpoint_interval"},
                       {"step", trainer->steps_done()},
                       {"every_steps", steps},
                       {"cost_s", cost_s},
                       {"interval_s", interval_s},
                       {"mtbf_s", p.mtbf_s}});
      };
      if (gen.stop) {
        // Below the minimum: what survived goes to a checkpoint, and the job ends.
        if (!a.checkpoint_dir.empty()) return runner->SaveNow(callbacks);
        return OkStatus();
      }
      if (gen.number == 0) inject_fault(trainer->steps_done() + 1);
      return runner->Run(callbacks);
    };
    Status s = run_generation();
    if (s.ok() || !elastic || s.code() == ErrorCode::kCancelled) {  // kCancelled: stopped
      if (s.ok() && timeline != nullptr && !a.trace.empty()) {
        const std::string events = timeline->ChromeTraceEvents(rank);
        KC_RETURN_IF_ERROR(WriteFile(TracePart(a.trace, rank), events.data(), events.size()));
      }
      return s;
    }
    // The generation failed. Keep this worker's state, then learn the next generation: the
    // launcher announces one when a member dies or goes silent.
    if (trainer != nullptr && state_ready) snapshot = fault::TakeSnapshot(*trainer, loader_after);
    watch.reset();  // first: its thread may be using the runner and the communicator
    if (runner != nullptr) runner->Abandon();  // a persist in flight waits for nobody now
    runner.reset();
    trainer.reset();
    comm.reset();
    Result<fault::Generation> next = fault::AwaitGeneration(
        *watch_store, gen.number + 1,
        Clock::Real()->Now() + std::chrono::duration_cast<Duration>(fault::Seconds(
                                   a.heartbeat_timeout_s + 2 * a.heartbeat_period_s + 10)));
    if (!next.ok()) return s;
    std::cerr << "kc train: rank " << rank << " (worker " << worker << "): generation "
              << gen.number << " ended (" << s.message() << "); generation " << next->number
              << " begins: " << next->reason << std::endl;
    gen = *std::move(next);
  }
}

int RunWorker(const TrainArgs& a, const Plan& p) {
  CatchStopRequests();
  if (Status s = RunWorkerRank(a, p); s.code() == ErrorCode::kCancelled) {
    return kExitOk;  // stopped on request, as the launcher reports
  } else if (!s.ok()) {
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
  if (a.min_ranks > 0) {
    v.push_back("--min-ranks");
    v.push_back(std::to_string(a.min_ranks));
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
  std::string kill_reason;  // why the launcher killed it (a missing heartbeat)
  bool exited = false;
  int status = 0;
};

// Starts rank `rank` (with `join`, a replacement worker of that id): stderr to a pipe, rank 0's
// (elastic: every worker's) fd 3 to `metrics_write`, pinned to its
// cores when they fit, OpenBLAS limited to its threads.
Result<Child> Spawn(const TrainArgs& a, const Plan& p, int rank, const std::string& store,
                    const std::string& group, int metrics_write, bool join = false) {
  int err[2];
  if (pipe2(err, O_CLOEXEC) != 0)
    return InternalError(std::string("pipe: ") + std::strerror(errno));
  std::vector<std::string> args = WorkerArgv(a, p, rank, store, group);
  if (join) args.push_back("--elastic-join");
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
    if (rank == 0 || p.elastic) {  // elastic: whichever worker leads a generation reports
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
    // A line at a time: whoever follows the file (kc agent reports a job's progress from it)
    // sees each record as it happens.
    *metrics_ << line << "\n" << std::flush;
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
      // After a recovery the steps since the restored state come again: the new ones count.
      while (!steps_.empty() && steps_.back().step >= r.step) steps_.pop_back();
      steps_.push_back(r);
      Show(r.step == a_.steps || r.step % every_ == 0);
    } else if (type == "start" && j.contains("stage_activation_bytes")) {
      stage_activation_bytes_ = j["stage_activation_bytes"].get<std::vector<int64_t>>();
    } else if (type == "checkpoint") {
      checkpoints_.push_back(j);
    } else if (type == "resume") {
      resumed_from_ = j.value("step", int64_t{0});
    } else if (type == "recovery" && on_recovery) {
      on_recovery(j);
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
  // Called with each "recovery" record (the leader of a new generation restored its state).
  std::function<void(const Json&)> on_recovery;
  int64_t last_step() const { return steps_.empty() ? 0 : steps_.back().step; }
  // Set by the launcher: failures seen, and the events of recoveries (faults.jsonl's).
  int faults = 0;
  std::vector<Json> recoveries;

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

// peak_per_core: one core's measured sgemm rate, or on GPUs one GPU's measured matrix rate in the
// run's precision.
void PrintSummary(const TrainArgs& a, const Plan& p, const Monitor& m, double peak_per_core,
                  const fs::path& metrics_path, const fs::path& plot_path, Json* summary_json) {
  const TrainSummary s = Summarise(m.steps());
  const double flops_per_token = parallel::TrainingFlopsPerToken(p.spec);
  // The units the peak is per: cores, or on GPUs the GPUs the ranks use.
  // Oversubscribed (more threads than cores): the peak is that of the cores there are.
  const int cores = p.cuda ? std::min(a.ranks, std::max(p.gpus, 1))
                           : std::min(a.ranks * p.threads, static_cast<int>(p.cpus.size()));
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
  if (peak_per_core > 0 && p.cuda) {
    std::cout << fmt::format(
        "  MFU             {:.1f}% ({:.1f} TFLOP/s of {} GPU{} x {:.1f} TFLOP/s {} matrix product "
        "measured now)\n",
        100 * mfu, achieved / 1e12, cores, cores == 1 ? "" : "s", peak_per_core / 1e12,
        a.precision);
  } else if (peak_per_core > 0) {
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
  if (m.faults > 0) {
    std::string what;
    for (const Json& r : m.recoveries) {
      what += fmt::format("; generation {} with {} rank{} from {} in {:.2f} s, {} step{} lost",
                          r.value("generation", 0), r.value("ranks", 0),
                          r.value("ranks", 0) == 1 ? "" : "s", r.value("source", ""),
                          r.value("duration_s", 0.0), r.value("steps_lost", 0),
                          r.value("steps_lost", 0) == 1 ? "" : "s");
    }
    std::cout << fmt::format("  faults          {}{}\n", m.faults, what);
  }
  std::cout << fmt::format("  wall time       {}\n", FormatDuration(s.total_s));
  std::cout << fmt::format("  metrics         {}\n  plot            {}\n", metrics_path.string(),
                           plot_path.string());
  if (!a.trace.empty()) std::cout << fmt::format("  trace           {}\n", a.trace);
  *summary_json = {
      {"type", "summary"},
      {"faults", m.faults},
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
      {"sgemm_flops_per_core", p.cuda ? 0.0 : peak_per_core},
      {"device", a.device},
      {"precision", a.precision},
      {"gpu_flops", p.cuda ? peak_per_core : 0.0},
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

// GPU 0's matrix-product rate in the run's precision (hal::MeasureGemmFlops).
Result<double> MeasureGpuFlops(const Plan& p) {
  hal::DeviceDescriptor d{.id = "local/gpu0", .kind = hal::DeviceKind::kCuda, .host = "local"};
  KC_ASSIGN_OR_RETURN(std::unique_ptr<hal::ComputeDevice> device, hal::OpenComputeDevice(d));
  return hal::MeasureGemmFlops(
      *device, {.type = p.precision == parallel::Precision::kBf16 ? hal::DataType::kBf16
                                                                  : hal::DataType::kF32});
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
  if (!p.cuda && a.ranks * p.threads > static_cast<int>(p.cpus.size())) {
    std::cerr << fmt::format(
        "kc train: warning: {} ranks x {} thread{} oversubscribe the {} core{} this process may "
        "use; the ranks take turns on them, so throughput and MFU are those of {} shared "
        "core{}\n",
        a.ranks, p.threads, p.threads == 1 ? "" : "s", p.cpus.size(), p.cpus.size() == 1 ? "" : "s",
        p.cpus.size(), p.cpus.size() == 1 ? "" : "s");
  }
  if (p.cuda && a.ranks > p.gpus) {
    std::cerr << fmt::format(
        "kc train: warning: {} ranks share {} GPU{} (round robin); throughput and MFU are those of "
        "the shared GPUs\n",
        a.ranks, p.gpus, p.gpus == 1 ? "" : "s");
  }
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
                  {"device", a.device},
                  {"precision", a.precision},
                  {"data", a.data},
                  {"plan", a.plan.empty() ? Json() : Json(a.plan)},
                  {"predicted_step_s", p.predicted_step_s ? Json(*p.predicted_step_s) : Json()}}
                 .dump()
          << "\n"
          << std::flush;

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
  CatchStopRequests();
  bool stop_passed_on = false;
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
  // Replacement workers need the write end later; otherwise the pipe ends with the workers.
  int metrics_write = mpipe[1];
  if (a.max_restarts == 0) {
    close(metrics_write);
    metrics_write = -1;
  }

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

  std::optional<std::string> failure;
  bool stopped_cleanly = false;  // below --min-ranks: the members saved and exited
  // Elasticity (fault/elastic.h): the launcher decides each generation and announces it.
  const fault::ElasticShape shape = ShapeOf(a, p);
  fault::Generation current = fault::FirstGeneration(shape, a.ranks);
  bool elastic_open = p.elastic && beat_client != nullptr;  // off once the job is ending
  if (elastic_open) {
    if (Status st = fault::AnnounceGeneration(*beat_client, current); !st.ok()) {
      std::cerr << "kc train: warning: not elastic: " << st.message() << "\n";
      elastic_open = false;
    }
  }
  int restarts_left = a.max_restarts;
  int pending_spawns = 0;
  std::vector<int> awaiting_ready;  // replacements not yet taken into a generation
  int faults = 0;
  struct Recovery {
    std::chrono::steady_clock::time_point detected;
    int64_t last_step = 0;  // the last step reported before the failure
  };
  std::optional<Recovery> recovering;
  // Beside the metrics unless given.
  const fs::path fault_log_path =
      a.fault_log.empty() ? metrics_path.parent_path() / "faults.jsonl" : fs::path(a.fault_log);
  std::ofstream fault_log;
  auto fault_event = [&](Json event) {
    if (!fault_log.is_open()) fault_log.open(fault_log_path, std::ios::app);
    event["time_unix"] =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    event["job"] = group;
    fault_log << event.dump() << "\n";
    fault_log.flush();
  };
  auto alive_workers = [&] {
    std::vector<int> alive;
    for (const Child& c : children) {
      if (!c.exited) alive.push_back(c.rank);
    }
    return alive;
  };
  auto announce = [&](const fault::Generation& next) -> bool {
    if (Status st = fault::AnnounceGeneration(*beat_client, next); !st.ok()) {
      failure = "cannot announce generation " + std::to_string(next.number) + ": " + st.message();
      return false;
    }
    current = next;
    return true;
  };
  monitor.on_recovery = [&](const Json& r) {
    const int64_t step = r.value("step", int64_t{0});
    Json event = {{"event", r.value("stop", false) ? "stopped" : "recovered"},
                  {"generation", r.value("generation", int64_t{0})},
                  {"ranks", r.value("ranks", 0)},
                  {"d", r.value("d", 0)},
                  {"source", r.value("source", "")},
                  {"step", step},
                  {"rebuild_s", r.value("rebuild_s", 0.0)}};
    if (recovering) {
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - recovering->detected)
              .count();
      event["steps_lost"] = std::max<int64_t>(0, recovering->last_step - step);
      event["duration_s"] = took;
      recovering.reset();
    }
    fault_event(event);
    monitor.recoveries.push_back(event);
  };
  std::string metrics_partial;
  int metrics_fd = mpipe[0];
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
    if (ok && elastic_open && current.rank_of(c.rank) >= 0) {
      // A member finished: the job is ending; tell spares once every member has.
      bool all = true;
      for (const fault::Member& m : current.members) {
        all = all && children[static_cast<size_t>(m.worker)].exited;
      }
      if (all) {
        fault::Generation done;
        done.number = current.number + 1;
        done.done = true;
        done.reason = "the job finished";
        (void)announce(done);
        elastic_open = false;
      }
    }
    if (!ok && !failure) {
      std::string why = !c.kill_reason.empty() ? c.kill_reason
                        : c.last_error.empty() ? DescribeExit(c.status)
                                               : c.last_error;
      if (c.kill_reason.empty() && !c.last_error.empty() && WIFSIGNALED(c.status))
        why += " (" + DescribeExit(c.status) + ")";
      monitor.faults = ++faults;
      Json event = {{"event", "detected"}, {"worker", c.rank}, {"reason", why}};
      if (elastic_open) {
        Result<fault::Generation> next =
            fault::NextGeneration(current, shape, alive_workers(), p.zero_stage == 1,
                                  fmt::format("worker {} failed: {}", c.rank, why));
        if (next.ok() && announce(*next)) {
          event["generation"] = next->number;
          event["ranks"] = next->members.size();
          fault_event(event);
          recovering = Recovery{std::chrono::steady_clock::now(), monitor.last_step()};
          if (next->stop) {
            const int left = static_cast<int>(alive_workers().size());
            const int usable = fault::UsableReplicas(shape, left) * shape.t * shape.p;
            failure = fmt::format(
                "worker {} failed: {}; {} worker{} left{}, below --min-ranks {}: the job "
                "stopped{}",
                c.rank, why, left, left == 1 ? "" : "s",
                usable == left ? std::string()
                               : fmt::format(" (global batch {} splits over {} of them)",
                                             shape.global_batch, usable),
                shape.min_ranks,
                a.checkpoint_dir.empty() || next->members.empty()
                    ? " (no --checkpoint-dir: the steps since the start are lost)"
                    : " with a checkpoint of the state that survived (run the command again "
                      "to resume from it)");
            stopped_cleanly = true;
            elastic_open = false;
            return;  // the members save and exit; spares see the stop and exit
          }
          std::cerr << fmt::format(
              "kc train: worker {} failed: {}; generation {} goes on with {} rank{} (d={})\n",
              c.rank, why, next->number, next->members.size(), next->members.size() == 1 ? "" : "s",
              next->d);
          if (restarts_left > 0) {
            --restarts_left;
            ++pending_spawns;  // started after this poll round (children may grow)
          }
          return;
        }
      }
      fault_event(event);
    }
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
    if (g_stop_requested != 0 && !stop_passed_on) {  // a SIGTERM ended the poll
      stop_passed_on = true;
      std::cerr << "kc train: stopping on request (SIGTERM): every rank stops after the same "
                   "step"
                << (a.checkpoint_dir.empty() ? " (no --checkpoint-dir: nothing is saved)"
                                             : ", with a checkpoint of it")
                << "\n";
      for (Child& c : children) {
        if (!c.exited) kill(c.pid, SIGTERM);
      }
    }
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
        if (elastic_open) {  // its exit starts the next generation
          c.kill_reason = fmt::format(
              "sent no heartbeat for {:.1f} s (--heartbeat-timeout {} s): "
              "declared failed and killed",
              beats->silent_for(r).count(), a.heartbeat_timeout_s);
          kill(c.pid, SIGKILL);
          continue;
        }
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
    // Replacements: started after a failure; taken in once they are up.
    for (; pending_spawns > 0 && !failure; --pending_spawns) {
      const int id = static_cast<int>(children.size());
      Result<Child> c = Spawn(a, p, id, store, group, metrics_write, /*join=*/true);
      if (!c.ok()) {
        std::cerr << "kc train: warning: cannot start replacement worker " << id << ": "
                  << c.status().message() << "\n";
        continue;
      }
      children.push_back(*std::move(c));
      ++running;
      if (beats) beats->Watch(id, std::chrono::steady_clock::now());
      awaiting_ready.push_back(id);
      std::cerr << "kc train: started replacement worker " << id << "\n";
    }
    for (size_t i = 0; i < awaiting_ready.size() && elastic_open && !failure;) {
      const int id = awaiting_ready[i];
      const std::string keys[1] = {fault::ReadyKey(id)};
      Result<bool> ready = beat_client->Check(keys);
      if (children[static_cast<size_t>(id)].exited || (ready.ok() && *ready)) {
        awaiting_ready.erase(awaiting_ready.begin() + static_cast<std::ptrdiff_t>(i));
        if (children[static_cast<size_t>(id)].exited) continue;
        Result<fault::Generation> next =
            fault::NextGeneration(current, shape, alive_workers(), p.zero_stage == 1,
                                  fmt::format("worker {} joined", id));
        if (next.ok() && next->members.size() > current.members.size() && announce(*next)) {
          fault_event({{"event", "joined"},
                       {"worker", id},
                       {"generation", next->number},
                       {"ranks", next->members.size()}});
          recovering = Recovery{std::chrono::steady_clock::now(), monitor.last_step()};
          std::cerr << fmt::format(
              "kc train: worker {} joined: generation {} goes on with {} "
              "ranks (d={})\n",
              id, next->number, next->members.size(), next->d);
        }
        continue;
      }
      ++i;
    }
    if (kill_at && std::chrono::steady_clock::now() > *kill_at) {
      for (Child& c : children) {
        if (!c.exited) kill(c.pid, SIGKILL);
      }
      kill_at.reset();
    }
  }
  if (metrics_write >= 0) close(metrics_write);
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
    std::cerr << "kc train: " << *failure
              << (stopped_cleanly ? "\n" : "; the other ranks were stopped\n");
    return kExitFailure;
  }
  if (stop_passed_on) {
    const int64_t step = monitor.steps().empty() ? 0 : monitor.steps().back().step;
    metrics.close();
    std::cerr << fmt::format("kc train: stopped on request after step {} of {}{}\n", step, a.steps,
                             a.checkpoint_dir.empty()
                                 ? ""
                                 : fmt::format("; its checkpoint is in {}; the same command "
                                               "resumes from it",
                                               a.checkpoint_dir));
    return kExitStopped;
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
  // The peak MFU is measured against, now that the workers are done: one core's sgemm, or
  // one GPU's matrix product in the run's precision.
  Result<double> peak = p.cuda ? MeasureGpuFlops(p)
                               : hal::MeasureSgemmFlops({.n = 512, .threads = 1, .repetitions = 6});
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
  c->add_option("--device", a->device,
                "cpu, or cuda: each rank trains on one NVIDIA GPU (round robin over those "
                "visible), data-parallel plans only")
      ->capture_default_str();
  c->add_option("--precision", a->precision,
                "fp32, or bf16 (mixed precision with fp32 master weights; --device cuda)")
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
  c->add_option("--min-ranks", a->min_ranks,
                "Elastic: when ranks fail the survivors go on down to this many (default --ranks: "
                "a failure stops the job)");
  c->add_option("--max-restarts", a->max_restarts,
                "Elastic: replacement workers started for failed ones, to grow back")
      ->capture_default_str();
  c->add_option("--fault-log", a->fault_log,
                "Fault events, one JSON object a line (default: faults.jsonl beside the metrics)");
  c->add_flag("--elastic-join", a->elastic_join)->group("");        // internal: a replacement
  c->add_option("--worker-rank", a->worker_rank)->group("");        // internal: run as this rank
  c->add_option("--store", a->store)->group("");                    // internal
  c->add_option("--group", a->group)->group("");                    // internal
  c->add_option("--has-validation", a->has_validation)->group("");  // internal
  c->callback([action, a] { *action = [a] { return RunTrain(*a); }; });
}

}  // namespace kc::app
