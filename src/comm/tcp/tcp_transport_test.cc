// The TCP transport between ranks run as threads of one process, over 127.0.0.1.
#include "comm/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/hash_store.h"
#include "hal/fd.h"

namespace kc::comm {
namespace {

TimePoint In(Duration d) { return std::chrono::steady_clock::now() + d; }
// Bounds waits that should end long before; it only stops a broken test from hanging.
TimePoint Far() { return In(std::chrono::seconds(60)); }

using Transports = std::vector<std::unique_ptr<Transport>>;

// Creates the `n` ranks of `group` concurrently (each blocks until all are connected).
Transports CreateGroup(HashStore* store, const std::string& group, int n,
                       const TcpTransportOptions& base = {}) {
  Transports out(n);
  std::vector<Status> errors(n);
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        TcpTransportOptions o = base;
        o.store = store;
        o.group = group;
        o.rank = r;
        o.size = n;
        o.connect_timeout = std::chrono::seconds(30);
        Result<std::unique_ptr<Transport>> t = CreateTcpTransport(o);
        if (t.ok()) {
          out[r] = *std::move(t);
        } else {
          errors[r] = t.status();
        }
      });
    }
  }
  for (int r = 0; r < n; ++r) EXPECT_TRUE(errors[r].ok()) << "rank " << r << ": " << errors[r];
  return out;
}

std::byte PatternByte(int src, int dst, size_t i, size_t salt) {
  return static_cast<std::byte>((src * 31 + dst * 7 + i * 13 + salt) & 0xff);
}

std::vector<std::byte> Pattern(int src, int dst, size_t size, size_t salt) {
  std::vector<std::byte> v(size);
  for (size_t i = 0; i < size; ++i) v[i] = PatternByte(src, dst, i, salt);
  return v;
}

