#include "api/dispatcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "api/internal/digest.h"
#include "api/internal/sqlite.h"
#include "api/job_spec.h"
#include "api/metrics.h"
#include "api/permissions.h"
#include "api/rpc_guard.h"
#include "api/train_job.h"
#include "base/file.h"
#include "base/log.h"
#include "base/mutex.h"
#include "comm/comm_limits_config.h"
#include "comm/tcp_store.h"
#include "fault/restart_policy.h"
#include "hal/inventory.h"
#include "hal/topology.h"
#include "parallel/engine_support.h"
#include "parallel/model_spec.h"
#include "parallel/plan.h"
#include "parallel/planner/approval.h"
#include "parallel/planner/cluster.h"
#include "parallel/planner/search.h"
#include "sched/scheduler.h"

namespace kc::api {
namespace {

namespace fs = std::filesystem;
using internal::WallSeconds;

// Runs: one start of a job on an agent. Recorded so that a restarted kcd knows which devices
// its predecessor's jobs still hold.
constexpr char kSchema[] = R"(
CREATE TABLE IF NOT EXISTS runs (
  run INTEGER PRIMARY KEY,
  job INTEGER NOT NULL,
  host TEXT NOT NULL,
  devices TEXT NOT NULL,
  started_s REAL NOT NULL,
  ended INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS requeues (
  job INTEGER NOT NULL,
  time_s REAL NOT NULL,
  reason TEXT NOT NULL,
  not_before_s REAL NOT NULL DEFAULT 0
);
)";

// kc train's exit status for input it refused before training (kExitBadInput): a new run would
// refuse it again.
constexpr int kTrainBadInput = 2;

// The longest a run token may live however long the job may run: when it expires, the job's
// next execution-time check stops it (with a checkpoint), and a resume mints another.
constexpr double kMaxRunTokenS = 90 * 86400.0;
// The most an agent's stop grace delays the requeue of its runs when it falls silent.
constexpr double kMaxAgentStopGraceS = 600;

// A run's id in its reports (RunAssignment.run_id).
std::string RunId(int64_t job, int64_t run) { return fmt::format("job-{}-run-{}", job, run); }

// A job's ranks on one host.
struct Run {
  int64_t run = 0;
  int64_t job = 0;
  std::string sched_id;  // its submission to the scheduler; "" when adopted
  bool adopted = false;  // left running by a previous kcd: the scheduler does not know it
  std::string host;
  std::vector<int> devices;     // indices into the topology
  double started_s = 0;         // when the order went out
  double running_since_s = -1;  // when the agent reported it up
  double prior_running_s = 0;   // the job's running time in earlier runs
  bool stopping = false;
  int ranks = 0;         // its generation's size, as its fault events last said
  double shrunk_s = -1;  // when the scheduler last shrank it (-1: never)
  // checkpoint_every: auto: its job's class, and the advice last sent (mtbf, interruptions).
  bool auto_interval = false;
  std::string job_class;
  double advised_mtbf_s = -1;
  int64_t advised_interruptions = -1;
  int64_t checkpoint_step = 0;
  std::string token_hash;  // its run token's (TokenStore::Revoke), revoked when it ends
  // A run across hosts: `host` is the supervisor agent running its launcher; these hosts run
  // its ranks (their devices), and its store is kcd's (stopped when the run ends). A host the
  // run was shrunk off keeps its share, with no devices, until the run ends.
  std::map<std::string, std::vector<int>> shares;
  std::shared_ptr<comm::TcpStoreServer> store;
  std::set<std::string> shares_down;  // hosts whose share ended or whose agent was lost
  // The start order of its shares (devices aside), for a host it grows onto; none when adopted.
  std::optional<kc::v1::StartOrder> share_order;
  bool command = false;  // a command job's: no supervisor to inspect
};

struct Agent {
  bool registered = false;
  bool supervisor = false;  // runs launchers of runs across hosts, no ranks
  double last_seen_s = 0;
  double stop_grace_s = 0;  // the agent's: how long its runs take to stop once it fences them
  std::vector<kc::v1::StartOrder> starts;
  std::vector<kc::v1::StopOrder> stops;
  std::vector<kc::v1::ResizeOrder> resizes;
  std::vector<kc::v1::InspectOrder> inspects;
};

std::string DevicesText(const std::vector<int>& devices) {
  return fmt::format("{}", fmt::join(devices, ","));
}

std::vector<int> ParseDevices(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    int device = -1;
    std::from_chars(text.data() + at, text.data() + comma, device);
    out.push_back(device);  // -1 if the database was changed: the run is then not adopted
    at = comma + 1;
  }
  return out;
}

// The seconds job `id` has spent running, from its history.
double RunningSeconds(const std::vector<JobEvent>& history) {
  double total = 0, since = -1;
  for (const JobEvent& e : history) {
    if (e.phase == JobPhase::kRunning) {
      if (since < 0) since = e.time_s;
    } else if (since >= 0) {
      total += e.time_s - since;
      since = -1;
    }
  }
  return total;
}

// `text` (a scheduler's reason) with its ids of kcd's jobs ("job-12.3": kcd's job 12, its
// third submission to the scheduler) as users know them ("12").
std::string KcdJobIds(std::string_view text) {
  auto digits_from = [&](size_t i) {
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    return i;
  };
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = text.find("job-", at)) != std::string_view::npos;) {
    const size_t id_end = digits_from(hit + 4);
    const size_t end = id_end > hit + 4 && id_end < text.size() && text[id_end] == '.'
                           ? digits_from(id_end + 1)
                           : id_end;
    const bool scheduler_id = end > id_end + 1;
    out.append(text.substr(at, hit - at));
    out.append(scheduler_id ? text.substr(hit + 4, id_end - hit - 4) : text.substr(hit, 4));
    at = scheduler_id ? end : hit + 4;
  }
  out.append(text.substr(at));
  return out;
}

// The cluster of DIR's files: its topology (none without topology.yaml) and a scheduler over it
// with DIR/pools.yaml's pools (one pool of every device without it), and topology.yaml's text
// as the topology was built from it.
Status LoadCluster(const fs::path& dir, std::unique_ptr<hal::Topology>* topology,
                   std::unique_ptr<sched::Scheduler>* scheduler, std::string* inventory) {
  if (!fs::exists(dir / "topology.yaml")) return OkStatus();
  const std::string path = (dir / "topology.yaml").string();
  KC_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  KC_ASSIGN_OR_RETURN(hal::TopologySpec spec, hal::LoadInventoryString(text, path));
  KC_ASSIGN_OR_RETURN(hal::Topology built, hal::Topology::Build(std::move(spec)));
  auto topo = std::make_unique<hal::Topology>(std::move(built));
  sched::PoolConfig pools = sched::AllDevicesPoolConfig();
  if (fs::exists(dir / "pools.yaml")) {
    KC_ASSIGN_OR_RETURN(pools, sched::LoadPoolConfig((dir / "pools.yaml").string()));
  }
  KC_ASSIGN_OR_RETURN(std::unique_ptr<sched::Scheduler> sched,
                      sched::Scheduler::Create(topo.get(), pools, {}));
  *scheduler = std::move(sched);
  *topology = std::move(topo);
  *inventory = std::move(text);
  return OkStatus();
}

}  // namespace

struct Dispatcher::Impl {
  DispatcherOptions o;
  std::unique_ptr<hal::Topology> topology;  // null: no topology yet
  // topology.yaml's text as `topology` was built from it: sent with every run across hosts,
  // whose ranks choose their collectives by it (an edit that does not load is not sent).
  std::string inventory;
  std::unique_ptr<sched::Scheduler> scheduler;
  std::vector<std::vector<int>> host_devices;   // per host index: its devices, in order
  parallel::planner::ApprovalLimits limits;     // zeros: none; replaced only under mu
  std::optional<comm::CommLimits> comm_limits;  // DIR/comm-limits.yaml, when there is one

  Mutex mu;
  CondVar wake;
  bool stopped KC_GUARDED_BY(mu) = false;
  bool woken KC_GUARDED_BY(mu) = false;
  internal::Database db KC_GUARDED_BY(mu);
  std::map<std::string, Agent> agents KC_GUARDED_BY(mu);        // by host name
  std::map<int64_t, Run> runs KC_GUARDED_BY(mu);                // by job id: its live run
  int64_t inspections KC_GUARDED_BY(mu) = 0;                    // JobService.Inspect requests made
  std::map<int64_t, std::string> queued KC_GUARDED_BY(mu);      // job id -> scheduler id, pending
  std::map<std::string, int64_t> sched_jobs KC_GUARDED_BY(mu);  // scheduler id -> job id
  std::vector<sched::Decision> deferred KC_GUARDED_BY(mu);      // starts waiting for victims
  LatencyHistogram pass_seconds;                                // its passes, for the metrics
  // Jobs requeued after a failed run: not placed again before this wall time (the backoff).
  std::map<int64_t, double> not_before KC_GUARDED_BY(mu);
  // DIR/topology.yaml and DIR/pools.yaml as the scheduler was last built from them.
  std::pair<std::pair<bool, fs::file_time_type>, std::pair<bool, fs::file_time_type>> config_applied
      KC_GUARDED_BY(mu);
  // DIR/plan-approval.yaml as `limits` last read it: whether it existed, and its mtime.
  bool limits_file KC_GUARDED_BY(mu) = false;
  fs::file_time_type limits_mtime KC_GUARDED_BY(mu){};
  // Per queued job: the pending reason last written to the store, and when.
  std::map<int64_t, std::pair<std::string, double>> shown_reasons KC_GUARDED_BY(mu);
  std::vector<char> up KC_GUARDED_BY(mu);  // per device: up in the scheduler
  // Jobs across hosts waiting for a supervisor agent or a store address (logged once each).
  std::set<int64_t> waiting_across KC_GUARDED_BY(mu);
  int64_t submissions KC_GUARDED_BY(mu) = 0;
  std::thread thread;

  void Audit(std::string_view principal, std::string_view action, std::string_view resource,
             std::string_view outcome, std::string_view reason) {
    AuditNow(o.audit, principal, action, resource, outcome, reason).IgnoreError();  // logged
  }

  // Moves job `id` to `to`, auditing the change; a transition the lifecycle refuses (the job
  // moved on meanwhile) is logged and ignored.
  void Move(int64_t id, JobPhase to, const std::string& scheduler_reason) {
    const std::string reason = KcdJobIds(scheduler_reason);
    Result<JobRecord> r = o.jobs->Transition(id, to, reason, WallSeconds());
    if (!r.ok()) {
      KC_LOG(INFO) << "dispatcher: job " << id << ": " << r.status().message();
      return;
    }
    Audit("kcd", fmt::format("job.{}", JobPhaseName(to)), fmt::format("job/{}", id), "ok", reason);
  }

