// `kc train CONFIG`: checks the model, the data and the layout, then runs the training on this
// machine (no daemon): a fault::Supervisor starts one worker process per rank through a
// fault::LocalLauncher (this binary with --worker-rank: train_worker.cc) and reports what
// happens, which this launcher shows (progress, notices) and writes (metrics, fault log, the
// summary and the loss plot at the end). Flags and checks: train_setup.h; output:
// train_output.h; the runtime: docs/design/runtime.md.
#include "apps/kc/train_command.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
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
#include <thread>
#include <vector>

#include "api/train_job.h"
#include "apps/kc/train_follow.h"
#include "apps/kc/train_hosts.h"
#include "apps/kc/train_output.h"
#include "apps/kc/train_setup.h"
#include "base/clock.h"
#include "base/subprocess.h"
#include "comm/tcp_store.h"
#include "fault/local_launcher.h"
#include "fault/remote_launcher.h"
#include "fault/supervisor.h"
#include "hal/host_load.h"
#include "hal/measure.h"

namespace kc::app {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// The launcher's exit code when SIGTERM stopped the run short (128 + SIGTERM, as a shell
// reports a process SIGTERM ended).
constexpr int kExitStopped = 128 + SIGTERM;

// SIGTERM asks the run to stop. The handler (whichever thread takes the signal, BLAS's
// included) only wakes a thread of the launcher's through an eventfd; that thread passes the
// request to the supervisor.
std::atomic<int> g_stop_fd{-1};
extern "C" void OnStopSignal(int) {
  const uint64_t one = 1;
  if (write(g_stop_fd.load(), &one, sizeof one) < 0) {
    // The counter is full: a wake-up is pending anyway.
  }
}

class StopRequests {
 public:
  // `on_stop` runs on a thread of its own at each SIGTERM.
  explicit StopRequests(std::function<void()> on_stop) : fd_(eventfd(0, EFD_CLOEXEC)) {
    g_stop_fd.store(fd_);
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    thread_ = std::thread([this, on_stop = std::move(on_stop)] {
      for (uint64_t n = 0; read(fd_, &n, sizeof n) == sizeof n && !done_.load();) on_stop();
    });
  }
  ~StopRequests() {
    done_.store(true);
    const uint64_t one = 1;
    if (write(fd_, &one, sizeof one) < 0) {
      // Full: the thread is awake already.
    }
    thread_.join();
    signal(SIGTERM, SIG_DFL);
    g_stop_fd.store(-1);
    close(fd_);
  }

