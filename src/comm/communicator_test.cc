#include "comm/communicator.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <functional>
#include <memory>
#include <numeric>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/notification.h"
#include "comm/bucket.h"
#include "comm/hash_store.h"
#include "hal/inventory.h"

namespace kc::comm {
namespace {

using namespace std::chrono_literals;
using hal::DataType;

// Asserts that a Result<std::shared_ptr<Work>> was accepted and completes OK.
#define ASSERT_DONE(w)                            \
  do {                                            \
    ASSERT_TRUE((w).ok()) << (w).status();        \
    const Status done_status = (*(w))->Wait();    \
    ASSERT_TRUE(done_status.ok()) << done_status; \
  } while (false)

std::string UniqueGroup(const std::string& what) {
  static std::atomic<int> counter{0};
  return "comm-" + what + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

struct GroupSpec {
  int size = 2;
  TransportKind transport = TransportKind::kAuto;
  std::vector<std::string> hosts;  // empty: one host
  Algorithm algorithm = Algorithm::kAuto;
  Duration timeout = 30s;
  std::shared_ptr<const hal::Topology> topology;  // devices by host name
};

// Runs body(comm) on `spec.size` threads, one communicator each, built concurrently.
void RunRanks(const GroupSpec& spec, const std::function<void(Communicator&)>& body) {
  HashStore store;
  const std::string group = UniqueGroup("g");
  std::vector<std::jthread> threads;
  for (int r = 0; r < spec.size; ++r) {
    threads.emplace_back([&, r] {
      Result<std::unique_ptr<Communicator>> c =
          Communicator::Create({.store = &store,
                                .group = group,
                                .rank = r,
                                .size = spec.size,
                                .host = spec.hosts.empty() ? "one-host" : spec.hosts[r],
                                .transport = spec.transport,
                                .timeout = spec.timeout,
                                .algorithm = spec.algorithm,
                                .staging_bytes = 64 << 10,
                                .shm_ring_bytes = 64 << 10,
                                .topology = spec.topology});
      ASSERT_TRUE(c.ok()) << c.status();
      body(**c);
    });
  }
}

std::vector<float> Input(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((rank + 1) * 10 + i % 7);
  return v;
}

float SumAt(int size, size_t i) {
  float s = 0;
  for (int r = 0; r < size; ++r) s += static_cast<float>((r + 1) * 10 + i % 7);
  return s;
}

struct LayoutCase {
  std::string name;
  GroupSpec spec;
};

// Names the case in test output instead of dumping its bytes.
void PrintTo(const LayoutCase& c, std::ostream* os) { *os << c.name; }

class CommunicatorLayoutTest : public ::testing::TestWithParam<LayoutCase> {};

// Every operation through the communicator on one layout, against the plain reference.
TEST_P(CommunicatorLayoutTest, EveryOperationMatchesTheReference) {
  const GroupSpec& spec = GetParam().spec;
  const int n = spec.size;
  for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{40000}}) {
    RunRanks(spec, [&](Communicator& c) {
      const int r = c.rank();
      // Allreduce sum and avg, two in flight at once, waited in reverse order.
      std::vector<float> a = Input(r, count);
      std::vector<float> b = Input(r, count);
      auto wa = c.Allreduce(std::span(a), ReduceOp::kSum);
      auto wb = c.Allreduce(std::span(b), ReduceOp::kAvg);
      ASSERT_TRUE(wa.ok() && wb.ok());
      ASSERT_TRUE((*wb)->Wait().ok());
      ASSERT_TRUE((*wa)->Wait().ok());
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(a[i], SumAt(n, i)) << "i=" << i;
        ASSERT_FLOAT_EQ(b[i], SumAt(n, i) / n) << "i=" << i;
      }
      // Reduce-scatter: this rank's chunk holds the sum.
      std::vector<float> rs = Input(r, count);
      auto w = c.ReduceScatter(std::as_writable_bytes(std::span(rs)), count, DataType::kF32,
                               ReduceOp::kSum);
      ASSERT_DONE(w);
      const ChunkRange mine = ChunkOf(count, n, r);
      for (size_t i = mine.offset; i < mine.offset + mine.count; ++i) ASSERT_EQ(rs[i], SumAt(n, i));
      // Allgather: chunk q comes from rank q.
      std::vector<int64_t> ag(count, -1);
      const ChunkRange own = ChunkOf(count, n, r);
      for (size_t i = own.offset; i < own.offset + own.count; ++i) ag[i] = r * 1000000 + i;
      w = c.Allgather(std::as_writable_bytes(std::span(ag)), count, DataType::kI64);
      ASSERT_DONE(w);
      for (int q = 0; q < n; ++q) {
        const ChunkRange ch = ChunkOf(count, n, q);
        for (size_t i = ch.offset; i < ch.offset + ch.count; ++i) ASSERT_EQ(ag[i], q * 1000000 + i);
      }
      // Broadcast and reduce from the last rank.
      const int root = n - 1;
      std::vector<double> bc(count, r == root ? 2.5 : 0.0);
      w = c.Broadcast(std::as_writable_bytes(std::span(bc)), root);
      ASSERT_DONE(w);
      for (double x : bc) ASSERT_EQ(x, 2.5);
      std::vector<int32_t> red(count, r + 1);
      w = c.Reduce(std::as_writable_bytes(std::span(red)), count, DataType::kI32, ReduceOp::kMax,
                   root);
      ASSERT_DONE(w);
      for (int32_t x : red) ASSERT_EQ(x, r == root ? n : r + 1);
      // Send/recv around the ring, and a barrier.
      if (n > 1) {
        std::vector<float> out(count, static_cast<float>(r));
        std::vector<float> in(count, -1);
        auto rw = c.Recv((r + n - 1) % n, std::as_writable_bytes(std::span(in)), 7);
        auto sw = c.Send((r + 1) % n, std::as_bytes(std::span(out)), 7);
        ASSERT_TRUE(rw.ok() && sw.ok());
        ASSERT_TRUE((*sw)->Wait().ok());
        ASSERT_TRUE((*rw)->Wait().ok());
        for (float x : in) ASSERT_EQ(x, static_cast<float>((r + n - 1) % n));
      }
      w = c.Barrier();
      ASSERT_DONE(w);
      EXPECT_TRUE(c.status().ok());
      EXPECT_GE(c.metrics().ops, 7u);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(
    Comm, CommunicatorLayoutTest,
    ::testing::Values(
        LayoutCase{"one_rank", {.size = 1}}, LayoutCase{"shm_direct_3", {.size = 3}},
        LayoutCase{"shm_ring_4", {.size = 4, .algorithm = Algorithm::kRing}},
        LayoutCase{"shm_rd_5", {.size = 5, .algorithm = Algorithm::kRecursiveDoubling}},
        LayoutCase{"tcp_3", {.size = 3, .transport = TransportKind::kTcp}},
        LayoutCase{"two_hosts_2x2", {.size = 4, .hosts = {"h0", "h0", "h1", "h1"}}},
        LayoutCase{"three_hosts_uneven", {.size = 5, .hosts = {"h0", "h1", "h1", "h2", "h2"}}},
        LayoutCase{"two_hosts_tcp_hier",
                   {.size = 4,
                    .transport = TransportKind::kTcp,
                    .hosts = {"h0", "h1", "h0", "h1"},
                    .algorithm = Algorithm::kHierarchical}}),
    [](const ::testing::TestParamInfo<LayoutCase>& info) { return info.param.name; });

TEST(CommunicatorTest, AutoChoosesByLayoutAndSize) {
  RunRanks({.size = 2}, [](Communicator& c) {
    EXPECT_EQ(c.ChooseAllreduce(4096), Algorithm::kDirect);
    EXPECT_EQ(c.ChooseAllreduce(64 << 20), Algorithm::kDirect);
  });
  RunRanks({.size = 2, .transport = TransportKind::kTcp}, [](Communicator& c) {
    EXPECT_EQ(c.ChooseAllreduce(4096), Algorithm::kRecursiveDoubling);
    EXPECT_EQ(c.ChooseAllreduce(64 << 20), Algorithm::kRing);
  });
  RunRanks({.size = 4, .hosts = {"a", "a", "b", "b"}}, [](Communicator& c) {
    EXPECT_EQ(c.ChooseAllreduce(64 << 20), Algorithm::kHierarchical);
    EXPECT_EQ(c.hosts(), (std::vector<int>{0, 0, 1, 1}));
  });
  RunRanks({.size = 2, .algorithm = Algorithm::kRing},
           [](Communicator& c) { EXPECT_EQ(c.ChooseAllreduce(4096), Algorithm::kRing); });
}

std::shared_ptr<const hal::Topology> TwoHosts(double network_gbs) {
  Result<hal::TopologySpec> spec = hal::LoadInventoryString(fmt::format(R"(name: two-hosts
models:
  cpu: {{kind: simulated, memory_gb: 1, peak_tflops_fp32: 1, peak_tflops_bf16: 0,
        memory_bandwidth_gbs: 10}}
hosts:
  - {{name: "h[0-1]", model: cpu, count: 2, intra_host: {{kind: shm, bandwidth_gbs: 10,
     latency_us: 1}}, network: {{bandwidth_gbs: {}, latency_us: 50}}}}
)",
                                                                        network_gbs),
                                                            "two-hosts.yaml");
  if (!spec.ok()) return nullptr;
  Result<hal::Topology> built = hal::Topology::Build(*std::move(spec));
  if (!built.ok()) return nullptr;
  return std::make_shared<const hal::Topology>(*std::move(built));
}

// With a topology and no devices, each rank takes a device of its host's in the topology
// (the ranks of a host in rank order), and kAuto follows the topology's cost model for them.
TEST(CommunicatorTest, ATopologyWithoutDevicesPlacesTheRanksByHostName) {
  for (double network_gbs : {0.125, 100.0}) {
    std::shared_ptr<const hal::Topology> topology = TwoHosts(network_gbs);
    ASSERT_NE(topology, nullptr);
    ASSERT_EQ(topology->num_devices(), 4);
    // Ranks 0 and 2 on h1 (devices 2 and 3), ranks 1 and 3 on h0 (devices 0 and 1).
    const std::vector<int> devices = {2, 0, 3, 1};
    RunRanks({.size = 4, .hosts = {"h1", "h0", "h1", "h0"}, .topology = topology},
             [&](Communicator& c) {
               for (int64_t bytes : {int64_t{4096}, int64_t{1} << 20, int64_t{64} << 20}) {
                 const hal::CollectiveAlgo want =
                     topology->Collective(hal::CollectiveOp::kAllreduce, devices, bytes).algo;
                 const Algorithm got = c.ChooseAllreduce(bytes);
                 switch (want) {
                   case hal::CollectiveAlgo::kTree:
                     EXPECT_EQ(got, Algorithm::kRecursiveDoubling) << bytes;
                     break;
                   case hal::CollectiveAlgo::kHierarchical:
                     EXPECT_EQ(got, Algorithm::kHierarchical) << bytes;
                     break;
                   default:
                     EXPECT_EQ(got, Algorithm::kRing) << bytes;
                 }
               }
             });
  }
  // A host the topology does not have, and more ranks on a host than its devices, are named.
  std::shared_ptr<const hal::Topology> topology = TwoHosts(1);
  ASSERT_NE(topology, nullptr);
  for (const auto& [names, named] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"h0", "h0", "h9"}, "host h9"}, {{"h0", "h0", "h0"}, "fewer devices"}}) {
    const std::vector<std::string>& hosts = names;
    HashStore store;
    const std::string group = UniqueGroup("topology-hosts");
    std::vector<Status> status(3);
    {
      std::vector<std::jthread> threads;
      for (int r = 0; r < 3; ++r) {
        threads.emplace_back([&, r] {
          status[r] = Communicator::Create({.store = &store,
                                            .group = group,
                                            .rank = r,
                                            .size = 3,
                                            .host = hosts[r],
                                            .connect_timeout = 10s,
                                            .topology = topology})
                          .status();
        });
      }
    }
    for (const Status& st : status) {
      EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st;
      EXPECT_NE(st.message().find(named), std::string::npos) << st;
    }
  }
}