  std::optional<int> HostIndex(std::string_view host) const {
    if (topology == nullptr) return std::nullopt;
    for (size_t h = 0; h < topology->hosts().size(); ++h) {
      if (topology->hosts()[h].name == host) return static_cast<int>(h);
    }
    return std::nullopt;
  }

  // Tells the scheduler which devices are up: a registered agent's, except those a run
  // adopted from a previous kcd still holds (the scheduler does not know them).
  void RefreshDevices(double now) KC_REQUIRES(mu) {
    if (topology == nullptr) return;
    std::vector<char> want(topology->num_devices(), 0);
    for (size_t h = 0; h < host_devices.size(); ++h) {
      auto a = agents.find(topology->hosts()[h].name);
      if (a == agents.end() || !a->second.registered) continue;
      for (int d : host_devices[h]) want[d] = 1;
    }
    for (const auto& [job, run] : runs) {
      if (run.adopted) {
        for (int d : run.devices) want[d] = 0;
      }
    }
    std::vector<int> down, back;
    for (int d = 0; d < topology->num_devices(); ++d) {
      if (want[d] == up[d]) continue;
      (want[d] ? back : down).push_back(d);
      up[d] = want[d];
    }
    if (!down.empty()) scheduler->DevicesDown(down, now).IgnoreError();  // indices are valid
    if (!back.empty()) scheduler->DevicesUp(back, now).IgnoreError();
  }

  // A run is over: forget it, record it as ended, and revoke its token (its processes may
  // still be stopping: they need no more checks).
  void EndRun(int64_t job) KC_REQUIRES(mu) {
    auto it = runs.find(job);
    if (it == runs.end()) return;
    if (!it->second.token_hash.empty()) {
      if (Status s = o.tokens->Revoke(it->second.token_hash); !s.ok()) {
        KC_LOG(WARNING) << "dispatcher: job " << job << ": " << s.message();
      }
    }
    Result<internal::Statement> st = db.Prepare("UPDATE runs SET ended = 1 WHERE run = ?");
    if (st.ok()) {
      st->Bind(1, it->second.run);
      if (st->Step() != SQLITE_DONE) KC_LOG(WARNING) << db.Error("cannot end a run").message();
    }
    // A run across hosts: its shares end with its launcher (an end order through the store);
    // a stop makes sure of it (a launcher that died sends none), and its store goes.
    for (const auto& [host, devices] : it->second.shares) {
      kc::v1::StopOrder stop;
      stop.set_job(job);
      stop.set_run(it->second.run);
      stop.set_reason("the run is over");
      agents[host].stops.push_back(std::move(stop));
    }
    if (it->second.store != nullptr) it->second.store->Stop();
    runs.erase(it);
  }

  // Orders the agent running `run` to stop it.
  void OrderStop(Run& run, const std::string& reason) KC_REQUIRES(mu) {
    if (run.stopping) return;
    run.stopping = true;
    kc::v1::StopOrder stop;
    stop.set_job(run.job);
    stop.set_run(run.run);
    stop.set_reason(reason);
    agents[run.host].stops.push_back(std::move(stop));
  }

  // Whether kcd has no record of the run `r` reports; one still running is then stopped.
  bool StopIfUnknown(Agent& a, const kc::v1::AgentJobReport& r) KC_REQUIRES(mu) {
    auto it = runs.find(r.job());
    if (it != runs.end() && it->second.run == r.run()) return false;
    if (r.state() == kc::v1::AgentJobReport::STATE_RUNNING) {
      kc::v1::StopOrder stop;
      stop.set_job(r.job());
      stop.set_run(r.run());
      stop.set_reason("kcd has no record of this run");
      a.stops.push_back(std::move(stop));
    }
    return true;
  }

  // Where a run runs, for people: its host, or a run across hosts' hosts and its launcher's.
  static std::string HostsOf(const Run& run) {
    if (run.shares.empty()) return run.host;
    std::vector<std::string> names;
    for (const auto& [name, devices] : run.shares) {
      if (!devices.empty()) names.push_back(name);
    }
    return fmt::format("{} (launcher on {})", fmt::join(names, ", "), run.host);
  }

  // A report of a share of a run across hosts (from `host`'s agent): its output goes to the
  // job's log; its end is noted (the launcher finds the host silent and goes on without it);
  // a denial at its execution-time check stops the whole run. Whether the run ended.
  bool ShareReport(Run& run, const std::string& host, const kc::v1::AgentJobReport& r, double now)
      KC_REQUIRES(mu) {
    if (run.shares.count(host) == 0) return false;  // not one of its hosts: nothing to do
    switch (r.state()) {
      case kc::v1::AgentJobReport::STATE_EXITED:
      case kc::v1::AgentJobReport::STATE_FAILED_TO_START:
      case kc::v1::AgentJobReport::STATE_FENCED:
        run.shares_down.insert(host);  // a grow onto this host starts another
        if (r.exit_code() != 0 || r.state() != kc::v1::AgentJobReport::STATE_EXITED) {
          o.jobs
              ->Note(run.job,
                     fmt::format("its share on {} ended ({}): {}", host,
                                 r.state() == kc::v1::AgentJobReport::STATE_FENCED
                                     ? std::string("fenced")
                                     : fmt::format("code {}", r.exit_code()),
                                 r.reason()),
                     now)
              .IgnoreError();
        }
        return false;
      case kc::v1::AgentJobReport::STATE_REVOKED: {
        Audit("kcd", "job.execution_check", fmt::format("job/{}", run.job), "denied",
              fmt::format("on {}: {}", host, r.reason()));
        if (run.stopping) return false;
        const int64_t job = run.job;
        Release(job, now);
        EndRun(job);  // its shares stop; its launcher, reporting a run kcd forgot, too
        Move(job, JobPhase::kPaused,
             fmt::format("stopped at its execution-time check on {}: {}", host, r.reason()));
        return true;
      }
      default:
        return false;
    }
  }

  // The scheduler is done with the job's current submission.
  void Release(int64_t job, double now) KC_REQUIRES(mu) {
    std::string id;
    if (auto q = queued.find(job); q != queued.end()) {
      id = q->second;
      queued.erase(q);
    } else if (auto r = runs.find(job); r != runs.end()) {
      id = r->second.sched_id;
    }
    shown_reasons.erase(job);
    if (id.empty()) return;
    scheduler->Finished(id, now).IgnoreError();  // the id is the scheduler's own
    sched_jobs.erase(id);
  }

  // The job's run is gone with its processes (its agent was lost or restarted): the job
  // waits in the queue again and resumes from its last checkpoint when it starts.
  void Requeue(int64_t job, const std::string& reason, double now) KC_REQUIRES(mu) {
    Release(job, now);
    EndRun(job);
    Move(job, JobPhase::kQueued, reason);
  }

  // How often job `job` was requeued after a failed run.
  int RestartsDone(int64_t job) KC_REQUIRES(mu) {
    Result<internal::Statement> st = db.Prepare("SELECT COUNT(*) FROM requeues WHERE job = ?");
    if (!st.ok()) return 0;
    st->Bind(1, job);
    return st->Step() == SQLITE_ROW ? static_cast<int>(st->Int(0)) : 0;
  }

  // Job `job`'s run ended badly (`what`; `permanent`: its input was refused, a new run would
  // meet it again): requeued to resume from its newest good checkpoint after the backoff of
  // its restart policy (fault::DecideRestart), or failed past max_restarts. Its run is over.
  void RequeueOrFail(int64_t job, bool permanent, const std::string& what, double now)
      KC_REQUIRES(mu) {
    fault::RestartPolicy policy;
    if (Result<JobRecord> j = o.jobs->Get(job); j.ok()) {
      if (Result<JobSpec> spec = ReadStoredJob(j->spec, "spec"); spec.ok()) {
        policy.max_restarts = spec->max_restarts;
        policy.backoff = std::chrono::duration_cast<Duration>(
            std::chrono::duration<double>(spec->restart_backoff_s));
        policy.max_backoff = std::max(policy.max_backoff, policy.backoff);
      }
    }
    fault::RunOutcome outcome{.end = fault::RunOutcome::End::kFailed};
    if (permanent) {
      outcome.error = InvalidArgumentError(what);
    } else {
      outcome.cause = fault::FaultEvent{.reason = what};
    }
    const fault::RestartDecision d = fault::DecideRestart(policy, outcome, RestartsDone(job));
    if (!d.requeue) {
      Move(job, JobPhase::kFailed, d.reason);
      return;
    }
    const double not_before_s = now + std::chrono::duration<double>(d.delay).count();
    Result<internal::Statement> st =
        db.Prepare("INSERT INTO requeues (job, time_s, reason, not_before_s) VALUES (?,?,?,?)");
    if (st.ok()) {
      st->Bind(1, job);
      st->Bind(2, now);
      st->Bind(3, d.reason);
      st->Bind(4, not_before_s);
      if (st->Step() != SQLITE_DONE)
        KC_LOG(WARNING) << db.Error("cannot record a requeue").message();
    }
    not_before[job] = not_before_s;
    Move(job, JobPhase::kQueued, d.reason);
  }

  // The fault layer's event `e` of job `job`'s run: a loss, and the size the run went on at
  // (it shrank after a loss, or grew as a replacement joined), into the job's history.
  void NoteFault(Run& run, const kc::v1::FaultReport& e, double now) KC_REQUIRES(mu) {
    const std::string& event = e.event();
    std::string note;
    if (event == "detected") {
      note = fmt::format("worker {} failed: {}", e.worker(), e.reason());
    } else if (event == "recovered") {
      const int ranks = e.ranks();
      const char* how = ranks < run.ranks   ? "shrank to"
                        : ranks > run.ranks ? "grew to"
                                            : "went on at";
      note = fmt::format("{} {} rank{} (generation {}), restored from {} at step {}", how, ranks,
                         ranks == 1 ? "" : "s", e.generation(),
                         e.source().empty() ? "?" : e.source(), e.step());
      run.ranks = ranks;
    } else if (event == "joined") {
      note = fmt::format("worker {} joined: {} ranks from generation {}", e.worker(), e.ranks(),
                         e.generation());
    } else {
      return;
    }
    o.jobs->Note(run.job, note, now).IgnoreError();  // ended meanwhile: nothing to note
  }

  // The name a job's comm limits entry matches: "TEAM/NAME".
  static std::string CommName(const JobRecord& j) { return j.team + "/" + j.name; }

