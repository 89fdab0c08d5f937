// A cluster across two hosts made of Linux network namespaces joined by a veth pair: kcd and
// the agent of host h1 in one, the agent of host h2 in the other, every kc command through a
// namespace. Jobs run side by side on both hosts; a job on a host whose agent dies goes back to
// the queue and resumes on the other host from its last checkpoint (the hosts' work
// directories share a checkpoint directory, as hosts share a file system). Jobs larger than a
// host run across hosts, survive the loss of one and grow back, onto it or onto a third host
// (h3, an agent of its own in namespace a). Needs root and iproute2; skips itself otherwise.
// Every namespace and process it makes, it removes.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "tests/support/daemon.h"
#include "tests/support/inventories.h"
#include "tests/support/kc_run.h"
#include "tests/support/netns.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using kc::testing::Daemon;
using kc::testing::KcRun;
using kc::testing::TempDir;
using kc::testing::TwoHosts;
using ::testing::HasSubstr;

class ClusterNetnsTest : public ::testing::Test {
 protected:
  // The training data both hosts' agents read: a small corpus, prepared once.
  static void SetUpTestSuite() {
    data_ = new TempDir("kc_netns_data");
    KcRun r = kc::testing::PrepareMicroData(KC_BINARY, *data_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }

  ClusterNetnsTest() : dir_("kc_netns_cluster") {}
  // A third host, h3, whose agent runs in namespace a beside h1's (a host of its own to kcd:
  // its own agent, devices and work directory).
  explicit ClusterNetnsTest(bool three_hosts) : ClusterNetnsTest() { three_hosts_ = three_hosts; }

  // kc init with kcd's certificate for ip_a, kcd in namespace a, a login, and the agents of
  // h1 (namespace a) and h2 (namespace b).
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces";
    if (!hosts_.ok()) GTEST_SKIP() << "cannot create network namespaces and veth here";
    model_ = dir_.Write("micro.yaml", kc::testing::kMicroModel);
    cluster_ = dir_.Path("cluster");
    w1_ = dir_.Path("w1");
    w2_ = dir_.Path("w2");
    // Both hosts' `shared` is one directory, where the jobs keep their checkpoints.
    std::filesystem::create_directories(dir_.Path("shared"));
    std::filesystem::create_directories(w1_);
    std::filesystem::create_directories(w2_);
    std::filesystem::create_directory_symlink(dir_.Path("shared"), w1_ + "/shared");
    std::filesystem::create_directory_symlink(dir_.Path("shared"), w2_ + "/shared");

    const std::string inventory =
        std::string(kc::testing::kTwoCpuHosts) +
        (three_hosts_ ? "  - {name: h3, model: cpu-slice, count: 2, network: {bandwidth_gbs: 1, "
                        "latency_us: 50}}\n"
                      : "");
    KcRun init = kc::testing::RunKc(KC_BINARY,
                                    fmt::format("init {} --inventory {} --host {}", cluster_,
                                                dir_.Write("inv.yaml", inventory), hosts_.ip_a()));
    ASSERT_EQ(init.exit_code, 0) << init.err;

    kcd_ = std::make_unique<Daemon>(
        fmt::format("ip netns exec {} {} --dir {} --listen {}:0 --agent-lost-after {}", hosts_.a(),
                    KCD_BINARY, cluster_, hosts_.ip_a(), kLeaseS));
    const std::string line = kcd_->WaitForLine("listening on");
    const size_t colon = line.rfind(':');
    ASSERT_NE(colon, std::string::npos) << kcd_->output();
    const std::string port = line.substr(colon + 1, line.find(' ', colon) - colon - 1);
    ASSERT_FALSE(port.empty()) << kcd_->output();
    kcd_port_ = port;

    KcRun login = Kc(hosts_.b(), fmt::format("login --server {}:{} --ca {}/tls/ca.pem "
                                             "--token-file {}/admin.token",
                                             hosts_.ip_a(), port, cluster_, cluster_));
    ASSERT_EQ(login.exit_code, 0) << login.err;
    EXPECT_THAT(login.out, HasSubstr("as admin"));

    agent1_ = StartAgent(hosts_.a(), "h1", w1_);
    agent2_ = StartAgent(hosts_.b(), "h2", w2_);
    ASSERT_THAT(agent1_->WaitForLine("kc agent:"), HasSubstr("host h1 with 2 devices"));
    ASSERT_THAT(agent2_->WaitForLine("kc agent:"), HasSubstr("host h2 with 2 devices"));
    if (three_hosts_) {
      w3_ = dir_.Path("w3");
      std::filesystem::create_directories(w3_);
      std::filesystem::create_directory_symlink(dir_.Path("shared"), w3_ + "/shared");
      agent3_ = StartAgent(hosts_.a(), "h3", w3_);
      ASSERT_THAT(agent3_->WaitForLine("kc agent:"), HasSubstr("host h3 with 2 devices"));
    }
  }

