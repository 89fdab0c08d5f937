// Bearer tokens: 256-bit random secrets that authenticate a principal to kcd. Only their
// SHA-256 is stored, so a copy of kcd's database gives no working token. A token has a kind,
// which bounds what it can be used for: a user's (what `kc login` keeps), a run's (kcd's, for one
// run's execution-time checks, revoked when the run ends) and an agent's (a host's machine
// identity, for the agent service only). Docs: docs/operations/roles.md ("Tokens").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kc::api {

enum class TokenKind : uint8_t {
  kUser,   // a user of the roles file, for every call its role allows
  kRun,    // issued by kcd to a job's owner for one run: PermissionService.Check only
  kAgent,  // a host's agent (the subject is the host's name): AgentService only
};
std::string_view TokenKindName(TokenKind k);  // "user", "run", "agent"

// The longest a token may live: ten years. No token lives for ever.
inline constexpr double kMaxTokenLifetimeS = 3650 * 86400.0;

struct IssuedToken {
  std::string token;  // "kc_" + 64 hex digits: shown once, never stored
  std::string user;   // its subject: a user, or for an agent token a host
  TokenKind kind = TokenKind::kUser;
  double expires_s = 0;  // seconds since the Unix epoch
  std::string hash;      // SHA-256 (hex) of the token: how the store names it (Revoke)
};

// Who a token authenticates.
struct TokenIdentity {
  std::string subject;  // the user, or the host of an agent token
  TokenKind kind = TokenKind::kUser;
};

// Safe for concurrent use.
class TokenStore {
 public:
  // Opens or creates the token tables in the database at `path`. kUnavailable on failure.
  static Result<std::unique_ptr<TokenStore>> Open(const std::string& path);
  ~TokenStore();
  TokenStore(const TokenStore&) = delete;
  TokenStore& operator=(const TokenStore&) = delete;

  // A new token for `subject`, valid for `ttl_s` seconds from `now_s`. kInvalidArgument for an
  // empty subject or a lifetime that is not a positive number of seconds up to
  // kMaxTokenLifetimeS (infinity and NaN included); kInternal if the random source fails.
  Result<IssuedToken> Issue(std::string_view subject, double ttl_s, double now_s,
                            TokenKind kind = TokenKind::kUser);
  // Who a token belongs to. kUnauthenticated, saying which, for a malformed token, one never
  // issued (or forged), an expired one, or one revoked.
  Result<TokenIdentity> Authenticate(std::string_view token, double now_s) const;
  // Revokes every token of `subject` of `kind` (kUser: its user and run tokens; kAgent: the
  // host's agent tokens) and records when; returns how many.
  Result<int64_t> RevokeAll(std::string_view subject, double now_s,
                            TokenKind kind = TokenKind::kUser);
  // Revokes the one token whose hash is `hash` (IssuedToken::hash). OK if already revoked or
  // unknown.
  Status Revoke(std::string_view hash);
  // When `user`'s tokens were last revoked (RevokeAll of kind kUser); 0 if never. Work it
  // started before then must not start again with a fresh token.
  Result<double> RevokedAt(std::string_view user) const;

 private:
  struct Impl;
  explicit TokenStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kc::api