 private:
  const int fd_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

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
  Result<TrainSetup> plan = CheckTrainArgs(&a);
  if (!plan.ok()) {
    std::cerr << "kc train: " << plan.status().message() << "\n";
    return kExitBadInput;
  }
  plan->predicted_step_s = predicted_step_s;
  const TrainSetup& p = *plan;
  // Across hosts: the hosts given, or nothing (this machine runs every rank).
  std::vector<fault::RemoteHost> hosts;
  if (!a.hosts.empty()) {
    Result<std::vector<fault::RemoteHost>> h = ParseHostsFlag(a.hosts);
    Status checked = h.ok() ? CheckHostsArgs(a, *h) : h.status();
    if (checked.ok() && p.topology != nullptr) checked = CheckHostsInInventory(*p.topology, *h);
    if (!checked.ok()) {
      std::cerr << "kc train: " << checked.message() << "\n";
      return kExitBadInput;
    }
    hosts = *std::move(h);
  }
  if (hosts.empty() && !p.cuda && a.ranks * p.threads > static_cast<int>(p.cpus.size())) {
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
  int64_t done_at = -1;
  if (Status s = ResolveResume(&a, &done_at); !s.ok()) {
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
  // The launcher's cores' rates before any rank runs: kc diagnose --live compares them with
  // the rates then (a throttled core). About 10 ms a core, measured before the metrics file is
  // made, so that its header follows its creation at once; not for a CUDA run.
  std::optional<kc::v1::HostLoadReport> start;
  if (!p.cuda) {
    Result<hal::HostLoad> load = hal::MeasureHostLoad(
        {.roots = {getpid()}, .window = std::chrono::milliseconds(10), .max_rate_cores = 16});
    if (load.ok()) start = api::ToHostLoadReport(*load, hal::HostName(), 0);
  }
  std::ofstream metrics(metrics_path, std::ios::trunc);
  if (!metrics) {
    std::cerr << "kc train: cannot write " << metrics_path.string() << "\n";
    return kExitBadInput;
  }
  metrics << Json{{"type", "run"},
                  {"model", p.spec.name},
                  {"host", hal::HostName()},
                  {"pid", getpid()},
                  {"start", start ? Json::parse(api::ReportJson(*start)) : Json()},
                  {"config", a.config},
                  {"ranks", a.ranks},
                  {"threads_per_rank", p.threads},
                  {"steps", a.steps},
                  {"global_batch", p.global_batch},
                  {"micro_batches", p.micro_batches},
                  {"zero_stage", p.zero_stage},
                  {"memory_copy_every", p.memory_copy_every},
                  {"seq_len", p.spec.seq_len},
                  {"grad_sync", a.grad_sync},
                  {"grad_wire", a.grad_wire},
                  {"device", a.device},
                  {"precision", a.precision},
                  {"data", a.data},
                  {"plan", a.plan.empty() ? Json() : Json(a.plan)},
                  {"comm_limits", CommLimitsJson(p)},
                  {"predicted_step_s", p.predicted_step_s ? Json(*p.predicted_step_s) : Json()}}
                 .dump()
          << "\n"
          << std::flush;
  // The typed reports, for kc agent: appended, as a run's earlier attempts left them.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> reports(nullptr, &std::fclose);
  if (!a.reports.empty()) {
    reports.reset(std::fopen(a.reports.c_str(), "ab"));
    if (!reports) {
      std::cerr << "kc train: --reports " << a.reports << ": " << std::strerror(errno) << "\n";
      return kExitBadInput;
    }
    if (!AppendRunReport(reports.get(), a, p, start)) return kExitFailure;
  }
  if (done_at >= 0) {  // said by ResolveResume
    metrics << Json{{"type", "done"}, {"step", done_at}, {"checkpoint_step", done_at}}.dump()
            << "\n";
    if (reports && !AppendDoneReports(reports.get(), a.run_id, done_at)) return kExitFailure;
    return metrics ? kExitOk : kExitFailure;
  }

  // A worker that dies must not take the launcher with it when its pipe closes.
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<comm::TcpStoreServer> server;
  std::unique_ptr<comm::TcpStoreClient> store;        // the supervisor's connection
  std::unique_ptr<comm::TcpStoreClient> share_store;  // the remote launcher's
  std::string address;
  if (a.ranks > 1 || p.elastic || !hosts.empty()) {
    // On this machine only, where every host reaches it (--listen), or served elsewhere
    // (--rendezvous: kcd's for a cluster job).
    std::string bind = "127.0.0.1";
    int port = 0;
    if (!hosts.empty()) {
      Status parsed = a.rendezvous.empty() ? ParseListenFlag(a.listen, &bind, &port)
                                           : ParseHostPort(a.rendezvous, &bind, &port);
      if (!parsed.ok() || (!a.rendezvous.empty() && port == 0)) {
        std::cerr << "kc train: "
                  << (parsed.ok() ? "--rendezvous: no port" : std::string(parsed.message()))
                  << "\n";
        return kExitBadInput;
      }
    }
    // Its clients say its token first: the run file's or $KC_RENDEZVOUS_TOKEN; a store of
    // this machine alone gets one of its own. One other hosts reach without a token takes any
    // client, which is said.
    a.store_token = StoreToken(a);
    if (a.store_token.empty() && hosts.empty()) a.store_token = NewStoreToken();
    if (a.store_token.empty() && !a.listen.empty()) {
      std::cerr << fmt::format(
          "kc train: warning: the run's store on {} takes any client that reaches it: set "
          "${} to a secret on this machine and every host\n",
          a.listen, kStoreTokenVariable);
    }
    Result<std::unique_ptr<comm::TcpStoreServer>> s =
        a.rendezvous.empty() ? comm::TcpStoreServer::Start(
                                   {.bind_address = bind, .port = port, .token = a.store_token})
                             : Result<std::unique_ptr<comm::TcpStoreServer>>(nullptr);
    auto connect = [&]() -> Result<std::unique_ptr<comm::TcpStoreClient>> {
      if (!s.ok()) return s.status();
      return comm::TcpStoreClient::Connect(bind, *s != nullptr ? (*s)->port() : port,
                                           Clock::Real()->Now() + std::chrono::seconds(10),
                                           {.token = a.store_token});
    };
    Result<std::unique_ptr<comm::TcpStoreClient>> c = connect();
    Result<std::unique_ptr<comm::TcpStoreClient>> c2 =
        hosts.empty() ? Result<std::unique_ptr<comm::TcpStoreClient>>(nullptr) : connect();
    if (!c.ok() || !c2.ok()) {
      std::cerr << "kc train: rendezvous store" << (hosts.empty() ? "" : " (--listen)") << ": "
                << (c.ok() ? c2.status() : c.status()) << "\n";
      return hosts.empty() ? kExitFailure : kExitBadInput;
    }
    server = *std::move(s);
    store = *std::move(c);
    share_store = *std::move(c2);
    address = fmt::format("{}:{}", bind.find(':') == std::string::npos ? bind : "[" + bind + "]",
                          server != nullptr ? server->port() : port);
  }
  const std::string group = fmt::format("kc-train-{}", getpid());
  std::unique_ptr<fault::ProcessLauncher> launcher;
  std::unique_ptr<comm::Store> share_view;
  fault::RemoteLauncher* remote = nullptr;
  if (hosts.empty()) {
    Result<std::unique_ptr<fault::LocalLauncher>> local =
        fault::LocalLauncher::Create({.command = [&](const fault::RankLaunch& r) {
          return WorkerCommand(a, p, r, address, group);
        }});
    if (!local.ok()) {
      std::cerr << "kc train: " << local.status() << "\n";
      return kExitFailure;
    }
    launcher = *std::move(local);
  } else {
    share_view = comm::WithPrefix(share_store.get(), kSharePrefix);
    Result<std::unique_ptr<fault::RemoteLauncher>> r =
        fault::RemoteLauncher::Create({.store = share_view.get(),
                                       .hosts = hosts,
                                       .share_timeout = SecondsToDuration(a.host_timeout_s)});
    Status published = r.ok() ? PublishRun(*store, a, p, group, hosts) : r.status();
    if (!published.ok()) {
      std::cerr << "kc train: " << published << "\n";
      return kExitFailure;
    }
    remote = r->get();
    launcher = *std::move(r);
    std::vector<std::string> where;
    for (const fault::RemoteHost& h : hosts) {
      where.push_back(fmt::format("{} ({} rank{})", h.name, h.slots, h.slots == 1 ? "" : "s"));
    }
    std::cerr << fmt::format(
        "kc train: rendezvous at {} for hosts {}: on each host, run this command with --share "
        "HOST --rendezvous {} in place of --hosts and --listen\n",
        address, fmt::join(where, ", "), address);
  }
  const std::string mode =
      a.progress == "auto" ? (isatty(STDERR_FILENO) == 1 ? "bar" : "lines") : a.progress;
  TrainProgress progress(mode, a.steps);
  LauncherView view(
      a, &metrics,
      a.fault_log.empty() ? metrics_path.parent_path() / "faults.jsonl" : fs::path(a.fault_log),
      group, &progress, reports.get(), metrics_path.parent_path() / api::kInspectAnswerFile);
  Result<std::unique_ptr<fault::Supervisor>> supervisor =
      fault::Supervisor::Create({.ranks = a.ranks,
                                 .shape = ShapeOf(a, p),
                                 .zero_sharded = p.zero_stage == 1,
                                 .max_restarts = a.max_restarts,
                                 .heartbeat = {.period = fault::Seconds(a.heartbeat_period_s),
                                               .timeout = fault::Seconds(a.heartbeat_timeout_s),
                                               .first_beat = fault::Seconds(a.timeout_s)},
                                 .store = store.get(),
                                 .launcher = launcher.get(),
                                 .observer = &view});
  if (!supervisor.ok()) {
    std::cerr << "kc train: " << supervisor.status() << "\n";
    return kExitFailure;
  }
  Result<fault::RunOutcome> ran = InternalError("not run");
  {
    bool said = false;
    StopRequests stops([&] {
      if (!std::exchange(said, true)) {
        std::cerr << fmt::format(
            "kc train: stopping on request (SIGTERM): every rank stops after the same step{}\n",
            a.checkpoint_dir.empty() ? " (no --checkpoint-dir: nothing is saved)"
                                     : ", with a checkpoint of it");
      }
      (*supervisor)->RequestStop();
    });
    // Across hosts the hosts come with the size (kcd grew the run onto a host, or shrank it
    // off one): the launcher places ranks there from now on, and their shares may join.
    std::string hosts_now = a.hosts;
    auto follow_hosts = [&](const std::string& given) -> Status {
      if (remote == nullptr) return InvalidArgumentError("hosts for a run on one machine");
      if (given == hosts_now) return OkStatus();
      Result<std::vector<fault::RemoteHost>> h = ParseHostsFlag(given);
      if (h.ok() && p.topology != nullptr) {
        KC_RETURN_IF_ERROR(CheckHostsInInventory(*p.topology, *h));
      }
      if (!h.ok()) return h.status();
      KC_RETURN_IF_ERROR(remote->SetHosts(*h));
      KC_RETURN_IF_ERROR(PublishRun(*store, a, p, group, *h));
      std::cerr << fmt::format("kc train: the run's hosts are now {}\n", given);
      hosts_now = given;
      return OkStatus();
    };
    // Declared after follow_hosts, which its thread calls: it is destroyed first.
    std::optional<FileFollower> resizes;
    if (!a.resize_file.empty()) {
      resizes.emplace(a.resize_file,
                      "{\"ranks\": N} with N at least 1 (across hosts with \"hosts\": \"H:N,...\")",
                      ResizeParser([&](int ranks, const std::string& given) {
                        if (!given.empty()) {
                          if (Status s = follow_hosts(given); !s.ok()) {
                            std::cerr << fmt::format(
                                "kc train: warning: {}: hosts \"{}\": {}; the size stays\n",
                                a.resize_file, given, s.message());
                            return;
                          }
                        }
                        (*supervisor)->Resize(ranks);
                      }));
    }
    // kc diagnose --live (or kc agent for kcd's JobService.Inspect) asks where every rank is.
    const fs::path inspect = metrics_path.parent_path() / api::kInspectRequestFile;
    fs::remove(inspect, ec);  // a request of an earlier run here is not this run's
    FileFollower inspects(inspect.string(), "{\"request\": N} with N at least 1",
                          InspectParser([&](int64_t n) { (*supervisor)->Inspect(n); }));
    ran = (*supervisor)->Run();
  }
  if (!ran.ok()) {
    std::cerr << "kc train: " << ran.status() << "\n";
    return kExitFailure;
  }
  const fault::RunOutcome& outcome = *ran;
  progress.Finish();
  if (remote != nullptr) remote->Finish();  // every host's share ends
  launcher.reset();
  store.reset();
  if (server != nullptr) server->Stop();

  if (outcome.end == fault::RunOutcome::End::kFailed ||
      outcome.end == fault::RunOutcome::End::kBelowMinimum) {
    for (int r = 0; r < a.ranks && !a.trace.empty(); ++r) fs::remove(TracePart(a.trace, r), ec);
    metrics.flush();
    std::cerr << "kc train: " << DescribeFailure(a, p, outcome) << "\n";
    return kExitFailure;
  }
  if (outcome.end == fault::RunOutcome::End::kStopped) {
    metrics.close();
    std::cerr << fmt::format(
        "kc train: stopped on request after step {} of {}{}\n", progress.last_step(), a.steps,
        a.checkpoint_dir.empty() ? ""
                                 : fmt::format("; its checkpoint is in {}; the same command "
                                               "resumes from it",
                                               a.checkpoint_dir));
    return kExitStopped;
  }
  // A resumed run takes the steps after its checkpoint's.
  const int64_t expected = a.steps - std::max<int64_t>(0, progress.resumed_from());
  if (const int64_t got = static_cast<int64_t>(progress.steps().size()); got != expected) {
    // Across hosts, what rank 0 reported just before its host was lost may be lost with it
    // (on its way through that host's share): the survivors went on from the state they held,
    // and only the record of those steps is missing.
    const bool lost_with_host = !hosts.empty() && !view.recoveries().empty() && got < expected &&
                                !progress.steps().empty() &&
                                progress.steps().back().step == a.steps;
    if (!lost_with_host) {
      std::cerr << "kc train: rank 0 reported " << got << " of " << expected << " steps\n";
      return kExitFailure;
    }
    std::cerr << fmt::format(
        "kc train: the reports of {} step{} were lost with the host of rank 0 (the metrics leave "
        "them out; training went on from the survivors' state)\n",
        expected - got, expected - got == 1 ? "" : "s");
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
  PrintSummary(a, p, progress, outcome.faults, view.recoveries(), peak.ok() ? *peak : 0,
               metrics_path, plot_path, &summary);
  metrics << summary.dump() << "\n";
  metrics.close();
  if (reports && !AppendSummaryReport(reports.get(), a.run_id, summary)) return kExitFailure;
  std::ofstream plot(plot_path, std::ios::trunc);
  plot << LossCurveSvg(fmt::format("{}: {} rank{}, global batch {}", p.spec.name, a.ranks,
                                   a.ranks == 1 ? "" : "s", p.global_batch),
                       progress.steps(), progress.val());
  plot.close();
  if (!metrics || !plot) {
    std::cerr << "kc train: cannot write " << metrics_path.string() << " or " << plot_path.string()
              << "\n";
    return kExitFailure;
  }
  return kExitOk;
}

int RunTrain(TrainArgs a) {
  if (a.config.empty() && a.job_file.empty()) {
    std::cerr << "kc train: expected a model file (kc train MODEL.yaml) or --job RUN_FILE\n";
    return kExitBadInput;
  }
  if (Status s = ApplyTrainRun(&a); !s.ok()) {
    std::cerr << "kc train: " << s.message() << "\n";
    return kExitBadInput;
  }
  if (!a.share.empty()) return RunHostShare(a);
  if (a.worker_rank >= 0) {
    Result<TrainSetup> setup = CheckTrainArgs(&a);
    if (!setup.ok()) {
      std::cerr << "kc train: rank " << a.worker_rank << ": " << setup.status().message() << "\n";
      return kExitBadInput;
    }
    return RunTrainWorker(a, *setup);
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
  c->add_option("config", a->config,
                "Model file (YAML), e.g. examples/models/gpt-tiny.yaml (or --job)");
  c->add_option("--job", a->job_file,
                "A run file (kc.v1.TrainRun) kc agent writes for a job it runs: the job as "
                "submitted and this run's assignment (model, size, plan, steps, global batch, "
                "elasticity, checkpoint policy, heartbeats, comm limits), instead of those flags");
  c->add_option("--reports", a->reports,
                "Append the run's typed reports here (kc.v1.TrainReport, length-delimited: "
                "steps, checkpoints, faults), for kc agent to follow");
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
  c->add_option("--grad-wire", a->grad_wire,
                "What the gradients' all-reduces send between ranks: fp32, or bf16 (half the "
                "bytes of the ring, additions in fp32; for links slower than the ranks' compute, "
                "docs/user-guide/comm.md)")
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
  c->add_option("--comm-limits", a->comm_limits,
                "The admin's comm limits file: every rank's communicator is rate limited by its "
                "entry for the model's name (or its default) and sends by its lanes (kc agent "
                "passes the job's)");
  c->add_option("--advice-file", a->advice_file,
                "With --checkpoint-every auto, instead of --mtbf: a JSON file {\"mtbf_s\": S, "
                "\"source\": WHO} read again at each re-estimate (kc agent keeps it current with "
                "the scheduler's advice)");
  c->add_option("--checkpoint-keep", a->checkpoint_keep, "Checkpoints kept (the newest)")
      ->capture_default_str();
  c->add_flag("--checkpoint-compress", a->checkpoint_compress, "Compress chunks with zstd");
  c->add_option("--checkpoint-full-every", a->checkpoint_full_every,
                "Every Nth checkpoint stores whole chunks; those between store each changed chunk "
                "as a delta against the previous checkpoint's (1: every checkpoint whole)")
      ->capture_default_str();
  c->add_option("--memory-copy-every", a->memory_copy_every,
                "Steps between in-memory copies of each rank's state on a rank of another host, "
                "which bring back a stage or tensor-parallel rank whose every replica was lost "
                "without reading a checkpoint; 0: none; auto: every 10 steps in an elastic run "
                "with t x p > 1 (docs/user-guide/elastic.md)")
      ->capture_default_str();
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
  c->add_option("--max-ranks", a->max_ranks,
                "Elastic: the most ranks the run grows to when asked (--resize-file); default "
                "--ranks");
  c->add_option("--resize-file", a->resize_file,
                "Elastic: a JSON file {\"ranks\": N} the run follows, growing or shrinking to N "
                "within [--min-ranks, --max-ranks] (kc agent keeps it current with the "
                "scheduler's decisions)");
  c->add_option("--fault-log", a->fault_log,
                "Fault events, one JSON object a line (default: faults.jsonl beside the metrics)");
  c->add_option("--hosts", a->hosts,
                "Run across hosts: HOST:RANKS,... (in placement order); this launcher serves "
                "the run's store on --listen and each host runs its share (--share)");
  c->add_option("--listen", a->listen,
                "With --hosts: ADDR[:PORT] of this machine where the hosts reach the run's store");
  c->add_option("--share", a->share,
                "Serve host HOST's ranks of a run across hosts (with the launcher's flags and "
                "--rendezvous)");
  c->add_option("--rendezvous", a->rendezvous,
                "With --share: ADDR:PORT of the launcher's store (what it printed)");
  c->add_option("--host-timeout", a->host_timeout_s,
                "With --hosts: seconds a host's share may be silent before its ranks are taken "
                "for lost (and a share cut off that long kills its ranks)")
      ->capture_default_str();
  c->add_option("--inventory", a->inventory,
                "With --hosts or --share: the cluster's inventory (hosts named as in --hosts; "
                "docs/user-guide/inventory.md): each rank takes a device of its host's, and the "
                "collectives choose ring, tree or hierarchical by its cost model, as kc topo "
                "report advises")
      ->check(CLI::ExistingFile);
  c->add_option("--worker-host", a->worker_host)->group("");        // internal: the rank's host
  c->add_option("--bind-address", a->bind_address)->group("");      // internal: its TCP address
  c->add_flag("--elastic-join", a->elastic_join)->group("");        // internal: a replacement
  c->add_option("--worker-rank", a->worker_rank)->group("");        // internal: run as this rank
  c->add_option("--store", a->store)->group("");                    // internal
  c->add_option("--group", a->group)->group("");                    // internal
  c->add_option("--has-validation", a->has_validation)->group("");  // internal
  c->callback([action, a, c] {
    // What a run file sets, given as well: refused (ApplyTrainRun).
    a->job_flags_given.clear();
    if (!a->config.empty()) a->job_flags_given.push_back("the model file");
    for (const RunFileFlag& flag : kRunFileFlags) {
      const std::string name(flag.name);
      if (c->count(name) > 0) a->job_flags_given.push_back(name);
    }
    *action = [a] { return RunTrain(*a); };
  });
}

}  // namespace kc::app