  // Stops the agents (which stop their jobs) and kcd, then whatever a killed agent left behind.
  void TearDown() override {
    for (std::unique_ptr<Daemon>* d : {&supervisor_, &agent1_, &agent2_, &agent3_, &kcd_}) {
      if (*d != nullptr) (*d)->Stop(SIGTERM);
    }
    KillProcessGroupsOf(w1_);
    KillProcessGroupsOf(w2_);
    KillProcessGroupsOf(w3_);
    KillProcessGroupsOf(ws_);
  }

  // A supervisor agent "ctl" in kcd's namespace: it runs the launchers of jobs across hosts.
  void StartSupervisor() {
    ws_ = dir_.Path("ws");
    std::filesystem::create_directories(ws_);
    std::filesystem::create_directory_symlink(dir_.Path("shared"), ws_ + "/shared");
    const std::string token = dir_.Path("ctl.token");
    KcRun issue = kc::testing::RunKc(
        KC_BINARY, fmt::format("token issue --agent ctl --dir {} --out {}", cluster_, token));
    ASSERT_EQ(issue.exit_code, 0) << issue.err;
    supervisor_ = std::make_unique<Daemon>(fmt::format(
        "ip netns exec {} env XDG_CONFIG_HOME={} {} agent --supervisor --host ctl --devices 0 "
        "--work {} --data-root {} --token-file {} --stop-grace {}",
        hosts_.a(), dir_.Path("config"), KC_BINARY, ws_, data_->path(), token, kStopGraceS));
    ASSERT_THAT(supervisor_->WaitForLine("kc agent:"), HasSubstr("host ctl with 0 devices"));
  }

  // A job file of 4 ranks, more than a host has: it runs across both.
  std::string AcrossFile(const std::string& name, int64_t steps, const std::string& more = "") {
    return dir_.Write(name + ".yaml",
                      fmt::format("name: {}\nmodel: {}\nranks: 4\nsteps: {}\ncheckpoint_every: "
                                  "100\ncheckpoint_dir: shared/{}\n{}",
                                  name, model_, steps, name, more));
  }

  // The agent of `host`, with the machine identity a system admin issued it.
  std::unique_ptr<Daemon> StartAgent(const std::string& ns, const std::string& host,
                                     const std::string& work) {
    const std::string token = dir_.Path(host + ".token");
    KcRun issue = kc::testing::RunKc(
        KC_BINARY, fmt::format("token issue --agent {} --dir {} --out {}", host, cluster_, token));
    EXPECT_EQ(issue.exit_code, 0) << issue.err;
    return std::make_unique<Daemon>(fmt::format(
        "ip netns exec {} env XDG_CONFIG_HOME={} {} agent --host {} --devices 2 --work {} "
        "--data-root {} --token-file {} --stop-grace {}",
        ns, dir_.Path("config"), KC_BINARY, host, work, data_->path(), token, kStopGraceS));
  }

