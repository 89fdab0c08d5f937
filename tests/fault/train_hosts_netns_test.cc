// `kc train` across two hosts made of Linux network namespaces joined by a veth pair: the
// launcher (and the run's store) in namespace a, a share of two ranks in each namespace, TCP
// between the hosts and shared memory inside each. The losses are those of the same run on one
// host; a host killed with its ranks (the host of rank 0) leaves the other training on from its
// own state; a host whose link is cut kills its own ranks while the other trains on. Needs root
// and iproute2; skips itself otherwise. Every namespace and process it makes, it removes.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/daemon.h"
#include "tests/support/inventories.h"
#include "tests/support/kc_run.h"
#include "tests/support/netns.h"
#include "tests/support/temp_dir.h"

namespace {

using kc::testing::Daemon;
using kc::testing::KcRun;
using kc::testing::Sh;
using kc::testing::TempDir;
using kc::testing::TwoHosts;
using ::testing::HasSubstr;

// The step losses of a metrics file, by step.
std::map<int64_t, double> Losses(const std::string& metrics) {
  std::map<int64_t, double> losses;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("type", "") == "step") {
      losses[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
  }
  return losses;
}

std::vector<nlohmann::json> Faults(const std::string& path) {
  std::vector<nlohmann::json> faults;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) faults.push_back(nlohmann::json::parse(line));
  return faults;
}

class TrainHostsNetnsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir("kc_hosts_data");
    KcRun r = kc::testing::PrepareMicroData(KC_BINARY, *data_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }

  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces";
    if (!hosts_.ok()) GTEST_SKIP() << "cannot create network namespaces and veth here";
    model_ = dir_.Write("micro.yaml", kc::testing::kMicroModel);
    port_ = 29600 + getpid() % 300;
  }

  // The flags every part of the run gives: the same model and training.
  std::string Flags(int steps, const std::string& extra = "") const {
    return fmt::format(
        "{} --ranks 4 --steps {} --data {}/fortunes/manifest.json --eval-every 0 --progress lines "
        "--checkpoint-dir {} {}",
        model_, steps, data_->path(), dir_.Path("ckpt"), extra);
  }
  // The launcher in namespace a, the hosts in placement order (rank 0 on the first).
  // Every part of the run has the store's token ($KC_RENDEZVOUS_TOKEN) unless told otherwise.
  std::unique_ptr<Daemon> Launcher(const std::string& flags, const std::string& hosts) {
    return std::make_unique<Daemon>(fmt::format(
        "ip netns exec {} env KC_RENDEZVOUS_TOKEN={} {} train {} --hosts {} --listen {}:{} --out "
        "{} 2>&1",
        hosts_.a(), kToken, KC_BINARY, flags, hosts, hosts_.ip_a(), port_, dir_.Path("out")));
  }
  std::unique_ptr<Daemon> Share(const std::string& ns, const std::string& host,
                                const std::string& flags, const std::string& token = kToken) {
    return std::make_unique<Daemon>(
        fmt::format("ip netns exec {} env KC_RENDEZVOUS_TOKEN={} {} train {} --share {} "
                    "--rendezvous {}:{} 2>&1",
                    ns, token, KC_BINARY, flags, host, hosts_.ip_a(), port_));
  }
  static constexpr char kToken[] = "0123abcd-the-runs-secret";
  // The same training on this machine alone.
  std::map<int64_t, double> OneHostLosses(int steps, const std::string& extra = "") {
    KcRun one = kc::testing::RunKc(
        KC_BINARY, fmt::format("train {} --ranks 4 --steps {} --data {}/fortunes/manifest.json "
                               "--eval-every 0 --progress none --out {} {}",
                               model_, steps, data_->path(), dir_.Path("one"), extra));
    EXPECT_EQ(one.exit_code, 0) << one.err;
    return Losses(dir_.Path("one/metrics.jsonl"));
  }
  // Every step of `a` has the loss of that step of `b`. A run that lost the host of rank 0 may
  // miss the reports rank 0 sent just before (`missing` of them at most); the others, and the
  // last step, are there.
  static void ExpectSameLosses(const std::map<int64_t, double>& a,
                               const std::map<int64_t, double>& b, size_t missing = 0) {
    ASSERT_FALSE(b.empty());
    ASSERT_LE(a.size(), b.size());
    EXPECT_GE(a.size() + missing, b.size());
    EXPECT_EQ(a.count(b.rbegin()->first), 1u);
    for (const auto& [step, loss] : a) {
      ASSERT_EQ(b.count(step), 1u) << step;
      EXPECT_NEAR(loss, b.at(step), 1e-4 * std::abs(b.at(step))) << step;
    }
  }

  static TempDir* data_;
  TempDir dir_{"kc_hosts"};
  TwoHosts hosts_;
  std::string model_;
  int port_ = 0;
};
TempDir* TrainHostsNetnsTest::data_ = nullptr;