// OpOptions::wire: the gradients' bf16 wire through the communicator, on the ring (an
// average) and on the hierarchical all-reduce's ring across hosts (a sum): every rank ends
// with the same bf16 values (random floats are not bf16 values: only what came over the wire
// is), near the f32 result.
TEST(CommunicatorTest, TheBf16WireReachesTheRingAndTheHierarchicalRingAcrossHosts) {
  for (const GroupSpec& spec :
       {GroupSpec{.size = 3, .transport = TransportKind::kTcp, .algorithm = Algorithm::kRing},
        GroupSpec{
            .size = 4, .hosts = {"a", "a", "b", "b"}, .algorithm = Algorithm::kHierarchical}}) {
    constexpr size_t kCount = 40000;  // past small_message_bytes: a ring, not recursive doubling
    const ReduceOp op = spec.algorithm == Algorithm::kRing ? ReduceOp::kAvg : ReduceOp::kSum;
    std::vector<std::vector<float>> out(static_cast<size_t>(spec.size));
    auto input = [](int rank, size_t i) { return std::sin(static_cast<float>(rank * 7919 + i)); };
    RunRanks(spec, [&](Communicator& c) {
      std::vector<float> data(kCount);
      for (size_t i = 0; i < kCount; ++i) data[i] = input(c.rank(), i);
      auto w = c.Allreduce(std::span(data), op, {.wire = WireFormat::kBf16});
      ASSERT_DONE(w);
      out[static_cast<size_t>(c.rank())] = std::move(data);
    });
    for (size_t i = 0; i < kCount; ++i) {
      float want = 0;
      for (int r = 0; r < spec.size; ++r) want += input(r, i);
      if (op == ReduceOp::kAvg) want /= static_cast<float>(spec.size);
      ASSERT_NEAR(out[0][i], want, 0.05) << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(out[0][i]) & 0xffffu, 0u) << i;
      for (int r = 1; r < spec.size; ++r) ASSERT_EQ(out[r][i], out[0][i]) << r << " " << i;
    }
  }
  // Not for integers, nor for a max.
  RunRanks({.size = 2, .transport = TransportKind::kTcp}, [](Communicator& c) {
    std::vector<int32_t> ints(4);
    EXPECT_EQ(
        c.Allreduce(std::span(ints), ReduceOp::kSum, {.wire = WireFormat::kBf16}).status().code(),
        ErrorCode::kInvalidArgument);
    std::vector<float> floats(4);
    EXPECT_EQ(
        c.Allreduce(std::span(floats), ReduceOp::kMax, {.wire = WireFormat::kBf16}).status().code(),
        ErrorCode::kInvalidArgument);
  });
}

