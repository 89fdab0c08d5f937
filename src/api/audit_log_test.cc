#include "api/audit_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

AuditRecord Rec(std::string who, std::string action, std::string outcome = "ok") {
  return {.seq = 0,
          .time_s = 1.7e9,
          .principal = std::move(who),
          .action = std::move(action),
          .resource = "job/1",
          .outcome = std::move(outcome),
          .reason = "because",
          .prev_hash = "",
          .hash = ""};
}

// Tampers with the database behind the log's back, as someone with file access could.
void Tamper(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const std::string all = "DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete; " + sql;
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, all.c_str(), nullptr, nullptr, &err), SQLITE_OK) << err;
  sqlite3_free(err);
  sqlite3_close(db);
}

class AuditLogTest : public ::testing::Test {
 protected:
  void Fill(int n) {
    Result<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_);
    ASSERT_TRUE(log.ok()) << log.status().message();
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(
          (*log)->Append(Rec(i % 2 ? "ann" : "bob", i % 3 ? "job.submit" : "plan.approve")).ok());
    }
    head_ = (*log)->head();
  }
  AuditVerifyResult Verify(const std::string& head = "") {
    Result<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_);
    KC_CHECK(log.ok()) << log.status().message();
    Result<AuditVerifyResult> v = (*log)->Verify(head);
    KC_CHECK(v.ok()) << v.status().message();
    return *v;
  }
  testing::TempDir dir_{"kc_audit"};
  std::string path_ = dir_.Path("audit.db");
  std::string head_;
};

TEST_F(AuditLogTest, AppendsAChainThatVerifiesAndContinuesAfterReopening) {
  Fill(5);
  AuditVerifyResult v = Verify(head_);
  EXPECT_TRUE(v.ok) << v.problem;
  EXPECT_EQ(v.records, 5);
  EXPECT_EQ(v.head, head_);
  Fill(3);  // reopened: seq and chain go on
  v = Verify();
  EXPECT_TRUE(v.ok) << v.problem;
  EXPECT_EQ(v.records, 8);
  Result<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_);
  ASSERT_TRUE(log.ok());
  Result<std::vector<AuditRecord>> all = (*log)->Query({});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 8u);
  EXPECT_EQ((*all)[7].seq, 8);
  EXPECT_EQ((*all)[1].prev_hash, (*all)[0].hash);
  EXPECT_EQ((*all)[0].prev_hash, std::string(64, '0'));
}

TEST_F(AuditLogTest, QueriesFilterByPrincipalActionAndPage) {
  Fill(6);
  Result<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ((*log)->Query({.principal = "ann"})->size(), 3u);
  EXPECT_EQ((*log)->Query({.action = "plan.approve"})->size(), 2u);
  EXPECT_EQ((*log)->Query({.action = "job."})->size(), 4u);
  EXPECT_EQ((*log)->Query({.after_seq = 4})->size(), 2u);
  EXPECT_EQ((*log)->Query({.limit = 2})->size(), 2u);
  EXPECT_EQ((*log)->Query({.resource_prefix = "job/"})->size(), 6u);
  EXPECT_EQ((*log)->Query({.resource_prefix = "job/1"})->size(), 6u);
  EXPECT_EQ((*log)->Query({.resource_prefix = "job/2"})->size(), 0u);
  EXPECT_EQ((*log)->Query({.principal = "ann", .resource_prefix = "job/"})->size(), 3u);
}

TEST_F(AuditLogTest, TheDatabaseRefusesUpdatesAndDeletes) {
  Fill(2);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  EXPECT_NE(sqlite3_exec(db, "UPDATE audit SET outcome='ok'", nullptr, nullptr, &err), SQLITE_OK);
  EXPECT_THAT(err, HasSubstr("append-only"));
  sqlite3_free(err);
  EXPECT_NE(sqlite3_exec(db, "DELETE FROM audit", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  EXPECT_TRUE(Verify().ok);
}

TEST_F(AuditLogTest, AnEditedRecordIsDetected) {
  Fill(5);
  Tamper(path_, "UPDATE audit SET outcome='denied' WHERE seq=3;");
  AuditVerifyResult v = Verify();
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.first_bad_seq, 3);
  EXPECT_THAT(v.problem, HasSubstr("record 3 does not match its hash: it was edited"));
}

TEST_F(AuditLogTest, AnEditedRecordWithARecomputedHashBreaksTheNextLink) {
  Fill(5);
  // Whoever edits record 2 and fixes its hash must fix every later link too.
  Tamper(path_, "UPDATE audit SET hash='" + std::string(64, 'a') + "' WHERE seq=2;");
  AuditVerifyResult v = Verify();
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.first_bad_seq, 2);
}

TEST_F(AuditLogTest, ADeletedRecordIsDetected) {
  Fill(5);
  Tamper(path_, "DELETE FROM audit WHERE seq=2;");
  AuditVerifyResult v = Verify();
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.first_bad_seq, 3);
  EXPECT_THAT(v.problem, HasSubstr("record 3 follows record 1"));
}

TEST_F(AuditLogTest, ReorderedRecordsAreDetected) {
  Fill(5);
  // Swap the contents of records 2 and 3 (keeping each seq in place).
  Tamper(path_,
         "UPDATE audit SET seq=-2 WHERE seq=2; UPDATE audit SET seq=2 WHERE seq=3; "
         "UPDATE audit SET seq=3 WHERE seq=-2;");
  AuditVerifyResult v = Verify();
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.first_bad_seq, 2);
}

TEST_F(AuditLogTest, RecordsRemovedFromTheEndAreDetectedAgainstAKnownHead) {
  Fill(5);
  Tamper(path_, "DELETE FROM audit WHERE seq=5;");
  EXPECT_TRUE(Verify().ok);  // without a head, a shorter chain is a valid chain
  AuditVerifyResult v = Verify(head_);
  EXPECT_FALSE(v.ok);
  EXPECT_THAT(v.problem, HasSubstr("records were removed from the end"));
}

TEST_F(AuditLogTest, ANonAuditFileIsRefused) {
  const std::string junk = dir_.Path("junk.db");
  {
    std::FILE* f = std::fopen(junk.c_str(), "w");
    std::fputs("this is not a database, just some text long enough to matter.............", f);
    std::fclose(f);
  }
  Result<std::unique_ptr<AuditLog>> log = AuditLog::Open(junk);
  EXPECT_EQ(log.status().code(), ErrorCode::kUnavailable);
  EXPECT_THAT(log.status().message(), HasSubstr("junk.db"));
}

}  // namespace
}  // namespace kc::api
