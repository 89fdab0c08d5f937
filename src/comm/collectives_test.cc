#include "comm/collectives.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "base/clock.h"
#include "base/notification.h"
#include "comm/hash_store.h"
#include "comm/shm/shm_transport.h"
#include "comm/subgroup_transport.h"
#include "comm/tcp/tcp_transport.h"

namespace kc::comm {
namespace {

using namespace std::chrono_literals;
using hal::Bf16;
using hal::DataType;

enum class Kind { kShm, kTcp };

std::string UniqueGroup() {
  static std::atomic<int> counter{0};
  return "coll-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

// Creates the n ranks of a new group concurrently, then runs body(transport) on n threads.
void RunGroup(Kind kind, int n, const std::function<void(Transport&)>& body) {
  HashStore store;
  const std::string group = UniqueGroup();
  std::vector<std::unique_ptr<Transport>> ts(n);
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        Result<std::unique_ptr<Transport>> t =
            kind == Kind::kShm
                ? CreateShmTransport({.store = &store,
                                      .group = group,
                                      .rank = r,
                                      .size = n,
                                      .ring_bytes = 64 << 10})
                : CreateTcpTransport({.store = &store, .group = group, .rank = r, .size = n});
        ASSERT_TRUE(t.ok()) << t.status();
        ts[r] = *std::move(t);
      });
    }
  }
  for (const auto& t : ts) ASSERT_NE(t, nullptr);
  std::vector<std::jthread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(*ts[r]); });
}

TimePoint Deadline(const Transport& t, Duration d = 20s) { return t.clock()->Now() + d; }

// Rank r's deterministic input: small integers, exact in every dtype and in any summation
// order for up to 4 ranks.
int Input(int rank, size_t i) { return static_cast<int>((rank * 7 + i * 3) % 11) - 5; }

template <typename T>
T From(double v) {
  if constexpr (std::is_same_v<T, Bf16>) {
    return hal::FloatToBf16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}
template <typename T>
double To(T v) {
  if constexpr (std::is_same_v<T, Bf16>) {
    return hal::Bf16ToFloat(v);
  } else {
    return static_cast<double>(v);
  }
}

double Reference(int n, size_t i, ReduceOp op) {
  double acc = Input(0, i);
  for (int r = 1; r < n; ++r) {
    const double v = Input(r, i);
    if (op == ReduceOp::kMin) {
      acc = std::min(acc, v);
    } else if (op == ReduceOp::kMax) {
      acc = std::max(acc, v);
    } else {
      acc += v;
    }
  }
  return op == ReduceOp::kAvg ? acc / n : acc;
}

template <typename T>
void CheckAllreduce(Transport& t, size_t count, ReduceOp op, uint64_t tag) {
  const int n = t.size();
  std::vector<T> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = From<T>(Input(t.rank(), i));
  Status s = Allreduce(t, {.data = std::as_writable_bytes(std::span(data)),
                           .count = count,
                           .dtype = hal::DataTypeOf<T>::value,
                           .op = op,
                           .deadline = Deadline(t),
                           .tag = tag});
  ASSERT_TRUE(s.ok()) << s;
  for (size_t i = 0; i < count; ++i) {
    const double want = Reference(n, i, op);
    if (op == ReduceOp::kAvg) {
      ASSERT_NEAR(To(data[i]), want, 1e-6) << "rank " << t.rank() << " i " << i;
    } else {
      ASSERT_EQ(To(data[i]), want) << ReduceOpName(op) << " rank " << t.rank() << " i " << i;
    }
  }
}

class CollectiveTest : public ::testing::TestWithParam<std::tuple<Kind, int, size_t>> {};

TEST_P(CollectiveTest, EveryCollectiveMatchesThePlainReference) {
  const auto [kind, n, count] = GetParam();
  RunGroup(kind, n, [&, n = n, count = count](Transport& t) {
    const int r = t.rank();
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      CheckAllreduce<float>(t, count, op, 1);
      CheckAllreduce<int32_t>(t, count, op, 2);
    }
    CheckAllreduce<int64_t>(t, count, ReduceOp::kSum, 3);
    CheckAllreduce<double>(t, count, ReduceOp::kMax, 4);
    CheckAllreduce<Bf16>(t, count, ReduceOp::kSum, 5);
    CheckAllreduce<float>(t, count, ReduceOp::kAvg, 6);
    CheckAllreduce<double>(t, count, ReduceOp::kAvg, 6);

    // ReduceScatter: this rank's chunk holds the sum.
    std::vector<int64_t> rs(count);
    for (size_t i = 0; i < count; ++i) rs[i] = Input(r, i);
    ASSERT_TRUE(ReduceScatter(t, {.data = std::as_writable_bytes(std::span(rs)),
                                  .count = count,
                                  .dtype = DataType::kI64,
                                  .op = ReduceOp::kSum,
                                  .deadline = Deadline(t),
                                  .tag = 7})
                    .ok());
    const ChunkRange mine = ChunkOf(count, n, r);
    for (size_t i = mine.offset; i < mine.offset + mine.count; ++i) {
      ASSERT_EQ(rs[i], Reference(n, i, ReduceOp::kSum)) << "rank " << r << " i " << i;
    }

    // Allgather: rank q's chunk is filled with q * 1000 + i.
    std::vector<int32_t> ag(count, -1);
    for (size_t i = mine.offset; i < mine.offset + mine.count; ++i) {
      ag[i] = r * 1000 + static_cast<int32_t>(i);
    }
    ASSERT_TRUE(Allgather(t, {.data = std::as_writable_bytes(std::span(ag)),
                              .count = count,
                              .dtype = DataType::kI32,
                              .deadline = Deadline(t),
                              .tag = 8})
                    .ok());
    for (int q = 0; q < n; ++q) {
      const ChunkRange c = ChunkOf(count, n, q);
      for (size_t i = c.offset; i < c.offset + c.count; ++i) {
        ASSERT_EQ(ag[i], q * 1000 + static_cast<int32_t>(i)) << "rank " << r << " i " << i;
      }
    }

    // Broadcast from the last rank.
    const int root = n - 1;
    std::vector<std::byte> bc(count, std::byte{0});
    if (r == root) {
      for (size_t i = 0; i < count; ++i) bc[i] = static_cast<std::byte>(i * 13 + 1);
    }
    ASSERT_TRUE(
        Broadcast(t, {.data = std::span(bc), .root = root, .deadline = Deadline(t), .tag = 9})
            .ok());
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(bc[i], static_cast<std::byte>(i * 13 + 1));

    ASSERT_TRUE(Barrier(t, {.deadline = Deadline(t), .tag = 10}).ok());
  });
}