TEST(CommunicatorTest, ForcedAlgorithmThatCannotRunIsInvalidArgument) {
  RunRanks({.size = 2, .transport = TransportKind::kTcp}, [](Communicator& c) {
    std::vector<float> x(8, 1);
    auto w = c.Allreduce(std::span(x), ReduceOp::kSum, {.algorithm = Algorithm::kDirect});
    EXPECT_EQ(w.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(w.status().message().find("direct"), std::string::npos);
    w = c.Allgather(std::as_writable_bytes(std::span(x)), 8, DataType::kF32,
                    {.algorithm = Algorithm::kHierarchical});
    EXPECT_EQ(w.status().code(), ErrorCode::kInvalidArgument);
    // Nothing was sent: the communicator still works.
    w = c.Allreduce(std::span(x), ReduceOp::kSum);
    ASSERT_DONE(w);
    EXPECT_EQ(x[0], 2);
  });
}

TEST(CommunicatorTest, BadArgumentsNameTheArgumentAndChangeNothing) {
  RunRanks({.size = 2}, [](Communicator& c) {
    std::vector<int32_t> x(4, 1);
    auto w = c.Allreduce(std::span(x), ReduceOp::kAvg);  // avg of an integer type
    EXPECT_EQ(w.status().code(), ErrorCode::kInvalidArgument);
    w = c.Broadcast(std::as_writable_bytes(std::span(x)), 2);
    EXPECT_EQ(w.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(w.status().message().find("root 2"), std::string::npos);
    w = c.Send(c.rank(), std::as_bytes(std::span(x)));
    EXPECT_EQ(w.status().code(), ErrorCode::kInvalidArgument);
    w = c.Allreduce(std::as_writable_bytes(std::span(x)), 5, DataType::kI32, ReduceOp::kSum);
    EXPECT_EQ(w.status().code(), ErrorCode::kInvalidArgument);  // 5 elements in 4
    EXPECT_TRUE(c.status().ok());
  });
  HashStore store;
  EXPECT_EQ(
      Communicator::Create({.store = &store, .group = "g", .rank = 2, .size = 2}).status().code(),
      ErrorCode::kInvalidArgument);
  EXPECT_EQ(Communicator::Create({.store = nullptr, .group = "g"}).status().code(),
            ErrorCode::kInvalidArgument);
  // A topology needs one device of it per rank.
  Result<hal::TopologySpec> spec = hal::LoadInventoryString(R"(name: one-host
models:
  cpu: {kind: simulated, memory_gb: 1, peak_tflops_fp32: 1, peak_tflops_bf16: 0,
        memory_bandwidth_gbs: 10}
hosts:
  - {name: h0, model: cpu, count: 2, intra_host: {kind: shm, bandwidth_gbs: 10, latency_us: 1}}
)",
                                                            "one-host.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  Result<hal::Topology> built = hal::Topology::Build(*std::move(spec));
  ASSERT_TRUE(built.ok()) << built.status();
  auto topology = std::make_shared<const hal::Topology>(*std::move(built));
  for (const std::vector<int>& devices : {std::vector<int>{0}, std::vector<int>{0, 2}}) {
    Result<std::unique_ptr<Communicator>> c = Communicator::Create(
        {.store = &store, .group = "g", .size = 2, .topology = topology, .devices = devices});
    EXPECT_EQ(c.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("options.devices"), std::string::npos) << c.status();
  }
}

TEST(CommunicatorTest, ShmTransportAcrossHostsIsInvalidArgument) {
  HashStore store;
  const std::string group = UniqueGroup("shm-hosts");
  std::vector<std::jthread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto c = Communicator::Create({.store = &store,
                                     .group = group,
                                     .rank = r,
                                     .size = 2,
                                     .host = r == 0 ? "a" : "b",
                                     .transport = TransportKind::kShm});
      EXPECT_EQ(c.status().code(), ErrorCode::kInvalidArgument);
    });
  }
}

