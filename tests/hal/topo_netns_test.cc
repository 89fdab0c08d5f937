// Two hosts as Linux network namespaces joined by a veth pair: `kc topo serve` on one,
// `kc topo probe --peers` on the other, across a link shaped with tc. Needs root and iproute2;
// skips itself otherwise. Every namespace and process it makes, it removes.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/netns.h"

namespace {

using kc::testing::Capture;
using kc::testing::Sh;
using kc::testing::TwoHosts;

// `kc topo serve` inside namespace `ns`; SIGTERM and reaped in the destructor.
class ServeIn {
 public:
  ServeIn(const std::string& ns, const std::string& ip) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      execlp("ip", "ip", "netns", "exec", ns.c_str(), KC_BINARY, "topo", "serve", "--bind",
             ip.c_str(), "--port", "0", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    FILE* f = fdopen(fds[0], "r");
    char line[256] = {};
    if (fgets(line, sizeof(line), f) != nullptr) {
      const std::string s(line);
      const size_t at = s.find(ip + ":");
      if (at != std::string::npos) port_ = std::atoi(s.c_str() + at + ip.size() + 1);
    }
    fclose(f);
  }
  ~ServeIn() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);  // `ip netns exec` execs kc, so this is the server itself
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST(KcTopoNetnsTest, ProbeMeasuresAPeerHostAcrossAShapedLink) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces";
  TwoHosts hosts;
  if (!hosts.ok()) GTEST_SKIP() << "cannot create network namespaces and veth here";
  constexpr double kShapedBitsPerSecond = 200e6;
  ASSERT_EQ(Sh("ip netns exec " + hosts.b() + " tc qdisc add dev " + hosts.dev_b() +
               " root tbf rate 200mbit burst 32kb latency 100ms"),
            0);
  ServeIn server(hosts.a(), hosts.ip_a());
  ASSERT_GT(server.port(), 0);
  int rc = -1;
  const std::string out =
      Capture("ip netns exec " + hosts.b() + " " + KC_BINARY +
                  " topo probe --quick --json --no-write --peers " + hosts.ip_a() + ":" +
                  std::to_string(server.port()) + " 2>/dev/null",
              &rc);
  ASSERT_EQ(rc, 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j["peers"].size(), 1u);
  const double bw = j["peers"][0]["bandwidth_bytes_per_second"].get<double>();
  EXPECT_GT(bw, 0);
  // The shaper caps what crosses the link: a probe that measured anything faster would not
  // be measuring the link. (An upper bound set by tc, not a timing expectation.)
  EXPECT_LT(bw, 1.5 * kShapedBitsPerSecond / 8) << "measured " << bw / 1e6 << " MB/s";
}

}  // namespace