std::string ParamName(const ::testing::TestParamInfo<CollectiveTest::ParamType>& info) {
  return std::string(std::get<0>(info.param) == Kind::kShm ? "Shm" : "Tcp") + "Size" +
         std::to_string(std::get<1>(info.param)) + "Count" +
         std::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Collective, CollectiveTest,
                         ::testing::Combine(::testing::Values(Kind::kShm, Kind::kTcp),
                                            ::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(size_t{0}, size_t{1}, size_t{7},
                                                              size_t{1000}, size_t{4097})),
                         ParamName);

// The ring moves each chunk in segments of about 1 MiB, reducing and forwarding one while
// the next is on the wire: chunks of several segments and a remainder, of unequal sizes
// (count % size != 0), over TCP, where the ring runs.
TEST(CollectiveSegmentTest, ChunksOfManySegmentsMatchThePlainReference) {
  constexpr size_t kCount = 3 * 870'001 + 2;  // chunks of ~3.3 MiB of floats, 1 apart
  for (int n : {2, 3}) {
    RunGroup(Kind::kTcp, n, [&](Transport& t) {
      CheckAllreduce<float>(t, kCount, ReduceOp::kSum, 1);
      CheckAllreduce<double>(t, kCount / 2, ReduceOp::kAvg, 2);
      CheckAllreduce<int32_t>(t, kCount, ReduceOp::kMax, 3);
    });
  }
}

