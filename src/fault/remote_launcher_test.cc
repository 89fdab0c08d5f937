// A supervisor's RemoteLauncher and the host shares it drives, every host a thread of this
// process with a ThreadLauncher for its ranks, all on one in-memory store: ranks start on the
// hosts their placement names, what they say comes back, a share cut off from the store kills
// its ranks while the launcher takes them for lost, replacements go to hosts that are up, a
// host that comes back takes ranks again, and so does a host the run is given while it runs.
#include "fault/remote_launcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <optional>
#include <thread>

#include "base/mutex.h"
#include "base/notification.h"
#include "comm/hash_store.h"
#include "fault/thread_launcher.h"

namespace kc::fault {
namespace {

using ::testing::HasSubstr;

// A view of a store that a test can cut off, as a host whose link went down: every call fails.
class CuttableStore final : public comm::Store {
 public:
  explicit CuttableStore(comm::Store* base) : base_(base) {}
  void Cut(bool cut) { cut_.store(cut); }

  Status Set(std::string_view k, std::string_view v) override {
    return cut_ ? Cut() : base_->Set(k, v);
  }
  Result<std::string> Get(std::string_view k, TimePoint d) override {
    if (cut_) return Cut();
    return base_->Get(k, d);
  }
  Status Wait(std::span<const std::string> k, TimePoint d) override {
    return cut_ ? Cut() : base_->Wait(k, d);
  }
  Result<int64_t> Add(std::string_view k, int64_t d) override {
    if (cut_) return Cut();
    return base_->Add(k, d);
  }
  Result<comm::CompareSetResult> CompareSet(std::string_view k, std::optional<std::string_view> e,
                                            std::string_view d) override {
    if (cut_) return Cut();
    return base_->CompareSet(k, e, d);
  }
  Result<bool> Delete(std::string_view k) override {
    if (cut_) return Cut();
    return base_->Delete(k);
  }
  Result<bool> Check(std::span<const std::string> k) override {
    if (cut_) return Cut();
    return base_->Check(k);
  }
  Clock* clock() const override { return base_->clock(); }

