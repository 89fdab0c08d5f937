#include "api/quotas.h"

#include <fmt/format.h>

#include <cmath>

#include "api/internal/sqlite.h"
#include "base/mutex.h"

namespace kc::api {
namespace {

constexpr char kSchema[] = R"(
CREATE TABLE IF NOT EXISTS quotas (
  subject TEXT NOT NULL,
  name TEXT NOT NULL,
  max_devices INTEGER,
  max_device_hours REAL,
  max_storage_gb REAL,
  PRIMARY KEY (subject, name)
);
CREATE TABLE IF NOT EXISTS quota_requests (
  id INTEGER PRIMARY KEY,
  subject TEXT NOT NULL,
  name TEXT NOT NULL,
  requester TEXT NOT NULL,
  max_devices INTEGER,
  max_device_hours REAL,
  max_storage_gb REAL,
  reason TEXT NOT NULL,
  state TEXT NOT NULL,
  decided_by TEXT NOT NULL,
  decision_reason TEXT NOT NULL
);
)";

constexpr char kRequestColumns[] =
    "id, subject, name, requester, max_devices, max_device_hours, max_storage_gb, reason, state, "
    "decided_by, decision_reason";

QuotaRequest RequestRow(const internal::Statement& s) {
  return {.id = s.Int(0),
          .subject = s.Text(1) == "team" ? QuotaSubject::kTeam : QuotaSubject::kUser,
          .name = s.Text(2),
          .requester = s.Text(3),
          .wanted = {.max_devices = s.OptInt(4),
                     .max_device_hours = s.OptDouble(5),
                     .max_storage_gb = s.OptDouble(6)},
          .reason = s.Text(7),
          .state = s.Text(8) == "approved" ? RequestState::kApproved
                   : s.Text(8) == "denied" ? RequestState::kDenied
                                           : RequestState::kPending,
          .decided_by = s.Text(9),
          .decision_reason = s.Text(10)};
}

std::string Num(double x) { return fmt::format("{:g}", x); }

}  // namespace

std::string_view QuotaSubjectName(QuotaSubject s) {
  return s == QuotaSubject::kTeam ? "team" : "user";
}

std::string_view RequestStateName(RequestState s) {
  switch (s) {
    case RequestState::kPending:
      return "pending";
    case RequestState::kApproved:
      return "approved";
    case RequestState::kDenied:
      return "denied";
  }
  return "?";
}

Status CheckQuota(std::string_view who, const Quota& q, const QuotaUsage& u, const QuotaAsk& a) {
  auto over = [&](std::string_view limit, std::string_view unit, double max, double used,
                  double asked) {
    return ResourceExhaustedError(fmt::format(
        "{}: over quota: {} {}{}: {}{} in use + {}{} asked = {}{}; ask a resource admin for "
        "more (kc quota request)",
        who, limit, Num(max), unit, Num(used), unit, Num(asked), unit, Num(used + asked), unit));
  };
  if (q.max_devices && u.devices + a.devices > *q.max_devices) {
    return over("max_devices", "", static_cast<double>(*q.max_devices),
                static_cast<double>(u.devices), static_cast<double>(a.devices));
  }
  if (q.max_device_hours && u.device_hours + a.device_hours > *q.max_device_hours) {
    return over("max_device_hours", " device-h", *q.max_device_hours, u.device_hours,
                a.device_hours);
  }
  if (q.max_storage_gb && u.storage_gb + a.storage_gb > *q.max_storage_gb) {
    return over("max_storage_gb", " GB", *q.max_storage_gb, u.storage_gb, a.storage_gb);
  }
  return OkStatus();
}

bool RuntimeExhausted(const Quota& q, const QuotaUsage& u) {
  return q.max_device_hours && u.device_hours >= *q.max_device_hours;
}

struct QuotaStore::Impl {
  mutable Mutex mu;
  internal::Database db KC_GUARDED_BY(mu);

  Status SetLocked(QuotaSubject subject, std::string_view name, const Quota& q) KC_REQUIRES(mu) {
    KC_ASSIGN_OR_RETURN(internal::Statement st,
                        db.Prepare("INSERT OR REPLACE INTO quotas (subject, name, max_devices, "
                                   "max_device_hours, max_storage_gb) VALUES (?,?,?,?,?)"));
    st.Bind(1, QuotaSubjectName(subject));
    st.Bind(2, name);
    st.Bind(3, q.max_devices);
    st.Bind(4, q.max_device_hours);
    st.Bind(5, q.max_storage_gb);
    if (st.Step() != SQLITE_DONE) return db.Error("cannot set a quota");
    return OkStatus();
  }
  Result<QuotaRequest> GetRequestLocked(int64_t id) const KC_REQUIRES(mu) {
    KC_ASSIGN_OR_RETURN(
        internal::Statement st,
        db.Prepare(fmt::format("SELECT {} FROM quota_requests WHERE id = ?", kRequestColumns)));
    st.Bind(1, id);
    const int rc = st.Step();
    if (rc == SQLITE_ROW) return RequestRow(st);
    if (rc == SQLITE_DONE)
      return NotFoundError(fmt::format("quota request {}: no such request", id));
    return db.Error("cannot read");
  }
  Result<QuotaRequest> DecideLocked(int64_t id, bool approve, std::string_view admin,
                                    std::string_view reason) KC_REQUIRES(mu) {
    KC_ASSIGN_OR_RETURN(QuotaRequest r, GetRequestLocked(id));
    if (r.state != RequestState::kPending) {
      return FailedPreconditionError(fmt::format("quota request {}: already {} by {}", id,
                                                 RequestStateName(r.state), r.decided_by));
    }
    r.state = approve ? RequestState::kApproved : RequestState::kDenied;
    r.decided_by = std::string(admin);
    r.decision_reason = std::string(reason);
    KC_ASSIGN_OR_RETURN(internal::Statement st,
                        db.Prepare("UPDATE quota_requests SET state = ?, decided_by = ?, "
                                   "decision_reason = ? WHERE id = ?"));
    st.Bind(1, RequestStateName(r.state));
    st.Bind(2, r.decided_by);
    st.Bind(3, r.decision_reason);
    st.Bind(4, id);
    if (st.Step() != SQLITE_DONE) return db.Error("cannot record the decision");
    if (approve) KC_RETURN_IF_ERROR(SetLocked(r.subject, r.name, r.wanted));
    return r;
  }
};