  // Kills the process groups of every process whose command line names `path` (a host's work
  // directory): the `kc train` sessions an agent started. Returns how many processes named it.
  static int KillProcessGroupsOf(const std::string& path) {
    if (path.empty()) return 0;
    int n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      const pid_t pid = std::stoi(name);
      std::ifstream in(e.path() / "cmdline");
      const std::string cmdline((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
      if (pid == getpid() || cmdline.find(path + "/") == std::string::npos) continue;
      const pid_t group = getpgid(pid);
      if (group > 1 && group != getpgrp()) kill(-group, SIGKILL);
      kill(pid, SIGKILL);
      ++n;
    }
    return n;
  }

  // Whether some process's command line names `path` (a host's work directory).
  static bool SomeProcessOf(const std::string& path) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
      std::ifstream in(e.path() / "cmdline");
      const std::string cmdline((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
      if (cmdline.find(path + "/") != std::string::npos) return true;
    }
    return false;
  }

  // Whether a process whose command line names `path` (a host's work directory) blocks
  // SIGTERM, and whether there is one.
  static std::pair<bool, bool> SomeProcessOfBlocksSigterm(const std::string& path) {
    bool found = false, blocked = false;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
      std::ifstream in(e.path() / "cmdline");
      const std::string cmdline((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
      if (cmdline.find(path + "/") == std::string::npos) continue;
      std::ifstream status(e.path() / "status");
      for (std::string line; std::getline(status, line);) {
        if (line.rfind("SigBlk:", 0) != 0) continue;
        found = true;
        blocked |= (std::stoull(line.substr(7), nullptr, 16) >> (SIGTERM - 1)) & 1;
      }
    }
    return {found, blocked};
  }

  // Runs kc inside namespace `ns` (the host namespace has no route to kcd) with this test's
  // configuration directory (its login).
  KcRun Kc(const std::string& ns, const std::string& args) {
    return kc::testing::RunKc(fmt::format("ip netns exec {} env XDG_CONFIG_HOME={} {}", ns,
                                          dir_.Path("config"), KC_BINARY),
                              args);
  }
  KcRun Kc(const std::string& args) { return Kc(hosts_.a(), args); }

  // A job file for the micro model, keeping its checkpoints in the hosts' shared directory.
  std::string JobFile(const std::string& name, int64_t steps) {
    return dir_.Write(name + ".yaml",
                      fmt::format("name: {}\nmodel: {}\nranks: 2\nsteps: {}\ncheckpoint_every: "
                                  "100\ncheckpoint_dir: shared/{}\n",
                                  name, model_, steps, name));
  }

  int64_t Submit(const std::string& name, int64_t steps) {
    return SubmitFile(JobFile(name, steps));
  }
  int64_t SubmitFile(const std::string& file) {
    KcRun r = Kc("submit " + file + " --json");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_object() ? Int(j, "id") : -1;
  }

  // The job as `kc job show --json` prints it.
  nlohmann::json Show(int64_t id) {
    KcRun r = Kc(fmt::format("job show {} --json", id));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out, nullptr, false);
  }

  // Polls the job until `done` holds for it (a remote phase: nothing local to wait on), for
  // at most two minutes; returns the last view.
  nlohmann::json Await(int64_t id, const std::function<bool(const nlohmann::json&)>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    nlohmann::json j;
    while (std::chrono::steady_clock::now() < deadline) {
      j = Show(id);
      if (j.is_object() && done(j)) return j;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "job " << id << " never got there: " << j.dump();
    return j;
  }

  // The step losses of a metrics file.
  static std::vector<double> StepLosses(const std::string& path) {
    std::vector<double> losses;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.value("type", "") == "step") losses.push_back(j["loss"].get<double>());
    }
    return losses;
  }

  static int64_t Int(const nlohmann::json& j, const char* key) {
    // Protobuf's JSON writes 64-bit integers as strings.
    const nlohmann::json& v = j.at(key);
    return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
  }

  static bool Ended(const nlohmann::json& j) {
    return j["phase"] == "succeeded" || j["phase"] == "failed" || j["phase"] == "cancelled";
  }

  // Whether a reason in the job's history says `text`.
  static bool Noted(const nlohmann::json& j, const std::string& text) {
    return NotedAt(j, text) >= 0;
  }
  // When (time_s) the first reason in the job's history that says `text` was written; -1: none.
  static double NotedAt(const nlohmann::json& j, const std::string& text) {
    for (const nlohmann::json& e : j["history"]) {
      if (e.value("reason", "").find(text) != std::string::npos) return e["time_s"].get<double>();
    }
    return -1;
  }

  // Submits an elastic job of 4 ranks (at least 2) and waits until it trains across h1 and h2
  // (the scheduler places in host order, rank 0 on h1). Its id; -1 when it runs elsewhere.
  int64_t RunningAcrossH1H2(const std::string& name) {
    const int64_t id = SubmitFile(AcrossFile(name, 1000000, "min_devices: 2\n"));
    Await(id,
          [](const nlohmann::json& j) { return j["phase"] == "running" && Int(j, "step") >= 20; });
    const nlohmann::json j = Show(id);
    EXPECT_EQ(j["host"], "h1, h2 (launcher on ctl)") << j.dump();
    return j["host"] == "h1, h2 (launcher on ctl)" ? id : -1;
  }

  static bool RunningWithCheckpoint(const nlohmann::json& j) {
    return j["phase"] == "running" && Int(j, "checkpoint_step") >= 100;
  }

  // Two long jobs, one a host (each needs both devices of one); the one on h1 is cancelled
  // and its processes gone. The id of the one on h2, running with a checkpoint; -1 on failure.
  int64_t OneJobOnH2() {
    const int64_t first = Submit("first", 1000000);
    const int64_t second = Submit("second", 1000000);
    const nlohmann::json a = Await(first, RunningWithCheckpoint);
    const nlohmann::json b = Await(second, RunningWithCheckpoint);
    const bool first_on_h2 = a["host"] == "h2";
    EXPECT_EQ((first_on_h2 ? b : a)["host"], "h1");
    const int64_t on_h1 = first_on_h2 ? second : first;
    if (Kc(fmt::format("job cancel {}", on_h1)).exit_code != 0) return -1;
    Await(on_h1, [&](const nlohmann::json& j) {
      return j["phase"] == "cancelled" && !SomeProcessOf(w1_);
    });
    return first_on_h2 ? first : second;
  }

