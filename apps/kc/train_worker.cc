// A `kc train` worker process (--worker-rank): composes a fault::ElasticWorker from the flags the
// launcher passed (its device, store connections, engine and runner options), adds kc train's
// drills (--inject-fault), --export and --trace, and reports through its pipe to the launcher.
#include <fmt/format.h>
#include <malloc.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "apps/kc/command.h"
#include "apps/kc/train_hosts.h"
#include "apps/kc/train_output.h"
#include "apps/kc/train_setup.h"
#include "comm/collectives.h"
#include "comm/tcp_store.h"
#include "fault/elastic_worker.h"
#include "fault/local_launcher.h"
#include "hal/compute.h"
#include "hal/cuda/cuda_device.h"
#include "parallel/timeline.h"

namespace kc::app {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// SIGTERM asks the run to stop: the ranks stop after a step they all agree on, with a
// checkpoint of it. Lock-free, so the handler may set it.
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);
extern "C" void OnStopRequest(int) { g_stop_requested.store(true); }

Status WriteFile(const fs::path& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  out.close();
  if (!out) return InternalError("cannot write " + path.string());
  return OkStatus();
}

// What bench/train/compare_losses.py needs to run the same model in PyTorch: the model,
// the initial parameters and every step's global batch.
Status Export(const TrainArgs& a, const TrainSetup& p, parallel::Trainer& trainer) {
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

// --inject-fault: how this worker fails, when it is the one named.
class Drill {
 public:
  Drill(const TrainSetup& p, int worker) : p_(p), mine_(worker == p.fault_rank), worker_(worker) {}
  // Before step `next`: exit, kill or stop.
  void BeforeStep(int64_t next) const {
    if (!mine_ || next != p_.fault_step || p_.fault_how.starts_with("kill-in")) return;
    Say(next);
    if (p_.fault_how == "kill") raise(SIGKILL);
    if (p_.fault_how == "stop") raise(SIGSTOP);  // silent until killed
    _exit(86);
  }
  // Inside a step: the timeline tells when its forward starts or its backward ends.
  bool in_step() const {
    return p_.fault_how == "kill-in-forward" || p_.fault_how == "kill-in-allreduce";
  }
  void Arm(parallel::Timeline* timeline, fault::RunnerOptions* runner) const {
    if (!mine_) return;
    if (in_step()) {
      const char* at = p_.fault_how == "kill-in-forward" ? "data" : "backward";
      timeline->set_observer([this, at](const char* name, int64_t step) {
        if (step + 1 == p_.fault_step && std::strcmp(name, at) == 0) KillNow();
      });
    }
    if (p_.fault_how == "kill-in-persist") {
      runner->checkpoint.on_persist = [this](int64_t step) {
        if (step + 1 == p_.fault_step) KillNow();
      };
    }
  }

 private:
  void Say(int64_t next) const {
    std::cerr << "kc train: rank " << worker_ << ": injected fault before step " << next
              << " (--inject-fault, " << p_.fault_how << ")" << std::endl;
  }
  void KillNow() const {
    Say(p_.fault_step);
    raise(SIGKILL);
  }
  const TrainSetup& p_;
  const bool mine_;
  const int worker_;
};

}  // namespace

