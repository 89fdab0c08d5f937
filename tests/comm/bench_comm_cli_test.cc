// `kc bench comm` end to end: it starts its rank processes, checks each result and prints
// the nccl-tests table or JSON Lines; bad arguments exit 2 naming the argument.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/netns.h"
#include "tests/support/temp_dir.h"

namespace {

using kc::testing::Capture;

std::vector<nlohmann::json> JsonLines(const std::string& out) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

std::string Kc(const std::string& args, int* rc) {
  return Capture(std::string(KC_BINARY) + " bench comm " + args + " 2>&1", rc);
}

TEST(KcBenchCommTest, EveryOperationChecksOutOnEveryTransport) {
  for (const std::string transport : {"auto", "tcp"}) {
    int rc = -1;
    const std::string out =
        Kc("--ranks 3 --op all --sizes 0,4K,100001 --iters 2 --warmup 1 "
           "--format json --transport " +
               transport,
           &rc);
    ASSERT_EQ(rc, 0) << out;
    const std::vector<nlohmann::json> rows = JsonLines(out);
    ASSERT_EQ(rows.size(), 7u * 3u) << out;  // 7 operations x 3 sizes
    for (const nlohmann::json& r : rows) {
      EXPECT_NE(r["check"], "WRONG") << r.dump();
      EXPECT_EQ(r["ranks"], 3);
      EXPECT_GE(r["time_us"].get<double>(), 0.0);
      if (r["op"] == "allreduce" && r["size"].get<int64_t>() > 0) {
        // nccl-tests: busbw = algbw * 2 (n - 1) / n.
        EXPECT_NEAR(r["busbw"].get<double>(), r["algbw"].get<double>() * 4.0 / 3.0,
                    1e-9 + 1e-6 * r["busbw"].get<double>());
      }
    }
  }
}

TEST(KcBenchCommTest, RegisteredBuffersAndForcedAlgorithmsCheckOut) {
  for (const std::string algo : {"direct", "ring", "recursive_doubling"}) {
    int rc = -1;
    const std::string out =
        Kc("--ranks 4 --sizes 1K,300000 --iters 2 --warmup 0 --format json "
           "--buffers registered --redop avg --algo " +
               algo,
           &rc);
    ASSERT_EQ(rc, 0) << out;
    for (const nlohmann::json& r : JsonLines(out)) {
      EXPECT_EQ(r["check"], "ok") << r.dump();
      EXPECT_EQ(r["algo"], algo);
    }
  }
}

// --op wire: the links' limit, plain sockets streaming around the ring; its busbw is the bytes
// each rank sent per second (a ring all-reduce's ceiling), and it has no result to check.
TEST(KcBenchCommTest, TheWireRowStreamsAroundTheRing) {
  for (const int ranks : {1, 3}) {
    int rc = -1;
    const std::string out = Kc("--ranks " + std::to_string(ranks) +
                                   " --op wire --sizes 4K,1M --iters 2 --warmup 1 --format json",
                               &rc);
    ASSERT_EQ(rc, 0) << out;
    const std::vector<nlohmann::json> rows = JsonLines(out);
    ASSERT_EQ(rows.size(), 2u) << out;
    for (const nlohmann::json& r : rows) {
      EXPECT_EQ(r["op"], "wire");
      EXPECT_EQ(r["algo"], "stream");
      EXPECT_EQ(r["check"], "-");
      EXPECT_EQ(r["ranks"], ranks);
      EXPECT_GT(r["time_us"].get<double>(), 0.0);
      EXPECT_DOUBLE_EQ(r["busbw"].get<double>(), r["algbw"].get<double>());
    }
  }
}

// With --inventory, --algo auto chooses each all-reduce by the inventory's cost model, the
// estimate `kc topo report` advises from: both name the same algorithm for every size. Two
// hosts of two devices joined by a slow network: the tree (recursive doubling) for a small
// all-reduce, where the size rule alone would take the hierarchical one, and the
// hierarchical one for a large one.
TEST(KcBenchCommTest, TheInventorysCostModelChoosesAsTopoReportAdvises) {
  const kc::testing::TempDir dir;
  const std::string inventory = dir.Write("two-hosts.yaml", R"(name: two-hosts
models:
  cpu: {kind: simulated, memory_gb: 16, peak_tflops_fp32: 1, peak_tflops_bf16: 0,
        memory_bandwidth_gbs: 20}
hosts:
  - name: "h[0-1]"
    model: cpu
    count: 2
    intra_host: {kind: shm, bandwidth_gbs: 20, latency_us: 1}
    network: {bandwidth_gbs: 0.125, latency_us: 50}
)");
  const std::map<std::string, std::string> kc_name = {
      {"tree", "recursive_doubling"}, {"ring", "ring"}, {"hierarchical", "hierarchical"}};
  std::map<int64_t, std::string> chosen;
  for (const int64_t bytes : {int64_t{4096}, int64_t{1} << 20}) {
    int rc = -1;
    const std::string report =
        Capture(std::string(KC_BINARY) + " topo report --json --inventory " + inventory +
                    " --allreduce-bytes " + std::to_string(bytes) + " 2>/dev/null",
                &rc);
    ASSERT_EQ(rc, 0) << report;
    const std::string advice = nlohmann::json::parse(report)["allreduce"]["best"];
    const std::string out = Kc("--ranks 4 --inventory " + inventory + " --sizes " +
                                   std::to_string(bytes) + " --iters 1 --warmup 0 --format json",
                               &rc);
    ASSERT_EQ(rc, 0) << out;
    const std::vector<nlohmann::json> rows = JsonLines(out);
    ASSERT_EQ(rows.size(), 1u) << out;
    EXPECT_EQ(rows[0]["check"], "ok");
    EXPECT_EQ(rows[0]["algo"], kc_name.at(advice)) << bytes << " bytes: " << report;
    chosen[bytes] = rows[0]["algo"];
  }
  EXPECT_EQ(chosen[4096], "recursive_doubling");
  EXPECT_EQ(chosen[1 << 20], "hierarchical");
  // More ranks than the inventory has devices: refused, naming it.
  int rc = -1;
  const std::string out = Kc("--ranks 5 --inventory " + inventory, &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--inventory " + inventory + ": 4 devices for 5 ranks"), std::string::npos)
      << out;
}

TEST(KcBenchCommTest, SimulatedHostsUseTheHierarchicalAlgorithm) {
  int rc = -1;
  const std::string out = Kc("--ranks 4 --hosts a,a,b,b --sizes 64K --iters 2 --format json", &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::vector<nlohmann::json> rows = JsonLines(out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["algo"], "hierarchical");
  EXPECT_EQ(rows[0]["check"], "ok");
}

TEST(KcBenchCommTest, MeasuresUnderATelemetryLaneFlood) {
  int rc = -1;
  const std::string out =
      Kc("--ranks 2 --sizes 4K --algo recursive_doubling --transport shm "
         "--flood 1M --iters 5 --warmup 1 --format json",
         &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::vector<nlohmann::json> rows = JsonLines(out);
  ASSERT_EQ(rows.size(), 1u) << out;
  EXPECT_EQ(rows[0]["check"], "ok");
  EXPECT_EQ(rows[0]["flood"], 1 << 20);
}

TEST(KcBenchCommTest, TablePrintsTheNcclTestsColumns) {
  int rc = -1;
  const std::string out = Kc("--ranks 2 --sizes 1K --iters 1", &rc);
  ASSERT_EQ(rc, 0) << out;
  for (const char* col :
       {"size", "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)"}) {
    EXPECT_NE(out.find(col), std::string::npos) << col << "\n" << out;
  }
  EXPECT_NE(out.find(" ok"), std::string::npos) << out;
}

// A rank stopped (SIGSTOP: silent, its sockets open) or killed before its first operation:
// the other ranks fail within --timeout and the launcher kills what is left, so the run ends
// with an error naming the rank, never a hang.
TEST(KcBenchCommTest, AStoppedOrKilledRankEndsTheRunWithAnError) {
  for (const std::string how : {"stop", "kill"}) {
    int rc = -1;
    const std::string out =
        Kc("--ranks 3 --transport tcp --sizes 64K --iters 2 --warmup 1 --timeout 2 "
           "--inject-fault 1:" +
               how,
           &rc);
    EXPECT_EQ(rc, 1) << how << "\n" << out;
    if (how == "stop") {
      EXPECT_NE(out.find("rank 1 did not end within 7 s of rank"), std::string::npos) << out;
    } else {
      EXPECT_NE(out.find("rank 1 killed by signal 9"), std::string::npos) << out;
    }
  }
}

TEST(KcBenchCommTest, BadArgumentsExitTwoNamingTheArgument) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--sizes 4Q", "--sizes"},
      {"--op allreduse", "--op"},
      {"--dtype f16", "--dtype"},
      {"--algo fastest", "--algo"},
      {"--transport ib", "--transport"},
      {"--buffers pinned", "--buffers"},
      {"--ranks 2 --hosts a", "--hosts"},
      {"--dtype i32 --redop avg", "--redop"},
      {"--cpu-bind socket", "--cpu-bind"},
      {"--flood 1Q", "--flood"},
      {"--inject-fault 2:stop", "--inject-fault"},
      {"--inject-fault 1:pause", "--inject-fault"},
      {"--inventory no-such-inventory.yaml", "--inventory"},
  };
  for (const auto& [args, named] : cases) {
    int rc = -1;
    const std::string out = Kc(args, &rc);
    EXPECT_EQ(rc, 2) << args << "\n" << out;
    EXPECT_NE(out.find(named), std::string::npos) << args << "\n" << out;
  }
}

}  // namespace
