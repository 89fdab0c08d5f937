#include "api/agent.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <sstream>
#include <thread>
#include <vector>

#include "api/internal/digest.h"
#include "api/job_spec.h"
#include "api/metrics.h"
#include "api/train_job.h"
#include "base/file.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/subprocess.h"
#include "comm/lanes.h"
#include "kc/v1/agent.grpc.pb.h"
#include "kc/v1/permission.grpc.pb.h"

namespace kc::api {
namespace {

namespace fs = std::filesystem;
using internal::WallSeconds;
using Report = kc::v1::AgentJobReport;

constexpr size_t kMaxLogPerReport = 64 << 10;
// A run's typed reports: sent at most this many a heartbeat, and kept at most this many while
// kcd has not taken them (the newest).
constexpr size_t kMaxReportsPerHeartbeat = 1000;
constexpr size_t kMaxReportsKept = 5000;
constexpr double kStepRelayPeriodS = 1;

// One job's processes on this host.
struct Job {
  kc::v1::StartOrder order;
  JobSpec spec;
  pid_t pid = -1;                     // the process group's leader (kc train)
  std::optional<Subprocess> process;  // it, killed with its group if the job is dropped
  int out_fd = -1;                    // its stdout and stderr
  std::string log;                    // output not yet delivered to kcd
  // A share of a run across hosts: each line of its output goes to kcd as "[host NAME] LINE",
  // beside the other hosts' in the job's log; whether the next byte starts a line.
  std::string line_prefix;
  bool at_line_start = true;
  std::string last_line;
  std::string advice_path;  // checkpoint_every: auto: the scheduler's advice, for kc train
  std::string resize_path;  // an elastic train job: the size kc train follows (--resize-file)
  // A train job's typed reports (kc train --reports), and how far they were read.
  std::string reports_path;
  std::string out_dir;  // a launcher's --out: where kc train looks for JobService.Inspect's
  int64_t reports_offset = 0;
  std::deque<kc::v1::TrainReport> reports;  // those not yet delivered to kcd
  double step_relayed_s = 0;                // when a step report was last queued for kcd
  int64_t step = 0;
  int64_t checkpoint_step = 0;
  // Its last step record, for the metrics: how fast it trains and where the time goes.
  double loss = 0, tokens_per_s = 0, step_s = 0, compute_s = 0, comm_exposed_s = 0;
  // And rank 0's TCP links then (none over shared memory): per lane its queue time in the step
  // and deepest backlog, retransmits, round trip.
  std::vector<double> lane_wait_s;
  std::vector<int64_t> lane_backlog;
  int64_t retransmits = 0;
  double rtt_s = 0;
  double next_check_s = 0;
  bool stopping = false;
  double kill_at_s = 0;
  // Set once it ended, until kcd has the report.
  bool ended = false;
  Report::State end_state = Report::STATE_EXITED;
  int exit_code = 0;
  std::string end_reason;
};

std::string LastLine(const std::string& text) {
  size_t end = text.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  size_t start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1,
                     end - (start == std::string::npos ? 0 : start + 1) + 1);
}

// Who a checkpoint directory belongs to: the owner and team of the first job that wrote there,
// recorded in DIR/.kc-owner. A job may write its checkpoints into a directory only when the
// permission table lets its owner write that owner's (checkpoint.write), so one tenant cannot
// name another's directory, resume from its checkpoints, and have retention delete them.
struct PathOwner {
  std::string owner, team;
  bool operator==(const PathOwner&) const = default;
};
constexpr char kOwnerFile[] = ".kc-owner";

// The recorded owner of `dir`; nullopt when none is recorded; an unreadable record belongs to
// nobody (so nobody but a system admin's job may write there).
std::optional<PathOwner> ReadPathOwner(const std::string& dir) {
  Result<std::string> text = ReadWholeFile((fs::path(dir) / kOwnerFile).string());
  if (!text.ok()) {
    if (text.status().code() == ErrorCode::kNotFound) return std::nullopt;
    return PathOwner{};
  }
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object() || !j.contains("owner") || !j["owner"].is_string() || !j.contains("team") ||
      !j["team"].is_string()) {
    return PathOwner{};
  }
  return PathOwner{.owner = j["owner"].get<std::string>(), .team = j["team"].get<std::string>()};
}

// Records `owner` as `dir`'s (creating it) unless another owner was recorded first, atomically
// across agents sharing the directory (a link, which fails when the record exists). Returns
// the owner recorded.
Result<PathOwner> ClaimPath(const std::string& dir, const PathOwner& owner) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return UnavailableError(fmt::format("{}: cannot create: {}", dir, ec.message()));
  const std::string record = (fs::path(dir) / kOwnerFile).string();
  const std::string tmp = fmt::format("{}.{}", record, getpid());
  const nlohmann::json j = {{"owner", owner.owner}, {"team", owner.team}};
  KC_RETURN_IF_ERROR(WriteFileDurably(tmp, j.dump() + "\n"));
  const bool linked = link(tmp.c_str(), record.c_str()) == 0;
  const int error = errno;
  unlink(tmp.c_str());
  if (!linked && error != EEXIST) {
    return UnavailableError(
        fmt::format("{}: cannot record its owner: {}", record, strerror(error)));
  }
  return ReadPathOwner(dir).value_or(PathOwner{});
}

// When process `pid` started (clock ticks since boot, /proc/PID/stat field 22): with the pid,
// it names one process, not whichever later reuses the number. -1 when there is none.
int64_t ProcessStartTime(pid_t pid) {
  Result<std::string> stat = ReadWholeFile(fmt::format("/proc/{}/stat", pid));
  if (!stat.ok()) return -1;
  // Field 2, the command, is in parentheses and may hold anything; count from after it.
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat->substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 3 && field == "Z") return -1;  // a zombie: it has ended
    if (i == 22) return std::strtoll(field.c_str(), nullptr, 10);
  }
  return -1;
}

// A run across hosts as `kc train --hosts` takes it: "h1:2,h2:2", each host's ranks
// consecutive in rank order.
Result<std::string> HostsOfRun(const kc::v1::RunAssignment& a) {
  std::vector<std::pair<std::string, int>> hosts;
  for (const auto& r : a.ranks()) {
    if (!hosts.empty() && hosts.back().first == r.host()) {
      ++hosts.back().second;
      continue;
    }
    for (const auto& [name, n] : hosts) {
      if (name == r.host()) {
        return InvalidArgumentError(
            fmt::format("host {}'s ranks are not consecutive in the assignment", name));
      }
    }
    hosts.emplace_back(r.host(), 1);
  }
  std::vector<std::string> parts;
  for (const auto& [name, n] : hosts) parts.push_back(fmt::format("{}:{}", name, n));
  return fmt::format("{}", fmt::join(parts, ","));
}

}  // namespace