  // The scheduler's checkpoint advice for `run`'s job (checkpoint_every: auto): the mean time
  // between interruptions of jobs of its pool and class, when it changed since it was last
  // sent (by 5%, or by an interruption), recorded as sent; nullopt when unchanged, or when the
  // scheduler has none.
  std::optional<kc::v1::CheckpointAdvice> NewAdvice(Run& run) KC_REQUIRES(mu) {
    if (!run.auto_interval || run.stopping || run.sched_id.empty()) return std::nullopt;
    Result<sched::JobStatus> st = scheduler->Query(run.sched_id);
    if (!st.ok()) return std::nullopt;
    const std::string& pool = st->run_pool.empty() ? st->pool : st->run_pool;
    Result<sched::CheckpointAdvice> a = scheduler->Advice(
        pool, sched::JobClassFromName(run.job_class).value_or(sched::JobClass::kNormal),
        st->borrowed, /*cost_s=*/0);  // the run measures its own cost
    if (!a.ok()) return std::nullopt;
    if (a->interruptions == run.advised_interruptions &&
        std::abs(a->mtbi_s - run.advised_mtbf_s) <= 0.05 * run.advised_mtbf_s) {
      return std::nullopt;
    }
    run.advised_mtbf_s = a->mtbi_s;
    run.advised_interruptions = a->interruptions;
    kc::v1::CheckpointAdvice out;
    out.set_job(run.job);
    out.set_run(run.run);
    out.set_mtbf_s(a->mtbi_s);
    out.set_source(fmt::format(
        "kcd's scheduler: pool {}, class {}{}: {} interruption{} in {:.2f} h of running", pool,
        run.job_class, st->borrowed ? " on borrowed devices" : "", a->interruptions,
        a->interruptions == 1 ? "" : "s", a->exposure_s / 3600));
    return out;
  }

  // The second of the three permission checks: may the owner still use devices? Work its
  // owner submitted before its tokens were revoked does not start with a fresh run token.
  Status ScheduleCheck(const JobRecord& j) {
    std::optional<Principal> owner = o.roles->PrincipalFor(j.owner);
    if (!owner) {
      return PermissionDeniedError(fmt::format("{} is no longer a user of this cluster", j.owner));
    }
    KC_ASSIGN_OR_RETURN(const double revoked_s, o.tokens->RevokedAt(j.owner));
    if (revoked_s >= j.submitted_s) {
      return PermissionDeniedError(
          fmt::format("{}'s tokens were revoked after this job was submitted; it does not "
                      "start again (submit it anew)",
                      j.owner));
    }
    CheckResult r =
        Check(*owner, Action::kDeviceUse, {.kind = "device", .owner = j.owner, .team = j.team});
    if (!r.allowed) return PermissionDeniedError(r.reason);
    return OkStatus();
  }

  // The plan for job `j` on its devices, with its estimates, checked against the approval
  // limits: the one its job file gives (checked at submission), or the planner's (data-parallel,
  // within what the engine runs: parallel::EngineSearchConstraints).
  PlanRecord PlanJob(const JobRecord& j, const JobSpec& spec) const {
    namespace pl = parallel::planner;
    PlanRecord rec{.job = j.id};
    Result<parallel::ModelSpec> model = parallel::LoadModelSpecFromString(spec.model_yaml, "model");
    Result<pl::PlannerCluster> cluster = pl::ClusterFromTopology(*topology);
    if (!model.ok() || !cluster.ok()) {
      rec.summary = fmt::format("not planned: {}",
                                (model.ok() ? cluster.status() : model.status()).message());
      return rec;
    }
    cluster->spec.devices = spec.ranks;
    cluster->spec.devices_per_node = std::min(cluster->spec.devices_per_node, spec.ranks);
    pl::SearchConstraints c = parallel::EngineSearchConstraints(hal::DeviceKind::kCpu);
    // Calibrated on whole layers of data-parallel steps, as kc plan on real devices.
    c.fixed_t = 1;
    c.max_p = 1;
    c.allow_recompute = false;
    // An elastic job's survivors go on from their own state: with ZeRO-1 a lost rank's part of
    // the optimizer state would have to come from a checkpoint.
    if (spec.min_devices > 0) c.max_zero_stage = 0;
    const int64_t batch =
        spec.global_batch > 0 ? spec.global_batch : model->batch_per_rank * spec.ranks;
    pl::RankedPlan best;
    if (!spec.plan.empty()) {
      Result<parallel::ParallelPlan> given = parallel::ParsePlanFlag(spec.plan);
      Result<pl::PlanEstimate> e = given.ok()
                                       ? pl::EstimatePlan(*model, *given, cluster->spec,
                                                          given->global_batch(), cluster->options)
                                       : Result<pl::PlanEstimate>(given.status());
      if (!e.ok()) {
        rec.summary =
            fmt::format("the job file's plan cannot be estimated: {}", e.status().message());
        return rec;
      }
      best = {.plan = *given, .estimate = *e};
    } else {
      Result<pl::SearchResult> found =
          pl::SearchPlans(*model, cluster->spec, batch, c, cluster->options, 1);
      if (!found.ok() || found->ranked.empty()) {
        rec.summary =
            fmt::format("no plan found: {}", found.ok() ? "none fits" : found.status().message());
        return rec;
      }
      best = found->ranked.front();
    }
    const pl::ApprovalVerdict v = pl::CheckApproval(best.plan, best.estimate, spec.steps, limits);
    rec.plan_yaml = parallel::PlanToYaml(best.plan);
    rec.summary = fmt::format(
        "{}{} devices; {:.3f} s a step predicted ({:.2f} h for {} steps); {:.2f} GB per device; "
        "{:.3f} GB sent a step",
        spec.plan.empty() ? "" : "the job file's plan; ", v.devices, best.estimate.step_time_s,
        v.runtime_s / 3600, v.steps, v.memory_bytes_per_device / 1e9, v.comm_bytes_per_step / 1e9);
    rec.approval_required = v.required;
    rec.reasons = v.reasons;
    return rec;
  }

  // A command job against the approval limits it can be held to: its devices and its expected
  // hours (the memory and traffic limits need a model's plan).
  PlanRecord CommandJobRecord(const JobRecord& j, const JobSpec& spec) const {
    PlanRecord rec{.job = j.id};
    const double hours = spec.expected_hours;
    rec.summary = fmt::format("a command job: {} devices, {:.2f} h expected (no model to plan)",
                              spec.ranks, hours);
    if (limits.max_devices > 0 && spec.ranks > limits.max_devices) {
      rec.reasons.push_back(
          fmt::format("{} devices, above the limit of {}", spec.ranks, limits.max_devices));
    }
    if (limits.max_runtime_s > 0 && hours * 3600 > limits.max_runtime_s) {
      rec.reasons.push_back(
          fmt::format("{:.2f} h expected (expected_hours), above the limit of "
                      "{:.2f} h",
                      hours, limits.max_runtime_s / 3600));
    }
    rec.approval_required = !rec.reasons.empty();
    return rec;
  }

  // Run `run` of job `j` on `devices`: with the plan kcd decided (and a resource admin
  // approved, if it had to) when the job file gave none, so that every rank runs it. An
  // elastic job started below its max_devices runs that plan at its size: d for its devices,
  // the same global batch (every size of its runs keeps it), its micro-batching refitted;
  // where that does not fit, kc train's data-parallel layout of the global batch, uneven
  // shares and all. `what` says which, for the audit log.
  kc::v1::RunAssignment AssignmentFor(const JobRecord& j, const JobSpec& spec, int64_t run,
                                      const std::vector<int>& devices, std::string* what) const {
    kc::v1::RunAssignment a;
    a.set_job(j.id);
    a.set_run_id(RunId(j.id, run));
    for (size_t i = 0; i < devices.size(); ++i) {
      kc::v1::RunAssignment::Rank* r = a.add_ranks();
      r->set_rank(static_cast<int>(i));
      r->set_worker(static_cast<int>(i));
      r->set_host(topology->device(devices[i]).host);
      r->set_device(topology->device(devices[i]).id);
    }
    const int n = static_cast<int>(devices.size());
    if (!spec.command.empty()) {
      *what = fmt::format("command on {} rank{}", n, n == 1 ? "" : "s");
      return a;
    }
    Result<parallel::ModelSpec> model = parallel::LoadModelSpecFromString(spec.model_yaml, "model");
    parallel::PlanKeys stated{.micro_batch_size = true, .micro_batches = true};
    Result<parallel::ParallelPlan> plan = NotFoundError("no plan");
    if (!spec.plan.empty()) {
      plan = parallel::ParsePlanFlag(spec.plan, &stated);
    } else if (o.plans != nullptr) {
      Result<PlanRecord> rec = o.plans->Get(j.id);
      if (rec.ok() && !rec->plan_yaml.empty()) {
        plan = parallel::LoadPlanFromString(rec->plan_yaml, fmt::format("job {} plan", j.id));
      }
    }
    // The global batch of every size, as kc train reads a plan at max_devices: the job's, or
    // the plan's when it states its micro-batch size, else the model's per rank.
    int64_t global = spec.global_batch;
    if (global == 0 && model.ok()) {
      global = plan.ok() && stated.micro_batch_size ? plan->global_batch()
                                                    : model->batch_per_rank * int64_t{spec.ranks};
    }
    std::optional<parallel::ParallelPlan> at_n;
    if (plan.ok() && model.ok() && n % (plan->t * plan->p) == 0) {
      parallel::ParallelPlan p = *plan;
      p.d = n / (plan->t * plan->p);
      // At max_devices the job's own micro-batching; at another size it is refitted.
      p = parallel::FillBatchDefaults(
          p, n == spec.ranks ? stated : parallel::PlanKeys{.micro_batches = true}, global);
      // One the engine runs on these devices, as every rank will ask before it builds.
      if (parallel::ValidatePlan(p, *model, n, global).ok() &&
          parallel::EngineSupports(p, topology->device(devices.front()).kind).ok()) {
        at_n = p;
      }
    }
    if (at_n) *a.mutable_plan() = ToTrainPlan(*at_n);
    a.set_global_batch(global);
    *what = at_n ? "plan " + parallel::PlanToString(*at_n)
                 : fmt::format("data parallel over {} rank{}", n, n == 1 ? "" : "s");
    a.set_checkpoint_every(spec.checkpoint_every);
    a.set_checkpoint_reason(spec.checkpoint_auto        ? "advised by kcd's scheduler"
                            : spec.checkpoint_every > 0 ? "the job's checkpoint_every"
                                                        : "after the last step only");
    if (comm_limits) {
      // The admin's limits as they apply to this job: its entry (or the default) and the lanes.
      *a.mutable_comm_limits() = ToCommLimits(comm_limits->ForJob(CommName(j)), comm_limits->lanes);
    }
    return a;
  }

