#include "base/layer_guard.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"

namespace kc {
namespace {

// A miniature stack of layers with guarded entry points, as real modules declare them.
struct FaultRunner {  // L5
  int entered = 0;
  Status OnPeerLost() {
    KC_LAYER_ENTRY(Layer::kFault, "runner");
    ++entered;
    return OkStatus();
  }
};

struct Transport {  // L2: runs a completion callback the upper layer registered
  std::function<Status()> on_complete;
  Status Complete() {
    KC_LAYER_ENTRY(Layer::kComm, "transport");
    return on_complete();
  }
  Result<int> Send() {
    KC_LAYER_ENTRY(Layer::kComm, "transport");
    return 42;
  }
};

struct Detector {  // L5 peers: one detector per node
  Detector* peer = nullptr;
  Status AwaitVerdict() {
    KC_LAYER_BLOCKING_ENTRY(Layer::kFault, "detector", this);
    return OkStatus();
  }
  Status AskPeerBlocking() {
    KC_LAYER_ENTRY(Layer::kFault, "detector");
    return peer->AwaitVerdict();
  }
  Status AskSelfBlocking() {
    KC_LAYER_BLOCKING_ENTRY(Layer::kFault, "detector", this);
    return AwaitVerdict();
  }
};

// Collects the monitor's owner and admin events for the life of the object.
class AlertSink {
 public:
  AlertSink() {
    BoundaryMonitor::Global().SetEventBus(&bus_);
    owner_sub_ = *bus_.Subscribe<Violation>(BoundaryOwnerTopic(),
                                            [this](const Violation& v) { owner.push_back(v); });
    admin_sub_ = *bus_.Subscribe<Violation>(BoundaryAdminTopic(),
                                            [this](const Violation& v) { admin.push_back(v); });
  }
  ~AlertSink() { BoundaryMonitor::Global().SetEventBus(nullptr); }
  // Waits until every event published so far has been delivered.
  void Flush() { ASSERT_TRUE(bus_.Flush().ok()); }

  std::vector<Violation> owner, admin;  // written on the bus thread; read after Flush()