// Two threads: the heartbeat thread registers, reports and takes kcd's orders; the worker
// thread watches the jobs' processes, makes their execution-time checks and starts them. Calls
// to kcd and launches are made without the lock, so a heartbeat never waits behind a launch or
// a check (nor a check behind a heartbeat).
struct Agent::Impl {
  AgentOptions o;

  mutable Mutex mu;
  CondVar wake;
  // kcd's stubs, replaced together by Connect; a call copies the one it uses.
  std::shared_ptr<kc::v1::AgentService::Stub> agents KC_GUARDED_BY(mu);
  std::shared_ptr<kc::v1::PermissionService::Stub> permissions KC_GUARDED_BY(mu);
  bool stopped KC_GUARDED_BY(mu) = false;
  std::map<int64_t, Job> jobs KC_GUARDED_BY(mu);  // by job id
  // Start orders for jobs whose previous run here is still stopping (kcd queued the job again
  // and placed it here): each starts once that run has ended and been reported.
  std::map<int64_t, kc::v1::StartOrder> deferred KC_GUARDED_BY(mu);
  // Deferred runs stopped before they started: their ends, for kcd.
  std::vector<Report> never_started KC_GUARDED_BY(mu);
  // Orders for the worker thread to start, in kcd's order, and the runs it is launching (job
  // -> run): registration reports both as running, so that kcd keeps their runs; a stop for a
  // run being launched waits here for it to be up (job -> reason).
  std::deque<kc::v1::StartOrder> to_start KC_GUARDED_BY(mu);
  std::map<int64_t, int64_t> launching KC_GUARDED_BY(mu);
  std::map<int64_t, std::string> stop_after_launch KC_GUARDED_BY(mu);
  std::unique_ptr<MetricsServer> metrics;  // with metrics_listen

  // The metrics page: the jobs it runs, each with its run's last step record.
  std::string Metrics() {
    MutexLock lock(&mu);
    std::string out;
    int64_t running = 0;
    std::vector<MetricSample> step, loss, tokens, step_s, compute_s, exposed_s, lane_wait,
        lane_backlog, retransmits, rtt;
    for (const auto& [id, j] : jobs) {
      if (j.ended) continue;
      ++running;
      if (!j.spec.command.empty()) continue;  // a command job reports no steps
      const std::vector<std::pair<std::string, std::string>> l = {
          {"job", std::to_string(id)}, {"name", j.spec.name}, {"host", o.host}};
      step.push_back({.labels = l, .value = double(j.step)});
      loss.push_back({.labels = l, .value = j.loss});
      tokens.push_back({.labels = l, .value = j.tokens_per_s});
      step_s.push_back({.labels = l, .value = j.step_s});
      compute_s.push_back({.labels = l, .value = j.compute_s});
      exposed_s.push_back({.labels = l, .value = j.comm_exposed_s});
      if (j.lane_wait_s.size() != static_cast<size_t>(comm::kNumLanes)) continue;  // no TCP links
      for (comm::Lane lane : comm::kAllLanes) {
        auto with_lane = l;
        with_lane.emplace_back("lane", std::string(comm::LaneName(lane)));
        const auto i = static_cast<size_t>(lane);
        lane_wait.push_back({.labels = with_lane, .value = j.lane_wait_s[i]});
        if (i < j.lane_backlog.size()) {
          lane_backlog.push_back({.labels = with_lane, .value = double(j.lane_backlog[i])});
        }
      }
      retransmits.push_back({.labels = l, .value = double(j.retransmits)});
      rtt.push_back({.labels = l, .value = j.rtt_s});
    }
    AppendMetric(&out, "kc_agent_jobs_running", "gauge", "Jobs whose processes run on this host",
                 {{.labels = {{"host", o.host}}, .value = double(running)}});
    AppendMetric(&out, "kc_run_step", "gauge", "The last step a run reported", step);
    AppendMetric(&out, "kc_run_loss", "gauge", "Its training loss at that step", loss);
    AppendMetric(&out, "kc_run_tokens_per_second", "gauge", "Tokens per second of that step",
                 tokens);
    AppendMetric(&out, "kc_run_step_seconds", "gauge", "How long that step took", step_s);
    AppendMetric(&out, "kc_run_compute_seconds", "gauge", "Of it, computing", compute_s);
    AppendMetric(&out, "kc_run_comm_exposed_seconds", "gauge",
                 "Of it, communication not hidden behind compute", exposed_s);
    AppendMetric(&out, "kc_run_lane_wait_seconds", "gauge",
                 "Rank 0's TCP send queue of a lane: its chunks' time queued in that step, summed",
                 lane_wait);
    AppendMetric(&out, "kc_run_lane_backlog_chunks", "gauge",
                 "Rank 0's TCP send queue of a lane: the most chunks queued at once so far",
                 lane_backlog);
    AppendMetric(&out, "kc_run_tcp_retransmits", "gauge",
                 "TCP segments rank 0's links retransmitted since its generation began",
                 retransmits);
    AppendMetric(&out, "kc_run_tcp_rtt_seconds", "gauge",
                 "The largest smoothed round trip of rank 0's TCP links", rtt);
    return out;
  }
  // Resize orders for runs still launching: carried out once they are up.
  std::map<int64_t, kc::v1::ResizeOrder> resize_after_launch KC_GUARDED_BY(mu);
  bool beat_now KC_GUARDED_BY(mu) = false;  // a job started: report it without waiting
  std::thread worker_thread;
  std::thread beat_thread;

  // Told by kcd at registration.
  double heartbeat_period_s KC_GUARDED_BY(mu) = 0.2;
  double check_period_s KC_GUARDED_BY(mu) = 1;
  bool registered KC_GUARDED_BY(mu) = false;
  int failures KC_GUARDED_BY(mu) = 0;  // heartbeats failed in a row
  // The lease (kcd's lost_after_s): past it without a registration or heartbeat kcd answered,
  // counted from when that call was made, the agent stops its runs (fencing) before kcd,
  // which waits the lease plus our stop grace from when it heard the call, starts them
  // elsewhere. 0 before the first registration.
  double lease_s KC_GUARDED_BY(mu) = 0;
  std::chrono::steady_clock::time_point last_contact KC_GUARDED_BY(mu);
  bool fenced KC_GUARDED_BY(mu) = false;  // since the lease ran out, until kcd answers again
  std::thread fence_thread;
  // JobService.Inspect's requests: each run's host load is measured (for about a second) on a
  // thread of its own, so that heartbeats and the runs' output go on meanwhile.
  std::deque<kc::v1::InspectOrder> to_probe KC_GUARDED_BY(mu);
  std::thread probe_thread;

