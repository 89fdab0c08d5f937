#include "fault/restart_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kc::fault {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;

RunOutcome BelowMinimum() {
  FaultEvent cause{.kind = FaultEvent::Kind::kDetected, .worker = 1};
  cause.below_minimum = true;
  cause.alive = 1;
  cause.min_ranks = 2;
  return {.end = RunOutcome::End::kBelowMinimum, .cause = cause, .faults = 1};
}

TEST(RestartPolicyTest, BelowTheMinimumIsRequeuedWithADoublingBackoffUpToMaxRestarts) {
  const RestartPolicy policy{.max_restarts = 3, .backoff = seconds(10), .max_backoff = seconds(30)};
  const seconds expected[] = {seconds(10), seconds(20), seconds(30)};
  for (int done = 0; done < 3; ++done) {
    RestartDecision d = DecideRestart(policy, BelowMinimum(), done);
    EXPECT_TRUE(d.requeue) << done;
    EXPECT_EQ(d.restart, done + 1);
    EXPECT_EQ(d.delay, expected[done]);
    EXPECT_THAT(d.reason, HasSubstr("1 ranks left, below the minimum 2"));
  }
  RestartDecision last = DecideRestart(policy, BelowMinimum(), 3);
  EXPECT_FALSE(last.requeue);
  EXPECT_THAT(last.reason, HasSubstr("not requeued: 3 restarts done, max_restarts 3"));
}

TEST(RestartPolicyTest, ARanksFailureIsRequeuedAndBadInputIsNot) {
  RunOutcome crashed{.end = RunOutcome::End::kFailed,
                     .cause = FaultEvent{.worker = 0, .reason = "killed by signal 9"}};
  EXPECT_TRUE(DecideRestart({}, crashed, 0).requeue);
  EXPECT_THAT(DecideRestart({}, crashed, 0).reason, HasSubstr("worker 0 failed: killed by signal"));
  // A run whose launcher ended (no worker to blame) is named by its own reason.
  RunOutcome launcher{.end = RunOutcome::End::kFailed,
                      .cause = FaultEvent{.reason = "exited with code 1 on h1"}};
  EXPECT_THAT(DecideRestart({}, launcher, 0).reason,
              ::testing::StartsWith("exited with code 1 on h1; requeued (restart 1 of 3)"));
  RunOutcome unavailable{.end = RunOutcome::End::kFailed, .error = UnavailableError("store")};
  EXPECT_TRUE(DecideRestart({}, unavailable, 0).requeue);
  for (const Status& s : {InvalidArgumentError("bad"), NotFoundError("gone"),
                          FailedPreconditionError("state"), UnimplementedError("zero_stage 2")}) {
    RunOutcome bad{.end = RunOutcome::End::kFailed, .error = s};
    EXPECT_FALSE(DecideRestart({}, bad, 0).requeue) << s.ToString();
  }
}

TEST(RestartPolicyTest, ACompletedOrStoppedRunIsNotRequeued) {
  EXPECT_FALSE(DecideRestart({}, {.end = RunOutcome::End::kCompleted}, 0).requeue);
  EXPECT_FALSE(DecideRestart({}, {.end = RunOutcome::End::kStopped}, 0).requeue);
}

TEST(RestartPolicyTest, NoRestartsMeansTheFirstLossFailsTheJob) {
  EXPECT_FALSE(DecideRestart({.max_restarts = 0}, BelowMinimum(), 0).requeue);
}

TEST(RestartPolicyTest, BadPoliciesNameTheirField) {
  EXPECT_THAT(ValidateRestartPolicy({.max_restarts = -1}).message(), HasSubstr("max_restarts -1"));
  EXPECT_THAT(ValidateRestartPolicy({.backoff = seconds(-1)}).message(), HasSubstr("backoff"));
  EXPECT_THAT(ValidateRestartPolicy({.backoff = seconds(60), .max_backoff = seconds(30)}).message(),
              HasSubstr("max_backoff 30 s: below the backoff (60 s)"));
  EXPECT_TRUE(ValidateRestartPolicy({}).ok());
}

}  // namespace
}  // namespace kc::fault
