// `kc topo` as a user runs it: reports on inventories with planted problems, bad input,
// the probe on this machine, and a probe against a `kc topo serve` peer on loopback.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/kc_run.h"

namespace {

using kc::testing::KcRun;

KcRun Kc(const std::string& args) { return kc::testing::RunKc(KC_BINARY, args); }

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

std::string Example(const std::string& name) {
  return std::string(KC_SOURCE_DIR) + "/examples/clusters/" + name;
}

bool HasAnomaly(const nlohmann::json& report, const std::string& kind,
                const std::string& subject_part) {
  for (const auto& a : report["anomalies"]) {
    if (a["kind"] == kind &&
        a["subject"].get<std::string>().find(subject_part) != std::string::npos) {
      return true;
    }
  }
  return false;
}

// Two racks of two hosts with 4 GPUs each behind NVSwitch.
constexpr const char* kTwoRacks = R"(name: two-racks
network: {cross_rack_bandwidth_factor: 0.5, cross_rack_latency_us: 3}
models:
  GPU: {memory_gb: 80, peak_tflops_fp32: 19.5, peak_tflops_bf16: 312, memory_bandwidth_gbs: 2039}
hosts:
  - name: "a[0-1]"
    rack: ra
    model: GPU
    count: 4
    intra_host: {kind: nvlink, bandwidth_gbs: 300, latency_us: 2}
    network: {bandwidth_gbs: 25, latency_us: 5}
  - name: "b[0-1]"
    rack: rb
    model: GPU
    count: 4
    intra_host: {kind: nvlink, bandwidth_gbs: 300, latency_us: 2}
    network: {bandwidth_gbs: 25, latency_us: 5}
)";

TEST(KcTopoReportTest, ExamplesReportWithoutAnomalies) {
  for (const char* name : {"dgx-a100x4.yaml", "dgx-a100x16.yaml", "h100x128.yaml", "mixed.yaml",
                           "synthetic-10k.yaml"}) {
    KcRun r = Kc("topo report --json --inventory " + Example(name));
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_TRUE(j["anomalies"].empty()) << name << ": " << j["anomalies"].dump();
  }
}

TEST(KcTopoReportTest, FlagsAPlantedCrossRackGroup) {
  const std::string inv = WriteFile("two_racks.yaml", kTwoRacks);
  const std::string groups = WriteFile("cross_rack_groups.yaml",
                                       "groups:\n"
                                       "  - name: straddle\n"
                                       "    devices: [a0/gpu0, a0/gpu1, b0/gpu0, b0/gpu1]\n");
  KcRun r = Kc("topo report --json --inventory " + inv + " --groups " + groups);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(HasAnomaly(j, "group_spans_racks", "straddle")) << j["anomalies"].dump();
  KcRun text = Kc("topo report --inventory " + inv + " --groups " + groups);
  EXPECT_NE(text.out.find("WARNING group_spans_racks"), std::string::npos) << text.out;
}

TEST(KcTopoReportTest, FlagsAPlantedSlowLink) {
  std::string inv = kTwoRacks;
  // a0's NVSwitch measured at 30% of its declared bandwidth.
  inv.replace(inv.find("intra_host: {kind: nvlink, bandwidth_gbs: 300, latency_us: 2}"),
              std::string("intra_host: {kind: nvlink, bandwidth_gbs: 300, latency_us: 2}").size(),
              "intra_host: {kind: nvlink, bandwidth_gbs: 300, latency_us: 2, "
              "measured_bandwidth_gbs: 90, measured_latency_us: 2}");
  KcRun r = Kc("topo report --json --inventory " + WriteFile("slow.yaml", inv));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(HasAnomaly(j, "slow_link", "a0")) << j["anomalies"].dump();
  EXPECT_TRUE(HasAnomaly(j, "slow_link", "a1")) << "a[0-1] share the entry: both hosts";
}

TEST(KcTopoReportTest, WrittenGroupsCanBeEditedAndReadBack) {
  const std::string inv = WriteFile("two_racks_w.yaml", kTwoRacks);
  const std::string groups = ::testing::TempDir() + "written_groups.yaml";
  KcRun w = Kc("topo report --inventory " + inv + " --write-groups " + groups);
  ASSERT_EQ(w.exit_code, 0) << w.err;
  KcRun r = Kc("topo report --json --inventory " + inv + " --groups " + groups);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["groups"].size(), 4u);
  EXPECT_TRUE(j["anomalies"].empty()) << j["anomalies"].dump();
}

TEST(KcTopoReportTest, MalformedInventoryExitsTwoWithFileLineAndKey) {
  std::string bad = kTwoRacks;
  bad.replace(bad.find("memory_gb: 80"), std::string("memory_gb: 80").size(), "memory_gb: -80");
  const std::string inv = WriteFile("neg_memory.yaml", bad);
  KcRun r = Kc("topo report --inventory " + inv);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(inv + ":4: models.GPU.memory_gb:"), std::string::npos) << r.err;
}

