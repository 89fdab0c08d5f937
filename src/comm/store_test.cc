// The Store contract, generations and rendezvous, run on a HashStore (fake clock) and on a
// TcpStoreServer on 127.0.0.1 with one client per thread.
#include "comm/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <latch>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/notification.h"
#include "comm/hash_store.h"
#include "comm/rendezvous.h"
#include "comm/tcp_store.h"

namespace kc::comm {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

using Keys = std::vector<std::string>;

enum class Backend { kHash, kTcp };

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kHash ? "Hash" : "Tcp";
}

class StoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kTcp) {
      Result<std::unique_ptr<TcpStoreServer>> server =
          TcpStoreServer::Start({.bind_address = "127.0.0.1", .port = 0});
      ASSERT_TRUE(server.ok()) << server.status();
      server_ = *std::move(server);
    }
    store_ = NewClient();
    ASSERT_NE(store_, nullptr);
  }

  void TearDown() override {
    store_.reset();
    if (server_ != nullptr) server_->Stop();
  }

  bool fake_clock() const { return GetParam() == Backend::kHash; }

  // Another handle on the same store, for another thread: a view of the HashStore, or a
  // client with its own connection.
  std::unique_ptr<Store> NewClient() {
    if (GetParam() == Backend::kHash) return WithPrefix(&hash_, "");
    Result<std::unique_ptr<TcpStoreClient>> client = TcpStoreClient::Connect(
        "127.0.0.1", server_->port(), std::chrono::steady_clock::now() + std::chrono::seconds(30));
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::unique_ptr<Store>(*std::move(client)) : nullptr;
  }

  std::vector<std::unique_ptr<Store>> NewClients(int n) {
    std::vector<std::unique_ptr<Store>> clients;
    for (int i = 0; i < n; ++i) clients.push_back(NewClient());
    return clients;
  }

  // A deadline no test reaches: the fake clock only moves when a test advances it, and on
  // TCP it only bounds a test that would otherwise hang.
  TimePoint Far() const { return store_->clock()->Now() + std::chrono::seconds(60); }

  // For the HashStore: returns once `n` threads are blocked on the fake clock, so a test
  // knows a Get or Wait is waiting before it acts. On TCP there is no such seam; the
  // assertions hold whichever comes first.
  void AwaitBlockedCallers(int n) {
    if (fake_clock()) clock_.BlockUntilWaiters(n);
  }

  FakeClock clock_;
  HashStore hash_{&clock_};
  std::unique_ptr<TcpStoreServer> server_;  // before store_: clients go first
  std::unique_ptr<Store> store_;
};

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values(Backend::kHash, Backend::kTcp),
                         BackendName);

TEST_P(StoreTest, GetReturnsTheBytesSet) {
  const std::string value("a\0b\xff\n", 5);
  ASSERT_TRUE(store_->Set("k", value).ok());
  Result<std::string> got = store_->Get("k", Far());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, value);
}

TEST_P(StoreTest, SetReplacesTheValueAndEmptyValuesAreValues) {
  ASSERT_TRUE(store_->Set("k", "first").ok());
  ASSERT_TRUE(store_->Set("k", "").ok());
  Result<std::string> got = store_->Get("k", Far());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "");
}

TEST_P(StoreTest, GetBlocksUntilAnotherThreadSets) {
  std::unique_ptr<Store> getter_store = NewClient();
  std::optional<Result<std::string>> got;
  Notification started;
  std::jthread getter([&] {
    started.Notify();
    got = getter_store->Get("late", Far());
  });
  started.WaitForNotification();
  AwaitBlockedCallers(1);
  ASSERT_TRUE(store_->Set("late", "here").ok());
  getter.join();
  ASSERT_TRUE(got->ok()) << got->status();
  EXPECT_EQ(**got, "here");
}

TEST_P(StoreTest, WaitReturnsOnceEveryKeyExists) {
  std::unique_ptr<Store> waiter_store = NewClient();
  const std::vector<std::string> keys = {"a", "b"};
  std::optional<Status> waited;
  std::jthread waiter([&] { waited = waiter_store->Wait(keys, Far()); });
  AwaitBlockedCallers(1);
  ASSERT_TRUE(store_->Set("a", "1").ok());
  Result<bool> both = store_->Check(keys);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_FALSE(*both);
  ASSERT_TRUE(store_->Add("b", 1).ok());
  waiter.join();
  EXPECT_TRUE(waited->ok()) << *waited;
}

TEST_P(StoreTest, WaitForNoKeysReturnsAtOnce) { EXPECT_TRUE(store_->Wait({}, Far()).ok()); }

