#include "comm/subgroup_transport.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/collectives.h"
#include "comm/hash_store.h"
#include "comm/shm/shm_transport.h"

namespace kc::comm {
namespace {

using namespace std::chrono_literals;

// Creates the n ranks of a new shm group concurrently, then runs body(parent) on n threads.
void RunGroup(int n, const std::function<void(const std::shared_ptr<Transport>&)>& body) {
  static std::atomic<int> counter{0};
  HashStore store;
  const std::string group =
      "subgroup-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  std::vector<std::shared_ptr<Transport>> ts(n);
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        Result<std::unique_ptr<Transport>> t = CreateShmTransport(
            {.store = &store, .group = group, .rank = r, .size = n, .ring_bytes = 64 << 10});
        ASSERT_TRUE(t.ok()) << t.status();
        ts[r] = *std::move(t);
      });
    }
  }
  for (const auto& t : ts) ASSERT_NE(t, nullptr);
  std::vector<std::jthread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(ts[r]); });
}

TimePoint Deadline(const Transport& t) { return t.clock()->Now() + 20s; }

std::span<const std::byte> Bytes(const int64_t& v) { return std::as_bytes(std::span(&v, 1)); }
std::span<std::byte> Bytes(int64_t& v) { return std::as_writable_bytes(std::span(&v, 1)); }

