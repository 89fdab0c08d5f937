#include "api/job_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <functional>

#include "api/internal/sqlite.h"
#include "base/log.h"
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
CREATE INDEX IF NOT EXISTS jobs_phase ON jobs (phase);
CREATE TABLE IF NOT EXISTS job_events (
  job INTEGER NOT NULL,
  phase TEXT NOT NULL,
  reason TEXT NOT NULL,
  time_s REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS job_events_job ON job_events (job);
CREATE TABLE IF NOT EXISTS job_progress (
  job INTEGER PRIMARY KEY,
  host TEXT NOT NULL,
  step INTEGER NOT NULL,
  checkpoint_step INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS job_logs (
  job INTEGER NOT NULL,
  start INTEGER NOT NULL,
  data BLOB NOT NULL,
  PRIMARY KEY (job, start)
);
CREATE TABLE IF NOT EXISTS job_reports (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  job INTEGER NOT NULL,
  event INTEGER NOT NULL,
  report BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS job_reports_job ON job_reports (job, event, seq);
)";

// The columns of a JobRecord, the last its running time: each "running" event's span to the
// event after it (a run still going counts from the next change on).
constexpr char kColumns[] =
    "id, name, owner, team, spec, devices, device_hours, storage_gb, phase, submitted_s, "
    "updated_s, reason, "
    "(SELECT COALESCE(SUM((SELECT n.time_s FROM job_events n WHERE n.job = e.job AND "
    "n.rowid > e.rowid ORDER BY n.rowid LIMIT 1) - e.time_s), 0) FROM job_events e "
    "WHERE e.job = jobs.id AND e.phase = 'running')";

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
          .reason = s.Text(11),
          .ran_s = s.Double(12)};
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
      return to == P::kRunning || to == P::kPaused;
    case P::kRunning:
      return to == P::kPaused || to == P::kSucceeded || to == P::kQueued;
    case P::kPaused:
      return to == P::kQueued || to == P::kRunning;
    default:
      return false;
  }
}

// The phases of jobs that have not ended, as SQL's IN list.
constexpr char kActivePhases[] = "('pending', 'approval_required', 'queued', 'running', 'paused')";

struct JobStore::Impl {
  JobStoreOptions options;  // immutable after Open
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

  // A job's reason, and with `event` an event of its phase in its history: not for a job that
  // ended (kFailedPrecondition).
  Status SetReasonLocked(int64_t id, std::string_view reason, double now_s, bool event)
      KC_EXCLUDES(mu) {
    MutexLock lock(&mu);
    KC_ASSIGN_OR_RETURN(JobRecord job, GetLocked(id));
    if (IsTerminal(job.phase)) {
      return FailedPreconditionError(fmt::format("job {}: it ended ({}); its {} stays", id,
                                                 JobPhaseName(job.phase),
                                                 event ? "history" : "reason"));
    }
    KC_ASSIGN_OR_RETURN(internal::Statement st,
                        db.Prepare("UPDATE jobs SET updated_s = ?, reason = ? WHERE id = ?"));
    st.Bind(1, now_s);
    st.Bind(2, reason);
    st.Bind(3, id);
    return Atomically([&]() KC_REQUIRES(mu) -> Status {
      if (st.Step() != SQLITE_DONE) return db.Error("cannot record the reason");
      return event ? RecordEvent(id, job.phase, reason, now_s) : OkStatus();
    });
  }

  Status RecordEvent(int64_t id, JobPhase phase, std::string_view reason, double now_s)
      KC_REQUIRES(mu) {
    KC_ASSIGN_OR_RETURN(
        internal::Statement st,
        db.Prepare("INSERT INTO job_events (job, phase, reason, time_s) VALUES (?,?,?,?)"));
    st.Bind(1, id);
    st.Bind(2, JobPhaseName(phase));
    st.Bind(3, reason);
    st.Bind(4, now_s);
    if (st.Step() != SQLITE_DONE) return db.Error("cannot record the job's history");
    return OkStatus();
  }

  // Runs `body` in one transaction: all of it is on disk, or none.
  Status Atomically(const std::function<Status()>& body) KC_REQUIRES(mu) {
    KC_RETURN_IF_ERROR(db.Exec("BEGIN IMMEDIATE"));
    Status s = body();
    if (!s.ok()) {
      db.Exec("ROLLBACK").IgnoreError();
      return s;
    }
    return db.Exec("COMMIT");
  }

  Result<int64_t> LogSize(int64_t id) const KC_REQUIRES(mu) {
    KC_ASSIGN_OR_RETURN(
        internal::Statement st,
        db.Prepare("SELECT COALESCE(MAX(start + length(data)), 0) FROM job_logs WHERE job = ?"));
    st.Bind(1, id);
    if (st.Step() != SQLITE_ROW) return db.Error("cannot read the job's log");
    return st.Int(0);
  }
};

JobStore::JobStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JobStore::~JobStore() = default;