TEST_P(StoreTest, AddStartsAtZeroAndStoresDecimal) {
  Result<int64_t> v = store_->Add("n", 5);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 5);
  v = store_->Add("n", -7);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, -2);
  Result<std::string> text = store_->Get("n", Far());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "-2");
  ASSERT_TRUE(store_->Set("m", "40").ok());
  v = store_->Add("m", 2);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 42);
}

TEST_P(StoreTest, AddToANonNumberOrPastInt64IsFailedPreconditionAndChangesNothing) {
  ASSERT_TRUE(store_->Set("word", "seven").ok());
  EXPECT_EQ(store_->Add("word", 1).status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(store_->Get("word", Far()).value_or(""), "seven");
  ASSERT_TRUE(store_->Add("big", INT64_MAX).ok());
  EXPECT_EQ(store_->Add("big", 1).status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(store_->Add("big", 0).value_or(0), INT64_MAX);
}

TEST_P(StoreTest, AddIsAtomicUnderFourThreads) {
  constexpr int kThreads = 4;
  constexpr int kIncrements = 1000;
  std::vector<std::unique_ptr<Store>> clients = NewClients(kThreads);
  std::atomic<int> failures{0};
  {
    std::latch start(kThreads);
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        start.arrive_and_wait();
        for (int i = 0; i < kIncrements; ++i) {
          if (!clients[t]->Add("counter", 1).ok()) failures.fetch_add(1);
        }
      });
    }
  }
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store_->Add("counter", 0).value_or(-1), kThreads * kIncrements);
}

TEST_P(StoreTest, CompareSetSwapsOnlyWhenTheValueMatches) {
  // Absent and expected absent: swapped.
  Result<CompareSetResult> r = store_->CompareSet("leader", std::nullopt, "rank3");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->swapped);
  EXPECT_EQ(r->current, "rank3");
  // Present and expected absent: the holder is reported.
  r = store_->CompareSet("leader", std::nullopt, "rank5");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->swapped);
  EXPECT_EQ(r->current, "rank3");
  // Present and different: unchanged.
  r = store_->CompareSet("leader", "rank1", "rank5");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->swapped);
  EXPECT_EQ(r->current, "rank3");
  // Present and equal: swapped.
  r = store_->CompareSet("leader", "rank3", "rank5");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->swapped);
  EXPECT_EQ(r->current, "rank5");
  // Absent and a value expected: unchanged and still absent.
  r = store_->CompareSet("nobody", "x", "y");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->swapped);
  EXPECT_EQ(r->current, std::nullopt);
  EXPECT_FALSE(store_->Check(Keys{"nobody"}).value_or(true));
  // An empty value is a value, not absence.
  ASSERT_TRUE(store_->Set("empty", "").ok());
  r = store_->CompareSet("empty", std::nullopt, "z");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->swapped);
  EXPECT_EQ(r->current, "");
}

TEST_P(StoreTest, CompareSetWakesAGetWaitingForTheKey) {
  std::unique_ptr<Store> getter_store = NewClient();
  std::optional<Result<std::string>> got;
  std::jthread getter([&] { got = getter_store->Get("elected", Far()); });
  AwaitBlockedCallers(1);
  ASSERT_TRUE(store_->CompareSet("elected", std::nullopt, "me").ok());
  getter.join();
  EXPECT_EQ(got->value_or(""), "me");
}

TEST_P(StoreTest, DeleteRemovesTheKeyAndSaysWhetherItExisted) {
  ASSERT_TRUE(store_->Set("k", "v").ok());
  EXPECT_TRUE(store_->Delete("k").value_or(false));
  EXPECT_FALSE(store_->Check(Keys{"k"}).value_or(true));
  EXPECT_FALSE(store_->Delete("k").value_or(true));
}

TEST_P(StoreTest, CheckIsTrueOnlyWhenEveryKeyExists) {
  EXPECT_TRUE(store_->Check({}).value_or(false));
  ASSERT_TRUE(store_->Set("x", "1").ok());
  EXPECT_TRUE(store_->Check(Keys{"x"}).value_or(false));
  EXPECT_FALSE(store_->Check(Keys{"x", "y"}).value_or(true));
  ASSERT_TRUE(store_->Set("y", "2").ok());
  EXPECT_TRUE(store_->Check(Keys{"x", "y"}).value_or(false));
}