 private:
  EventBus bus_;
  Subscription owner_sub_, admin_sub_;  // declared after bus_: cancelled before it goes
};

class LayerGuardTest : public ::testing::Test {
 protected:
  void SetUp() override { BoundaryMonitor::Global().Reset(); }
  void TearDown() override {
    BoundaryMonitor::Global().SetEventBus(nullptr);
    BoundaryMonitor::Global().SetPolicy(MonitorPolicy::Development());
    BoundaryMonitor::Global().Reset();
  }
  void SetLevels(AlertLevel upward, AlertLevel peer) {
    BoundaryMonitor::Global().SetPolicy({.upward_call = upward, .peer_blocking_call = peer});
  }
  // Plants an upward call: L2 code runs a callback that enters an L5 entry point.
  Status PlantUpwardCall(FaultRunner* runner) {
    Transport t;
    t.on_complete = [runner] { return runner->OnPeerLost(); };
    return t.Complete();
  }
};

TEST_F(LayerGuardTest, DownwardCallsAreNotViolations) {
  Transport t;
  auto api_entry = [&]() -> Result<int> {
    KC_LAYER_ENTRY(Layer::kApi, "jobs");
    return t.Send();
  };
  Result<int> r = api_entry();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 42);
  EXPECT_EQ(BoundaryMonitor::Global().count(ViolationKind::kUpwardCall), 0u);
}

TEST_F(LayerGuardTest, UpwardCallAtInfoIsLoggedAndProceeds) {
  SetLevels(AlertLevel::kInfo, AlertLevel::kInfo);
  AlertSink alerts;
  FaultRunner runner;
  log::StartCapture();
  EXPECT_TRUE(PlantUpwardCall(&runner).ok());
  const std::string logged = log::StopCapture();
  alerts.Flush();
  EXPECT_EQ(runner.entered, 1);
  EXPECT_EQ(BoundaryMonitor::Global().count(ViolationKind::kUpwardCall), 1u);
  EXPECT_NE(logged.find("boundary violation kind=upward_call level=info caller=comm/transport "
                        "callee=fault/runner entry=OnPeerLost"),
            std::string::npos)
      << logged;
  EXPECT_TRUE(alerts.owner.empty());
  EXPECT_TRUE(alerts.admin.empty());
  std::vector<Violation> recent = BoundaryMonitor::Global().recent();
  ASSERT_EQ(recent.size(), 1u);
  EXPECT_EQ(recent[0].caller_layer, Layer::kComm);
  EXPECT_EQ(recent[0].callee_layer, Layer::kFault);
  EXPECT_EQ(recent[0].layer_stack.rfind("comm/transport > fault/runner", 0), 0u)
      << recent[0].layer_stack;
  EXPECT_NE(recent[0].stack_trace.find("#0"), std::string::npos);
}

TEST_F(LayerGuardTest, UpwardCallAtWarningNotifiesTheOwnerAndProceeds) {
  SetLevels(AlertLevel::kWarning, AlertLevel::kInfo);
  AlertSink alerts;
  std::vector<Violation>& owner = alerts.owner;
  std::vector<Violation>& admin = alerts.admin;
  FaultRunner runner;
  EXPECT_TRUE(PlantUpwardCall(&runner).ok());
  EXPECT_TRUE(PlantUpwardCall(&runner).ok());
  alerts.Flush();
  EXPECT_EQ(runner.entered, 2);
  ASSERT_EQ(owner.size(), 2u);
  EXPECT_EQ(owner[0].level, AlertLevel::kWarning);
  EXPECT_EQ(owner[0].caller_component, "transport");
  EXPECT_EQ(owner[1].count, 2u);
  EXPECT_TRUE(admin.empty());
}

TEST_F(LayerGuardTest, UpwardCallAtSevereIsRefusedAndAlertsTheAdmin) {
  SetLevels(AlertLevel::kSevere, AlertLevel::kInfo);
  AlertSink alerts;
  std::vector<Violation>& owner = alerts.owner;
  std::vector<Violation>& admin = alerts.admin;
  FaultRunner runner;
  Status s = PlantUpwardCall(&runner);
  alerts.Flush();
  EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("upward_call from comm/transport into fault/runner"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(runner.entered, 0) << "a refused entry point must not run";
  ASSERT_EQ(admin.size(), 1u);
  EXPECT_EQ(admin[0].level, AlertLevel::kSevere);
  EXPECT_FALSE(admin[0].stack_trace.empty());
  EXPECT_TRUE(owner.empty());
  EXPECT_EQ(CurrentLayer(), std::nullopt) << "a refused scope must not stay on the stack";
}

TEST_F(LayerGuardTest, BlockingCallBetweenPeersIsAViolation) {
  SetLevels(AlertLevel::kInfo, AlertLevel::kSevere);
  Detector a, b;
  a.peer = &b;
  Status s = a.AskPeerBlocking();
  EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(BoundaryMonitor::Global().count(ViolationKind::kPeerBlockingCall), 1u);
  EXPECT_EQ(BoundaryMonitor::Global().count(ViolationKind::kUpwardCall), 0u);
}

TEST_F(LayerGuardTest, BlockingCallWithinOneComponentIsFine) {
  Detector a;
  EXPECT_TRUE(a.AskSelfBlocking().ok());
  EXPECT_EQ(BoundaryMonitor::Global().count(ViolationKind::kPeerBlockingCall), 0u);
}

TEST_F(LayerGuardTest, EventBusDeliveryIsTheSanctionedUpwardPath) {
  // Rule 2: L2 publishes, the L5 subscriber runs on the bus thread, with no L2 frame below it.
  EventBus bus;
  FaultRunner runner;
  Status inner;
  const Topic<int> lost{"comm.peer_lost"};
  auto sub = bus.Subscribe<int>(lost, [&](const int&) { inner = runner.OnPeerLost(); });
  auto publish_from_comm = [&]() -> Status {
    KC_LAYER_ENTRY(Layer::kComm, "transport");
    return bus.Publish(lost, 3);
  };
  ASSERT_TRUE(publish_from_comm().ok());
  ASSERT_TRUE(bus.Flush().ok());
  EXPECT_TRUE(inner.ok());
  EXPECT_EQ(runner.entered, 1);
  EXPECT_EQ(BoundaryMonitor::Global().count(ViolationKind::kUpwardCall), 0u);
}

TEST_F(LayerGuardTest, StacksArePerThread) {
  FaultRunner runner;
  Status other_thread;
  auto comm_entry = [&]() -> Status {
    KC_LAYER_ENTRY(Layer::kComm, "transport");
    std::thread t([&] { other_thread = runner.OnPeerLost(); });
    t.join();
    return OkStatus();
  };
  EXPECT_TRUE(comm_entry().ok());
  EXPECT_TRUE(other_thread.ok());
  EXPECT_EQ(BoundaryMonitor::Global().count(ViolationKind::kUpwardCall), 0u);
}

TEST_F(LayerGuardTest, CurrentLayerFollowsTheStack) {
  EXPECT_EQ(CurrentLayer(), std::nullopt);
  auto entry = [&]() -> Status {
    KC_LAYER_ENTRY(Layer::kHal, "device");
    EXPECT_EQ(CurrentLayer(), Layer::kHal);
    return OkStatus();
  };
  EXPECT_TRUE(entry().ok());
  EXPECT_EQ(CurrentLayer(), std::nullopt);
}

TEST_F(LayerGuardTest, LogLinesNameTheExecutingLayer) {
  auto entry = [&]() -> Status {
    KC_LAYER_ENTRY(Layer::kComm, "transport");
    KC_LOG(INFO) << "hello " << log::KV("peer", 3);
    return OkStatus();
  };
  log::SetRank(1, 4);
  log::SetStep(12);
  log::StartCapture();
  EXPECT_TRUE(entry().ok());
  const std::string line = log::StopCapture();
  log::ClearContext();
  EXPECT_NE(line.find("1/4 step=12 layer=comm"), std::string::npos) << line;
  EXPECT_NE(line.find("hello peer=3"), std::string::npos) << line;
}

TEST(MonitorPolicyTest, ModesAreStrictInDevelopmentAndQuieterInProduction) {
  const MonitorPolicy dev = *MonitorPolicy::FromMode("development");
  EXPECT_EQ(dev.upward_call, AlertLevel::kSevere);
  EXPECT_EQ(dev.peer_blocking_call, AlertLevel::kSevere);
  const MonitorPolicy prod = *MonitorPolicy::FromMode("production");
  EXPECT_EQ(prod.upward_call, AlertLevel::kWarning);
  EXPECT_EQ(prod.peer_blocking_call, AlertLevel::kInfo);
  EXPECT_EQ(MonitorPolicy::FromMode("staging").status().code(), ErrorCode::kInvalidArgument);
}

TEST(AlertLevelTest, NamesRoundTrip) {
  for (AlertLevel l : {AlertLevel::kInfo, AlertLevel::kWarning, AlertLevel::kSevere}) {
    EXPECT_EQ(AlertLevelFromName(AlertLevelName(l)), l);
  }
  EXPECT_EQ(AlertLevelFromName("loud"), std::nullopt);
}

}  // namespace
}  // namespace kc
