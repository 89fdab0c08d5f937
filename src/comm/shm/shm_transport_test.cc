#include "comm/shm/shm_transport.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "comm/hash_store.h"
#include "comm/internal/shm_segment.h"
#include "comm/tcp_store.h"
#include "tests/support/child_guard.h"
#include "tests/support/shm_entries.h"

namespace kc::comm {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kRingBytes = 64 * 1024;  // small, so 8 MiB messages wrap many times

std::string UniqueGroup(std::string_view name) {
  static std::atomic<int> counter{0};
  return std::string(name) + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

// Deterministic content of message `seed`.
std::vector<std::byte> Pattern(uint64_t seed, size_t n) {
  std::vector<std::byte> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<std::byte>(x);
  }
  return v;
}

// /dev/shm entries whose name carries `group`'s segment prefix.
int ShmEntries(const std::string& group) {
  return kc::testing::CountShmEntries(internal::SegmentPrefix("kc-shm-", group));
}

ShmTransportOptions Options(Store* store, const std::string& group, int rank, int size) {
  return {.store = store,
          .group = group,
          .rank = rank,
          .size = size,
          .connect_timeout = 30s,
          .ring_bytes = kRingBytes,
          .chunk_bytes = 16 * 1024,
          .spin_iterations = 100};
}

// Creates `size` endpoints concurrently (Create blocks until all ranks joined). `tweak`, if
// set, edits every rank's options.
std::vector<std::unique_ptr<Transport>> CreateGroup(
    Store* store, const std::string& group, int size, Clock* clock = Clock::Real(),
    const std::function<void(ShmTransportOptions&)>& tweak = nullptr) {
  std::vector<std::unique_ptr<Transport>> out(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ShmTransportOptions o = Options(store, group, r, size);
      o.clock = clock;
      if (tweak) tweak(o);
      auto t = CreateShmTransport(o);
      EXPECT_TRUE(t.ok()) << t.status();
      if (t.ok()) out[r] = std::move(t).value();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TimePoint Soon() { return Clock::Real()->Now() + 30s; }

class ShmAllToAllTest : public ::testing::TestWithParam<int> {};

TEST_P(ShmAllToAllTest, EveryRankReceivesEveryPeersPatternsAtEverySize) {
  const int n = GetParam();
  HashStore store;
  const std::string group = UniqueGroup("all2all");
  auto ts = CreateGroup(&store, group, n);
  ASSERT_EQ(ts.size(), static_cast<size_t>(n));
  for (auto& t : ts) ASSERT_NE(t, nullptr);
  EXPECT_EQ(ShmEntries(group), 0);  // unlinked once everyone mapped them

  const std::vector<size_t> sizes = {0, 1, 7, 4096, kRingBytes - 24, 3 * kRingBytes + 5, 8 << 20};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Transport* t = ts[r].get();
      std::vector<std::vector<std::byte>> out, in;
      std::vector<std::shared_ptr<Request>> reqs;
      std::vector<std::pair<uint64_t, size_t>> expect;  // (seed, size) of in[i]
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        for (size_t k = 0; k < sizes.size(); ++k) {
          const uint64_t send_seed = r * 1000 + p * 100 + k;
          out.push_back(Pattern(send_seed, sizes[k]));
          in.emplace_back(sizes[k]);
          expect.push_back({p * 1000 + r * 100 + k, sizes[k]});
        }
      }
      size_t i = 0;
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        for (size_t k = 0; k < sizes.size(); ++k, ++i) {
          auto s = t->Send(p, /*tag=*/7, out[i]);
          ASSERT_TRUE(s.ok()) << s.status();
          reqs.push_back(s.value());
          auto rv = t->Recv(p, /*tag=*/7, in[i]);
          ASSERT_TRUE(rv.ok()) << rv.status();
          reqs.push_back(rv.value());
        }
      }
      for (auto& q : reqs) EXPECT_TRUE(q->Wait(Soon()).ok());
      for (size_t j = 0; j < in.size(); ++j) {
        EXPECT_TRUE(in[j] == Pattern(expect[j].first, expect[j].second))
            << "rank " << r << " message " << j;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& t : ts) EXPECT_TRUE(t->status().ok());
  ts.clear();
  EXPECT_EQ(ShmEntries(group), 0);
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmAllToAllTest, ::testing::Values(1, 2, 3, 4));

TEST(ShmTransportTest, ManyMessagesWithOneTagArriveInOrder) {
  HashStore store;
  auto ts = CreateGroup(&store, UniqueGroup("order"), 2);
  constexpr int kCount = 500;
  std::vector<std::vector<std::byte>> out, in;
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < kCount; ++i) {
    out.push_back(Pattern(i, 100 + i % 37));
    in.emplace_back(out.back().size());
  }
  for (int i = 0; i < kCount; ++i) reqs.push_back(ts[0]->Send(1, 3, out[i]).value());
  for (int i = 0; i < kCount; ++i) reqs.push_back(ts[1]->Recv(0, 3, in[i]).value());
  for (auto& r : reqs) ASSERT_TRUE(r->Wait(Soon()).ok());
  for (int i = 0; i < kCount; ++i) EXPECT_TRUE(in[i] == out[i]) << i;
}