TEST(KcTopoReportTest, DuplicateDeviceIdsExitTwo) {
  std::string dup = kTwoRacks;
  dup.replace(dup.find("\"b[0-1]\""), std::string("\"b[0-1]\"").size(), "\"a[1-2]\"");
  KcRun r = Kc("topo report --inventory " + WriteFile("dup.yaml", dup));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("a1"), std::string::npos) << r.err;
}

TEST(KcTopoReportTest, GroupNamingADeviceTwiceExitsTwo) {
  const std::string inv = WriteFile("two_racks_g.yaml", kTwoRacks);
  const std::string groups = WriteFile("twice.yaml",
                                       "groups:\n"
                                       "  - name: x\n"
                                       "    devices: [a0/gpu0, a0/gpu1]\n"
                                       "  - name: y\n"
                                       "    devices: [a0/gpu1]\n");
  KcRun r = Kc("topo report --inventory " + inv + " --groups " + groups);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(groups + ":5:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("a0/gpu1"), std::string::npos) << r.err;
}

TEST(KcTopoReportTest, MissingInventoryExitsTwo) {
  KcRun r = Kc("topo report --inventory /nonexistent/cluster.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/nonexistent/cluster.yaml"), std::string::npos) << r.err;
}

TEST(KcTopoProbeTest, MeasuresThisHostAndWritesALoadableTopology) {
  const std::string out = ::testing::TempDir() + "probed_topology.yaml";
  KcRun r = Kc("topo probe --quick --json --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["stream_copy_bytes_per_second"].get<double>(), 0);
  EXPECT_GT(j["sgemm_flops_per_core"].get<double>(), 0);
  EXPECT_EQ(j["written"], out);
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  EXPECT_EQ(j["pus"].get<int>(), CPU_COUNT(&allowed))
      << "the probe must report the true core count";
  EXPECT_GE(j["numa_nodes"].size(), 1u);
  if (j["pus"].get<int>() >= 2) EXPECT_GT(j["shm"]["bandwidth_bytes_per_second"].get<double>(), 0);
  KcRun report = Kc("topo report --json --inventory " + out);
  ASSERT_EQ(report.exit_code, 0) << report.err;
  nlohmann::json rj = nlohmann::json::parse(report.out);
  EXPECT_EQ(rj["num_devices"].get<int>(), static_cast<int>(j["devices"].size()));
}

TEST(KcTopoProbeTest, CpuDevicesSplitTheCores) {
  KcRun info = Kc("topo probe --quick --json --no-write");
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const int pus = nlohmann::json::parse(info.out)["pus"].get<int>();
  KcRun r = Kc("topo probe --quick --json --no-write --cpu-devices " + std::to_string(pus));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["devices"].size(), static_cast<size_t>(pus));
  for (const auto& d : j["devices"]) EXPECT_EQ(d["cpus"].size(), 1u);
  KcRun too_many = Kc("topo probe --quick --no-write --cpu-devices " + std::to_string(pus + 1));
  EXPECT_EQ(too_many.exit_code, 2);
  EXPECT_NE(too_many.err.find("--cpu-devices"), std::string::npos) << too_many.err;
}

TEST(KcTopoProbeTest, MalformedPeerExitsTwoBeforeMeasuring) {
  KcRun r = Kc("topo probe --no-write --peers localhost");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--peers"), std::string::npos) << r.err;
}

// Starts `kc topo serve` on an ephemeral loopback port; stops it in the destructor.
class ServeProcess {
 public:
  ServeProcess() {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      execl(KC_BINARY, KC_BINARY, "topo", "serve", "--bind", "127.0.0.1", "--port", "0",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    // The first line says where it listens: "... listening on 127.0.0.1:PORT ...".
    FILE* f = fdopen(fds[0], "r");
    char line[256] = {};
    if (fgets(line, sizeof(line), f) != nullptr) {
      std::string s(line);
      const size_t colon = s.find("127.0.0.1:");
      if (colon != std::string::npos) port_ = std::atoi(s.c_str() + colon + 10);
    }
    fclose(f);
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST(KcTopoServeTest, ProbeMeasuresAPeerOverTcp) {
  ServeProcess server;
  ASSERT_GT(server.port(), 0);
  KcRun r =
      Kc("topo probe --quick --json --no-write --peers 127.0.0.1:" + std::to_string(server.port()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["peers"].size(), 1u);
  EXPECT_GT(j["peers"][0]["bandwidth_bytes_per_second"].get<double>(), 0) << j["peers"].dump();
  EXPECT_GT(j["peers"][0]["latency_seconds"].get<double>(), 0);
}

TEST(KcTopoServeTest, UnreachablePeerFailsWithTheAddress) {
  // A port bound but not listening refuses connections, and no one else can take it meanwhile.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  KcRun r = Kc("topo probe --quick --json --no-write --peers 127.0.0.1:" + std::to_string(port));
  close(fd);
  EXPECT_EQ(r.exit_code, 1);
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["peers"][0]["error"].get<std::string>().find("127.0.0.1"), std::string::npos)
      << j["peers"].dump();
}

}  // namespace
