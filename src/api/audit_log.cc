#include "api/audit_log.h"

#include <fmt/format.h>

#include "api/internal/digest.h"
#include "api/internal/sqlite.h"
#include "base/mutex.h"

namespace kc::api {
namespace {

const std::string kGenesis(64, '0');

constexpr char kSchema[] = R"(
CREATE TABLE IF NOT EXISTS audit (
  seq INTEGER PRIMARY KEY,
  time_s REAL NOT NULL,
  principal TEXT NOT NULL,
  action TEXT NOT NULL,
  resource TEXT NOT NULL,
  outcome TEXT NOT NULL,
  reason TEXT NOT NULL,
  prev_hash TEXT NOT NULL,
  hash TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
  BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
  BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
)";

AuditRecord Row(const internal::Statement& s) {
  return {.seq = s.Int(0),
          .time_s = s.Double(1),
          .principal = s.Text(2),
          .action = s.Text(3),
          .resource = s.Text(4),
          .outcome = s.Text(5),
          .reason = s.Text(6),
          .prev_hash = s.Text(7),
          .hash = s.Text(8)};
}

constexpr char kColumns[] =
    "seq, time_s, principal, action, resource, outcome, reason, "
    "prev_hash, hash";

}  // namespace

std::string AuditRecordHash(const AuditRecord& r) {
  // Length-prefixed fields, so no two records serialise alike.
  std::string buf;
  auto add = [&buf](std::string_view f) { buf += fmt::format("{}:{};", f.size(), f); };
  add(std::to_string(r.seq));
  add(fmt::format("{:.6f}", r.time_s));
  add(r.principal);
  add(r.action);
  add(r.resource);
  add(r.outcome);
  add(r.reason);
  add(r.prev_hash);
  return internal::Sha256Hex(buf);
}

struct AuditLog::Impl {
  mutable Mutex mu;
  internal::Database db KC_GUARDED_BY(mu);
  int64_t last_seq KC_GUARDED_BY(mu) = 0;
  std::string last_hash KC_GUARDED_BY(mu) = kGenesis;
};

AuditLog::AuditLog(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AuditLog::~AuditLog() = default;

Result<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  MutexLock lock(&impl->mu);
  KC_RETURN_IF_ERROR(impl->db.Open(path, "audit log", kSchema));
  KC_ASSIGN_OR_RETURN(
      internal::Statement st,
      impl->db.Prepare(fmt::format("SELECT {} FROM audit ORDER BY seq DESC LIMIT 1", kColumns)));
  if (st.Step() == SQLITE_ROW) {
    AuditRecord r = Row(st);
    impl->last_seq = r.seq;
    impl->last_hash = r.hash;
  }
  return std::unique_ptr<AuditLog>(new AuditLog(std::move(impl)));
}

Result<AuditRecord> AuditLog::Append(AuditRecord r) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  // The chain's end is read inside the write transaction: another process (kc token, a
  // second kcd by mistake) may have appended since, and must not fork the chain.
  KC_RETURN_IF_ERROR(m.db.Exec("BEGIN IMMEDIATE"));
  Status s = [&]() KC_REQUIRES(m.mu) -> Status {
    KC_ASSIGN_OR_RETURN(internal::Statement last,
                        m.db.Prepare("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1"));
    const int rc = last.Step();
    if (rc == SQLITE_ROW) {
      m.last_seq = last.Int(0);
      m.last_hash = last.Text(1);
    } else if (rc != SQLITE_DONE) {
      return m.db.Error("cannot read the chain's end");
    }
    r.seq = m.last_seq + 1;
    r.prev_hash = m.last_hash;
    r.hash = AuditRecordHash(r);
    KC_ASSIGN_OR_RETURN(
        internal::Statement st,
        m.db.Prepare(fmt::format("INSERT INTO audit ({}) VALUES (?,?,?,?,?,?,?,?,?)", kColumns)));
    st.Bind(1, r.seq);
    st.Bind(2, r.time_s);
    int col = 3;
    for (const std::string* f :
         {&r.principal, &r.action, &r.resource, &r.outcome, &r.reason, &r.prev_hash, &r.hash}) {
      st.Bind(col++, *f);
    }
    if (st.Step() != SQLITE_DONE) return m.db.Error("cannot append");
    return OkStatus();
  }();
  if (!s.ok()) {
    m.db.Exec("ROLLBACK").IgnoreError();  // the failure to report is s
    return s;
  }
  KC_RETURN_IF_ERROR(m.db.Exec("COMMIT"));
  m.last_seq = r.seq;
  m.last_hash = r.hash;
  return r;
}

Result<std::vector<AuditRecord>> AuditLog::Query(const AuditQuery& q) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(
      internal::Statement st,
      m.db.Prepare(fmt::format(
          "SELECT {} FROM audit WHERE seq > ?1 AND time_s >= ?2 AND (?3 = '' OR principal = ?3) "
          "AND (?4 = '' OR action = ?4 OR (substr(?4, -1) = '.' AND "
          "substr(action, 1, length(?4)) = ?4)) "
          "AND substr(resource, 1, length(?6)) = ?6 ORDER BY seq LIMIT ?5",
          kColumns)));
  st.Bind(1, q.after_seq);
  st.Bind(2, q.since_s);
  st.Bind(3, q.principal);
  st.Bind(4, q.action);
  st.Bind(5, static_cast<int64_t>(q.limit));
  st.Bind(6, q.resource_prefix);
  std::vector<AuditRecord> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) out.push_back(Row(st));
  if (rc != SQLITE_DONE) return m.db.Error("cannot query");
  return out;
}

Result<AuditVerifyResult> AuditLog::Verify(const std::string& expected_head) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare(fmt::format("SELECT {} FROM audit ORDER BY rowid", kColumns)));
  AuditVerifyResult v;
  std::string prev = kGenesis;
  int64_t expect_seq = 1;
  int rc;
  auto bad = [&v](int64_t seq, std::string problem) {
    v.ok = false;
    v.first_bad_seq = seq;
    v.problem = std::move(problem);
  };
  while ((rc = st.Step()) == SQLITE_ROW) {
    const AuditRecord r = Row(st);
    ++v.records;
    if (r.seq != expect_seq) {
      bad(r.seq, fmt::format("record {} follows record {}: {} missing or out of order", r.seq,
                             expect_seq - 1, r.seq > expect_seq ? "records" : "a record"));
      break;
    }
    if (r.prev_hash != prev) {
      bad(r.seq, fmt::format("record {} does not link to record {} (a record before it was "
                             "changed, removed or moved)",
                             r.seq, r.seq - 1));
      break;
    }
    if (AuditRecordHash(r) != r.hash) {
      bad(r.seq, fmt::format("record {} does not match its hash: it was edited", r.seq));
      break;
    }
    prev = r.hash;
    ++expect_seq;
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return m.db.Error("cannot read");
  v.head = prev;
  if (v.ok && !expected_head.empty() && expected_head != prev) {
    bad(expect_seq, fmt::format("the last record's hash is {}, not the expected head {}: records "
                                "were removed from the end, or the head belongs to another log",
                                prev, expected_head));
  }
  return v;
}

std::string AuditLog::head() const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  // From the file: another process may have appended.
  Result<internal::Statement> st = m.db.Prepare("SELECT hash FROM audit ORDER BY seq DESC LIMIT 1");
  if (st.ok() && st->Step() == SQLITE_ROW) return st->Text(0);
  return m.last_hash;
}

}  // namespace kc::api