// The seed's §5.1 scenario, made deterministic: rank 1 never posts the Recv of a large
// telemetry message and its telemetry unexpected-buffer budget is used up, so the message
// sits in a full telemetry ring and its send cannot complete. A gradient message posted after
// it to the same peer still goes through.
TEST(ShmTransportTest, AGradientMessageOvertakesABackPressuredTelemetryBacklog) {
  HashStore store;
  auto ts = CreateGroup(&store, UniqueGroup("overtake"), 2, Clock::Real(),
                        [](ShmTransportOptions& o) { o.max_unexpected_bytes = 4096; });
  const auto small = Pattern(1, 4096), big = Pattern(2, 4 * kRingBytes), grad = Pattern(3, 4096);
  auto s_small = ts[0]->Send(1, /*tag=*/10, small, Lane::kTelemetry).value();
  auto s_big = ts[0]->Send(1, /*tag=*/11, big, Lane::kTelemetry).value();
  // `small` is buffered at rank 1 (the budget admits one message); `big` then cannot be.
  ASSERT_TRUE(s_small->Wait(Soon()).ok());
  auto s_grad = ts[0]->Send(1, /*tag=*/12, grad, Lane::kGradient).value();
  std::vector<std::byte> in_grad(grad.size());
  auto r_grad = ts[1]->Recv(0, 12, in_grad).value();
  ASSERT_TRUE(r_grad->Wait(Soon()).ok());
  ASSERT_TRUE(s_grad->Wait(Soon()).ok());
  EXPECT_TRUE(in_grad == grad);
  EXPECT_FALSE(s_big->Test().has_value()) << "the telemetry backlog cannot have drained";

  // Receiving the telemetry messages releases the backlog.
  std::vector<std::byte> in_small(small.size()), in_big(big.size());
  auto r_small = ts[1]->Recv(0, 10, in_small).value();
  auto r_big = ts[1]->Recv(0, 11, in_big).value();
  ASSERT_TRUE(r_small->Wait(Soon()).ok());
  ASSERT_TRUE(r_big->Wait(Soon()).ok());
  ASSERT_TRUE(s_big->Wait(Soon()).ok());
  EXPECT_TRUE(in_small == small);
  EXPECT_TRUE(in_big == big);
}

