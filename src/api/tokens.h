// Bearer tokens: 256-bit random secrets that authenticate a user to kcd. Only their SHA-256
// is stored, so a copy of kcd's database gives no working token. `kc login` keeps one in the
// user's configuration directory. Docs: docs/operations/roles.md ("Tokens").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kc::api {

struct IssuedToken {
  std::string token;  // "kc_" + 64 hex digits: shown once, never stored
  std::string user;
  double expires_s = 0;  // seconds since the Unix epoch
};

// Safe for concurrent use.
class TokenStore {
 public:
  // Opens or creates the token table in the database at `path`. kUnavailable on failure.
  static Result<std::unique_ptr<TokenStore>> Open(const std::string& path);
  ~TokenStore();
  TokenStore(const TokenStore&) = delete;
  TokenStore& operator=(const TokenStore&) = delete;

  // A new token for `user`, valid for `ttl_s` seconds from `now_s`. kInvalidArgument for an
  // empty user or a non-positive lifetime; kInternal if the system's random source fails.
  Result<IssuedToken> Issue(std::string_view user, double ttl_s, double now_s);
  // The user a token belongs to. kUnauthenticated, saying which, for a malformed token, one
  // never issued (or forged), an expired one, or one revoked.
  Result<std::string> Authenticate(std::string_view token, double now_s) const;
  // Revokes every token of `user`; returns how many.
  Result<int64_t> RevokeAll(std::string_view user);

 private:
  struct Impl;
  explicit TokenStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kc::api