Result<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path,
                                                 const JobStoreOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
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
  KC_RETURN_IF_ERROR(m.Atomically([&]() KC_REQUIRES(m.mu) -> Status {
    if (st.Step() != SQLITE_DONE) return m.db.Error("cannot record the job");
    job.id = sqlite3_last_insert_rowid(m.db.handle());
    return m.RecordEvent(job.id, job.phase, job.reason, now_s);
  }));
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
  KC_RETURN_IF_ERROR(m.Atomically([&]() KC_REQUIRES(m.mu) -> Status {
    if (st.Step() != SQLITE_DONE) return m.db.Error("cannot record the transition");
    return m.RecordEvent(id, to, reason, now_s);
  }));
  job.phase = to;
  job.updated_s = now_s;
  job.reason = std::move(reason);
  return job;
}

Status JobStore::SetReason(int64_t id, std::string_view reason, double now_s) {
  return impl_->SetReasonLocked(id, reason, now_s, /*event=*/false);
}

Status JobStore::Note(int64_t id, std::string reason, double now_s) {
  return impl_->SetReasonLocked(id, reason, now_s, /*event=*/true);
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
                               "(?2 = '' OR phase = ?2) AND (?4 = 0 OR phase IN {}) "
                               "ORDER BY id LIMIT ?3",
                               kColumns, kActivePhases)));
  st.Bind(1, f.owner);
  st.Bind(2, f.phase ? JobPhaseName(*f.phase) : std::string_view());
  st.Bind(3, static_cast<int64_t>(f.limit));
  st.Bind(4, static_cast<int64_t>(f.active ? 1 : 0));
  std::vector<JobRecord> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) out.push_back(Row(st));
  if (rc != SQLITE_DONE) return m.db.Error("cannot list");
  return out;
}

Result<int64_t> JobStore::CountActive(std::string_view owner) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(
      internal::Statement st,
      m.db.Prepare(
          fmt::format("SELECT COUNT(*) FROM jobs WHERE owner = ? AND phase IN {}", kActivePhases)));
  st.Bind(1, owner);
  if (st.Step() != SQLITE_ROW) return m.db.Error("cannot count");
  return st.Int(0);
}

Result<std::map<JobPhase, int64_t>> JobStore::CountByPhase() const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("SELECT phase, COUNT(*) FROM jobs GROUP BY phase"));
  std::map<JobPhase, int64_t> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    if (std::optional<JobPhase> p = JobPhaseFromName(st.Text(0))) out[*p] = st.Int(1);
  }
  if (rc != SQLITE_DONE) return m.db.Error("cannot count");
  return out;
}

Result<std::vector<JobEvent>> JobStore::History(int64_t id) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_RETURN_IF_ERROR(m.GetLocked(id).status());
  KC_ASSIGN_OR_RETURN(
      internal::Statement st,
      m.db.Prepare("SELECT phase, reason, time_s FROM job_events WHERE job = ? ORDER BY rowid"));
  st.Bind(1, id);
  std::vector<JobEvent> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    out.push_back({.phase = JobPhaseFromName(st.Text(0)).value_or(JobPhase::kFailed),
                   .reason = st.Text(1),
                   .time_s = st.Double(2)});
  }
  if (rc != SQLITE_DONE) return m.db.Error("cannot read the job's history");
  return out;
}

Result<JobRecord> JobStore::Modify(int64_t id, std::optional<std::string> name,
                                   std::optional<double> device_hours, double now_s) {
  if (name && name->empty()) return InvalidArgumentError("job: name: must not be empty");
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(JobRecord job, m.GetLocked(id));
  if (IsTerminal(job.phase)) {
    return FailedPreconditionError(
        fmt::format("job {}: it has ended ({}); nothing can change", id, JobPhaseName(job.phase)));
  }
  if (name) job.name = *std::move(name);
  if (device_hours) job.device_hours = *device_hours;
  job.updated_s = now_s;
  KC_ASSIGN_OR_RETURN(
      internal::Statement st,
      m.db.Prepare("UPDATE jobs SET name = ?, device_hours = ?, updated_s = ? WHERE id = ?"));
  st.Bind(1, job.name);
  st.Bind(2, job.device_hours);
  st.Bind(3, now_s);
  st.Bind(4, id);
  if (st.Step() != SQLITE_DONE) return m.db.Error("cannot record the change");
  return job;
}

Status JobStore::SetProgress(int64_t id, const JobProgress& p) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_RETURN_IF_ERROR(m.GetLocked(id).status());
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("INSERT OR REPLACE INTO job_progress (job, host, step, "
                                   "checkpoint_step) VALUES (?,?,?,?)"));
  st.Bind(1, id);
  st.Bind(2, p.host);
  st.Bind(3, p.step);
  st.Bind(4, p.checkpoint_step);
  if (st.Step() != SQLITE_DONE) return m.db.Error("cannot record the job's progress");
  return OkStatus();
}

Result<JobProgress> JobStore::Progress(int64_t id) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_RETURN_IF_ERROR(m.GetLocked(id).status());
  KC_ASSIGN_OR_RETURN(
      internal::Statement st,
      m.db.Prepare("SELECT host, step, checkpoint_step FROM job_progress WHERE job = ?"));
  st.Bind(1, id);
  const int rc = st.Step();
  if (rc == SQLITE_DONE) return JobProgress{};
  if (rc != SQLITE_ROW) return m.db.Error("cannot read the job's progress");
  return JobProgress{.host = st.Text(0), .step = st.Int(1), .checkpoint_step = st.Int(2)};
}