// (world size, connections per peer)
class TcpTransportAllPairsTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(TcpTransportAllPairsTest, EveryRankReceivesEveryPeersPattern) {
  const auto [n, connections] = GetParam();
  HashStore store;
  TcpTransportOptions base;
  base.connections_per_peer = connections;
  Transports t = CreateGroup(&store, "all-pairs", n, base);
  ASSERT_EQ(t.size(), static_cast<size_t>(n));
  for (auto& x : t) ASSERT_NE(x, nullptr);
  const size_t sizes[] = {0, 1, 7, 4096, 256 * 1024, 8 * 1024 * 1024};
  for (size_t size : sizes) {
    SCOPED_TRACE("size=" + std::to_string(size));
    // [src][dst]
    std::vector<std::vector<std::vector<std::byte>>> sent(n), got(n);
    std::vector<std::shared_ptr<Request>> reqs;
    for (int src = 0; src < n; ++src) {
      sent[src].resize(n);
      for (int dst = 0; dst < n; ++dst) {
        if (src == dst) continue;
        sent[src][dst] = Pattern(src, dst, size, size);
      }
    }
    for (int dst = 0; dst < n; ++dst) {
      got[dst].resize(n);
      for (int src = 0; src < n; ++src) {
        if (src == dst) continue;
        got[dst][src].resize(size);
        Result<std::shared_ptr<Request>> r = t[dst]->Recv(src, 42, got[dst][src]);
        ASSERT_TRUE(r.ok()) << r.status();
        reqs.push_back(*r);
      }
    }
    for (int src = 0; src < n; ++src) {
      for (int dst = 0; dst < n; ++dst) {
        if (src == dst) continue;
        Result<std::shared_ptr<Request>> r = t[src]->Send(dst, 42, sent[src][dst]);
        ASSERT_TRUE(r.ok()) << r.status();
        reqs.push_back(*r);
      }
    }
    for (auto& r : reqs) ASSERT_TRUE(r->Wait(Far()).ok());
    for (int dst = 0; dst < n; ++dst) {
      for (int src = 0; src < n; ++src) {
        if (src != dst) EXPECT_TRUE(got[dst][src] == sent[src][dst]) << src << "->" << dst;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TcpWorldSizes, TcpTransportAllPairsTest,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values(1, 3)));

TEST(TcpTransportTest, ManyMessagesWithOneTagArriveInPostingOrderAcrossLanes) {
  HashStore store;
  Transports t = CreateGroup(&store, "in-order", 2);
  ASSERT_NE(t[1], nullptr);
  constexpr int kMessages = 200;
  std::vector<std::vector<std::byte>> sent(kMessages), got(kMessages);
  std::vector<std::shared_ptr<Request>> sends, recvs;
  for (int i = 0; i < kMessages; ++i) {
    // Varying sizes (some over a chunk) and lanes: order follows posting, not the wire.
    sent[i] = Pattern(0, 1, static_cast<size_t>(i * 4099 % 600000), static_cast<size_t>(i));
    Result<std::shared_ptr<Request>> s = t[0]->Send(1, 7, sent[i], kAllLanes[i % kNumLanes]);
    ASSERT_TRUE(s.ok()) << s.status();
    sends.push_back(*s);
  }
  for (int i = 0; i < kMessages; ++i) {
    got[i].resize(sent[i].size());
    Result<std::shared_ptr<Request>> r = t[1]->Recv(0, 7, got[i]);
    ASSERT_TRUE(r.ok()) << r.status();
    recvs.push_back(*r);
  }
  for (auto& r : sends) ASSERT_TRUE(r->Wait(Far()).ok());
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(recvs[i]->Wait(Far()).ok()) << i;
    EXPECT_TRUE(got[i] == sent[i]) << i;
  }
}

TEST(TcpTransportTest, DifferentTagsCanBeReceivedOutOfPostingOrder) {
  HashStore store;
  Transports t = CreateGroup(&store, "tags", 2);
  ASSERT_NE(t[1], nullptr);
  std::vector<std::byte> a = Pattern(0, 1, 1000, 1), b = Pattern(0, 1, 3000, 2);
  auto sa = t[0]->Send(1, 1, a);
  auto sb = t[0]->Send(1, 2, b);
  ASSERT_TRUE(sa.ok() && sb.ok());
  std::vector<std::byte> ga(a.size()), gb(b.size());
  auto rb = t[1]->Recv(0, 2, gb);
  ASSERT_TRUE(rb.ok());
  ASSERT_TRUE((*rb)->Wait(Far()).ok());
  EXPECT_TRUE(gb == b);
  auto ra = t[1]->Recv(0, 1, ga);
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE((*ra)->Wait(Far()).ok());
  EXPECT_TRUE(ga == a);
  EXPECT_TRUE((*sa)->Wait(Far()).ok());
  EXPECT_TRUE((*sb)->Wait(Far()).ok());
}

// A LaneScheduler that hands out nothing until a gradient message is queued, so that a
// telemetry message is certainly still queued when the gradient one arrives.
class GatedScheduler final : public LaneScheduler {
 public:
  explicit GatedScheduler(std::unique_ptr<LaneScheduler> inner) : inner_(std::move(inner)) {}
  Status Enqueue(Lane lane, WorkItem item, TimePoint deadline) override {
    Status s = inner_->Enqueue(lane, std::move(item), deadline);
    if (lane == Lane::kGradient) open_ = true;
    return s;
  }
  Result<Chunk> Next(TimePoint deadline) override {
    if (!open_) return DeadlineExceededError("gated");
    return inner_->Next(deadline);
  }
  void Close() override {
    open_ = true;
    inner_->Close();
  }
  LaneSchedulerMetrics metrics() const override { return inner_->metrics(); }
  const LaneOptions& options() const override { return inner_->options(); }