QuotaStore::QuotaStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
QuotaStore::~QuotaStore() = default;

Result<std::unique_ptr<QuotaStore>> QuotaStore::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  MutexLock lock(&impl->mu);
  KC_RETURN_IF_ERROR(impl->db.Open(path, "quota store", kSchema));
  return std::unique_ptr<QuotaStore>(new QuotaStore(std::move(impl)));
}

Result<Quota> QuotaStore::Get(QuotaSubject subject, std::string_view name) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("SELECT max_devices, max_device_hours, max_storage_gb FROM "
                                   "quotas WHERE subject = ? AND name = ?"));
  st.Bind(1, QuotaSubjectName(subject));
  st.Bind(2, name);
  const int rc = st.Step();
  if (rc == SQLITE_DONE) return Quota{};
  if (rc != SQLITE_ROW) return m.db.Error("cannot read a quota");
  return Quota{.max_devices = st.OptInt(0),
               .max_device_hours = st.OptDouble(1),
               .max_storage_gb = st.OptDouble(2)};
}

Status QuotaStore::Set(QuotaSubject subject, std::string_view name, const Quota& quota) {
  MutexLock lock(&impl_->mu);
  return impl_->SetLocked(subject, name, quota);
}

Result<QuotaRequest> QuotaStore::Request(QuotaRequest r) {
  if (r.name.empty()) return InvalidArgumentError("quota request: name: must not be empty");
  if (r.requester.empty()) {
    return InvalidArgumentError("quota request: requester: must not be empty");
  }
  // A limit is a non-negative number; an unlimited one is left unset, not infinite or NaN.
  const auto bad = [](std::optional<double> v) { return v && !(*v >= 0 && std::isfinite(*v)); };
  if ((r.wanted.max_devices && *r.wanted.max_devices < 0) || bad(r.wanted.max_device_hours) ||
      bad(r.wanted.max_storage_gb)) {
    return InvalidArgumentError(
        "quota request: a limit must be a finite number, not negative (leave it unset for "
        "unlimited)");
  }
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  r.state = RequestState::kPending;
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("INSERT INTO quota_requests (subject, name, requester, "
                                   "max_devices, max_device_hours, max_storage_gb, reason, state, "
                                   "decided_by, decision_reason) VALUES (?,?,?,?,?,?,?,?,'','')"));
  st.Bind(1, QuotaSubjectName(r.subject));
  st.Bind(2, r.name);
  st.Bind(3, r.requester);
  st.Bind(4, r.wanted.max_devices);
  st.Bind(5, r.wanted.max_device_hours);
  st.Bind(6, r.wanted.max_storage_gb);
  st.Bind(7, r.reason);
  st.Bind(8, RequestStateName(r.state));
  if (st.Step() != SQLITE_DONE) return m.db.Error("cannot file the request");
  r.id = sqlite3_last_insert_rowid(m.db.handle());
  return r;
}

Result<QuotaRequest> QuotaStore::Decide(int64_t id, bool approve, std::string_view admin,
                                        std::string_view reason) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_RETURN_IF_ERROR(m.db.Exec("BEGIN IMMEDIATE"));
  Result<QuotaRequest> r = m.DecideLocked(id, approve, admin, reason);
  if (!r.ok()) {
    m.db.Exec("ROLLBACK").IgnoreError();  // the error being returned says what went wrong
    return r;
  }
  KC_RETURN_IF_ERROR(m.db.Exec("COMMIT"));
  return r;
}

Result<std::vector<QuotaRequest>> QuotaStore::Requests(std::optional<RequestState> state) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(
      internal::Statement st,
      m.db.Prepare(fmt::format("SELECT {} FROM quota_requests WHERE (?1 = '' OR state = ?1) "
                               "ORDER BY id",
                               kRequestColumns)));
  st.Bind(1, state ? RequestStateName(*state) : std::string_view());
  std::vector<QuotaRequest> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) out.push_back(RequestRow(st));
  if (rc != SQLITE_DONE) return m.db.Error("cannot list requests");
  return out;
}

}  // namespace kc::api