int RunTrainWorker(const TrainArgs& a, const TrainSetup& p) {
  const int worker = a.worker_rank;
  struct sigaction sa {};
  sa.sa_handler = OnStopRequest;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  auto fail = [&](const Status& s) {
    std::cerr << "kc train: rank " << worker << ": " << s << "\n";
    return kExitFailure;
  };
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
    Result<int> gpus = hal::cuda::CudaDeviceCount();
    if (!gpus.ok()) return fail(gpus.status());
    d.kind = hal::DeviceKind::kCuda;
    d.index_on_host = worker % *gpus;
    d.id = fmt::format("local/gpu{}", d.index_on_host);
    d.cpus.clear();
  }
  // Pinning is done: the launcher bound this process to its cores before exec, so every
  // thread (BLAS, communicator, the model's workers) is born on them.
  Result<std::unique_ptr<hal::ComputeDevice>> device =
      hal::OpenComputeDevice(d, {.threads = p.blas_threads});
  if (!device.ok()) return fail(device.status());

  const Duration timeout = SecondsToDuration(a.timeout_s);
  fault::ElasticWorkerOptions o;
  o.worker = worker;
  o.join = a.elastic_join;
  o.ranks = a.ranks;
  o.shape = ShapeOf(a, p);
  o.job = a.group;
  if (a.ranks > 1 || p.elastic) {
    std::string host;
    int port = 0;
    if (Status s = ParseHostPort(a.store, &host, &port); !s.ok()) return fail(s);
    o.connect = [host, port, timeout,
                 token = StoreToken(a)]() -> Result<std::unique_ptr<comm::Store>> {
      KC_ASSIGN_OR_RETURN(auto c,
                          comm::TcpStoreClient::Connect(host, port, Clock::Real()->Now() + timeout,
                                                        {.token = token}));
      return std::unique_ptr<comm::Store>(std::move(c));
    };
  }
  o.transport = p.transport;
  o.topology = p.topology;
  o.host = a.worker_host;
  if (!a.bind_address.empty()) o.bind_address = a.bind_address;
  // The admin's comm limits: this rank's communicators admit their operations through the
  // job's limit and send by its lanes.
  std::unique_ptr<comm::RateLimiter> limiter;
  if (p.rate_limit) {
    Result<std::unique_ptr<comm::RateLimiter>> l =
        comm::RateLimiter::Create(*p.rate_limit, Clock::Real());
    if (!l.ok()) {
      std::cerr << "kc train: rank " << worker << ": --comm-limits: " << l.status().message()
                << "\n";
      return kExitBadInput;
    }
    limiter = *std::move(l);
    o.rate_limiter = limiter.get();
  }
  o.lanes = p.lanes;
  o.timeout = timeout;
  o.heartbeat = {.period = fault::Seconds(a.heartbeat_period_s),
                 .timeout = fault::Seconds(a.heartbeat_timeout_s)};
  parallel::TrainerOptions& t = o.trainer;
  t.spec = p.spec;
  t.data = DataOptions(a, "train");
  if (p.validation) t.validation = DataOptions(a, "val");
  t.total_steps = a.steps;
  t.device = device->get();
  t.compute_threads = p.compute_threads;
  t.plan = p.ParallelPlanFor(a.ranks);  // its size and micro-batching are set per generation
  t.grad_sync = p.grad_sync;
  t.grad_wire = p.grad_wire;
  t.precision = p.precision;
  t.bucket_bytes = static_cast<int64_t>(a.bucket_mb * (1 << 20));
  o.runner = {.steps = a.steps,
              .checkpoint = {.dir = a.checkpoint_dir,
                             .keep = a.checkpoint_keep,
                             .compress = a.checkpoint_compress,
                             .full_every = a.checkpoint_full_every},
              .checkpoint_every = p.checkpoint_every,
              .mtbf_s = p.mtbf_s,
              .resume_from = a.resume != "auto" && a.resume != "never" ? a.resume : "",
              .model = fault::ModelFingerprint(p.spec)};
  if (!a.advice_file.empty()) {
    // The advice as the agent last wrote it; one that cannot be read keeps the last good.
    o.runner.advised_mtbf = [path = a.advice_file,
                             last = fault::RunnerOptions::AdvisedMtbf{}]() mutable {
      std::ifstream in(path);
      const Json j = Json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("mtbf_s") && j["mtbf_s"].is_number() &&
          j.contains("source") && j["source"].is_string()) {
        last = {.mtbf_s = j["mtbf_s"].get<double>(), .source = j["source"].get<std::string>()};
      }
      return last;
    };
  }
  o.memory_copy_every = p.memory_copy_every;
  o.eval_every = p.eval_every;
  o.eval_batches = p.validation ? a.eval_batches : 0;
  o.stop_requested = &g_stop_requested;
  fault::ReportPipe reports;  // to the launcher
  o.observer = &reports;

  const Drill drill(p, worker);
  std::unique_ptr<parallel::Timeline> timeline;  // the generation's, with --trace or a drill
  o.hooks.configure = [&](const fault::WorkerGeneration& g, parallel::TrainerOptions* to,
                          fault::RunnerOptions* ro) {
    if (p.topology != nullptr && g.rank == 0 && to->comm != nullptr) {
      // What the inventory's cost model chose for this generation's ranks (a lost host
      // changes them). On stdout: a worker's last line on stderr is why it failed.
      const std::string_view algorithm =
          comm::AlgorithmName(to->comm->ChooseAllreduce(to->bucket_bytes));
      std::cout << fmt::format(
                       "kc train: generation {}: a gradient bucket's all-reduce ({} bytes over {} "
                       "ranks) by {}, as inventory {}'s cost model advises\n",
                       g.generation->number, to->bucket_bytes, g.ranks, algorithm,
                       p.topology->name())
                << std::flush;
    }
    timeline.reset();
    if (!a.trace.empty() || drill.in_step()) {
      // About 60 spans a step (most are the backward's bucket hand-offs), reserved up front.
      timeline = std::make_unique<parallel::Timeline>(
          a.trace.empty()
              ? 4096
              : static_cast<size_t>(a.steps) * static_cast<size_t>(64 + 8 * p.micro_batches));
      to->timeline = timeline.get();
    }
    drill.Arm(timeline.get(), ro);
  };
  o.hooks.on_trainer = [&](const fault::WorkerGeneration& g, parallel::Trainer& trainer) {
    if (a.export_dir.empty() || g.rank != 0 || g.generation->number != 0) return OkStatus();
    return Export(a, p, trainer);
  };
  o.hooks.before_step = [&](int64_t next) {
    if (timeline != nullptr && a.trace.empty()) timeline->Clear();
    drill.BeforeStep(next);
  };

  fault::ElasticWorker elastic(o);
  Result<int> rank = elastic.Run();
  if (!rank.ok() && rank.status().code() == ErrorCode::kCancelled) {
    return kExitOk;  // stopped on request, as the launcher reports
  }
  if (!rank.ok()) return fail(rank.status());
  if (timeline != nullptr && !a.trace.empty() && *rank >= 0) {
    const std::string events = timeline->ChromeTraceEvents(*rank);
    if (Status s = WriteFile(TracePart(a.trace, *rank), events.data(), events.size()); !s.ok()) {
      return fail(s);
    }
  }
  return kExitOk;
}

}  // namespace kc::app
