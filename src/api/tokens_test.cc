#include "api/tokens.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

class TokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<TokenStore>> s = TokenStore::Open(path_);
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_ = std::move(*s);
  }
  testing::TempDir dir_{"kc_tokens"};
  std::string path_ = dir_.Path("kcd.db");
  std::unique_ptr<TokenStore> store_;
};

TEST_F(TokensTest, AnIssuedTokenAuthenticatesItsUserUntilItExpires) {
  Result<IssuedToken> t = store_->Issue("ann", 3600, 1000);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->token.size(), 3u + 64u);
  EXPECT_EQ(store_->Authenticate(t->token, 1000)->subject, "ann");
  EXPECT_EQ(store_->Authenticate(t->token, 4599)->kind, TokenKind::kUser);
  Result<TokenIdentity> late = store_->Authenticate(t->token, 4600);
  EXPECT_EQ(late.status().code(), ErrorCode::kUnauthenticated);
  EXPECT_THAT(late.status().message(), HasSubstr("expired"));
  // Two tokens are never the same.
  EXPECT_NE(store_->Issue("ann", 10, 0)->token, store_->Issue("ann", 10, 0)->token);
}

TEST_F(TokensTest, ForgedMalformedAndRevokedTokensAreRefused) {
  Result<IssuedToken> t = store_->Issue("bob", 3600, 0);
  ASSERT_TRUE(t.ok());
  std::string forged = t->token;
  forged.back() = forged.back() == '0' ? '1' : '0';
  EXPECT_THAT(store_->Authenticate(forged, 1).status().message(), HasSubstr("unknown"));
  EXPECT_THAT(store_->Authenticate("kc_xyz", 1).status().message(), HasSubstr("malformed"));
  EXPECT_THAT(store_->Authenticate("", 1).status().message(), HasSubstr("malformed"));
  EXPECT_EQ(*store_->RevokeAll("bob", 1), 1);
  Result<TokenIdentity> r = store_->Authenticate(t->token, 1);
  EXPECT_EQ(r.status().code(), ErrorCode::kUnauthenticated);
  EXPECT_THAT(r.status().message(), HasSubstr("revoked"));
  EXPECT_EQ(store_->Issue("", 10, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->Issue("bob", 0, 0).status().code(), ErrorCode::kInvalidArgument);
}

TEST_F(TokensTest, OnlyTheHashIsStored) {
  Result<IssuedToken> t = store_->Issue("ann", 3600, 0);
  ASSERT_TRUE(t.ok());
  store_.reset();  // closed: everything is in the database file
  std::ifstream in(path_, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  std::ifstream wal(path_ + "-wal", std::ios::binary);
  bytes << wal.rdbuf();
  EXPECT_EQ(bytes.str().find(t->token.substr(3)), std::string::npos);
  // And it still works after reopening.
  Result<std::unique_ptr<TokenStore>> again = TokenStore::Open(path_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->Authenticate(t->token, 1)->subject, "ann");
}

// A user's revocation takes its run tokens with it, not its agent's namesake; it is
// remembered with its time; one token is revoked by its hash.
TEST_F(TokensTest, RevokingAUserTakesItsRunTokensAndIsRemembered) {
  const IssuedToken user = *store_->Issue("ann", 3600, 0);
  const IssuedToken run = *store_->Issue("ann", 3600, 0, TokenKind::kRun);
  const IssuedToken agent = *store_->Issue("ann", 3600, 0, TokenKind::kAgent);
  EXPECT_EQ(store_->Authenticate(run.token, 1)->kind, TokenKind::kRun);
  EXPECT_EQ(*store_->RevokedAt("ann"), 0);
  EXPECT_EQ(*store_->RevokeAll("ann", 50), 2);
  EXPECT_EQ(*store_->RevokedAt("ann"), 50);
  EXPECT_FALSE(store_->Authenticate(user.token, 60).ok());
  EXPECT_FALSE(store_->Authenticate(run.token, 60).ok());
  EXPECT_EQ(store_->Authenticate(agent.token, 60)->kind, TokenKind::kAgent);
  EXPECT_EQ(*store_->RevokeAll("ann", 70, TokenKind::kAgent), 1);
  EXPECT_EQ(*store_->RevokedAt("ann"), 50);  // an agent's revocation is not the user's
  const IssuedToken one = *store_->Issue("bob", 3600, 0, TokenKind::kRun);
  const IssuedToken other = *store_->Issue("bob", 3600, 0, TokenKind::kRun);
  ASSERT_TRUE(store_->Revoke(one.hash).ok());
  EXPECT_THAT(store_->Authenticate(one.token, 1).status().message(), HasSubstr("revoked"));
  EXPECT_TRUE(store_->Authenticate(other.token, 1).ok());
}

}  // namespace
}  // namespace kc::api