  // The pool the roles file gives team `team` (its `pool:` key), when the scheduler has a
  // pool of that name that takes `job_class` and the team; "" (level 1 chooses) otherwise.
  std::string TeamPool(const std::string& team, sched::JobClass job_class) const {
    if (o.roles == nullptr || scheduler == nullptr) return "";
    for (const TeamSpec& t : o.roles->teams) {
      if (t.name != team || t.pool.empty()) continue;
      for (const sched::Pool& p : scheduler->pools()) {
        const auto& teams = p.spec.teams;
        if (p.spec.name == t.pool &&
            std::find(p.spec.classes.begin(), p.spec.classes.end(), job_class) !=
                p.spec.classes.end() &&
            (teams.empty() || std::find(teams.begin(), teams.end(), team) != teams.end())) {
          return t.pool;
        }
      }
    }
    return "";
  }

  // The CUDA ordinals on their host of `devices` that are GPUs, comma-separated in the order
  // given: a GPU's ordinal is its place among its host's GPUs (index_on_host order). "" when
  // none is a GPU.
  std::string CudaVisibleDevices(const std::vector<int>& devices) const {
    std::vector<std::string> ordinals;
    for (int dev : devices) {
      const hal::DeviceDescriptor& d = topology->device(dev);
      if (d.kind != hal::DeviceKind::kCuda) continue;
      int ordinal = 0;
      for (int other : host_devices[topology->host_of(dev)]) {
        const hal::DeviceDescriptor& peer = topology->device(other);
        ordinal += peer.kind == hal::DeviceKind::kCuda && peer.index_on_host < d.index_on_host;
      }
      ordinals.push_back(std::to_string(ordinal));
    }
    return fmt::format("{}", fmt::join(ordinals, ","));
  }

  // Hands job `j` (pending, or queued without a scheduler submission) to the scheduler.
  void Admit(const JobRecord& j, double now) KC_REQUIRES(mu) {
    const std::string where = fmt::format("job/{}", j.id);
    if (Status s = ScheduleCheck(j); !s.ok()) {
      Audit("kcd", "job.schedule", where, "denied", s.message());
      Move(j.id, JobPhase::kFailed, fmt::format("refused at scheduling: {}", s.message()));
      return;
    }
    if (scheduler == nullptr) return;  // waits: there are no devices (no topology) yet
    Result<JobSpec> spec = ReadStoredJob(j.spec, fmt::format("job {} spec", j.id));
    if (!spec.ok()) {
      Move(j.id, JobPhase::kFailed, fmt::format("cannot run: {}", spec.status().message()));
      return;
    }
    // A job's ranks share one host when one holds them (shared memory between all of them).
    // An elastic train job runs at any size in [min_devices, max_devices] a host has free,
    // and the scheduler grows and shrinks it there; a command job with min_devices starts at
    // any size in that range and keeps it (its program's world size is fixed while it runs),
    // without it at its size. A job larger than every host runs across hosts (a launcher on a
    // supervisor agent, a share on each host: kc train's, or kc run's for a command job).
    const bool ranged = spec->min_devices > 0;
    const int min = ranged ? spec->min_devices : spec->ranks;
    const size_t largest = LargestHost();
    const bool across = static_cast<size_t>(spec->ranks) > largest;
    if (static_cast<size_t>(min) > largest && !across) {
      Move(j.id, JobPhase::kFailed,
           fmt::format("cannot run: its {} ranks run on one host, and the largest host of the "
                       "cluster has {} devices",
                       min, largest));
      return;
    }
    // Its plan's tensor and pipeline groups are whole at every size.
    int group = 1;
    if (!spec->plan.empty()) {
      if (Result<parallel::ParallelPlan> p = parallel::ParsePlanFlag(spec->plan); p.ok()) {
        group = p->t * p->p;
      }
    }
    if (j.phase == JobPhase::kPending && o.plans != nullptr) {
      // The planner's plan (a command job: its devices and hours, there being no model to
      // plan); past the approval limits the job waits for a resource admin.
      const PlanRecord plan =
          spec->command.empty() ? PlanJob(j, *spec) : CommandJobRecord(j, *spec);
      if (Status s = o.plans->Put(plan); !s.ok()) KC_LOG(WARNING) << s.message();
      if (plan.approval_required) {
        Move(j.id, JobPhase::kApprovalRequired,
             fmt::format("approval required: {}", fmt::join(plan.reasons, "; ")));
        return;
      }
    }
    const std::string id = fmt::format("job-{}.{}", j.id, ++submissions);
    const sched::JobClass job_class =
        sched::JobClassFromName(spec->job_class).value_or(sched::JobClass::kNormal);
    sched::JobRequest req{.id = id,
                          .team = j.team,
                          .user = j.owner,
                          .job_class = job_class,
                          .min_devices = min,
                          .max_devices = spec->ranks,
                          // Its tensor- and pipeline-parallel groups inside a host; the scheduler
                          // refuses a group that does not divide.
                          .tp = ranged || across ? group : spec->ranks,
                          .one_host = !across,
                          .resizable = spec->command.empty(),
                          .pool = TeamPool(j.team, job_class),
                          .duration_s = spec->expected_hours * 3600};
    if (Status s = scheduler->Submit(req, now); !s.ok()) {
      Move(j.id, JobPhase::kFailed, fmt::format("the scheduler refused it: {}", s.message()));
      return;
    }
    queued[j.id] = id;
    sched_jobs[id] = j.id;
    if (j.phase == JobPhase::kPending) {
      Move(j.id, JobPhase::kQueued,
           min == spec->ranks ? fmt::format("queued for {} devices", spec->ranks)
                              : fmt::format("queued for {} to {} devices", min, spec->ranks));
    }
  }

  // Whether the scheduler's job `victim` still holds devices a start waits for: its run has
  // not stopped, or has not yet gone on at the size it was shrunk to (its fault events say the
  // size). A run that has not shrunk within kShrinkWaitS is waited for no longer (logged).
  bool Holding(const std::string& victim, double now) KC_REQUIRES(mu) {
    constexpr double kShrinkWaitS = 60;
    auto v = sched_jobs.find(victim);
    if (v == sched_jobs.end()) return false;
    auto r = runs.find(v->second);
    if (r == runs.end()) return false;
    const Run& run = r->second;
    if (run.shrunk_s < 0) return true;  // preempted: until it stopped
    if (run.ranks <= static_cast<int>(run.devices.size())) return false;
    if (now - run.shrunk_s < kShrinkWaitS) return true;
    KC_LOG(WARNING) << "dispatcher: job " << run.job << " did not shrink to " << run.devices.size()
                    << " devices within " << kShrinkWaitS << " s; starting what waited for them";
    return false;
  }

  // The scheduler's grow or shrink of a running elastic job: the order to its agent, and a
  // note in its history. The run's fault events then say the size it went on at.
  void Resize(const sched::Decision& d, double now) KC_REQUIRES(mu) {
    auto sj = sched_jobs.find(d.job);
    if (sj == sched_jobs.end()) return;
    auto r = runs.find(sj->second);
    if (r == runs.end() || r->second.stopping || d.devices.empty()) return;
    Run& run = r->second;
    if (!run.shares.empty()) return ResizeAcross(run, d);
    const int h = topology->host_of(d.devices.front());
    const bool elsewhere = std::any_of(d.devices.begin(), d.devices.end(), [&](int dev) {
      return topology->hosts()[topology->host_of(dev)].name != run.host;
    });
    if (elsewhere) {
      KC_LOG(WARNING) << "dispatcher: job " << run.job << ": a " << DecisionKindName(d.kind)
                      << " onto another host is not carried out: " << DevicesText(d.devices);
      return;
    }
    const int before = static_cast<int>(run.devices.size());
    run.devices = d.devices;
    if (d.kind == sched::DecisionKind::kShrink) run.shrunk_s = now;
    RecordDevices(run);
    kc::v1::ResizeOrder order;
    order.set_job(run.job);
    order.set_run(run.run);
    const auto& mine = host_devices[h];
    for (int dev : d.devices) {
      order.add_devices(static_cast<int>(std::find(mine.begin(), mine.end(), dev) - mine.begin()));
    }
    order.set_reason(d.reason);
    agents[run.host].resizes.push_back(std::move(order));
    const std::string what =
        KcdJobIds(fmt::format("the scheduler {} it from {} to {} devices: {}",
                              d.kind == sched::DecisionKind::kShrink ? "shrinks" : "grows", before,
                              d.devices.size(), d.reason));
    Audit("kcd", "job.resize", fmt::format("job/{}", run.job), "ok", what);
    o.jobs->Note(run.job, what, WallSeconds()).IgnoreError();
  }

  // The grow or shrink of a run across hosts: its launcher's agent is told every host's
  // devices from now on (kc train places ranks there and retires those a host has no place
  // for), and a host new to the run, or whose share is gone, gets a share start.
  void ResizeAcross(Run& run, const sched::Decision& d) KC_REQUIRES(mu) {
    std::map<std::string, std::vector<int>> next;
    std::vector<std::string> order;  // placement order: the decision's
    for (int dev : d.devices) {
      const std::string& name = topology->hosts()[topology->host_of(dev)].name;
      if (next.count(name) == 0) order.push_back(name);
      next[name].push_back(dev);
    }
    std::vector<std::string> started;
    for (const std::string& name : order) {
      auto had = run.shares.find(name);
      if (had != run.shares.end() && run.shares_down.count(name) == 0) continue;  // it runs
      if (!run.share_order) {
        KC_LOG(WARNING) << "dispatcher: job " << run.job << ": a " << DecisionKindName(d.kind)
                        << " onto " << name << " is not carried out: kcd restarted since the run "
                        << "started and no longer has its share order";
        return;
      }
      kc::v1::StartOrder share = *run.share_order;
      LocalDevices(next[name], &share);
      agents[name].starts.push_back(std::move(share));
      run.shares_down.erase(name);
      started.push_back(name);
    }
    const int before = static_cast<int>(run.devices.size());
    for (auto& [name, devices] : run.shares) devices.clear();
    for (const auto& [name, devices] : next) run.shares[name] = devices;
    run.devices = d.devices;
    if (d.kind == sched::DecisionKind::kShrink) run.shrunk_s = WallSeconds();
    RecordDevices(run);
    kc::v1::ResizeOrder resize;
    resize.set_job(run.job);
    resize.set_run(run.run);
    resize.set_reason(d.reason);
    std::vector<std::string> where;
    for (const std::string& name : order) {
      kc::v1::ResizeOrder::Host* h = resize.add_hosts();
      h->set_name(name);
      h->set_devices(static_cast<int>(next[name].size()));
      where.push_back(fmt::format("{}:{}", name, next[name].size()));
    }
    agents[run.host].resizes.push_back(std::move(resize));
    const std::string what = KcdJobIds(fmt::format(
        "the scheduler {} it from {} to {} devices ({}{}): {}",
        d.kind == sched::DecisionKind::kShrink ? "shrinks" : "grows", before, d.devices.size(),
        fmt::join(where, ", "),
        started.empty() ? "" : fmt::format("; a share starts on {}", fmt::join(started, ", ")),
        d.reason));
    Audit("kcd", "job.resize", fmt::format("job/{}", run.job), "ok", what);
    o.jobs->Note(run.job, what, WallSeconds()).IgnoreError();
  }