TEST_P(StoreTest, OversizeOrEmptyKeysAndOversizeValuesAreInvalidArgument) {
  const std::string long_key(kMaxKeyBytes + 1, 'k');
  const std::string big_value(kMaxValueBytes + 1, 'v');
  EXPECT_EQ(store_->Set(long_key, "v").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->Set("", "v").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->Get(long_key, Far()).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->Add(long_key, 1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->Wait(Keys{"ok", long_key}, Far()).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->Check(Keys{long_key}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->Delete(long_key).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->Set("k", big_value).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->CompareSet("k", std::nullopt, big_value).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->CompareSet("k", big_value, "v").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(store_->Check(Keys{"k"}).value_or(true));
}

TEST_P(StoreTest, KeysAndValuesAtTheLimitsAreAccepted) {
  const std::string max_key(kMaxKeyBytes, 'k');
  std::string max_value(kMaxValueBytes, 'v');
  max_value.back() = 'w';
  ASSERT_TRUE(store_->Set(max_key, max_value).ok());
  Result<std::string> got = store_->Get(max_key, Far());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == max_value);
}

TEST_P(StoreTest, PrefixViewsHaveDisjointKeySpaces) {
  std::unique_ptr<Store> a = WithPrefix(store_.get(), "a/");
  std::unique_ptr<Store> b = WithPrefix(store_.get(), "b/");
  ASSERT_TRUE(a->Set("k", "from a").ok());
  EXPECT_FALSE(b->Check(Keys{"k"}).value_or(true));
  EXPECT_EQ(store_->Get("a/k", Far()).value_or(""), "from a");
  EXPECT_EQ(b->Add("n", 2).value_or(0), 2);
  EXPECT_EQ(a->Add("n", 5).value_or(0), 5);
  std::unique_ptr<Store> ab = WithPrefix(a.get(), "b/");  // views nest
  EXPECT_EQ(ab->Add("n", 1).value_or(0), 1);
  EXPECT_EQ(store_->Get("a/b/n", Far()).value_or(""), "1");
  EXPECT_EQ(a->Set("", "v").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(a->clock(), store_->clock());
}

// A cancellable view waits as its base does until cancelled; then its waits give up with
// kAborted instead of at their deadline (a rendezvous a newer generation made pointless).
TEST(CancellableStoreTest, WaitsGiveUpOnceCancelledAndOtherwiseWaitAsTheBaseDoes) {
  HashStore base;  // the real clock
  std::atomic<bool> cancelled{false};
  std::unique_ptr<Store> view = WithCancel(&base, &cancelled, std::chrono::milliseconds(10));
  ASSERT_TRUE(view->Set("a", "1").ok());
  EXPECT_EQ(view->Get("a", base.clock()->Now()).value_or(""), "1");
  EXPECT_EQ(view->Add("n", 2).value_or(0), 2);
  // Past its deadline it says what the base says, after several slices.
  Result<std::string> late = view->Get("b", base.clock()->Now() + std::chrono::milliseconds(50));
  EXPECT_EQ(late.status().code(), ErrorCode::kDeadlineExceeded) << late.status();
  // Another thread waits for a key nobody sets; cancelling ends its wait long before a
  // minute has passed (whether it began waiting before or after).
  Status waited;
  std::thread waiter(
      [&] { waited = view->Wait(Keys{"never"}, base.clock()->Now() + std::chrono::seconds(60)); });
  cancelled.store(true);
  waiter.join();
  EXPECT_EQ(waited.code(), ErrorCode::kAborted) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("key \"never\": cancelled"));
  EXPECT_EQ(view->Get("a", base.clock()->Now() + std::chrono::seconds(60)).status().code(),
            ErrorCode::kAborted);
  EXPECT_TRUE(view->Set("c", "still").ok());  // what does not wait goes on
}

// ---------------------------------------------------------------------------------------
// Generations.

TEST_P(StoreTest, TheFirstGenerationIsZero) {
  EXPECT_EQ(CurrentGeneration(*store_).value_or(-1), 0);
}

TEST_P(StoreTest, RacingAdvancesFromOneGenerationMakeExactlyOneStep) {
  for (int64_t g = 0; g < 3; ++g) ASSERT_TRUE(AdvanceGeneration(*store_, g).ok());
  constexpr int kSurvivors = 4;
  std::vector<std::unique_ptr<Store>> clients = NewClients(kSurvivors);
  std::vector<std::optional<Result<GenerationAdvance>>> results(kSurvivors);
  {
    std::latch start(kSurvivors);
    std::vector<std::jthread> threads;
    for (int t = 0; t < kSurvivors; ++t) {
      threads.emplace_back([&, t] {
        start.arrive_and_wait();
        results[t] = AdvanceGeneration(*clients[t], 3);
      });
    }
  }
  int advanced = 0;
  for (const auto& r : results) {
    ASSERT_TRUE(r->ok()) << r->status();
    EXPECT_EQ((*r)->generation, 4);
    advanced += (*r)->advanced ? 1 : 0;
  }
  EXPECT_EQ(advanced, 1);
  EXPECT_EQ(CurrentGeneration(*store_).value_or(-1), 4);
}

TEST_P(StoreTest, AdvancingFromAPastGenerationReportsTheCurrentOne) {
  Result<GenerationAdvance> r = AdvanceGeneration(*store_, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->advanced);
  EXPECT_EQ(r->generation, 1);
  ASSERT_TRUE(AdvanceGeneration(*store_, 1).ok());
  r = AdvanceGeneration(*store_, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->advanced);
  EXPECT_EQ(r->generation, 2);
  EXPECT_EQ(AdvanceGeneration(*store_, 7).status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(AdvanceGeneration(*store_, -1).status().code(), ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------
// Rendezvous.

// Runs `world_size` members of `generation` as threads, each on its own client, with
// addresses "host<i>:29500"; returns each member's result in thread order.
std::vector<Result<RendezvousResult>> RunRendezvous(std::vector<std::unique_ptr<Store>>& clients,
                                                    int64_t generation, int world_size,
                                                    TimePoint deadline) {
  std::vector<std::optional<Result<RendezvousResult>>> results(clients.size());
  {
    std::vector<std::jthread> threads;
    for (size_t t = 0; t < clients.size(); ++t) {
      threads.emplace_back([&, t] {
        results[t] = Rendezvous(*clients[t], {.generation = generation,
                                              .address = "host" + std::to_string(t) + ":29500",
                                              .world_size = world_size,
                                              .deadline = deadline});
      });
    }
  }
  std::vector<Result<RendezvousResult>> out;
  for (auto& r : results) out.push_back(*std::move(r));
  return out;
}

class RendezvousStoreTest : public StoreTest {
 protected:
  std::vector<Result<RendezvousResult>> Run(int64_t generation, int members, int world_size) {
    std::vector<std::unique_ptr<Store>> clients = NewClients(members);
    return RunRendezvous(clients, generation, world_size, Far());
  }

  // Checks that `results` form one complete group of generation `g`.
  static void ExpectOneGroup(const std::vector<Result<RendezvousResult>>& results, int64_t g) {
    const int n = static_cast<int>(results.size());
    std::vector<std::string> addresses;
    for (int t = 0; t < n; ++t) addresses.push_back("host" + std::to_string(t) + ":29500");
    std::set<int> ranks;
    for (int t = 0; t < n; ++t) {
      ASSERT_TRUE(results[t].ok()) << results[t].status();
      const RendezvousResult& r = *results[t];
      EXPECT_EQ(r.generation, g);
      EXPECT_EQ(r.world_size, n);
      ranks.insert(r.rank);
      ASSERT_EQ(r.addresses.size(), static_cast<size_t>(n));
      EXPECT_EQ(r.addresses[r.rank], addresses[t]);   // ours is under our rank
      EXPECT_EQ(r.addresses, results[0]->addresses);  // everyone sees the same list
      EXPECT_THAT(r.addresses, UnorderedElementsAreArray(addresses));
    }
    EXPECT_EQ(ranks.size(), static_cast<size_t>(n));
    EXPECT_EQ(*ranks.begin(), 0);
    EXPECT_EQ(*ranks.rbegin(), n - 1);
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, RendezvousStoreTest,
                         ::testing::Values(Backend::kHash, Backend::kTcp), BackendName);

TEST_P(RendezvousStoreTest, AssignsRanksZeroToNMinusOneOnceAndSharesEveryAddress) {
  // World sizes 1, a non-power of two, and a power of two, one generation each.
  int64_t generation = 0;
  for (int world_size : {1, 3, 4}) {
    SCOPED_TRACE("world_size=" + std::to_string(world_size));
    ExpectOneGroup(Run(generation, world_size, world_size), generation);
    Result<GenerationAdvance> next = AdvanceGeneration(*store_, generation);
    ASSERT_TRUE(next.ok()) << next.status();
    generation = next->generation;
  }
}

TEST_P(RendezvousStoreTest, AnOldGenerationsMembersDoNotAffectTheNextGeneration) {
  ExpectOneGroup(Run(0, 2, 2), 0);
  ASSERT_TRUE(AdvanceGeneration(*store_, 0).ok());
  // A member still in generation 0 cannot join it any more...
  Result<RendezvousResult> stale = Rendezvous(
      *store_, {.generation = 0, .address = "stale:1", .world_size = 2, .deadline = Far()});
  EXPECT_EQ(stale.status().code(), ErrorCode::kAborted);
  // ...and whatever it writes lands in generation 0's key space.
  std::unique_ptr<Store> old = WithPrefix(store_.get(), GenerationPrefix(0));
  ASSERT_TRUE(old->Set("rdzv/addr/0", "stale:1").ok());
  ASSERT_TRUE(old->Add("rdzv/arrivals", 1).ok());
  ASSERT_TRUE(old->Set("rdzv/world_size", "7").ok());
  ExpectOneGroup(Run(1, 2, 2), 1);
  std::unique_ptr<Store> next = WithPrefix(store_.get(), GenerationPrefix(1));
  EXPECT_EQ(next->Add("rdzv/arrivals", 0).value_or(-1), 2);
}

TEST_P(RendezvousStoreTest, AMemberBeyondTheWorldSizeIsAborted) {
  ExpectOneGroup(Run(0, 1, 1), 0);
  Result<RendezvousResult> late = Rendezvous(
      *store_, {.generation = 0, .address = "late:1", .world_size = 1, .deadline = Far()});
  EXPECT_EQ(late.status().code(), ErrorCode::kAborted);
}

TEST_P(RendezvousStoreTest, MembersDisagreeingOnTheWorldSizeFail) {
  ASSERT_TRUE(store_->Set(GenerationPrefix(0) + "rdzv/world_size", "3").ok());
  Result<RendezvousResult> r =
      Rendezvous(*store_, {.generation = 0, .address = "a:1", .world_size = 2, .deadline = Far()});
  EXPECT_EQ(r.status().code(), ErrorCode::kFailedPrecondition);
}

TEST_P(RendezvousStoreTest, AGenerationNotYetStartedCannotBeJoined) {
  Result<RendezvousResult> r =
      Rendezvous(*store_, {.generation = 1, .address = "a:1", .world_size = 1, .deadline = Far()});
  EXPECT_EQ(r.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(
      Rendezvous(*store_, {.generation = 0, .address = "a", .world_size = 0, .deadline = Far()})
          .status()
          .code(),
      ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------
// HashStore deadlines on the fake clock.

class HashStoreTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  HashStore store_{&clock_};
};

TEST_F(HashStoreTest, GetGivesUpAtTheDeadlineNamingTheKey) {
  std::optional<Result<std::string>> got;
  std::jthread getter([&] { got = store_.Get("missing", clock_.Now() + std::chrono::seconds(5)); });
  clock_.BlockUntilWaiters(1);
  clock_.Advance(std::chrono::seconds(5));
  getter.join();
  EXPECT_EQ(got->status().code(), ErrorCode::kDeadlineExceeded);
  EXPECT_THAT(got->status().message(), HasSubstr("\"missing\""));
}

TEST_F(HashStoreTest, WaitGivesUpAtTheDeadline) {
  ASSERT_TRUE(store_.Set("here", "1").ok());
  std::optional<Status> waited;
  const std::vector<std::string> keys = {"here", "absent"};
  std::jthread waiter([&] { waited = store_.Wait(keys, clock_.Now() + std::chrono::seconds(1)); });
  clock_.BlockUntilWaiters(1);
  clock_.Advance(std::chrono::seconds(1));
  waiter.join();
  EXPECT_EQ(waited->code(), ErrorCode::kDeadlineExceeded);
  EXPECT_THAT(waited->message(), HasSubstr("\"absent\""));
}

TEST_F(HashStoreTest, GetOfAnExistingKeyAnswersEvenPastTheDeadline) {
  ASSERT_TRUE(store_.Set("k", "v").ok());
  EXPECT_EQ(store_.Get("k", clock_.Now() - std::chrono::seconds(1)).value_or(""), "v");
  EXPECT_EQ(store_.Get("absent", clock_.Now()).status().code(), ErrorCode::kDeadlineExceeded);
}

TEST_F(HashStoreTest, RendezvousGivesUpWhenAMemberNeverArrives) {
  std::vector<std::optional<Result<RendezvousResult>>> results(2);
  const TimePoint deadline = clock_.Now() + std::chrono::seconds(30);
  {
    std::vector<std::jthread> members;
    for (int t = 0; t < 2; ++t) {
      members.emplace_back([&, t] {
        results[t] = Rendezvous(store_, {.generation = 0,
                                         .address = "m" + std::to_string(t),
                                         .world_size = 3,
                                         .deadline = deadline});
      });
    }
    clock_.BlockUntilWaiters(2);
    clock_.Advance(std::chrono::seconds(30));
  }
  for (const auto& r : results) {
    EXPECT_EQ(r->status().code(), ErrorCode::kDeadlineExceeded);
  }
}

}  // namespace
}  // namespace kc::comm