// TP x DP on 4 ranks: TP groups {0,1} {2,3}, DP groups {0,2} {1,3}, used concurrently.
TEST(CommunicatorTest, SplitMakesTensorAndDataParallelGroups) {
  for (TransportKind kind : {TransportKind::kAuto, TransportKind::kTcp}) {
    RunRanks({.size = 4, .transport = kind}, [](Communicator& c) {
      const int r = c.rank();
      auto tp = c.Split(r / 2, r);
      auto dp = c.Split(r % 2, r);
      ASSERT_TRUE(tp.ok()) << tp.status();
      ASSERT_TRUE(dp.ok()) << dp.status();
      ASSERT_EQ((*tp)->size(), 2);
      EXPECT_EQ((*tp)->rank(), r % 2);
      EXPECT_EQ((*dp)->rank(), r / 2);
      std::vector<int64_t> t(100, r);
      std::vector<int64_t> d(100, r);
      auto wt = (*tp)->Allreduce(std::span(t), ReduceOp::kSum);
      auto wd = (*dp)->Allreduce(std::span(d), ReduceOp::kSum);
      ASSERT_TRUE(wt.ok() && wd.ok());
      ASSERT_TRUE((*wt)->Wait().ok());
      ASSERT_TRUE((*wd)->Wait().ok());
      EXPECT_EQ(t[99], r < 2 ? 0 + 1 : 2 + 3);
      EXPECT_EQ(d[99], r % 2 == 0 ? 0 + 2 : 1 + 3);
      // The parent still works alongside.
      std::vector<int64_t> all(10, 1);
      auto wa = c.Allreduce(std::span(all), ReduceOp::kSum);
      ASSERT_DONE(wa);
      EXPECT_EQ(all[0], 4);
    });
  }
}

