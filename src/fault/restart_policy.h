// What follows a run's end: requeue the job (it resumes from its newest good checkpoint) after
// a backoff, or fail it. One rule, asked by whoever owns the job's lifetime: kcd's dispatcher
// for cluster jobs. The supervisor itself never restarts a run: a requeue waits for devices.
#pragma once

#include <string>

#include "base/clock.h"
#include "fault/supervisor.h"

namespace kc::fault {

struct RestartPolicy {
  // Requeues after a run ended below its minimum or by a rank's failure; then the job fails.
  int max_restarts = 3;
  Duration backoff = std::chrono::seconds(10);  // before the first requeue; doubled at each
  Duration max_backoff = std::chrono::minutes(5);
};

// OK, or kInvalidArgument naming the field: max_restarts < 0, a backoff below 0 or a
// max_backoff below the backoff.
Status ValidateRestartPolicy(const RestartPolicy& policy);

struct RestartDecision {
  bool requeue = false;
  Duration delay{};    // before the job may be placed again (requeue only)
  int restart = 0;     // the requeue's number, from 1 (requeue only)
  std::string reason;  // for the job's history and the audit log
};

// The decision after `outcome`, for a job requeued `restarts_done` times before. Requeued: a run
// that ended below its minimum, or failed by a rank's failure (it crashed, was killed or went
// silent), while restarts_done < max_restarts, after backoff * 2^restarts_done (at most
// max_backoff). Not requeued: a completed or stopped run; a failure with an error the next run
// would meet again (kInvalidArgument, kNotFound, kFailedPrecondition, kPermissionDenied,
// kUnimplemented: bad input or state, decided by code); and any failure past max_restarts.
// A cause with no worker (-1) is the run's as a whole: its reason is the decision's.
RestartDecision DecideRestart(const RestartPolicy& policy, const RunOutcome& outcome,
                              int restarts_done);

}  // namespace kc::fault
