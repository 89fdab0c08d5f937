#include "api/job_store.h"

#include <fmt/format.h>

#include <array>

#include "api/internal/sqlite.h"
#include "base/mutex.h"

namespace kc::api {
namespace {

constexpr std::array<std::string_view, 8> kPhaseNames = {
    "pending", "approval_required", "queued", "running",
    "paused",  "succeeded",         "failed", "cancelled"};

constexpr char kSchema[] = R"(
CREATE TABLE IF NOT EXISTS jobs (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  owner TEXT NOT NULL,
  team TEXT NOT NULL,
  spec TEXT NOT NULL,
  devices INTEGER NOT NULL,
  device_hours REAL NOT NULL,
  storage_gb REAL NOT NULL,
  phase TEXT NOT NULL,
  submitted_s REAL NOT NULL,
  updated_s REAL NOT NULL,
  reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_owner ON jobs (owner);
)";

constexpr char kColumns[] =
    "id, name, owner, team, spec, devices, device_hours, storage_gb, phase, submitted_s, "
    "updated_s, reason";

JobRecord Row(const internal::Statement& s) {
  return {.id = s.Int(0),
          .name = s.Text(1),
          .owner = s.Text(2),
          .team = s.Text(3),
          .spec = s.Text(4),
          .devices = s.Int(5),
          .device_hours = s.Double(6),
          .storage_gb = s.Double(7),
          .phase = JobPhaseFromName(s.Text(8)).value_or(JobPhase::kFailed),
          .submitted_s = s.Double(9),
          .updated_s = s.Double(10),
          .reason = s.Text(11)};
}

}  // namespace

std::string_view JobPhaseName(JobPhase p) { return kPhaseNames[static_cast<size_t>(p)]; }

std::optional<JobPhase> JobPhaseFromName(std::string_view name) {
  for (size_t i = 0; i < kPhaseNames.size(); ++i) {
    if (kPhaseNames[i] == name) return static_cast<JobPhase>(i);
  }
  return std::nullopt;
}

bool IsTerminal(JobPhase p) {
  return p == JobPhase::kSucceeded || p == JobPhase::kFailed || p == JobPhase::kCancelled;
}

bool AllowedTransition(JobPhase from, JobPhase to) {
  using P = JobPhase;
  if (IsTerminal(from)) return false;
  if (to == P::kCancelled || to == P::kFailed) return true;
  switch (from) {
    case P::kPending:
      return to == P::kApprovalRequired || to == P::kQueued;
    case P::kApprovalRequired:
      return to == P::kQueued;
    case P::kQueued:
      return to == P::kRunning;
    case P::kRunning:
      return to == P::kPaused || to == P::kSucceeded || to == P::kQueued;
    case P::kPaused:
      return to == P::kQueued || to == P::kRunning;
    default:
      return false;
  }
}

struct JobStore::Impl {
  mutable Mutex mu;
  internal::Database db KC_GUARDED_BY(mu);

  Result<JobRecord> GetLocked(int64_t id) const KC_REQUIRES(mu) {
    KC_ASSIGN_OR_RETURN(internal::Statement st,
                        db.Prepare(fmt::format("SELECT {} FROM jobs WHERE id = ?", kColumns)));
    st.Bind(1, id);
    const int rc = st.Step();
    if (rc == SQLITE_ROW) return Row(st);
    if (rc == SQLITE_DONE) return NotFoundError(fmt::format("job {}: no such job", id));
    return db.Error("cannot read");
  }
};

JobStore::JobStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JobStore::~JobStore() = default;

Result<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  MutexLock lock(&impl->mu);
  KC_RETURN_IF_ERROR(impl->db.Open(path, "job store", kSchema));
  return std::unique_ptr<JobStore>(new JobStore(std::move(impl)));
}

Result<JobRecord> JobStore::Submit(JobRecord job, double now_s) {
  if (job.name.empty()) return InvalidArgumentError("job: name: must not be empty");
  if (job.owner.empty()) return InvalidArgumentError("job: owner: must not be empty");
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  job.phase = JobPhase::kPending;
  job.submitted_s = now_s;
  job.updated_s = now_s;
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("INSERT INTO jobs (name, owner, team, spec, devices, "
                                   "device_hours, storage_gb, phase, submitted_s, updated_s, "
                                   "reason) VALUES (?,?,?,?,?,?,?,?,?,?,?)"));
  st.Bind(1, job.name);
  st.Bind(2, job.owner);
  st.Bind(3, job.team);
  st.Bind(4, job.spec);
  st.Bind(5, job.devices);
  st.Bind(6, job.device_hours);
  st.Bind(7, job.storage_gb);
  st.Bind(8, JobPhaseName(job.phase));
  st.Bind(9, now_s);
  st.Bind(10, now_s);
  st.Bind(11, job.reason);
  if (st.Step() != SQLITE_DONE) return m.db.Error("cannot record the job");
  job.id = sqlite3_last_insert_rowid(m.db.handle());
  return job;
}

Result<JobRecord> JobStore::Transition(int64_t id, JobPhase to, std::string reason, double now_s) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(JobRecord job, m.GetLocked(id));
  if (!AllowedTransition(job.phase, to)) {
    return FailedPreconditionError(fmt::format("job {}: cannot go from {} to {}", id,
                                               JobPhaseName(job.phase), JobPhaseName(to)));
  }
  KC_ASSIGN_OR_RETURN(
      internal::Statement st,
      m.db.Prepare("UPDATE jobs SET phase = ?, updated_s = ?, reason = ? WHERE id = ?"));
  st.Bind(1, JobPhaseName(to));
  st.Bind(2, now_s);
  st.Bind(3, reason);
  st.Bind(4, id);
  if (st.Step() != SQLITE_DONE) return m.db.Error("cannot record the transition");
  job.phase = to;
  job.updated_s = now_s;
  job.reason = std::move(reason);
  return job;
}

Result<JobRecord> JobStore::Get(int64_t id) const {
  MutexLock lock(&impl_->mu);
  return impl_->GetLocked(id);
}

Result<std::vector<JobRecord>> JobStore::List(const JobFilter& f) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(
      internal::Statement st,
      m.db.Prepare(fmt::format("SELECT {} FROM jobs WHERE (?1 = '' OR owner = ?1) AND "
                               "(?2 = '' OR phase = ?2) ORDER BY id LIMIT ?3",
                               kColumns)));
  st.Bind(1, f.owner);
  st.Bind(2, f.phase ? JobPhaseName(*f.phase) : std::string_view());
  st.Bind(3, static_cast<int64_t>(f.limit));
  std::vector<JobRecord> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) out.push_back(Row(st));
  if (rc != SQLITE_DONE) return m.db.Error("cannot list");
  return out;
}

}  // namespace kc::api
