#include "fault/restart_policy.h"

#include <fmt/format.h>

#include <algorithm>

namespace kc::fault {
namespace {

// Errors a new run would meet again: requeuing would only fail again.
bool Permanent(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kNotFound:
    case ErrorCode::kFailedPrecondition:
    case ErrorCode::kPermissionDenied:
    case ErrorCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

double InSeconds(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

Status ValidateRestartPolicy(const RestartPolicy& policy) {
  if (policy.max_restarts < 0) {
    return InvalidArgumentError(
        fmt::format("max_restarts {}: must be 0 or more", policy.max_restarts));
  }
  if (policy.backoff < Duration::zero()) {
    return InvalidArgumentError(
        fmt::format("restart backoff {} s: must be 0 or more", InSeconds(policy.backoff)));
  }
  if (policy.max_backoff < policy.backoff) {
    return InvalidArgumentError(fmt::format("restart max_backoff {} s: below the backoff ({} s)",
                                            InSeconds(policy.max_backoff),
                                            InSeconds(policy.backoff)));
  }
  return OkStatus();
}

RestartDecision DecideRestart(const RestartPolicy& policy, const RunOutcome& outcome,
                              int restarts_done) {
  RestartDecision d;
  std::string why;
  switch (outcome.end) {
    case RunOutcome::End::kCompleted:
      d.reason = "completed";
      return d;
    case RunOutcome::End::kStopped:
      d.reason = "stopped on request";
      return d;
    case RunOutcome::End::kBelowMinimum:
      why = outcome.cause ? fmt::format("{} ranks left, below the minimum {}", outcome.cause->alive,
                                        outcome.cause->min_ranks)
                          : "below the minimum";
      break;
    case RunOutcome::End::kFailed:
      if (!outcome.cause && !outcome.error.ok() && Permanent(outcome.error.code())) {
        d.reason = "failed: " + outcome.error.ToString();
        return d;
      }
      if (!outcome.cause) {
        why = "failed: " + outcome.error.ToString();
      } else if (outcome.cause->worker < 0) {  // the run as a whole (its launcher ended)
        why = outcome.cause->reason;
      } else {
        why = fmt::format("worker {} failed: {}", outcome.cause->worker, outcome.cause->reason);
      }
      break;
  }
  if (restarts_done >= policy.max_restarts) {
    d.reason = fmt::format("{}; not requeued: {} restart{} done, max_restarts {}", why,
                           restarts_done, restarts_done == 1 ? "" : "s", policy.max_restarts);
    return d;
  }
  d.requeue = true;
  d.restart = restarts_done + 1;
  Duration delay = policy.backoff;
  for (int i = 0; i < restarts_done && delay < policy.max_backoff; ++i) delay *= 2;
  d.delay = std::min(delay, policy.max_backoff);
  d.reason = fmt::format(
      "{}; requeued (restart {} of {}) after {:.0f} s, to resume from the "
      "newest good checkpoint",
      why, d.restart, policy.max_restarts, InSeconds(d.delay));
  return d;
}

}  // namespace kc::fault
