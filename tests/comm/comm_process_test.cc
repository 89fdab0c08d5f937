// A peer process killed in the middle of a collective: the survivors' Work must fail within
// the deadline with an error (not hang, not time out), and the communicator stays failed.
// Each test forks its child before it starts any thread.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "base/notification.h"
#include "comm/communicator.h"
#include "comm/tcp_store.h"

namespace kc::comm {
namespace {

using namespace std::chrono_literals;

constexpr int kSize = 3;
constexpr int kChildRank = 2;

std::unique_ptr<Communicator> Join(int port, const std::string& group, int rank, TransportKind kind,
                                   Algorithm algo, const std::vector<std::string>& hosts,
                                   std::unique_ptr<TcpStoreClient>* store) {
  auto s = TcpStoreClient::Connect("127.0.0.1", port, Clock::Real()->Now() + 30s);
  if (!s.ok()) return nullptr;
  *store = *std::move(s);
  auto c = Communicator::Create({.store = store->get(),
                                 .group = group,
                                 .rank = rank,
                                 .size = kSize,
                                 .host = hosts[rank],
                                 .transport = kind,
                                 .timeout = 60s,
                                 .algorithm = algo});
  if (!c.ok()) return nullptr;
  return *std::move(c);
}

bool AllreduceOnce(Communicator& c) {
  std::vector<float> x(100000, 1.0f);
  auto w = c.Allreduce(std::span(x), ReduceOp::kSum);
  return w.ok() && (*w)->Wait().ok() && x[0] == kSize && x.back() == kSize;
}

struct KillCase {
  std::string name;
  TransportKind kind;
  Algorithm algo;
  std::vector<std::string> hosts;
};

void PrintTo(const KillCase& c, std::ostream* os) { *os << c.name; }

class KillPeerTest : public ::testing::TestWithParam<KillCase> {};

TEST_P(KillPeerTest, SurvivorsFailPromptlyWhenAPeerDiesMidAllreduce) {
  const KillCase& param = GetParam();
  const std::string group = "kill-" + param.name + "-" + std::to_string(getpid());
  int to_child[2];
  int to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Rank 2: join, take part in one all-reduce, report, then wait to be told to die.
    int port = 0;
    if (read(to_child[0], &port, sizeof(port)) != sizeof(port)) _exit(3);
    std::unique_ptr<TcpStoreClient> store;
    std::unique_ptr<Communicator> c =
        Join(port, group, kChildRank, param.kind, param.algo, param.hosts, &store);
    const char ok = c != nullptr && AllreduceOnce(*c) ? 'R' : 'F';
    if (write(to_parent[1], &ok, 1) != 1) _exit(4);
    char cmd = 0;
    if (read(to_child[0], &cmd, 1) != 1) _exit(5);
    raise(SIGKILL);  // no destructor runs: the peers see a dead process, not a goodbye
    _exit(6);
  }
  auto server = TcpStoreServer::Start({.bind_address = "127.0.0.1"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_EQ(write(to_child[1], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));

  std::atomic<int> submitted{0};
  Notification both_submitted;
  std::vector<Status> results(2);
  std::vector<Status> later(2);
  std::vector<std::jthread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      std::unique_ptr<TcpStoreClient> store;
      std::unique_ptr<Communicator> c =
          Join(port, group, r, param.kind, param.algo, param.hosts, &store);
      ASSERT_NE(c, nullptr);
      ASSERT_TRUE(AllreduceOnce(*c));
      // The second all-reduce: rank 2 never joins it; it is killed while we are inside.
      std::vector<float> x(100000, 1.0f);
      auto w = c->Allreduce(std::span(x), ReduceOp::kSum);
      ASSERT_TRUE(w.ok());
      if (++submitted == 2) both_submitted.Notify();
      results[r] = (*w)->Wait();
      auto again = c->Allreduce(std::span(x), ReduceOp::kSum);
      later[r] = again.ok() ? (*again)->Wait() : again.status();
    });
  }
  char ready = 0;
  ASSERT_EQ(read(to_parent[0], &ready, 1), 1);
  ASSERT_EQ(ready, 'R');
  both_submitted.WaitForNotification();
  const char die = 'D';
  ASSERT_EQ(write(to_child[1], &die, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(results[r].ok()) << "rank " << r;
    // Noticed as a failure of the peer, well before the 60 s deadline.
    EXPECT_NE(results[r].code(), ErrorCode::kDeadlineExceeded) << results[r];
    EXPECT_FALSE(later[r].ok()) << "sticky failure, rank " << r;
  }
  (*server)->Stop();
  close(to_child[0]);
  close(to_child[1]);
  close(to_parent[0]);
  close(to_parent[1]);
}

INSTANTIATE_TEST_SUITE_P(
    Comm, KillPeerTest,
    ::testing::Values(
        KillCase{"shm_direct", TransportKind::kAuto, Algorithm::kAuto, {"h", "h", "h"}},
        KillCase{"shm_ring", TransportKind::kShm, Algorithm::kRing, {"h", "h", "h"}},
        KillCase{"tcp_ring", TransportKind::kTcp, Algorithm::kRing, {"h", "h", "h"}},
        KillCase{"tcp_rd", TransportKind::kTcp, Algorithm::kRecursiveDoubling, {"h", "h", "h"}},
        KillCase{"two_hosts_hier", TransportKind::kAuto, Algorithm::kAuto, {"a", "b", "b"}}),
    [](const ::testing::TestParamInfo<KillCase>& info) { return info.param.name; });

}  // namespace
}  // namespace kc::comm