 private:
  std::unique_ptr<LaneScheduler> inner_;
  std::atomic<bool> open_{false};
};

TEST(TcpTransportTest, GradientMessageOvertakesQueuedTelemetry) {
  HashStore store;
  TcpTransportOptions base;
  base.make_scheduler = [](const LaneOptions& o,
                           Clock* c) -> Result<std::unique_ptr<LaneScheduler>> {
    KC_ASSIGN_OR_RETURN(std::unique_ptr<LaneScheduler> inner, LaneScheduler::Create(o, c));
    return std::unique_ptr<LaneScheduler>(new GatedScheduler(std::move(inner)));
  };
  Transports t = CreateGroup(&store, "lanes", 2, base);
  ASSERT_NE(t[1], nullptr);
  std::vector<std::byte> telemetry = Pattern(0, 1, 8 * 1024 * 1024, 3);
  std::vector<std::byte> gradient = Pattern(0, 1, 4096, 4);
  std::vector<std::byte> got_telemetry(telemetry.size()), got_gradient(gradient.size());
  auto rt = t[1]->Recv(0, 1, got_telemetry);
  auto rg = t[1]->Recv(0, 2, got_gradient);
  ASSERT_TRUE(rt.ok() && rg.ok());
  auto st = t[0]->Send(1, 1, telemetry, Lane::kTelemetry);
  ASSERT_TRUE(st.ok());
  auto sg = t[0]->Send(1, 2, gradient, Lane::kGradient);
  ASSERT_TRUE(sg.ok());
  ASSERT_TRUE((*rt)->Wait(Far()).ok());
  // The receiver handles the stream in order, so the gradient message completed first.
  std::optional<Status> gradient_done = (*rg)->Test();
  ASSERT_TRUE(gradient_done.has_value());
  EXPECT_TRUE(gradient_done->ok());
  EXPECT_TRUE(got_gradient == gradient);
  EXPECT_TRUE(got_telemetry == telemetry);
  EXPECT_TRUE((*st)->Wait(Far()).ok());
  EXPECT_TRUE((*sg)->Wait(Far()).ok());
}

TEST(TcpTransportTest, RecvOfTheWrongSizeFailsThatRequestOnly) {
  HashStore store;
  Transports t = CreateGroup(&store, "wrong-size", 2);
  ASSERT_NE(t[1], nullptr);
  std::vector<std::byte> msg = Pattern(0, 1, 100, 5);
  std::vector<std::byte> small(99), right(100);
  // Posted before the message arrives.
  auto r1 = t[1]->Recv(0, 9, small);
  ASSERT_TRUE(r1.ok());
  auto s1 = t[0]->Send(1, 9, msg);
  ASSERT_TRUE(s1.ok());
  EXPECT_EQ((*r1)->Wait(Far()).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE((*s1)->Wait(Far()).ok());
  // Posted after it arrived (the first Recv of tag 10 waits for the second message, so the
  // first one is buffered by then).
  auto s2 = t[0]->Send(1, 10, msg);
  auto s3 = t[0]->Send(1, 10, msg);
  ASSERT_TRUE(s2.ok() && s3.ok());
  ASSERT_TRUE((*s2)->Wait(Far()).ok());
  ASSERT_TRUE((*s3)->Wait(Far()).ok());
  std::vector<std::byte> big(101);
  auto r2 = t[1]->Recv(0, 10, big);
  auto r3 = t[1]->Recv(0, 10, right);
  ASSERT_TRUE(r2.ok() && r3.ok());
  EXPECT_EQ((*r2)->Wait(Far()).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE((*r3)->Wait(Far()).ok());
  EXPECT_TRUE(right == msg);
  EXPECT_TRUE(t[1]->status().ok());
}

TEST(TcpTransportTest, WaitPastDeadlineLeavesTheRecvPending) {
  HashStore store;
  Transports t = CreateGroup(&store, "deadline", 2);
  ASSERT_NE(t[1], nullptr);
  std::vector<std::byte> got(10);
  auto r = t[1]->Recv(0, 1, got);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->Wait(In(std::chrono::milliseconds(20))).code(), ErrorCode::kDeadlineExceeded);
  EXPECT_FALSE((*r)->Test().has_value());
  std::vector<std::byte> msg = Pattern(0, 1, 10, 6);
  auto s = t[0]->Send(1, 1, msg);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE((*r)->Wait(Far()).ok());
  EXPECT_TRUE(got == msg);
  EXPECT_TRUE((*s)->Wait(Far()).ok());
}

TEST(TcpTransportTest, BadPeerIsInvalidArgument) {
  HashStore store;
  Transports t = CreateGroup(&store, "bad-peer", 2);
  ASSERT_NE(t[0], nullptr);
  std::vector<std::byte> b(1);
  EXPECT_EQ(t[0]->Send(0, 1, b).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(t[0]->Recv(2, 1, b).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(t[0]->Recv(-1, 1, b).status().code(), ErrorCode::kInvalidArgument);
}

// Connections per peer.
class TcpTransportCloseTest : public ::testing::TestWithParam<int> {};

TEST_P(TcpTransportCloseTest, DestroyedRankDeliversItsLastMessageAndFailsOnlyItsOwnRequests) {
  // Before the transports: a send's buffer must outlive it. Several chunks, so that with
  // more than one connection the message is striped.
  const std::vector<std::byte> last = Pattern(0, 1, 3 * 1024 * 1024 + 5, 8);
  std::vector<std::byte> got(last.size()), never(10), late(10), to_closed(10);
  HashStore store;
  TcpTransportOptions base;
  base.connections_per_peer = GetParam();
  base.close_timeout = std::chrono::seconds(60);  // never reached: the peers answer at once
  Transports t = CreateGroup(&store, "close", 3, base);
  ASSERT_NE(t[2], nullptr);
  // Posted before rank 0 closes; rank 0 never sends tag 2.
  auto never_sent = t[1]->Recv(0, 2, never);
  ASSERT_TRUE(never_sent.ok());
  // Rank 0's last message, not waited for: the destructor writes it before the close frame.
  auto last_send = t[0]->Send(1, 1, last);
  ASSERT_TRUE(last_send.ok());
  t[0].reset();
  ASSERT_TRUE((*last_send)->Test().has_value());
  EXPECT_TRUE((*last_send)->Test()->ok()) << *(*last_send)->Test();

  // Rank 1 still receives it, though its Recv is posted after the close.
  auto last_recv = t[1]->Recv(0, 1, got);
  ASSERT_TRUE(last_recv.ok());
  EXPECT_TRUE((*last_recv)->Wait(Far()).ok());
  EXPECT_TRUE(got == last);

  // Requests from and to rank 0 fail with kUnavailable naming it; the transport stays OK.
  Status s = (*never_sent)->Wait(Far());
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("peer rank=0 closed"), std::string::npos) << s;
  auto late_recv = t[1]->Recv(0, 1, late);  // the second message of tag 1: never sent
  ASSERT_TRUE(late_recv.ok());
  s = (*late_recv)->Wait(Far());
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("peer rank=0 closed"), std::string::npos) << s;
  auto send_to_closed = t[1]->Send(0, 1, to_closed);
  ASSERT_TRUE(send_to_closed.ok());
  s = (*send_to_closed)->Wait(Far());
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable) << s;
  EXPECT_TRUE(t[1]->status().ok()) << t[1]->status();
  EXPECT_TRUE(t[2]->status().ok()) << t[2]->status();

  // Ranks 1 and 2 still talk, both ways.
  for (int src : {1, 2}) {
    const int dst = 3 - src;
    std::vector<std::byte> msg = Pattern(src, dst, 300 * 1024, 9), in(msg.size());
    auto r = t[dst]->Recv(src, 5, in);
    auto w = t[src]->Send(dst, 5, msg);
    ASSERT_TRUE(r.ok() && w.ok());
    EXPECT_TRUE((*w)->Wait(Far()).ok());
    EXPECT_TRUE((*r)->Wait(Far()).ok());
    EXPECT_TRUE(in == msg) << src << "->" << dst;
  }
  EXPECT_TRUE(t[1]->status().ok()) << t[1]->status();
  EXPECT_TRUE(t[2]->status().ok()) << t[2]->status();
}

TEST_P(TcpTransportCloseTest, RanksDestroyedTogetherCloseWithoutFailingEachOther) {
  HashStore store;
  TcpTransportOptions base;
  base.connections_per_peer = GetParam();
  base.close_timeout = std::chrono::seconds(60);
  Transports t = CreateGroup(&store, "close-together", 3, base);
  ASSERT_NE(t[2], nullptr);
  // Every rank has one message in flight to every other when all are destroyed at once.
  std::vector<std::vector<std::byte>> msgs;
  std::vector<std::shared_ptr<Request>> sends;
  for (int src = 0; src < 3; ++src) msgs.push_back(Pattern(src, 0, 1024 * 1024, 10));
  for (int src = 0; src < 3; ++src) {
    for (int dst = 0; dst < 3; ++dst) {
      if (src == dst) continue;
      auto w = t[src]->Send(dst, 1, msgs[src]);
      ASSERT_TRUE(w.ok());
      sends.push_back(*w);
    }
  }
  {
    std::vector<std::jthread> closers;
    for (auto& x : t) closers.emplace_back([&x] { x.reset(); });
  }
  // Each send was written before its rank's close frame, or failed because its peer had
  // closed first; no rank saw a lost connection (that would fail the rest sticky).
  for (auto& w : sends) {
    const std::optional<Status> s = w->Test();
    ASSERT_TRUE(s.has_value());
    if (s->ok()) continue;
    EXPECT_EQ(s->code(), ErrorCode::kUnavailable) << *s;
    EXPECT_NE(s->message().find("closed its transport"), std::string::npos) << *s;
  }
}

INSTANTIATE_TEST_SUITE_P(TcpConnections, TcpTransportCloseTest, ::testing::Values(1, 3));

TEST(TcpTransportTest, AbortFailsPendingRequestsAndPeersSeeTheClose) {
  HashStore store;
  Transports t = CreateGroup(&store, "abort", 2);
  ASSERT_NE(t[1], nullptr);
  std::vector<std::byte> got0(10), got1(10);
  auto r0 = t[0]->Recv(1, 1, got0);
  auto r1 = t[1]->Recv(0, 1, got1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  t[0]->Abort(OkStatus());
  t[0]->Abort(OkStatus());  // idempotent
  EXPECT_EQ((*r0)->Wait(Far()).code(), ErrorCode::kAborted);
  EXPECT_EQ(t[0]->status().code(), ErrorCode::kAborted);
  EXPECT_EQ(t[0]->Send(1, 1, got0).status().code(), ErrorCode::kAborted);
  EXPECT_EQ((*r1)->Wait(Far()).code(), ErrorCode::kUnavailable);
}

TEST(TcpTransportTest, AbortedRankFailsEveryPeerSticky) {
  HashStore store;
  Transports t = CreateGroup(&store, "abort-sticky", 3);
  ASSERT_NE(t[2], nullptr);
  std::vector<std::byte> got1(10), got2(10), b(10);
  auto r1 = t[1]->Recv(0, 1, got1);
  auto r2 = t[2]->Recv(0, 1, got2);
  ASSERT_TRUE(r1.ok() && r2.ok());
  t[0]->Abort(OkStatus());
  // Unlike a close, an abort fails the peers' whole transports.
  for (int r : {1, 2}) {
    const Status s = (r == 1 ? *r1 : *r2)->Wait(Far());
    EXPECT_EQ(s.code(), ErrorCode::kUnavailable) << s;
    EXPECT_EQ(t[r]->status().code(), ErrorCode::kUnavailable) << t[r]->status();
    const int other = 3 - r;
    EXPECT_EQ(t[r]->Send(other, 1, b).status().code(), ErrorCode::kUnavailable);
    EXPECT_EQ(t[r]->Recv(other, 1, b).status().code(), ErrorCode::kUnavailable);
  }
  // Destroying an aborted transport changes nothing for the peers.
  t[0].reset();
  EXPECT_EQ(t[1]->status().code(), ErrorCode::kUnavailable);
}

TEST(TcpTransportTest, HelloWithWrongGroupIsRefusedWithoutDisturbingTheGroup) {
  HashStore store;
  const std::string group = "real-group";
  Result<std::unique_ptr<Transport>> t1 = InvalidArgumentError("not created");
  std::jthread rank1(
      [&] { t1 = CreateTcpTransport({.store = &store, .group = group, .rank = 1, .size = 2}); });
  // Connect to rank 1 as a rank 0 of another generation.
  Result<std::string> addr = store.Get(group + "/tcp_transport/addr/1", Far());
  ASSERT_TRUE(addr.ok()) << addr.status();
  const size_t colon = addr->rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr->substr(colon + 1))));
  ASSERT_EQ(inet_pton(AF_INET, addr->substr(0, colon).c_str(), &sa.sin_addr), 1);
  {
    hal::Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(fd.valid());
    ASSERT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    // The hello of comm/doc/tcp_protocol.md with group "real-group-old".
    const std::string bad_group = group + "-old";
    // magic, version 1, rank 0, size 2, connection 0 of 1, then group_bytes and group.
    std::vector<unsigned char> hello = {'K', 'C', 'P', '1', 1, 0, 0, 0, 0, 0, 0, 0,
                                        2,   0,   0,   0,   0, 0, 0, 0, 1, 0, 0, 0};
    hello.push_back(static_cast<unsigned char>(bad_group.size()));
    hello.insert(hello.end(), {0, 0, 0});
    hello.insert(hello.end(), bad_group.begin(), bad_group.end());
    ASSERT_EQ(send(fd.get(), hello.data(), hello.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(hello.size()));
    // Refused: closed without a reply (a blocking read ends with EOF).
    char c;
    EXPECT_LE(recv(fd.get(), &c, 1, 0), 0);
  }
  // The real rank 0 still gets in.
  Result<std::unique_ptr<Transport>> t0 =
      CreateTcpTransport({.store = &store, .group = group, .rank = 0, .size = 2});
  rank1.join();
  ASSERT_TRUE(t0.ok()) << t0.status();
  ASSERT_TRUE(t1.ok()) << t1.status();
  std::vector<std::byte> msg = Pattern(0, 1, 64, 7), got(64);
  auto r = (*t1)->Recv(0, 1, got);
  auto s = (*t0)->Send(1, 1, msg);
  ASSERT_TRUE(r.ok() && s.ok());
  EXPECT_TRUE((*r)->Wait(Far()).ok());
  EXPECT_TRUE(got == msg);
  EXPECT_TRUE((*s)->Wait(Far()).ok());
}

