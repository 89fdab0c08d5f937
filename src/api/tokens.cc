#include "api/tokens.h"

#include <fmt/format.h>
#include <openssl/rand.h>

#include <cmath>
#include <optional>

#include "api/internal/digest.h"
#include "api/internal/sqlite.h"
#include "base/mutex.h"

namespace kc::api {
namespace {

using internal::Sha256Hex;

constexpr char kSchema[] = R"(
CREATE TABLE IF NOT EXISTS tokens (
  hash TEXT PRIMARY KEY,
  user TEXT NOT NULL,
  issued_s REAL NOT NULL,
  expires_s REAL NOT NULL,
  revoked INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS token_revocations (
  subject TEXT NOT NULL,
  kind TEXT NOT NULL,
  time_s REAL NOT NULL
);
)";
constexpr std::string_view kPrefix = "kc_";
constexpr size_t kSecretBytes = 32;  // 256 bits

std::string Hex(const unsigned char* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += fmt::format("{:02x}", p[i]);
  return out;
}

bool WellFormed(std::string_view t) {
  if (t.size() != kPrefix.size() + 2 * kSecretBytes || !t.starts_with(kPrefix)) return false;
  for (char c : t.substr(kPrefix.size())) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::optional<TokenKind> KindFromName(std::string_view name) {
  for (TokenKind k : {TokenKind::kUser, TokenKind::kRun, TokenKind::kAgent}) {
    if (TokenKindName(k) == name) return k;
  }
  return std::nullopt;
}

}  // namespace

std::string_view TokenKindName(TokenKind k) {
  switch (k) {
    case TokenKind::kUser:
      return "user";
    case TokenKind::kRun:
      return "run";
    case TokenKind::kAgent:
      return "agent";
  }
  return "?";
}

struct TokenStore::Impl {
  mutable Mutex mu;
  internal::Database db KC_GUARDED_BY(mu);
};

TokenStore::TokenStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenStore::~TokenStore() = default;

Result<std::unique_ptr<TokenStore>> TokenStore::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  MutexLock lock(&impl->mu);
  KC_RETURN_IF_ERROR(impl->db.Open(path, "token store", kSchema));
  // Tokens issued before kinds existed are users'.
  KC_ASSIGN_OR_RETURN(internal::Statement has_kind,
                      impl->db.Prepare("SELECT 1 FROM pragma_table_info('tokens') "
                                       "WHERE name = 'kind'"));
  if (has_kind.Step() != SQLITE_ROW) {
    KC_RETURN_IF_ERROR(
        impl->db.Exec("ALTER TABLE tokens ADD COLUMN kind TEXT NOT NULL DEFAULT 'user'"));
  }
  return std::unique_ptr<TokenStore>(new TokenStore(std::move(impl)));
}

Result<IssuedToken> TokenStore::Issue(std::string_view subject, double ttl_s, double now_s,
                                      TokenKind kind) {
  if (subject.empty()) return InvalidArgumentError("token: subject: must not be empty");
  if (!(ttl_s > 0) || !(ttl_s <= kMaxTokenLifetimeS)) {
    return InvalidArgumentError(
        fmt::format("token: lifetime: must be positive and at most {} days, got {} s",
                    kMaxTokenLifetimeS / 86400, ttl_s));
  }
  unsigned char secret[kSecretBytes];
  if (RAND_bytes(secret, sizeof(secret)) != 1) {
    return InternalError("token: the system's random source failed");
  }
  IssuedToken t{.token = std::string(kPrefix) + Hex(secret, sizeof(secret)),
                .user = std::string(subject),
                .kind = kind,
                .expires_s = now_s + ttl_s};
  t.hash = Sha256Hex(t.token);
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("INSERT INTO tokens (hash, user, issued_s, expires_s, kind) "
                                   "VALUES (?,?,?,?,?)"));
  st.Bind(1, t.hash);
  st.Bind(2, t.user);
  st.Bind(3, now_s);
  st.Bind(4, t.expires_s);
  st.Bind(5, TokenKindName(kind));
  if (st.Step() != SQLITE_DONE) return m.db.Error("cannot record the token");
  return t;
}

Result<TokenIdentity> TokenStore::Authenticate(std::string_view token, double now_s) const {
  if (!WellFormed(token)) {
    return UnauthenticatedError("token: malformed (expected kc_ and 64 hex digits)");
  }
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(
      internal::Statement st,
      m.db.Prepare("SELECT user, expires_s, revoked, kind FROM tokens WHERE hash = ?"));
  st.Bind(1, Sha256Hex(token));
  const int rc = st.Step();
  if (rc == SQLITE_DONE) return UnauthenticatedError("token: unknown (never issued here)");
  if (rc != SQLITE_ROW) return m.db.Error("cannot read");
  if (st.Int(2) != 0) return UnauthenticatedError("token: revoked");
  if (!(now_s < st.Double(1))) {
    return UnauthenticatedError(fmt::format("token: expired (log in again: kc login)"));
  }
  const std::optional<TokenKind> kind = KindFromName(st.Text(3));
  if (!kind) return UnauthenticatedError("token: of an unknown kind");
  return TokenIdentity{.subject = st.Text(0), .kind = *kind};
}

Result<int64_t> TokenStore::RevokeAll(std::string_view subject, double now_s, TokenKind kind) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_RETURN_IF_ERROR(m.db.Exec("BEGIN IMMEDIATE"));
  Result<int64_t> revoked = [&]() KC_REQUIRES(m.mu) -> Result<int64_t> {
    KC_ASSIGN_OR_RETURN(
        internal::Statement st,
        m.db.Prepare("UPDATE tokens SET revoked = 1 WHERE user = ?1 AND revoked = 0 AND "
                     "(kind = ?2 OR (?2 = 'user' AND kind = 'run'))"));
    st.Bind(1, subject);
    st.Bind(2, TokenKindName(kind));
    if (st.Step() != SQLITE_DONE) return m.db.Error("cannot revoke");
    const auto n = static_cast<int64_t>(sqlite3_changes(m.db.handle()));
    KC_ASSIGN_OR_RETURN(
        internal::Statement at,
        m.db.Prepare("INSERT INTO token_revocations (subject, kind, time_s) VALUES (?,?,?)"));
    at.Bind(1, subject);
    at.Bind(2, TokenKindName(kind));
    at.Bind(3, now_s);
    if (at.Step() != SQLITE_DONE) return m.db.Error("cannot record the revocation");
    return n;
  }();
  if (!revoked.ok()) {
    m.db.Exec("ROLLBACK").IgnoreError();  // the failure to report is revoked's
    return revoked;
  }
  KC_RETURN_IF_ERROR(m.db.Exec("COMMIT"));
  return revoked;
}

Status TokenStore::Revoke(std::string_view hash) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("UPDATE tokens SET revoked = 1 WHERE hash = ?"));
  st.Bind(1, hash);
  if (st.Step() != SQLITE_DONE) return m.db.Error("cannot revoke");
  return OkStatus();
}

Result<double> TokenStore::RevokedAt(std::string_view user) const {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("SELECT COALESCE(MAX(time_s), 0) FROM token_revocations "
                                   "WHERE subject = ? AND kind = 'user'"));
  st.Bind(1, user);
  if (st.Step() != SQLITE_ROW) return m.db.Error("cannot read the revocations");
  return st.Double(0);
}

}  // namespace kc::api