// The bf16 wire: f32 sums and averages travel as bf16, added in f32. Values exact in bf16
// (small integers) sum exactly; others within the rounding of each hop, and every rank ends
// with the same bits (the owner of a chunk keeps the rounded value it sends). Over both
// transports, 1 to 4 ranks, empty chunks, and chunks of several segments.
TEST(CollectiveWireTest, TheBf16WireSumsWithinItsRoundingAndEveryRankEndsTheSame) {
  for (Kind kind : {Kind::kShm, Kind::kTcp}) {
    for (int n : {1, 2, 3, 4}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{1'300'001}}) {
        if (kind == Kind::kShm && count > 1000) continue;  // the segments are TCP's case
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          std::vector<std::vector<float>> out(static_cast<size_t>(n));
          std::vector<std::vector<float>> in(static_cast<size_t>(n));
          for (int r = 0; r < n; ++r) {
            std::mt19937 gen(static_cast<unsigned>(r * 131 + count));
            std::uniform_real_distribution<float> u(-1.0f, 1.0f);
            in[r].resize(count);
            for (float& x : in[r]) x = u(gen);
          }
          RunGroup(kind, n, [&](Transport& t) {
            std::vector<float> data = in[static_cast<size_t>(t.rank())];
            Status st = Allreduce(t, {.data = std::as_writable_bytes(std::span(data)),
                                      .count = count,
                                      .op = op,
                                      .deadline = Deadline(t),
                                      .tag = 5,
                                      .wire = WireFormat::kBf16});
            ASSERT_TRUE(st.ok()) << st;
            out[static_cast<size_t>(t.rank())] = std::move(data);
          });
          for (size_t i = 0; i < count; ++i) {
            double want = 0, magnitude = 0;
            for (int r = 0; r < n; ++r) {
              want += in[r][i];
              magnitude += std::abs(in[r][i]);
            }
            if (op == ReduceOp::kAvg) {
              want /= n;
              magnitude /= n;
            }
            // One rank: nothing travels. Else each hop's partial sum and the result rounded
            // once each: at most n roundings of 2^-9 relative.
            const double bound = n == 1 ? 0 : n * std::ldexp(magnitude, -8);
            ASSERT_NEAR(out[0][i], want, bound)
                << "n " << n << " count " << count << " i " << i << " " << ReduceOpName(op);
            for (int r = 1; r < n; ++r) {
              ASSERT_EQ(std::memcmp(&out[r][i], &out[0][i], sizeof(float)), 0)
                  << "rank " << r << " differs at " << i;
            }
            // What came over the wire is a bf16 value: the low 16 bits are zero.
            if (n > 1) ASSERT_EQ(std::bit_cast<uint32_t>(out[0][i]) & 0xffffu, 0u) << i;
          }
        }
      }
    }
  }
  // Small integers are exact in bf16: their sums too.
  RunGroup(Kind::kTcp, 3, [](Transport& t) {
    std::vector<float> data(100);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(Input(t.rank(), i));
    Status st = Allreduce(t, {.data = std::as_writable_bytes(std::span(data)),
                              .count = data.size(),
                              .deadline = Deadline(t),
                              .wire = WireFormat::kBf16});
    ASSERT_TRUE(st.ok()) << st;
    for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], Reference(3, i, ReduceOp::kSum));
  });
}

TEST(CollectiveWireTest, TheBf16WireIsForFloatSumsAndAveragesOnly) {
  RunGroup(Kind::kTcp, 2, [](Transport& t) {
    std::vector<int32_t> ints(4);
    Status s = Allreduce(t, {.data = std::as_writable_bytes(std::span(ints)),
                             .count = 4,
                             .dtype = DataType::kI32,
                             .deadline = Deadline(t),
                             .wire = WireFormat::kBf16});
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("the bf16 wire carries f32 sums and averages only"),
              std::string::npos)
        << s;
    std::vector<float> floats(4);
    s = Allreduce(t, {.data = std::as_writable_bytes(std::span(floats)),
                      .count = 4,
                      .op = ReduceOp::kMax,
                      .deadline = Deadline(t),
                      .wire = WireFormat::kBf16});
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    EXPECT_TRUE(t.status().ok());
  });
}

TEST(CollectiveArgsTest, BadArgumentsAreInvalidArgumentAndLeaveTheTransportUsable) {
  RunGroup(Kind::kShm, 2, [](Transport& t) {
    std::vector<int32_t> ints(4);
    Status s = Allreduce(t, {.data = std::as_writable_bytes(std::span(ints)),
                             .count = 4,
                             .dtype = DataType::kI32,
                             .op = ReduceOp::kAvg,
                             .deadline = Deadline(t)});
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    s = Allreduce(t, {.data = std::as_writable_bytes(std::span(ints)),
                      .count = 5,
                      .dtype = DataType::kI32,
                      .deadline = Deadline(t)});
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    s = Broadcast(t, {.data = std::as_writable_bytes(std::span(ints)), .root = 2});
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    EXPECT_TRUE(t.status().ok());
    EXPECT_TRUE(Barrier(t, {.deadline = Deadline(t)}).ok());
  });
}

TEST(CollectiveArgsTest, SizeOneAvgLeavesDataUnchanged) {
  RunGroup(Kind::kShm, 1, [](Transport& t) {
    std::vector<float> v = {1.5f, -2.0f, 3.0f};
    ASSERT_TRUE(Allreduce(t, {.data = std::as_writable_bytes(std::span(v)),
                              .count = 3,
                              .op = ReduceOp::kAvg,
                              .deadline = Deadline(t)})
                    .ok());
    EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  });
}

class CollectiveFailureTest : public ::testing::TestWithParam<Kind> {};

TEST_P(CollectiveFailureTest, RankAbortingMidAllreduceFailsThePeersBeforeTheirDeadline) {
  RunGroup(GetParam(), 3, [](Transport& t) {
    if (t.rank() == 2) {
      // Gives up before or while the others are inside the collective: either way they
      // must fail on the lost peer, not wait for their deadline.
      t.Abort(AbortedError("test: rank 2 gives up"));
      return;
    }
    std::vector<float> v(1000, 1.0f);
    Status s = Allreduce(t, {.data = std::as_writable_bytes(std::span(v)),
                             .count = v.size(),
                             .deadline = t.clock()->Now() + 60s});
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.code(), ErrorCode::kDeadlineExceeded)
        << "must fail on the abort, not time out: " << s;
    EXPECT_NE(s.message().find("allreduce step="), std::string::npos) << s;
    EXPECT_FALSE(t.status().ok());  // aborted after the failure
  });
}