TEST(CommunicatorTest, SubGroupOrdersMembersAsGivenAndLeavesOthersOut) {
  RunRanks({.size = 3}, [](Communicator& c) {
    const std::vector<int> members = {2, 0};
    auto sub = c.SubGroup(members);
    ASSERT_TRUE(sub.ok()) << sub.status();
    if (c.rank() == 1) {
      EXPECT_EQ(*sub, nullptr);
      return;
    }
    ASSERT_NE(*sub, nullptr);
    EXPECT_EQ((*sub)->rank(), c.rank() == 2 ? 0 : 1);
    std::vector<float> x(5, c.rank() == 2 ? 9.0f : 0.0f);
    auto w = (*sub)->Broadcast(std::as_writable_bytes(std::span(x)), 0);
    ASSERT_DONE(w);
    EXPECT_EQ(x[4], 9.0f);
  });
}

TEST(CommunicatorTest, RegisteredBuffersGiveTheSameResults) {
  RunRanks({.size = 3}, [](Communicator& c) {
    const size_t count = 50000;  // larger than staging: sliced
    auto buf = c.Allocate(count * sizeof(float));
    ASSERT_TRUE(buf.ok()) << buf.status();
    std::span<float> x = (*buf)->as<float>();
    ASSERT_EQ(x.size(), count);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data()) % 64, 0u);
    std::vector<float> in = Input(c.rank(), count);
    std::copy(in.begin(), in.end(), x.begin());
    auto w = c.Allreduce(x, ReduceOp::kSum);
    ASSERT_DONE(w);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(x[i], SumAt(3, i));
  });
}