Status JobStore::AppendLog(int64_t id, std::string_view data) {
  if (data.empty()) return OkStatus();
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_RETURN_IF_ERROR(m.GetLocked(id).status());
  KC_ASSIGN_OR_RETURN(int64_t size, m.LogSize(id));
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("INSERT INTO job_logs (job, start, data) VALUES (?,?,?)"));
  st.Bind(1, id);
  st.Bind(2, size);
  sqlite3_bind_blob(st.get(), 3, data.data(), static_cast<int>(data.size()), SQLITE_TRANSIENT);
  if (st.Step() != SQLITE_DONE) return m.db.Error("cannot append to the job's log");
  // The oldest output goes, whole pieces at a time, until what is kept fits.
  KC_ASSIGN_OR_RETURN(internal::Statement drop,
                      m.db.Prepare("DELETE FROM job_logs WHERE job = ?1 AND start + length(data) "
                                   "<= ?2 - ?3"));
  drop.Bind(1, id);
  drop.Bind(2, size + static_cast<int64_t>(data.size()));
  drop.Bind(3, m.options.max_log_bytes);
  if (drop.Step() != SQLITE_DONE) return m.db.Error("cannot drop the job's oldest output");
  return OkStatus();
}

Result<LogSlice> JobStore::ReadLog(int64_t id, int64_t offset, int64_t max_bytes) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_RETURN_IF_ERROR(m.GetLocked(id).status());
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("SELECT start, data FROM job_logs WHERE job = ? AND "
                                   "start + length(data) > ? ORDER BY start"));
  st.Bind(1, id);
  st.Bind(2, offset);
  LogSlice out{.from = offset};
  int rc;
  while (static_cast<int64_t>(out.data.size()) < max_bytes && (rc = st.Step()) == SQLITE_ROW) {
    const int64_t start = st.Int(0);
    const char* data = static_cast<const char*>(sqlite3_column_blob(st.get(), 1));
    const int64_t n = sqlite3_column_bytes(st.get(), 1);
    // The first piece kept may start past `offset`: what lay between was dropped.
    if (out.data.empty()) out.from = std::max(offset, start);
    const int64_t from = std::max<int64_t>(0, offset - start);
    const int64_t take = std::min(n - from, max_bytes - static_cast<int64_t>(out.data.size()));
    out.data.append(data + from, static_cast<size_t>(take));
  }
  return out;
}

Status JobStore::AppendReports(int64_t id, const std::vector<JobReport>& reports) {
  if (reports.empty()) return OkStatus();
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_RETURN_IF_ERROR(m.GetLocked(id).status());
  KC_RETURN_IF_ERROR(m.db.Exec("BEGIN"));
  for (const JobReport& r : reports) {
    Result<internal::Statement> st =
        m.db.Prepare("INSERT INTO job_reports (job, event, report) VALUES (?,?,?)");
    if (!st.ok()) {
      m.db.Exec("ROLLBACK").IgnoreError();  // the prepare's error says why
      return st.status();
    }
    st->Bind(1, id);
    st->Bind(2, int64_t{r.event});
    sqlite3_bind_blob(st->get(), 3, r.bytes.data(), static_cast<int>(r.bytes.size()),
                      SQLITE_TRANSIENT);
    if (st->Step() != SQLITE_DONE) {
      const Status e = m.db.Error("cannot record the job's reports");
      m.db.Exec("ROLLBACK").IgnoreError();
      return e;
    }
  }
  // The oldest of each kind go once the job has more of it than it keeps.
  for (auto [event, keep] : {std::pair{0, kMaxJobReports}, {1, kMaxJobEvents}}) {
    Result<internal::Statement> drop = m.db.Prepare(
        "DELETE FROM job_reports WHERE job = ?1 AND event = ?2 AND seq <= (SELECT seq FROM "
        "job_reports WHERE job = ?1 AND event = ?2 ORDER BY seq DESC LIMIT 1 OFFSET ?3)");
    if (!drop.ok()) continue;
    drop->Bind(1, id);
    drop->Bind(2, int64_t{event});
    drop->Bind(3, keep);
    if (drop->Step() != SQLITE_DONE) KC_LOG(WARNING) << m.db.Error("job reports").message();
  }
  return m.db.Exec("COMMIT");
}

Result<std::vector<std::string>> JobStore::Reports(int64_t id) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_RETURN_IF_ERROR(m.GetLocked(id).status());
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("SELECT report FROM job_reports WHERE job = ? ORDER BY seq"));
  st.Bind(1, id);
  std::vector<std::string> out;
  while (st.Step() == SQLITE_ROW) {
    const char* data = static_cast<const char*>(sqlite3_column_blob(st.get(), 0));
    out.emplace_back(data, static_cast<size_t>(sqlite3_column_bytes(st.get(), 0)));
  }
  return out;
}

}  // namespace kc::api