TEST_F(TrainHostsNetnsTest, TwoHostsGiveTheLossesOfOneHost) {
  const std::string flags = Flags(30);
  std::unique_ptr<Daemon> launcher = Launcher(flags, "h1:2,h2:2");
  ASSERT_THAT(launcher->WaitForLine("rendezvous at"), HasSubstr(hosts_.ip_a()));
  std::unique_ptr<Daemon> h1 = Share(hosts_.a(), "h1", flags);
  std::unique_ptr<Daemon> h2 = Share(hosts_.b(), "h2", flags);
  EXPECT_THAT(h2->WaitForLine("serving"), HasSubstr("this host is " + hosts_.ip_b()));
  ASSERT_EQ(launcher->Finish(), 0) << launcher->output();
  EXPECT_EQ(h1->Finish(), 0) << h1->output();
  EXPECT_EQ(h2->Finish(), 0) << h2->output();
  EXPECT_THAT(h2->output(), HasSubstr("the run is over"));
  ExpectSameLosses(Losses(dir_.Path("out/metrics.jsonl")), OneHostLosses(30));
  // A clean link: kc diagnose finds nothing wrong with it.
  KcRun d = kc::testing::RunKc(KC_BINARY, "diagnose --json " + dir_.Path("out"));
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_THAT(d.out, ::testing::Not(HasSubstr("retransmit"))) << d.out;
}

// With the cluster's inventory every part of the run places the ranks on its hosts' devices
// and the gradients' all-reduce follows its cost model; the losses stay those of one host. An
// inventory without a host of --hosts, or a share with another inventory, is refused.
TEST_F(TrainHostsNetnsTest, WithTheInventoryTheCollectivesFollowItsCostModel) {
  const std::string inventory = dir_.Write("cluster.yaml", kc::testing::kTwoCpuHosts);
  const std::string flags = Flags(20, "--inventory " + inventory);
  std::unique_ptr<Daemon> launcher = Launcher(flags, "h1:2,h2:2");
  ASSERT_THAT(launcher->WaitForLine("rendezvous at"), HasSubstr(hosts_.ip_a()));
  std::unique_ptr<Daemon> h1 = Share(hosts_.a(), "h1", flags);
  std::unique_ptr<Daemon> h2 = Share(hosts_.b(), "h2", flags);
  ASSERT_EQ(launcher->Finish(), 0) << launcher->output();
  EXPECT_EQ(h1->Finish(), 0) << h1->output();
  EXPECT_EQ(h2->Finish(), 0) << h2->output();
  // Rank 0 runs on h1 and says what the cost model chose for its generation.
  EXPECT_THAT(h1->output() + launcher->output(),
              ::testing::ContainsRegex("generation 0: a gradient bucket's all-reduce \\([0-9]+ "
                                       "bytes over 4 ranks\\) by (ring|recursive_doubling|"
                                       "hierarchical), as inventory test's cost model advises"));
  ExpectSameLosses(Losses(dir_.Path("out/metrics.jsonl")), OneHostLosses(20));

  // h3 is not in the inventory: the launcher names it before anything starts.
  KcRun bad = kc::testing::RunKc(
      KC_BINARY, fmt::format("train {} --hosts h1:2,h3:2 --listen 127.0.0.1:{} --out {}", flags,
                             port_ + 1, dir_.Path("bad")));
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("host h3 is not in --inventory's topology test"));
  // One host's ranks on a host of the inventory with fewer devices.
  bad = kc::testing::RunKc(
      KC_BINARY, fmt::format("train {} --hosts h1:3,h2:1 --listen 127.0.0.1:{} --out {}", flags,
                             port_ + 1, dir_.Path("bad")));
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("host h1 runs 3 ranks, and --inventory's topology test gives "
                                 "it 2 devices"));
  // Without a host list the inventory has nothing to place.
  bad = kc::testing::RunKc(KC_BINARY, "train " + flags + " --out " + dir_.Path("bad"));
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("--inventory is for a run across hosts"));
}

