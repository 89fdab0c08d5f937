// A cluster as its users run it, every piece in its own process: `kc up` (kcd and an agent)
// trains a job end to end and `kc jobs` / `kc job show` follow it; pause, resume and cancel;
// a right revoked while a job runs stops it at its next execution-time check, keeping its
// checkpoint; a plan past the cluster's approval limits waits for a resource admin's decision;
// an agent killed without its stop leaves no job running twice; job paths that climb out of the
// agent's roots are refused.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "api/audit_log.h"
#include "api/client.h"
#include "tests/support/daemon.h"
#include "tests/support/inventories.h"
#include "tests/support/kc_run.h"
#include "tests/support/repo_root.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using kc::testing::Daemon;
using kc::testing::KcRun;
using kc::testing::kTwoCpuHosts;
using kc::testing::TempDir;
using ::testing::HasSubstr;

bool Ended(const nlohmann::json& phase) {
  return phase == "succeeded" || phase == "failed" || phase == "cancelled";
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class ClusterTest : public ::testing::Test {
 protected:
  // The training data every test's agents read: a small corpus, prepared once.
  static void SetUpTestSuite() {
    data_ = new TempDir("kc_cluster_data");
    KcRun r = kc::testing::PrepareMicroData(KC_BINARY, *data_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }

  ClusterTest() : dir_("kc_cluster") {
    model_ = dir_.Write("micro.yaml", kc::testing::kMicroModel);
  }

  // Runs kc with this test's configuration directory (its login).
  KcRun Kc(const std::string& args) {
    return kc::testing::RunKc(fmt::format("XDG_CONFIG_HOME={} {}", dir_.Path("config"), KC_BINARY),
                              args);
  }

  // A job file for the micro model.
  std::string JobFile(const std::string& name, int64_t steps, const std::string& extra = "") {
    return dir_.Write(name + ".yaml", fmt::format("name: {}\nmodel: {}\nranks: 2\nsteps: {}\n{}",
                                                  name, model_, steps, extra));
  }

  // `kc up` on this test's directory (named relative to it, as users do); returns once it
  // serves.
  std::unique_ptr<Daemon> Up(const std::string& flags = "") {
    auto up = std::make_unique<Daemon>(
        fmt::format("env --chdir {} XDG_CONFIG_HOME={} {} up --dir cluster --listen "
                    "127.0.0.1:0 --devices 2 --data-root {} {}",
                    dir_.path(), dir_.Path("config"), KC_BINARY, data_->path(), flags));
    EXPECT_THAT(up->WaitForLine("kc up: kcd on"), HasSubstr("agent on")) << up->output();
    return up;
  }

  // `kc init` of cluster directory `cluster` with `inventory` (the two-host one of CPU slices).
  void Init(const char* inventory = kTwoCpuHosts) {
    KcRun init = Kc(fmt::format("init {} --inventory {}", dir_.Path("cluster"),
                                dir_.Write("inv.yaml", inventory)));
    ASSERT_EQ(init.exit_code, 0) << init.err;
  }

  // kcd on its own, on cluster directory `cluster` (Init), with `flags`, on `port` (0: any);
  // logs this test's kc in as its admin. Returns kcd and its port.
  std::pair<std::unique_ptr<Daemon>, std::string> Kcd(const std::string& flags,
                                                      const std::string& port = "0") {
    const std::string cluster = dir_.Path("cluster");
    auto kcd = std::make_unique<Daemon>(
        fmt::format("{} --dir {} --listen 127.0.0.1:{} {}", KCD_BINARY, cluster, port, flags));
    const std::string line = kcd->WaitForLine("listening on");
    const size_t colon = line.rfind(':');
    const std::string bound = line.substr(colon + 1, line.find(' ', colon) - colon - 1);
    EXPECT_FALSE(bound.empty()) << kcd->output();
    KcRun login =
        Kc(fmt::format("login --server localhost:{} --ca {}/tls/ca.pem --token-file "
                       "{}/admin.token",
                       bound, cluster, cluster));
    EXPECT_EQ(login.exit_code, 0) << login.err;
    return {std::move(kcd), bound};
  }

  // `kc agent` for host h1 of the two-host inventory, with the agent token a system admin
  // issued it (and the admin's login for kcd's address and CA).
  std::unique_ptr<Daemon> AgentOnH1() {
    const std::string token = dir_.Path("h1.token");
    KcRun issue =
        Kc(fmt::format("token issue --agent h1 --dir {} --out {}", dir_.Path("cluster"), token));
    EXPECT_EQ(issue.exit_code, 0) << issue.err;
    auto agent = std::make_unique<Daemon>(
        fmt::format("env XDG_CONFIG_HOME={} {} agent --host h1 --devices 2 --work {} "
                    "--data-root {} --token-file {} --stop-grace 5",
                    dir_.Path("config"), KC_BINARY, dir_.Path("work"), data_->path(), token));
    EXPECT_THAT(agent->WaitForLine("kc agent:"), HasSubstr("host h1 with 2 devices"));
    return agent;
  }

  // The roles file of two tenants: alice (team vision, with `vision` its extra keys) and bob
  // (team nlp); admin is the system admin.
  void TwoTenants(const std::string& vision) {
    dir_.Write("cluster/roles.yaml",
               fmt::format("cluster: local\nusers:\n  - {{name: admin, role: system_admin}}\n"
                           "  - {{name: alice, role: submitter, teams: [vision]}}\n"
                           "  - {{name: bob, role: submitter, teams: [nlp]}}\n"
                           "teams:\n  - {{name: vision{}}}\n  - {{name: nlp}}\n",
                           vision.empty() ? "" : ", " + vision));
  }

  // Tokens for alice and bob (TwoTenants) and their logins to kcd on `port`: user -> the
  // login file to pass as --login.
  std::map<std::string, std::string> AliceAndBob(const std::string& port) {
    const std::string cluster = dir_.Path("cluster");
    std::map<std::string, std::string> login;
    for (const char* user : {"alice", "bob"}) {
      const std::string token = dir_.Path(std::string(user) + ".token");
      EXPECT_EQ(Kc(fmt::format("token issue {} --dir {} --out {}", user, cluster, token)).exit_code,
                0);
      login[user] = dir_.Path(std::string(user) + ".json");
      KcRun r =
          Kc(fmt::format("login --server localhost:{} --ca {}/tls/ca.pem --token-file {} "
                         "--login {}",
                         port, cluster, token, login[user]));
      EXPECT_EQ(r.exit_code, 0) << r.err;
    }
    return login;
  }

  // The job as `kc job show --json` prints it.
  nlohmann::json Show(int64_t id, const std::string& login = "") {
    KcRun r = Kc(fmt::format("job show {} --json{}", id, login.empty() ? "" : " --login " + login));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out, nullptr, false);
  }

  // Polls the job until `done` holds for it (a remote phase: nothing local to wait on), for
  // at most two minutes; returns the last view.
  nlohmann::json Await(int64_t id, const std::function<bool(const nlohmann::json&)>& done,
                       const std::string& login = "") {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    nlohmann::json j;
    while (std::chrono::steady_clock::now() < deadline) {
      j = Show(id, login);
      if (j.is_object() && done(j)) return j;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "job " << id << " never got there: " << j.dump();
    return j;
  }

  // Polls until job `id` runs again and its output shows `kc train` resuming from a checkpoint.
  void AwaitResumed(int64_t id) {
    Await(id, [&](const nlohmann::json& x) {
      return x["phase"] == "running" &&
             Kc(fmt::format("job logs {}", id)).out.find("kc train: resuming from") !=
                 std::string::npos;
    });
  }

  // A rank of job `id`'s run on this host: a child of kc train, its process group's leader
  // (the agent's record); -1 when there is none.
  pid_t ARankOf(int64_t id) {
    std::istringstream record(Read(dir_.Path(fmt::format("cluster/work/agent/{}.pid", id))));
    pid_t leader = -1;
    if (!(record >> leader)) return -1;
    std::istringstream children(Read(fmt::format("/proc/{}/task/{}/children", leader, leader)));
    pid_t rank = -1;
    if (!(children >> rank)) ADD_FAILURE() << "kc train " << leader << " has no ranks";
    return rank;
  }

  // Once elastic job `id` has taken 2 steps, kill -9 of one of its ranks; it must train on, in
  // the same run, 20 steps past the kill, kcd must have heard of the loss; then it is cancelled.
  void KillARankAndTrainOn(int64_t id) {
    Await(id,
          [](const nlohmann::json& j) { return j["phase"] == "running" && Int(j, "step") >= 2; });
    const pid_t rank = ARankOf(id);
    ASSERT_GT(rank, 0);
    const int64_t killed_at = Int(Show(id), "step");
    ASSERT_EQ(kill(rank, SIGKILL), 0);
    // It trains on, and kcd has heard of the loss (the history's note of it comes with the
    // heartbeat that hands the fault to the scheduler) before it is cancelled.
    nlohmann::json j = Await(id, [&](const nlohmann::json& x) {
      if (Ended(x["phase"])) return true;
      bool heard = false;
      for (const nlohmann::json& e : x["history"]) {
        heard = heard || e.value("reason", std::string()).find(" failed: ") != std::string::npos;
      }
      return heard && Int(x, "step") >= killed_at + 20;
    });
    EXPECT_EQ(j["phase"], "running") << Kc(fmt::format("job logs {}", id)).out;
    KcRun cancel = Kc(fmt::format("job cancel {}", id));
    EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
    Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  }

  static int64_t Int(const nlohmann::json& j, const char* key) {
    // Protobuf's JSON writes 64-bit integers as strings.
    const nlohmann::json& v = j.at(key);
    return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
  }

  static TempDir* data_;
  TempDir dir_;
  std::string model_;
};

TempDir* ClusterTest::data_ = nullptr;

TEST_F(ClusterTest, UpTrainsASubmittedJobEndToEnd) {
  std::unique_ptr<Daemon> up = Up();
  KcRun submit = Kc("submit " + JobFile("first", 6, "checkpoint_every: 3\n") + " --wait --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err << submit.out;
  nlohmann::json done = nlohmann::json::parse(submit.out);
  EXPECT_EQ(done["phase"], "succeeded");
  EXPECT_EQ(done["owner"], "admin");

  nlohmann::json j = Show(Int(done, "id"));
  EXPECT_EQ(Int(j, "step"), 6);
  EXPECT_EQ(Int(j, "checkpoint_step"), 6);
  EXPECT_FALSE(j["host"].get<std::string>().empty());
  std::vector<std::string> phases;
  for (const nlohmann::json& e : j["history"]) phases.push_back(e["phase"]);
  EXPECT_THAT(phases, ::testing::ElementsAre("pending", "queued", "running", "succeeded"));

  KcRun jobs = Kc("jobs");
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  EXPECT_THAT(jobs.out, HasSubstr("first"));
  EXPECT_THAT(jobs.out, HasSubstr("succeeded"));
  KcRun logs = Kc(fmt::format("job logs {}", Int(done, "id")));
  ASSERT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_THAT(logs.out, HasSubstr("checkpoints     2 (steps 3, 6)"));

  EXPECT_EQ(up->Stop(SIGTERM), 0);
  // Who did what is in the audit log: the submission, kcd's start of it and its end.
  Result<std::unique_ptr<AuditLog>> audit = AuditLog::Open(dir_.Path("cluster/audit.db"));
  ASSERT_TRUE(audit.ok());
  Result<std::vector<AuditRecord>> records = (*audit)->Query({.limit = 1000});
  ASSERT_TRUE(records.ok());
  std::vector<std::string> actions;
  for (const AuditRecord& r : *records) actions.push_back(r.action);
  EXPECT_THAT(actions, ::testing::IsSupersetOf({"job.submit", "agent.register", "job.start",
                                                "job.running", "job.succeeded"}));
  EXPECT_TRUE((*audit)->Verify("")->ok);
}

// The newcomer's path: `kc init DIR` without an inventory, then `kc up --dir DIR` (this host
// is the inventory). Port 0 is chosen once and kept over restarts, so the saved login keeps
// working; a login to another cluster is kept beside the new one, not overwritten unsaid.
TEST_F(ClusterTest, UpOnAnInitDirectoryKeepsItsPortAndEarlierLogins) {
  KcRun init = Kc("init " + dir_.Path("cluster"));
  ASSERT_EQ(init.exit_code, 0) << init.err;
  const std::string login = dir_.Path("config/kc/login.json");
  ASSERT_TRUE(
      SaveClientConfig(login, {.server = "elsewhere:7470", .ca_pem = "-", .token = "kc_x"}).ok());

  std::unique_ptr<Daemon> up = Up();
  EXPECT_THAT(up->output(), HasSubstr("has no inventory; this host's is"));
  auto port = [](const Daemon& d) {
    const std::string& out = d.output();
    const size_t at = out.find("kcd on localhost:");
    return at == std::string::npos ? "" : out.substr(at + 17, out.find(' ', at + 17) - at - 17);
  };
  const std::string first = port(*up);
  ASSERT_FALSE(first.empty()) << up->output();
  Result<ClientConfig> kept = LoadClientConfig(login + ".previous");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->server, "elsewhere:7470");
  EXPECT_EQ(up->Stop(SIGTERM), 0);

  up = Up();
  EXPECT_EQ(port(*up), first) << up->output();
  EXPECT_THAT(up->output(), ::testing::Not(HasSubstr("has no inventory")));
  KcRun jobs = Kc("jobs");  // the login saved by the first kc up
  EXPECT_EQ(jobs.exit_code, 0) << jobs.err;
  // The same login again is not a login to keep.
  EXPECT_EQ(LoadClientConfig(login + ".previous")->server, "elsewhere:7470");
}

TEST_F(ClusterTest, PauseResumeAndCancelAJob) {
  std::unique_ptr<Daemon> up = Up();
  // No periodic checkpoint comes before the pause: the one it resumes from is the pause's.
  KcRun submit = Kc("submit " + JobFile("long", 1000000, "checkpoint_every: 100000\n") + " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  Await(id, [](const nlohmann::json& j) { return j["phase"] == "running" && Int(j, "step") >= 5; });

  KcRun pause = Kc(fmt::format("job pause {} --reason 'make room'", id));
  ASSERT_EQ(pause.exit_code, 0) << pause.err;
  EXPECT_THAT(pause.out, HasSubstr("paused: paused by admin: make room"));
  // Its ranks stopped after the same step, with a checkpoint of it.
  nlohmann::json paused = Await(id, [](const nlohmann::json& j) {
    return Int(j, "checkpoint_step") > 0 && j["phase"] == "paused";
  });
  EXPECT_EQ(Int(paused, "checkpoint_step"), Int(paused, "step"));
  EXPECT_GE(Int(paused, "step"), 5);
  // Its devices are free again: another job of both devices runs to the end.
  KcRun other = Kc("submit " + JobFile("short", 3) + " --wait");
  EXPECT_EQ(other.exit_code, 0) << other.err;
  EXPECT_EQ(Show(id)["phase"], "paused");

  KcRun resume = Kc(fmt::format("job resume {}", id));
  ASSERT_EQ(resume.exit_code, 0) << resume.err;
  nlohmann::json j = Await(id, [](const nlohmann::json& x) {
    return x["phase"] == "running" && x["history"].size() >= 6;
  });
  // It went on from the pause's checkpoint, not from step 0.
  const auto logs_show_resume = [&] {
    return Kc(fmt::format("job logs {}", id))
               .out.find(fmt::format("(step {})", Int(paused, "step"))) != std::string::npos;
  };
  Await(id, [&](const nlohmann::json&) { return logs_show_resume(); });

  // Paused and resumed at once: the new run is placed on the same devices while the old one
  // may still be saving its checkpoint; it starts when that one has stopped.
  ASSERT_EQ(Kc(fmt::format("job pause {}", id)).exit_code, 0);
  ASSERT_EQ(Kc(fmt::format("job resume {}", id)).exit_code, 0);
  Await(id, [&](const nlohmann::json& x) {
    const std::string logs = Kc(fmt::format("job logs {}", id)).out;
    const size_t first = logs.find("kc train: resuming from");
    return x["phase"] == "running" && first != std::string::npos &&
           logs.find("kc train: resuming from", first + 1) != std::string::npos;
  });

  KcRun cancel = Kc(fmt::format("job cancel {}", id));
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_EQ(Show(id)["phase"], "cancelled");
  // Cancelled twice: the annotated error, FAILED_PRECONDITION, as a failure.
  EXPECT_EQ(Kc(fmt::format("job cancel {}", id)).exit_code, 1);
  // And the devices are free again.
  EXPECT_EQ(Kc("submit " + JobFile("after", 3) + " --wait").exit_code, 0);
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

TEST_F(ClusterTest, AWaitingJobSaysWhyItWaitsAsSlurmDoes) {
  std::unique_ptr<Daemon> up = Up();
  KcRun first = Kc("submit " + JobFile("first", 1000000) + " --json");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const int64_t running = Int(nlohmann::json::parse(first.out), "id");
  Await(running, [](const nlohmann::json& j) { return j["phase"] == "running"; });
  // Both devices are taken: the next job waits for resources, and says so.
  KcRun second = Kc("submit " + JobFile("second", 3) + " --json");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const int64_t waiting = Int(nlohmann::json::parse(second.out), "id");
  nlohmann::json j = Await(waiting, [](const nlohmann::json& x) {
    return x["reason"].get<std::string>().starts_with("pending: reason=Resources");
  });
  EXPECT_EQ(j["phase"], "queued");
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("0 of 2 devices free, needs 2"));
  KcRun jobs = Kc("jobs");
  EXPECT_THAT(jobs.out, HasSubstr("pending: reason=Resources")) << jobs.out;
  // The devices free: it runs, and its reason is no longer a pending one.
  ASSERT_EQ(Kc(fmt::format("job cancel {}", running)).exit_code, 0);
  j = Await(waiting, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  EXPECT_EQ(j["phase"], "succeeded") << j.dump();
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

// The roles file gives team vision pool "mine" (host h2, whose agent is not running); the
// pools file sends every other job to "all" (h1), which lends nothing. Alice's job goes to her
// team's pool and waits there, saying so; Bob's runs on h1.
TEST_F(ClusterTest, AJobGoesToTheTeamPoolTheRolesFileNames) {
  Init();
  TwoTenants("pool: mine");
  dir_.Write("cluster/pools.yaml",
             "pools:\n"
             "  - {name: all, classes: [high, normal, preemptible], rest: true, lend: false}\n"
             "  - {name: mine, classes: [normal], hosts: h2}\n");
  auto [kcd, port] = Kcd("");
  const std::map<std::string, std::string> login = AliceAndBob(port);
  std::unique_ptr<Daemon> agent = AgentOnH1();
  KcRun hers = Kc("submit " + JobFile("hers", 3) + " --json --login " + login.at("alice"));
  ASSERT_EQ(hers.exit_code, 0) << hers.err;
  const int64_t id = Int(nlohmann::json::parse(hers.out), "id");
  nlohmann::json j = Await(id, [](const nlohmann::json& x) {
    return x["reason"].get<std::string>().starts_with("pending: reason=Resources (pool mine:");
  });
  EXPECT_EQ(j["phase"], "queued");
  KcRun his = Kc("submit " + JobFile("his", 3) + " --wait --login " + login.at("bob"));
  EXPECT_EQ(his.exit_code, 0) << his.err << his.out;
  EXPECT_EQ(Show(id)["phase"], "queued");
  EXPECT_EQ(agent->Stop(SIGTERM), 0);
  EXPECT_EQ(kcd->Stop(SIGTERM), 0);
}

TEST_F(ClusterTest, APlanPastTheApprovalLimitsWaitsForAResourceAdmin) {
  // The cluster's limit: a plan of more than one device needs approval.
  dir_.Write("cluster/plan-approval.yaml", "max_devices: 1\n");
  std::unique_ptr<Daemon> up = Up();
  const auto submit = [&](const std::string& name) {
    KcRun r = Kc("submit " + JobFile(name, 3) + " --json");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return Int(nlohmann::json::parse(r.out), "id");
  };
  const auto waiting = [](const nlohmann::json& j) { return j["phase"] == "approval_required"; };

  const int64_t approved = submit("approved");
  Await(approved, waiting);
  KcRun plan = Kc(fmt::format("job plan {}", approved));
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("approval required"));
  EXPECT_THAT(plan.out, HasSubstr("devices"));
  // A reason is required to deny.
  EXPECT_EQ(Kc(fmt::format("job deny {}", approved)).exit_code, 2);
  KcRun approve = Kc(fmt::format("job approve {} --note 'fits this week' --json", approved));
  ASSERT_EQ(approve.exit_code, 0) << approve.err;
  nlohmann::json decided = nlohmann::json::parse(approve.out);
  EXPECT_EQ(decided["decision"], "approved");
  EXPECT_EQ(decided["decided_by"], "admin");
  EXPECT_EQ(decided["note"], "fits this week");
  nlohmann::json j = Await(approved, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  EXPECT_EQ(j["phase"], "succeeded") << j.dump();
  // Decided once: a second decision is FAILED_PRECONDITION, a failure.
  EXPECT_EQ(Kc(fmt::format("job deny {} --reason late", approved)).exit_code, 1);

  const int64_t denied = submit("denied");
  Await(denied, waiting);
  KcRun deny = Kc(fmt::format("job deny {} --reason 'too big for now'", denied));
  ASSERT_EQ(deny.exit_code, 0) << deny.err;
  EXPECT_THAT(deny.out, HasSubstr("denied by admin: too big for now"));
  j = Show(denied);
  EXPECT_EQ(j["phase"], "cancelled");
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("too big for now"));
  EXPECT_EQ(up->Stop(SIGTERM), 0);

  Result<std::unique_ptr<AuditLog>> audit = AuditLog::Open(dir_.Path("cluster/audit.db"));
  ASSERT_TRUE(audit.ok());
  Result<std::vector<AuditRecord>> records = (*audit)->Query({.limit = 1000});
  ASSERT_TRUE(records.ok());
  std::vector<std::string> decisions;
  for (const AuditRecord& r : *records) {
    if (r.action.starts_with("plan.")) decisions.push_back(r.action + " " + r.outcome);
  }
  // The admin decided the plans of its own jobs: overrides, recorded as such.
  EXPECT_THAT(decisions, ::testing::IsSupersetOf(
                             {"plan.approve override", "plan.deny override", "plan.deny failed"}));
}

// Approval limits written while kcd runs apply to the next job it admits, and removing them
// lifts them: no restart.
TEST_F(ClusterTest, ApprovalLimitsApplyLive) {
  std::unique_ptr<Daemon> up = Up();
  EXPECT_EQ(Kc("submit " + JobFile("before", 3) + " --wait").exit_code, 0);
  dir_.Write("cluster/plan-approval.yaml", "max_devices: 1\n");
  KcRun held = Kc("submit " + JobFile("held", 3) + " --json");
  ASSERT_EQ(held.exit_code, 0) << held.err;
  nlohmann::json j = Await(Int(nlohmann::json::parse(held.out), "id"),
                           [](const nlohmann::json& x) { return x["phase"] != "pending"; });
  EXPECT_EQ(j["phase"], "approval_required") << j.dump();
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("approval required"));
  std::filesystem::remove(dir_.Path("cluster/plan-approval.yaml"));
  EXPECT_EQ(Kc("submit " + JobFile("after", 3) + " --wait").exit_code, 0);
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

// A system admin's new pools apply while kcd runs: the running job whose pool no longer takes
// it keeps running (flagged in its history and the audit log), and a job submitted after is
// placed by the new pools, on the devices once the running job leaves them.
TEST_F(ClusterTest, NewPoolsApplyLiveAndARunningJobKeepsItsDevices) {
  std::unique_ptr<Daemon> up = Up();
  KcRun first = Kc("submit " + JobFile("first", 1000000) + " --json");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const int64_t running = Int(nlohmann::json::parse(first.out), "id");
  Await(running,
        [](const nlohmann::json& j) { return j["phase"] == "running" && Int(j, "step") >= 1; });
  // From now on one pool, for high-priority jobs only: no pool takes the running normal job.
  KcRun put = Kc("pools put " + dir_.Write("pools.yaml",
                                           "pools:\n  - {name: urgent, classes: [high], "
                                           "rest: true}\n"));
  ASSERT_EQ(put.exit_code, 0) << put.err;
  EXPECT_THAT(put.out, HasSubstr("applies it at its next pass")) << put.out;
  nlohmann::json j = Await(running, [](const nlohmann::json& x) {
    for (const nlohmann::json& e : x["history"]) {
      if (e.value("reason", std::string()).starts_with("flagged: no pool takes it")) return true;
    }
    return Ended(x["phase"]);
  });
  ASSERT_EQ(j["phase"], "running") << j.dump();
  const int64_t step = Int(j, "step");
  EXPECT_THAT(Kc("pools").out, HasSubstr("urgent"));
  // A high-priority job waits in pool urgent for the devices the running job keeps.
  KcRun high = Kc("submit " + JobFile("urgent", 3, "class: high\n") + " --json");
  ASSERT_EQ(high.exit_code, 0) << high.err;
  const int64_t waiting = Int(nlohmann::json::parse(high.out), "id");
  j = Await(waiting, [](const nlohmann::json& x) {
    return x["reason"].get<std::string>().starts_with("pending: reason=");
  });
  EXPECT_EQ(j["phase"], "queued") << j.dump();
  // The running job trains on meanwhile; once it leaves, the new pool runs the waiting one.
  Await(running, [&](const nlohmann::json& x) { return Int(x, "step") >= step + 3; });
  ASSERT_EQ(Kc(fmt::format("job cancel {}", running)).exit_code, 0);
  j = Await(waiting, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  EXPECT_EQ(j["phase"], "succeeded") << j.dump();
  EXPECT_EQ(up->Stop(SIGTERM), 0);

  Result<std::unique_ptr<AuditLog>> audit = AuditLog::Open(dir_.Path("cluster/audit.db"));
  ASSERT_TRUE(audit.ok());
  Result<std::vector<AuditRecord>> applied =
      (*audit)->Query({.action = "cluster.apply", .limit = 10});
  ASSERT_TRUE(applied.ok());
  ASSERT_EQ(applied->size(), 1u);
  EXPECT_EQ((*applied)[0].outcome, "ok");
  EXPECT_THAT((*applied)[0].reason, HasSubstr("1 running jobs kept their devices (1 flagged)"));
  Result<std::vector<AuditRecord>> flagged = (*audit)->Query({.action = "job.flag", .limit = 10});
  ASSERT_TRUE(flagged.ok());
  ASSERT_EQ(flagged->size(), 1u);
  EXPECT_EQ((*flagged)[0].resource, fmt::format("job/{}", running));
}

// A new topology applies while kcd runs: the job running on h1 keeps its devices (the same
// ids in the new topology: not flagged) and trains on; the scheduler runs on the new hosts.
TEST_F(ClusterTest, ANewTopologyAppliesLiveAndTheRunningJobTrainsOn) {
  Init();
  auto [kcd, port] = Kcd("");
  std::unique_ptr<Daemon> agent = AgentOnH1();
  KcRun submit = Kc("submit " + JobFile("long", 1000000) + " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  Await(id, [](const nlohmann::json& j) { return j["phase"] == "running"; });
  // h2 leaves the cluster.
  const std::string one_host = dir_.Write(
      "one-host.yaml",
      "name: test\nmodels:\n  cpu-slice: {kind: cpu, memory_gb: 4, peak_tflops_fp32: 0.1, "
      "peak_tflops_bf16: 0,\n              memory_bandwidth_gbs: 10}\nhosts:\n  - {name: h1, "
      "model: cpu-slice, count: 2, network: {bandwidth_gbs: 1, latency_us: 50}}\n");
  KcRun put = Kc("cluster topology put " + one_host);
  ASSERT_EQ(put.exit_code, 0) << put.err;
  // Applied (the audit says so), and the job trains on past that.
  std::string applied;
  for (int i = 0; i < 1200 && applied.find("cluster.apply") == std::string::npos; ++i) {
    applied = Kc("audit query --action cluster.apply").out;
    if (applied.find("cluster.apply") == std::string::npos) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  EXPECT_THAT(applied, HasSubstr("1 hosts, 2 devices, 1 pools; 1 running jobs kept their devices "
                                 "(0 flagged)"));
  const int64_t step = Int(Show(id), "step");
  nlohmann::json j = Await(
      id, [&](const nlohmann::json& x) { return Ended(x["phase"]) || Int(x, "step") >= step + 5; });
  EXPECT_EQ(j["phase"], "running") << j.dump();
  for (const nlohmann::json& e : j["history"]) {
    EXPECT_THAT(e.value("reason", std::string()), Not(HasSubstr("flagged"))) << j.dump();
  }
  ASSERT_EQ(Kc(fmt::format("job cancel {}", id)).exit_code, 0);
  Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  // The next job runs on h1 of the new topology.
  EXPECT_EQ(Kc("submit " + JobFile("next", 3) + " --wait").exit_code, 0);
  EXPECT_EQ(agent->Stop(SIGTERM), 0);
  EXPECT_EQ(kcd->Stop(SIGTERM), 0);
}

// A command job larger than the whole cluster fails saying why (one larger than a host, but
// not than the cluster, runs across hosts: ClusterNetnsTest).
TEST_F(ClusterTest, ACommandJobLargerThanTheClusterFailsWithWhy) {
  std::unique_ptr<Daemon> up = Up();
  KcRun submit =
      Kc("submit " + dir_.Write("wide.yaml", "name: wide\ncommand: [\"/bin/true\"]\nranks: 3\n") +
         " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  nlohmann::json j = Await(Int(nlohmann::json::parse(submit.out), "id"),
                           [](const nlohmann::json& x) { return Ended(x["phase"]); });
  EXPECT_EQ(j["phase"], "failed");
  EXPECT_THAT(j["reason"].get<std::string>(),
              HasSubstr("asks for at least 3 devices, above the capacity of every pool"));
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

TEST_F(ClusterTest, ARightRevokedWhileRunningStopsTheJobAtItsNextCheck) {
  // kcd and an agent apart, as on a real cluster: kcd is restarted, the agent is not.
  const std::string cluster = dir_.Path("cluster");
  Init();
  const std::string roles = Read(cluster + "/roles.yaml");
  const std::string users = "users:\n  - {name: admin, role: system_admin}\n";
  ASSERT_NE(roles.find(users), std::string::npos) << roles;
  std::string with_alice = roles;
  with_alice.replace(with_alice.find(users), users.size(),
                     users + "  - {name: alice, role: submitter}\n");
  dir_.Write("cluster/roles.yaml", with_alice);
  auto [kcd, port] = Kcd("--check-period 0.2");
  const std::string server = "--server localhost:" + port + " --ca " + cluster + "/tls/ca.pem";
  const std::string alice_login = dir_.Path("alice.json");
  ASSERT_EQ(
      Kc(fmt::format("token issue alice --dir {} --out {}", cluster, dir_.Path("alice.token")))
          .exit_code,
      0);
  KcRun login = Kc(fmt::format("login {} --token-file {} --login {}", server,
                               dir_.Path("alice.token"), alice_login));
  ASSERT_EQ(login.exit_code, 0) << login.err;
  EXPECT_THAT(login.out, HasSubstr("as alice (submitter)"));
  std::unique_ptr<Daemon> agent = AgentOnH1();

  KcRun submit = Kc("submit " + JobFile("alices", 1000000, "checkpoint_every: 100\n") +
                    " --json --login " + alice_login);
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  Await(id, [](const nlohmann::json& j) {
    return j["phase"] == "running" && Int(j, "checkpoint_step") >= 100;
  });

  // A system admin makes alice an observer and restarts kcd on the same address; the agent
  // reconnects, and kcd adopts the job still running there.
  std::string demoted = with_alice;
  demoted.replace(demoted.find("{name: alice, role: submitter}"), 30,
                  "{name: alice, role: observer}");
  dir_.Write("cluster/roles.yaml", demoted);
  EXPECT_EQ(kcd->Stop(SIGTERM), 0);
  std::tie(kcd, port) = Kcd("--check-period 0.2", port);

  nlohmann::json j = Await(id, [](const nlohmann::json& x) { return x["phase"] == "paused"; });
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("stopped at its execution-time check"));
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("observer"));
  // What it had done is kept: its ranks stopped with a checkpoint of their last step.
  j = Await(id, [](const nlohmann::json& x) { return Int(x, "checkpoint_step") > 100; });
  EXPECT_EQ(Int(j, "checkpoint_step"), Int(j, "step"));

  // Alice may no longer submit either: the first of the three checks.
  KcRun again = Kc("submit " + JobFile("again", 3) + " --login " + alice_login);
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_THAT(again.err, HasSubstr("observer"));

  EXPECT_EQ(agent->Stop(SIGTERM), 0);
  EXPECT_EQ(kcd->Stop(SIGTERM), 0);
  Result<std::unique_ptr<AuditLog>> audit = AuditLog::Open(cluster + "/audit.db");
  ASSERT_TRUE(audit.ok());
  Result<std::vector<AuditRecord>> denied =
      (*audit)->Query({.action = "job.execution_check", .limit = 10});
  ASSERT_TRUE(denied.ok());
  ASSERT_EQ(denied->size(), 1u);
  EXPECT_EQ((*denied)[0].outcome, "denied");
  Result<std::vector<AuditRecord>> starts = (*audit)->Query({.action = "kcd.start", .limit = 10});
  ASSERT_TRUE(starts.ok());
  ASSERT_EQ(starts->size(), 2u);
  EXPECT_EQ((*starts)[1].outcome, "roles changed");
}

// Whether the process `pid` is still there, and not a zombie waiting for its parent.
bool Alive(pid_t pid) {
  const std::string stat = Read(fmt::format("/proc/{}/stat", pid));
  const size_t close = stat.rfind(')');
  return close != std::string::npos && stat.substr(close + 2, 1) != "Z";
}

TEST_F(ClusterTest, AnAgentKilledWithoutItsStopLeavesNoJobRunningTwice) {
  std::unique_ptr<Daemon> up = Up();
  KcRun submit = Kc("submit " + JobFile("long", 1000000, "checkpoint_every: 20\n") + " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  Await(id, [](const nlohmann::json& j) {
    return j["phase"] == "running" && Int(j, "checkpoint_step") >= 20;
  });
  // The agent keeps each job's process group while it runs.
  std::istringstream record(Read(dir_.Path(fmt::format("cluster/work/agent/{}.pid", id))));
  pid_t pid = -1;
  ASSERT_TRUE(record >> pid) << "no record of job " << id << "'s processes";
  ASSERT_TRUE(Alive(pid));

  // kcd and the agent die at once; the job's processes do not, having no one to stop them.
  EXPECT_EQ(up->Stop(SIGKILL), -1);
  EXPECT_TRUE(Alive(pid));
  // The next agent on the same directory stops them before it registers; kcd, which lost
  // the run, starts the job again from its checkpoint, on the devices now free.
  up = Up();
  // SIGKILL is sent before the agent registers; the process's end is the kernel's to finish.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Alive(pid) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(Alive(pid));
  AwaitResumed(id);
  EXPECT_EQ(Kc(fmt::format("job cancel {}", id)).exit_code, 0);
  EXPECT_EQ(up->Stop(SIGTERM), 0);
  // Stopped in order this time: nothing of it is left.
  EXPECT_FALSE(std::filesystem::exists(dir_.Path(fmt::format("cluster/work/agent/{}.pid", id))));
}

// A job requeued after a failed run waits out its backoff even across a restart of kc up
// (kcd keeps when it ends): another job submitted after the restart runs and ends first.
TEST_F(ClusterTest, ARequeuedJobsBackoffOutlastsARestartOfKcd) {
  std::unique_ptr<Daemon> up = Up();
  KcRun submit = Kc("submit " + JobFile("flaky", 1000000, "restart_backoff: 3600\n") + " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  Await(id, [](const nlohmann::json& j) { return j["phase"] == "running" && Int(j, "step") >= 2; });
  const pid_t rank = ARankOf(id);
  ASSERT_GT(rank, 0);
  ASSERT_EQ(kill(rank, SIGKILL), 0);  // not elastic: the run fails, the job is requeued
  Await(id, [](const nlohmann::json& j) {
    return j["phase"] == "queued" &&
           j["reason"].get<std::string>().find("requeued") != std::string::npos;
  });
  EXPECT_EQ(up->Stop(SIGTERM), 0);
  up = Up();
  KcRun other = Kc("submit " + JobFile("other", 3) + " --json");
  ASSERT_EQ(other.exit_code, 0) << other.err;
  const nlohmann::json done = Await(Int(nlohmann::json::parse(other.out), "id"),
                                    [](const nlohmann::json& x) { return Ended(x["phase"]); });
  EXPECT_EQ(done["phase"], "succeeded") << done.dump();
  const nlohmann::json j = Show(id);
  EXPECT_EQ(j["phase"], "queued") << j.dump();
  int runs = 0;
  for (const nlohmann::json& e : j["history"]) {
    runs += e["phase"] == "running" && e.value("reason", "").starts_with("running on");
  }
  EXPECT_EQ(runs, 1) << j.dump();  // never started again
  EXPECT_EQ(Kc(fmt::format("job cancel {}", id)).exit_code, 0);
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

TEST_F(ClusterTest, AnAgentSilentPastLostAfterStopsItsRunBeforeTheNextStarts) {
  Init();
  auto [kcd, port] = Kcd("--agent-lost-after 1");
  std::unique_ptr<Daemon> agent = AgentOnH1();
  KcRun submit = Kc("submit " + JobFile("long", 1000000, "checkpoint_every: 20\n") + " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  Await(id, [](const nlohmann::json& j) {
    return j["phase"] == "running" && Int(j, "checkpoint_step") >= 20;
  });
  // The agent falls silent (its job does not: it is a process group of its own) until kcd
  // has taken the job for lost and queued it again; only h1 can take it.
  ASSERT_EQ(kill(agent->pid(), SIGSTOP), 0);
  Await(id, [](const nlohmann::json& j) { return j["phase"] == "queued"; });
  ASSERT_EQ(kill(agent->pid(), SIGCONT), 0);
  // Back, the agent registers with the run kcd dropped: kcd stops it and starts the job again
  // on the same devices; the new run waits for the old one to stop, then resumes.
  AwaitResumed(id);
  EXPECT_EQ(Kc(fmt::format("job cancel {}", id)).exit_code, 0);
  EXPECT_EQ(agent->Stop(SIGTERM), 0);
  EXPECT_EQ(kcd->Stop(SIGTERM), 0);
}

TEST_F(ClusterTest, TheFaultLayersEventsAreInTheAuditLog) {
  std::unique_ptr<Daemon> up = Up();
  KcRun submit = Kc("submit " + JobFile("doomed", 1000000, "max_restarts: 0\n") + " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  Await(id, [](const nlohmann::json& j) { return j["phase"] == "running" && Int(j, "step") >= 2; });
  // kill -9 of one of its ranks (a child of kc train, the group's leader).
  const pid_t rank = ARankOf(id);
  ASSERT_GT(rank, 0);
  ASSERT_EQ(kill(rank, SIGKILL), 0);
  nlohmann::json j = Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  // Not elastic, and no restarts allowed: the first loss fails it.
  EXPECT_EQ(j["phase"], "failed");
  EXPECT_THAT(j["reason"].get<std::string>(),
              HasSubstr("not requeued: 0 restarts done, max_restarts 0"));
  EXPECT_EQ(up->Stop(SIGTERM), 0);

  Result<std::unique_ptr<AuditLog>> audit = AuditLog::Open(dir_.Path("cluster/audit.db"));
  ASSERT_TRUE(audit.ok());
  Result<std::vector<AuditRecord>> faults = (*audit)->Query({.action = "fault.", .limit = 10});
  ASSERT_TRUE(faults.ok());
  ASSERT_FALSE(faults->empty());
  EXPECT_EQ((*faults)[0].action, "fault.detected");
  EXPECT_EQ((*faults)[0].resource, fmt::format("job/{}", id));
  EXPECT_THAT((*faults)[0].reason, HasSubstr("killed by signal 9"));
  EXPECT_TRUE((*audit)->Verify("")->ok);
}

// The job file's plan is what every rank runs, and within [min_devices, ranks] kill -9 of a rank
// is survived: the other goes on from its own state and the job succeeds; the fault log's
// detection and recovery are in the audit log.
TEST_F(ClusterTest, AnElasticJobRunsItsPlanAndSurvivesKillNineOfARank) {
  std::unique_ptr<Daemon> up = Up();
  KcRun submit = Kc("submit " +
                    JobFile("elastic", 10000,
                            "min_devices: 1\nplan: \"d=2 micro_batch_size=2 micro_batches=2\"\n") +
                    " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  Await(id, [](const nlohmann::json& j) { return j["phase"] == "running" && Int(j, "step") >= 2; });
  const pid_t rank = ARankOf(id);
  ASSERT_GT(rank, 0);
  ASSERT_EQ(kill(rank, SIGKILL), 0);
  // (10000 steps, tens of seconds: the kill lands early in the run even on a loaded machine,
  // where seeing step 2 through kcd can take seconds.)
  // It goes on without the lost rank, a replacement joins, and it succeeds in the same run;
  // its history says so.
  nlohmann::json j = Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  EXPECT_EQ(j["phase"], "succeeded") << Kc(fmt::format("job logs {}", id)).out;
  std::vector<std::string> history;
  for (const nlohmann::json& e : j["history"]) {
    history.push_back(
        fmt::format("{}: {}", e["phase"].get<std::string>(), e.value("reason", std::string())));
  }
  using ::testing::ContainsRegex;
  EXPECT_THAT(history,
              ::testing::Contains(ContainsRegex("^running: worker [01] failed: .*signal 9")));
  EXPECT_THAT(history, ::testing::Contains(ContainsRegex("^running: shrank to 1 rank")))
      << Kc(fmt::format("job logs {}", id)).out;
  EXPECT_THAT(history, ::testing::Contains(ContainsRegex("^running: grew to 2 ranks")));
  EXPECT_EQ(std::count(history.begin(), history.end(), "queued: queued for 1 to 2 devices"), 1)
      << "one run, never requeued";
  EXPECT_EQ(up->Stop(SIGTERM), 0);

  // The run recorded the plan it ran: the job file's.
  const std::string jobs = dir_.Path(fmt::format("cluster/work/jobs/{}", id));
  std::string metrics;
  for (const auto& e : std::filesystem::directory_iterator(jobs)) {
    if (e.path().filename().string().starts_with("run-")) {
      metrics = Read((e.path() / "metrics.jsonl").string());
    }
  }
  const nlohmann::json header =
      nlohmann::json::parse(metrics.substr(0, metrics.find('\n')), nullptr, false);
  ASSERT_TRUE(header.is_object()) << metrics;
  EXPECT_THAT(header["plan"].get<std::string>(), HasSubstr("micro_batch_size=2"));
  EXPECT_EQ(header["micro_batches"], 2);
  EXPECT_EQ(header["ranks"], 2);

  Result<std::unique_ptr<AuditLog>> audit = AuditLog::Open(dir_.Path("cluster/audit.db"));
  ASSERT_TRUE(audit.ok());
  Result<std::vector<AuditRecord>> faults = (*audit)->Query({.action = "fault.", .limit = 10});
  ASSERT_TRUE(faults.ok());
  std::vector<std::string> actions;
  for (const AuditRecord& r : *faults) actions.push_back(r.action);
  EXPECT_THAT(actions, ::testing::IsSupersetOf({"fault.detected", "fault.recovered"}));
}

// The history of job `id` as "PHASE: REASON" lines.
std::vector<std::string> HistoryOf(const nlohmann::json& j) {
  std::vector<std::string> history;
  for (const nlohmann::json& e : j["history"]) {
    history.push_back(
        fmt::format("{}: {}", e["phase"].get<std::string>(), e.value("reason", std::string())));
  }
  return history;
}

bool HistoryHas(const nlohmann::json& j, const std::string& text) {
  for (const std::string& line : HistoryOf(j)) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

// min_devices / max_devices on kc up: an elastic job starts on the one device free, grows to
// two when the other job ends, and shrinks back to one when a high-priority job needs a
// device, which starts once the shrink is done. One run throughout; its history says each step.
TEST_F(ClusterTest, AnElasticJobStartsOnWhatIsFreeGrowsAndShrinksAsTheSchedulerDecides) {
  std::unique_ptr<Daemon> up = Up("--metrics-listen 127.0.0.1:0");
  const std::string metrics_line = up->WaitForLine("metrics: http://127.0.0.1:");
  const int metrics_port = std::atoi(metrics_line.c_str() + metrics_line.rfind(':') + 1);
  ASSERT_GT(metrics_port, 0) << up->output();
  // kcd's metrics say the size the job's run goes on at.
  auto ranks_of = [&](int64_t id) {
    httplib::Result page = httplib::Client("127.0.0.1", metrics_port).Get("/metrics");
    if (!page) return -1;
    std::istringstream lines(page->body);
    const std::string series = fmt::format("kc_job_ranks{{job=\"{}\",", id);
    for (std::string line; std::getline(lines, line);) {
      if (line.starts_with(series)) return std::atoi(line.c_str() + line.rfind(' ') + 1);
    }
    return 0;
  };
  auto submit = [&](const std::string& name, const std::string& body) {
    KcRun r = Kc(fmt::format(
        "submit {} --json",
        dir_.Write(name + ".yaml", fmt::format("name: {}\nmodel: {}\n{}", name, model_, body))));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? Int(nlohmann::json::parse(r.out), "id") : -1;
  };
  const int64_t other = submit("other", "ranks: 1\nsteps: 1000000\n");
  Await(other, [](const nlohmann::json& j) { return j["phase"] == "running"; });
  const int64_t elastic = submit("elastic", "min_devices: 1\nmax_devices: 2\nsteps: 1000000\n");
  nlohmann::json j = Await(elastic, [](const nlohmann::json& x) {
    return x["phase"] == "running" && Int(x, "step") >= 2;
  });
  EXPECT_EQ(Int(j, "devices"), 2);  // what it asks for at most
  EXPECT_TRUE(HistoryHas(j, "queued for 1 to 2 devices")) << j.dump();

  ASSERT_EQ(Kc(fmt::format("job cancel {}", other)).exit_code, 0);
  j = Await(elastic, [](const nlohmann::json& x) {
    return Ended(x["phase"]) || HistoryHas(x, "running: grew to 2 ranks");
  });
  EXPECT_TRUE(HistoryHas(j, "running: the scheduler grows it from 1 to 2 devices")) << j.dump();
  EXPECT_EQ(ranks_of(elastic), 2);
  {  // kc up's page has its agent's too: the run's own progress.
    httplib::Result page = httplib::Client("127.0.0.1", metrics_port).Get("/metrics");
    ASSERT_TRUE(page);
    EXPECT_THAT(page->body,
                HasSubstr(fmt::format("kc_run_tokens_per_second{{job=\"{}\"", elastic)));
  }

  const int64_t high = submit("high", "class: high\nranks: 1\nsteps: 20\n");
  j = Await(high, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  EXPECT_EQ(j["phase"], "succeeded") << j.dump();
  j = Show(elastic);
  EXPECT_EQ(j["phase"], "running") << Kc(fmt::format("job logs {}", elastic)).out;
  EXPECT_TRUE(HistoryHas(j, "running: the scheduler shrinks it from 2 to 1 devices")) << j.dump();
  EXPECT_TRUE(HistoryHas(j, "running: shrank to 1 rank")) << j.dump();
  // kcd's metric says the size its history last noted: 1, or 2 again when the scheduler grew
  // it back onto the device the high-priority job left (a slow machine gets there first).
  int last_size = 0;
  for (const std::string& line : HistoryOf(Show(elastic))) {
    if (line.find("running: shrank to 1 rank") != std::string::npos) last_size = 1;
    if (line.find("running: grew to 2 ranks") != std::string::npos) last_size = 2;
  }
  EXPECT_EQ(ranks_of(elastic), last_size);
  // No rank failed: the scheduler's shrink retires one.
  EXPECT_FALSE(HistoryHas(j, " failed: ")) << j.dump();
  ASSERT_EQ(Kc(fmt::format("job cancel {}", elastic)).exit_code, 0);
  Await(elastic, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

// kill -9 of every process of a running job (kc train, its supervisor, and every rank, as a
// crash of the job would): the job is requeued (not failed) by its restart policy after its
// backoff, resumes from its newest checkpoint and succeeds; history and audit log say so.
TEST_F(ClusterTest, KillNineOfEveryRankRequeuesTheJobWhichResumesFromItsCheckpoint) {
  std::unique_ptr<Daemon> up = Up();
  KcRun submit = Kc(
      "submit " +
      JobFile("requeued", 6000, "min_devices: 1\ncheckpoint_every: 300\nrestart_backoff: 0.5\n") +
      " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  Await(id, [](const nlohmann::json& j) {
    return j["phase"] == "running" && Int(j, "checkpoint_step") >= 300;
  });
  std::istringstream record(Read(dir_.Path(fmt::format("cluster/work/agent/{}.pid", id))));
  pid_t leader = -1;
  ASSERT_TRUE(record >> leader);
  ASSERT_EQ(kill(-leader, SIGKILL), 0);

  nlohmann::json j = Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  EXPECT_EQ(j["phase"], "succeeded") << Kc(fmt::format("job logs {}", id)).out;
  EXPECT_EQ(Int(j, "step"), 6000);
  std::vector<std::string> phases;
  std::string requeue;
  for (const nlohmann::json& e : j["history"]) {
    if (!phases.empty() && phases.back() == e["phase"]) continue;  // notes of one phase
    phases.push_back(e["phase"]);
    if (e["phase"] == "queued" && phases.size() > 2) requeue = e.value("reason", "");
  }
  EXPECT_THAT(phases, ::testing::ElementsAre("pending", "queued", "running", "queued", "running",
                                             "succeeded"));
  EXPECT_THAT(requeue, HasSubstr("requeued (restart 1 of 3) after"));
  EXPECT_THAT(Kc(fmt::format("job logs {}", id)).out, HasSubstr("kc train: resuming from"));
  EXPECT_EQ(up->Stop(SIGTERM), 0);
  Result<std::unique_ptr<AuditLog>> audit = AuditLog::Open(dir_.Path("cluster/audit.db"));
  ASSERT_TRUE(audit.ok());
  Result<std::vector<AuditRecord>> queued = (*audit)->Query({.action = "job.queued", .limit = 10});
  ASSERT_TRUE(queued.ok());
  EXPECT_THAT(*queued, ::testing::Contains(::testing::Field(&AuditRecord::reason,
                                                            HasSubstr("requeued (restart 1"))));
}

// checkpoint_every: auto takes the interval from the scheduler's advice for the job's pool and
// class: kcd sends the advice with the start, the agent keeps it in the run's advice file, and
// the run records each interval with whose advice it was.
TEST_F(ClusterTest, CheckpointEveryAutoTakesTheSchedulersAdvice) {
  std::unique_ptr<Daemon> up = Up();
  KcRun submit =
      Kc("submit " + JobFile("auto", 600, "checkpoint_every: auto\n") + " --wait --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err << submit.out;
  const nlohmann::json done = nlohmann::json::parse(submit.out);
  const int64_t id = Int(done, "id");
  EXPECT_EQ(done["phase"], "succeeded") << Kc(fmt::format("job logs {}", id)).out;
  EXPECT_EQ(up->Stop(SIGTERM), 0);

  const std::string run = dir_.Path(fmt::format("cluster/work/jobs/{}/run-1", id));
  const nlohmann::json advice = nlohmann::json::parse(Read(run + "/advice.json"), nullptr, false);
  ASSERT_TRUE(advice.is_object()) << Read(run + "/advice.json");
  EXPECT_GT(advice["mtbf_s"].get<double>(), 0);
  EXPECT_THAT(advice["source"].get<std::string>(),
              ::testing::StartsWith("kcd's scheduler: pool all, class normal: 0 interruptions"));
  std::istringstream metrics(Read(run + "/metrics.jsonl"));
  int intervals = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    if (!r.is_object() || r["type"] != "checkpoint_interval") continue;
    ++intervals;
    EXPECT_EQ(r["source"], advice["source"]);
    EXPECT_DOUBLE_EQ(r["mtbf_s"].get<double>(), advice["mtbf_s"].get<double>());
    EXPECT_GT(r["every_steps"].get<int64_t>(), 0);
  }
  EXPECT_GE(intervals, 1) << Read(run + "/metrics.jsonl").substr(0, 2000);
}

// The advice follows what happens in the job's pool: a rank's fault is an interruption, and the
// changed advice reaches the running job's advice file.
TEST_F(ClusterTest, AChangedAdviceReachesTheRunningJob) {
  std::unique_ptr<Daemon> up = Up();
  KcRun submit =
      Kc("submit " + JobFile("follows", 1000000, "checkpoint_every: auto\nmin_devices: 1\n") +
         " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  const std::string file = dir_.Path(fmt::format("cluster/work/jobs/{}/run-1/advice.json", id));
  const auto source = [&] {
    const nlohmann::json a = nlohmann::json::parse(Read(file), nullptr, false);
    return a.is_object() ? a.value("source", std::string()) : std::string();
  };
  Await(id, [](const nlohmann::json& j) { return j["phase"] == "running" && Int(j, "step") >= 2; });
  EXPECT_THAT(source(), HasSubstr(": 0 interruptions in"));
  const pid_t rank = ARankOf(id);
  ASSERT_GT(rank, 0);
  ASSERT_EQ(kill(rank, SIGKILL), 0);
  // Nothing to wait on but the file the agent rewrites: polled, for at most two minutes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (source().find(": 1 interruption in") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(source(), HasSubstr(": 1 interruption in"));
  EXPECT_EQ(Kc(fmt::format("job cancel {}", id)).exit_code, 0);
  Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

// The admin's comm limits file reaches every job's ranks: the job's entry (by TEAM/NAME) and the
// lanes are what its run records, and kc job show says them.
TEST_F(ClusterTest, TheAdminsCommLimitsReachTheJobsRanksAndShowInJobShow) {
  KcRun init = Kc("init " + dir_.Path("cluster"));
  ASSERT_EQ(init.exit_code, 0) << init.err;
  dir_.Write("cluster/comm-limits.yaml",
             "rate_limits:\n"
             "  default: {ops_per_second: 10000}\n"
             "  jobs:\n"
             "    - {job: \"*/limited\", ops_per_second: 2000, bytes_per_second_gb: 2.5}\n"
             "lanes:\n"
             "  priority: [activation, gradient, control, telemetry]\n");
  std::unique_ptr<Daemon> up = Up();
  KcRun submit = Kc("submit " + JobFile("limited", 20) + " --wait --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err << submit.out;
  const nlohmann::json done = nlohmann::json::parse(submit.out);
  const int64_t id = Int(done, "id");
  EXPECT_EQ(done["phase"], "succeeded") << Kc(fmt::format("job logs {}", id)).out;
  KcRun show = Kc(fmt::format("job show {}", id));
  EXPECT_THAT(show.out, HasSubstr("comm       2000 ops/s, 2.5 GB/s (bursts of 1000 ops, 256 MB); "
                                  "lanes activation > gradient > control > telemetry"));
  EXPECT_EQ(up->Stop(SIGTERM), 0);

  const std::string metrics =
      Read(dir_.Path(fmt::format("cluster/work/jobs/{}/run-1/metrics.jsonl", id)));
  const nlohmann::json header =
      nlohmann::json::parse(metrics.substr(0, metrics.find('\n')), nullptr, false);
  ASSERT_TRUE(header.is_object()) << metrics;
  const nlohmann::json& limits = header["comm_limits"];
  ASSERT_TRUE(limits.is_object()) << header.dump();
  EXPECT_EQ(limits["ops_per_second"], 2000);
  EXPECT_EQ(limits["bytes_per_second"], 2.5e9);
  EXPECT_EQ(limits["lanes"]["priority"],
            nlohmann::json({"activation", "gradient", "control", "telemetry"}));
}

// kc diagnose of a kcd job, from what its runs reported to kcd: the seed's misconfiguration
// (the gradient lane not first, from the admin's comm limits) at L2, and its pause at L4; and
// --live while it runs: where every rank is, asked of its supervisor through kcd and the agent.
TEST_F(ClusterTest, KcDiagnoseOfAJobNamesItsLaneMisconfigurationAndItsPause) {
  KcRun init = Kc("init " + dir_.Path("cluster"));
  ASSERT_EQ(init.exit_code, 0) << init.err;
  dir_.Write("cluster/comm-limits.yaml",
             "lanes:\n  priority: [activation, gradient, control, telemetry]\n");
  std::unique_ptr<Daemon> up = Up();
  KcRun submit = Kc("submit " + JobFile("long", 1000000, "checkpoint_every: 100000\n") + " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  Await(id, [](const nlohmann::json& j) { return j["phase"] == "running" && Int(j, "step") >= 5; });
  ASSERT_EQ(Kc(fmt::format("job pause {}", id)).exit_code, 0);
  const int64_t paused_at =
      Int(Await(id, [](const nlohmann::json& j) { return j["phase"] == "paused"; }), "step");
  ASSERT_EQ(Kc(fmt::format("job resume {}", id)).exit_code, 0);
  Await(id, [&](const nlohmann::json& j) {
    return j["phase"] == "running" && Int(j, "step") >= paused_at + 5;
  });
  // Live: kcd asks the run's supervisor through its agent where every rank is. (Until both
  // ranks' heartbeats have published a communicator: just resumed, a rank's last beat may
  // have come before it had one.)
  KcRun live;
  nlohmann::json answer;
  auto both_published = [&] {
    if (!answer.is_object() || answer["ranks"].size() != 2) return false;
    for (const nlohmann::json& rank : answer["ranks"]) {
      if (!rank["published"].get<bool>() || rank["groups"].empty()) return false;
    }
    return true;
  };
  for (int i = 0; i < 20 && !both_published(); ++i) {
    live = Kc(fmt::format("diagnose {} --live --json --wait 60", id));
    ASSERT_EQ(live.exit_code, 0) << live.err;
    answer = nlohmann::json::parse(live.out)["live"];
  }
  ASSERT_TRUE(answer.is_object()) << live.out;
  EXPECT_GT(Int(answer, "request"), 0);
  ASSERT_EQ(answer["ranks"].size(), 2u) << live.out;
  for (const nlohmann::json& rank : answer["ranks"]) {
    ASSERT_TRUE(rank["published"].get<bool>()) << live.out;
    ASSERT_FALSE(rank["groups"].empty()) << live.out;
    EXPECT_FALSE(rank["groups"][0]["ops"].empty()) << live.out;  // it has trained
  }
  // And its host's load, measured by the agent: the ranks' cores, each with its rate.
  ASSERT_EQ(answer["hosts"].size(), 1u) << live.out;
  EXPECT_FALSE(answer["hosts"][0]["cores"].empty()) << live.out;
  EXPECT_GT(answer["hosts"][0]["cores"][0]["sgemm_flops"], 1e8) << live.out;
  ASSERT_EQ(Kc(fmt::format("job cancel {}", id)).exit_code, 0);
  Await(id, [](const nlohmann::json& j) { return Ended(j["phase"]); });
  KcRun ended = Kc(fmt::format("diagnose {} --live", id));
  EXPECT_EQ(ended.exit_code, 1);
  EXPECT_THAT(ended.err, HasSubstr("no run going on")) << ended.err;

  KcRun diagnose = Kc(fmt::format("diagnose {}", id));
  ASSERT_EQ(diagnose.exit_code, 0) << diagnose.err;
  std::cout << diagnose.out;  // in the test's log: what a user sees
  EXPECT_THAT(diagnose.out, HasSubstr("micro (2 ranks")) << diagnose.out;
  EXPECT_THAT(diagnose.out, HasSubstr("L2 fault   the gradient lane is not first")) << diagnose.out;
  EXPECT_THAT(diagnose.out, HasSubstr("the job was paused 1 time and requeued 0 times"))
      << diagnose.out;
  KcRun json = Kc(fmt::format("diagnose {} --json", id));
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json findings = nlohmann::json::parse(json.out)["findings"];
  ASSERT_TRUE(findings.is_array()) << json.out;
  EXPECT_EQ(findings[0]["layer"], "L2") << json.out;
  // A job kcd does not have is named.
  KcRun unknown = Kc("diagnose 9999");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_THAT(unknown.err, HasSubstr("9999"));
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

// kc diagnose of a preemptible job that a high-priority one preempted: L4 names it.
TEST_F(ClusterTest, KcDiagnoseOfAPreemptedJobNamesThePreemption) {
  std::unique_ptr<Daemon> up = Up();
  KcRun victim =
      Kc("submit " + JobFile("cheap", 1000000, "class: preemptible\ncheckpoint_every: 100000\n") +
         " --json");
  ASSERT_EQ(victim.exit_code, 0) << victim.err;
  const int64_t id = Int(nlohmann::json::parse(victim.out), "id");
  Await(id, [](const nlohmann::json& j) { return j["phase"] == "running" && Int(j, "step") >= 3; });
  KcRun high = Kc("submit " + JobFile("urgent", 3, "class: high\n") + " --wait");
  ASSERT_EQ(high.exit_code, 0) << high.err << high.out;
  // Preempted, then back once the urgent job is done.
  nlohmann::json j = Await(id, [](const nlohmann::json& x) {
    return Ended(x["phase"]) || (x["phase"] == "running" && HistoryHas(x, "preempted: "));
  });
  ASSERT_EQ(j["phase"], "running") << j.dump();
  ASSERT_EQ(Kc(fmt::format("job cancel {}", id)).exit_code, 0);
  Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  KcRun diagnose = Kc(fmt::format("diagnose {}", id));
  ASSERT_EQ(diagnose.exit_code, 0) << diagnose.err;
  EXPECT_THAT(diagnose.out,
              HasSubstr("L4 fault   the scheduler stopped the job 1 time for other work "
                        "(preempted)"))
      << diagnose.out;
  // kcd's job ids, not the scheduler's.
  EXPECT_THAT(diagnose.out, HasSubstr("first: preempted: checkpoint and pause for job 2 (high"))
      << diagnose.out;
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

// A command job: any program on every rank with torchrun's launch environment, its own
// working directory and environment. kill -9 of one of its ranks fails the run (the program's
// state is its own); the job is requeued and the next run sees the restart counted.
TEST_F(ClusterTest, ACommandJobRunsAnyProgramAndIsRestartedAfterKillNine) {
  std::unique_ptr<Daemon> up = Up();
  const std::string script = dir_.Write(
      "job.sh",
      "echo \"rank=$RANK/$WORLD_SIZE local=$LOCAL_RANK restart=$TORCHELASTIC_RESTART_COUNT "
      "id=$TORCHELASTIC_RUN_ID greeting=$GREETING dir=$(basename \"$PWD\")\"\n"
      "echo step > \"$KC_CHECKPOINT_DIR/rank$RANK-restart$TORCHELASTIC_RESTART_COUNT\"\n"
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exec sleep 60; fi\n");
  const std::string job =
      dir_.Write("cmd.yaml", fmt::format("name: cmd\ncommand: [/bin/sh, {}]\nworkdir: shared/cmd\n"
                                         "env: {{GREETING: hello}}\nranks: 2\nrestart_backoff: 0\n",
                                         script));
  KcRun submit = Kc("submit " + job + " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  const std::string checkpoints = dir_.Path(fmt::format("cluster/work/jobs/{}/checkpoints", id));
  // Both ranks are up once each has written its file (nothing else says so).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (!(std::filesystem::exists(checkpoints + "/rank0-restart0") &&
           std::filesystem::exists(checkpoints + "/rank1-restart0")) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const pid_t rank = ARankOf(id);  // a child of kc run
  ASSERT_GT(rank, 0);
  ASSERT_EQ(kill(rank, SIGKILL), 0);
  nlohmann::json j = Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  const std::string logs = Kc(fmt::format("job logs {}", id)).out;
  EXPECT_EQ(j["phase"], "succeeded") << logs;
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(logs, HasSubstr(fmt::format("[rank {}] rank={}/2 local={} restart=1 id=job-{} "
                                            "greeting=hello dir=cmd",
                                            r, r, r, id)));
  }
  EXPECT_THAT(logs, HasSubstr("failed: killed by signal 9"));
  std::string requeue;
  for (const nlohmann::json& e : j["history"]) {
    const std::string reason = e.value("reason", "");
    if (reason.find("requeued (restart 1 of 3)") != std::string::npos) requeue = reason;
  }
  EXPECT_FALSE(requeue.empty()) << j.dump();
  EXPECT_TRUE(std::filesystem::exists(checkpoints + "/rank1-restart1"));
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

// A command job with min_devices starts at the size the cluster has free in its range, and its
// program sees that size as WORLD_SIZE.
TEST_F(ClusterTest, ACommandJobWithMinDevicesStartsAtWhatIsFree) {
  std::unique_ptr<Daemon> up = Up();
  const std::string holder = dir_.Write("holder.sh", "exec sleep 120\n");
  KcRun first =
      Kc("submit " +
         dir_.Write("holder.yaml",
                    fmt::format("name: holder\ncommand: [/bin/sh, {}]\nranks: 1\n", holder)) +
         " --json");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const int64_t held = Int(nlohmann::json::parse(first.out), "id");
  Await(held, [](const nlohmann::json& x) { return x["phase"] == "running"; });
  const std::string script = dir_.Write("size.sh", "echo \"rank=$RANK world=$WORLD_SIZE\"\n");
  KcRun submit =
      Kc("submit " +
         dir_.Write("ranged.yaml", fmt::format("name: ranged\ncommand: [/bin/sh, {}]\nranks: 2\n"
                                               "min_devices: 1\n",
                                               script)) +
         " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  nlohmann::json j = Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  const std::string logs = Kc(fmt::format("job logs {}", id)).out;
  EXPECT_EQ(j["phase"], "succeeded") << logs;
  EXPECT_THAT(logs, HasSubstr("[rank 0] rank=0 world=1"));
  EXPECT_THAT(logs, Not(HasSubstr("[rank 1]")));
  ASSERT_EQ(Kc(fmt::format("job cancel {}", held)).exit_code, 0);
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

// The example PyTorch DDP program (examples/jobs/torch-ddp) as a command job on kc up: it
// trains and succeeds; kill -9 of one of its ranks after its first checkpoint requeues the job,
// and the next run, its restart counted, resumes from the checkpoint. Skipped where Debian's
// PyTorch (python3-torch) is missing.
TEST_F(ClusterTest, ThePyTorchDdpExampleResumesFromItsCheckpointAfterKillNine) {
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 has no PyTorch (Debian: python3-torch)";
  }
  std::unique_ptr<Daemon> up = Up();
  const std::string job = dir_.Write(
      "ddp.yaml",
      fmt::format("name: torch-ddp\ncommand: [/usr/bin/python3, {}examples/jobs/torch-ddp/"
                  "train.py, --steps, \"3000\", --checkpoint-every, \"50\"]\nranks: 2\n"
                  "restart_backoff: 0\nheartbeat_timeout: 60\n",
                  kc::testing::RepoRoot()));
  KcRun submit = Kc("submit " + job + " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  const std::string saved =
      dir_.Path(fmt::format("cluster/work/jobs/{}/checkpoints/torch-ddp.pt", id));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (!std::filesystem::exists(saved) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(std::filesystem::exists(saved)) << Kc(fmt::format("job logs {}", id)).out;
  const pid_t rank = ARankOf(id);  // a child of kc run
  ASSERT_GT(rank, 0);
  ASSERT_EQ(kill(rank, SIGKILL), 0);
  nlohmann::json j = Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  const std::string logs = Kc(fmt::format("job logs {}", id)).out;
  EXPECT_EQ(j["phase"], "succeeded") << logs.substr(logs.size() > 4000 ? logs.size() - 4000 : 0);
  EXPECT_THAT(logs, HasSubstr("failed: killed by signal 9"));
  EXPECT_THAT(
      logs, ::testing::ContainsRegex("\\[rank 0\\] resumed from step [1-9][0-9]* \\(restart 1\\)"));
  EXPECT_THAT(logs, HasSubstr("[rank 0] step 3000 loss "));
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

// On GPUs (an inventory of CUDA devices; the program only prints what it is given) each
// command job's ranks see the job's own GPUs as CUDA_VISIBLE_DEVICES, by their ordinals on the
// host: two one-rank jobs side by side on h1's two GPUs get one each, not the same.
TEST_F(ClusterTest, ACommandJobSeesItsOwnGpusAsCudaVisibleDevices) {
  Init(R"(name: gpus
models:
  H: {kind: cuda, memory_gb: 80, peak_tflops_fp32: 60, peak_tflops_bf16: 900,
      memory_bandwidth_gbs: 3000}
hosts:
  - {name: h1, model: H, count: 2, intra_host: {kind: nvlink, bandwidth_gbs: 400, latency_us: 2},
     network: {bandwidth_gbs: 50, latency_us: 5}}
)");
  auto [kcd, port] = Kcd("");
  std::unique_ptr<Daemon> agent = AgentOnH1();
  const std::string script = dir_.Write(
      "gpu.sh", "echo \"visible=$CUDA_VISIBLE_DEVICES local=$LOCAL_RANK\"\nexec sleep 60\n");
  std::vector<int64_t> ids;
  for (const char* name : {"first", "second"}) {
    KcRun submit = Kc(fmt::format(
        "submit {} --json",
        dir_.Write(fmt::format("{}.yaml", name),
                   fmt::format("name: {}\ncommand: [/bin/sh, {}]\nranks: 1\n", name, script))));
    ASSERT_EQ(submit.exit_code, 0) << submit.err;
    ids.push_back(Int(nlohmann::json::parse(submit.out), "id"));
  }
  std::set<std::string> seen;
  for (int64_t id : ids) {
    std::string logs;
    Await(id, [&](const nlohmann::json& x) {
      logs = Kc(fmt::format("job logs {}", id)).out;
      return Ended(x["phase"]) || logs.find("visible=") != std::string::npos;
    });
    const size_t at = logs.find("visible=");
    ASSERT_NE(at, std::string::npos) << logs;
    seen.insert(logs.substr(at, logs.find(' ', at) - at));
  }
  EXPECT_EQ(seen, (std::set<std::string>{"visible=0", "visible=1"}));
  // A job file may not set it: the devices are the scheduler's to give.
  KcRun bad =
      Kc("submit " + dir_.Write("bad.yaml", fmt::format("name: bad\ncommand: [/bin/true]\n"
                                                        "env: {{CUDA_VISIBLE_DEVICES: \"0\"}}\n")));
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_THAT(bad.err, HasSubstr("CUDA_VISIBLE_DEVICES"));
  for (int64_t id : ids) Kc(fmt::format("job cancel {}", id));
  for (int64_t id : ids) Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  EXPECT_EQ(agent->Stop(SIGTERM), 0);
  EXPECT_EQ(kcd->Stop(SIGTERM), 0);
}

// The approval limits hold command jobs to what can be known without a model: devices and
// expected hours. One past max_devices waits for a resource admin, then runs once approved.
TEST_F(ClusterTest, ACommandJobPastTheApprovalLimitsWaitsForAResourceAdmin) {
  dir_.Write("cluster/plan-approval.yaml", "max_devices: 1\nmax_runtime_hours: 2\n");
  std::unique_ptr<Daemon> up = Up();
  KcRun submit = Kc("submit " +
                    dir_.Write("big.yaml",
                               "name: big\ncommand: [/bin/true]\nranks: 2\n"
                               "expected_hours: 3\n") +
                    " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  nlohmann::json j =
      Await(id, [](const nlohmann::json& x) { return x["phase"] == "approval_required"; });
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("2 devices, above the limit of 1"));
  EXPECT_THAT(j["reason"].get<std::string>(),
              HasSubstr("3.00 h expected (expected_hours), above the limit of 2.00 h"));
  KcRun plan = Kc(fmt::format("job plan {}", id));
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("a command job: 2 devices"));
  ASSERT_EQ(Kc(fmt::format("job approve {}", id)).exit_code, 0);
  j = Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  EXPECT_EQ(j["phase"], "succeeded") << j.dump();
  // Within the limits: no wait.
  KcRun small =
      Kc("submit " + dir_.Write("small.yaml", "name: small\ncommand: [/bin/true]\n") + " --wait");
  EXPECT_EQ(small.exit_code, 0) << small.err << small.out;
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

// kc job pause of a command job: SIGTERM reaches every rank, which saves to KC_CHECKPOINT_DIR
// and exits; kc job resume starts it again, and it goes on from what it saved.
TEST_F(ClusterTest, ACommandJobPausedSavesAndResumesFromItsOwnCheckpoint) {
  std::unique_ptr<Daemon> up = Up();
  const std::string script =
      dir_.Write("job.sh",
                 "state=\"$KC_CHECKPOINT_DIR/rank$RANK\"\n"
                 "if [ -f \"$state\" ]; then echo \"resumed from $(cat \"$state\")\"; exit 0; fi\n"
                 "n=0\n"
                 "trap 'echo $n > \"$state\"; echo \"saved at $n\"; exit 0' TERM\n"
                 "touch \"$KC_CHECKPOINT_DIR/up$RANK\"\n"
                 "while true; do n=$((n+1)); sleep 0.02; done\n");
  const std::string job = dir_.Write(
      "cmd.yaml", fmt::format("name: pausable\ncommand: [/bin/sh, {}]\nranks: 2\n", script));
  KcRun submit = Kc("submit " + job + " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  const std::string checkpoints = dir_.Path(fmt::format("cluster/work/jobs/{}/checkpoints", id));
  // Both ranks are up once each has touched its file (nothing else says so).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (!(std::filesystem::exists(checkpoints + "/up0") &&
           std::filesystem::exists(checkpoints + "/up1")) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(Kc(fmt::format("job pause {}", id)).exit_code, 0);
  Await(id, [&](const nlohmann::json& x) {
    return x["phase"] == "paused" && std::filesystem::exists(checkpoints + "/rank0") &&
           std::filesystem::exists(checkpoints + "/rank1");
  });
  ASSERT_EQ(Kc(fmt::format("job resume {}", id)).exit_code, 0);
  nlohmann::json j = Await(id, [](const nlohmann::json& x) { return Ended(x["phase"]); });
  const std::string logs = Kc(fmt::format("job logs {}", id)).out;
  EXPECT_EQ(j["phase"], "succeeded") << logs;
  EXPECT_THAT(logs, HasSubstr("[rank 0] saved at"));
  EXPECT_THAT(logs, HasSubstr("[rank 1] resumed from"));
  EXPECT_EQ(up->Stop(SIGTERM), 0);
}

// A run's faults reach kcd's scheduler: with a pools file that demotes a job at its first fault,
// kill -9 of a rank of an elastic job demotes it, audited.
TEST_F(ClusterTest, ARanksFaultReachesTheSchedulerAndDemotesAFlakyJob) {
  std::unique_ptr<Daemon> up = Up();
  const std::string pools =
      dir_.Write("pools.yaml",
                 "pools:\n  - {name: all, classes: [high, normal, preemptible], rest: true}\n"
                 "scheduler: {demote_min_faults: 1, demote_faults_per_hour: 1}\n");
  KcRun put = Kc("pools put " + pools);
  ASSERT_EQ(put.exit_code, 0) << put.err;
  EXPECT_EQ(up->Stop(SIGTERM), 0);
  up = Up();  // kcd lays the pools file at its start
  KcRun submit = Kc("submit " + JobFile("flaky", 100000, "min_devices: 1\n") + " --json");
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const int64_t id = Int(nlohmann::json::parse(submit.out), "id");
  KillARankAndTrainOn(id);
  EXPECT_EQ(up->Stop(SIGTERM), 0);

  Result<std::unique_ptr<AuditLog>> audit = AuditLog::Open(dir_.Path("cluster/audit.db"));
  ASSERT_TRUE(audit.ok());
  Result<std::vector<AuditRecord>> demoted = (*audit)->Query({.action = "job.demote", .limit = 10});
  ASSERT_TRUE(demoted.ok());
  ASSERT_EQ(demoted->size(), 1u);
  EXPECT_EQ((*demoted)[0].resource, fmt::format("job/{}", id));
}

TEST_F(ClusterTest, KillNineOfKcdAmidSubmissionsLosesNoAcknowledgedJob) {
  Init();
  auto [kcd, port] = Kcd("");
  const std::string job = JobFile("many", 3);
  // Submissions one after another, each acknowledged (exit 0, its id) or not, until one fails.
  std::mutex mu;
  std::condition_variable acked_cv;
  std::vector<std::pair<int64_t, std::string>> acked;  // id, name
  std::thread submitter([&] {
    for (int n = 0;; ++n) {
      const std::string name = fmt::format("job-{}", n);
      KcRun r = Kc(fmt::format("submit {} --name {} --json", job, name));
      if (r.exit_code != 0) return;
      std::lock_guard<std::mutex> lock(mu);
      acked.emplace_back(Int(nlohmann::json::parse(r.out), "id"), name);
      acked_cv.notify_all();
    }
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    acked_cv.wait(lock, [&] { return acked.size() >= 10; });
  }
  kcd->Stop(SIGKILL);  // while the next submission is on its way
  submitter.join();
  kcd = Kcd("", port).first;
  for (const auto& [id, name] : acked) {
    nlohmann::json j = Show(id);
    ASSERT_TRUE(j.is_object()) << "job " << id << " lost";
    EXPECT_EQ(j["name"], name);
  }
  EXPECT_EQ(kcd->Stop(SIGTERM), 0);
  Result<std::unique_ptr<AuditLog>> audit = AuditLog::Open(dir_.Path("cluster/audit.db"));
  ASSERT_TRUE(audit.ok());
  EXPECT_TRUE((*audit)->Verify("")->ok);
}

// Two tenants on one cluster: bob (team nlp) names the directory where alice (team vision) keeps
// her checkpoints. His job is stopped at its first execution-time check, before it reads or
// writes anything there, and her checkpoints stay as they were. Another job's own directory
// cannot even be named.
TEST_F(ClusterTest, AJobCannotWriteIntoAnotherTenantsCheckpointDirectory) {
  Init();
  TwoTenants("");
  auto [kcd, port] = Kcd("--check-period 0.2");
  const std::map<std::string, std::string> login = AliceAndBob(port);
  std::unique_ptr<Daemon> agent = AgentOnH1();

  KcRun mine =
      Kc("submit " + JobFile("mine", 6, "checkpoint_every: 3\ncheckpoint_dir: shared/a\n") +
         " --wait --json --login " + login.at("alice"));
  ASSERT_EQ(mine.exit_code, 0) << mine.err << mine.out;
  const std::string checkpoints = dir_.Path("work/shared/a");
  const auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::recursive_directory_iterator(checkpoints)) {
      names.push_back(e.path().string() + " " +
                      std::to_string(e.is_regular_file() ? e.file_size() : 0));
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> before = listing();
  ASSERT_TRUE(std::filesystem::exists(checkpoints + "/step-00000006/MANIFEST.json"));

  KcRun theirs =
      Kc("submit " + JobFile("theirs", 100, "checkpoint_every: 1\ncheckpoint_dir: shared/a\n") +
         " --json --login " + login.at("bob"));
  ASSERT_EQ(theirs.exit_code, 0) << theirs.err;
  const int64_t id = Int(nlohmann::json::parse(theirs.out), "id");
  nlohmann::json j = Await(id, [](const nlohmann::json& x) { return x["phase"] == "paused"; });
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("checkpoint.write"));
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("this belongs to alice"));
  EXPECT_EQ(Int(j, "step"), 0);
  EXPECT_EQ(listing(), before);

  KcRun named = Kc("submit " + JobFile("named", 3, "checkpoint_dir: jobs/1/checkpoints\n") +
                   " --login " + login.at("bob"));
  EXPECT_EQ(named.exit_code, 2);
  EXPECT_THAT(named.err, HasSubstr("checkpoint_dir: expected a directory outside jobs/"));
  EXPECT_EQ(agent->Stop(SIGTERM), 0);
  EXPECT_EQ(kcd->Stop(SIGTERM), 0);
}

TEST_F(ClusterTest, JobPathsThatClimbOutOfTheAgentsRootsAreRefused) {
  for (const char* bad :
       {"data: ../../etc/shadow", "checkpoint_dir: /etc/cron.d", "data: fortunes/../../../x"}) {
    KcRun r = Kc("submit " + JobFile("bad", 3, std::string(bad) + "\n"));
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_THAT(r.err, HasSubstr(std::string(bad).substr(0, std::string(bad).find(':'))));
    EXPECT_THAT(r.err, HasSubstr("bad.yaml:5"));
  }
}

}  // namespace
}  // namespace kc::api