TEST(SubgroupTransportTest, BadArgumentsAreInvalidArgument) {
  RunGroup(3, [](const std::shared_ptr<Transport>& parent) {
    if (parent->rank() != 0) return;
    const auto code = [&](std::vector<int> ranks, uint16_t salt) {
      return CreateSubgroupTransport(parent, std::move(ranks), salt).status().code();
    };
    EXPECT_EQ(CreateSubgroupTransport(nullptr, {0}, 1).status().code(),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(code({0, 1}, 0), ErrorCode::kInvalidArgument);     // salt 0 is the parent's
    EXPECT_EQ(code({}, 1), ErrorCode::kInvalidArgument);         // empty
    EXPECT_EQ(code({0, 3}, 1), ErrorCode::kInvalidArgument);     // out of range
    EXPECT_EQ(code({-1, 0}, 1), ErrorCode::kInvalidArgument);    // out of range
    EXPECT_EQ(code({0, 1, 0}, 1), ErrorCode::kInvalidArgument);  // duplicate
    EXPECT_EQ(code({1, 2}, 1), ErrorCode::kInvalidArgument);     // without this rank
    Result<std::unique_ptr<Transport>> view = CreateSubgroupTransport(parent, {0, 2}, 1);
    ASSERT_TRUE(view.ok()) << view.status();
    std::shared_ptr<Transport> shared_view = *std::move(view);
    EXPECT_EQ(CreateSubgroupTransport(shared_view, {0}, 2).status().code(),
              ErrorCode::kInvalidArgument);  // nested
    // Bad tags and peers (sub-rank 1 is parent rank 2; 0 is this rank): refused locally,
    // and the parent stays healthy.
    int64_t x = 0;
    EXPECT_EQ(shared_view->Send(1, uint64_t{1} << 48, Bytes(x)).status().code(),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(shared_view->Recv(1, ~uint64_t{0}, Bytes(x)).status().code(),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(shared_view->Send(2, 0, Bytes(x)).status().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(shared_view->Send(shared_view->rank(), 0, Bytes(x)).status().code(),
              ErrorCode::kInvalidArgument);
    EXPECT_TRUE(parent->status().ok());
  });
}

TEST(SubgroupTransportTest, MapsRanksInTheGivenOrderAndSaltsTags) {
  RunGroup(4, [](const std::shared_ptr<Transport>& parent) {
    const int r = parent->rank();
    if (r == 0 || r == 2) return;  // the view is {3, 1}: sub-rank 0 is parent rank 3
    Result<std::unique_ptr<Transport>> made = CreateSubgroupTransport(parent, {3, 1}, 7);
    ASSERT_TRUE(made.ok()) << made.status();
    Transport& view = **made;
    EXPECT_EQ(view.size(), 2);
    EXPECT_EQ(view.rank(), r == 3 ? 0 : 1);
    EXPECT_EQ(view.clock(), parent->clock());
    const uint64_t salted = (uint64_t{7} << 48) | 5;
    if (r == 3) {
      // The same tag on the view and on the parent: two different channels.
      const int64_t on_view = 111;
      const int64_t on_parent = 222;
      auto a = view.Send(1, 5, Bytes(on_view));
      auto b = parent->Send(1, 5, Bytes(on_parent));
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_TRUE((*a)->Wait(Deadline(view)).ok());
      EXPECT_TRUE((*b)->Wait(Deadline(view)).ok());
      // A second view message, received on the parent under the salted tag.
      const int64_t raw = 333;
      auto c = view.Send(1, 5, Bytes(raw));
      ASSERT_TRUE(c.ok());
      EXPECT_TRUE((*c)->Wait(Deadline(view)).ok());
    } else {
      int64_t got_parent = 0;
      int64_t got_view = 0;
      int64_t got_raw = 0;
      auto b = parent->Recv(3, 5, Bytes(got_parent));
      auto a = view.Recv(0, 5, Bytes(got_view));
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_TRUE((*b)->Wait(Deadline(view)).ok());
      EXPECT_TRUE((*a)->Wait(Deadline(view)).ok());
      auto c = parent->Recv(3, salted, Bytes(got_raw));
      ASSERT_TRUE(c.ok());
      EXPECT_TRUE((*c)->Wait(Deadline(view)).ok());
      EXPECT_EQ(got_view, 111);
      EXPECT_EQ(got_parent, 222);
      EXPECT_EQ(got_raw, 333);
    }
  });
}

TEST(SubgroupTransportTest, DisjointViewsRunCollectivesConcurrentlyWithTheParent) {
  RunGroup(6, [](const std::shared_ptr<Transport>& parent) {
    const int r = parent->rank();
    // Evens and odds, same salt (disjoint sets cannot collide); odds in descending order.
    std::vector<int> ranks = r % 2 == 0 ? std::vector<int>{0, 2, 4} : std::vector<int>{5, 3, 1};
    Result<std::unique_ptr<Transport>> made = CreateSubgroupTransport(parent, ranks, 3);
    ASSERT_TRUE(made.ok()) << made.status();
    Transport& view = **made;
    std::vector<int64_t> sub(100, r);
    std::vector<int64_t> all(100, r);
    std::jthread on_parent([&] {
      ASSERT_TRUE(Allreduce(*parent, {.data = std::as_writable_bytes(std::span(all)),
                                      .count = all.size(),
                                      .dtype = hal::DataType::kI64,
                                      .deadline = Deadline(*parent),
                                      .tag = 1})
                      .ok());
    });
    ASSERT_TRUE(Allreduce(view, {.data = std::as_writable_bytes(std::span(sub)),
                                 .count = sub.size(),
                                 .dtype = hal::DataType::kI64,
                                 .deadline = Deadline(view),
                                 .tag = 1})
                    .ok());
    on_parent.join();
    for (int64_t v : sub) ASSERT_EQ(v, r % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5);
    for (int64_t v : all) ASSERT_EQ(v, 15);
    // Broadcast from sub-rank 0 (parent rank 5 for the odds).
    int64_t b = view.rank() == 0 ? 100 + r : -1;
    ASSERT_TRUE(Broadcast(view, {.data = Bytes(b), .deadline = Deadline(view), .tag = 2}).ok());
    EXPECT_EQ(b, r % 2 == 0 ? 100 : 105);
  });
}

TEST(SubgroupTransportTest, AbortOnAViewFailsTheWholeParentGroup) {
  RunGroup(3, [](const std::shared_ptr<Transport>& parent) {
    if (parent->rank() == 0) {
      Result<std::unique_ptr<Transport>> view = CreateSubgroupTransport(parent, {0, 1}, 4);
      ASSERT_TRUE(view.ok()) << view.status();
      (*view)->Abort(AbortedError("test: view gives up"));
      EXPECT_EQ((*view)->status().code(), ErrorCode::kAborted);
      EXPECT_EQ(parent->status().code(), ErrorCode::kAborted);
      return;
    }
    // Rank 2 is outside the view, yet its collective with rank 0 fails promptly.
    int64_t x = 1;
    Status s = Allreduce(*parent, {.data = Bytes(x),
                                   .count = 1,
                                   .dtype = hal::DataType::kI64,
                                   .deadline = parent->clock()->Now() + 60s});
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.code(), ErrorCode::kDeadlineExceeded) << s;
  });
}

}  // namespace
}  // namespace kc::comm