TEST_F(TrainHostsNetnsTest, AShareWithOtherFlagsOrWithoutTheTokenIsRefused) {
  std::unique_ptr<Daemon> launcher = Launcher(Flags(30), "h1:2,h2:2");
  ASSERT_NE(launcher->WaitForLine("rendezvous at"), "");
  std::unique_ptr<Daemon> h2 = Share(hosts_.b(), "h2", Flags(31));
  EXPECT_EQ(h2->Finish(), 2) << h2->output();
  EXPECT_THAT(h2->output(), HasSubstr("steps (the launcher's 30, this host's 31)"));
  // A host the launcher does not list is refused once it has waited for it to be (as it
  // would be added while the run grows) for --timeout, at most 10 s.
  std::unique_ptr<Daemon> h3 = Share(hosts_.b(), "h3", Flags(30, "--timeout 2"));
  EXPECT_EQ(h3->Finish(), 2) << h3->output();
  EXPECT_THAT(h3->output(), HasSubstr("the run's hosts are h1, h2: this host is none of them "
                                      "(waited 2 s for the launcher to add it)"));
  // Without the launcher's token the store tells a share nothing.
  std::unique_ptr<Daemon> stranger = Share(hosts_.b(), "h2", Flags(30), "not-the-secret");
  EXPECT_EQ(stranger->Finish(), 2) << stranger->output();
  EXPECT_THAT(stranger->output(), HasSubstr("refused this host: give it the launcher's token"));
}

// The host of rank 0 (h2, in namespace b) is killed with its ranks mid-run: the launcher takes
// them for lost once the host is silent, and h1's ranks go on from their own state as the next
// generation, with the losses of the uninterrupted run.
TEST_F(TrainHostsNetnsTest, KillingTheHostOfRankZeroLeavesTheOtherTraining) {
  const std::string flags = Flags(1500, "--min-ranks 2");
  std::unique_ptr<Daemon> launcher = Launcher(flags + " --host-timeout 1", "h2:2,h1:2");
  ASSERT_NE(launcher->WaitForLine("rendezvous at"), "");
  std::unique_ptr<Daemon> h1 = Share(hosts_.a(), "h1", flags);
  std::unique_ptr<Daemon> h2 = Share(hosts_.b(), "h2", flags);
  ASSERT_NE(launcher->WaitForLine(" 150/1500"), "") << launcher->output();
  kill(-h2->pid(), SIGKILL);  // the share and its ranks, as a host that dies
  h2->Stop(SIGKILL);
  ASSERT_EQ(launcher->Finish(), 0) << launcher->output();
  EXPECT_EQ(h1->Finish(), 0) << h1->output();
  EXPECT_THAT(launcher->output(), HasSubstr("worker 0 failed: host h2"));
  const std::vector<nlohmann::json> faults = Faults(dir_.Path("out/faults.jsonl"));
  bool recovered = false;
  for (const nlohmann::json& f : faults) {
    if (f["event"] != "recovered") continue;
    recovered = true;
    EXPECT_EQ(f["source"], "replica") << f;
    EXPECT_EQ(f["ranks"], 2) << f;
  }
  EXPECT_TRUE(recovered) << launcher->output();
  ExpectSameLosses(Losses(dir_.Path("out/metrics.jsonl")), OneHostLosses(1500), 20);
}

