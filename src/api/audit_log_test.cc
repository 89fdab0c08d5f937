#include "api/audit_log.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>

#include "base/file.h"
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
  // As an auditor verifies a copy: read only (a writer refuses to open a tampered log).
  AuditVerifyResult Verify(const std::string& head = "") {
    Result<std::unique_ptr<AuditLog>> log = AuditLog::OpenExisting(path_);
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

// The head file names the last record written: removing records from the end is noticed
// without a head noted elsewhere; with one, so is a log cut back past it.
TEST_F(AuditLogTest, RecordsRemovedFromTheEndAreDetectedByTheHeadFile) {
  Fill(5);
  Tamper(path_, "DELETE FROM audit WHERE seq=5;");
  AuditVerifyResult v = Verify();
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.first_bad_seq, 5);
  EXPECT_THAT(v.problem, HasSubstr("records were removed from the end"));
  v = Verify(head_);
  EXPECT_FALSE(v.ok);
  EXPECT_THAT(v.problem, HasSubstr("removed from the end"));
  // A writer refuses to go on from there: appending would hide the cut.
  Result<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_);
  EXPECT_EQ(log.status().code(), ErrorCode::kDataLoss);
  EXPECT_THAT(log.status().message(), HasSubstr("records were removed from its end"));
}

// Whoever can write the file but does not hold the key cannot re-chain it: recomputing every
// record's hash without the key (plain SHA-256, or another key) breaks at the first record
// changed, and the head file, whose own MAC needs the key, cannot follow.
TEST_F(AuditLogTest, AReChainedLogIsDetected) {
  Fill(5);
  // Record 3 edited, and it and every later record re-hashed, as an attacker would.
  std::vector<AuditRecord> records = *AuditLog::OpenExisting(path_).value()->Query({});
  std::string sql, prev = records[1].hash;
  for (size_t i = 2; i < records.size(); ++i) {
    AuditRecord& r = records[i];
    if (r.seq == 3) r.outcome = "denied";
    r.prev_hash = prev;
    r.hash = AuditRecordHash(r, "not the key");
    prev = r.hash;
    sql += fmt::format("UPDATE audit SET outcome='{}', prev_hash='{}', hash='{}' WHERE seq={};",
                       r.outcome, r.prev_hash, r.hash, r.seq);
  }
  Tamper(path_, sql);
  AuditVerifyResult v = Verify();
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.first_bad_seq, 3);
  EXPECT_THAT(v.problem, HasSubstr("written without the key"));
}

// The head file cannot be rolled back, with the records after it removed, without the key;
// nor removed unnoticed.
TEST_F(AuditLogTest, TheHeadFileCanBeNeitherRolledBackNorRemoved) {
  Fill(5);
  const std::vector<AuditRecord> records = *AuditLog::OpenExisting(path_).value()->Query({});
  const std::string head_file = AuditHeadPath(path_);
  Result<std::string> text = ReadWholeFile(head_file);
  ASSERT_TRUE(text.ok());
  // Records 3 to 5 cut, and the head file pointed at record 2 (its MAC cannot follow).
  Tamper(path_, "DELETE FROM audit WHERE seq > 2;");
  nlohmann::json j = nlohmann::json::parse(*text);
  j["seq"] = 2;
  j["hash"] = records[1].hash;
  ASSERT_TRUE(WriteFileDurably(head_file, j.dump()).ok());
  AuditVerifyResult v = Verify();
  EXPECT_FALSE(v.ok);
  EXPECT_THAT(v.problem, HasSubstr("its MAC is not the key's: it was changed"));
  // And without the head file, nothing can say where the log ended.
  std::filesystem::remove(head_file);
  EXPECT_THAT(Verify().problem, HasSubstr("head file"));
}

// A writer checks, before every record, that the log still holds the last record it knows:
// one cut behind its back gets nothing more appended.
TEST_F(AuditLogTest, AWriterAppendsNothingToALogCutBehindItsBack) {
  Result<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_);
  ASSERT_TRUE(log.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*log)->Append(Rec("ann", "job.submit")).ok());
  Tamper(path_, "DELETE FROM audit WHERE seq=3;");
  Result<AuditRecord> r = (*log)->Append(Rec("ann", "job.cancel"));
  EXPECT_EQ(r.status().code(), ErrorCode::kDataLoss);
  EXPECT_EQ((*log)->Query({})->size(), 2u);
  // Its own head is still the one it wrote, and verifying says what happened.
  EXPECT_EQ((*log)->known_head().seq, 3);
  Result<AuditVerifyResult> v = (*log)->Verify();
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->ok);
  EXPECT_THAT(v->problem, HasSubstr("removed from the end"));
}

// The walk reads on a connection of its own: the log takes records while it is verified.
TEST_F(AuditLogTest, VerifyingDoesNotHoldUpAppends) {
  Fill(3);
  Result<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_);
  ASSERT_TRUE(log.ok());
  std::future<Result<AuditRecord>> appended;
  bool appended_during_the_walk = false;
  Result<AuditVerifyResult> v = (*log)->Verify({.on_record = [&](int64_t seq) {
    if (seq != 1) return;
    appended =
        std::async(std::launch::async, [&] { return (*log)->Append(Rec("ann", "job.submit")); });
    // A walk that held the log's lock would keep this append waiting until it ended.
    appended_during_the_walk =
        appended.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  }});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->ok) << v->problem;
  EXPECT_EQ(v->records, 3);  // its snapshot: the walk began before the append
  EXPECT_TRUE(appended_during_the_walk);
  ASSERT_TRUE(appended.get().ok());
  EXPECT_EQ(Verify().records, 4);
}

// Reading a file that is not a log, to verify or show it, is refused and changes nothing.
TEST_F(AuditLogTest, OpeningAFileToReadNeverWritesIt) {
  const std::string other = dir_.Path("other.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(other.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE jobs (id INTEGER);", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const std::string before = *ReadWholeFile(other);
  Result<std::unique_ptr<AuditLog>> log = AuditLog::OpenExisting(other);
  EXPECT_EQ(log.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(log.status().message(), HasSubstr("not an audit log"));
  EXPECT_EQ(*ReadWholeFile(other), before);
  EXPECT_FALSE(std::filesystem::exists(AuditKeyPath(other)));
  EXPECT_EQ(AuditLog::OpenExisting(dir_.Path("none.db")).status().code(), ErrorCode::kNotFound);
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
