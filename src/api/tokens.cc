#include "api/tokens.h"

#include <fmt/format.h>
#include <openssl/rand.h>

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

}  // namespace

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
  return std::unique_ptr<TokenStore>(new TokenStore(std::move(impl)));
}

Result<IssuedToken> TokenStore::Issue(std::string_view user, double ttl_s, double now_s) {
  if (user.empty()) return InvalidArgumentError("token: user: must not be empty");
  if (!(ttl_s > 0)) return InvalidArgumentError("token: lifetime: must be positive");
  unsigned char secret[kSecretBytes];
  if (RAND_bytes(secret, sizeof(secret)) != 1) {
    return InternalError("token: the system's random source failed");
  }
  IssuedToken t{.token = std::string(kPrefix) + Hex(secret, sizeof(secret)),
                .user = std::string(user),
                .expires_s = now_s + ttl_s};
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("INSERT INTO tokens (hash, user, issued_s, expires_s) "
                                   "VALUES (?,?,?,?)"));
  st.Bind(1, Sha256Hex(t.token));
  st.Bind(2, t.user);
  st.Bind(3, now_s);
  st.Bind(4, t.expires_s);
  if (st.Step() != SQLITE_DONE) return m.db.Error("cannot record the token");
  return t;
}

Result<std::string> TokenStore::Authenticate(std::string_view token, double now_s) const {
  if (!WellFormed(token)) {
    return UnauthenticatedError("token: malformed (expected kc_ and 64 hex digits)");
  }
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("SELECT user, expires_s, revoked FROM tokens WHERE hash = ?"));
  st.Bind(1, Sha256Hex(token));
  const int rc = st.Step();
  if (rc == SQLITE_DONE) return UnauthenticatedError("token: unknown (never issued here)");
  if (rc != SQLITE_ROW) return m.db.Error("cannot read");
  if (st.Int(2) != 0) return UnauthenticatedError("token: revoked");
  if (now_s >= st.Double(1)) {
    return UnauthenticatedError(fmt::format("token: expired (log in again: kc login)"));
  }
  return st.Text(0);
}

Result<int64_t> TokenStore::RevokeAll(std::string_view user) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(internal::Statement st,
                      m.db.Prepare("UPDATE tokens SET revoked = 1 WHERE user = ? AND revoked = 0"));
  st.Bind(1, user);
  if (st.Step() != SQLITE_DONE) return m.db.Error("cannot revoke");
  return static_cast<int64_t>(sqlite3_changes(m.db.handle()));
}

}  // namespace kc::api