  // The job on h2 was requeued because h2 was lost, runs on h1, and went on from its
  // checkpoint in the shared directory, not from step 0.
  void ExpectResumedOnH1AfterH2WasLost(int64_t id) {
    const nlohmann::json j = Await(
        id, [](const nlohmann::json& x) { return x["phase"] == "running" && x["host"] == "h1"; });
    bool requeued = false;
    for (const nlohmann::json& e : j["history"]) {
      requeued |= e["phase"] == "queued" &&
                  e["reason"].get<std::string>().find("host h2 lost") != std::string::npos;
    }
    EXPECT_TRUE(requeued) << j.dump();
    Await(id, [&](const nlohmann::json&) {
      return Kc(fmt::format("job logs {}", id)).out.find("kc train: resuming from") !=
             std::string::npos;
    });
  }

  static constexpr int kStopGraceS = 5;  // the agents'
  // kcd's --agent-lost-after, the agents' lease: a heartbeat answered within it, also under a
  // sanitizer's slowdown (an agent measures from the call, so the call's time counts).
  static constexpr int kLeaseS = 5;
  static TempDir* data_;
  // Declared first: the namespaces go last, after every process in them.
  TwoHosts hosts_;
  TempDir dir_;
  bool three_hosts_ = false;
  std::string model_, cluster_, w1_, w2_, w3_, ws_, kcd_port_;
  std::unique_ptr<Daemon> kcd_, agent1_, agent2_, agent3_, supervisor_;
};

TempDir* ClusterNetnsTest::data_ = nullptr;

// Three hosts of 2 devices: a job of 4 ranks runs over two of them, and the third is free.
class ClusterThreeHostsNetnsTest : public ClusterNetnsTest {
 protected:
  ClusterThreeHostsNetnsTest() : ClusterNetnsTest(/*three_hosts=*/true) {}
};

TEST_F(ClusterNetnsTest, AgentsInTwoNamespacesRunJobsSideBySide) {
  // Each job needs both devices of a host: the two run at once only on two hosts.
  const int64_t first = Submit("first", 1000000);
  const int64_t second = Submit("second", 1000000);
  const nlohmann::json a = Await(first, RunningWithCheckpoint);
  const nlohmann::json b = Await(second, RunningWithCheckpoint);
  EXPECT_EQ(Show(first)["phase"], "running");  // still, while the second runs
  const std::set<std::string> hosts = {a["host"].get<std::string>(), b["host"].get<std::string>()};
  EXPECT_EQ(hosts, (std::set<std::string>{"h1", "h2"}));
  // Their processes hear the SIGTERM a stop order sends (the agent blocks it for itself).
  for (const std::string& work : {w1_, w2_}) {
    EXPECT_EQ(SomeProcessOfBlocksSigterm(work), std::make_pair(true, false)) << work;
  }

  for (int64_t id : {first, second}) {
    KcRun cancel = Kc(hosts_.b(), fmt::format("job cancel {}", id));
    ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
    EXPECT_EQ(Show(id)["phase"], "cancelled");
  }
  // The devices are free again: a short job runs to the end.
  KcRun short_job = Kc("submit " + JobFile("short", 3) + " --wait --json");
  ASSERT_EQ(short_job.exit_code, 0) << short_job.err << short_job.out;
  EXPECT_EQ(nlohmann::json::parse(short_job.out)["phase"], "succeeded");

  EXPECT_EQ(agent2_->Stop(SIGTERM), 0);
  EXPECT_EQ(agent1_->Stop(SIGTERM), 0);
  EXPECT_EQ(kcd_->Stop(SIGTERM), 0);
}

TEST_F(ClusterNetnsTest, AJobOnALostHostResumesOnTheOtherHost) {
  const int64_t on_h2 = OneJobOnH2();
  ASSERT_GE(on_h2, 0);

  // h2's agent dies. Its job's processes keep running in their own session (an agent killed
  // outright does not take them along); a host lost takes them with it, so the test kills
  // them too.
  agent2_->Stop(SIGKILL);
  const int orphans = KillProcessGroupsOf(w2_);
  std::cerr << "killed " << orphans << " process(es) left behind by h2's dead agent\n";

  ExpectResumedOnH1AfterH2WasLost(on_h2);

  KcRun cancel = Kc(fmt::format("job cancel {}", on_h2));
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_EQ(Show(on_h2)["phase"], "cancelled");
  EXPECT_EQ(agent1_->Stop(SIGTERM), 0);
  EXPECT_EQ(kcd_->Stop(SIGTERM), 0);
}