 private:
  static Status Cut() { return UnavailableError("cut off"); }
  comm::Store* const base_;
  std::atomic<bool> cut_{false};
};

// What the supervisor would see.
class Events final : public RankEvents {
 public:
  void OnOutput(int worker, std::string line) override {
    MutexLock lock(&mu_);
    output_[worker].push_back(std::move(line));
    cv_.SignalAll();
  }
  void OnReport(int worker, Report report) override {
    MutexLock lock(&mu_);
    if (std::holds_alternative<ReadyReport>(report)) ++ready_[worker];
    cv_.SignalAll();
  }
  void OnExit(int worker, RankExit exit) override {
    MutexLock lock(&mu_);
    EXPECT_EQ(exits_.count(worker), 0u) << "a second exit of worker " << worker;
    exits_[worker] = std::move(exit);
    cv_.SignalAll();
  }
  // Its exit, once it came (within a minute).
  std::optional<RankExit> AwaitExit(int worker) {
    MutexLock lock(&mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (exits_.count(worker) == 0 && cv_.WaitUntil(&mu_, deadline)) {
    }
    auto e = exits_.find(worker);
    return e == exits_.end() ? std::nullopt : std::optional<RankExit>(e->second);
  }
  std::vector<std::string> OutputOf(int worker) {
    MutexLock lock(&mu_);
    return output_[worker];
  }
  int ReadyOf(int worker) {
    MutexLock lock(&mu_);
    return ready_[worker];
  }
  // Whether it reported it is up (within a minute).
  bool AwaitReady(int worker) {
    MutexLock lock(&mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (ready_[worker] == 0 && cv_.WaitUntil(&mu_, deadline)) {
    }
    return ready_[worker] > 0;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::map<int, std::vector<std::string>> output_ KC_GUARDED_BY(mu_);
  std::map<int, int> ready_ KC_GUARDED_BY(mu_);
  std::map<int, RankExit> exits_ KC_GUARDED_BY(mu_);
};

// One host: its share on a thread, its ranks threads of a ThreadLauncher. A rank says where it
// runs, reports once, then ends at once or runs until stopped or killed.
class Host {
 public:
  Host(comm::Store* store, std::string name, bool run_until_stopped)
      : name_(std::move(name)),
        view_(store),
        launcher_({.store = &view_, .body = [this, run_until_stopped](RankContext& rank) {
                     rank.Output("worker " + std::to_string(rank.worker()) + " on " + name_ +
                                 (rank.join() ? " (joined)" : ""));
                     rank.observer()->OnReport(ReadyReport{.worker = rank.worker()});
                     if (!run_until_stopped) return OkStatus();
                     Notification killed;
                     auto hook = rank.OnKill([&](Status) { killed.Notify(); });
                     // A stop sets the flag; a kill notifies.
                     while (
                         !rank.stop_requested()->load() &&
                         !killed.WaitForNotificationWithDeadline(
                             Clock::Real(), Clock::Real()->Now() + std::chrono::milliseconds(5))) {
                     }
                     return OkStatus();
                   }}) {}
  ~Host() { Join().IgnoreError(); }

  void Serve() {
    thread_ = std::thread([this] {
      served_ = ServeHostShare({.store = &view_,
                                .host = name_,
                                .launcher = &launcher_,
                                .beat_period = std::chrono::milliseconds(20),
                                .fence_after = std::chrono::milliseconds(400)});
    });
  }
  Status Join() {
    if (thread_.joinable()) thread_.join();
    return served_;
  }
  void Cut(bool cut) { view_.Cut(cut); }

 private:
  const std::string name_;
  CuttableStore view_;
  ThreadLauncher launcher_;
  std::thread thread_;
  Status served_ = InternalError("not served");
};

RemoteLauncherOptions Options(comm::Store* store, std::vector<RemoteHost> hosts) {
  return {.store = store,
          .hosts = std::move(hosts),
          .share_timeout = std::chrono::milliseconds(400),
          .poll = std::chrono::milliseconds(5)};
}

TEST(RemoteLauncherTest, RanksStartOnTheirHostsAndWhatTheyDoComesBack) {
  comm::HashStore store;
  Host h1(&store, "h1", false), h2(&store, "h2", false);
  auto launcher = RemoteLauncher::Create(Options(&store, {{"h1", 1}, {"h2", 2}}));
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  Events events;
  for (int w = 0; w < 3; ++w) ASSERT_TRUE((*launcher)->Start({.worker = w}, &events).ok());
  // The shares may come up after the starts were queued.
  h1.Serve();
  h2.Serve();
  for (int w = 0; w < 3; ++w) {
    std::optional<RankExit> e = events.AwaitExit(w);
    ASSERT_TRUE(e.has_value()) << w;
    EXPECT_TRUE(e->ok) << e->description;
    EXPECT_EQ(events.ReadyOf(w), 1) << w;
  }
  EXPECT_THAT(events.OutputOf(0), ::testing::ElementsAre("worker 0 on h1"));
  EXPECT_THAT(events.OutputOf(1), ::testing::ElementsAre("worker 1 on h2"));
  EXPECT_THAT(events.OutputOf(2), ::testing::ElementsAre("worker 2 on h2"));
  EXPECT_EQ((*launcher)->HostOf(2), "h2");
  // A fourth worker of the first generation has no slot.
  EXPECT_EQ((*launcher)->Start({.worker = 3}, &events).code(), ErrorCode::kUnavailable);
  (*launcher)->Finish();
  EXPECT_TRUE(h1.Join().ok());
  EXPECT_TRUE(h2.Join().ok());
}

// What a share's launcher was asked to start; each rank ends at once.
class Recorder final : public ProcessLauncher {
 public:
  Status Start(const RankLaunch& launch, RankEvents* events) override {
    {
      MutexLock lock(&mu_);
      launches_.push_back(launch);
    }
    events->OnExit(launch.worker, {.ok = true, .description = "exited with status 0"});
    return OkStatus();
  }
  void Signal(int, RankSignal) override {}
  std::vector<RankLaunch> launches() const {
    MutexLock lock(&mu_);
    return launches_;
  }

 private:
  mutable Mutex mu_;
  std::vector<RankLaunch> launches_ KC_GUARDED_BY(mu_);
};

// A command run's contract travels with the start: the host's launcher gets the rank's
// variables as the supervisor gave them.
TEST(RemoteLauncherTest, AStartCarriesItsRanksEnvironmentToItsHost) {
  comm::HashStore store;
  Recorder recorder;
  Status served = InternalError("not served");
  std::thread share([&] {
    served = ServeHostShare({.store = &store,
                             .host = "h1",
                             .launcher = &recorder,
                             .beat_period = std::chrono::milliseconds(20),
                             .fence_after = std::chrono::milliseconds(400)});
  });
  auto launcher = RemoteLauncher::Create(Options(&store, {{"h1", 1}}));
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  Events events;
  const std::vector<std::pair<std::string, std::string>> env = {{"RANK", "0"},
                                                                {"MASTER_ADDR", "10.0.0.1"}};
  ASSERT_TRUE((*launcher)->Start({.worker = 0, .env = env}, &events).ok());
  std::optional<RankExit> e = events.AwaitExit(0);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->ok) << e->description;
  (*launcher)->Finish();
  share.join();
  EXPECT_TRUE(served.ok()) << served;
  ASSERT_EQ(recorder.launches().size(), 1u);
  EXPECT_EQ(recorder.launches()[0].env, env);
}

TEST(RemoteLauncherTest, AStopReachesTheRankThroughItsHost) {
  comm::HashStore store;
  Host h1(&store, "h1", true);
  auto launcher = RemoteLauncher::Create(Options(&store, {{"h1", 1}}));
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  Events events;
  h1.Serve();
  ASSERT_TRUE((*launcher)->Start({.worker = 0}, &events).ok());
  (*launcher)->Signal(0, RankSignal::kStop);  // queued behind its start
  std::optional<RankExit> e = events.AwaitExit(0);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->ok) << e->description;
  (*launcher)->Finish();
  EXPECT_TRUE(h1.Join().ok());
}

TEST(RemoteLauncherTest, AHostCutOffKillsItsRanksWhileTheLauncherTakesThemForLost) {
  comm::HashStore store;
  Host h1(&store, "h1", true), h2(&store, "h2", true);
  auto launcher = RemoteLauncher::Create(Options(&store, {{"h1", 2}, {"h2", 1}}));
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  Events events;
  h1.Serve();
  h2.Serve();
  ASSERT_TRUE((*launcher)->Start({.worker = 0}, &events).ok());  // h1
  ASSERT_TRUE((*launcher)->Start({.worker = 1}, &events).ok());  // h1
  ASSERT_TRUE((*launcher)->Start({.worker = 2}, &events).ok());  // h2
  // Worker 1 gives its slot back, so a replacement has room on h1 when h2 is gone.
  (*launcher)->Signal(1, RankSignal::kStop);
  ASSERT_TRUE(events.AwaitExit(1).has_value());
  // Every rank has said where it runs: each is up.
  for (int w : {0, 2}) ASSERT_TRUE(events.AwaitReady(w)) << w;

  h2.Cut(true);
  // The share ends by itself, having killed its rank: it trains on nowhere.
  Status served = h2.Join();
  EXPECT_EQ(served.code(), ErrorCode::kUnavailable) << served;
  EXPECT_THAT(served.message(), HasSubstr("its ranks were killed"));
  // The launcher, not hearing from h2, takes its rank for lost.
  std::optional<RankExit> lost = events.AwaitExit(2);
  ASSERT_TRUE(lost.has_value());
  EXPECT_TRUE(lost->killed);
  EXPECT_THAT(lost->description, HasSubstr("host h2"));
  EXPECT_THAT(lost->description, HasSubstr("taken for lost"));

  // A replacement goes to the host that is up with a free slot: h1.
  ASSERT_TRUE((*launcher)->Start({.worker = 3, .join = true}, &events).ok());
  EXPECT_EQ((*launcher)->HostOf(3), "h1");
  ASSERT_TRUE(events.AwaitReady(3));
  EXPECT_THAT(events.OutputOf(3), ::testing::ElementsAre("worker 3 on h1 (joined)"));
  // h1 is full now; none other is up.
  EXPECT_EQ((*launcher)->Start({.worker = 4, .join = true}, &events).code(),
            ErrorCode::kUnavailable);

  // h2 comes back (a new share): it takes ranks again.
  h2.Cut(false);
  h2.Serve();
  Status started = UnavailableError("");
  while (!started.ok()) {  // until the launcher has seen h2 up
    std::this_thread::yield();
    started = (*launcher)->Start({.worker = 4, .join = true}, &events);
  }
  EXPECT_EQ((*launcher)->HostOf(4), "h2");
  ASSERT_TRUE(events.AwaitReady(4));

  // A kill of a rank whose host is up goes through its share.
  (*launcher)->Signal(4, RankSignal::kKill);
  std::optional<RankExit> killed = events.AwaitExit(4);
  ASSERT_TRUE(killed.has_value());
  EXPECT_TRUE(killed->killed) << killed->description;
  for (int w : {0, 3}) (*launcher)->Signal(w, RankSignal::kStop);
  for (int w : {0, 3}) ASSERT_TRUE(events.AwaitExit(w).has_value());
  (*launcher)->Finish();
  EXPECT_TRUE(h1.Join().ok());
  EXPECT_TRUE(h2.Join().ok());
}

TEST(RemoteLauncherTest, ASignalToARankWhoseHostNeverCameUpEndsItAtOnce) {
  comm::HashStore store;
  auto launcher = RemoteLauncher::Create(Options(&store, {{"h1", 2}}));
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  Events events;
  ASSERT_TRUE((*launcher)->Start({.worker = 0}, &events).ok());
  (*launcher)->Signal(0, RankSignal::kKill);
  std::optional<RankExit> e = events.AwaitExit(0);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->killed);
  EXPECT_THAT(e->description, HasSubstr("killed before it started: host h1 has no share up"));
  // A stop ends one that never ran as well: it had nothing to save.
  ASSERT_TRUE((*launcher)->Start({.worker = 1}, &events).ok());
  (*launcher)->Signal(1, RankSignal::kStop);
  std::optional<RankExit> stopped = events.AwaitExit(1);
  ASSERT_TRUE(stopped.has_value());
  EXPECT_TRUE(stopped->ok) << stopped->description;
}

// The run's placement changes while it runs (kcd grows it onto another host, or shrinks it off
// one): a host given slots whose share is not up yet takes a replacement, which waits there for
// the share; a host left out keeps its ranks, now overplaced, the first a shrink retires.
TEST(RemoteLauncherTest, AHostGivenSlotsLaterTakesRanksOnceItsShareIsUp) {
  comm::HashStore store;
  Host h1(&store, "h1", true), h3(&store, "h3", true);
  auto launcher = RemoteLauncher::Create(Options(&store, {{"h1", 2}}));
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  Events events;
  h1.Serve();
  ASSERT_TRUE((*launcher)->Start({.worker = 0}, &events).ok());
  ASSERT_TRUE((*launcher)->Start({.worker = 1}, &events).ok());
  for (int w : {0, 1}) ASSERT_TRUE(events.AwaitReady(w)) << w;
  EXPECT_TRUE((*launcher)->Overplaced().empty());
  // h1 is full, and no other host is known.
  EXPECT_EQ((*launcher)->Start({.worker = 2, .join = true}, &events).code(),
            ErrorCode::kUnavailable);

  // h3 joins the run before its share is up: a replacement goes there and waits for it.
  ASSERT_TRUE((*launcher)->SetHosts({{"h1", 2}, {"h3", 2}}).ok());
  ASSERT_TRUE((*launcher)->Start({.worker = 2, .join = true}, &events).ok());
  ASSERT_TRUE((*launcher)->Start({.worker = 3, .join = true}, &events).ok());
  EXPECT_EQ((*launcher)->HostOf(2), "h3");
  EXPECT_EQ((*launcher)->HostOf(3), "h3");
  EXPECT_EQ((*launcher)->Start({.worker = 4, .join = true}, &events).code(),
            ErrorCode::kUnavailable);
  h3.Serve();
  for (int w : {2, 3}) ASSERT_TRUE(events.AwaitReady(w)) << w;
  EXPECT_THAT(events.OutputOf(2), ::testing::ElementsAre("worker 2 on h3 (joined)"));

  // h1 gives up its slots: its ranks are overplaced, the newest first to go when one must.
  ASSERT_TRUE((*launcher)->SetHosts({{"h1", 1}, {"h3", 2}}).ok());
  EXPECT_THAT((*launcher)->Overplaced(), ::testing::ElementsAre(1));
  ASSERT_TRUE((*launcher)->SetHosts({{"h3", 2}}).ok());
  EXPECT_THAT((*launcher)->Overplaced(), ::testing::ElementsAre(0, 1));
  (*launcher)->Signal(1, RankSignal::kKill);
  ASSERT_TRUE(events.AwaitExit(1).has_value());
  EXPECT_THAT((*launcher)->Overplaced(), ::testing::ElementsAre(0));
  EXPECT_EQ((*launcher)->SetHosts({{"h3", 1}, {"h3", 1}}).code(), ErrorCode::kInvalidArgument);

  for (int w : {0, 2, 3}) (*launcher)->Signal(w, RankSignal::kStop);
  for (int w : {0, 2, 3}) ASSERT_TRUE(events.AwaitExit(w).has_value());
  (*launcher)->Finish();
  EXPECT_TRUE(h1.Join().ok());
  EXPECT_TRUE(h3.Join().ok());
  EXPECT_EQ((*launcher)->SetHosts({{"h1", 2}}).code(), ErrorCode::kFailedPrecondition);
}

TEST(RemoteLauncherTest, BadHostsAreRefused) {
  comm::HashStore store;
  EXPECT_EQ(RemoteLauncher::Create(Options(&store, {})).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_THAT(RemoteLauncher::Create(Options(&store, {{"h1", 0}})).status().message(),
              HasSubstr("h1 has no slots"));
  EXPECT_THAT(RemoteLauncher::Create(Options(&store, {{"h1", 1}, {"h1", 1}})).status().message(),
              HasSubstr("given twice"));
  EXPECT_EQ(RemoteLauncher::Create(Options(nullptr, {{"h1", 1}})).status().code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kc::fault