// Hang localisation's raw material: each rank's newest operation per communicator of its tree.
// Rank 1 sees rank 0 inside an all-reduce it has not entered itself; once both are through,
// both say so, and a group split off appears beside the root.
TEST(CommunicatorTest, ProgressSaysWhichOperationEachRankIsIn) {
  std::atomic<Communicator*> first{nullptr};
  RunRanks({.size = 2}, [&](Communicator& c) {
    std::vector<float> x(1000, 1);
    if (c.rank() == 1) {
      while (first.load() == nullptr || first.load()->progress().at(0).done) {
        std::this_thread::yield();  // until rank 0 is inside its all-reduce
      }
      const OpProgress theirs = first.load()->progress().at(0);
      EXPECT_EQ(theirs.op, "allreduce");
      EXPECT_EQ(theirs.seq, 0u);
      EXPECT_EQ(theirs.bytes, 4000);
      EXPECT_EQ(theirs.group, c.group());
      EXPECT_EQ(c.progress().at(0).op, "");  // it has started nothing
    } else {
      first = &c;
    }
    auto w = c.Allreduce(std::span(x), ReduceOp::kSum);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Wait().ok());
    const OpProgress mine = c.progress().at(0);
    EXPECT_EQ(mine.op, "allreduce");
    EXPECT_TRUE(mine.done);
    Result<std::unique_ptr<Communicator>> child = c.Split(0, c.rank());
    ASSERT_TRUE(child.ok()) << child.status();
    std::vector<OpProgress> all = c.progress();
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(all[0].op, "split");
    EXPECT_EQ(all[0].seq, 1u);
    EXPECT_EQ(all[1].group, (*child)->group());
    EXPECT_EQ(all[1].op, "");
  });
}

// Each communicator keeps its newest kOpHistory operations, oldest first, each with when it
// started and ended; the ones before them are gone.
TEST(CommunicatorTest, ProgressKeepsTheNewestOperationsWithTheirTimes) {
  RunRanks({.size = 2}, [&](Communicator& c) {
    std::vector<float> x(256, 1);
    const TimePoint before = Clock::Real()->Now();
    const int ops = kOpHistory + 4;
    for (int i = 0; i < ops; ++i) {
      auto w = i % 2 == 0 ? c.Allreduce(std::span(x), ReduceOp::kSum) : c.Barrier();
      ASSERT_TRUE(w.ok());
      ASSERT_TRUE((*w)->Wait().ok());
    }
    const std::vector<OpRecord> recent = c.progress().at(0).recent;
    ASSERT_EQ(recent.size(), static_cast<size_t>(kOpHistory));
    for (size_t i = 0; i < recent.size(); ++i) {
      const uint64_t seq = static_cast<uint64_t>(ops - kOpHistory) + i;
      EXPECT_EQ(recent[i].seq, seq);
      EXPECT_EQ(recent[i].op, seq % 2 == 0 ? "allreduce" : "barrier");
      EXPECT_EQ(recent[i].bytes, seq % 2 == 0 ? 1024 : 0);
      ASSERT_TRUE(recent[i].end.has_value());
      EXPECT_LE(recent[i].start, *recent[i].end);
      // The coarse clock lags the steady one by at most a tick (a few milliseconds).
      EXPECT_GE(recent[i].start, before - std::chrono::milliseconds(50));
      if (i > 0) EXPECT_LE(*recent[i - 1].end, recent[i].start);
    }
  });
}

// Over TCP a communicator's metrics carry its links': the lanes' send queues (gradient traffic
// by default) and the connections' TCP_INFO; read while operations run, from another thread.
// Over shared memory there are none.
TEST(CommunicatorTest, MetricsCarryTheLinksLanesAndConnections) {
  RunRanks({.size = 2, .transport = TransportKind::kTcp}, [&](Communicator& c) {
    std::vector<float> x(1 << 18, 1);
    std::atomic<bool> done{false};
    std::thread reader([&] {
      while (!done.load()) (void)c.metrics();
    });
    for (int i = 0; i < 4; ++i) {
      auto w = c.Allreduce(std::span(x), ReduceOp::kSum);
      ASSERT_TRUE(w.ok());
      ASSERT_TRUE((*w)->Wait().ok());
    }
    done = true;
    reader.join();
    const LinkStats links = c.metrics().links;
    ASSERT_TRUE(links.lanes.has_value());
    EXPECT_GT(links.lanes->lane(Lane::kGradient).sent_chunks, 0u);
    EXPECT_EQ(links.lanes->lane(Lane::kTelemetry).sent_chunks, 0u);
    EXPECT_GE(links.connections, 1);
    EXPECT_GT(links.max_rtt_s, 0);
  });
  RunRanks({.size = 2, .transport = TransportKind::kShm}, [&](Communicator& c) {
    EXPECT_FALSE(c.metrics().links.lanes.has_value());
    EXPECT_EQ(c.metrics().links.connections, 0);
  });
}