  // The run's devices in its record (a restarted kcd adopts it with them).
  void RecordDevices(const Run& run) KC_REQUIRES(mu) {
    if (Result<internal::Statement> st = db.Prepare("UPDATE runs SET devices = ? WHERE run = ?");
        st.ok()) {
      st->Bind(1, DevicesText(run.devices));
      st->Bind(2, run.run);
      if (st->Step() != SQLITE_DONE)
        KC_LOG(WARNING) << db.Error("cannot record a resize").message();
    }
  }

  // The devices of the largest host: a job with more ranks runs across hosts.
  size_t LargestHost() const KC_REQUIRES(mu) {
    size_t largest = 0;
    for (const std::vector<int>& on_host : host_devices)
      largest = std::max(largest, on_host.size());
    return largest;
  }

  // A start order's devices: their indices on their host, and CUDA_VISIBLE_DEVICES of them.
  void LocalDevices(const std::vector<int>& devices, kc::v1::StartOrder* out) const
      KC_REQUIRES(mu) {
    out->clear_devices();
    for (int dev : devices) {
      const auto& mine = host_devices[topology->host_of(dev)];
      out->add_devices(static_cast<int>(std::find(mine.begin(), mine.end(), dev) - mine.begin()));
    }
    out->set_cuda_visible_devices(CudaVisibleDevices(devices));
  }

  // A start decision: the order to the agent of the devices' host.
  void Start(const sched::Decision& d, double now) KC_REQUIRES(mu) {
    auto sj = sched_jobs.find(d.job);
    if (sj == sched_jobs.end()) return;
    const int64_t job = sj->second;
    Result<JobRecord> j = o.jobs->Get(job);
    if (!j.ok() || j->phase != JobPhase::kQueued || d.devices.empty()) {
      scheduler->Finished(d.job, now).IgnoreError();
      sched_jobs.erase(sj);
      queued.erase(job);
      return;
    }
    // Checked again as it starts: its owner's tokens may have been revoked while it queued.
    if (Status s = ScheduleCheck(*j); !s.ok()) {
      Audit("kcd", "job.schedule", fmt::format("job/{}", job), "denied", s.message());
      Release(job, now);
      Move(job, JobPhase::kFailed, fmt::format("refused at its start: {}", s.message()));
      return;
    }
    // Across hosts: the launcher goes to a supervisor agent, and the run's store is kcd's. So
    // too for an elastic train job larger than every host that starts on one: it may grow
    // onto others.
    std::map<std::string, std::vector<int>> shares;
    for (int dev : d.devices) shares[topology->hosts()[topology->host_of(dev)].name].push_back(dev);
    Result<JobSpec> spec = ReadStoredJob(j->spec, "spec");
    const size_t largest = LargestHost();
    std::string supervisor;
    for (const auto& [name, agent] : agents) {
      if (agent.registered && agent.supervisor) supervisor = name;
    }
    // (It waits for a supervisor agent as any job across hosts does: the scheduler, which may
    // grow it across hosts, does not know it runs on one.)
    const bool may_span = spec.ok() && spec->command.empty() && spec->min_devices > 0 &&
                          static_cast<size_t>(spec->ranks) > largest;
    if (shares.size() > 1 || may_span) {
      if (supervisor.empty() || o.store_address.empty()) {
        const std::string why =
            supervisor.empty()
                ? "it spans hosts: waits for a supervisor agent (kc agent --supervisor)"
                : "it spans hosts: kcd serves no stores (its --listen is not an address the "
                  "hosts reach)";
        if (waiting_across.insert(job).second) {
          KC_LOG(WARNING) << "dispatcher: job " << job << ": " << why;
        }
        // Back to the scheduler in a while; queued meanwhile, saying why.
        Release(job, now);
        not_before[job] = now + 5;
        o.jobs->SetReason(job, why, WallSeconds()).IgnoreError();  // ended meanwhile: nothing
        return;
      }
      waiting_across.erase(job);
    } else {
      shares.clear();
    }
    const int h = topology->host_of(d.devices.front());
    const std::string host = shares.empty() ? topology->hosts()[h].name : supervisor;
    std::shared_ptr<comm::TcpStoreServer> store;
    std::string store_token;  // its clients say it first: the store is reachable by every host
    if (!shares.empty()) {
      store_token = internal::RandomHex(32);
      Result<std::unique_ptr<comm::TcpStoreServer>> started = comm::TcpStoreServer::Start(
          {.bind_address = o.store_address, .port = 0, .token = store_token});
      if (!started.ok()) {
        KC_LOG(WARNING) << "dispatcher: job " << job
                        << ": cannot serve its store: " << started.status().message();
        return;
      }
      store = *std::move(started);
    }
    Result<std::vector<JobEvent>> history = o.jobs->History(job);
    // The owner's run token for the execution-time checks, valid for the job's runtime and a
    // day (at most kMaxRunTokenS), revoked when the run ends.
    const double ttl =
        std::min((spec.ok() ? spec->expected_hours * 3600 : 0) + 86400, kMaxRunTokenS);
    Result<IssuedToken> token = o.tokens->Issue(j->owner, ttl, WallSeconds(), TokenKind::kRun);
    Result<internal::Statement> st = db.Prepare(
        "INSERT INTO runs (job, host, devices, started_s, token_hash) VALUES (?,?,?,?,?)");
    if (!token.ok() || !st.ok()) {
      KC_LOG(WARNING) << "dispatcher: job " << job << ": cannot start: "
                      << (token.ok() ? st.status() : token.status()).message();
      return;
    }
    st->Bind(1, job);
    st->Bind(2, host);
    st->Bind(3, DevicesText(d.devices));
    st->Bind(4, now);
    st->Bind(5, token->hash);
    if (st->Step() != SQLITE_DONE) {
      KC_LOG(WARNING) << db.Error("cannot record a run").message();
      o.tokens->Revoke(token->hash).IgnoreError();  // never handed out
      return;
    }
    Run run{.run = sqlite3_last_insert_rowid(db.handle()),
            .job = job,
            .sched_id = d.job,
            .host = host,
            .devices = d.devices,
            .started_s = now,
            .prior_running_s = history.ok() ? RunningSeconds(*history) : 0,
            .ranks = static_cast<int>(d.devices.size()),
            .token_hash = token->hash,
            .shares = shares,
            .store = store};
    if (spec.ok() && spec->checkpoint_auto) {
      run.auto_interval = true;
      run.job_class = spec->job_class;
    }
    run.command = spec.ok() && !spec->command.empty();
    queued.erase(job);
    if (runs.count(job) != 0) EndRun(job);  // a preempted run not yet reported stopped
    kc::v1::StartOrder order;
    if (std::optional<kc::v1::CheckpointAdvice> advice = NewAdvice(run)) {
      *order.mutable_advice() = *std::move(advice);
    }
    order.set_job(job);
    order.set_run(run.run);
    order.set_restart(RestartsDone(job));
    order.set_cuda_visible_devices(CudaVisibleDevices(d.devices));
    std::string layout;
    if (Result<kc::v1::TrainJob> stored = ReadStoredTrainJob(j->spec, fmt::format("job {}", job));
        stored.ok() && spec.ok()) {
      *order.mutable_train_job() = *std::move(stored);  // as submitted
      *order.mutable_assignment() = AssignmentFor(*j, *spec, run.run, d.devices, &layout);
      if (store != nullptr) {
        order.mutable_assignment()->set_rendezvous(
            fmt::format("{}:{}", o.store_address, store->port()));
        order.mutable_assignment()->set_rendezvous_token(store_token);
        // Every rank chooses its collectives by the cluster's cost model for its hosts.
        order.mutable_assignment()->set_inventory(inventory);
      }
    }
    order.set_token(token->token);
    order.set_owner(j->owner);
    order.set_team(j->team);
    if (shares.empty()) {
      LocalDevices(d.devices, &order);
    } else {
      run.share_order = order;
      run.share_order->set_role(kc::v1::StartOrder::ROLE_SHARE);
      for (const auto& [name, devices] : shares) {
        kc::v1::StartOrder share = *run.share_order;
        LocalDevices(devices, &share);
        agents[name].starts.push_back(std::move(share));
      }
      order.set_role(kc::v1::StartOrder::ROLE_SUPERVISOR);
      order.clear_devices();
      order.clear_cuda_visible_devices();
    }
    agents[host].starts.push_back(std::move(order));
    std::vector<std::string> where;
    for (const auto& [name, devices] : shares) {
      where.push_back(fmt::format("{} devices {}", name, DevicesText(devices)));
    }
    Audit("kcd", "job.start", fmt::format("job/{}", job), "ok",
          shares.empty() ? fmt::format("run {} on {} devices {} ({}): {}", run.run, host,
                                       DevicesText(d.devices), layout, d.reason)
                         : fmt::format("run {} across {} (launcher on {}, store {}:{}) ({}): {}",
                                       run.run, fmt::join(where, ", "), host, o.store_address,
                                       store->port(), layout, d.reason));
    runs[job] = std::move(run);
  }

  // One pass: lost agents, new jobs, jobs stopped in the store, the scheduler's decisions,
  // runtimes used up.
  // Applies DIR/plan-approval.yaml live: the jobs admitted from this pass on are planned
  // against the file as it is now (none: no limits). Jobs already queued or running are not
  // affected. A file that does not load keeps the limits in force, logged once per change.
  void RefreshLimits() KC_REQUIRES(mu) {
    const fs::path file = fs::path(o.dir) / "plan-approval.yaml";
    std::error_code ec;
    const bool exists = fs::exists(file, ec);
    const fs::file_time_type mtime = exists ? fs::last_write_time(file, ec) : fs::file_time_type{};
    if (ec || (exists == limits_file && mtime == limits_mtime)) return;
    limits_file = exists;
    limits_mtime = mtime;
    if (!exists) {
      limits = {};
      KC_LOG(INFO) << "dispatcher: " << file.string() << " removed: no approval limits";
      return;
    }
    Result<parallel::planner::ApprovalLimits> l =
        parallel::planner::LoadApprovalLimits(file.string());
    if (!l.ok()) {
      KC_LOG(WARNING) << "dispatcher: approval limits unchanged: " << l.status().message();
      return;
    }
    limits = *l;
    KC_LOG(INFO) << "dispatcher: approval limits from " << file.string() << " apply now";
  }