// A host cut off (its link down): its agent cannot reach kcd and stops its run within its lease
// (fencing); kcd starts the job on the other host only after that lease and the agent's stop
// grace, so the two runs never overlap; the job resumes from the checkpoint the fenced run
// saved in the shared directory. Back on the network, the host takes jobs again.
TEST_F(ClusterNetnsTest, ACutHostStopsItsRunBeforeTheJobStartsElsewhereAndComesBack) {
  const int64_t on_h2 = OneJobOnH2();
  ASSERT_GE(on_h2, 0);

  ASSERT_EQ(kc::testing::Sh("ip -n " + hosts_.b() + " link set " + hosts_.dev_b() + " down"), 0);
  const auto cut = std::chrono::steady_clock::now();
  // Until the job runs on h1: h2's run must be gone before anything of it starts there.
  std::optional<double> h2_gone_s;
  bool overlapped = false;
  const auto deadline = cut + std::chrono::minutes(2);
  while (std::chrono::steady_clock::now() < deadline) {
    const bool on_h2_still = SomeProcessOf(w2_);
    const bool on_h1_now = SomeProcessOf(w1_);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
    if (!on_h2_still && !h2_gone_s) h2_gone_s = t;
    overlapped |= on_h2_still && on_h1_now;
    if (on_h1_now && h2_gone_s) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(h2_gone_s.has_value()) << "h2's run never stopped";
  EXPECT_FALSE(overlapped) << "the job ran on both hosts at once";
  // The lease, a heartbeat period, and the grace at most.
  EXPECT_LT(*h2_gone_s, kLeaseS + 1 + kStopGraceS)
      << "h2's run outlived its agent's lease and grace";
  std::cerr << "h2's run stopped " << *h2_gone_s << " s after the cut\n";

  ExpectResumedOnH1AfterH2WasLost(on_h2);

  // h2 back: with h1 busy, a job needing a whole host runs there.
  ASSERT_EQ(kc::testing::Sh("ip -n " + hosts_.b() + " link set " + hosts_.dev_b() + " up"), 0);
  KcRun short_job = Kc("submit " + JobFile("short", 3) + " --wait --json");
  ASSERT_EQ(short_job.exit_code, 0) << short_job.err << short_job.out;
  const nlohmann::json done = nlohmann::json::parse(short_job.out);
  EXPECT_EQ(done["phase"], "succeeded");
  EXPECT_EQ(done["host"], "h2");
  EXPECT_EQ(Show(on_h2)["host"], "h1");  // the job runs on, once

  ASSERT_EQ(Kc(fmt::format("job cancel {}", on_h2)).exit_code, 0);
  EXPECT_EQ(agent2_->Stop(SIGTERM), 0);
  EXPECT_EQ(agent1_->Stop(SIGTERM), 0);
  EXPECT_EQ(kcd_->Stop(SIGTERM), 0);
}

// A job larger than a host runs across two of the three: its launcher on the supervisor agent,
// a share of two ranks on each host, its store served by kcd; the losses are those of the same
// training on one machine.
TEST_F(ClusterThreeHostsNetnsTest, AJobLargerThanAHostRunsAcrossTwoWithTheLossesOfOneMachine) {
  // Without a supervisor agent it waits, saying so.
  const int64_t id = SubmitFile(AcrossFile("across", 40));
  Await(id, [](const nlohmann::json& j) {
    return j["phase"] == "queued" &&
           j["reason"].get<std::string>().find("waits for a supervisor agent") != std::string::npos;
  });
  StartSupervisor();
  const nlohmann::json done = Await(id, Ended);
  EXPECT_EQ(done["phase"], "succeeded") << done.dump();
  EXPECT_EQ(done["host"], "h1, h2 (launcher on ctl)") << done.dump();
  std::vector<double> across, one;
  for (const auto& e : std::filesystem::recursive_directory_iterator(ws_ + "/jobs")) {
    if (e.path().filename() == "metrics.jsonl") across = StepLosses(e.path().string());
  }
  KcRun local = kc::testing::RunKc(
      KC_BINARY, fmt::format("train {} --ranks 4 --steps 40 --data {}/fortunes/manifest.json "
                             "--checkpoint-every 100 --progress none --out {}",
                             model_, data_->path(), dir_.Path("one")));
  ASSERT_EQ(local.exit_code, 0) << local.err;
  one = StepLosses(dir_.Path("one/metrics.jsonl"));
  ASSERT_EQ(across.size(), 40u) << Kc(fmt::format("job logs {}", id)).out;
  ASSERT_EQ(one.size(), across.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(across[i], one[i], 1e-4 * one[i]) << i;
  // kcd sent the cluster's inventory with the run: rank 0 (on h1) chose its all-reduce by it.
  // A share's lines are in the job's log under its host's name.
  EXPECT_THAT(Kc(fmt::format("job logs {}", id)).out,
              ::testing::ContainsRegex("\\[host h1\\] kc train: generation 0: a gradient "
                                       "bucket's all-reduce .* by (ring|recursive_doubling|"
                                       "hierarchical), as inventory test's cost model advises"));
}

// The host of rank 0 dies (its agent and its ranks) while an elastic job runs across both
// hosts: the job is not requeued; the launcher, with the store in kcd, goes on with the other
// host's ranks from their own state, and the job succeeds.
TEST_F(ClusterNetnsTest, AJobAcrossHostsSurvivesTheLossOfTheHostOfRankZero) {
  StartSupervisor();
  const int64_t id = SubmitFile(AcrossFile("survive", 1000, "min_devices: 2\n"));
  Await(id,
        [](const nlohmann::json& j) { return j["phase"] == "running" && Int(j, "step") >= 100; });
  ASSERT_EQ(Show(id)["host"], "h1, h2 (launcher on ctl)");
  // h1 holds ranks 0 and 1 (the scheduler places in host order).
  agent1_->Stop(SIGKILL);
  KillProcessGroupsOf(w1_);
  const nlohmann::json j =
      Await(id, [](const nlohmann::json& x) { return Ended(x) || x["phase"] == "queued"; });
  EXPECT_EQ(j["phase"], "succeeded") << j.dump();
  bool shrank = false, worker0 = false;
  for (const nlohmann::json& e : j["history"]) {
    const std::string reason = e.value("reason", "");
    shrank |= reason.find("shrank to 2 ranks") != std::string::npos &&
              reason.find("restored from replica") != std::string::npos;
    worker0 |= reason.find("worker 0 failed: host h1") != std::string::npos;
  }
  EXPECT_TRUE(shrank) << j.dump();
  EXPECT_TRUE(worker0) << j.dump();
}

// The host of an elastic job across hosts is lost, then comes back: kcd shrinks the run to the
// other host once the lost host's lease has run out, and when its agent registers again the
// scheduler grows the run back onto it: kcd starts a share there and tells the launcher the
// run's hosts, whose new workers join the run. The job never goes back to the queue.
TEST_F(ClusterNetnsTest, AJobAcrossHostsGrowsBackOntoAHostThatComesBack) {
  StartSupervisor();
  const int64_t id = RunningAcrossH1H2("grow");
  ASSERT_GE(id, 0);
  agent2_->Stop(SIGKILL);
  KillProcessGroupsOf(w2_);
  // The launcher goes on with h1's ranks; kcd, once h2 is taken for lost, shrinks the run.
  nlohmann::json j = Await(id, [&](const nlohmann::json& x) {
    return Ended(x) || (Noted(x, "shrinks it from 4 to 2 devices (h1:2)") &&
                        x["host"] == "h1 (launcher on ctl)");
  });
  ASSERT_EQ(j["phase"], "running") << j.dump();
  EXPECT_TRUE(Noted(j, "shrank to 2 ranks")) << j.dump();
  const int64_t step_before = Int(j, "step");

  agent2_ = StartAgent(hosts_.b(), "h2", w2_);
  ASSERT_THAT(agent2_->WaitForLine("kc agent:"), HasSubstr("host h2 with 2 devices"));
  j = Await(id, [&](const nlohmann::json& x) {
    return Ended(x) || (Noted(x,
                              "grows it from 2 to 4 devices (h1:2, h2:2; a share starts on "
                              "h2)") &&
                        Noted(x, "grew to 4 ranks") && Int(x, "step") > step_before + 10);
  });
  ASSERT_EQ(j["phase"], "running") << j.dump();
  EXPECT_EQ(j["host"], "h1, h2 (launcher on ctl)");
  EXPECT_TRUE(SomeProcessOf(w2_)) << "no rank runs on h2";
  EXPECT_FALSE(Noted(j, "resumes from its last checkpoint")) << "requeued: " << j.dump();
  const std::string logs = Kc(fmt::format("job logs {}", id)).out;
  EXPECT_THAT(logs, HasSubstr("kc train: the run's hosts are now h1:2,h2:2"));
  std::cerr << fmt::format(
      "h2 lost: shrank to 2 ranks {:.1f} s after its first rank's failure was noted, kcd "
      "shrank the job {:.1f} s after; back at 4 ranks {:.1f} s after kcd's grow\n",
      NotedAt(j, "shrank to 2 ranks") - NotedAt(j, "failed: host h2"),
      NotedAt(j, "shrinks it from 4") - NotedAt(j, "failed: host h2"),
      NotedAt(j, "grew to 4 ranks") - NotedAt(j, "grows it from 2"));

  ASSERT_EQ(Kc(fmt::format("job cancel {}", id)).exit_code, 0);
  Await(id, [&](const nlohmann::json& x) {
    return x["phase"] == "cancelled" && !SomeProcessOf(w1_) && !SomeProcessOf(w2_);
  });
}

// The host of rank 0 (h1) dies while an elastic job of 4 ranks runs on h1 and h2: h2's ranks go
// on, and once kcd takes h1 for lost the scheduler moves its place to h3, which was free: the
// run grows back to 4 ranks over h2 and h3 and trains on, without going back to the queue.
TEST_F(ClusterThreeHostsNetnsTest, ALostHostsPlaceGoesToAFreeHost) {
  StartSupervisor();
  const int64_t id = RunningAcrossH1H2("replace");
  ASSERT_GE(id, 0);
  agent1_->Stop(SIGKILL);
  KillProcessGroupsOf(w1_);
  nlohmann::json j = Await(id, [](const nlohmann::json& x) {
    return Ended(x) || Noted(x, "grows it from 2 to 4 devices (h2:2, h3:2; a share starts on h3)");
  });
  ASSERT_EQ(j["phase"], "running") << j.dump();
  EXPECT_TRUE(Noted(j, "worker 0 failed: host h1")) << j.dump();
  EXPECT_TRUE(Noted(j, "shrinks it from 4 to 2 devices (h2:2)")) << j.dump();
  const int64_t step_then = Int(j, "step");
  j = Await(id, [&](const nlohmann::json& x) {
    return Ended(x) || (Noted(x, "grew to 4 ranks") && Int(x, "step") > step_then + 10 &&
                        x["host"] == "h2, h3 (launcher on ctl)");
  });
  ASSERT_EQ(j["phase"], "running") << j.dump();
  EXPECT_FALSE(Noted(j, "resumes from its last checkpoint")) << "requeued: " << j.dump();
  EXPECT_TRUE(SomeProcessOf(w3_)) << "no rank runs on h3";
  EXPECT_THAT(Kc(fmt::format("job logs {}", id)).out,
              HasSubstr("[host h3] kc train: --share h3: serving its ranks"));
  ASSERT_EQ(Kc(fmt::format("job cancel {}", id)).exit_code, 0);
  Await(id, [&](const nlohmann::json& x) {
    return x["phase"] == "cancelled" && !SomeProcessOf(w2_) && !SomeProcessOf(w3_);
  });
}

// h2's link is cut while an elastic job of 4 ranks runs on h1 and h2: h2's share, cut off from
// the run's store, kills its ranks within its host timeout, long before kcd takes h2 for lost;
// h1's ranks go on, and the run grows onto h3, which was free, only after h2's ranks are gone:
// the job never runs twice on h2's place.
TEST_F(ClusterThreeHostsNetnsTest, ACutHostsRanksStopBeforeItsPlaceGoesToAFreeHost) {
  StartSupervisor();
  const int64_t id = RunningAcrossH1H2("cut");
  ASSERT_GE(id, 0);
  ASSERT_FALSE(SomeProcessOf(w3_));
  ASSERT_EQ(kc::testing::Sh("ip -n " + hosts_.b() + " link set " + hosts_.dev_b() + " down"), 0);
  const auto cut = std::chrono::steady_clock::now();
  std::optional<double> h2_gone_s, h3_up_s;
  bool overlapped = false;
  while (std::chrono::steady_clock::now() < cut + std::chrono::minutes(2) && !h3_up_s) {
    const bool on_h2 = SomeProcessOf(w2_), on_h3 = SomeProcessOf(w3_);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
    if (!on_h2 && !h2_gone_s) h2_gone_s = t;
    if (on_h3) h3_up_s = t;
    overlapped |= on_h2 && on_h3;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(h2_gone_s.has_value()) << "h2's run never stopped";
  ASSERT_TRUE(h3_up_s.has_value()) << "the run never grew onto h3";
  EXPECT_FALSE(overlapped) << "h2's ranks still ran when h3's started";
  // The share's fence: its host timeout (2 s), with its agent's lease (5 s) and grace behind it.
  EXPECT_LT(*h2_gone_s, kLeaseS + 1 + kStopGraceS) << "h2's ranks outlived the lease";
  std::cerr << "h2's ranks stopped " << *h2_gone_s << " s after the cut; h3 started at " << *h3_up_s
            << " s\n";
  const nlohmann::json j = Await(id, [](const nlohmann::json& x) {
    return Ended(x) || (Noted(x, "grew to 4 ranks") && x["host"] == "h1, h3 (launcher on ctl)");
  });
  ASSERT_EQ(j["phase"], "running") << j.dump();
  EXPECT_TRUE(Noted(j, "failed: host h2")) << j.dump();
  EXPECT_FALSE(Noted(j, "resumes from its last checkpoint")) << "requeued: " << j.dump();
  ASSERT_EQ(Kc(fmt::format("job cancel {}", id)).exit_code, 0);
  Await(id, [&](const nlohmann::json& x) {
    return x["phase"] == "cancelled" && !SomeProcessOf(w1_) && !SomeProcessOf(w3_);
  });
}

// kcd restarts while a job runs across hosts: the run's store went with it, so the run cannot go
// on (its shares, cut off from the store, stop their ranks); it ends rather than hang, and the
// job starts again across the hosts from its checkpoint under the new kcd.
TEST_F(ClusterNetnsTest, AJobAcrossHostsStartsAgainFromItsCheckpointAfterKcdRestarts) {
  StartSupervisor();
  const int64_t id = SubmitFile(AcrossFile("restart", 1000000, "min_devices: 2\n"));
  Await(id, RunningWithCheckpoint);
  ASSERT_EQ(kcd_->Stop(SIGTERM), 0) << kcd_->output();
  kcd_ = std::make_unique<Daemon>(
      fmt::format("ip netns exec {} {} --dir {} --listen {}:{} --agent-lost-after {}", hosts_.a(),
                  KCD_BINARY, cluster_, hosts_.ip_a(), kcd_port_, kLeaseS));
  ASSERT_NE(kcd_->WaitForLine("listening on"), "") << kcd_->output();
  const nlohmann::json j = Await(id, [](const nlohmann::json& x) {
    int runs = 0;
    for (const nlohmann::json& e : x["history"]) {
      runs += e["phase"] == "running" &&
              e.value("reason", "").find("running on h1, h2") != std::string::npos;
    }
    return Ended(x) || (runs >= 2 && x["phase"] == "running");
  });
  ASSERT_EQ(j["phase"], "running") << j.dump();
  EXPECT_TRUE(Noted(j, "kcd has no record of its run; resumes from its last checkpoint"))
      << j.dump();
  Await(id, [&](const nlohmann::json&) {
    const std::string logs = Kc(fmt::format("job logs {}", id)).out;
    return logs.find("kc train: resuming from") != std::string::npos;
  });
  ASSERT_EQ(Kc(fmt::format("job cancel {}", id)).exit_code, 0);
}

// A command job larger than a host runs across both: kc run's supervisor on the supervisor
// agent starts each rank through its host's share (kc run --share), with its part of torchrun's
// contract. Rank 0 listens where MASTER_ADDR and MASTER_PORT say, as a PyTorch program's
// TCPStore does, and the ranks of the other host reach it there.
TEST_F(ClusterNetnsTest, ACommandJobLargerThanAHostRunsAcrossBoth) {
  StartSupervisor();
  const std::string program = dir_.Write("gather.py", R"(import os, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print(f"rank {rank} of {world} group {os.environ['GROUP_RANK']} local "
      f"{os.environ['LOCAL_RANK']}/{os.environ['LOCAL_WORLD_SIZE']} master {addr}", flush=True)
if "KC_HEARTBEAT_FILE" in os.environ:
    open(os.environ["KC_HEARTBEAT_FILE"], "a").close()
    print(f"rank {rank} beats every {os.environ['KC_HEARTBEAT_PERIOD']} s", flush=True)
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(120)
    got = []
    for _ in range(world - 1):
        c, _ = server.accept()
        got.append(int(c.recv(16).decode()))
        c.close()
    print("gathered " + ",".join(str(r) for r in sorted(got)), flush=True)
else:
    deadline = time.time() + 120
    while True:  # rank 0 may not listen yet: a TCPStore client retries the same way
        try:
            c = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    c.sendall(str(rank).encode())
    c.close()
)");
  const int64_t id = SubmitFile(
      dir_.Write("gather.yaml", fmt::format("name: gather\ncommand: [python3, {}]\nranks: 4\n"
                                            "heartbeat_timeout: 60\nheartbeat_period: 2\n",
                                            program)));
  const nlohmann::json done = Await(id, Ended);
  const std::string logs = Kc(fmt::format("job logs {}", id)).out;
  EXPECT_EQ(done["phase"], "succeeded") << done.dump() << logs;
  EXPECT_EQ(done["host"], "h1, h2 (launcher on ctl)") << done.dump();
  // h1 holds ranks 0 and 1 (the scheduler places in host order): its address is MASTER_ADDR.
  const std::string master = hosts_.ip_a();
  for (const std::string& line :
       {"[rank 0] rank 0 of 4 group 0 local 0/2 master " + master,
        "[rank 1] rank 1 of 4 group 0 local 1/2 master " + master,
        "[rank 2] rank 2 of 4 group 1 local 0/2 master " + master,
        "[rank 3] rank 3 of 4 group 1 local 1/2 master " + master,
        std::string("[rank 3] rank 3 beats every 2 s"), std::string("[rank 0] gathered 1,2,3")}) {
    EXPECT_THAT(logs, HasSubstr(line));
  }
}

}  // namespace
}  // namespace kc::api