TEST(CommunicatorTest, AbortFailsThePeersPendingWorkAndStaysFailed) {
  for (TransportKind kind : {TransportKind::kAuto, TransportKind::kTcp}) {
    RunRanks({.size = 3, .transport = kind}, [](Communicator& c) {
      std::vector<float> x(1000, 1);
      if (c.rank() == 2) {
        c.Abort(UnavailableError("test: rank 2 gives up"));
        EXPECT_FALSE(c.status().ok());
        return;
      }
      auto w = c.Allreduce(std::span(x), ReduceOp::kSum);
      ASSERT_TRUE(w.ok());
      const Status s = (*w)->Wait();
      EXPECT_FALSE(s.ok());
      EXPECT_NE(s.code(), ErrorCode::kDeadlineExceeded) << s;  // failed at once, not by timeout
      // Sticky: the next operation fails with the communicator's status.
      auto again = c.Allreduce(std::span(x), ReduceOp::kSum);
      ASSERT_TRUE(again.ok());
      EXPECT_FALSE((*again)->Wait().ok());
      EXPECT_FALSE(c.status().ok());
    });
  }
}

TEST(CommunicatorTest, AbsentPeerFailsWithDeadlineExceeded) {
  Notification done;
  RunRanks({.size = 2, .timeout = 300ms}, [&](Communicator& c) {
    if (c.rank() == 1) {  // alive, but never joins the all-reduce
      done.WaitForNotification();
      return;
    }
    std::vector<float> x(10, 1);
    auto w = c.Allreduce(std::span(x), ReduceOp::kSum);
    ASSERT_TRUE(w.ok());
    const Status s = (*w)->Wait();
    done.Notify();
    EXPECT_EQ(s.code(), ErrorCode::kDeadlineExceeded) << s;
    EXPECT_EQ(c.status().code(), ErrorCode::kDeadlineExceeded);
  });
}

TEST(CommunicatorTest, WaitWithAnEarlierDeadlineLeavesTheOperationRunning) {
  RunRanks({.size = 2}, [](Communicator& c) {
    std::vector<float> x(10, 1);
    if (c.rank() == 0) {
      auto w = c.Allreduce(std::span(x), ReduceOp::kSum);
      ASSERT_TRUE(w.ok());
      // Rank 1 has not joined yet for sure: it waits for our barrier below first.
      EXPECT_EQ((*w)->Wait(Clock::Real()->Now()).code(), ErrorCode::kDeadlineExceeded);
      EXPECT_FALSE((*w)->Test().has_value());
      std::vector<float> token(1, 0);
      auto s = c.Send(1, std::as_bytes(std::span(token)), 1);
      ASSERT_DONE(s);
      ASSERT_TRUE((*w)->Wait().ok());
    } else {
      std::vector<float> token(1, 0);
      auto r = c.Recv(0, std::as_writable_bytes(std::span(token)), 1);
      ASSERT_DONE(r);
      auto w = c.Allreduce(std::span(x), ReduceOp::kSum);
      ASSERT_DONE(w);
    }
    EXPECT_EQ(x[0], 2);
  });
}

TEST(CommunicatorTest, PointToPointWorkMayOutliveItsCommunicator) {
  HashStore store;
  const std::string group = UniqueGroup("outlive");
  std::vector<std::jthread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto c = Communicator::Create({.store = &store, .group = group, .rank = r, .size = 2});
      ASSERT_TRUE(c.ok()) << c.status();
      if (r == 1) return;  // never sends
      std::vector<float> in(4);
      auto w = (*c)->Recv(1, std::as_writable_bytes(std::span(in)), 9);
      ASSERT_TRUE(w.ok());
      c->reset();                       // the communicator goes first
      EXPECT_FALSE((*w)->Wait().ok());  // fails cleanly; nothing is touched after free
    });
  }
}

TEST(CommunicatorTest, RateLimiterQueuesOperationsAndCountsTheWait) {
  FakeClock clock;
  Result<std::unique_ptr<RateLimiter>> limiter = RateLimiter::Create(
      {.ops_per_second = 1, .bytes_per_second = 1e9, .burst_ops = 1, .burst_bytes = 1e9}, &clock);
  ASSERT_TRUE(limiter.ok());
  HashStore store;
  auto c = Communicator::Create({.store = &store,
                                 .group = UniqueGroup("rate"),
                                 .clock = &clock,
                                 .rate_limiter = limiter->get()});
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> x(4, 1);
  auto first = (*c)->Allreduce(std::span(x), ReduceOp::kSum);
  ASSERT_DONE(first);  // the burst admits one at once
  auto second = (*c)->Allreduce(std::span(x), ReduceOp::kSum);
  ASSERT_TRUE(second.ok());
  clock.BlockUntilWaiters(1);  // the second waits in the limiter, not dropped
  EXPECT_FALSE((*second)->Test().has_value());
  EXPECT_EQ((*limiter)->metrics().current_waiters, 1);
  clock.Advance(1s);
  ASSERT_TRUE((*second)->Wait().ok());
  const CommunicatorMetrics m = (*c)->metrics();
  EXPECT_EQ(m.ops, 2u);
  EXPECT_EQ(m.rate_limited, 1u);
  EXPECT_EQ(m.rate_limit_wait, 1s);
}