  // Whether DIR/topology.yaml and DIR/pools.yaml exist, and their mtimes.
  using ConfigStamp = std::pair<bool, fs::file_time_type>;
  std::pair<ConfigStamp, ConfigStamp> ConfigStamps() const {
    auto stamp = [&](const char* name) {
      const fs::path file = fs::path(o.dir) / name;
      std::error_code ec;
      const bool exists = fs::exists(file, ec);
      return ConfigStamp{exists, exists ? fs::last_write_time(file, ec) : fs::file_time_type{}};
    };
    return {stamp("topology.yaml"), stamp("pools.yaml")};
  }

  // host_devices for the topology.
  void IndexHosts() KC_REQUIRES(mu) {
    host_devices.clear();
    if (topology == nullptr) return;
    host_devices.resize(topology->hosts().size());
    for (int d = 0; d < topology->num_devices(); ++d) {
      host_devices[topology->host_of(d)].push_back(d);
    }
  }

  // Applies DIR/topology.yaml and DIR/pools.yaml live, when either changed (a system admin's
  // TopologyService.Put or PoolService.Put, or an edit): the scheduler is rebuilt for them as a
  // start of kcd builds it. Running jobs are not stopped: each keeps its devices until it ends,
  // as a restart of kcd adopts it (the scheduler places around them), and one whose devices
  // left the topology, or whose pool no longer takes it, is flagged in its history and the
  // audit log. Queued jobs go to the new scheduler. Files that do not load keep what is in
  // force, logged once per change.
  void RefreshConfig(double now) KC_REQUIRES(mu) {
    const std::pair<ConfigStamp, ConfigStamp> stamps = ConfigStamps();
    if (stamps == config_applied) return;
    config_applied = stamps;
    std::unique_ptr<hal::Topology> topo;
    std::unique_ptr<sched::Scheduler> sched;
    std::string text;
    if (Status s = LoadCluster(fs::path(o.dir), &topo, &sched, &text); !s.ok() || topo == nullptr) {
      const std::string why = s.ok() ? "no topology.yaml" : std::string(s.message());
      KC_LOG(WARNING) << "dispatcher: topology and pools unchanged: " << why;
      Audit("kcd", "cluster.apply", "cluster", "failed", why);
      return;
    }
    // The running jobs' devices in the new topology, by their ids.
    std::map<std::string, int> index;
    for (int d = 0; d < topo->num_devices(); ++d) index[topo->device(d).id] = d;
    std::vector<sched::Pool> pools = sched->pools();
    int flagged = 0;
    for (auto& [job, run] : runs) {
      std::vector<int> moved;
      std::vector<std::string> gone;
      for (int d : run.devices) {
        const std::string id = topology != nullptr && d >= 0 && d < topology->num_devices()
                                   ? topology->device(d).id
                                   : "?";
        auto it = index.find(id);
        if (it == index.end() || topo->device(it->second).host != run.host) {
          gone.push_back(id);
        } else {
          moved.push_back(it->second);
        }
      }
      std::string flag;
      if (!gone.empty()) {
        flag = fmt::format("its devices {} are no longer in the topology", fmt::join(gone, ", "));
      } else {
        Result<JobRecord> j = o.jobs->Get(job);
        Result<JobSpec> spec = j.ok() ? ReadStoredJob(j->spec, "spec") : j.status();
        const std::optional<sched::JobClass> job_class =
            spec.ok() ? sched::JobClassFromName(spec->job_class) : std::nullopt;
        const bool fits = std::any_of(pools.begin(), pools.end(), [&](const sched::Pool& p) {
          const auto& c = p.spec.classes;
          const auto& t = p.spec.teams;
          return job_class && std::find(c.begin(), c.end(), *job_class) != c.end() &&
                 (t.empty() || std::find(t.begin(), t.end(), j->team) != t.end()) &&
                 std::all_of(moved.begin(), moved.end(), [&](int d) {
                   return std::find(p.devices.begin(), p.devices.end(), d) != p.devices.end();
                 });
        });
        if (!fits) flag = "no pool takes it on its devices any more";
      }
      run.devices = std::move(moved);
      run.sched_id.clear();
      run.adopted = true;  // the new scheduler does not know it: it places around it
      if (!flag.empty()) {
        ++flagged;
        const std::string note =
            "flagged: " + flag + "; it keeps running on what it holds until it ends";
        o.jobs->Note(job, note, now).IgnoreError();  // ended meanwhile: nothing to note
        Audit("kcd", "job.flag", fmt::format("job/{}", job), "ok", note);
      }
    }
    // Queued jobs are handed to the new scheduler at this pass (queued without a submission).
    const size_t requeued = queued.size();
    queued.clear();
    sched_jobs.clear();
    deferred.clear();
    scheduler.reset();  // before the topology it points to
    topology = std::move(topo);
    inventory = std::move(text);
    scheduler = std::move(sched);
    IndexHosts();
    // An agent whose host left, or whose device count changed, registers again (and is
    // checked against the new topology then).
    for (auto& [host, a] : agents) {
      std::optional<int> h = HostIndex(host);
      if (!h) a.registered = false;
    }
    up.assign(topology->num_devices(), 1);  // every device starts up in a new scheduler
    const std::string what = fmt::format(
        "{} hosts, {} devices, {} pools; {} running jobs kept their devices ({} flagged), {} "
        "queued jobs requeued",
        topology->hosts().size(), topology->num_devices(), scheduler->pools().size(), runs.size(),
        flagged, requeued);
    KC_LOG(INFO) << "dispatcher: topology and pools apply now: " << what;
    Audit("kcd", "cluster.apply", "cluster", "ok", what);
  }

  void Pass() KC_REQUIRES(mu) {
    const double now = WallSeconds();
    RefreshLimits();
    RefreshConfig(now);
    // Agents silent too long: their runs are lost; the jobs go back to the queue.
    for (auto& [host, a] : agents) {
      // Its lease ran out at lost_after_s: it has stopped its runs by the end of its grace.
      if (now - a.last_seen_s <= o.lost_after_s + a.stop_grace_s) continue;
      std::vector<int64_t> lost;
      for (auto& [job, run] : runs) {
        if (run.host == host) lost.push_back(job);
        if (run.shares.count(host) != 0) run.shares_down.insert(host);  // gone with it
      }
      if (!a.registered && lost.empty()) continue;
      a.registered = false;
      a.starts.clear();
      a.stops.clear();
      a.resizes.clear();
      Audit("kcd", "agent.lost", "host/" + host, "ok",
            fmt::format("no heartbeat for {:.0f} s (lease {:.0f} s, then {:.0f} s for its runs "
                        "to stop)",
                        now - a.last_seen_s, o.lost_after_s, a.stop_grace_s));
      for (int64_t job : lost) {
        Requeue(job, fmt::format("host {} lost; resumes from its last checkpoint", host), now);
      }
    }
    RefreshDevices(now);
    // New jobs, and queued ones the scheduler does not have (resumed, or left by a restart).
    // Only the jobs that have not ended are read, and those this kcd has that ended since.
    Result<std::vector<JobRecord>> waiting = o.jobs->List({.active = true, .limit = 1 << 30});
    if (waiting.ok()) {
      std::set<int64_t> active;
      for (const JobRecord& j : *waiting) active.insert(j.id);
      std::set<int64_t> ended;
      for (const auto& [id, sched_id] : queued) {
        if (active.count(id) == 0) ended.insert(id);
      }
      for (const auto& [id, run] : runs) {
        if (active.count(id) == 0) ended.insert(id);
      }
      for (int64_t id : ended) {
        if (Result<JobRecord> j = o.jobs->Get(id); j.ok()) waiting->push_back(*std::move(j));
      }
      for (const JobRecord& j : *waiting) {
        const bool known = queued.count(j.id) != 0 || runs.count(j.id) != 0;
        if (j.phase == JobPhase::kPending || (j.phase == JobPhase::kQueued && !known)) {
          if (auto b = not_before.find(j.id); b != not_before.end()) {
            if (now < b->second) continue;  // requeued after a failure: its backoff
            not_before.erase(b);
          }
          Admit(j, now);
        } else if (j.phase == JobPhase::kRunning && !known) {
          Move(j.id, JobPhase::kQueued,
               "kcd has no record of its run; resumes from its last "
               "checkpoint");
        } else if (known && (IsTerminal(j.phase) || j.phase == JobPhase::kPaused)) {
          // Cancelled or paused in the store (or failed): stop it here.
          Release(j.id, now);
          if (auto r = runs.find(j.id); r != runs.end()) OrderStop(r->second, j.reason);
        }
      }
    }
    if (scheduler == nullptr) return;
    // Runs past their allowed runtime stop (their checkpoint stays) and wait for more hours.
    for (auto& [job, run] : runs) {
      if (run.running_since_s < 0 || run.stopping) continue;
      Result<JobRecord> j = o.jobs->Get(job);
      if (!j.ok() || j->devices <= 0) continue;
      const double allowed_s = j->device_hours / static_cast<double>(j->devices) * 3600;
      const double used_s = run.prior_running_s + (now - run.running_since_s);
      if (used_s <= allowed_s) continue;
      const std::string why = fmt::format(
          "runtime quota exhausted: ran {:.2f} h of its {:.2f} h; stopped with a checkpoint "
          "of its last step; raise expected_hours with kc job modify, then resume",
          used_s / 3600, allowed_s / 3600);
      Move(job, JobPhase::kPaused, why);
      Release(job, now);
      OrderStop(run, why);
    }
    std::vector<sched::Decision> decisions = std::move(deferred);
    deferred.clear();
    for (sched::Decision& d : scheduler->Schedule(now)) decisions.push_back(std::move(d));
    for (sched::Decision& d : decisions) {
      switch (d.kind) {
        case sched::DecisionKind::kStart: {
          // Wait until the victims whose devices it takes have stopped, or shrunk.
          const bool waiting_for_victims = std::any_of(
              d.after.begin(), d.after.end(),
              [&](const std::string& victim) KC_REQUIRES(mu) { return Holding(victim, now); });
          if (waiting_for_victims) {
            deferred.push_back(std::move(d));
          } else {
            Start(d, now);
          }
          break;
        }
        case sched::DecisionKind::kPreempt: {
          auto sj = sched_jobs.find(d.job);
          if (sj == sched_jobs.end()) break;
          const int64_t job = sj->second;
          // The scheduler has it pending again under the same id.
          if (auto r = runs.find(job); r != runs.end()) OrderStop(r->second, d.reason);
          queued[job] = d.job;
          Move(job, JobPhase::kQueued, "preempted: " + d.reason);
          break;
        }
        case sched::DecisionKind::kShrink:
        case sched::DecisionKind::kGrow:
          Resize(d, now);
          break;
        case sched::DecisionKind::kDemote: {
          // A job whose ranks fail too often drops a priority level in the scheduler.
          auto sj = sched_jobs.find(d.job);
          if (sj != sched_jobs.end()) {
            Audit("kcd", "job.demote", fmt::format("job/{}", sj->second), "ok", d.reason);
          }
          break;
        }
        default:  // interval, promote: the scheduler's own; advice follows from NewAdvice
          KC_LOG(INFO) << "dispatcher: " << DecisionKindName(d.kind) << " " << d.job << ": "
                       << d.reason;
          break;
      }
    }
    ShowPendingReasons();
  }