// Every lane keeps posting order for one tag, while the lanes interleave (messages bigger
// than a ring included, so lanes are cut mid-message by higher ones).
TEST(ShmTransportTest, MessagesWithOneTagArriveInPostingOrderWithinEachLane) {
  HashStore store;
  auto ts = CreateGroup(&store, UniqueGroup("lane-order"), 2);
  constexpr int kPerLane = 120;
  const std::vector<size_t> sizes = {0, 33, 4096, 3 * kRingBytes + 1, 700};
  std::vector<std::vector<std::byte>> out, in;
  std::vector<std::shared_ptr<Request>> sends, recvs;
  for (int i = 0; i < kPerLane * kNumLanes; ++i) {
    out.push_back(Pattern(i, sizes[(i / kNumLanes) % sizes.size()]));
    in.emplace_back(out.back().size());
  }
  // Message i goes on lane i % kNumLanes with tag 100 + lane, so each lane's tag sees its
  // messages in the order of i.
  for (int i = 0; i < kPerLane * kNumLanes; ++i) {
    const Lane lane = kAllLanes[i % kNumLanes];
    sends.push_back(ts[0]->Send(1, 100 + i % kNumLanes, out[i], lane).value());
  }
  for (int i = 0; i < kPerLane * kNumLanes; ++i) {
    recvs.push_back(ts[1]->Recv(0, 100 + i % kNumLanes, in[i]).value());
  }
  for (auto& r : recvs) ASSERT_TRUE(r->Wait(Soon()).ok());
  for (auto& s : sends) ASSERT_TRUE(s->Wait(Soon()).ok());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_TRUE(in[i] == out[i]) << i;
}

// The same tag on two lanes: no order between them, but each Recv gets one whole message.
TEST(ShmTransportTest, OneTagOnTwoLanesDeliversBothMessages) {
  HashStore store;
  auto ts = CreateGroup(&store, UniqueGroup("tag-two-lanes"), 2);
  const auto a = Pattern(1, 2 * kRingBytes), b = Pattern(2, 2 * kRingBytes);
  auto sa = ts[0]->Send(1, 5, a, Lane::kTelemetry).value();
  auto sb = ts[0]->Send(1, 5, b, Lane::kGradient).value();
  std::vector<std::byte> x(a.size()), y(b.size());
  auto rx = ts[1]->Recv(0, 5, x).value();
  auto ry = ts[1]->Recv(0, 5, y).value();
  ASSERT_TRUE(rx->Wait(Soon()).ok());
  ASSERT_TRUE(ry->Wait(Soon()).ok());
  ASSERT_TRUE(sa->Wait(Soon()).ok());
  ASSERT_TRUE(sb->Wait(Soon()).ok());
  EXPECT_TRUE((x == a && y == b) || (x == b && y == a));
}