TEST_P(CollectiveFailureTest, AbsentRankGivesDeadlineExceeded) {
  std::atomic<int> deadline_exceeded{0};
  std::atomic<int> finished{0};
  Notification others_done;
  RunGroup(GetParam(), 3, [&](Transport& t) {
    if (t.rank() == 2) {
      others_done.WaitForNotification();  // never joins, and stays alive until the others gave up
      return;
    }
    struct Done {
      std::atomic<int>* finished;
      Notification* others_done;
      ~Done() {
        if (++*finished == 2) others_done->Notify();
      }
    } done{&finished, &others_done};
    std::vector<float> v(10, 1.0f);
    Status s = Allreduce(t, {.data = std::as_writable_bytes(std::span(v)),
                             .count = v.size(),
                             .deadline = Deadline(t, 200ms)});
    EXPECT_FALSE(s.ok());
    if (s.code() == ErrorCode::kDeadlineExceeded) ++deadline_exceeded;
  });
  EXPECT_GE(deadline_exceeded.load(), 1);
}

// ---------------------------------------------------------------------------------------
// The algorithm matrix: every reduction algorithm x dtype x op x size, against a plain
// reference. Inputs are small integers, so sums, mins and maxes are exact in every dtype
// and in any combining order (|partial sums| <= 8 * 5 = 40, exact even in bf16), and
// products use inputs in {1, -1, 2} (|product| <= 2^8, exact everywhere). Avg is compared
// with a dtype-sized tolerance.

enum class Algo { kRing, kRecursiveDoubling, kHierarchical, kReduce, kReduceScatter };

std::string_view AlgoName(Algo a) {
  switch (a) {
    case Algo::kRing:
      return "ring";
    case Algo::kRecursiveDoubling:
      return "rd";
    case Algo::kHierarchical:
      return "hier";
    case Algo::kReduce:
      return "reduce";
    case Algo::kReduceScatter:
      return "reduce_scatter";
  }
  return "?";
}

int MatrixInput(ReduceOp op, int rank, size_t i) {
  static constexpr int kProdValues[] = {1, -1, 2, 1, -1};
  return op == ReduceOp::kProd ? kProdValues[(static_cast<size_t>(rank) * 3 + i) % 5]
                               : Input(rank, i);
}

double MatrixReference(int n, size_t i, ReduceOp op) {
  double acc = MatrixInput(op, 0, i);
  for (int r = 1; r < n; ++r) {
    const double v = MatrixInput(op, r, i);
    switch (op) {
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
      default:
        acc += v;
    }
  }
  return op == ReduceOp::kAvg ? acc / n : acc;
}

template <typename T>
double AvgTolerance() {
  if constexpr (std::is_same_v<T, Bf16>) return 1.0 / 64;  // |avg| <= 5, 8 mantissa bits
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  return 1e-12;
}

struct MatrixCall {
  Algo algo = Algo::kRing;
  size_t count = 0;
  ReduceOp op = ReduceOp::kSum;
  uint64_t tag = 0;
  std::span<const int> hosts;            // kHierarchical
  Algorithm leaders = Algorithm::kRing;  // kHierarchical
  int root = 0;                          // kReduce
};