  // Writes each queued job's pending reason as this pass left it ("pending: reason=Resources
  // (...)", Slurm's squeue %R) for kc jobs and kc job show: at once when its kind changes,
  // at most every kReasonRefreshS when only its details (free devices, expected start) do.
  void ShowPendingReasons() KC_REQUIRES(mu) {
    constexpr double kReasonRefreshS = 30;
    const double wall = WallSeconds();
    for (const auto& [job, sched_id] : queued) {
      Result<sched::JobStatus> s = scheduler->Query(sched_id);
      if (!s.ok() || s->state != sched::JobState::kPending || s->reason.empty()) continue;
      auto& [shown, at] = shown_reasons[job];
      if (shown == s->reason) continue;
      const auto kind = [](std::string_view r) { return r.substr(0, r.find(" (")); };
      if (kind(shown) == kind(s->reason) && wall - at < kReasonRefreshS) continue;
      if (Status st = o.jobs->SetReason(job, KcdJobIds(s->reason), wall); !st.ok()) {
        KC_LOG(INFO) << "dispatcher: job " << job << ": " << st.message();
        continue;
      }
      shown = s->reason;
      at = wall;
    }
  }

  void Loop() {
    MutexLock lock(&mu);
    while (!stopped) {
      const auto start = std::chrono::steady_clock::now();
      Pass();
      pass_seconds.Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      woken = false;
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(o.pass_period_s));
      while (!stopped && !woken && wake.WaitUntil(&mu, until)) {
      }
    }
  }
};

Dispatcher::Dispatcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Dispatcher::~Dispatcher() {
  {
    MutexLock lock(&impl_->mu);
    impl_->stopped = true;
    impl_->wake.SignalAll();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::unique_ptr<Dispatcher>> Dispatcher::Start(DispatcherOptions o) {
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.o = o;
  const fs::path dir(o.dir);
  {
    MutexLock lock(&m.mu);
    m.config_applied = m.ConfigStamps();
    KC_RETURN_IF_ERROR(LoadCluster(dir, &m.topology, &m.scheduler, &m.inventory));
    m.IndexHosts();
  }
  if (m.topology != nullptr) {
    if (fs::exists(dir / "comm-limits.yaml")) {
      KC_ASSIGN_OR_RETURN(m.comm_limits, comm::LoadCommLimits((dir / "comm-limits.yaml").string()));
    }
    if (fs::exists(dir / "plan-approval.yaml")) {
      KC_ASSIGN_OR_RETURN(
          m.limits, parallel::planner::LoadApprovalLimits((dir / "plan-approval.yaml").string()));
      MutexLock lock(&m.mu);
      std::error_code ec;  // unknown: the first pass reads the file again
      m.limits_file = true;
      m.limits_mtime = fs::last_write_time(dir / "plan-approval.yaml", ec);
    }
  }
  {
    MutexLock lock(&m.mu);
    KC_RETURN_IF_ERROR(m.db.Open((dir / "kcd.db").string(), "dispatcher", kSchema));
    // Runs recorded before run tokens were revoked at their end have no token hash.
    KC_ASSIGN_OR_RETURN(internal::Statement has_hash,
                        m.db.Prepare("SELECT 1 FROM pragma_table_info('runs') "
                                     "WHERE name = 'token_hash'"));
    if (has_hash.Step() != SQLITE_ROW) {
      KC_RETURN_IF_ERROR(
          m.db.Exec("ALTER TABLE runs ADD COLUMN token_hash TEXT NOT NULL DEFAULT ''"));
    }
    // Requeues recorded before their backoff's end was kept have none (it has passed).
    KC_ASSIGN_OR_RETURN(internal::Statement has_end,
                        m.db.Prepare("SELECT 1 FROM pragma_table_info('requeues') "
                                     "WHERE name = 'not_before_s'"));
    if (has_end.Step() != SQLITE_ROW) {
      KC_RETURN_IF_ERROR(
          m.db.Exec("ALTER TABLE requeues ADD COLUMN not_before_s REAL NOT NULL DEFAULT 0"));
    }
    // A requeued job's backoff outlasts a restart of kcd.
    {
      const double wall = WallSeconds();
      KC_ASSIGN_OR_RETURN(internal::Statement ends,
                          m.db.Prepare("SELECT job, MAX(not_before_s) FROM requeues GROUP BY job"));
      while (ends.Step() == SQLITE_ROW) {
        if (ends.Double(1) > wall) m.not_before[ends.Int(0)] = ends.Double(1);
      }
    }
    if (m.topology != nullptr) {
      // Every device starts down: its agent brings it up by registering.
      m.up.assign(m.topology->num_devices(), 1);
      m.RefreshDevices(WallSeconds());
    }
    // Adopt the runs a previous kcd left: their jobs keep their devices until they end.
    KC_ASSIGN_OR_RETURN(internal::Statement st,
                        m.db.Prepare("SELECT run, job, host, devices, started_s, token_hash "
                                     "FROM runs WHERE ended = 0"));
    std::vector<Run> open;
    while (st.Step() == SQLITE_ROW) {
      open.push_back({.run = st.Int(0),
                      .job = st.Int(1),
                      .host = st.Text(2),
                      .devices = ParseDevices(st.Text(3)),
                      .started_s = st.Double(4),
                      .token_hash = st.Text(5)});
    }
    for (Run& r : open) {
      Result<JobRecord> j = o.jobs->Get(r.job);
      const bool alive =
          j.ok() && (j->phase == JobPhase::kRunning || j->phase == JobPhase::kQueued);
      const bool devices_known =
          m.topology != nullptr && std::all_of(r.devices.begin(), r.devices.end(), [&](int d) {
            return d >= 0 && d < m.topology->num_devices();
          });
      if (!alive || !devices_known || !m.HostIndex(r.host)) {
        m.runs[r.job] = r;
        m.EndRun(r.job);
        continue;
      }
      Result<std::vector<JobEvent>> history = o.jobs->History(r.job);
      r.adopted = true;
      r.prior_running_s = history.ok() ? RunningSeconds(*history) : 0;
      if (j->phase == JobPhase::kRunning && history.ok() && !history->empty()) {
        r.running_since_s = history->back().time_s;  // its open running interval
      }
      m.runs[r.job] = r;
      // Its agent has `lost_after_s` to report back, like any agent.
      m.agents[r.host].last_seen_s = WallSeconds();
    }
    m.RefreshDevices(WallSeconds());
  }
  m.thread = std::thread([p = impl.get()] { p->Loop(); });
  return std::unique_ptr<Dispatcher>(new Dispatcher(std::move(impl)));
}

void Dispatcher::Wake() {
  MutexLock lock(&impl_->mu);
  impl_->woken = true;
  impl_->wake.SignalAll();
}

Result<kc::v1::RegisterAgentResponse> Dispatcher::Register(
    const kc::v1::RegisterAgentRequest& req) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);  // the topology may be replaced live (RefreshConfig)
  if (m.topology == nullptr) {
    return NotFoundError(fmt::format(
        "host {}: the cluster has no topology yet ({}/topology.yaml); kc init --inventory "
        "or kc up writes one",
        req.host(), m.o.dir));
  }
  std::optional<int> h = m.HostIndex(req.host());
  if (req.supervisor()) {
    // Runs launchers only: a name of its own, and no devices.
    if (h) {
      return InvalidArgumentError(fmt::format(
          "host {}: a supervisor agent takes a name outside the topology, which has this host",
          req.host()));
    }
    if (req.devices() != 0) {
      return InvalidArgumentError(
          fmt::format("host {}: a supervisor agent has no devices (--devices 0), not {}",
                      req.host(), req.devices()));
    }
  } else if (!h) {
    return NotFoundError(fmt::format("host {}: not in the cluster's topology ({} hosts: {}...)",
                                     req.host(), m.topology->hosts().size(),
                                     m.topology->hosts().front().name));
  } else if (const int want = static_cast<int>(m.host_devices[*h].size()); req.devices() != want) {
    return InvalidArgumentError(
        fmt::format("host {}: devices: the agent found {}, the topology has {}", req.host(),
                    req.devices(), want));
  }
  Agent& a = m.agents[req.host()];
  a.supervisor = req.supervisor();
  const bool again = a.registered;
  a.registered = true;
  a.last_seen_s = WallSeconds();
  // Bounded: an agent cannot keep its host's runs from being requeued for long.
  a.stop_grace_s = std::isfinite(req.stop_grace_s())
                       ? std::clamp(req.stop_grace_s(), 0.0, kMaxAgentStopGraceS)
                       : 0.0;
  a.starts.clear();
  a.stops.clear();
  a.resizes.clear();
  // Runs on this host it does not report died with a previous agent: back to the queue.
  std::set<int64_t> reported;
  for (const kc::v1::AgentJobReport& r : req.jobs()) reported.insert(r.run());
  std::vector<int64_t> gone;
  for (const auto& [job, run] : m.runs) {
    if (run.host == req.host() && reported.count(run.run) == 0) gone.push_back(job);
  }
  for (int64_t job : gone) {
    m.Requeue(job,
              fmt::format("the agent on {} restarted without it; resumes from its last checkpoint",
                          req.host()),
              WallSeconds());
  }
  // Runs it reports that kcd does not know (any more) are stopped.
  for (const kc::v1::AgentJobReport& r : req.jobs()) m.StopIfUnknown(a, r);
  m.Audit("kcd", "agent.register", "host/" + req.host(), "ok",
          fmt::format("{} devices{}", req.devices(), again ? " (again)" : ""));
  m.RefreshDevices(WallSeconds());
  m.woken = true;
  m.wake.SignalAll();
  kc::v1::RegisterAgentResponse out;
  out.set_heartbeat_period_s(m.o.heartbeat_period_s);
  out.set_lost_after_s(m.o.lost_after_s);
  out.set_check_period_s(m.o.check_period_s);
  return out;
}