// A plan with p = 2 over h1:2,h2:2 puts stage 0 of both replicas on h1 and stage 1 on h2: when
// h2 dies no replica of stage 1 survives. Every 10 steps (the default of an elastic run with
// t x p > 1) each rank's state is copied to its place on the other host, so h1's two ranks
// form one replica of both stages from those copies, not from a checkpoint, and train on
// with the losses of the run on one host.
TEST_F(TrainHostsNetnsTest, AStageWhoseHostDiedComesBackFromTheOtherHostsInMemoryCopies) {
  std::string two_layers = kc::testing::kMicroModel;
  two_layers.replace(two_layers.find("layers: 1"), 9, "layers: 2");
  model_ = dir_.Write("micro2.yaml", two_layers);
  const std::string plan = "--plan p=2,d=2 --global-batch 8 ";
  const std::string flags = Flags(600, plan + "--min-ranks 2");
  std::unique_ptr<Daemon> launcher = Launcher(flags + " --host-timeout 1", "h1:2,h2:2");
  ASSERT_NE(launcher->WaitForLine("rendezvous at"), "") << launcher->output();
  std::unique_ptr<Daemon> h1 = Share(hosts_.a(), "h1", flags);
  std::unique_ptr<Daemon> h2 = Share(hosts_.b(), "h2", flags);
  ASSERT_NE(launcher->WaitForLine(" 150/600"), "") << launcher->output();
  kill(-h2->pid(), SIGKILL);
  h2->Stop(SIGKILL);
  ASSERT_EQ(launcher->Finish(), 0) << launcher->output();
  EXPECT_EQ(h1->Finish(), 0) << h1->output();
  bool recovered = false;
  for (const nlohmann::json& f : Faults(dir_.Path("out/faults.jsonl"))) {
    if (f["event"] != "recovered") continue;
    recovered = true;
    EXPECT_EQ(f["source"], "memory") << f;
    EXPECT_EQ(f["ranks"], 2) << f;
    EXPECT_EQ(f["step"].get<int64_t>() % 10, 0) << f;
    EXPECT_LE(f["steps_lost"].get<int64_t>(), 10) << f;
  }
  EXPECT_TRUE(recovered) << launcher->output();
  ExpectSameLosses(Losses(dir_.Path("out/metrics.jsonl")), OneHostLosses(600, plan));
}

// h2's link goes down mid-run: its share, cut off from the store, kills its ranks and ends with
// an error, while the launcher takes them for lost and h1 trains on to the end.
TEST_F(TrainHostsNetnsTest, ACutHostKillsItsRanksAndTheOtherTrainsOn) {
  const std::string flags = Flags(1500, "--min-ranks 2");
  std::unique_ptr<Daemon> launcher = Launcher(flags + " --host-timeout 1", "h1:2,h2:2");
  ASSERT_NE(launcher->WaitForLine("rendezvous at"), "");
  std::unique_ptr<Daemon> h1 = Share(hosts_.a(), "h1", flags);
  std::unique_ptr<Daemon> h2 = Share(hosts_.b(), "h2", flags);
  ASSERT_NE(launcher->WaitForLine(" 150/1500"), "") << launcher->output();
  ASSERT_EQ(Sh("ip -n " + hosts_.b() + " link set " + hosts_.dev_b() + " down"), 0);
  // The share ends only once its ranks have: none trains on beside the others.
  EXPECT_EQ(h2->Finish(), 1) << h2->output();
  EXPECT_THAT(h2->output(), HasSubstr("cut off from the run's store"));
  ASSERT_EQ(launcher->Finish(), 0) << launcher->output();
  EXPECT_EQ(h1->Finish(), 0) << h1->output();
  EXPECT_THAT(launcher->output(), HasSubstr("host h2: its share has been silent"));
}

