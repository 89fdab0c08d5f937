#include "api/audit_log.h"

#include <fmt/format.h>
#include <openssl/rand.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "api/internal/digest.h"
#include "api/internal/sqlite.h"
#include "base/file.h"
#include "base/mutex.h"

namespace kc::api {
namespace {

namespace fs = std::filesystem;

const std::string kGenesis(64, '0');
constexpr size_t kKeyHexDigits = 64;  // 256 bits

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

bool IsHex(std::string_view s, size_t digits) {
  return s.size() == digits && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// The key of the log at `path`: kNotFound when there is none, kDataLoss when it is not one.
Result<std::string> ReadKey(const std::string& key_path) {
  KC_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(key_path));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (!IsHex(text, kKeyHexDigits)) {
    return DataLossError(fmt::format("{}: not an audit key (64 hex digits)", key_path));
  }
  return text;
}

// A new key, written 0600.
Result<std::string> MakeKey(const std::string& key_path) {
  unsigned char bytes[kKeyHexDigits / 2];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return InternalError("audit: the system's random source failed");
  }
  std::string key;
  for (unsigned char b : bytes) key += fmt::format("{:02x}", b);
  KC_RETURN_IF_ERROR(WriteFileDurably(key_path, key + "\n", {.mode = 0600}));
  return key;
}

std::string HeadMac(std::string_view key, const AuditHead& h) {
  return internal::HmacSha256Hex(key, fmt::format("kc-audit-head:{}:{}", h.seq, h.hash));
}

// The head file of a log: nullopt when there is none; kDataLoss when it is not one, or its
// MAC is not the key's (it was changed).
Result<std::optional<AuditHead>> ReadHead(const std::string& head_path, std::string_view key) {
  Result<std::string> text = ReadWholeFile(head_path);
  if (!text.ok()) {
    if (text.status().code() == ErrorCode::kNotFound) return std::optional<AuditHead>();
    return text.status();
  }
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  const bool shaped = j.is_object() && j.contains("seq") && j["seq"].is_number_integer() &&
                      j.contains("hash") && j["hash"].is_string() && j.contains("mac") &&
                      j["mac"].is_string();
  if (!shaped) return DataLossError(fmt::format("{}: not an audit head file", head_path));
  const AuditHead h{.seq = j["seq"].get<int64_t>(), .hash = j["hash"].get<std::string>()};
  if (j["mac"].get<std::string>() != HeadMac(key, h)) {
    return DataLossError(fmt::format("{}: its MAC is not the key's: it was changed", head_path));
  }
  return std::optional<AuditHead>(h);
}

// Replaces the head file with `h` (0600; concurrent writers each through a file of their own).
Status WriteHead(const std::string& head_path, std::string_view key, const AuditHead& h) {
  const nlohmann::json j = {{"seq", h.seq}, {"hash", h.hash}, {"mac", HeadMac(key, h)}};
  return WriteFileDurably(head_path, j.dump() + "\n", {.mode = 0600, .unique_temp = true});
}

}  // namespace

std::string AuditKeyPath(const std::string& log_path) {
  return fs::path(log_path).replace_extension(".key").string();
}

std::string AuditHeadPath(const std::string& log_path) {
  return fs::path(log_path).replace_extension(".head").string();
}

std::string AuditRecordHash(const AuditRecord& r, std::string_view key) {
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
  return internal::HmacSha256Hex(key, buf);
}

struct AuditLog::Impl {
  // Immutable after Open.
  std::string path;
  std::string key;  // "" when opened without one (OpenExisting): no Verify
  bool writable = false;

  mutable Mutex mu;
  internal::Database db KC_GUARDED_BY(mu);
  AuditHead known KC_GUARDED_BY(mu) = {.seq = 0, .hash = kGenesis};
  int64_t head_written KC_GUARDED_BY(mu) = -1;  // the seq this process last wrote to the file

  // OK when the log holds record known.seq with MAC known.hash (and so extends it); kDataLoss
  // naming what is wrong otherwise. Inside the caller's transaction.
  Status ExtendsKnownHead() const KC_REQUIRES(mu) {
    if (known.seq == 0) return OkStatus();
    KC_ASSIGN_OR_RETURN(internal::Statement st,
                        db.Prepare("SELECT hash, (SELECT MAX(seq) FROM audit) FROM audit "
                                   "WHERE seq = ?"));
    st.Bind(1, known.seq);
    const int rc = st.Step();
    if (rc == SQLITE_DONE) {
      return DataLossError(fmt::format(
          "audit log {}: record {}, the head its writers know, is gone: records were removed "
          "from its end (run kc audit verify; nothing is appended to a log in this state)",
          path, known.seq));
    }
    if (rc != SQLITE_ROW) return db.Error("cannot read the chain's head");
    if (st.Text(0) != known.hash) {
      return DataLossError(fmt::format(
          "audit log {}: record {} is not the one its writers know: the log was changed or "
          "re-chained (run kc audit verify; nothing is appended to a log in this state)",
          path, known.seq));
    }
    return OkStatus();
  }
};