// Runs one reduction on this rank and checks its output against MatrixReference.
template <typename T>
void CheckReduction(Transport& t, const MatrixCall& c) {
  const int n = t.size();
  const int r = t.rank();
  std::vector<T> data(c.count);
  for (size_t i = 0; i < c.count; ++i) data[i] = From<T>(MatrixInput(c.op, r, i));
  const std::vector<T> input = data;
  const std::span<std::byte> bytes = std::as_writable_bytes(std::span(data));
  const DataType dtype = hal::DataTypeOf<T>::value;
  const TimePoint deadline = Deadline(t);
  const AllreduceOptions ar{.data = bytes,
                            .count = c.count,
                            .dtype = dtype,
                            .op = c.op,
                            .deadline = deadline,
                            .tag = c.tag};
  Status s;
  size_t first = 0;  // the elements [first, last) must hold the reference
  size_t last = c.count;
  bool others_unchanged = false;
  switch (c.algo) {
    case Algo::kRing:
      s = Allreduce(t, ar);
      break;
    case Algo::kRecursiveDoubling:
      s = AllreduceRecursiveDoubling(t, ar);
      break;
    case Algo::kHierarchical:
      s = AllreduceHierarchical(t, c.hosts, ar, c.leaders);
      break;
    case Algo::kReduceScatter: {
      s = ReduceScatter(t, ar);
      const ChunkRange mine = ChunkOf(c.count, n, r);
      first = mine.offset;
      last = mine.offset + mine.count;
      break;
    }
    case Algo::kReduce:
      s = Reduce(t, {.data = bytes,
                     .count = c.count,
                     .dtype = dtype,
                     .op = c.op,
                     .root = c.root,
                     .deadline = deadline,
                     .tag = c.tag});
      if (r != c.root) {
        first = last = 0;
        others_unchanged = true;
      }
      break;
  }
  const std::string what = std::string(AlgoName(c.algo)) + " " +
                           std::string(hal::DataTypeName(dtype)) + " " +
                           std::string(ReduceOpName(c.op)) + " n=" + std::to_string(n) +
                           " rank=" + std::to_string(r) + " count=" + std::to_string(c.count);
  ASSERT_TRUE(s.ok()) << what << ": " << s;
  if (others_unchanged) {
    ASSERT_TRUE(data.empty() ||
                std::memcmp(data.data(), input.data(), data.size() * sizeof(T)) == 0)
        << what << ": a non-root's data changed";
    return;
  }
  for (size_t i = first; i < last; ++i) {
    const double want = MatrixReference(n, i, c.op);
    const double got = To(data[i]);
    const bool ok = c.op == ReduceOp::kAvg
                        ? std::abs(got - want) <= AvgTolerance<T>() * std::max(1.0, std::abs(want))
                        : got == want;
    ASSERT_TRUE(ok) << what << " i=" << i << ": got " << got << " want " << want;
  }
}

// Host layouts for n ranks: the named ones from the design note when they fit, blocks of
// two (the last host smaller when n is odd), and an interleaved layout (host = rank % 3),
// whose hosts are not contiguous rank ranges.
std::vector<std::vector<int>> HostLayouts(int n) {
  std::vector<std::vector<int>> layouts;
  for (const std::vector<int>& named : std::vector<std::vector<int>>{
           {0, 0, 1, 1}, {0, 0, 0, 1, 1}, {0, 1, 1, 1, 2, 2}, {0, 1, 2}}) {
    if (static_cast<int>(named.size()) == n) layouts.push_back(named);
  }
  std::vector<int> pairs(n);
  std::vector<int> interleaved(n);
  for (int r = 0; r < n; ++r) {
    pairs[r] = r / 2;
    interleaved[r] = 7 - r % 3;  // arbitrary host ids, not 0-based
  }
  layouts.push_back(pairs);
  layouts.push_back(interleaved);
  return layouts;
}

template <typename T>
std::vector<ReduceOp> OpsFor() {
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax};
  if constexpr (!std::is_integral_v<T>) ops.push_back(ReduceOp::kAvg);
  return ops;
}

// Every reduction algorithm for every op of T at `count`. Roots and host layouts rotate with
// the op, so every root/layout is covered across ops without multiplying the calls.
template <typename T>
void CheckEveryReduction(Transport& t, size_t count, uint64_t tag) {
  const int n = t.size();
  const std::vector<std::vector<int>> layouts = HostLayouts(n);
  const int roots[] = {0, n - 1, n / 2};
  int k = 0;
  for (ReduceOp op : OpsFor<T>()) {
    const std::vector<int>& hosts = layouts[static_cast<size_t>(k) % layouts.size()];
    for (Algo algo : {Algo::kRing, Algo::kRecursiveDoubling, Algo::kHierarchical, Algo::kReduce,
                      Algo::kReduceScatter}) {
      CheckReduction<T>(t,
                        {.algo = algo,
                         .count = count,
                         .op = op,
                         .tag = tag,
                         .hosts = hosts,
                         .leaders = k % 2 == 0 ? Algorithm::kRing : Algorithm::kRecursiveDoubling,
                         .root = roots[k % 3]});
      if (::testing::Test::HasFatalFailure()) return;
    }
    ++k;
  }
}