  Status Connect() KC_REQUIRES(mu) {
    KC_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, ConnectToKcd(o.kcd));
    agents = kc::v1::AgentService::NewStub(channel);
    permissions = kc::v1::PermissionService::NewStub(channel);
    return OkStatus();
  }

  Status Register() KC_REQUIRES(mu) {
    kc::v1::RegisterAgentRequest req;
    req.set_host(o.host);
    req.set_devices(o.devices);
    req.set_stop_grace_s(o.stop_grace_s);
    req.set_supervisor(o.supervisor);
    // Every run kcd has not heard the end of, ended ones too: left out, kcd would take one
    // for lost with a previous agent and queue it again before its end is reported.
    for (auto& [id, j] : jobs) {
      Report* r = req.add_jobs();
      r->set_job(id);
      r->set_run(j.order.run());
      r->set_state(Report::STATE_RUNNING);
    }
    // kcd's orders, to be carried out or being carried out.
    std::vector<std::pair<int64_t, int64_t>> orders;
    for (const auto& [id, start] : deferred) orders.emplace_back(id, start.run());
    for (const kc::v1::StartOrder& start : to_start) orders.emplace_back(start.job(), start.run());
    for (const auto& [id, run] : launching) orders.emplace_back(id, run);
    for (const auto& [id, run] : orders) {
      Report* r = req.add_jobs();
      r->set_job(id);
      r->set_run(run);
      r->set_state(Report::STATE_RUNNING);
    }
    kc::v1::RegisterAgentResponse resp;
    grpc::ClientContext ctx;
    PrepareCall(o.kcd, &ctx, std::chrono::seconds(10));
    const std::shared_ptr<kc::v1::AgentService::Stub> stub = agents;
    const auto called_at = std::chrono::steady_clock::now();
    mu.Unlock();
    const grpc::Status called = stub->Register(&ctx, req, &resp);
    mu.Lock();
    KC_RETURN_IF_ERROR(FromGrpc(called));
    heartbeat_period_s = resp.heartbeat_period_s() > 0 ? resp.heartbeat_period_s() : 1;
    check_period_s = resp.check_period_s() > 0 ? resp.check_period_s() : 1;
    lease_s = resp.lost_after_s() > 0 ? resp.lost_after_s() : 0;
    Contact(called_at);
    registered = true;
    KC_LOG(INFO) << "agent: registered host " << o.host << " with " << o.devices << " devices";
    return OkStatus();
  }

  // The execution-time checks for job `j` with its owner's token. OK, or why it may not go on.
  // kUnavailable when kcd could not be asked (the job goes on meanwhile). Its checkpoint
  // directory is asked about as its recorded owner's; one nobody has written yet is recorded as
  // the job owner's once the checks pass.
  // Called without the lock, with the stub to call.
  Status ExecutionCheck(const kc::v1::StartOrder& order, const JobSpec& spec,
                        kc::v1::PermissionService::Stub& stub) {
    ClientConfig as_owner = o.kcd;
    as_owner.token = order.token();
    const PathOwner job_owner{.owner = order.owner(), .team = order.team()};
    const std::string checkpoints = CheckpointDir(order, spec);
    const std::optional<PathOwner> recorded = ReadPathOwner(checkpoints);
    const PathOwner checkpoints_owner = recorded.value_or(job_owner);
    struct Ask {
      const char* action;
      std::string kind, id;
      PathOwner of;
    };
    std::vector<Ask> asks = {{"checkpoint.write", "path", checkpoints, checkpoints_owner}};
    if (order.role() != kc::v1::StartOrder::ROLE_SUPERVISOR) {  // a launcher uses no device
      asks.insert(asks.begin(),
                  Ask{"device.use", "device",
                      fmt::format("{}:{}", o.host, fmt::join(order.devices(), ",")), job_owner});
    }
    if (!spec.data.empty()) asks.push_back({"data.read", "path", spec.data, job_owner});
    for (const Ask& a : asks) {
      kc::v1::PermissionCheckRequest req;
      req.set_action(a.action);
      req.mutable_resource()->set_kind(a.kind);
      req.mutable_resource()->set_id(a.id);
      req.mutable_resource()->set_owner(a.of.owner);
      req.mutable_resource()->set_team(a.of.team);
      kc::v1::PermissionCheckResponse resp;
      grpc::ClientContext ctx;
      PrepareCall(as_owner, &ctx, std::chrono::seconds(5));
      const grpc::Status s = stub.Check(&ctx, req, &resp);
      // Only an answer stops a job: a denial, or a token kcd no longer takes. Anything else
      // (kcd restarting, a call cut short, over the rate limit) means it could not be asked.
      if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
          s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
        return PermissionDeniedError(fmt::format("{}: {}", a.action, s.error_message()));
      }
      if (!s.ok()) return UnavailableError(fmt::format("{}: {}", a.action, s.error_message()));
      if (!resp.allowed()) {
        return PermissionDeniedError(fmt::format("{} {}: {}", a.action, a.id, resp.reason()));
      }
    }
    if (!recorded) {
      KC_ASSIGN_OR_RETURN(const PathOwner claimed, ClaimPath(checkpoints, job_owner));
      // Another job's owner recorded it first (another agent on shared storage): ask again.
      if (!(claimed == job_owner)) return ExecutionCheck(order, spec, stub);
    }
    return OkStatus();
  }

  std::string JobDir(int64_t job) const {
    return (fs::path(o.work_dir) / "jobs" / std::to_string(job)).string();
  }
  std::string CheckpointDir(const kc::v1::StartOrder& order, const JobSpec& spec) const {
    return spec.checkpoint_dir.empty() ? (fs::path(JobDir(order.job())) / "checkpoints").string()
                                       : (fs::path(o.work_dir) / spec.checkpoint_dir).string();
  }

  // Each running job's process group, recorded as "PID START_TIME" in WORK/agent/JOB.pid
  // while it runs: an agent killed without its stop (SIGKILL, a crash) leaves them running,
  // and the next agent on this work directory stops them before it registers, so that a job
  // kcd starts again does not run twice on the same devices and checkpoints.
  std::string PidFile(int64_t job) const {
    return (fs::path(o.work_dir) / "agent" / fmt::format("{}.pid", job)).string();
  }
  void RecordProcess(int64_t job, pid_t pid) {
    std::error_code ec;
    fs::create_directories(fs::path(PidFile(job)).parent_path(), ec);
    if (Status s =
            WriteFileDurably(PidFile(job), fmt::format("{} {}\n", pid, ProcessStartTime(pid)));
        !s.ok()) {
      KC_LOG(WARNING) << "agent: job " << job << ": " << s.message();
    }
  }
  void ForgetProcess(int64_t job) {
    std::error_code ec;
    fs::remove(PidFile(job), ec);
  }
  // Stops the process groups a previous agent on this work directory left running.
  void StopLeftovers() {
    std::error_code ec;
    for (const fs::directory_entry& e :
         fs::directory_iterator(fs::path(o.work_dir) / "agent", ec)) {
      if (e.path().extension() != ".pid") continue;
      Result<std::string> text = ReadWholeFile(e.path().string());
      std::istringstream in(text.ok() ? *text : "");
      pid_t pid = -1;
      int64_t start = -1;
      if (in >> pid >> start && pid > 1 && start >= 0 && ProcessStartTime(pid) == start) {
        KC_LOG(WARNING) << "agent: stopping job " << e.path().stem().string()
                        << ", left running by a previous agent (process group " << pid << ")";
        kill(-pid, SIGKILL);
      }
      fs::remove(e.path(), ec);
    }
  }

  // Starts `j`'s processes, or records why it could not. Called without the lock (its checks
  // call kcd, and it forks): `j` is not in `jobs` yet.
  void Launch(Job& j, kc::v1::PermissionService::Stub& stub) {
    auto fail = [&](std::string why) {
      j.ended = true;
      j.end_state = Report::STATE_FAILED_TO_START;
      j.end_reason = std::move(why);
    };
    // The job as kcd checked it at submission: nothing to parse again. Its paths, though,
    // are this host's business: checked here too, so that a job reads and writes only under
    // the roots this agent chose, whatever kcd sent.
    j.spec = JobSpecOf(j.order.train_job());
    for (auto [key, path] : {std::pair{"data", j.spec.data},
                             {"checkpoint_dir", j.spec.checkpoint_dir},
                             {"workdir", j.spec.workdir}}) {
      if (path.empty()) continue;
      if (Status s = CheckRelativePath(key, path); !s.ok()) return fail(std::string(s.message()));
    }
    if (IsReservedCheckpointDir(j.spec.checkpoint_dir)) {
      return fail("checkpoint_dir: " + j.spec.checkpoint_dir + ": the agent's own directory");
    }
    // A train job with min_devices runs at any size in [min_devices, ranks]; others at ranks.
    // A run across hosts: its size is the assignment's, and a share has a device for each rank
    // of this host.
    const kc::v1::StartOrder::Role role = j.order.role();
    const int ranks = role == kc::v1::StartOrder::ROLE_WHOLE ? j.order.devices_size()
                                                             : j.order.assignment().ranks_size();
    // (A command job with min_devices starts at a size in its range too, and keeps it.)
    const bool elastic = j.spec.command.empty() && j.spec.min_devices > 0;
    if (ranks != j.spec.ranks &&
        !(j.spec.min_devices > 0 && ranks >= j.spec.min_devices && ranks <= j.spec.ranks)) {
      return fail(fmt::format("{} devices for {} ranks", ranks, j.spec.ranks));
    }
    std::string hosts;  // a run across hosts: its hosts and their ranks, in rank order
    if (role != kc::v1::StartOrder::ROLE_WHOLE) {
      if (j.order.assignment().rendezvous().empty()) return fail("a run across hosts: no store");
      Result<std::string> h = HostsOfRun(j.order.assignment());
      if (!h.ok()) return fail(std::string(h.status().message()));
      hosts = *h;
      // A share's devices are this host's of the run now: as many as the assignment names
      // here at the start, and as kcd grows the run, the devices it grew onto (the launcher
      // places that many ranks here).
      if (role == kc::v1::StartOrder::ROLE_SHARE && j.order.devices_size() < 1) {
        return fail("a share of a run across hosts with no devices here");
      }
      if (role == kc::v1::StartOrder::ROLE_SHARE) j.line_prefix = fmt::format("[host {}] ", o.host);
    }
    if (Status s = ExecutionCheck(j.order, j.spec, stub); !s.ok()) {
      j.ended = true;
      j.end_state = s.code() == ErrorCode::kUnavailable ? Report::STATE_FAILED_TO_START
                                                        : Report::STATE_REVOKED;
      j.end_reason = std::string(s.message());
      return;
    }
    const std::string dir = JobDir(j.order.job());
    const std::string out = (fs::path(dir) / fmt::format("run-{}", j.order.run())).string();
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) return fail(fmt::format("{}: cannot create: {}", out, ec.message()));
    std::vector<std::string> args;
    std::string working_dir = dir;
    if (!j.spec.command.empty()) {
      // A command job: its program on every rank, with torchrun's launch environment (kc run),
      // counting kcd's requeues as restarts; its checkpoint directory lasts over them.
      if (!j.spec.workdir.empty()) {
        working_dir = (fs::path(o.work_dir) / j.spec.workdir).string();
        fs::create_directories(working_dir, ec);
        if (ec) return fail(fmt::format("{}: cannot create: {}", working_dir, ec.message()));
      }
      // Across hosts, the supervisor agent's kc run starts every rank through each host's
      // share (kc run --share), whose checkpoint directory is its own host's.
      const std::string grace = fmt::format("{}", o.stop_grace_s * 0.8);  // before the kill
      if (role == kc::v1::StartOrder::ROLE_SHARE) {
        args = {o.kc_binary,        "run",
                "--share",          o.host,
                "--rendezvous",     j.order.assignment().rendezvous(),
                "--checkpoint-dir", CheckpointDir(j.order, j.spec),
                "--grace",          grace};
      } else {
        args = {o.kc_binary, "run"};
        if (role == kc::v1::StartOrder::ROLE_SUPERVISOR) {
          args.insert(args.end(),
                      {"--hosts", hosts, "--rendezvous", j.order.assignment().rendezvous()});
        } else {
          args.insert(args.end(), {"--nproc", std::to_string(ranks), "--checkpoint-dir",
                                   CheckpointDir(j.order, j.spec)});
        }
        args.insert(args.end(),
                    {"--run-id", fmt::format("job-{}", j.order.job()), "--restart-offset",
                     std::to_string(j.order.restart()), "--grace", grace});
      }
      if (j.spec.heartbeat_timeout_s > 0 && role != kc::v1::StartOrder::ROLE_SHARE) {
        // Its program touches KC_HEARTBEAT_FILE (kc's torch backend does): a rank that stops
        // is found and the job restarted.
        args.insert(args.end(),
                    {"--heartbeat-timeout", fmt::format("{}", j.spec.heartbeat_timeout_s),
                     "--heartbeat-period", fmt::format("{}", j.spec.heartbeat_period_s)});
      }
      args.push_back("--");
      args.insert(args.end(), j.spec.command.begin(), j.spec.command.end());
    } else {
      // The job unchanged and this run's assignment, in one file the launcher and each of its
      // ranks read (docs/design/job-contract.md); what is this host's (its directories, the
      // files this agent keeps current) on the command line.
      const std::string run_file = (fs::path(out) / "job.binpb").string();
      kc::v1::TrainRun run;
      *run.mutable_job() = j.order.train_job();
      *run.mutable_assignment() = j.order.assignment();
      if (Status s = WriteTrainRun(run_file, run); !s.ok()) return fail(std::string(s.message()));
      args = {o.kc_binary,
              "train",
              "--job",
              run_file,
              "--checkpoint-dir",
              CheckpointDir(j.order, j.spec)};
      if (role == kc::v1::StartOrder::ROLE_SHARE) {
        // This host's ranks; the launcher (on a supervisor agent) reports for the run.
        args.insert(args.end(),
                    {"--share", o.host, "--rendezvous", j.order.assignment().rendezvous()});
      } else {
        j.reports_path = (fs::path(out) / "reports.binpb").string();
        j.out_dir = out;
        args.insert(args.end(), {"--out", out, "--reports", j.reports_path, "--progress", "lines"});
      }
      if (role == kc::v1::StartOrder::ROLE_SUPERVISOR) {
        args.insert(args.end(),
                    {"--hosts", hosts, "--rendezvous", j.order.assignment().rendezvous()});
      }
      if (j.spec.checkpoint_auto && role != kc::v1::StartOrder::ROLE_SHARE) {
        // The interval from the scheduler's advice, which kc train reads again at each of its
        // re-estimates from a file this agent keeps current.
        j.advice_path = (fs::path(out) / "advice.json").string();
        if (Status s = WriteAdvice(j, j.order.advice()); !s.ok())
          return fail(std::string(s.message()));
        args.insert(args.end(), {"--advice-file", j.advice_path});
      }
      // Elastic within [min_devices, max_devices]: the run grows and shrinks as the scheduler
      // decides (a file this agent keeps current with its resize orders), across hosts with
      // the hosts it runs on.
      if (elastic && j.spec.min_devices < j.spec.ranks && role != kc::v1::StartOrder::ROLE_SHARE) {
        j.resize_path = (fs::path(out) / "resize.json").string();
        if (Status s = WriteResize(j.resize_path, ranks, hosts); !s.ok()) {
          return fail(std::string(s.message()));
        }
        args.insert(args.end(), {"--resize-file", j.resize_path});
      }
      {
        // As kc train's own default (data/fortunes/manifest.json), with the data root for data/.
        const fs::path root =
            o.data_root.empty() ? fs::path(o.work_dir) / "data" : fs::path(o.data_root);
        args.insert(
            args.end(),
            {"--data",
             (root / (j.spec.data.empty() ? "fortunes/manifest.json" : j.spec.data)).string()});
      }
    }
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) return fail(fmt::format("pipe: {}", strerror(errno)));
    // A session of its own (setsid), so that its ranks go with it; an empty signal mask (a
    // caller that blocked SIGTERM for sigwait, kc agent or kc up, would leave the job deaf to
    // its stop order until the SIGKILL).
    std::vector<std::pair<std::string, std::string>> env = j.spec.env;
    if (!j.spec.command.empty() && role != kc::v1::StartOrder::ROLE_WHOLE) {
      // kc run across hosts: the run's store takes its clients by this token.
      env.emplace_back("KC_RENDEZVOUS_TOKEN", j.order.assignment().rendezvous_token());
    }
    if (!j.order.cuda_visible_devices().empty()) {
      // The job's GPUs on this host, in rank order: its ranks' LOCAL_RANK indexes them.
      env.emplace_back("CUDA_VISIBLE_DEVICES", j.order.cuda_visible_devices());
    }
    Result<Subprocess> process =
        Subprocess::Start({.path = args[0],
                           .argv = args,
                           .env = env,
                           .working_dir = working_dir,
                           .fds = {{.child = 0, .parent = ChildFd::kDevNull},
                                   {.child = 1, .parent = pipefd[1]},
                                   {.child = 2, .parent = pipefd[1]}},
                           .group = SubprocessOptions::Group::kNewSession});
    close(pipefd[1]);
    if (!process.ok()) {
      close(pipefd[0]);
      return fail(std::string(process.status().message()));
    }
    fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
    const pid_t pid = process->pid();
    j.pid = pid;
    j.process = *std::move(process);
    j.out_fd = pipefd[0];
    RecordProcess(j.order.job(), pid);
    KC_LOG(INFO) << "agent: job " << j.order.job() << " run " << j.order.run() << " started (pid "
                 << pid << ")";
  }

  // The advice as kc train's --advice-file reads it, replaced whole (a reader never sees half).
  Status WriteAdvice(const Job& j, const kc::v1::CheckpointAdvice& advice) {
    const nlohmann::json a = {{"mtbf_s", advice.mtbf_s()}, {"source", advice.source()}};
    const std::string text = a.dump() + "\n";
    return WriteFileAtomically(j.advice_path,
                               std::as_bytes(std::span<const char>(text.data(), text.size())));
  }

  void Signal(Job& j, int sig) {
    if (j.process && !j.ended) j.process->SignalGroup(sig);
  }

  static void AppendLog(Job& j, std::string_view bytes) {
    if (j.line_prefix.empty()) {
      j.log.append(bytes);
      return;
    }
    for (char c : bytes) {
      if (j.at_line_start) j.log += j.line_prefix;
      j.log += c;
      j.at_line_start = c == '\n';
    }
  }

  // Output and progress since the last look; whether it ended.
  void Poll(Job& j) {
    if (j.out_fd >= 0) {
      char buf[16384];
      ssize_t n;
      while ((n = read(j.out_fd, buf, sizeof buf)) > 0) {
        if (j.log.size() < (16u << 20)) AppendLog(j, std::string_view(buf, static_cast<size_t>(n)));
        std::string line = LastLine(std::string(buf, static_cast<size_t>(n)));
        if (!line.empty()) j.last_line = std::move(line);
      }
    }
    // The run's supervisor's reports: progress, checkpoints, faults.
    auto take = [&](const kc::v1::TrainReport& r) {
      if (r.has_step()) {
        j.step = r.step().step();
        j.loss = r.step().loss();
        j.tokens_per_s = r.step().tokens_per_s();
        j.step_s = r.step().step_s();
        j.compute_s = r.step().compute_s();
        j.comm_exposed_s = r.step().comm_exposed_s();
        j.lane_wait_s.assign(r.step().lane_wait_s().begin(), r.step().lane_wait_s().end());
        j.lane_backlog.assign(r.step().lane_backlog().begin(), r.step().lane_backlog().end());
        j.retransmits = r.step().retransmits();
        j.rtt_s = r.step().rtt_s();
      }
      if (r.has_checkpoint())
        j.checkpoint_step = std::max(j.checkpoint_step, r.checkpoint().step());
      // For kcd, which keeps them with the job: every event and checkpoint, and a step a second
      // (the newest of each second replaces the one before it), so that a run of thousands of
      // steps a second costs kcd a few rows a second. A backlog (kcd out of reach) keeps its
      // newest.
      const double now = WallSeconds();
      if (r.has_step() && !j.reports.empty() && j.reports.back().has_step() &&
          now - j.step_relayed_s < kStepRelayPeriodS) {
        j.reports.back() = r;
        return;
      }
      if (r.has_step()) j.step_relayed_s = now;
      if (j.reports.size() >= kMaxReportsKept) j.reports.pop_front();
      j.reports.push_back(r);
    };
    auto read_reports = [&] {
      if (j.reports_path.empty()) return;
      if (Status read = ReadNewReports(j.reports_path, &j.reports_offset, take); !read.ok()) {
        KC_LOG(WARNING) << "agent: job " << j.order.job() << ": " << read.message();
        j.reports_path.clear();  // not followed any further
      }
    };
    read_reports();
    if (!j.process || j.ended) return;
    const std::optional<int> exited = j.process->TryWait();
    if (!exited) return;
    const int status = *exited;
    // Its group may still hold ranks: they go with it.
    j.process->SignalGroup(SIGKILL);
    read_reports();  // what it wrote last (its summary)
    ForgetProcess(j.order.job());
    j.ended = true;
    if (j.end_state == Report::STATE_REVOKED || j.end_state == Report::STATE_FENCED) return;
    j.end_state = Report::STATE_EXITED;
    j.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    j.end_reason =
        WIFEXITED(status) ? j.last_line : fmt::format("killed by signal {}", WTERMSIG(status));
  }

  void Close(Job& j) {
    if (j.out_fd >= 0) close(j.out_fd);
    j.out_fd = -1;
  }

  // The worker thread's round: each job's output and end, kills past the grace period, the
  // execution-time checks that are due, and the starts kcd ordered. Checks and launches are
  // made without the lock. Returns whether it started a job.
  bool Work() KC_REQUIRES(mu) {
    const double now = WallSeconds();
    struct Due {
      int64_t job;
      kc::v1::StartOrder order;
      JobSpec spec;
    };
    std::vector<Due> due;
    for (auto& [id, j] : jobs) {
      Poll(j);
      if (j.stopping && !j.ended && now >= j.kill_at_s) Signal(j, SIGKILL);
      if (!j.ended && !j.stopping && now >= j.next_check_s) {
        j.next_check_s = now + check_period_s;
        due.push_back({id, j.order, j.spec});
      }
    }
    if (!due.empty()) {
      const std::shared_ptr<kc::v1::PermissionService::Stub> stub = permissions;
      std::vector<Status> verdicts;
      mu.Unlock();
      for (const Due& d : due) verdicts.push_back(ExecutionCheck(d.order, d.spec, *stub));
      mu.Lock();
      for (size_t i = 0; i < due.size(); ++i) {
        const Status& s = verdicts[i];
        auto it = jobs.find(due[i].job);
        if (s.ok() || s.code() == ErrorCode::kUnavailable || it == jobs.end()) continue;
        Job& j = it->second;
        if (j.order.run() != due[i].order.run() || j.ended || j.stopping) continue;
        KC_LOG(WARNING) << "agent: job " << due[i].job
                        << ": execution check denied: " << s.message();
        j.end_state = Report::STATE_REVOKED;
        j.end_reason = std::string(s.message());
        j.stopping = true;
        j.kill_at_s = WallSeconds() + o.stop_grace_s;
        Signal(j, SIGTERM);
      }
    }
    bool started = false;
    while (!to_start.empty() && !stopped) {
      Job j;
      j.order = std::move(to_start.front());
      to_start.pop_front();
      const int64_t id = j.order.job();
      launching[id] = j.order.run();
      const std::shared_ptr<kc::v1::PermissionService::Stub> stub = permissions;
      mu.Unlock();
      Launch(j, *stub);
      mu.Lock();
      launching.erase(id);
      j.next_check_s = WallSeconds() + check_period_s;
      Job& placed = jobs[id] = std::move(j);
      started = true;
      if (auto stop = stop_after_launch.find(id); stop != stop_after_launch.end()) {
        StopJob(placed, stop->second);
        stop_after_launch.erase(stop);
      }
      if (auto r = resize_after_launch.find(id); r != resize_after_launch.end()) {
        if (r->second.run() == placed.order.run()) ResizeJob(placed, r->second);
        resize_after_launch.erase(r);
      }
    }
    return started;
  }

  // The scheduler's grow or shrink: the size kc train follows, written whole.
  void ResizeJob(Job& j, const kc::v1::ResizeOrder& r) KC_REQUIRES(mu) {
    if (j.resize_path.empty() || j.ended || j.stopping) return;
    // Across hosts: the devices of every host, as kc train --hosts takes them.
    int ranks = r.devices_size();
    std::vector<std::string> hosts;
    for (const kc::v1::ResizeOrder::Host& h : r.hosts()) {
      if (h.devices() < 1) continue;
      hosts.push_back(fmt::format("{}:{}", h.name(), h.devices()));
      ranks += h.devices();
    }
    KC_LOG(INFO) << "agent: job " << j.order.job() << ": to " << ranks << " device"
                 << (ranks == 1 ? "" : "s")
                 << (hosts.empty() ? "" : fmt::format(" on {}", fmt::join(hosts, ","))) << ": "
                 << r.reason();
    if (Status s = WriteResize(j.resize_path, ranks, fmt::format("{}", fmt::join(hosts, ",")));
        !s.ok()) {
      KC_LOG(WARNING) << "agent: job " << j.order.job() << ": " << s.message();
    }
  }

  // {"ranks": N}, with "hosts": "H:N,..." for a run across hosts.
  static Status WriteResize(const std::string& path, int ranks, const std::string& hosts) {
    nlohmann::json size{{"ranks", ranks}};
    if (!hosts.empty()) size["hosts"] = hosts;
    const std::string text = size.dump() + "\n";
    return WriteFileAtomically(path,
                               std::as_bytes(std::span<const char>(text.data(), text.size())));
  }

  // kcd answered a call made at `at`: the lease runs from there.
  void Contact(std::chrono::steady_clock::time_point at) KC_REQUIRES(mu) {
    last_contact = std::max(last_contact, at);
    if (fenced) KC_LOG(INFO) << "agent: kcd answers again: runs start here again";
    fenced = false;
  }

  // Fencing: once kcd has not answered for the lease, every run here stops (SIGTERM: a
  // checkpoint, then the exit; SIGKILL after the stop grace), and orders not started yet are
  // dropped, so that nothing still runs here when kcd, its lease and our grace later, starts
  // the jobs elsewhere.
  void Fence() KC_REQUIRES(mu) {
    if (lease_s <= 0 || fenced) return;
    const double silent =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - last_contact).count();
    if (silent <= lease_s) return;
    fenced = true;
    const std::string reason =
        fmt::format("no answer from kcd for {:.1f} s, past the {:.0f} s lease", silent, lease_s);
    KC_LOG(WARNING) << "agent: " << reason << ": stopping every run on " << o.host;
    for (auto& [id, j] : jobs) {
      if (j.ended || j.stopping) continue;
      j.end_state = Report::STATE_FENCED;
      j.end_reason = reason;
      StopJob(j, reason);
    }
    std::vector<kc::v1::StartOrder> unstarted(to_start.begin(), to_start.end());
    for (const auto& [id, start] : deferred) unstarted.push_back(start);
    deferred.clear();
    to_start.clear();
    for (const kc::v1::StartOrder& start : unstarted) {
      kc::v1::StopOrder stop;
      stop.set_job(start.job());
      stop.set_run(start.run());
      stop.set_reason(reason);
      NeverStarted(stop);
    }
    for (const auto& [id, run] : launching) stop_after_launch[id] = reason;
  }

  void FenceLoop() {
    MutexLock lock(&mu);
    while (!stopped) {
      Fence();
      const auto until = After(0.1);
      while (!stopped && wake.WaitUntil(&mu, until)) {
      }
    }
  }

  void StopJob(Job& j, const std::string& reason) KC_REQUIRES(mu) {
    KC_LOG(INFO) << "agent: job " << j.order.job() << ": stopping: " << reason;
    j.stopping = true;
    j.kill_at_s = WallSeconds() + o.stop_grace_s;
    Signal(j, SIGTERM);
  }

  // The heartbeat thread's round: registration when needed, then one report of every job to
  // kcd and its orders back: stops carried out at once, starts handed to the worker thread.
  // The calls to kcd are made without the lock.
  void Beat() KC_REQUIRES(mu) {
    if (!registered) {
      Status s = Register();
      if (!s.ok()) {
        KC_LOG(WARNING) << "agent: cannot register: " << s.message();
        if (++failures % 5 == 0) Connect().IgnoreError();  // as for heartbeats, below
        return;
      }
    }
    kc::v1::AgentHeartbeatRequest req;
    req.set_host(o.host);
    std::map<int64_t, size_t> sent_log;
    for (auto& [id, j] : jobs) {
      Report* r = req.add_jobs();
      r->set_job(id);
      r->set_run(j.order.run());
      r->set_step(j.step);
      r->set_checkpoint_step(j.checkpoint_step);
      const size_t n = std::min(j.log.size(), kMaxLogPerReport);
      r->set_log(j.log.substr(0, n));
      sent_log[id] = n;
      const size_t n_reports = std::min(j.reports.size(), kMaxReportsPerHeartbeat);
      for (size_t i = 0; i < n_reports; ++i) *r->add_reports() = j.reports[i];
      if (j.ended && j.log.size() <= n && j.reports.size() <= n_reports) {
        r->set_state(j.end_state);
        r->set_exit_code(j.exit_code);
        r->set_reason(j.end_reason);
      } else {
        r->set_state(Report::STATE_RUNNING);
      }
    }
    const int job_reports = req.jobs_size();  // then the runs that never started
    const size_t never_started_sent = never_started.size();
    for (const Report& r : never_started) *req.add_jobs() = r;
    kc::v1::AgentHeartbeatResponse resp;
    grpc::ClientContext ctx;
    PrepareCall(o.kcd, &ctx, std::chrono::seconds(10));
    const std::shared_ptr<kc::v1::AgentService::Stub> stub = agents;
    const auto called_at = std::chrono::steady_clock::now();
    mu.Unlock();
    const grpc::Status s = stub->Heartbeat(&ctx, req, &resp);
    mu.Lock();
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) registered = false;
      KC_LOG(WARNING) << "agent: heartbeat: " << s.error_message();
      // A channel that keeps failing may be stuck on a dead connection (kcd restarted in the
      // middle of a handshake): a fresh one connects at once.
      if (++failures % 5 == 0) Connect().IgnoreError();  // the same config connected before
      return;
    }
    failures = 0;
    Contact(called_at);
    // Delivered: forget the log and faults sent (the worker thread only appends meanwhile) and
    // the jobs whose end kcd now knows (only this thread removes jobs).
    never_started.erase(never_started.begin(),
                        never_started.begin() + static_cast<std::ptrdiff_t>(never_started_sent));
    for (int i = 0; i < job_reports; ++i) {
      const Report& r = req.jobs(i);
      Job& j = jobs[r.job()];
      j.log.erase(0, sent_log[r.job()]);
      j.reports.erase(j.reports.begin(), j.reports.begin() + r.reports_size());
      if (r.state() != Report::STATE_RUNNING) {
        Close(j);
        jobs.erase(r.job());
      }
    }
    for (const kc::v1::StopOrder& stop : resp.stop()) {
      if (auto d = deferred.find(stop.job());
          d != deferred.end() && d->second.run() == stop.run()) {
        NeverStarted(stop);
        deferred.erase(d);
        continue;
      }
      if (auto q = std::find_if(to_start.begin(), to_start.end(),
                                [&](const kc::v1::StartOrder& start) {
                                  return start.job() == stop.job() && start.run() == stop.run();
                                });
          q != to_start.end()) {
        NeverStarted(stop);
        to_start.erase(q);
        continue;
      }
      if (auto l = launching.find(stop.job()); l != launching.end() && l->second == stop.run()) {
        stop_after_launch[stop.job()] = stop.reason();
        continue;
      }
      auto it = jobs.find(stop.job());
      if (it == jobs.end() || it->second.order.run() != stop.run()) continue;
      StopJob(it->second, stop.reason());
    }
    for (const kc::v1::ResizeOrder& r : resp.resize()) {
      if (auto l = launching.find(r.job()); l != launching.end() && l->second == r.run()) {
        resize_after_launch[r.job()] = r;
        continue;
      }
      if (auto it = jobs.find(r.job()); it != jobs.end() && it->second.order.run() == r.run()) {
        ResizeJob(it->second, r);
      }
    }
    for (const kc::v1::InspectOrder& i : resp.inspect()) {
      auto it = jobs.find(i.job());
      if (it == jobs.end() || it->second.order.run() != i.run() || it->second.ended) {
        continue;  // not running here (any more): the asker hears nothing and says so
      }
      if (it->second.order.role() != kc::v1::StartOrder::ROLE_SUPERVISOR) {
        to_probe.push_back(i);  // its ranks run here
        wake.SignalAll();
      }
      if (it->second.out_dir.empty()) continue;  // a share: its launcher is elsewhere
      if (Status w = WriteInspectRequest(it->second.out_dir, i.request()); !w.ok()) {
        KC_LOG(WARNING) << "agent: job " << i.job() << ": " << w.message();
      }
    }
    for (const kc::v1::CheckpointAdvice& advice : resp.advice()) {
      auto it = jobs.find(advice.job());
      if (it == jobs.end() || it->second.order.run() != advice.run() ||
          it->second.advice_path.empty()) {
        continue;
      }
      if (Status w = WriteAdvice(it->second, advice); !w.ok()) {
        KC_LOG(WARNING) << "agent: job " << advice.job() << ": " << w.message();
      }
    }
    for (auto d = deferred.begin(); d != deferred.end();) {
      if (jobs.count(d->first) != 0) {
        ++d;
        continue;
      }
      to_start.push_back(std::move(d->second));
      d = deferred.erase(d);
    }
    for (const kc::v1::StartOrder& start : resp.start()) {
      if (auto it = jobs.find(start.job()); it != jobs.end()) {
        if (it->second.order.run() == start.run()) {
          KC_LOG(WARNING) << "agent: job " << start.job() << " run " << start.run()
                          << ": already running here";
        } else {
          KC_LOG(INFO) << "agent: job " << start.job() << " run " << start.run()
                       << " starts once run " << it->second.order.run() << " has stopped";
          deferred[start.job()] = start;
        }
        continue;
      }
      to_start.push_back(start);
    }
    if (!to_start.empty()) wake.SignalAll();
  }

  // A start order stopped before it started: its end, for kcd.
  void NeverStarted(const kc::v1::StopOrder& stop) KC_REQUIRES(mu) {
    KC_LOG(INFO) << "agent: job " << stop.job() << " run " << stop.run()
                 << ": stopped before it started: " << stop.reason();
    Report r;
    r.set_job(stop.job());
    r.set_run(stop.run());
    r.set_state(Report::STATE_FAILED_TO_START);
    r.set_reason("stopped before it started");
    never_started.push_back(std::move(r));
  }

  std::chrono::steady_clock::time_point After(double seconds) {
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               std::chrono::duration<double>(seconds));
  }

  // Measures the load of each run JobService.Inspect asked about: its cores, who else runs on
  // them, their rates now (hal::MeasureHostLoad), as a report of the run for kcd.
  void ProbeLoop() {
    MutexLock lock(&mu);
    while (!stopped) {
      if (to_probe.empty()) {
        wake.Wait(&mu);
        continue;
      }
      const kc::v1::InspectOrder i = to_probe.front();
      to_probe.pop_front();
      auto it = jobs.find(i.job());
      if (it == jobs.end() || it->second.order.run() != i.run() || it->second.pid <= 0) continue;
      const int pid = it->second.pid;
      std::vector<std::string> devices;
      for (const auto& r : it->second.order.assignment().ranks()) {
        if (r.host() == o.host) devices.push_back(r.device());
      }
      mu.Unlock();
      const double t0 = WallSeconds();
      Result<hal::HostLoad> load = hal::MeasureHostLoad({.roots = {pid}});
      KC_LOG(INFO) << "agent: job " << i.job() << ": host load measured in "
                   << fmt::format("{:.2f}", WallSeconds() - t0) << " s (request " << i.request()
                   << ")";
      mu.Lock();
      it = jobs.find(i.job());
      if (it == jobs.end() || it->second.order.run() != i.run()) continue;
      if (!load.ok()) {
        KC_LOG(WARNING) << "agent: job " << i.job() << ": host load: " << load.status().message();
        continue;
      }
      kc::v1::TrainReport r;
      r.set_run_id(it->second.order.assignment().run_id());
      *r.mutable_host() = ToHostLoadReport(*load, o.host, i.request());
      for (std::string& d : devices) r.mutable_host()->add_devices(std::move(d));
      it->second.reports.push_back(std::move(r));
      beat_now = true;
      wake.SignalAll();
    }
  }

  void BeatLoop() {
    MutexLock lock(&mu);
    while (!stopped) {
      Beat();
      const auto until = After(registered ? heartbeat_period_s : 1.0);
      while (!stopped && !beat_now && wake.WaitUntil(&mu, until)) {
      }
      beat_now = false;
    }
  }

  void WorkLoop() {
    MutexLock lock(&mu);
    while (!stopped) {
      if (Work()) {
        beat_now = true;  // its start is reported at once, not a heartbeat period later
        wake.SignalAll();
      }
      // Output and ends are looked at every heartbeat period (a report has nothing newer).
      const auto until = After(heartbeat_period_s);
      while (!stopped && to_start.empty() && wake.WaitUntil(&mu, until)) {
      }
    }
    // Stop every job: SIGTERM, then SIGKILL after the grace period. Waiting for a child to
    // exit is polling its status: there is nothing to wait on but time.
    for (auto& [id, j] : jobs) Signal(j, SIGTERM);
    const double kill_at = WallSeconds() + o.stop_grace_s;
    for (auto& [id, j] : jobs) {
      while (j.pid > 0 && !j.ended) {
        Poll(j);
        if (j.ended) break;
        if (WallSeconds() >= kill_at) Signal(j, SIGKILL);
        wake.WaitUntil(&mu, std::chrono::steady_clock::now() + std::chrono::milliseconds(20));
      }
      Close(j);
    }
  }
};

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Agent::~Agent() {
  impl_->metrics.reset();  // it reads the jobs
  {
    MutexLock lock(&impl_->mu);
    impl_->stopped = true;
    impl_->wake.SignalAll();
  }
  if (impl_->beat_thread.joinable()) impl_->beat_thread.join();
  if (impl_->fence_thread.joinable()) impl_->fence_thread.join();
  if (impl_->worker_thread.joinable()) impl_->worker_thread.join();
  if (impl_->probe_thread.joinable()) impl_->probe_thread.join();
}

