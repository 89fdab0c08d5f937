#include "api/audit_log.h"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <sqlite3.h>

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

// Statement with RAII finalize.
struct Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt() { sqlite3_finalize(s); }
};

std::string Text(sqlite3_stmt* s, int col) {
  const unsigned char* t = sqlite3_column_text(s, col);
  return t == nullptr ? "" : reinterpret_cast<const char*>(t);
}

AuditRecord Row(sqlite3_stmt* s) {
  return {.seq = sqlite3_column_int64(s, 0),
          .time_s = sqlite3_column_double(s, 1),
          .principal = Text(s, 2),
          .action = Text(s, 3),
          .resource = Text(s, 4),
          .outcome = Text(s, 5),
          .reason = Text(s, 6),
          .prev_hash = Text(s, 7),
          .hash = Text(s, 8)};
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
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(buf.data(), buf.size(), md, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

struct AuditLog::Impl {
  std::string path;
  mutable Mutex mu;
  sqlite3* db KC_GUARDED_BY(mu) = nullptr;
  int64_t last_seq KC_GUARDED_BY(mu) = 0;
  std::string last_hash KC_GUARDED_BY(mu) = kGenesis;

  Status Error(std::string_view what) const KC_REQUIRES(mu) {
    return UnavailableError(fmt::format("audit log {}: {}: {}", path, what, sqlite3_errmsg(db)));
  }
};

AuditLog::AuditLog(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AuditLog::~AuditLog() {
  MutexLock lock(&impl_->mu);
  sqlite3_close(impl_->db);
}

Result<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  MutexLock lock(&impl->mu);
  if (sqlite3_open_v2(path.c_str(), &impl->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                      nullptr) != SQLITE_OK) {
    Status s = impl->Error("cannot open");
    sqlite3_close(impl->db);
    impl->db = nullptr;
    return s;
  }
  for (const char* sql : {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=FULL;", kSchema}) {
    if (sqlite3_exec(impl->db, sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
      Status s = impl->Error("not an audit log, or cannot be set up");
      sqlite3_close(impl->db);
      impl->db = nullptr;
      return s;
    }
  }
  Stmt st;
  const std::string last = fmt::format("SELECT {} FROM audit ORDER BY seq DESC LIMIT 1", kColumns);
  if (sqlite3_prepare_v2(impl->db, last.c_str(), -1, &st.s, nullptr) != SQLITE_OK) {
    return impl->Error("cannot read");
  }
  if (sqlite3_step(st.s) == SQLITE_ROW) {
    AuditRecord r = Row(st.s);
    impl->last_seq = r.seq;
    impl->last_hash = r.hash;
  }
  return std::unique_ptr<AuditLog>(new AuditLog(std::move(impl)));
}

Result<AuditRecord> AuditLog::Append(AuditRecord r) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  r.seq = m.last_seq + 1;
  r.prev_hash = m.last_hash;
  r.hash = AuditRecordHash(r);
  Stmt st;
  const std::string sql =
      fmt::format("INSERT INTO audit ({}) VALUES (?,?,?,?,?,?,?,?,?)", kColumns);
  if (sqlite3_prepare_v2(m.db, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK) {
    return m.Error("cannot append");
  }
  sqlite3_bind_int64(st.s, 1, r.seq);
  sqlite3_bind_double(st.s, 2, r.time_s);
  int col = 3;
  for (const std::string* f :
       {&r.principal, &r.action, &r.resource, &r.outcome, &r.reason, &r.prev_hash, &r.hash}) {
    sqlite3_bind_text(st.s, col++, f->c_str(), static_cast<int>(f->size()), SQLITE_TRANSIENT);
  }
  if (sqlite3_step(st.s) != SQLITE_DONE) return m.Error("cannot append");
  m.last_seq = r.seq;
  m.last_hash = r.hash;
  return r;
}

Result<std::vector<AuditRecord>> AuditLog::Query(const AuditQuery& q) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  Stmt st;
  const std::string sql = fmt::format(
      "SELECT {} FROM audit WHERE seq > ? AND time_s >= ? AND (? = '' OR principal = ?) "
      "AND (? = '' OR action = ? OR (substr(?, -1) = '.' AND substr(action, 1, length(?)) = ?)) "
      "ORDER BY seq LIMIT ?",
      kColumns);
  if (sqlite3_prepare_v2(m.db, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK) {
    return m.Error("cannot query");
  }
  sqlite3_bind_int64(st.s, 1, q.after_seq);
  sqlite3_bind_double(st.s, 2, q.since_s);
  sqlite3_bind_text(st.s, 3, q.principal.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 4, q.principal.c_str(), -1, SQLITE_TRANSIENT);
  for (int i = 5; i <= 9; ++i) sqlite3_bind_text(st.s, i, q.action.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(st.s, 10, q.limit);
  std::vector<AuditRecord> out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) out.push_back(Row(st.s));
  if (rc != SQLITE_DONE) return m.Error("cannot query");
  return out;
}

Result<AuditVerifyResult> AuditLog::Verify(const std::string& expected_head) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  Stmt st;
  const std::string sql = fmt::format("SELECT {} FROM audit ORDER BY rowid", kColumns);
  if (sqlite3_prepare_v2(m.db, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK) {
    return m.Error("cannot read");
  }
  AuditVerifyResult v;
  std::string prev = kGenesis;
  int64_t expect_seq = 1;
  int rc;
  auto bad = [&v](int64_t seq, std::string problem) {
    v.ok = false;
    v.first_bad_seq = seq;
    v.problem = std::move(problem);
  };
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
    const AuditRecord r = Row(st.s);
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
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return m.Error("cannot read");
  v.head = prev;
  if (v.ok && !expected_head.empty() && expected_head != prev) {
    bad(expect_seq, fmt::format("the last record's hash is {}, not the expected head {}: records "
                                "were removed from the end, or the head belongs to another log",
                                prev, expected_head));
  }
  return v;
}

std::string AuditLog::head() const {
  MutexLock lock(&impl_->mu);
  return impl_->last_hash;
}

}  // namespace kc::api
