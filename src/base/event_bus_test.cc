#include "base/event_bus.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "base/notification.h"

namespace kc {
namespace {

struct Ping {
  int n;
};

const Topic<Ping> kPings{"test.pings"};

TEST(EventBusTest, DeliversInPublishOrderOnTheDispatcherThread) {
  EventBus bus;
  std::vector<int> seen;
  std::thread::id delivered_on;
  auto sub = bus.Subscribe<Ping>(kPings, [&](const Ping& p) {
    seen.push_back(p.n);
    delivered_on = std::this_thread::get_id();
  });
  ASSERT_TRUE(sub.ok());
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(bus.Publish(kPings, Ping{i}).ok());
  ASSERT_TRUE(bus.Flush().ok());
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_NE(delivered_on, std::this_thread::get_id());
  EXPECT_EQ(bus.stats().delivered, 100u);
}

TEST(EventBusTest, EverySubscriberOfATopicGetsTheEventAndOthersDoNot) {
  EventBus bus;
  const Topic<Ping> other{"test.other"};
  int a = 0, b = 0, c = 0;
  auto sa = bus.Subscribe<Ping>(kPings, [&](const Ping&) { ++a; });
  auto sb = bus.Subscribe<Ping>(kPings, [&](const Ping&) { ++b; });
  auto sc = bus.Subscribe<Ping>(other, [&](const Ping&) { ++c; });
  ASSERT_TRUE(bus.Publish(kPings, Ping{1}).ok());
  ASSERT_TRUE(bus.Flush().ok());
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(c, 0);
}

TEST(EventBusTest, RejectsATopicNameUsedWithAnotherType) {
  EventBus bus;
  auto sub = bus.Subscribe<Ping>(kPings, [](const Ping&) {});
  ASSERT_TRUE(sub.ok());
  const Topic<std::string> clash{"test.pings"};
  Status s = bus.Publish(clash, std::string("x"));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("test.pings"), std::string::npos);
  EXPECT_EQ(bus.Subscribe<std::string>(clash, [](const std::string&) {}).status().code(),
            ErrorCode::kInvalidArgument);
}

TEST(EventBusTest, CancelledSubscriptionGetsNothingMore) {
  EventBus bus;
  int n = 0;
  auto sub = bus.Subscribe<Ping>(kPings, [&](const Ping&) { ++n; });
  ASSERT_TRUE(bus.Publish(kPings, Ping{1}).ok());
  ASSERT_TRUE(bus.Flush().ok());
  sub->Cancel();
  ASSERT_TRUE(bus.Publish(kPings, Ping{2}).ok());
  ASSERT_TRUE(bus.Flush().ok());
  EXPECT_EQ(n, 1);
}

// A subscriber that blocks until released lets the test fill the queue deterministically.
class BlockedSubscriber {
 public:
  explicit BlockedSubscriber(EventBus* bus) {
    sub_ = *bus->Subscribe<Ping>(kPings, [this](const Ping& p) {
      if (p.n == -1) {
        entered_.Notify();
        release_.WaitForNotification();
      } else {
        seen_.push_back(p.n);
      }
    });
  }
  void AwaitBlocked() { entered_.WaitForNotification(); }
  void Release() { release_.Notify(); }
  const std::vector<int>& seen() const { return seen_; }
  void Cancel() { sub_.Cancel(); }