AuditLog::AuditLog(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AuditLog::~AuditLog() = default;

Result<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->writable = true;
  MutexLock lock(&impl->mu);
  KC_RETURN_IF_ERROR(impl->db.Open(path, "audit log", kSchema));
  KC_ASSIGN_OR_RETURN(internal::Statement count, impl->db.Prepare("SELECT COUNT(*) FROM audit"));
  if (count.Step() != SQLITE_ROW) return impl->db.Error("cannot read");
  const bool empty = count.Int(0) == 0;
  const std::string key_path = AuditKeyPath(path), head_path = AuditHeadPath(path);
  Result<std::string> key = ReadKey(key_path);
  if (!key.ok() && key.status().code() == ErrorCode::kNotFound && empty && !fs::exists(head_path)) {
    key = MakeKey(key_path);  // a new log
  } else if (!key.ok() && key.status().code() == ErrorCode::kNotFound) {
    return FailedPreconditionError(
        fmt::format("audit log {}: its key {} is missing: its chain can be neither extended nor "
                    "checked",
                    path, key_path));
  }
  KC_RETURN_IF_ERROR(key.status());
  impl->key = *std::move(key);
  KC_ASSIGN_OR_RETURN(std::optional<AuditHead> head, ReadHead(head_path, impl->key));
  if (!head) {
    if (!empty) {
      return DataLossError(fmt::format(
          "audit log {}: its head file {} is missing: records removed from its end could not "
          "be noticed (run kc audit verify)",
          path, head_path));
    }
    head = AuditHead{.seq = 0, .hash = kGenesis};
    KC_RETURN_IF_ERROR(WriteHead(head_path, impl->key, *head));
  }
  impl->known = *head;
  KC_RETURN_IF_ERROR(impl->ExtendsKnownHead());
  return std::unique_ptr<AuditLog>(new AuditLog(std::move(impl)));
}

Result<std::unique_ptr<AuditLog>> AuditLog::OpenExisting(const std::string& path,
                                                         const std::string& key_path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  MutexLock lock(&impl->mu);
  KC_RETURN_IF_ERROR(impl->db.OpenExisting(path, "audit log"));
  // Asking SQLite about the file reads it and writes nothing.
  Result<internal::Statement> st = impl->db.Prepare(
      "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'audit'");
  if (!st.ok() || st->Step() != SQLITE_ROW || st->Int(0) != 1) {
    return InvalidArgumentError(fmt::format("{}: not an audit log", path));
  }
  Result<std::string> key = ReadKey(key_path.empty() ? AuditKeyPath(path) : key_path);
  if (key.ok()) {
    impl->key = *std::move(key);
  } else if (key.status().code() != ErrorCode::kNotFound) {
    return key.status();
  }
  return std::unique_ptr<AuditLog>(new AuditLog(std::move(impl)));
}

