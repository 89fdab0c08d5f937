#include "comm/collectives.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "base/clock.h"
#include "base/notification.h"
#include "comm/hash_store.h"
#include "comm/shm/shm_transport.h"
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

INSTANTIATE_TEST_SUITE_P(Collective, CollectiveFailureTest,
                         ::testing::Values(Kind::kShm, Kind::kTcp),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return std::string(info.param == Kind::kShm ? "Shm" : "Tcp");
                         });

}  // namespace
}  // namespace kc::comm
