#include "api/agent.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
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
#include "base/file.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/subprocess.h"
#include "kc/v1/agent.grpc.pb.h"
#include "kc/v1/permission.grpc.pb.h"

namespace kc::api {
namespace {

namespace fs = std::filesystem;
using internal::WallSeconds;
using Report = kc::v1::AgentJobReport;

constexpr size_t kMaxLogPerReport = 64 << 10;

// One job's processes on this host.
struct Job {
  kc::v1::StartOrder order;
  JobSpec spec;
  pid_t pid = -1;                     // the process group's leader (kc train)
  std::optional<Subprocess> process;  // it, killed with its group if the job is dropped
  int out_fd = -1;                    // its stdout and stderr
  std::string log;                    // output not yet delivered to kcd
  std::string last_line;
  std::string metrics_path;
  int64_t metrics_offset = 0;
  std::string advice_path;  // checkpoint_every: auto: the scheduler's advice, for kc train
  std::string faults_path;  // kc train's fault log
  int64_t faults_offset = 0;
  std::vector<std::string> faults;  // its events not yet delivered to kcd
  int64_t step = 0;
  int64_t checkpoint_step = 0;
  double next_check_s = 0;
  bool stopping = false;
  double kill_at_s = 0;
  // Set once it ended, until kcd has the report.
  bool ended = false;
  Report::State end_state = Report::STATE_EXITED;
  int exit_code = 0;
  std::string end_reason;
};

// Calls `f` with each whole line of file `path` past `*offset` (one still being written waits
// for the next call) and moves `*offset` past them. A file not there yet has no lines.
void ReadNewLines(const std::string& path, int64_t* offset,
                  const std::function<void(const std::string&)>& f) {
  if (path.empty()) return;
  std::ifstream in(path);
  if (!in) return;
  in.seekg(*offset);
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a line still being written
    *offset += static_cast<int64_t>(line.size()) + 1;
    f(line);
  }
}

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

}  // namespace

struct Agent::Impl {
  AgentOptions o;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<kc::v1::AgentService::Stub> agents;
  std::unique_ptr<kc::v1::PermissionService::Stub> permissions;

  mutable Mutex mu;
  CondVar wake;
  bool stopped KC_GUARDED_BY(mu) = false;
  std::map<int64_t, Job> jobs KC_GUARDED_BY(mu);  // by job id
  // Start orders for jobs whose previous run here is still stopping (kcd queued the job again
  // and placed it here): each starts once that run has ended and been reported.
  std::map<int64_t, kc::v1::StartOrder> deferred KC_GUARDED_BY(mu);
  // Deferred runs stopped before they started: their ends, for kcd.
  std::vector<Report> never_started KC_GUARDED_BY(mu);
  std::thread thread;

  // Told by kcd at registration.
  double heartbeat_period_s = 0.2;
  double check_period_s = 1;
  bool registered = false;  // only the agent's thread (and Start, before it) touches these
  int failures = 0;         // heartbeats failed in a row

  Status Connect() {
    KC_ASSIGN_OR_RETURN(channel, ConnectToKcd(o.kcd));
    agents = kc::v1::AgentService::NewStub(channel);
    permissions = kc::v1::PermissionService::NewStub(channel);
    return OkStatus();
  }

  Status Register() KC_REQUIRES(mu) {
    kc::v1::RegisterAgentRequest req;
    req.set_host(o.host);
    req.set_devices(o.devices);
    // Every run kcd has not heard the end of, ended ones too: left out, kcd would take one
    // for lost with a previous agent and queue it again before its end is reported.
    for (auto& [id, j] : jobs) {
      Report* r = req.add_jobs();
      r->set_job(id);
      r->set_run(j.order.run());
      r->set_state(Report::STATE_RUNNING);
    }
    for (auto& [id, start] : deferred) {  // kcd's orders, to be carried out
      Report* r = req.add_jobs();
      r->set_job(id);
      r->set_run(start.run());
      r->set_state(Report::STATE_RUNNING);
    }
    kc::v1::RegisterAgentResponse resp;
    grpc::ClientContext ctx;
    PrepareCall(o.kcd, &ctx, std::chrono::seconds(10));
    KC_RETURN_IF_ERROR(FromGrpc(agents->Register(&ctx, req, &resp)));
    heartbeat_period_s = resp.heartbeat_period_s() > 0 ? resp.heartbeat_period_s() : 1;
    check_period_s = resp.check_period_s() > 0 ? resp.check_period_s() : 1;
    registered = true;
    KC_LOG(INFO) << "agent: registered host " << o.host << " with " << o.devices << " devices";
    return OkStatus();
  }

