#include "comm/shm/shm_direct.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "comm/collectives.h"
#include "comm/hash_store.h"
#include "comm/internal/shm_segment.h"
#include "comm/tcp_store.h"
#include "tests/support/child_guard.h"
#include "tests/support/shm_entries.h"

namespace kc::comm {
namespace {

using namespace std::chrono_literals;
using hal::DataType;

// Small, so that every size but the tiny ones is sliced and the small path is short.
constexpr int64_t kStagingBytes = 64 * 1024;
constexpr int64_t kSmallBytes = 4 * 1024;

std::string UniqueGroup(std::string_view name) {
  static std::atomic<int> counter{0};
  return std::string(name) + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

// /dev/shm entries whose name carries `group`'s segment prefix.
int ShmEntries(const std::string& group) {
  return kc::testing::CountShmEntries(internal::SegmentPrefix("kc-shmd-", group));
}

TimePoint Soon() { return Clock::Real()->Now() + 30s; }

ShmDirectOptions Options(Store* store, const std::string& group, int rank, int size) {
  return {.store = store,
          .group = group,
          .rank = rank,
          .size = size,
          .connect_timeout = 30s,
          .staging_bytes = kStagingBytes,
          .small_bytes = kSmallBytes,
          .spin_iterations = 2000};
}

// Creates `size` members concurrently (Create blocks until all ranks joined).
std::vector<std::unique_ptr<ShmDirectGroup>> CreateGroup(Store* store, const std::string& group,
                                                         int size) {
  std::vector<std::unique_ptr<ShmDirectGroup>> out(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto g = ShmDirectGroup::Create(Options(store, group, r, size));
      EXPECT_TRUE(g.ok()) << g.status();
      if (g.ok()) out[r] = std::move(g).value();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// Runs fn(rank) on one thread per rank and joins them.
template <typename Fn>
void OnEveryRank(int size, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (auto& t : threads) t.join();
}

// Element access through doubles; every test value is exact in every type.
void Put(DataType t, std::byte* p, size_t i, double v) {
  switch (t) {
    case DataType::kF32: {
      const float x = static_cast<float>(v);
      std::memcpy(p + i * 4, &x, 4);
      return;
    }
    case DataType::kF64:
      std::memcpy(p + i * 8, &v, 8);
      return;
    case DataType::kI32: {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(p + i * 4, &x, 4);
      return;
    }
    case DataType::kI64: {
      const int64_t x = static_cast<int64_t>(v);
      std::memcpy(p + i * 8, &x, 8);
      return;
    }
    case DataType::kBf16: {
      const hal::Bf16 x = hal::FloatToBf16(static_cast<float>(v));
      std::memcpy(p + i * 2, &x, 2);
      return;
    }
  }
}

double Get(DataType t, const std::byte* p, size_t i) {
  switch (t) {
    case DataType::kF32: {
      float x;
      std::memcpy(&x, p + i * 4, 4);
      return x;
    }
    case DataType::kF64: {
      double x;
      std::memcpy(&x, p + i * 8, 8);
      return x;
    }
    case DataType::kI32: {
      int32_t x;
      std::memcpy(&x, p + i * 4, 4);
      return x;
    }
    case DataType::kI64: {
      int64_t x;
      std::memcpy(&x, p + i * 8, 8);
      return static_cast<double>(x);
    }
    case DataType::kBf16: {
      hal::Bf16 x;
      std::memcpy(&x, p + i * 2, 2);
      return hal::Bf16ToFloat(x);
    }
  }
  return 0;
}

// Rank r's input element i. Products stay within +-256 (exact in bf16); min and max of
// floating types carry a NaN on one rank for some elements.
double Input(DataType t, ReduceOp op, int size, int r, size_t i) {
  if (op == ReduceOp::kProd) {
    const int k = static_cast<int>((r + i) % 3);
    return k == 0 ? 2 : k == 1 ? -1 : 1;
  }
  if ((op == ReduceOp::kMin || op == ReduceOp::kMax) && IsFloating(t) && i % 17 == 3 &&
      static_cast<size_t>(r) == i % size) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return static_cast<double>(static_cast<int>((r * 131 + i * 7) % 9) - 4);
}

// The plain reference: op over every rank's input, in doubles (exact here), then avg's
// scale as the type computes it.
double Expected(DataType t, ReduceOp op, int size, size_t i) {
  double acc = Input(t, op, size, 0, i);
  for (int r = 1; r < size; ++r) {
    const double x = Input(t, op, size, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += x;
        break;
      case ReduceOp::kProd:
        acc *= x;
        break;
      case ReduceOp::kMin:
        acc = std::isnan(acc) || std::isnan(x) ? std::nan("") : std::min(acc, x);
        break;
      case ReduceOp::kMax:
        acc = std::isnan(acc) || std::isnan(x) ? std::nan("") : std::max(acc, x);
        break;
    }
  }
  if (op == ReduceOp::kAvg && size > 1) {
    if (t == DataType::kF64) return acc * (1.0 / size);
    const float f = static_cast<float>(acc) * (1.0f / static_cast<float>(size));
    return t == DataType::kBf16 ? hal::Bf16ToFloat(hal::FloatToBf16(f)) : f;
  }
  return acc;
}

bool Same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

constexpr DataType kTypes[] = {DataType::kF32, DataType::kF64, DataType::kI32, DataType::kI64,
                               DataType::kBf16};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kAvg};
// 0, 1, odd on the small path (f32), odd just past it, and sliced (well over staging).
constexpr size_t kCounts[] = {0, 1, 1001, 3001, 40001};

enum class Buffers { kUser, kRegistered, kMixed };

// Checks `got` element-wise against want(i); reports the first difference only.
template <typename Want>
void ExpectElements(const char* what, int rank, DataType t, const std::byte* got, size_t begin,
                    size_t end, Want want) {
  for (size_t i = begin; i < end; ++i) {
    if (!Same(Get(t, got, i), want(i))) {
      ADD_FAILURE() << what << " rank " << rank << " dtype " << hal::DataTypeName(t) << " element "
                    << i << " of [" << begin << ", " << end << "): got " << Get(t, got, i)
                    << " want " << want(i);
      return;
    }
  }
}

// One rank's walk through every collective, dtype, op and size; results against Expected.
void RunMatrix(ShmDirectGroup& g, ShmRegion* region, bool use_region) {
  const int n = g.size();
  const int r = g.rank();
  for (DataType t : kTypes) {
    const size_t es = hal::DataTypeSize(t);
    for (size_t count : kCounts) {
      std::vector<std::byte> user(count * es);
      // Registered data starts 64 bytes into the region: offsets must work.
      std::span<std::byte> data =
          use_region ? region->data().subspan(64, count * es) : std::span<std::byte>(user);
      std::byte* d = data.data();
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::kAvg && !IsFloating(t)) continue;
        auto input = [&](size_t i) { return Input(t, op, n, r, i); };
        auto expected = [&](size_t i) { return Expected(t, op, n, i); };
        auto fill = [&] {
          for (size_t i = 0; i < count; ++i) Put(t, d, i, input(i));
        };
        const std::string name = std::string(ReduceOpName(op)) + " n=" + std::to_string(n) +
                                 " count=" + std::to_string(count);

        fill();
        Status s = g.Allreduce(data, count, t, op, Soon());
        ASSERT_TRUE(s.ok()) << s;
        ExpectElements(("allreduce " + name).c_str(), r, t, d, 0, count,
                       n == 1 ? std::function<double(size_t)>(input) : expected);

        fill();
        s = g.ReduceScatter(data, count, t, op, Soon());
        ASSERT_TRUE(s.ok()) << s;
        const ChunkRange c = ChunkOf(count, n, r);
        ExpectElements(("reduce_scatter " + name).c_str(), r, t, d, c.offset, c.offset + c.count,
                       n == 1 ? std::function<double(size_t)>(input) : expected);
        ExpectElements(("reduce_scatter others " + name).c_str(), r, t, d, 0, c.offset, input);
        ExpectElements(("reduce_scatter others " + name).c_str(), r, t, d, c.offset + c.count,
                       count, input);

        fill();
        const int root = static_cast<int>(count % n);
        s = g.Reduce(data, count, t, op, root, Soon());
        ASSERT_TRUE(s.ok()) << s;
        ExpectElements(("reduce " + name).c_str(), r, t, d, 0, count,
                       r == root && n > 1 ? std::function<double(size_t)>(expected) : input);
      }
      // Allgather: only this rank's chunk is meaningful on input.
      auto gathered = [&](size_t i) {
        for (int p = 0; p < n; ++p) {
          const ChunkRange c = ChunkOf(count, n, p);
          if (i >= c.offset && i < c.offset + c.count) return Input(t, ReduceOp::kSum, n, p, i);
        }
        return -1000.0;
      };
      const ChunkRange own = ChunkOf(count, n, r);
      for (size_t i = 0; i < count; ++i) {
        const bool mine = i >= own.offset && i < own.offset + own.count;
        Put(t, d, i, mine ? Input(t, ReduceOp::kSum, n, r, i) : 77);
      }
      Status s = g.Allgather(data, count, t, Soon());
      ASSERT_TRUE(s.ok()) << s;
      ExpectElements("allgather", r, t, d, 0, count, gathered);

      const int root = static_cast<int>((count + 1) % n);
      for (size_t i = 0; i < count; ++i) Put(t, d, i, Input(t, ReduceOp::kSum, n, r, i));
      s = g.Broadcast(data.first(count * es), root, Soon());
      ASSERT_TRUE(s.ok()) << s;
      ExpectElements("broadcast", r, t, d, 0, count,
                     [&](size_t i) { return Input(t, ReduceOp::kSum, n, root, i); });
      ASSERT_TRUE(g.Barrier(Soon()).ok());
    }
  }
}

class ShmDirectMatrixTest : public ::testing::TestWithParam<std::tuple<int, Buffers>> {};

TEST_P(ShmDirectMatrixTest, EveryCollectiveMatchesThePlainReference) {
  const int n = std::get<0>(GetParam());
  const Buffers buffers = std::get<1>(GetParam());
  HashStore store;
  const std::string group = UniqueGroup("matrix");
  auto gs = CreateGroup(&store, group, n);
  for (auto& g : gs) ASSERT_NE(g, nullptr);
  EXPECT_EQ(ShmEntries(group), 0);  // unlinked once everyone mapped them
  OnEveryRank(n, [&](int r) {
    std::shared_ptr<ShmRegion> region;
    if (buffers != Buffers::kUser) {
      auto a = gs[r]->Allocate(64 + 40001 * 8, Soon());
      ASSERT_TRUE(a.ok()) << a.status();
      region = std::move(a).value();
    }
    const bool use_region =
        buffers == Buffers::kRegistered || (buffers == Buffers::kMixed && r % 2 == 0);
    RunMatrix(*gs[r], region.get(), use_region);
    EXPECT_TRUE(gs[r]->status().ok()) << gs[r]->status();
  });
  gs.clear();
  EXPECT_EQ(ShmEntries(group), 0);
}

INSTANTIATE_TEST_SUITE_P(
    ShmDirect, ShmDirectMatrixTest,
    ::testing::Values(std::tuple(1, Buffers::kUser), std::tuple(2, Buffers::kUser),
                      std::tuple(3, Buffers::kUser), std::tuple(4, Buffers::kUser),
                      std::tuple(5, Buffers::kUser), std::tuple(6, Buffers::kUser),
                      std::tuple(7, Buffers::kUser), std::tuple(8, Buffers::kUser),
                      std::tuple(1, Buffers::kRegistered), std::tuple(2, Buffers::kRegistered),
                      std::tuple(3, Buffers::kRegistered), std::tuple(5, Buffers::kRegistered),
                      std::tuple(8, Buffers::kRegistered), std::tuple(2, Buffers::kMixed),
                      std::tuple(3, Buffers::kMixed), std::tuple(6, Buffers::kMixed)));

TEST(ShmDirectTest, RegionsAreZeroedAndSharedAndOutliveTheGroup) {
  HashStore store;
  const std::string group = UniqueGroup("region");
  auto gs = CreateGroup(&store, group, 3);
  std::vector<std::shared_ptr<ShmRegion>> regions(3);
  OnEveryRank(3, [&](int r) {
    auto a = gs[r]->Allocate(10000, Soon());
    ASSERT_TRUE(a.ok()) << a.status();
    regions[r] = std::move(a).value();
  });
  EXPECT_EQ(ShmEntries(group), 0);
  for (auto& region : regions) {
    ASSERT_EQ(region->data().size(), 10000u);
    for (std::byte b : region->data()) ASSERT_EQ(b, std::byte{0});
  }
  gs.clear();
  regions[1]->data()[5] = std::byte{9};  // still mapped
  EXPECT_EQ(regions[1]->data()[5], std::byte{9});
}

TEST(ShmDirectTest, BadArgumentsFailBeforeAnythingAndLeaveTheGroupUsable) {
  HashStore store;
  auto gs = CreateGroup(&store, UniqueGroup("args"), 2);
  OnEveryRank(2, [&](int r) {
    ShmDirectGroup& g = *gs[r];
    std::vector<float> v(100, 1.0f);
    auto bytes = std::as_writable_bytes(std::span(v));
    EXPECT_EQ(g.Allreduce(bytes, 101, DataType::kF32, ReduceOp::kSum, Soon()).code(),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(g.Allreduce(bytes.subspan(1), 10, DataType::kF32, ReduceOp::kSum, Soon()).code(),
              ErrorCode::kInvalidArgument);  // misaligned
    EXPECT_EQ(g.Allreduce(bytes, 10, DataType::kI32, ReduceOp::kAvg, Soon()).code(),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(g.Allreduce(bytes, 10, static_cast<DataType>(9), ReduceOp::kSum, Soon()).code(),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(g.ReduceScatter(bytes, 10, DataType::kF32, static_cast<ReduceOp>(9), Soon()).code(),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(g.Allgather(bytes, 1000, DataType::kF32, Soon()).code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(g.Broadcast(bytes, 2, Soon()).code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(g.Broadcast(bytes, -1, Soon()).code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(g.Reduce(bytes, 10, DataType::kF32, ReduceOp::kSum, 5, Soon()).code(),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(g.Allocate(0, Soon()).status().code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(g.status().ok());
    EXPECT_TRUE(g.Allreduce(bytes, 100, DataType::kF32, ReduceOp::kSum, Soon()).ok());
    EXPECT_EQ(v[99], 2.0f);
  });
}

TEST(ShmDirectTest, BadOptionsAreRejected) {
  HashStore store;
  ShmDirectOptions o = Options(&store, "bad", 0, 1);
  o.staging_bytes = 100;
  EXPECT_EQ(ShmDirectGroup::Create(o).status().code(), ErrorCode::kInvalidArgument);
  o = Options(&store, "bad", 2, 2);
  EXPECT_EQ(ShmDirectGroup::Create(o).status().code(), ErrorCode::kInvalidArgument);
  o = Options(nullptr, "bad", 0, 1);
  EXPECT_EQ(ShmDirectGroup::Create(o).status().code(), ErrorCode::kInvalidArgument);
  o = Options(&store, "bad", 0, 1);
  o.host_ranks = -1;
  EXPECT_EQ(ShmDirectGroup::Create(o).status().code(), ErrorCode::kInvalidArgument);
}

// A small group of a job with more ranks on the host than it has CPUs (a tensor-parallel
// group beside others) waits as an oversubscribed one, and reduces the same.
TEST(ShmDirectTest, AGroupAmongManyHostRanksReducesTheSame) {
  HashStore store;
  const std::string group = UniqueGroup("host-ranks");
  std::vector<std::unique_ptr<ShmDirectGroup>> gs(2);
  OnEveryRank(2, [&](int r) {
    ShmDirectOptions o = Options(&store, group, r, 2);
    o.host_ranks = 4096;  // more than any machine's CPUs
    auto g = ShmDirectGroup::Create(o);
    ASSERT_TRUE(g.ok()) << g.status();
    gs[r] = std::move(g).value();
  });
  OnEveryRank(2, [&](int r) {
    for (int round = 0; round < 50; ++round) {
      std::vector<float> v(1000, static_cast<float>(r + round));
      ASSERT_TRUE(gs[r]
                      ->Allreduce(std::as_writable_bytes(std::span(v)), v.size(), DataType::kF32,
                                  ReduceOp::kSum, Soon())
                      .ok());
      EXPECT_EQ(v[0], static_cast<float>(1 + 2 * round));
      EXPECT_EQ(v[999], static_cast<float>(1 + 2 * round));
    }
  });
}

TEST(ShmDirectTest, RanksCallingDifferentCollectivesFailWithInvalidArgument) {
  HashStore store;
  auto gs = CreateGroup(&store, UniqueGroup("mismatch"), 2);
  OnEveryRank(2, [&](int r) {
    std::vector<float> v(1000, 1.0f);
    auto bytes = std::as_writable_bytes(std::span(v));
    const size_t count = r == 0 ? 1000 : 999;
    const Status s = gs[r]->Allreduce(bytes, count, DataType::kF32, ReduceOp::kSum, Soon());
    // Both see the mismatch after the first arrival (or, second, the other's failure).
    EXPECT_TRUE(s.code() == ErrorCode::kInvalidArgument || s.code() == ErrorCode::kAborted) << s;
    EXPECT_EQ(gs[r]->Barrier(Soon()), s);  // sticky
  });
}

TEST(ShmDirectTest, AbortByOneRankFailsTheOthersBeforeTheirDeadline) {
  HashStore store;
  auto gs = CreateGroup(&store, UniqueGroup("abort"), 3);
  std::vector<Status> got(3);
  const TimePoint deadline = Clock::Real()->Now() + 60s;
  OnEveryRank(3, [&](int r) {
    if (r == 2) {
      gs[2]->Abort(AbortedError("test aborts rank 2"));
      got[2] = gs[2]->status();
      return;
    }
    std::vector<float> v(100000, 1.0f);  // the large path
    got[r] = gs[r]->Allreduce(std::as_writable_bytes(std::span(v)), v.size(), DataType::kF32,
                              ReduceOp::kSum, deadline);
  });
  EXPECT_LT(Clock::Real()->Now(), deadline);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), ErrorCode::kAborted) << got[r];
    EXPECT_NE(got[r].message().find("rank 2"), std::string::npos) << got[r];
    EXPECT_EQ(gs[r]->Barrier(deadline), got[r]);  // sticky
  }
  EXPECT_EQ(got[2].message(), "test aborts rank 2");
  EXPECT_EQ(gs[2]->Barrier(deadline).code(), ErrorCode::kAborted);
}

TEST(ShmDirectTest, AbortFromAnotherThreadEndsABlockedCollectiveOfThisRank) {
  HashStore store;
  auto gs = CreateGroup(&store, UniqueGroup("abort-self"), 2);
  // Rank 1 never calls; rank 0 blocks until its own Abort.
  std::thread aborter([&] { gs[0]->Abort(CancelledError("shutting down")); });
  const Status s = gs[0]->Barrier(Clock::Real()->Now() + 60s);
  aborter.join();
  EXPECT_EQ(s.code(), ErrorCode::kCancelled) << s;
  // Rank 0 may have arrived before it aborted, letting rank 1's first barrier through; the
  // next one cannot complete.
  gs[1]->Barrier(Soon()).IgnoreError();
  const Status next = gs[1]->Barrier(Soon());
  EXPECT_EQ(next.code(), ErrorCode::kAborted) << next;
  EXPECT_NE(next.message().find("rank 0"), std::string::npos) << next;
}

TEST(ShmDirectTest, AnAbsentRankMakesTheOthersExceedTheirDeadline) {
  HashStore store;
  auto gs = CreateGroup(&store, UniqueGroup("deadline"), 3);
  std::vector<Status> got(2);
  OnEveryRank(2, [&](int r) {
    std::vector<double> v(50, 1.0);
    got[r] = gs[r]->Allreduce(std::as_writable_bytes(std::span(v)), v.size(), DataType::kF64,
                              ReduceOp::kSum, Clock::Real()->Now() + 200ms);
  });
  for (int r = 0; r < 2; ++r) {
    // The first to time out fails the group; the other may see that first.
    EXPECT_TRUE(got[r].code() == ErrorCode::kDeadlineExceeded ||
                got[r].code() == ErrorCode::kAborted)
        << got[r];
    EXPECT_EQ(gs[r]->status(), got[r]);
  }
  EXPECT_TRUE(got[0].code() == ErrorCode::kDeadlineExceeded ||
              got[1].code() == ErrorCode::kDeadlineExceeded);
  // The latecomer finds the group failed.
  EXPECT_EQ(gs[2]->Barrier(Soon()).code(), ErrorCode::kAborted);
}

TEST(ShmDirectTest, ADestroyedMemberFailsItsPeersNextCollective) {
  HashStore store;
  auto gs = CreateGroup(&store, UniqueGroup("destroyed"), 2);
  gs[1].reset();
  const Status s = gs[0]->Barrier(Soon());
  EXPECT_EQ(s.code(), ErrorCode::kAborted) << s;
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
}

using kc::testing::ChildGuard;

constexpr size_t kForkCount = (1 << 20) + 3;  // f32, over staging: sliced

// The child rank: joins through the TCP store whose port arrives on `port_fd`, runs an
// allreduce on a user buffer and one on a region (exit code 10 + k on a failure), then
// _exit()s while the parent waits in a barrier. Never returns.
[[noreturn]] void RunChildRank(int port_fd, const std::string& group) {
  int port = 0;
  if (read(port_fd, &port, sizeof port) != sizeof port) _exit(2);
  auto store = TcpStoreClient::Connect("127.0.0.1", port, Clock::Real()->Now() + 30s);
  if (!store.ok()) _exit(3);
  auto g = ShmDirectGroup::Create(Options(store.value().get(), group, 1, 2));
  if (!g.ok()) _exit(4);
  std::vector<float> v(kForkCount);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 100);
  if (!g.value()
           ->Allreduce(std::as_writable_bytes(std::span(v)), v.size(), DataType::kF32,
                       ReduceOp::kSum, Soon())
           .ok()) {
    _exit(5);
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != static_cast<float>(i % 100 + i % 7)) _exit(6);
  }
  auto region = g.value()->Allocate(kForkCount * 4, Soon());
  if (!region.ok()) _exit(7);
  std::span<std::byte> rd = region.value()->data();
  for (size_t i = 0; i < kForkCount; ++i) {
    const float x = 2.0f;
    std::memcpy(rd.data() + i * 4, &x, 4);
  }
  if (!g.value()->Allreduce(rd, kForkCount, DataType::kF32, ReduceOp::kMax, Soon()).ok()) _exit(8);
  for (size_t i = 0; i < kForkCount; ++i) {
    float x;
    std::memcpy(&x, rd.data() + i * 4, 4);
    if (x != 3.0f) _exit(9);
  }
  _exit(0);  // while rank 0 waits in its barrier: it must notice the death
}

// The peer rank is a forked child process: proves the cross-process mappings (user buffers
// and regions), then that its death fails the survivor with kUnavailable naming it, although
// it stays an unreaped zombie. Forked before this test starts any thread.
TEST(ShmDirectTest, APeerProcessThatExitsMidCollectiveFailsTheSurvivorWithUnavailable) {
  const std::string group = UniqueGroup("fork");
  int port_pipe[2];
  ASSERT_EQ(pipe(port_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(port_pipe[1]);
    RunChildRank(port_pipe[0], group);
  }
  ChildGuard child(pid);
  close(port_pipe[0]);
  auto server = TcpStoreServer::Start({.bind_address = "127.0.0.1", .port = 0});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = server.value()->port();
  ASSERT_EQ(write(port_pipe[1], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  close(port_pipe[1]);
  auto store = TcpStoreClient::Connect("127.0.0.1", port, Soon());
  ASSERT_TRUE(store.ok());
  auto g = ShmDirectGroup::Create(Options(store.value().get(), group, 0, 2));
  ASSERT_TRUE(g.ok()) << g.status();

  std::vector<float> v(kForkCount);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 7);
  ASSERT_TRUE(g.value()
                  ->Allreduce(std::as_writable_bytes(std::span(v)), v.size(), DataType::kF32,
                              ReduceOp::kSum, Soon())
                  .ok());
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(v[i], static_cast<float>(i % 100 + i % 7)) << i;
  }
  auto region = g.value()->Allocate(kForkCount * 4, Soon());
  ASSERT_TRUE(region.ok()) << region.status();
  std::span<std::byte> rd = region.value()->data();
  for (size_t i = 0; i < kForkCount; ++i) {
    const float x = 3.0f;
    std::memcpy(rd.data() + i * 4, &x, 4);
  }
  ASSERT_TRUE(g.value()->Allreduce(rd, kForkCount, DataType::kF32, ReduceOp::kMax, Soon()).ok());

  const Status s = g.value()->Barrier(Clock::Real()->Now() + 60s);
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
  EXPECT_EQ(g.value()->status(), s);
  const int wstatus = child.Reap();
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  g.value().reset();
  EXPECT_EQ(ShmEntries(group), 0);
}

}  // namespace
}  // namespace kc::comm