int Agent::running_jobs() const {
  MutexLock lock(&impl_->mu);
  int n = 0;
  for (const auto& [id, j] : impl_->jobs) n += j.ended ? 0 : 1;
  return n;
}

int Agent::metrics_port() const { return impl_->metrics ? impl_->metrics->port() : 0; }

std::string Agent::metrics_url() const { return impl_->metrics ? impl_->metrics->url() : ""; }

std::string Agent::MetricsText() const { return impl_->Metrics(); }

Result<std::unique_ptr<Agent>> Agent::Start(AgentOptions o) {
  if (o.host.empty()) return InvalidArgumentError("agent: host: must not be empty");
  if (o.supervisor ? o.devices != 0 : o.devices <= 0) {
    return InvalidArgumentError(o.supervisor
                                    ? "agent: devices: a supervisor agent has none (--devices 0)"
                                    : "agent: devices: must be positive");
  }
  if (o.work_dir.empty()) return InvalidArgumentError("agent: work directory: must be set");
  // A job runs in its own directory: every path it is given must not depend on ours.
  std::error_code ec;
  o.work_dir = fs::absolute(o.work_dir, ec).lexically_normal().string();
  if (!o.data_root.empty()) o.data_root = fs::absolute(o.data_root, ec).lexically_normal().string();
  auto impl = std::make_unique<Impl>();
  impl->o = o;
  impl->StopLeftovers();
  {
    MutexLock lock(&impl->mu);
    KC_RETURN_IF_ERROR(impl->Connect());
    Status s = impl->Register();
    if (!s.ok() && s.code() != ErrorCode::kUnavailable &&
        s.code() != ErrorCode::kDeadlineExceeded) {
      return s;
    }
  }
  if (!o.metrics_listen.empty()) {
    KC_ASSIGN_OR_RETURN(impl->metrics, MetricsServer::Start(o.metrics_listen, [p = impl.get()] {
                          return p->Metrics();
                        }));
  }
  impl->worker_thread = std::thread([p = impl.get()] { p->WorkLoop(); });
  impl->beat_thread = std::thread([p = impl.get()] { p->BeatLoop(); });
  impl->fence_thread = std::thread([p = impl.get()] { p->FenceLoop(); });
  impl->probe_thread = std::thread([p = impl.get()] { p->ProbeLoop(); });
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

}  // namespace kc::api