// Three ranks; on every rank one thread per lane sends to and receives from both peers at
// once. Every message arrives whole and, per (sender, lane), in order.
TEST(ShmTransportTest, AllLanesDeliverUnderConcurrentMixedTraffic) {
  constexpr int kRanks = 3;
  constexpr int kPerPeer = 40;
  const std::vector<size_t> sizes = {0, 1, 5000, kRingBytes + 7, 3 * kRingBytes, 64};
  HashStore store;
  auto ts = CreateGroup(&store, UniqueGroup("mixed"), kRanks);
  auto seed = [](int from, int to, int lane, int i) {
    return static_cast<uint64_t>(((from * kRanks + to) * kNumLanes + lane) * 1000 + i);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    for (int lane = 0; lane < kNumLanes; ++lane) {
      threads.emplace_back([&, r, lane] {
        Transport* t = ts[r].get();
        std::vector<std::vector<std::byte>> out, in;
        std::vector<uint64_t> expect;
        out.reserve(2 * kPerPeer);
        in.reserve(2 * kPerPeer);
        std::vector<std::shared_ptr<Request>> reqs;
        for (int i = 0; i < kPerPeer; ++i) {
          for (int p = 0; p < kRanks; ++p) {
            if (p == r) continue;
            const size_t n = sizes[(i + lane) % sizes.size()];
            out.push_back(Pattern(seed(r, p, lane, i), n));
            auto s = t->Send(p, /*tag=*/lane, out.back(), kAllLanes[lane]);
            ASSERT_TRUE(s.ok()) << s.status();
            reqs.push_back(s.value());
            in.emplace_back(n);
            expect.push_back(seed(p, r, lane, i));
            auto rv = t->Recv(p, /*tag=*/lane, in.back());
            ASSERT_TRUE(rv.ok()) << rv.status();
            reqs.push_back(rv.value());
          }
        }
        for (auto& q : reqs) EXPECT_TRUE(q->Wait(Soon()).ok());
        for (size_t j = 0; j < in.size(); ++j) {
          EXPECT_TRUE(in[j] == Pattern(expect[j], in[j].size()))
              << "rank " << r << " lane " << lane << " message " << j;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  for (auto& t : ts) EXPECT_TRUE(t->status().ok());
}

TEST(ShmTransportTest, EveryLanesRingSizeIsValidated) {
  HashStore store;
  ShmTransportOptions o = Options(&store, UniqueGroup("badring"), 0, 1);
  o.ring_bytes = {1 << 16, 1 << 16, 1000, 1 << 16};
  EXPECT_EQ(CreateShmTransport(o).status().code(), ErrorCode::kInvalidArgument);
  o.ring_bytes = 1 << 16;
  o.chunk_bytes = {1, 1, 0, 1};
  EXPECT_EQ(CreateShmTransport(o).status().code(), ErrorCode::kInvalidArgument);
}

TEST(ShmTransportTest, DifferentTagsCanBeReceivedOutOfPostingOrder) {
  HashStore store;
  auto ts = CreateGroup(&store, UniqueGroup("tags"), 2);
  auto a = Pattern(1, 300000), b = Pattern(2, 5000);  // a is bigger than the ring
  auto sa = ts[0]->Send(1, /*tag=*/1, a).value();
  auto sb = ts[0]->Send(1, /*tag=*/2, b).value();
  std::vector<std::byte> ib(b.size()), ia(a.size());
  auto rb = ts[1]->Recv(0, 2, ib).value();
  ASSERT_TRUE(rb->Wait(Soon()).ok());  // tag 2 completes while tag 1 is buffered
  auto ra = ts[1]->Recv(0, 1, ia).value();
  ASSERT_TRUE(ra->Wait(Soon()).ok());
  EXPECT_TRUE(sa->Wait(Soon()).ok());
  EXPECT_TRUE(sb->Wait(Soon()).ok());
  EXPECT_TRUE(ia == a);
  EXPECT_TRUE(ib == b);
}

TEST(ShmTransportTest, RecvWithTheWrongSizeFailsThatRequestOnly) {
  HashStore store;
  auto ts = CreateGroup(&store, UniqueGroup("size"), 2);
  auto a = Pattern(1, 100), b = Pattern(2, 50);
  std::vector<std::byte> wrong(99), right(50);
  auto r1 = ts[1]->Recv(0, 1, wrong).value();  // posted before the message arrives
  ASSERT_TRUE(ts[0]->Send(1, 1, a).value()->Wait(Soon()).ok());
  EXPECT_EQ(r1->Wait(Soon()).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(ts[0]->Send(1, 2, b).value()->Wait(Soon()).ok());
  auto r2 = ts[1]->Recv(0, 2, right).value();
  ASSERT_TRUE(r2->Wait(Soon()).ok());
  EXPECT_TRUE(right == b);
  // A buffered message received with the wrong size.
  ASSERT_TRUE(ts[0]->Send(1, 3, a).value()->Wait(Soon()).ok());
  auto r3 = ts[1]->Recv(0, 3, right).value();
  EXPECT_EQ(r3->Wait(Soon()).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(ts[1]->status().ok());
}

TEST(ShmTransportTest, WaitPastItsDeadlineLeavesTheRequestPending) {
  HashStore store;
  FakeClock clock;
  auto ts = CreateGroup(&store, UniqueGroup("deadline"), 2, &clock);
  std::vector<std::byte> in(10);
  auto r = ts[1]->Recv(0, 1, in).value();
  const TimePoint deadline = clock.Now() + 5s;
  std::thread waiter([&] { EXPECT_EQ(r->Wait(deadline).code(), ErrorCode::kDeadlineExceeded); });
  clock.BlockUntilWaiters(1);
  clock.Advance(10s);
  waiter.join();
  EXPECT_FALSE(r->Test().has_value());
  auto out = Pattern(9, 10);
  ASSERT_TRUE(ts[0]->Send(1, 1, out).value()->Wait(clock.Now() + 1h).ok());
  ASSERT_TRUE(r->Wait(clock.Now() + 1h).ok());
  EXPECT_TRUE(in == out);
}

TEST(ShmTransportTest, AbortFailsThePeersPendingRequests) {
  HashStore store;
  auto ts = CreateGroup(&store, UniqueGroup("abort"), 3);
  std::vector<std::byte> in(10);
  auto r1 = ts[1]->Recv(0, 1, in).value();
  auto r2 = ts[2]->Recv(0, 1, in).value();
  ts[0]->Abort(AbortedError("test abort"));
  EXPECT_EQ(ts[0]->status().code(), ErrorCode::kAborted);
  EXPECT_EQ(r1->Wait(Soon()).code(), ErrorCode::kAborted);
  EXPECT_EQ(r2->Wait(Soon()).code(), ErrorCode::kAborted);
  // Sticky.
  EXPECT_EQ(ts[1]->Send(2, 1, in).status().code(), ErrorCode::kAborted);
  EXPECT_EQ(ts[0]->Recv(1, 1, in).status().code(), ErrorCode::kAborted);
}

TEST(ShmTransportTest, APeerThatClosesDeliversWhatItSentThenFailsOnlyItsRequests) {
  HashStore store;
  auto ts = CreateGroup(&store, UniqueGroup("close"), 3);
  const auto a = Pattern(5, 3 * kRingBytes);  // more than the ring, so it is buffered
  ASSERT_TRUE(ts[0]->Send(2, 1, a).value()->Wait(Soon()).ok());
  ts[0].reset();  // its last bytes may still be in the ring
  std::vector<std::byte> in(a.size()), more(4);
  auto from0 = ts[2]->Recv(0, 1, in).value();
  auto never = ts[2]->Recv(0, 2, more).value();
  ASSERT_TRUE(from0->Wait(Soon()).ok());
  EXPECT_TRUE(in == a);
  EXPECT_EQ(never->Wait(Soon()).code(), ErrorCode::kUnavailable);
  EXPECT_TRUE(ts[2]->status().ok());
  // Ranks 1 and 2 still talk.
  const auto b = Pattern(6, 1000);
  std::vector<std::byte> got(b.size());
  auto r = ts[2]->Recv(1, 1, got).value();
  ASSERT_TRUE(ts[1]->Send(2, 1, b).value()->Wait(Soon()).ok());
  ASSERT_TRUE(r->Wait(Soon()).ok());
  EXPECT_TRUE(got == b);
}

TEST(ShmTransportTest, BadPeerIsInvalidArgument) {
  HashStore store;
  auto ts = CreateGroup(&store, UniqueGroup("badpeer"), 2);
  std::vector<std::byte> b(1);
  EXPECT_EQ(ts[0]->Send(0, 1, b).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ts[0]->Recv(2, 1, b).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ts[0]->Send(-1, 1, b).status().code(), ErrorCode::kInvalidArgument);
}

TEST(ShmTransportTest, ConnectTimesOutWhenAPeerNeverJoins) {
  FakeClock clock;
  HashStore store(&clock);
  const std::string group = UniqueGroup("lonely");
  std::thread advancer([&] {
    clock.BlockUntilWaiters(1);
    clock.Advance(60s);
  });
  auto t = CreateShmTransport(Options(&store, group, 0, 2));
  advancer.join();
  EXPECT_EQ(t.status().code(), ErrorCode::kDeadlineExceeded);
  EXPECT_EQ(ShmEntries(group), 0);
}

using kc::testing::ChildGuard;

// The child rank of the fork test: connects to the store whose port arrives on `port_fd`,
// sends `hello`, reports on `ready_fd`, then waits to be killed. Never returns.
[[noreturn]] void RunChildRank(int port_fd, int ready_fd, const std::string& group,
                               const std::vector<std::byte>& hello) {
  int port = 0;
  if (read(port_fd, &port, sizeof port) != sizeof port) _exit(2);
  auto store = TcpStoreClient::Connect("127.0.0.1", port, Clock::Real()->Now() + 30s);
  if (!store.ok()) _exit(3);
  auto t = CreateShmTransport(Options(store.value().get(), group, 1, 2));
  if (!t.ok()) _exit(4);
  if (!t.value()->Send(0, 1, hello).value()->Wait(Clock::Real()->Now() + 30s).ok()) _exit(5);
  const char c = 1;
  if (write(ready_fd, &c, 1) != 1) _exit(6);
  char unused;
  // Blocks until SIGKILL; returns only if the parent died (its pipe end closed).
  if (read(port_fd, &unused, 1) < 0) _exit(7);
  _exit(8);
}

// The peer rank is a forked child process: proves the cross-process mapping, then that its
// death fails the survivor's pending Recv with kUnavailable and the error sticks. The child
// is forked before this process starts any thread of the test.
TEST(ShmTransportTest, APeerProcessKilledFailsPendingRequestsWithUnavailable) {
  const std::string group = UniqueGroup("fork");
  const auto hello = Pattern(42, 200000);
  int port_pipe[2], ready_pipe[2];
  ASSERT_EQ(pipe(port_pipe), 0);
  ASSERT_EQ(pipe(ready_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(port_pipe[1]);
    close(ready_pipe[0]);
    RunChildRank(port_pipe[0], ready_pipe[1], group, hello);
  }
  ChildGuard child(pid);
  close(port_pipe[0]);
  close(ready_pipe[1]);

  auto server = TcpStoreServer::Start({.bind_address = "127.0.0.1", .port = 0});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = server.value()->port();
  ASSERT_EQ(write(port_pipe[1], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  auto store = TcpStoreClient::Connect("127.0.0.1", port, Clock::Real()->Now() + 30s);
  ASSERT_TRUE(store.ok());
  auto t = CreateShmTransport(Options(store.value().get(), group, 0, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<std::byte> in(hello.size());
  ASSERT_TRUE(t.value()->Recv(1, 1, in).value()->Wait(Soon()).ok());
  EXPECT_TRUE(in == hello);
  char c;
  ASSERT_EQ(read(ready_pipe[0], &c, 1), 1);
  close(ready_pipe[0]);

  auto pending = t.value()->Recv(1, 2, in).value();
  const int wstatus = child.KillAndReap();
  close(port_pipe[1]);
  EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << wstatus;
  EXPECT_EQ(pending->Wait(Soon()).code(), ErrorCode::kUnavailable);
  EXPECT_EQ(t.value()->status().code(), ErrorCode::kUnavailable);
  EXPECT_EQ(t.value()->Send(1, 1, in).status().code(), ErrorCode::kUnavailable);
  t.value().reset();
  EXPECT_EQ(ShmEntries(group), 0);
}

}  // namespace
}  // namespace kc::comm

namespace kc::comm {
namespace {

int SpinForBench() {
  const char* v = std::getenv("KC_SHM_BENCH_SPIN");
  return v != nullptr ? std::atoi(v) : ShmTransportOptions{}.spin_iterations;
}

// Not a check: prints the single-pair bandwidth for 8 MiB messages with default ring sizes.
// Run with --gtest_also_run_disabled_tests --gtest_filter='*Throughput*'.
TEST(ShmTransportTest, DISABLED_Throughput8MiB) {
  HashStore store;
  const std::string group = UniqueGroup("bench");
  std::vector<std::unique_ptr<Transport>> ts(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ts[r] = CreateShmTransport({.store = &store,
                                  .group = group,
                                  .rank = r,
                                  .size = 2,
                                  .spin_iterations = SpinForBench()})
                  .value();
    });
  }
  for (auto& t : threads) t.join();
  constexpr int kIters = 200;
  const auto out = Pattern(1, 8 << 20);
  std::vector<std::byte> in(out.size());
  const auto start = std::chrono::steady_clock::now();
  std::thread sender([&] {
    for (int i = 0; i < kIters; ++i) ASSERT_TRUE(ts[0]->Send(1, 1, out).value()->Wait(Soon()).ok());
  });
  for (int i = 0; i < kIters; ++i) ASSERT_TRUE(ts[1]->Recv(0, 1, in).value()->Wait(Soon()).ok());
  sender.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("shm 8 MiB x %d: %.2f GB/s\n", kIters, kIters * double(out.size()) / s / 1e9);
}

}  // namespace
}  // namespace kc::comm
