// Quotas per submitter and per team — devices in use, device-hours of runtime, storage — the
// check at submission, and quota-increase requests that a resource admin approves or denies.
// Stored in kcd's SQLite database. Docs: docs/operations/quotas.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kc::api {

enum class QuotaSubject : uint8_t { kUser, kTeam };
std::string_view QuotaSubjectName(QuotaSubject s);  // "user", "team"

// Unset limits are unlimited.
struct Quota {
  std::optional<int64_t> max_devices;      // devices held at once by running jobs
  std::optional<double> max_device_hours;  // runtime, device-hours, over the quota's life
  std::optional<double> max_storage_gb;    // checkpoints and job data
};

struct QuotaUsage {
  int64_t devices = 0;
  double device_hours = 0;
  double storage_gb = 0;
};

// What a new job would add.
struct QuotaAsk {
  int64_t devices = 0;
  double device_hours = 0;  // its expected runtime times its devices
  double storage_gb = 0;
};

// OK when `ask` fits `quota` on top of `usage`; kResourceExhausted with the numbers
// otherwise ("team vision: max_devices 64: 60 in use + 8 asked = 68"). `who` names the
// subject in the message.
Status CheckQuota(std::string_view who, const Quota& quota, const QuotaUsage& usage,
                  const QuotaAsk& ask);

// Whether a running job's owner has used up its runtime: the supervisor then checkpoints and
// stops the job.
bool RuntimeExhausted(const Quota& quota, const QuotaUsage& usage);

enum class RequestState : uint8_t { kPending, kApproved, kDenied };
std::string_view RequestStateName(RequestState s);

struct QuotaRequest {
  int64_t id = 0;
  QuotaSubject subject = QuotaSubject::kUser;
  std::string name;       // the user or team
  std::string requester;  // who asked
  Quota wanted;           // the quota asked for (replaces the current one if approved)
  std::string reason;
  RequestState state = RequestState::kPending;
  std::string decided_by;
  std::string decision_reason;
};

// Safe for concurrent use.
class QuotaStore {
 public:
  // Opens or creates the quota tables in the database at `path`. kUnavailable on failure.
  static Result<std::unique_ptr<QuotaStore>> Open(const std::string& path);
  ~QuotaStore();
  QuotaStore(const QuotaStore&) = delete;
  QuotaStore& operator=(const QuotaStore&) = delete;

  // The quota of a user or team; unlimited when none was set.
  Result<Quota> Get(QuotaSubject subject, std::string_view name) const;
  Status Set(QuotaSubject subject, std::string_view name, const Quota& quota);

  // Files a request; it waits for a resource admin. kInvalidArgument for an empty name or
  // requester, or a negative limit.
  Result<QuotaRequest> Request(QuotaRequest request);
  // Approves (the quota becomes request.wanted) or denies a pending request. kNotFound for an
  // unknown id; kFailedPrecondition for a request already decided. Whether `admin` may decide
  // is the permission service's call, made before this one.
  Result<QuotaRequest> Decide(int64_t id, bool approve, std::string_view admin,
                              std::string_view reason);
  Result<std::vector<QuotaRequest>> Requests(std::optional<RequestState> state) const;

 private:
  struct Impl;
  explicit QuotaStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kc::api
