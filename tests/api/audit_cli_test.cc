// `kc audit` as an admin runs it: verify an intact log, find an edited, deleted or truncated
// one, and read records.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
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

// Appends a record of `principal`'s `action` on job/1 to `log`.
void Append(AuditLog& log, const std::string& principal, const std::string& action,
            const std::string& reason = "") {
  KC_CHECK(log.Append({.seq = 0,
                       .time_s = 1.7e9,
                       .principal = principal,
                       .action = action,
                       .resource = "job/1",
                       .outcome = "ok",
                       .reason = reason,
                       .prev_hash = "",
                       .hash = ""})
               .ok());
}

// Writes four records and returns the head hash.
std::string Write(const std::string& path) {
  Result<std::unique_ptr<AuditLog>> log = AuditLog::Open(path);
  KC_CHECK(log.ok()) << log.status().message();
  for (const char* action : {"job.submit", "plan.approve", "job.cancel", "job.submit"}) {
    Append(**log, "ann", action);
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
  // The head file beside the log names record 4; so does a head noted elsewhere.
  r = Kc("audit verify " + truncated);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("removed from the end"));
  r = Kc("audit verify " + truncated + " --head " + head);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("removed from the end"));
  r = Kc("audit verify " + dir.Path("nope.db"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("nope.db: no such audit log"));
}

// `kc audit verify` and `show` on a file that is not an audit log refuse it and leave it as it
// was; a log without its key cannot be verified.
TEST(AuditCliTest, ReadingIsRefusedForAFileThatIsNotALogAndChangesNothing) {
  TempDir dir("kc_audit_cli");
  const std::string other = dir.Path("jobs.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(other.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE jobs (id INTEGER);", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const std::string text = dir.Write("notes.txt", "not a database at all\n");
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  for (const std::string& path : {other, text}) {
    const std::string before = bytes(path);
    for (const char* verb : {"verify", "show"}) {
      KcRun r = Kc(std::string("audit ") + verb + " " + path);
      EXPECT_EQ(r.exit_code, 2) << verb << " " << path << ": " << r.out;
      EXPECT_THAT(r.err, HasSubstr("not an audit log")) << verb << " " << path;
    }
    EXPECT_EQ(bytes(path), before) << path;
  }
  const std::string log = dir.Path("audit.db");
  Write(log);
  std::filesystem::rename(dir.Path("audit.key"), dir.Path("elsewhere.key"));
  KcRun r = Kc("audit verify " + log);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("key"));
  r = Kc("audit verify " + log + " --key " + dir.Path("elsewhere.key"));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

// What users and jobs put in records reaches the terminal escaped: no escape sequence runs, no
// line is forged.
TEST(AuditCliTest, ControlCharactersInRecordsAreShownEscaped) {
  TempDir dir("kc_audit_cli");
  const std::string db = dir.Path("audit.db");
  {
    Result<std::unique_ptr<AuditLog>> log = AuditLog::Open(db);
    ASSERT_TRUE(log.ok());
    Append(**log, "ann\x1b[2J", "job.submit",
           "x\n     9 1.000 root job.cancel job/1 ok: forged\r\xc2\x9b");
  }
  KcRun r = Kc("audit show " + db);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos);
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
  EXPECT_EQ(r.out.find("\xc2\x9b"), std::string::npos);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1);
  EXPECT_THAT(r.out, HasSubstr("ann\\x1b[2J"));
  EXPECT_THAT(r.out, HasSubstr("x\\n     9 1.000 root"));
  EXPECT_THAT(r.out, HasSubstr("\\r\\u{9b}"));
}

}  // namespace
}  // namespace kc::api