void CheckAllgatherBroadcastBarrier(Transport& t, size_t count) {
  const int n = t.size();
  const int r = t.rank();
  std::vector<int64_t> ag(count, -1);
  const ChunkRange mine = ChunkOf(count, n, r);
  for (size_t i = mine.offset; i < mine.offset + mine.count; ++i) {
    ag[i] = r * 1000003 + static_cast<int64_t>(i);
  }
  ASSERT_TRUE(Allgather(t, {.data = std::as_writable_bytes(std::span(ag)),
                            .count = count,
                            .dtype = DataType::kI64,
                            .deadline = Deadline(t),
                            .tag = 40})
                  .ok());
  for (int q = 0; q < n; ++q) {
    const ChunkRange c = ChunkOf(count, n, q);
    for (size_t i = c.offset; i < c.offset + c.count; ++i) {
      ASSERT_EQ(ag[i], q * 1000003 + static_cast<int64_t>(i)) << "rank " << r << " i " << i;
    }
  }
  for (int root : {0, n - 1}) {
    std::vector<float> bc(count, -1.0f);
    if (r == root) {
      for (size_t i = 0; i < count; ++i) bc[i] = static_cast<float>(i) * 0.5f + root;
    }
    ASSERT_TRUE(Broadcast(t, {.data = std::as_writable_bytes(std::span(bc)),
                              .root = root,
                              .deadline = Deadline(t),
                              .tag = 41})
                    .ok());
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(bc[i], static_cast<float>(i) * 0.5f + root) << "rank " << r << " i " << i;
    }
  }
  ASSERT_TRUE(Barrier(t, {.deadline = Deadline(t), .tag = 42}).ok());
}

// Coverage: every rank count 1..8 on both transports runs, at counts 0, 1 and 1001, every
// algorithm (ring, recursive doubling, hierarchical, reduce, reduce-scatter) x every op (avg
// for floats) on f32 and i32, and on f64, i64 and bf16 too for rank counts 1..5 (the full
// dtype matrix on 6..8 ranks doubled the run time), plus allgather, broadcast and barrier. The
// large count 65537 runs every algorithm on f32 sum, i64 max and bf16 avg only, to keep the binary
// fast.
class CollectiveAlgorithmTest : public ::testing::TestWithParam<std::tuple<Kind, int>> {};

TEST_P(CollectiveAlgorithmTest, EveryAlgorithmDtypeAndOpMatchesThePlainReference) {
  const auto [kind, n] = GetParam();
  RunGroup(kind, n, [&](Transport& t) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{1001}}) {
      CheckEveryReduction<float>(t, count, 11);
      CheckEveryReduction<int32_t>(t, count, 13);
      if (t.size() <= 5) {  // the other dtypes on rank counts 1..5 only, for time
        CheckEveryReduction<double>(t, count, 12);
        CheckEveryReduction<int64_t>(t, count, 14);
        CheckEveryReduction<Bf16>(t, count, 15);
      }
      CheckAllgatherBroadcastBarrier(t, count);
      if (HasFatalFailure()) return;
    }
    constexpr size_t kLarge = 65537;
    const std::vector<int> hosts = HostLayouts(t.size()).front();
    for (Algo algo : {Algo::kRing, Algo::kRecursiveDoubling, Algo::kHierarchical, Algo::kReduce,
                      Algo::kReduceScatter}) {
      const MatrixCall c{
          .algo = algo, .count = kLarge, .tag = 20, .hosts = hosts, .root = t.size() - 1};
      CheckReduction<float>(t, c);
      CheckReduction<int64_t>(t, {.algo = algo,
                                  .count = kLarge,
                                  .op = ReduceOp::kMax,
                                  .tag = 21,
                                  .hosts = hosts,
                                  .leaders = Algorithm::kRecursiveDoubling});
      CheckReduction<Bf16>(t, {.algo = algo,
                               .count = kLarge,
                               .op = ReduceOp::kAvg,
                               .tag = 22,
                               .hosts = hosts,
                               .root = t.size() / 2});
      if (HasFatalFailure()) return;
    }
    CheckAllgatherBroadcastBarrier(t, kLarge);
  });
}

// Every host layout x both leader algorithms, on one dtype per kind of op (f32 sum and avg,
// i32 prod), at an odd count.
TEST_P(CollectiveAlgorithmTest, HierarchicalMatchesTheFlatReferenceForEveryHostLayout) {
  const auto [kind, n] = GetParam();
  RunGroup(kind, n, [&](Transport& t) {
    std::vector<std::vector<int>> layouts = HostLayouts(t.size());
    layouts.push_back(std::vector<int>(static_cast<size_t>(t.size()), 3));  // one host
    std::vector<int> singles(static_cast<size_t>(t.size()));
    for (int r = 0; r < t.size(); ++r) singles[static_cast<size_t>(r)] = t.size() - r;
    layouts.push_back(singles);  // one rank per host
    for (const std::vector<int>& hosts : layouts) {
      for (Algorithm leaders :
           {Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kAuto}) {
        MatrixCall c{.algo = Algo::kHierarchical,
                     .count = 1001,
                     .tag = 30,
                     .hosts = hosts,
                     .leaders = leaders};
        CheckReduction<float>(t, c);
        c.op = ReduceOp::kAvg;
        CheckReduction<float>(t, c);
        c.op = ReduceOp::kProd;
        CheckReduction<int32_t>(t, c);
        if (HasFatalFailure()) return;
      }
    }
  });
}