Result<AuditRecord> AuditLog::Append(AuditRecord r) {
  Impl& m = *impl_;
  if (!m.writable) {
    return FailedPreconditionError(fmt::format("audit log {}: opened to read only", m.path));
  }
  MutexLock lock(&m.mu);
  // The chain's end is read inside the write transaction: another process (kc token, a
  // second kcd by mistake) may have appended since, and must not fork the chain.
  KC_RETURN_IF_ERROR(m.db.Exec("BEGIN IMMEDIATE"));
  Status s = [&]() KC_REQUIRES(m.mu) -> Status {
    KC_RETURN_IF_ERROR(m.ExtendsKnownHead());
    KC_ASSIGN_OR_RETURN(
        internal::Statement last,
        m.db.Prepare(fmt::format("SELECT {} FROM audit ORDER BY seq DESC LIMIT 1", kColumns)));
    const int rc = last.Step();
    AuditHead end{.seq = 0, .hash = kGenesis};
    if (rc == SQLITE_ROW) {
      const AuditRecord at_end = Row(last);
      // Appended by another writer since: it must hold the key too.
      if (at_end.seq != m.known.seq && AuditRecordHash(at_end, m.key) != at_end.hash) {
        return DataLossError(fmt::format(
            "audit log {}: its last record, {}, does not match its MAC: it was written "
            "without the key (run kc audit verify; nothing is appended to a log in this "
            "state)",
            m.path, at_end.seq));
      }
      end = {.seq = at_end.seq, .hash = at_end.hash};
    } else if (rc != SQLITE_DONE) {
      return m.db.Error("cannot read the chain's end");
    }
    r.seq = end.seq + 1;
    r.prev_hash = end.hash;
    r.hash = AuditRecordHash(r, m.key);
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
  m.known = {.seq = r.seq, .hash = r.hash};
  // After the commit: a crash in between leaves the file behind the log, which still extends
  // it; ahead of the log it would be a false alarm.
  if (r.seq > m.head_written) {
    KC_RETURN_IF_ERROR(WriteHead(AuditHeadPath(m.path), m.key, m.known));
    m.head_written = r.seq;
  }
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

Result<AuditVerifyResult> AuditLog::Verify(const AuditVerifyOptions& options) const {
  const Impl& m = *impl_;
  const std::string& expected_head = options.expected_head;
  if (m.key.empty()) {
    return FailedPreconditionError(fmt::format(
        "{}: its key ({}) is not there: a chain is checked with the key that made it (give "
        "--key)",
        m.path, AuditKeyPath(m.path)));
  }
  AuditHead known;
  {
    MutexLock lock(&m.mu);
    known = m.known;
  }
  // The heads the log must hold: the head file's (when it has one, its MAC checked) and this
  // process's.
  AuditVerifyResult v;
  auto bad = [&v](int64_t seq, std::string problem) {
    if (!v.ok) return;
    v.ok = false;
    v.first_bad_seq = seq;
    v.problem = std::move(problem);
  };
  const std::string head_path = AuditHeadPath(m.path);
  Result<std::optional<AuditHead>> file_head = ReadHead(head_path, m.key);
  std::vector<std::pair<AuditHead, std::string>> heads;  // the head, and whose it is
  std::string head_file_problem;                         // reported after the records'
  if (!file_head.ok()) {
    head_file_problem = file_head.status().message();
  } else if (!file_head->has_value()) {
    head_file_problem = fmt::format(
        "its head file {} is missing: records removed from its end would not be noticed",
        head_path);
  } else {
    heads.emplace_back(**file_head, "the head file's");
  }
  if (m.writable) heads.emplace_back(known, "the head its writer keeps");
  // On a connection of its own, in one read transaction: a snapshot, without holding the
  // mutex the writers need.
  internal::Database db;
  KC_RETURN_IF_ERROR(db.OpenExisting(m.path, "audit log"));
  KC_RETURN_IF_ERROR(db.Exec("BEGIN"));
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      db.Prepare(fmt::format("SELECT {} FROM audit ORDER BY rowid", kColumns)));
  std::string prev = kGenesis;
  int64_t expect_seq = 1;
  bool expected_found = expected_head.empty();
  int rc;
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
    if (AuditRecordHash(r, m.key) != r.hash) {
      bad(r.seq, fmt::format("record {} does not match its hash: it was edited, or written "
                             "without the key",
                             r.seq));
      break;
    }
    for (const auto& [h, whose] : heads) {
      if (h.seq == r.seq && h.hash != r.hash) {
        bad(r.seq, fmt::format("record {} is not {} ({}): the log was re-chained from it on", r.seq,
                               whose, h.hash));
      }
    }
    expected_found |= r.hash == expected_head;
    prev = r.hash;
    ++expect_seq;
    if (options.on_record) options.on_record(r.seq);
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return db.Error("cannot read");
  sqlite3_reset(st.get());
  db.Exec("COMMIT").IgnoreError();  // a read transaction: nothing to lose
  v.head = prev;
  v.head_seq = expect_seq - 1;
  if (v.ok) {
    for (const auto& [h, whose] : heads) {
      if (h.seq > v.head_seq) {
        bad(v.head_seq + 1,
            fmt::format("the log ends at record {}, and {} is record {}: records were removed "
                        "from the end",
                        v.head_seq, whose, h.seq));
      }
    }
  }
  if (v.ok && !head_file_problem.empty()) bad(v.head_seq + 1, head_file_problem);
  if (v.ok && !expected_found) {
    bad(expect_seq, fmt::format("no record has the expected head {}: records were removed from "
                                "the end, or the head belongs to another log",
                                expected_head));
  }
  return v;
}

std::string AuditLog::head() const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  // From the file: another process may have appended.
  Result<internal::Statement> st = m.db.Prepare("SELECT hash FROM audit ORDER BY seq DESC LIMIT 1");
  if (st.ok() && st->Step() == SQLITE_ROW) return st->Text(0);
  return kGenesis;
}

AuditHead AuditLog::known_head() const {
  MutexLock lock(&impl_->mu);
  return impl_->known;
}

}  // namespace kc::api