// kc agent's grow of a run across hosts, by hand: a run of 2 ranks on h1 (of at most 4) is
// told by its resize file that it has h1 and h2 now; its launcher places the 2 new workers on
// h2, whose share comes up after the file changed, and they join the run. Stopped then, every
// host's part ends well.
TEST_F(TrainHostsNetnsTest, AResizeFileGrowsTheRunOntoAHostItDidNotHave) {
  const std::string flags = fmt::format(
      "{} --ranks 2 --max-ranks 4 --min-ranks 2 --steps 1000000 --data {}/fortunes/manifest.json "
      "--eval-every 0 --progress lines --checkpoint-dir {}",
      model_, data_->path(), dir_.Path("ckpt"));
  const std::string size = dir_.Path("resize.json");
  std::unique_ptr<Daemon> launcher =
      Launcher(flags + " --host-timeout 1 --resize-file " + size, "h1:2");
  ASSERT_NE(launcher->WaitForLine("rendezvous at"), "") << launcher->output();
  std::unique_ptr<Daemon> h1 = Share(hosts_.a(), "h1", flags);
  ASSERT_NE(launcher->WaitForLine("host h1 is up"), "") << launcher->output();
  dir_.Write("resize.json", R"({"ranks": 4, "hosts": "h1:2,h2:2"})");
  ASSERT_NE(launcher->WaitForLine("the run's hosts are now h1:2,h2:2"), "") << launcher->output();
  std::unique_ptr<Daemon> h2 = Share(hosts_.b(), "h2", flags);
  ASSERT_NE(launcher->WaitForLine("goes on with 4 ranks"), "") << launcher->output();
  EXPECT_EQ(launcher->Stop(SIGTERM), 128 + SIGTERM) << launcher->output();  // stopped
  EXPECT_EQ(h1->Finish(), 0) << h1->output();
  EXPECT_EQ(h2->Finish(), 0) << h2->output();
  int joined_on_h2 = 0;
  for (const nlohmann::json& f : Faults(dir_.Path("out/faults.jsonl"))) {
    joined_on_h2 += f["event"] == "joined";
  }
  EXPECT_GE(joined_on_h2, 1) << launcher->output();
  EXPECT_THAT(h2->output(), HasSubstr("--share h2: the run is over"));
}

}  // namespace

// A congested link between the hosts (tc tbf at 200 Mbit/s with a queue of a few packets, so
// that each burst of an all-reduce overflows it and TCP retransmits): rank 0's step records
// carry its TCP links' counters (each lane's queue, retransmits, round trip), and kc diagnose
// names the link at L2.
TEST_F(TrainHostsNetnsTest, KcDiagnoseNamesALossyLinkBetweenTheHosts) {
  for (const auto& [ns, dev] :
       {std::pair(hosts_.a(), hosts_.dev_a()), std::pair(hosts_.b(), hosts_.dev_b())}) {
    if (Sh("ip netns exec " + ns + " tc qdisc add dev " + dev +
           " root tbf rate 500mbit burst 32kb limit 16kb") != 0) {
      GTEST_SKIP() << "tc tbf is not available here";
    }
  }
  const std::string flags = Flags(12);
  std::unique_ptr<Daemon> launcher = Launcher(flags, "h1:2,h2:2");
  ASSERT_NE(launcher->WaitForLine("rendezvous at"), "");
  std::unique_ptr<Daemon> h1 = Share(hosts_.a(), "h1", flags);
  std::unique_ptr<Daemon> h2 = Share(hosts_.b(), "h2", flags);
  ASSERT_EQ(launcher->Finish(), 0) << launcher->output();
  EXPECT_EQ(h1->Finish(), 0) << h1->output();
  EXPECT_EQ(h2->Finish(), 0) << h2->output();
  std::ifstream metrics(dir_.Path("out/metrics.jsonl"));
  int64_t retransmits = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || j.value("type", "") != "step") continue;
    ASSERT_EQ(j["lane_wait_ms"].size(), 4u) << line;  // rank 0 has TCP links: their lanes
    retransmits = std::max(retransmits, j.value("retransmits", int64_t{0}));
  }
  EXPECT_GT(retransmits, 0);
  KcRun d = kc::testing::RunKc(KC_BINARY, "diagnose --json " + dir_.Path("out"));
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_THAT(d.out, HasSubstr("the links between hosts retransmit")) << d.out;
}
