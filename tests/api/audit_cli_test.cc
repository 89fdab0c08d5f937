// `kc audit` as an admin runs it: verify an intact log, find an edited, deleted or truncated
// one, and read records.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <nlohmann/json.hpp>
#include <string>

#include "api/audit_log.h"
#include "tests/support/kc_run.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using kc::testing::KcRun;
using kc::testing::TempDir;
using ::testing::HasSubstr;

KcRun Kc(const std::string& args) { return kc::testing::RunKc(KC_BINARY, args); }

// Writes four records and returns the head hash.
std::string Write(const std::string& path) {
  Result<std::unique_ptr<AuditLog>> log = AuditLog::Open(path);
  KC_CHECK(log.ok()) << log.status().message();
  for (const char* action : {"job.submit", "plan.approve", "job.cancel", "job.submit"}) {
    KC_CHECK((*log)
                 ->Append({.seq = 0,
                           .time_s = 1.7e9,
                           .principal = "ann",
                           .action = action,
                           .resource = "job/1",
                           .outcome = "ok",
                           .reason = "",
                           .prev_hash = "",
                           .hash = ""})
                 .ok());
  }
  return (*log)->head();
}

void Sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const std::string all = "DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete; " + sql;
  ASSERT_EQ(sqlite3_exec(db, all.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
}

TEST(AuditCliTest, VerifiesAnIntactLogAndShowsIt) {
  TempDir dir("kc_audit_cli");
  const std::string db = dir.Path("audit.db");
  const std::string head = Write(db);
  KcRun r = Kc("audit verify " + db + " --head " + head);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("4 records, chain intact; head " + head));
  r = Kc("audit show " + db + " --action job. --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json rows = nlohmann::json::parse(r.out);
  EXPECT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1]["action"], "job.cancel");
}

TEST(AuditCliTest, FindsEditedDeletedAndTruncatedLogs) {
  TempDir dir("kc_audit_cli");
  const std::string edited = dir.Path("edited.db"), deleted = dir.Path("deleted.db"),
                    truncated = dir.Path("truncated.db");
  Write(edited);
  Sql(edited, "UPDATE audit SET principal='mallory' WHERE seq=2;");
  KcRun r = Kc("audit verify " + edited);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("TAMPERED at record 2: record 2 does not match its hash"));
  Write(deleted);
  Sql(deleted, "DELETE FROM audit WHERE seq=3;");
  r = Kc("audit verify " + deleted + " --json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(nlohmann::json::parse(r.out)["first_bad_seq"], 4);
  const std::string head = Write(truncated);
  Sql(truncated, "DELETE FROM audit WHERE seq=4;");
  EXPECT_EQ(Kc("audit verify " + truncated).exit_code, 0);
  r = Kc("audit verify " + truncated + " --head " + head);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("removed from the end"));
  r = Kc("audit verify " + dir.Path("nope.db"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("nope.db: no such audit log"));
}

}  // namespace
}  // namespace kc::api