 private:
  Notification entered_, release_;
  std::vector<int> seen_;  // written by the dispatcher; read after Flush
  Subscription sub_;
};

TEST(EventBusTest, DropOldestKeepsTheNewestEvents) {
  EventBus bus({.name = "t", .queue_capacity = 3, .overflow = OverflowPolicy::kDropOldest});
  BlockedSubscriber s(&bus);
  ASSERT_TRUE(bus.Publish(kPings, Ping{-1}).ok());
  s.AwaitBlocked();
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(bus.Publish(kPings, Ping{i}).ok());
  s.Release();
  ASSERT_TRUE(bus.Flush().ok());
  EXPECT_EQ(s.seen(), (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(bus.stats().dropped, 2u);
  EXPECT_EQ(bus.stats().queue_high_water, 3u);
  s.Cancel();
}

TEST(EventBusTest, RejectNewReturnsResourceExhausted) {
  EventBus bus({.name = "t", .queue_capacity = 2, .overflow = OverflowPolicy::kRejectNew});
  BlockedSubscriber s(&bus);
  ASSERT_TRUE(bus.Publish(kPings, Ping{-1}).ok());
  s.AwaitBlocked();
  EXPECT_TRUE(bus.Publish(kPings, Ping{0}).ok());
  EXPECT_TRUE(bus.Publish(kPings, Ping{1}).ok());
  EXPECT_EQ(bus.Publish(kPings, Ping{2}).code(), ErrorCode::kResourceExhausted);
  s.Release();
  ASSERT_TRUE(bus.Flush().ok());
  EXPECT_EQ(s.seen(), (std::vector<int>{0, 1}));
  EXPECT_EQ(bus.stats().dropped, 1u);
  s.Cancel();
}

TEST(EventBusTest, BlockPolicyTimesOutOnTheBusClock) {
  FakeClock clock;
  EventBus bus({.name = "t",
                .queue_capacity = 1,
                .overflow = OverflowPolicy::kBlock,
                .publish_timeout = std::chrono::seconds(5),
                .clock = &clock});
  BlockedSubscriber s(&bus);
  ASSERT_TRUE(bus.Publish(kPings, Ping{-1}).ok());
  s.AwaitBlocked();
  ASSERT_TRUE(bus.Publish(kPings, Ping{0}).ok());
  Status blocked;
  std::thread publisher([&] { blocked = bus.Publish(kPings, Ping{1}); });
  clock.BlockUntilWaiters(1);
  clock.Advance(std::chrono::seconds(6));
  publisher.join();
  EXPECT_EQ(blocked.code(), ErrorCode::kDeadlineExceeded);
  s.Release();
  ASSERT_TRUE(bus.Flush().ok());
  EXPECT_EQ(s.seen(), (std::vector<int>{0}));
  s.Cancel();
}

TEST(EventBusTest, BlockPolicyProceedsWhenRoomAppears) {
  EventBus bus({.name = "t", .queue_capacity = 1, .overflow = OverflowPolicy::kBlock});
  BlockedSubscriber s(&bus);
  ASSERT_TRUE(bus.Publish(kPings, Ping{-1}).ok());
  s.AwaitBlocked();
  ASSERT_TRUE(bus.Publish(kPings, Ping{0}).ok());
  Status second;
  std::thread publisher([&] { second = bus.Publish(kPings, Ping{1}); });
  s.Release();  // the queue drains, the blocked publisher gets room
  publisher.join();
  EXPECT_TRUE(second.ok());
  ASSERT_TRUE(bus.Flush().ok());
  EXPECT_EQ(s.seen(), (std::vector<int>{0, 1}));
  s.Cancel();
}

TEST(EventBusTest, FlushFromACallbackIsRefused) {
  EventBus bus;
  Status inner;
  auto sub = bus.Subscribe<Ping>(kPings, [&](const Ping&) { inner = bus.Flush(); });
  ASSERT_TRUE(bus.Publish(kPings, Ping{1}).ok());
  ASSERT_TRUE(bus.Flush().ok());
  EXPECT_EQ(inner.code(), ErrorCode::kFailedPrecondition);
}

TEST(EventBusTest, CallbackMayCancelItsOwnSubscription) {
  EventBus bus;
  int n = 0;
  Subscription sub;
  sub = *bus.Subscribe<Ping>(kPings, [&](const Ping&) {
    ++n;
    sub.Cancel();
  });
  ASSERT_TRUE(bus.Publish(kPings, Ping{1}).ok());
  ASSERT_TRUE(bus.Publish(kPings, Ping{2}).ok());
  ASSERT_TRUE(bus.Flush().ok());
  EXPECT_EQ(n, 1);
}

TEST(EventBusTest, ConcurrentPublishersLoseNothingUnderBlockPolicy) {
  EventBus bus({.name = "t",
                .queue_capacity = 8,
                .overflow = OverflowPolicy::kBlock,
                .publish_timeout = std::chrono::minutes(5)});
  std::atomic<int> sum{0};
  auto sub = bus.Subscribe<Ping>(kPings, [&](const Ping& p) { sum += p.n; });
  std::vector<std::thread> publishers;
  for (int t = 0; t < 4; ++t) {
    publishers.emplace_back([&] {
      for (int i = 1; i <= 250; ++i) ASSERT_TRUE(bus.Publish(kPings, Ping{i}).ok());
    });
  }
  for (auto& t : publishers) t.join();
  ASSERT_TRUE(bus.Flush().ok());
  EXPECT_EQ(sum.load(), 4 * 250 * 251 / 2);
  EXPECT_EQ(bus.stats().dropped, 0u);
}

}  // namespace
}  // namespace kc