// Recursive doubling combines in a fixed order, so on arbitrary floats every rank's result
// is byte-identical (not only close); hierarchical inherits it from its broadcast.
TEST_P(CollectiveAlgorithmTest, RecursiveDoublingAndHierarchicalAreBitIdenticalOnEveryRank) {
  const auto [kind, n] = GetParam();
  constexpr uint32_t kSeed = 20240611;
  constexpr size_t kCount = 777;
  std::vector<std::vector<std::vector<std::byte>>> outputs(
      4, std::vector<std::vector<std::byte>>(static_cast<size_t>(n)));
  RunGroup(kind, n, [&](Transport& t) {
    const int r = t.rank();
    std::mt19937 rng(kSeed + static_cast<uint32_t>(r));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> f32(kCount);
    std::vector<Bf16> bf16(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      f32[i] = dist(rng) * 1000.0f;
      bf16[i] = hal::FloatToBf16(dist(rng));
    }
    std::vector<float> f32_hier = f32;
    std::vector<float> f32_avg = f32;
    std::vector<int> hosts = HostLayouts(t.size()).back();
    const auto opts = [&](auto& v, DataType dtype, ReduceOp op, uint64_t tag) {
      return AllreduceOptions{.data = std::as_writable_bytes(std::span(v)),
                              .count = kCount,
                              .dtype = dtype,
                              .op = op,
                              .deadline = Deadline(t),
                              .tag = tag};
    };
    ASSERT_TRUE(AllreduceRecursiveDoubling(t, opts(f32, DataType::kF32, ReduceOp::kSum, 1)).ok());
    ASSERT_TRUE(AllreduceRecursiveDoubling(t, opts(bf16, DataType::kBf16, ReduceOp::kSum, 2)).ok());
    ASSERT_TRUE(
        AllreduceRecursiveDoubling(t, opts(f32_avg, DataType::kF32, ReduceOp::kAvg, 3)).ok());
    ASSERT_TRUE(
        AllreduceHierarchical(t, hosts, opts(f32_hier, DataType::kF32, ReduceOp::kSum, 4)).ok());
    const auto keep = [&](int which, const auto& v) {
      const auto b = std::as_bytes(std::span(v));
      outputs[static_cast<size_t>(which)][static_cast<size_t>(r)].assign(b.begin(), b.end());
    };
    keep(0, f32);
    keep(1, bf16);
    keep(2, f32_avg);
    keep(3, f32_hier);
  });
  for (size_t which = 0; which < outputs.size(); ++which) {
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(outputs[which][static_cast<size_t>(r)], outputs[which][0])
          << "output " << which << " of rank " << r << " differs from rank 0's (seed " << kSeed
          << ")";
    }
  }
}

// Two hierarchical allreduces with different tags run concurrently on every rank: their
// sub-group traffic must not cross.
TEST_P(CollectiveAlgorithmTest, ConcurrentHierarchicalCallsWithDifferentTagsDoNotCollide) {
  const auto [kind, n] = GetParam();
  RunGroup(kind, n, [&](Transport& t) {
    const std::vector<int> hosts = HostLayouts(t.size()).front();
    std::vector<std::jthread> calls;
    for (uint64_t tag : {uint64_t{5}, uint64_t{6}}) {
      calls.emplace_back([&t, &hosts, tag] {
        std::vector<int64_t> v(300, static_cast<int64_t>(tag) * (t.rank() + 1));
        Status s =
            AllreduceHierarchical(t, hosts,
                                  {.data = std::as_writable_bytes(std::span(v)),
                                   .count = v.size(),
                                   .dtype = DataType::kI64,
                                   .deadline = Deadline(t),
                                   .tag = tag},
                                  tag == 5 ? Algorithm::kRing : Algorithm::kRecursiveDoubling);
        ASSERT_TRUE(s.ok()) << s;
        const int64_t want = static_cast<int64_t>(tag) * t.size() * (t.size() + 1) / 2;
        for (int64_t x : v) ASSERT_EQ(x, want) << "tag " << tag;
      });
    }
  });
}

std::string AlgoParamName(
    const ::testing::TestParamInfo<CollectiveAlgorithmTest::ParamType>& info) {
  return std::string(std::get<0>(info.param) == Kind::kShm ? "Shm" : "Tcp") + "Size" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Collective, CollectiveAlgorithmTest,
                         ::testing::Combine(::testing::Values(Kind::kShm, Kind::kTcp),
                                            ::testing::Range(1, 9)),
                         AlgoParamName);