  // The execution-time checks for job `j` with its owner's token. OK, or why it may not go on.
  // kUnavailable when kcd could not be asked (the job goes on meanwhile). Its checkpoint
  // directory is asked about as its recorded owner's; one nobody has written yet is recorded as
  // the job owner's once the checks pass.
  Status ExecutionCheck(const Job& j) {
    ClientConfig as_owner = o.kcd;
    as_owner.token = j.order.token();
    const PathOwner job_owner{.owner = j.order.owner(), .team = j.order.team()};
    const std::string checkpoints = CheckpointDir(j);
    const std::optional<PathOwner> recorded = ReadPathOwner(checkpoints);
    const PathOwner checkpoints_owner = recorded.value_or(job_owner);
    struct Ask {
      const char* action;
      std::string kind, id;
      PathOwner of;
    };
    std::vector<Ask> asks = {
        {"device.use", "device", fmt::format("{}:{}", o.host, fmt::join(j.order.devices(), ",")),
         job_owner},
        {"checkpoint.write", "path", checkpoints, checkpoints_owner}};
    if (!j.spec.data.empty()) asks.push_back({"data.read", "path", j.spec.data, job_owner});
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
      const grpc::Status s = permissions->Check(&ctx, req, &resp);
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
      if (!(claimed == job_owner)) return ExecutionCheck(j);
    }
    return OkStatus();
  }

  std::string JobDir(int64_t job) const {
    return (fs::path(o.work_dir) / "jobs" / std::to_string(job)).string();
  }
  std::string CheckpointDir(const Job& j) const {
    return j.spec.checkpoint_dir.empty()
               ? (fs::path(JobDir(j.order.job())) / "checkpoints").string()
               : (fs::path(o.work_dir) / j.spec.checkpoint_dir).string();
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

  // Starts `j`'s processes, or records why it could not.
  void Launch(Job& j) {
    auto fail = [&](std::string why) {
      j.ended = true;
      j.end_state = Report::STATE_FAILED_TO_START;
      j.end_reason = std::move(why);
    };
    Result<JobSpec> spec = ParseJobSpec(j.order.spec(), fmt::format("job {} spec", j.order.job()));
    if (!spec.ok()) return fail(std::string(spec.status().message()));
    j.spec = *std::move(spec);
    if (static_cast<int>(j.order.devices_size()) != j.spec.ranks) {
      return fail(fmt::format("{} devices for {} ranks", j.order.devices_size(), j.spec.ranks));
    }
    if (Status s = ExecutionCheck(j); !s.ok()) {
      j.ended = true;
      j.end_state = s.code() == ErrorCode::kUnavailable ? Report::STATE_FAILED_TO_START
                                                        : Report::STATE_REVOKED;
      j.end_reason = std::string(s.message());
      return;
    }
    j.next_check_s = WallSeconds() + check_period_s;
    const std::string dir = JobDir(j.order.job());
    const std::string out = (fs::path(dir) / fmt::format("run-{}", j.order.run())).string();
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) return fail(fmt::format("{}: cannot create: {}", out, ec.message()));
    const std::string model = (fs::path(dir) / "model.yaml").string();
    if (Status s = WriteFileDurably(model, j.spec.model_yaml); !s.ok()) {
      return fail(std::string(s.message()));
    }
    std::vector<std::string> args = {o.kc_binary,
                                     "train",
                                     model,
                                     "--ranks",
                                     std::to_string(j.spec.ranks),
                                     "--steps",
                                     std::to_string(j.spec.steps),
                                     "--out",
                                     out,
                                     "--checkpoint-dir",
                                     CheckpointDir(j),
                                     "--progress",
                                     "lines"};
    if (j.spec.checkpoint_auto) {
      // The interval from the scheduler's advice, which kc train reads again at each of its
      // re-estimates from a file this agent keeps current.
      j.advice_path = (fs::path(out) / "advice.json").string();
      if (Status s = WriteAdvice(j, j.order.advice()); !s.ok())
        return fail(std::string(s.message()));
      args.insert(args.end(), {"--checkpoint-every", "auto", "--advice-file", j.advice_path});
    } else if (j.spec.checkpoint_every > 0) {
      args.insert(args.end(), {"--checkpoint-every", std::to_string(j.spec.checkpoint_every)});
    }
    // The plan kcd decided or the job file gave, as it is: what every rank runs.
    if (!j.spec.plan.empty()) args.insert(args.end(), {"--plan", j.spec.plan});
    // Elastic within [min_devices, ranks]: the survivors of a loss go on, and a replacement
    // starts on the lost rank's device for each loss.
    if (j.spec.min_devices > 0 && j.spec.min_devices < j.spec.ranks) {
      args.insert(args.end(), {"--min-ranks", std::to_string(j.spec.min_devices), "--max-restarts",
                               std::to_string(j.spec.ranks)});
    }
    if (j.spec.global_batch > 0) {
      args.insert(args.end(), {"--global-batch", std::to_string(j.spec.global_batch)});
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
    j.metrics_path = (fs::path(out) / "metrics.jsonl").string();
    j.faults_path = (fs::path(out) / "faults.jsonl").string();
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) return fail(fmt::format("pipe: {}", strerror(errno)));
    // A session of its own (setsid), so that its ranks go with it; an empty signal mask (a
    // caller that blocked SIGTERM for sigwait, kc agent or kc up, would leave the job deaf to
    // its stop order until the SIGKILL).
    Result<Subprocess> process =
        Subprocess::Start({.path = args[0],
                           .argv = args,
                           .working_dir = dir,
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

  // Output and progress since the last look; whether it ended.
  void Poll(Job& j) {
    if (j.out_fd >= 0) {
      char buf[16384];
      ssize_t n;
      while ((n = read(j.out_fd, buf, sizeof buf)) > 0) {
        if (j.log.size() < (16u << 20)) j.log.append(buf, static_cast<size_t>(n));
        std::string line = LastLine(std::string(buf, static_cast<size_t>(n)));
        if (!line.empty()) j.last_line = std::move(line);
      }
    }
    ReadNewLines(j.metrics_path, &j.metrics_offset, [&](const std::string& line) {
      nlohmann::json m = nlohmann::json::parse(line, nullptr, false);
      if (!m.is_object()) return;
      const std::string type = m.value("type", "");
      if (type == "step") j.step = m.value("step", j.step);
      if (type == "checkpoint") j.checkpoint_step = m.value("step", j.checkpoint_step);
      if (type == "done") {  // its checkpoint already held every step asked for
        j.step = m.value("step", j.step);
        j.checkpoint_step = m.value("checkpoint_step", j.checkpoint_step);
      }
    });
    ReadNewLines(j.faults_path, &j.faults_offset, [&](const std::string& line) {
      if (j.faults.size() < 1000) j.faults.push_back(line);  // a storm is cut, not kept whole
    });
    if (!j.process || j.ended) return;
    const std::optional<int> exited = j.process->TryWait();
    if (!exited) return;
    const int status = *exited;
    // Its group may still hold ranks: they go with it.
    j.process->SignalGroup(SIGKILL);
    ForgetProcess(j.order.job());
    j.ended = true;
    if (j.end_state == Report::STATE_REVOKED) return;
    j.end_state = Report::STATE_EXITED;
    j.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    j.end_reason =
        WIFEXITED(status) ? j.last_line : fmt::format("killed by signal {}", WTERMSIG(status));
  }

  void Close(Job& j) {
    if (j.out_fd >= 0) close(j.out_fd);
    j.out_fd = -1;
  }

  // One round: look at the jobs, check their rights, report, obey. Returns whether it started
  // a job (whose start is then reported at once, not a heartbeat period later).
  bool Round() KC_REQUIRES(mu) {
    const double now = WallSeconds();
    for (auto& [id, j] : jobs) {
      Poll(j);
      if (j.stopping && !j.ended && now >= j.kill_at_s) Signal(j, SIGKILL);
      if (!j.ended && !j.stopping && now >= j.next_check_s) {
        j.next_check_s = now + check_period_s;
        if (Status s = ExecutionCheck(j); !s.ok() && s.code() != ErrorCode::kUnavailable) {
          KC_LOG(WARNING) << "agent: job " << id << ": execution check denied: " << s.message();
          j.end_state = Report::STATE_REVOKED;
          j.end_reason = std::string(s.message());
          j.stopping = true;
          j.kill_at_s = now + o.stop_grace_s;
          Signal(j, SIGTERM);
        }
      }
    }
    if (!registered) {
      Status s = Register();
      if (!s.ok()) {
        KC_LOG(WARNING) << "agent: cannot register: " << s.message();
        if (++failures % 5 == 0) Connect().IgnoreError();  // as for heartbeats, below
        return false;
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
      for (const std::string& f : j.faults) r->add_faults(f);
      if (j.ended && j.log.size() <= n) {
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
    const grpc::Status s = agents->Heartbeat(&ctx, req, &resp);
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) registered = false;
      KC_LOG(WARNING) << "agent: heartbeat: " << s.error_message();
      // A channel that keeps failing may be stuck on a dead connection (kcd restarted in the
      // middle of a handshake): a fresh one connects at once.
      if (++failures % 5 == 0) Connect().IgnoreError();  // the same config connected before
      return false;
    }
    failures = 0;
    // Delivered: forget the log sent and the jobs whose end kcd now knows.
    never_started.erase(never_started.begin(),
                        never_started.begin() + static_cast<std::ptrdiff_t>(never_started_sent));
    for (int i = 0; i < job_reports; ++i) {
      const Report& r = req.jobs(i);
      Job& j = jobs[r.job()];
      j.log.erase(0, sent_log[r.job()]);
      j.faults.erase(j.faults.begin(), j.faults.begin() + r.faults_size());
      if (r.state() != Report::STATE_RUNNING) {
        Close(j);
        jobs.erase(r.job());
      }
    }
    for (const kc::v1::StopOrder& stop : resp.stop()) {
      if (auto d = deferred.find(stop.job());
          d != deferred.end() && d->second.run() == stop.run()) {
        KC_LOG(INFO) << "agent: job " << stop.job() << " run " << stop.run()
                     << ": stopped before it started: " << stop.reason();
        Report r;
        r.set_job(stop.job());
        r.set_run(stop.run());
        r.set_state(Report::STATE_FAILED_TO_START);
        r.set_reason("stopped before it started");
        never_started.push_back(std::move(r));
        deferred.erase(d);
        continue;
      }
      auto it = jobs.find(stop.job());
      if (it == jobs.end() || it->second.order.run() != stop.run()) continue;
      KC_LOG(INFO) << "agent: job " << stop.job() << ": stopping: " << stop.reason();
      it->second.stopping = true;
      it->second.kill_at_s = now + o.stop_grace_s;
      Signal(it->second, SIGTERM);
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
    bool started = false;
    for (auto d = deferred.begin(); d != deferred.end();) {
      if (jobs.count(d->first) != 0) {
        ++d;
        continue;
      }
      Job& j = jobs[d->first];
      j.order = std::move(d->second);
      Launch(j);
      started = true;
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
      Job& j = jobs[start.job()];
      j.order = start;
      Launch(j);
      started = true;
    }
    return started;
  }

  void Loop() {
    MutexLock lock(&mu);
    while (!stopped) {
      if (Round()) continue;
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(registered ? heartbeat_period_s : 1.0));
      while (!stopped && wake.WaitUntil(&mu, until)) {
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
  {
    MutexLock lock(&impl_->mu);
    impl_->stopped = true;
    impl_->wake.SignalAll();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

int Agent::running_jobs() const {
  MutexLock lock(&impl_->mu);
  int n = 0;
  for (const auto& [id, j] : impl_->jobs) n += j.ended ? 0 : 1;
  return n;
}

Result<std::unique_ptr<Agent>> Agent::Start(AgentOptions o) {
  if (o.host.empty()) return InvalidArgumentError("agent: host: must not be empty");
  if (o.devices <= 0) return InvalidArgumentError("agent: devices: must be positive");
  if (o.work_dir.empty()) return InvalidArgumentError("agent: work directory: must be set");
  // A job runs in its own directory: every path it is given must not depend on ours.
  std::error_code ec;
  o.work_dir = fs::absolute(o.work_dir, ec).lexically_normal().string();
  if (!o.data_root.empty()) o.data_root = fs::absolute(o.data_root, ec).lexically_normal().string();
  auto impl = std::make_unique<Impl>();
  impl->o = o;
  impl->StopLeftovers();
  KC_RETURN_IF_ERROR(impl->Connect());
  {
    MutexLock lock(&impl->mu);
    Status s = impl->Register();
    if (!s.ok() && s.code() != ErrorCode::kUnavailable &&
        s.code() != ErrorCode::kDeadlineExceeded) {
      return s;
    }
  }
  impl->thread = std::thread([p = impl.get()] { p->Loop(); });
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

}  // namespace kc::api
