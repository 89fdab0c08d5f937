// `kc login`, `kc submit`, `kc jobs`, `kc job ...`, `kc agent`, `kc up`.
#include "apps/kc/cluster_commands.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "api/agent.h"
#include "api/audit_log.h"
#include "api/client.h"
#include "api/control_plane.h"
#include "api/roles_file.h"
#include "api/rpc_guard.h"
#include "api/tokens.h"
#include "api/train_job.h"
#include "apps/kc/kcd_client.h"
#include "base/file.h"
#include "hal/cpu_devices.h"
#include "hal/host_probe.h"
#include "hal/inventory.h"
#include "hal/measure.h"
#include "kc/v1/jobs.grpc.pb.h"
#include "kc/v1/permission.grpc.pb.h"
#include "kc/v1/plans.grpc.pb.h"

namespace kc::app {
namespace {

namespace fs = std::filesystem;

std::string Age(double since_s) {
  const double s = static_cast<double>(std::time(nullptr)) - since_s;
  if (s < 120) return fmt::format("{:.0f}s", std::max(0.0, s));
  if (s < 7200) return fmt::format("{:.0f}m", s / 60);
  if (s < 172800) return fmt::format("{:.0f}h", s / 3600);
  return fmt::format("{:.0f}d", s / 86400);
}

void PrintJob(const kc::v1::JobInfo& j) {
  const auto P = Printable;
  std::cout << fmt::format("job {}: {}\n", j.id(), P(j.name()));
  std::cout << fmt::format("  owner      {}{}\n", P(j.owner()),
                           j.team().empty() ? "" : " (team " + P(j.team()) + ")");
  std::cout << fmt::format("  phase      {}: {}\n", P(j.phase()), P(j.reason()));
  std::cout << fmt::format("  devices    {}{}\n", j.devices(),
                           j.host().empty() ? "" : " on " + P(j.host()));
  std::cout << fmt::format("  progress   step {}, last checkpoint at step {}\n", j.step(),
                           j.checkpoint_step());
  std::cout << fmt::format("  runtime    {:.2f} h allowed\n", j.expected_hours());
  if (!j.comm_limits().empty()) {
    std::cout << fmt::format("  comm       {}\n", P(j.comm_limits()));
  }
  if (j.history_size() > 0) {
    std::cout << "  history\n";
    const double t0 = j.history(0).time_s();
    for (const kc::v1::JobEvent& e : j.history()) {
      std::cout << fmt::format("    +{:>8.3f} s  {:<18} {}\n", e.time_s() - t0, P(e.phase()),
                               P(e.reason()));
    }
  }
}

void PrintPlan(const kc::v1::PlanInfo& p) {
  const auto P = Printable;
  std::cout << fmt::format("job {}: {}\n", p.job(),
                           p.summary().empty() ? "no plan" : P(p.summary()));
  if (p.approval_required()) {
    std::cout << "  approval required:\n";
    for (const std::string& r : p.reasons()) std::cout << "    " << P(r) << "\n";
  }
  if (!p.decision().empty()) {
    std::cout << fmt::format("  {} by {}{}\n", P(p.decision()), P(p.decided_by()),
                             p.note().empty() ? "" : ": " + P(p.note()));
  }
  if (!p.plan_yaml().empty()) std::cout << "  plan\n" << p.plan_yaml();
}

bool Ended(const std::string& phase) {
  return phase == "succeeded" || phase == "failed" || phase == "cancelled";
}

// Polls job `id` until it ends (or, with `until_running`, runs); prints each change of phase.
// Polling a remote phase: there is nothing local to wait on.
Result<kc::v1::JobInfo> Follow(Session& s, int64_t id, double timeout_s, bool quiet) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  std::string last;
  while (true) {
    kc::v1::GetJobRequest req;
    req.set_id(id);
    kc::v1::JobInfo j;
    KC_RETURN_IF_ERROR(s.Call(&kc::v1::JobService::Stub::Get, req, &j));
    if (!quiet && j.phase() != last) {
      std::cerr << fmt::format("job {}: {}: {}\n", id, Printable(j.phase()), Printable(j.reason()));
      last = j.phase();
    }
    if (Ended(j.phase())) return j;
    if (timeout_s > 0 && std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceededError(
          fmt::format("job {}: still {} after {} s", id, j.phase(), timeout_s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void AddLogin(CLI::App& app, Action* action) {
  CLI::App* c = app.add_subcommand("login", "Keep kcd's address, its CA and a token for kc");
  struct Args {
    std::string server = "localhost:7470", ca, token, token_file, login;
    bool insecure = false;
  };
  auto a = std::make_shared<Args>();
  c->add_option("--server", a->server, "kcd's address (default localhost:7470)");
  c->add_option("--ca", a->ca, "The cluster's CA certificate (DIR/tls/ca.pem of kc init)");
  c->add_option("--token", a->token, "Your bearer token");
  c->add_option("--token-file", a->token_file, "A file holding it (e.g. DIR/admin.token)");
  c->add_flag("--insecure-loopback", a->insecure, "Plaintext, to a kcd on loopback only");
  c->add_option("--login", a->login, "Where to keep it (default CONFIG/kc/login.json)");
  c->callback([action, a] {
    *action = [a] {
      api::ClientConfig cfg{.server = a->server, .insecure = a->insecure};
      if (!a->ca.empty()) {
        Result<std::string> ca = ReadWholeFile(a->ca);
        if (!ca.ok()) return Fail("login: --ca", ca.status());
        cfg.ca_pem = *ca;
      }
      cfg.token = a->token;
      if (!a->token_file.empty()) {
        Result<std::string> t = ReadWholeFile(a->token_file);
        if (!t.ok()) return Fail("login: --token-file", t.status());
        cfg.token = t->substr(0, t->find_last_not_of(" \n\r\t") + 1);
      }
      if (cfg.token.empty())
        return Fail("login", InvalidArgumentError("--token or --token-file: required"));
      // Proves the token before keeping it: who does kcd say this is?
      Result<std::shared_ptr<grpc::Channel>> ch = api::ConnectToKcd(cfg);
      if (!ch.ok()) return Fail("login", ch.status());
      auto stub = kc::v1::PermissionService::NewStub(*ch);
      kc::v1::PermissionCheckRequest req;
      req.set_action("job.list");
      req.mutable_resource()->set_kind("job");
      kc::v1::PermissionCheckResponse resp;
      grpc::ClientContext ctx;
      api::PrepareCall(cfg, &ctx, std::chrono::seconds(10));
      if (Status s = api::FromGrpc(stub->Check(&ctx, req, &resp)); !s.ok()) {
        return Fail(fmt::format("login to {}", cfg.server), s);
      }
      const std::string path = LoginPath(a->login);
      if (Status s = api::SaveClientConfig(path, cfg); !s.ok()) return Fail("login", s);
      std::cout << fmt::format("logged in to {} as {} ({}); kept in {}\n", cfg.server,
                               resp.principal(), resp.role(), path);
      return kExitOk;
    };
  });
}

void AddSubmit(CLI::App& app, Action* action) {
  CLI::App* c = app.add_subcommand("submit", "Submit a job file to kcd");
  struct Args {
    std::string file, name, team, login;
    bool wait = false, json = false;
    double timeout_s = 0;
  };
  auto a = std::make_shared<Args>();
  c->add_option("job", a->file, "Job file (YAML), e.g. examples/jobs/gpt-tiny.yaml")->required();
  c->add_option("--name", a->name, "Instead of the file's name");
  c->add_option("--team", a->team, "Instead of the file's team");
  c->add_flag("--wait", a->wait, "Follow the job until it ends; exit 0 only if it succeeded");
  c->add_option("--timeout", a->timeout_s, "With --wait: give up after this many seconds");
  c->add_flag("--json", a->json, "Print the job as JSON");
  c->add_option("--login", a->login, "Login file (default CONFIG/kc/login.json)");
  c->callback([action, a] {
    *action = [a]() -> int {
      Result<api::JobSpec> spec = api::LoadJobFile(a->file);
      if (!spec.ok()) return Fail("submit", spec.status());
      if (!a->name.empty()) spec->name = a->name;
      if (!a->team.empty()) spec->team = a->team;
      Result<Session> s = Session::Open(a->login);
      if (!s.ok()) return Fail("submit", s.status());
      kc::v1::SubmitJobRequest req;
      req.set_name(spec->name);
      req.set_team(spec->team);
      *req.mutable_job() = api::ToTrainJob(*spec);  // the job file, read once
      req.set_devices(spec->ranks);
      req.set_expected_hours(spec->expected_hours);
      req.set_storage_gb(spec->storage_gb);
      kc::v1::JobInfo j;
      if (Status st = s->Call(&kc::v1::JobService::Stub::Submit, req, &j); !st.ok()) {
        return Fail("submit", st);
      }
      if (!a->json)
        std::cout << fmt::format("submitted job {} ({}): {}\n", j.id(), Printable(j.name()),
                                 Printable(j.phase()));
      if (a->wait) {
        Result<kc::v1::JobInfo> end = Follow(*s, j.id(), a->timeout_s, a->json);
        if (!end.ok()) return Fail("submit --wait", end.status());
        j = *end;
      }
      if (a->json) std::cout << ToJson(j) << "\n";
      return !a->wait || j.phase() == "succeeded" ? kExitOk : kExitFailure;
    };
  });
}

void AddJobs(CLI::App& app, Action* action) {
  CLI::App* c = app.add_subcommand("jobs", "List the jobs you may see");
  struct Args {
    std::string phase, login;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  c->add_option("--phase", a->phase, "Only jobs in this phase (running, queued, ...)");
  c->add_flag("--json", a->json, "Print JSON");
  c->add_option("--login", a->login, "Login file (default CONFIG/kc/login.json)");
  c->callback([action, a] {
    *action = [a]() -> int {
      Result<Session> s = Session::Open(a->login);
      if (!s.ok()) return Fail("jobs", s.status());
      kc::v1::ListJobsRequest req;
      req.set_phase(a->phase);
      kc::v1::ListJobsResponse resp;
      if (Status st = s->Call(&kc::v1::JobService::Stub::List, req, &resp); !st.ok()) {
        return Fail("jobs", st);
      }
      if (a->json) {
        std::cout << ToJson(resp) << "\n";
        return kExitOk;
      }
      std::cout << fmt::format("{:>5}  {:<16} {:<10} {:<10} {:<17} {:>7} {:>5}  {}\n", "ID", "NAME",
                               "OWNER", "TEAM", "PHASE", "DEVICES", "AGE", "REASON");
      for (const kc::v1::JobInfo& j : resp.jobs()) {
        std::cout << fmt::format("{:>5}  {:<16} {:<10} {:<10} {:<17} {:>7} {:>5}  {}\n", j.id(),
                                 Printable(j.name()), Printable(j.owner()),
                                 j.team().empty() ? "-" : Printable(j.team()), Printable(j.phase()),
                                 j.devices(), Age(j.submitted_s()), Printable(j.reason()));
      }
      return kExitOk;
    };
  });
}

void AddJob(CLI::App& app, Action* action) {
  CLI::App* job = app.add_subcommand("job", "Show, follow or change one job");
  job->require_subcommand(1);
  struct Args {
    int64_t id = 0;
    std::string login, reason, name;
    bool json = false, follow = false;
    double timeout_s = 0, hours = -1;
  };
  auto add = [&](const char* name, const char* help) {
    auto a = std::make_shared<Args>();
    CLI::App* c = job->add_subcommand(name, help);
    c->add_option("id", a->id, "The job's id")->required();
    c->add_option("--login", a->login, "Login file (default CONFIG/kc/login.json)");
    return std::pair{c, a};
  };
  {
    auto added = add("show", "A job's phase, progress and history");
    CLI::App* c = added.first;
    std::shared_ptr<Args> a = added.second;
    c->add_flag("--json", a->json, "Print JSON");
    c->callback([action, a] {
      *action = [a]() -> int {
        Result<Session> s = Session::Open(a->login);
        if (!s.ok()) return Fail("job show", s.status());
        kc::v1::GetJobRequest req;
        req.set_id(a->id);
        kc::v1::JobInfo j;
        if (Status st = s->Call(&kc::v1::JobService::Stub::Get, req, &j); !st.ok()) {
          return Fail("job show", st);
        }
        if (a->json) {
          std::cout << ToJson(j) << "\n";
        } else {
          PrintJob(j);
        }
        return kExitOk;
      };
    });
  }
  {
    auto added = add("plan", "The parallel layout kcd planned for a job, and its approval");
    CLI::App* c = added.first;
    std::shared_ptr<Args> a = added.second;
    c->add_flag("--json", a->json, "Print JSON");
    c->callback([action, a] {
      *action = [a]() -> int {
        kc::v1::GetPlanRequest req;
        req.set_job(a->id);
        return CallAndPrint("job plan", a->login, a->json, &kc::v1::PlanService::Stub::Get, req,
                            PrintPlan);
      };
    });
  }
  // A resource admin's decision on a plan waiting for approval.
  for (const bool approve : {true, false}) {
    auto added = add(approve ? "approve" : "deny",
                     approve ? "Approve a job's plan: the job goes to the queue (resource admins)"
                             : "Deny a job's plan: the job is cancelled (resource admins)");
    CLI::App* c = added.first;
    std::shared_ptr<Args> a = added.second;
    CLI::Option* note = c->add_option("--note,--reason", a->reason,
                                      "Why, for the submitter and "
                                      "the audit log");
    if (!approve) note->required();
    c->add_flag("--json", a->json, "Print the plan as JSON");
    c->callback([action, a, approve] {
      *action = [a, approve]() -> int {
        kc::v1::DecidePlanRequest req;
        req.set_job(a->id);
        req.set_note(a->reason);
        return CallAndPrint(
            approve ? "job approve" : "job deny", a->login, a->json,
            approve ? &kc::v1::PlanService::Stub::Approve : &kc::v1::PlanService::Stub::Deny, req,
            PrintPlan);
      };
    });
  }
  {
    auto added = add("wait", "Wait until a job ends; exit 0 only if it succeeded");
    CLI::App* c = added.first;
    std::shared_ptr<Args> a = added.second;
    c->add_option("--timeout", a->timeout_s, "Give up after this many seconds (exit 1)");
    c->add_flag("--json", a->json, "Print the ended job as JSON");
    c->callback([action, a] {
      *action = [a]() -> int {
        Result<Session> s = Session::Open(a->login);
        if (!s.ok()) return Fail("job wait", s.status());
        Result<kc::v1::JobInfo> j = Follow(*s, a->id, a->timeout_s, a->json);
        if (!j.ok()) return Fail("job wait", j.status());
        if (a->json) std::cout << ToJson(*j) << "\n";
        return j->phase() == "succeeded" ? kExitOk : kExitFailure;
      };
    });
  }
  {
    auto added = add("logs", "The output of a job's processes");
    CLI::App* c = added.first;
    std::shared_ptr<Args> a = added.second;
    c->add_flag("-f,--follow", a->follow, "Keep printing until the job ends");
    c->callback([action, a] {
      *action = [a]() -> int {
        Result<Session> s = Session::Open(a->login);
        if (!s.ok()) return Fail("job logs", s.status());
        int64_t offset = 0;
        while (true) {
          kc::v1::JobLogsRequest req;
          req.set_id(a->id);
          req.set_offset(offset);
          kc::v1::JobLogsResponse resp;
          if (Status st = s->Call(&kc::v1::JobService::Stub::Logs, req, &resp); !st.ok()) {
            return Fail("job logs", st);
          }
          if (resp.from_offset() > offset) {
            std::cerr << fmt::format(
                "kc: job logs: {} bytes of its output before this were "
                "dropped (kcd keeps each job's newest)\n",
                resp.from_offset() - offset);
          }
          std::cout << resp.data() << std::flush;
          offset = resp.next_offset();
          if (!a->follow || resp.complete()) return kExitOk;
          if (resp.data().empty()) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }
      };
    });
  }
  // The changes: each prints the job after it.
  auto change = [&](const char* name, const char* help, auto call) {
    auto added = add(name, help);
    CLI::App* c = added.first;
    std::shared_ptr<Args> a = added.second;
    if (std::string_view(name) != "resume" && std::string_view(name) != "modify") {
      c->add_option("--reason", a->reason, "Why, for the record");
    }
    if (std::string_view(name) == "modify") {
      c->add_option("--name", a->name, "A new name");
      c->add_option("--expected-hours", a->hours, "The runtime it is allowed, in hours")
          ->check(CLI::NonNegativeNumber);
    }
    c->callback([action, a, call, name] {
      *action = [a, call, name]() -> int {
        Result<Session> s = Session::Open(a->login);
        if (!s.ok()) return Fail(fmt::format("job {}", name), s.status());
        kc::v1::JobInfo j;
        if (Status st = call(*s, *a, &j); !st.ok()) return Fail(fmt::format("job {}", name), st);
        std::cout << fmt::format("job {} ({}): {}: {}\n", j.id(), Printable(j.name()),
                                 Printable(j.phase()), Printable(j.reason()));
        return kExitOk;
      };
    });
  };
  change("cancel", "Cancel a job", [](Session& s, const Args& a, kc::v1::JobInfo* j) {
    kc::v1::CancelJobRequest req;
    req.set_id(a.id);
    req.set_reason(a.reason);
    return s.Call(&kc::v1::JobService::Stub::Cancel, req, j);
  });
  change("pause", "Stop a job with a checkpoint of its last step, and free its devices",
         [](Session& s, const Args& a, kc::v1::JobInfo* j) {
           kc::v1::PauseJobRequest req;
           req.set_id(a.id);
           req.set_reason(a.reason);
           return s.Call(&kc::v1::JobService::Stub::Pause, req, j);
         });
  change("resume", "Queue a paused job again; it resumes from its last checkpoint",
         [](Session& s, const Args& a, kc::v1::JobInfo* j) {
           kc::v1::ResumeJobRequest req;
           req.set_id(a.id);
           return s.Call(&kc::v1::JobService::Stub::Resume, req, j);
         });
  change("modify", "Rename a job or change the runtime it is allowed",
         [](Session& s, const Args& a, kc::v1::JobInfo* j) {
           kc::v1::ModifyJobRequest req;
           req.set_id(a.id);
           req.set_name(a.name);
           req.set_expected_hours(a.hours);
           return s.Call(&kc::v1::JobService::Stub::Modify, req, j);
         });
}

// Blocks SIGINT and SIGTERM (before any thread starts, so only sigwait sees them) and returns
// the set to wait on.
sigset_t BlockStopSignals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return stop;
}

std::string SelfPath() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "kc" : p.string();
}

void AddAgent(CLI::App& app, Action* action) {
  CLI::App* c = app.add_subcommand(
      "agent", "Run this host's agent: register its devices with kcd and run the jobs it gets");
  auto o = std::make_shared<api::AgentOptions>();
  auto login = std::make_shared<std::string>();
  c->add_option("--host", o->host,
                "This host's name in the cluster's topology (default: hostname)");
  c->add_option("--devices", o->devices, "Devices on this host, as the topology lists them")
      ->required();
  c->add_flag("--supervisor", o->supervisor, "Run launchers of jobs across hosts (--devices 0)");
  c->add_option("--work", o->work_dir, "Jobs' directories and checkpoints")->required();
  c->add_option("--data-root", o->data_root,
                "What jobs' data paths are relative to (default WORK/data)");
  c->add_option("--metrics-listen", o->metrics_listen,
                "Serve its jobs' Prometheus metrics (GET /metrics, plaintext) on HOST:PORT (port "
                "0: any); default: none");
  c->add_option("--stop-grace", o->stop_grace_s,
                "Seconds a stopped job has to save its checkpoint before SIGKILL (default 30)")
      ->check(CLI::PositiveNumber);
  c->add_option("--login", *login,
                "Login file with kcd's address and CA (default CONFIG/kc/login.json)");
  auto token_file = std::make_shared<std::string>();
  c->add_option("--token-file", *token_file,
                "This host's agent token (kc token issue --agent HOST --out FILE on kcd's "
                "host), instead of the login's token")
      ->required();
  c->callback([action, o, login, token_file] {
    *action = [o, login, token_file]() -> int {
      Result<api::ClientConfig> cfg = api::LoadClientConfig(LoginPath(*login));
      if (!cfg.ok()) return Fail("agent", cfg.status());
      Result<std::string> token = ReadWholeFile(*token_file);
      if (!token.ok()) return Fail("agent: --token-file", token.status());
      cfg->token = token->substr(0, token->find_last_not_of(" \n\r\t") + 1);
      o->kcd = *cfg;
      if (o->host.empty()) {
        char name[256] = {};
        gethostname(name, sizeof name - 1);
        o->host = name;
      }
      o->kc_binary = SelfPath();
      const sigset_t stop = BlockStopSignals();
      Result<std::unique_ptr<api::Agent>> agent = api::Agent::Start(*o);
      if (!agent.ok()) return Fail("agent", agent.status());
      std::cout << fmt::format("kc agent: host {} with {} devices, reporting to {}\n", o->host,
                               o->devices, o->kcd.server);
      if (const std::string url = (*agent)->metrics_url(); !url.empty()) {
        std::cout << "kc agent: metrics on " << url << "\n";
      }
      std::cout << std::flush;
      int sig = 0;
      sigwait(&stop, &sig);
      agent->reset();
      std::cout << fmt::format("kc agent: stopped (signal {})\n", sig);
      return kExitOk;
    };
  });
}

// A new agent token for `host` in the cluster directory `dir`, its earlier ones revoked.
Result<std::string> IssueAgentToken(const std::string& dir, const std::string& host) {
  KC_ASSIGN_OR_RETURN(std::unique_ptr<api::TokenStore> tokens,
                      api::TokenStore::Open((fs::path(dir) / "kcd.db").string()));
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  KC_RETURN_IF_ERROR(tokens->RevokeAll(host, now, api::TokenKind::kAgent).status());
  KC_ASSIGN_OR_RETURN(api::IssuedToken t,
                      tokens->Issue(host, 90 * 86400.0, now, api::TokenKind::kAgent));
  KC_ASSIGN_OR_RETURN(std::unique_ptr<api::AuditLog> audit,
                      api::AuditLog::Open((fs::path(dir) / "audit.db").string()));
  KC_RETURN_IF_ERROR(api::AuditNow(audit.get(), "kc up", "token.issue", "agent/" + host, "ok",
                                   "kc up's agent, its earlier tokens revoked"));
  return t.token;
}

std::string DefaultUpDir() {
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/kc/up";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::string(home) + "/.local/share/kc/up";
  }
  return "kc-up";
}

// Before `kc up` logs in to `cfg` at `login`: a login there for another server or token is
// kept as LOGIN.previous, and the user told so, instead of being overwritten without a word.
Status KeepEarlierLogin(const std::string& login, const api::ClientConfig& cfg) {
  if (!fs::exists(login)) return OkStatus();
  KC_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(login));
  Result<api::ClientConfig> earlier = api::ParseClientConfig(text, login);
  if (earlier.ok() && earlier->server == cfg.server && earlier->token == cfg.token &&
      earlier->ca_pem == cfg.ca_pem) {
    return OkStatus();
  }
  const std::string kept = login + ".previous";
  KC_RETURN_IF_ERROR(api::SaveSecret(kept, text));
  std::cerr << fmt::format("kc up: {} held a login to {}; it is kept in {} (--login {} uses it)\n",
                           login, earlier.ok() ? earlier->server : "another server (unreadable)",
                           kept, kept);
  return OkStatus();
}

// The inventory of this host with `devices` CPU devices (0: one per core), measured quickly.
Result<std::string> ProbeThisHost(int devices) {
  KC_ASSIGN_OR_RETURN(hal::HostInfo info, hal::ProbeHost());
  KC_ASSIGN_OR_RETURN(hal::HostMeasurement m, hal::MeasureHost(info, {.quick = true}));
  KC_ASSIGN_OR_RETURN(hal::TopologySpec spec,
                      hal::MakeCpuTopologySpec(
                          info, {.num_devices = devices > 0 ? devices : std::max(1, info.cores),
                                 .measured = m.cpu}));
  return hal::InventoryToYaml(spec);
}

// kc up's agent shares kcd's process: a heartbeat that is late is a machine too busy to run
// its threads on time, not a lost host, so kcd waits much longer than a cluster's 10 s
// before it puts the agent's jobs back in the queue.
constexpr double kUpAgentLostAfterS = 120;

void AddUp(CLI::App& app, Action* action) {
  CLI::App* c = app.add_subcommand(
      "up", "Start kcd and an agent on this machine (making the cluster the first time)");
  struct Args {
    std::string dir, listen = "127.0.0.1:7470", login, data_root = "data", metrics_listen;
    int devices = 0;
  };
  auto a = std::make_shared<Args>();
  c->add_option("--dir", a->dir, "The cluster directory (default DATA/kc/up)");
  c->add_option("--listen", a->listen, "kcd's address (default 127.0.0.1:7470; port 0: any)");
  c->add_option("--devices", a->devices,
                "CPU devices to split this host into, the first time (default: one per core)");
  c->add_option("--metrics-listen", a->metrics_listen,
                "Serve kcd's Prometheus metrics (GET /metrics, plaintext) on HOST:PORT (port 0: "
                "any); default: none");
  c->add_option("--login", a->login, "Where to log in as its admin (default CONFIG/kc/login.json)");
  c->add_option("--data-root", a->data_root,
                "What jobs' data paths are relative to (default ./data, where kc data prepare "
                "writes)");
  c->callback([action, a] {
    *action = [a]() -> int {
      const std::string dir = a->dir.empty() ? DefaultUpDir() : a->dir;
      if (!fs::exists(fs::path(dir) / "roles.yaml")) {
        Result<std::string> inventory = ProbeThisHost(a->devices);
        if (!inventory.ok()) return Fail("up: probing this host", inventory.status());
        std::error_code ec;
        fs::create_directories(dir, ec);
        const std::string probed = (fs::path(dir) / "probed.yaml").string();
        if (Status s = WriteFileDurably(probed, *inventory); !s.ok()) return Fail("up", s);
        Result<api::InitResult> init = api::InitCluster({.dir = dir, .inventory_path = probed});
        if (!init.ok()) return Fail("up: init", init.status());
        fs::remove(probed, ec);
        std::cout << fmt::format("kc up: made cluster {} (kc init)\n", dir);
      }
      // A directory `kc init` made without --inventory: this host is its inventory.
      const std::string topology = (fs::path(dir) / "topology.yaml").string();
      if (!fs::exists(topology)) {
        Result<std::string> inventory = ProbeThisHost(a->devices);
        if (!inventory.ok()) return Fail("up: probing this host", inventory.status());
        if (Status s = WriteFileDurably(topology, *inventory); !s.ok()) return Fail("up", s);
        std::cout << fmt::format("kc up: {} has no inventory; this host's is {}\n", dir, topology);
      }
      Result<hal::TopologySpec> topo = hal::LoadInventory(topology);
      if (!topo.ok()) return Fail("up", topo.status());
      const std::string host = topo->hosts.front().name;
      int devices = 0;
      for (const hal::DeviceDescriptor& d : topo->devices) devices += d.host == host ? 1 : 0;
      // The agent's machine identity: a fresh token for this host, its earlier ones revoked.
      Result<std::string> agent_token = IssueAgentToken(dir, host);
      if (!agent_token.ok()) return Fail("up: agent token", agent_token.status());
      const sigset_t stop = BlockStopSignals();
      // kcd's metrics page ends with its agent's, once the agent is up and until it stops.
      struct AgentRef {
        std::mutex mu;
        api::Agent* agent = nullptr;
      };
      auto agent_ref = std::make_shared<AgentRef>();
      const std::function<std::string()> agent_metrics = [agent_ref] {
        std::lock_guard lock(agent_ref->mu);
        return agent_ref->agent != nullptr ? agent_ref->agent->MetricsText() : std::string();
      };
      // Port 0 means any free port the first time, then the same one at every restart, so
      // the logins saved for this cluster keep working (a new one only when it is taken).
      const std::string kept_port = (fs::path(dir) / "up.port").string();
      const std::string_view listen_host =
          std::string_view(a->listen).substr(0, a->listen.rfind(':'));
      Result<std::string> kept = ReadWholeFile(kept_port);
      std::string listen = a->listen;
      if (listen.ends_with(":0") && kept.ok() && !kept->empty()) {
        listen = fmt::format("{}:{}", listen_host, kept->substr(0, kept->find_first_of(" \n")));
      }
      Result<std::unique_ptr<api::Kcd>> kcd =
          api::Kcd::Start({.dir = dir,
                           .listen = listen,
                           .agent_lost_after_s = kUpAgentLostAfterS,
                           .metrics_listen = a->metrics_listen,
                           .more_metrics = agent_metrics});
      if (!kcd.ok() && listen != a->listen) {
        std::cerr << fmt::format(
            "kc up: {} (this cluster's port before) is taken; kcd takes "
            "another, and logins saved for the old one need kc login\n",
            listen);
        listen = a->listen;
        kcd = api::Kcd::Start({.dir = dir,
                               .listen = listen,
                               .agent_lost_after_s = kUpAgentLostAfterS,
                               .metrics_listen = a->metrics_listen,
                               .more_metrics = agent_metrics});
      }
      if (!kcd.ok()) return Fail("up: kcd", kcd.status());
      if (a->listen.ends_with(":0")) {
        const std::string port = fmt::format("{}\n", (*kcd)->port());
        if (Status s = WriteFileDurably(kept_port, port); !s.ok()) return Fail("up", s);
      }
      Result<std::string> ca = ReadWholeFile((fs::path(dir) / "tls/ca.pem").string());
      Result<std::string> token = ReadWholeFile((fs::path(dir) / "admin.token").string());
      if (!ca.ok() || !token.ok()) return Fail("up", ca.ok() ? token.status() : ca.status());
      api::ClientConfig cfg{.server = fmt::format("localhost:{}", (*kcd)->port()),
                            .ca_pem = *ca,
                            .token = token->substr(0, token->find_last_not_of(" \n") + 1)};
      const std::string login = LoginPath(a->login);
      if (Status s = KeepEarlierLogin(login, cfg); !s.ok()) return Fail("up: login", s);
      if (Status s = api::SaveClientConfig(login, cfg); !s.ok()) return Fail("up: login", s);
      api::ClientConfig as_agent = cfg;
      as_agent.token = *agent_token;
      Result<std::unique_ptr<api::Agent>> agent =
          api::Agent::Start({.kcd = as_agent,
                             .host = host,
                             .devices = devices,
                             .work_dir = (fs::path(dir) / "work").string(),
                             .data_root = fs::absolute(a->data_root).string(),
                             .kc_binary = SelfPath()});
      if (!agent.ok()) return Fail("up: agent", agent.status());
      {
        std::lock_guard lock(agent_ref->mu);
        agent_ref->agent = agent->get();
      }
      std::cout
          << fmt::format(
                 "kc up: kcd on {} (TLS), agent on {} with {} devices; logged in as the "
                 "admin ({})\n"
                 "  submit a job: kc submit examples/jobs/gpt-tiny.yaml; follow it: kc jobs\n",
                 cfg.server, host, devices, login)
          << ((*kcd)->metrics_url().empty() ? "" : "  metrics: " + (*kcd)->metrics_url() + "\n")
          << std::flush;
      int sig = 0;
      sigwait(&stop, &sig);
      {
        std::lock_guard lock(agent_ref->mu);
        agent_ref->agent = nullptr;
      }
      agent->reset();
      (*kcd)->Shutdown();
      std::cout << fmt::format("kc up: stopped (signal {})\n", sig);
      return kExitOk;
    };
  });
}

// `kc token issue|revoke --dir DIR USER` (or `--agent HOST`): a system admin on kcd's host hands
// out or takes back bearer tokens, through the cluster directory (whose files only they can
// write), audited.
void AddToken(CLI::App& app, Action* action) {
  CLI::App* token =
      app.add_subcommand("token", "Issue or revoke users' and agents' bearer tokens (admins)");
  token->require_subcommand(1);
  struct Args {
    std::string dir, user, agent, out;
    double days = 90;
  };
  for (const char* verb : {"issue", "revoke"}) {
    auto a = std::make_shared<Args>();
    const bool issue = std::string_view(verb) == "issue";
    CLI::App* c = token->add_subcommand(
        verb, issue ? "A new token for a user of the roles file, or a host's agent (printed once)"
                    : "Revoke every token of a user (their queued jobs do not start) or agent");
    c->add_option("user", a->user, "The user");
    c->add_option("--agent", a->agent,
                  "Instead of a user: the agent of this host (a machine identity that may call "
                  "the agent service alone, for this host alone)");
    c->add_option("--dir", a->dir, "The cluster directory (made by kc init)")->required();
    if (issue) {
      c->add_option("--days", a->days, "Days the token is valid (default 90, at most 3650)")
          ->check(CLI::Range(0.0, api::kMaxTokenLifetimeS / 86400));
      c->add_option("--out", a->out, "Write it to this file (mode 0600) instead of printing it");
    }
    c->callback([action, a, issue] {
      *action = [a, issue]() -> int {
        const std::string what = issue ? "token issue" : "token revoke";
        if (a->user.empty() == a->agent.empty()) {
          return Fail(what, InvalidArgumentError("give a user or --agent HOST, not both"));
        }
        const bool agent = !a->agent.empty();
        const std::string subject = agent ? a->agent : a->user;
        const api::TokenKind kind = agent ? api::TokenKind::kAgent : api::TokenKind::kUser;
        const std::string resource = (agent ? "agent/" : "user/") + subject;
        const fs::path dir(a->dir);
        Result<api::RolesConfig> roles = api::LoadRolesFile((dir / "roles.yaml").string());
        if (!roles.ok()) return Fail("token", roles.status());
        if (issue && !agent && !roles->PrincipalFor(subject)) {
          return Fail(what, InvalidArgumentError(
                                fmt::format("user {}: not in {}/roles.yaml", subject, a->dir)));
        }
        if (a->days <= 0) return Fail(what, InvalidArgumentError("--days: must be positive"));
        Result<std::unique_ptr<api::TokenStore>> tokens =
            api::TokenStore::Open((dir / "kcd.db").string());
        Result<std::unique_ptr<api::AuditLog>> audit =
            api::AuditLog::Open((dir / "audit.db").string());
        if (!tokens.ok()) return Fail("token", tokens.status());
        if (!audit.ok()) return Fail("token", audit.status());
        const char* admin = std::getenv("USER");
        const std::string who = fmt::format("local:{}", admin != nullptr ? admin : "?");
        const double now =
            std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count();
        if (!issue) {
          Result<int64_t> n = (*tokens)->RevokeAll(subject, now, kind);
          if (!n.ok()) return Fail(what, n.status());
          api::AuditNow(audit->get(), who, "token.revoke", resource, "ok",
                        fmt::format("{} tokens", *n))
              .IgnoreError();  // logged by AuditNow
          std::cout << fmt::format("revoked {} tokens of {}\n", *n, resource);
          return kExitOk;
        }
        Result<api::IssuedToken> t = (*tokens)->Issue(subject, a->days * 86400, now, kind);
        if (!t.ok()) return Fail(what, t.status());
        api::AuditNow(audit->get(), who, "token.issue", resource, "ok",
                      fmt::format("valid {} days", a->days))
            .IgnoreError();  // logged by AuditNow
        if (a->out.empty()) {
          std::cout << t->token << "\n";
        } else if (Status s = api::SaveSecret(a->out, t->token + "\n"); !s.ok()) {
          return Fail(what, s);
        }
        return kExitOk;
      };
    });
  }
}

}  // namespace

void AddClusterCommands(CLI::App& app, Action* action) {
  AddToken(app, action);
  AddLogin(app, action);
  AddSubmit(app, action);
  AddJobs(app, action);
  AddJob(app, action);
  AddAgent(app, action);
  AddUp(app, action);
}

}  // namespace kc::app