std::string Dispatcher::CommLimitsOf(const JobRecord& job) const {
  const Impl& m = *impl_;
  if (!m.comm_limits) return "";
  const std::string name = Impl::CommName(job);
  return comm::DescribeCommLimits(m.comm_limits->ForJob(name), m.comm_limits->lanes);
}

Result<kc::v1::AgentHeartbeatResponse> Dispatcher::Heartbeat(
    const kc::v1::AgentHeartbeatRequest& req) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  auto ai = m.agents.find(req.host());
  if (ai == m.agents.end() || !ai->second.registered) {
    return FailedPreconditionError(
        fmt::format("host {}: not registered (kcd restarted, or the agent was declared lost); "
                    "register again",
                    req.host()));
  }
  Agent& a = ai->second;
  const double now = WallSeconds();
  a.last_seen_s = now;
  bool changed = false;
  for (const kc::v1::AgentJobReport& r : req.jobs()) {
    if (!r.log().empty()) m.o.jobs->AppendLog(r.job(), r.log()).IgnoreError();  // unknown: no log
    for (const kc::v1::TrainReport& t : r.reports()) {
      if (!t.has_fault()) continue;
      const kc::v1::FaultReport& f = t.fault();  // the run's faults, audited
      m.Audit("kcd", "fault." + (f.event().empty() ? std::string("unknown") : f.event()),
              fmt::format("job/{}", r.job()), "ok",
              fmt::format("on {}: {}", req.host(), FaultReportJson(f)));
    }
    if (m.StopIfUnknown(a, r)) continue;
    if (Run& run = m.runs[r.job()]; run.host != req.host()) {
      // A share's own reports: its host's load, when JobService.Inspect asked.
      std::vector<JobReport> loads;
      for (const kc::v1::TrainReport& t : r.reports()) {
        if (t.has_host() && run.shares.count(req.host()) != 0) {
          loads.push_back({.bytes = t.SerializeAsString(), .event = true});
        }
      }
      if (!loads.empty()) m.o.jobs->AppendReports(r.job(), loads).IgnoreError();
      changed |= m.ShareReport(run, req.host(), r, now);
      continue;
    }
    // Kept with the job for kc diagnose: a run kcd knows on this host.
    std::vector<JobReport> kept;
    for (const kc::v1::TrainReport& t : r.reports()) {
      kept.push_back({.bytes = t.SerializeAsString(),
                      .event = t.has_run() || t.has_summary() || t.has_fault() ||
                               t.has_progress() || t.has_host()});
    }
    m.o.jobs->AppendReports(r.job(), kept).IgnoreError();
    Run& run = m.runs[r.job()];
    int detected = 0;
    for (const kc::v1::TrainReport& t : r.reports()) {
      if (!t.has_fault()) continue;
      if (t.fault().event() == "detected") ++detected;
      if (!run.stopping) m.NoteFault(run, t.fault(), now);
    }
    // A rank's failure counts toward the job's fault rate (demotion of flaky jobs) and its
    // pool's interruptions (checkpoint advice), as in kc sim.
    for (int i = 0; i < detected && !run.adopted; ++i) {
      m.scheduler->Faulted(run.sched_id, now).IgnoreError();  // unknown: it ended already
    }
    const std::string where = fmt::format("job/{}", run.job);
    m.o.jobs
        ->SetProgress(
            run.job,
            {.host = Impl::HostsOf(run), .step = r.step(), .checkpoint_step = r.checkpoint_step()})
        .IgnoreError();  // the job exists: it has a run
    if (r.checkpoint_step() > run.checkpoint_step && !run.adopted) {
      m.scheduler->Checkpointed(run.sched_id, now).IgnoreError();
    }
    run.checkpoint_step = std::max(run.checkpoint_step, r.checkpoint_step());
    switch (r.state()) {
      case kc::v1::AgentJobReport::STATE_RUNNING:
        if (run.running_since_s < 0) {
          run.running_since_s = now;
          if (!run.stopping) {
            m.Move(run.job, JobPhase::kRunning, fmt::format("running on {}", Impl::HostsOf(run)));
          }
        }
        break;
      case kc::v1::AgentJobReport::STATE_EXITED:
      case kc::v1::AgentJobReport::STATE_FAILED_TO_START: {
        changed = true;
        if (run.stopping) {  // its phase was set, and the scheduler told, when it was decided
          m.EndRun(run.job);
          break;
        }
        // A run that ended within one heartbeat was never reported running: it ran, and only
        // a running job may succeed.
        if (r.state() == kc::v1::AgentJobReport::STATE_EXITED && run.running_since_s < 0) {
          m.Move(run.job, JobPhase::kRunning, fmt::format("running on {}", Impl::HostsOf(run)));
        }
        const std::string ran_on = Impl::HostsOf(run);
        m.Release(run.job, now);
        m.EndRun(run.job);
        if (r.state() == kc::v1::AgentJobReport::STATE_FAILED_TO_START) {
          m.Move(r.job(), JobPhase::kFailed,
                 fmt::format("could not start on {}: {}", req.host(), r.reason()));
        } else if (r.exit_code() == 0) {
          m.Move(r.job(), JobPhase::kSucceeded, fmt::format("finished on {}", ran_on));
        } else {
          // A rank lost below the minimum, kc train crashed or killed: requeued by the job's
          // restart policy; input kc train refused: failed.
          m.RequeueOrFail(
              r.job(), r.exit_code() == kTrainBadInput,
              fmt::format("exited with code {} on {}: {}", r.exit_code(), ran_on, r.reason()), now);
        }
        break;
      }
      case kc::v1::AgentJobReport::STATE_FENCED:
        // Heard before kcd took the agent for lost: the run stopped itself, with a checkpoint.
        changed = true;
        if (run.stopping) {
          m.EndRun(run.job);
          break;
        }
        m.Requeue(run.job,
                  fmt::format("fenced on {}: {}; resumes from its last checkpoint", req.host(),
                              r.reason()),
                  now);
        break;
      case kc::v1::AgentJobReport::STATE_REVOKED: {
        changed = true;
        m.Audit("kcd", "job.execution_check", where, "denied", r.reason());
        if (run.stopping) {
          m.EndRun(run.job);
          break;
        }
        m.Release(run.job, now);
        m.EndRun(run.job);
        m.Move(r.job(), JobPhase::kPaused,
               fmt::format("stopped at its execution-time check: {}", r.reason()));
        break;
      }
      default:
        break;
    }
  }
  if (changed) {
    m.RefreshDevices(now);
    m.woken = true;
    m.wake.SignalAll();
  }
  kc::v1::AgentHeartbeatResponse out;
  for (auto& [job, run] : m.runs) {
    if (run.host != req.host()) continue;
    if (std::optional<kc::v1::CheckpointAdvice> advice = m.NewAdvice(run)) {
      *out.add_advice() = *std::move(advice);
    }
  }
  for (kc::v1::StartOrder& s : a.starts) *out.add_start() = std::move(s);
  for (kc::v1::StopOrder& s : a.stops) *out.add_stop() = std::move(s);
  for (kc::v1::ResizeOrder& r : a.resizes) *out.add_resize() = std::move(r);
  for (kc::v1::InspectOrder& i : a.inspects) *out.add_inspect() = std::move(i);
  a.starts.clear();
  a.stops.clear();
  a.resizes.clear();
  a.inspects.clear();
  return out;
}

Result<kc::v1::InspectJobResponse> Dispatcher::Inspect(int64_t job) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  const auto r = m.runs.find(job);
  if (r == m.runs.end() || r->second.stopping) {
    return FailedPreconditionError(
        fmt::format("job {} has no run going on: there is nothing live to inspect", job));
  }
  const Run& run = r->second;
  if (run.command) {
    return FailedPreconditionError(fmt::format(
        "job {} is a command job: kc supervises its processes, not its collectives, so there "
        "is no supervisor to ask where its ranks are",
        job));
  }
  kc::v1::InspectOrder order;
  order.set_job(job);
  order.set_run(run.run);
  order.set_request(++m.inspections);
  m.agents[run.host].inspects.push_back(order);
  for (const auto& [host, devices] : run.shares) m.agents[host].inspects.push_back(order);
  kc::v1::InspectJobResponse out;
  out.set_request(order.request());
  out.set_run_id(RunId(job, run.run));
  if (run.shares.empty()) out.add_hosts(run.host);
  for (const auto& [host, devices] : run.shares) out.add_hosts(host);
  return out;
}

void Dispatcher::AppendMetrics(std::string* out) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  int64_t agents = 0;
  for (const auto& [host, a] : m.agents) agents += a.registered;
  AppendMetric(out, "kc_scheduler_queue_depth", "gauge",
               "Jobs queued for the scheduler, not yet started",
               {{.value = double(m.queued.size())}});
  AppendMetric(out, "kc_agents_registered", "gauge", "Agents registered and heard from",
               {{.value = double(agents)}});
  m.pass_seconds.Append(out, "kc_scheduler_pass_seconds",
                        "How long one dispatcher pass (the scheduler's included) takes");
  std::vector<MetricSample> ranks, step, checkpoint;
  for (const auto& [job, run] : m.runs) {
    Result<JobRecord> j = m.o.jobs->Get(job);
    if (!j.ok()) continue;
    std::vector<std::pair<std::string, std::string>> labels = {
        {"job", std::to_string(job)}, {"name", j->name}, {"team", j->team}, {"host", run.host}};
    const JobProgress p = m.o.jobs->Progress(job).value_or(JobProgress{});
    ranks.push_back({.labels = labels, .value = double(run.ranks)});
    step.push_back({.labels = labels, .value = double(p.step)});
    checkpoint.push_back({.labels = labels, .value = double(p.checkpoint_step)});
  }
  AppendMetric(out, "kc_job_ranks", "gauge",
               "Ranks a running job's run goes on at, as its fault events last said", ranks);
  AppendMetric(out, "kc_job_step", "gauge", "The last step a running job reported", step);
  AppendMetric(out, "kc_job_checkpoint_step", "gauge",
               "The step of a running job's last committed checkpoint", checkpoint);
}

}  // namespace kc::api