TEST(TcpTransportTest, DestructorWritesACloseFrameAndGivesUpOnAPeerThatNeverAnswers) {
  HashStore store;
  const std::string group = "close-wire";
  // A fake rank 1 on a plain blocking socket: it says hello, then never reads or closes.
  hal::Fd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(listener.valid());
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(listen(listener.get(), 4), 0);
  socklen_t len = sizeof(sa);
  ASSERT_EQ(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&sa), &len), 0);
  ASSERT_TRUE(
      store.Set(group + "/tcp_transport/addr/1", "127.0.0.1:" + std::to_string(ntohs(sa.sin_port)))
          .ok());
  Result<std::unique_ptr<Transport>> t0 = InvalidArgumentError("not created");
  std::jthread rank0([&] {
    t0 = CreateTcpTransport({.store = &store,
                             .group = group,
                             .rank = 0,
                             .size = 2,
                             .close_timeout = std::chrono::milliseconds(100)});
  });
  hal::Fd fd(accept(listener.get(), nullptr, nullptr));
  ASSERT_TRUE(fd.valid());
  auto read_exactly = [&](size_t n) {
    std::vector<unsigned char> out(n);
    size_t done = 0;
    while (done < n) {
      const ssize_t got = recv(fd.get(), out.data() + done, n - done, 0);
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    out.resize(done);
    return out;
  };
  // Rank 0's hello (comm/doc/tcp_protocol.md), answered as rank 1.
  std::vector<unsigned char> hello = read_exactly(28 + group.size());
  ASSERT_EQ(hello.size(), 28 + group.size());
  hello[8] = 1;  // rank
  ASSERT_EQ(send(fd.get(), hello.data(), hello.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(hello.size()));
  rank0.join();
  ASSERT_TRUE(t0.ok()) << t0.status();
  // Returns although the fake never shuts its end: close_timeout bounds the wait.
  t0->reset();
  // On the wire: the close frame ("KCC1", then 44 zero bytes), then EOF.
  std::vector<unsigned char> close = read_exactly(48);
  ASSERT_EQ(close.size(), 48u);
  EXPECT_EQ(std::string(close.begin(), close.begin() + 4), "KCC1");
  EXPECT_TRUE(std::all_of(close.begin() + 4, close.end(), [](unsigned char c) { return c == 0; }));
  char c;
  EXPECT_EQ(recv(fd.get(), &c, 1, 0), 0);
}

TEST(TcpTransportTest, TooManyUnexpectedBytesFailTheTransport) {
  // Before the transports: a send's buffer must outlive it.
  std::vector<std::byte> small(10), big(2000);
  HashStore store;
  TcpTransportOptions base;
  base.max_unexpected_bytes = 1000;
  Transports t = CreateGroup(&store, "unexpected-limit", 2, base);
  ASSERT_NE(t[1], nullptr);
  auto r = t[1]->Recv(0, 1, small);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(t[0]->Send(1, 2, big).ok());  // nobody receives tag 2 yet
  EXPECT_EQ((*r)->Wait(Far()).code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(t[1]->status().code(), ErrorCode::kResourceExhausted);
}

TEST(TcpTransportTest, OptionsAreChecked) {
  HashStore store;
  EXPECT_EQ(CreateTcpTransport(
                {.store = &store, .group = "g", .rank = 0, .size = 2, .connections_per_peer = 0})
                .status()
                .code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(
      CreateTcpTransport({.store = &store, .group = "g", .rank = 2, .size = 2}).status().code(),
      ErrorCode::kInvalidArgument);
  EXPECT_EQ(
      CreateTcpTransport({.store = nullptr, .group = "g", .rank = 0, .size = 1}).status().code(),
      ErrorCode::kInvalidArgument);
  // A group of one needs no peers.
  Result<std::unique_ptr<Transport>> one =
      CreateTcpTransport({.store = &store, .group = "solo", .rank = 0, .size = 1});
  ASSERT_TRUE(one.ok()) << one.status();
  std::vector<std::byte> b(1);
  EXPECT_EQ((*one)->Send(0, 1, b).status().code(), ErrorCode::kInvalidArgument);
}

// Measures (does not assert) single-pair loopback throughput for 8 MiB messages.
class TcpTransportThroughputTest : public ::testing::TestWithParam<int> {};

TEST_P(TcpTransportThroughputTest, LoopbackFor8MiBMessages) {
  HashStore store;
  TcpTransportOptions base;
  base.connections_per_peer = GetParam();
  Transports t = CreateGroup(&store, "throughput", 2, base);
  ASSERT_NE(t[1], nullptr);
  constexpr int kMessages = 64;
  constexpr size_t kBytes = 8 * 1024 * 1024;
  std::vector<std::byte> src(kBytes, std::byte{1}), dst(kBytes);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kMessages; ++i) {
    auto r = t[1]->Recv(0, 1, dst);
    auto s = t[0]->Send(1, 1, src);
    ASSERT_TRUE(r.ok() && s.ok());
    ASSERT_TRUE((*s)->Wait(Far()).ok());
    ASSERT_TRUE((*r)->Wait(Far()).ok());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("tcp_transport loopback, %d connection(s): %d x 8 MiB in %.3f s = %.2f GB/s\n",
              GetParam(), kMessages, seconds,
              kMessages * static_cast<double>(kBytes) / seconds / 1e9);
}

INSTANTIATE_TEST_SUITE_P(TcpConnections, TcpTransportThroughputTest, ::testing::Values(1, 2, 4));

}  // namespace
}  // namespace kc::comm