TEST(CollectiveArgsTest, AlgorithmNamesRoundTrip) {
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kRecursiveDoubling,
                      Algorithm::kHierarchical, Algorithm::kDirect}) {
    EXPECT_EQ(AlgorithmFromName(AlgorithmName(a)), a) << AlgorithmName(a);
  }
  EXPECT_EQ(AlgorithmName(Algorithm::kRecursiveDoubling), "recursive_doubling");
  EXPECT_EQ(AlgorithmFromName("rd"), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(AlgorithmFromName("hier"), Algorithm::kHierarchical);
  EXPECT_EQ(AlgorithmFromName("Ring"), std::nullopt);
  EXPECT_EQ(AlgorithmFromName(""), std::nullopt);
}

TEST(CollectiveArgsTest, BadReduceAndHierarchicalArgumentsAreInvalidArgumentBeforeSending) {
  RunGroup(Kind::kShm, 2, [](Transport& t) {
    std::vector<float> v(4, 1.0f);
    const std::span<std::byte> bytes = std::as_writable_bytes(std::span(v));
    Status s = Reduce(t, {.data = bytes, .count = 4, .root = 2, .deadline = Deadline(t)});
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    s = Reduce(t, {.data = bytes, .count = 5, .deadline = Deadline(t)});
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    s = AllreduceRecursiveDoubling(t, {.data = bytes,
                                       .count = 4,
                                       .dtype = DataType::kI32,
                                       .op = ReduceOp::kAvg,
                                       .deadline = Deadline(t)});
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    const int one_host[] = {0};
    const int two_hosts[] = {0, 1};
    const AllreduceOptions ok_opts{.data = bytes, .count = 4, .deadline = Deadline(t)};
    s = AllreduceHierarchical(t, one_host, ok_opts);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    s = AllreduceHierarchical(t, two_hosts, ok_opts, Algorithm::kHierarchical);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    s = AllreduceHierarchical(t, two_hosts, ok_opts, Algorithm::kDirect);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    AllreduceOptions big_tag = ok_opts;
    big_tag.tag = uint64_t{1} << 48;
    s = AllreduceHierarchical(t, two_hosts, big_tag);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    // On a sub-group view the phases would need nested salts.
    Result<std::unique_ptr<Transport>> view =
        CreateSubgroupTransport(std::shared_ptr<Transport>(&t, [](Transport*) {}), {0, 1}, 9);
    ASSERT_TRUE(view.ok()) << view.status();
    s = AllreduceHierarchical(**view, two_hosts, ok_opts);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s;
    EXPECT_TRUE(t.status().ok());
    EXPECT_TRUE(AllreduceHierarchical(t, two_hosts, ok_opts).ok());
    EXPECT_EQ(v, std::vector<float>(4, 2.0f));
  });
}

TEST_P(CollectiveFailureTest, RankAbortingMidRecursiveDoublingFailsThePeersBeforeTheirDeadline) {
  RunGroup(GetParam(), 3, [](Transport& t) {
    if (t.rank() == 2) {
      t.Abort(AbortedError("test: rank 2 gives up"));
      return;
    }
    std::vector<float> v(1000, 1.0f);
    Status s = AllreduceRecursiveDoubling(t, {.data = std::as_writable_bytes(std::span(v)),
                                              .count = v.size(),
                                              .deadline = t.clock()->Now() + 60s});
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.code(), ErrorCode::kDeadlineExceeded)
        << "must fail on the abort, not time out: " << s;
    EXPECT_NE(s.message().find("allreduce_rd step="), std::string::npos) << s;
    EXPECT_FALSE(t.status().ok());
  });
}

TEST_P(CollectiveFailureTest, RankAbortingMidHierarchicalFailsThePeersBeforeTheirDeadline) {
  // Rank 1 is a non-leader of host 0, rank 2 the leader of host 1.
  for (int quitter : {1, 2}) {
    RunGroup(GetParam(), 4, [quitter](Transport& t) {
      if (t.rank() == quitter) {
        t.Abort(AbortedError("test: a rank gives up"));
        return;
      }
      const int hosts[] = {0, 0, 1, 1};
      std::vector<float> v(1000, 1.0f);
      Status s = AllreduceHierarchical(t, hosts,
                                       {.data = std::as_writable_bytes(std::span(v)),
                                        .count = v.size(),
                                        .deadline = t.clock()->Now() + 60s});
      EXPECT_FALSE(s.ok());
      EXPECT_NE(s.code(), ErrorCode::kDeadlineExceeded)
          << "quitter " << quitter << ": must fail on the abort, not time out: " << s;
      EXPECT_NE(s.message().find("allreduce_hierarchical step="), std::string::npos) << s;
      EXPECT_FALSE(t.status().ok());
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Collective, CollectiveFailureTest,
                         ::testing::Values(Kind::kShm, Kind::kTcp),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return std::string(info.param == Kind::kShm ? "Shm" : "Tcp");
                         });

}  // namespace
}  // namespace kc::comm