TEST(GradientBucketsTest, BucketsStartAsTheyCompleteAndResultsLandInTheTensors) {
  RunRanks({.size = 2}, [](Communicator& c) {
    // Six tensors of 100 floats, buckets of 1 KiB: three buckets of two tensors.
    std::vector<std::vector<float>> grads(6, std::vector<float>(100));
    std::vector<std::span<std::byte>> spans;
    for (auto& g : grads) spans.push_back(std::as_writable_bytes(std::span(g)));
    auto b = GradientBuckets::Create(&c, spans, {.bucket_bytes = 1024, .op = ReduceOp::kSum});
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ((*b)->num_buckets(), 3);
    EXPECT_EQ((*b)->bucket_of(1), 0);
    EXPECT_EQ((*b)->bucket_of(2), 1);
    for (int step = 0; step < 2; ++step) {
      const uint64_t ops_before = c.metrics().ops;
      for (int i = 0; i < 6; ++i) {
        std::fill(grads[i].begin(), grads[i].end(), static_cast<float>(c.rank() + i + step));
      }
      // Mark the second bucket first: nothing may start before bucket 0 is complete.
      ASSERT_TRUE((*b)->MarkReady(2).ok());
      ASSERT_TRUE((*b)->MarkReady(3).ok());
      ASSERT_TRUE((*b)->MarkReady(0).ok());
      EXPECT_EQ((*b)->MarkReady(0).code(), ErrorCode::kFailedPrecondition);
      EXPECT_EQ((*b)->Finish().code(), ErrorCode::kFailedPrecondition);  // 1, 4, 5 missing
      ASSERT_TRUE((*b)->MarkReady(1).ok());
      ASSERT_TRUE((*b)->MarkReady(4).ok());
      ASSERT_TRUE((*b)->MarkReady(5).ok());
      ASSERT_TRUE((*b)->Finish().ok());
      EXPECT_EQ(c.metrics().ops - ops_before, 3u);  // one all-reduce per bucket
      for (int i = 0; i < 6; ++i) {
        for (float g : grads[i]) ASSERT_EQ(g, static_cast<float>(0 + 1 + 2 * (i + step)));
      }
    }
    EXPECT_EQ((*b)->MarkReady(6).code(), ErrorCode::kInvalidArgument);
  });
}

TEST(GradientBucketsTest, GradientsWrittenIntoTheirViewsAreNotCopied) {
  RunRanks({.size = 2}, [](Communicator& c) {
    std::vector<float> scratch(300, -7.0f);
    // Register three tensors, then adopt the bucket views in their place.
    std::vector<std::span<std::byte>> spans;
    for (int i = 0; i < 3; ++i) {
      spans.push_back(std::as_writable_bytes(std::span(scratch).subspan(i * 100, 100)));
    }
    auto b = GradientBuckets::Create(&c, spans, {.bucket_bytes = 1 << 20, .op = ReduceOp::kAvg});
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ((*b)->num_buckets(), 1);
    (*b)->AdoptViews();
    std::span<float> v0(reinterpret_cast<float*>((*b)->view(0).data()), 100);
    std::fill(v0.begin(), v0.end(), static_cast<float>(c.rank() * 2));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*b)->MarkReady(i).ok());
    ASSERT_TRUE((*b)->Finish().ok());
    EXPECT_EQ(v0[0], 1.0f);        // avg of 0 and 2, reduced in the bucket
    EXPECT_EQ(scratch[0], -7.0f);  // the registered memory is no longer touched
  });
}

TEST(GradientBucketsTest, CoalescedAllreduceOfManySmallTensors) {
  RunRanks({.size = 3}, [](Communicator& c) {
    std::vector<std::vector<double>> ts;
    for (int i = 0; i < 20; ++i) ts.emplace_back(i + 1, c.rank() + 1.0);
    std::vector<std::span<std::byte>> spans;
    for (auto& t : ts) spans.push_back(std::as_writable_bytes(std::span(t)));
    const uint64_t before = c.metrics().ops;
    ASSERT_TRUE(AllreduceCoalesced(
                    c, spans, {.bucket_bytes = 512, .dtype = DataType::kF64, .op = ReduceOp::kSum})
                    .ok());
    EXPECT_LT(c.metrics().ops - before, 20u);  // fused
    for (auto& t : ts) {
      for (double x : t) ASSERT_EQ(x, 6.0);
    }
  });
}

}  // namespace
}  // namespace kc::comm
