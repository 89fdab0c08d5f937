#include "api/internal/sqlite.h"

#include <fmt/format.h>

namespace kc::api::internal {

Status Database::Open(const std::string& path, std::string_view what, const char* schema) {
  path_ = path;
  what_ = std::string(what);
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    return Error("cannot open");
  }
  // Other processes (kc token, kc audit) may hold the write lock for a moment: wait for it.
  sqlite3_busy_timeout(db_, 10000);
  for (const char* sql : {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=FULL;", schema}) {
    if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
      return Error(fmt::format("not a {}, or cannot be set up", what_));
    }
  }
  return OkStatus();
}

Result<Statement> Database::Prepare(std::string_view sql) const {
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &s, nullptr) != SQLITE_OK) {
    return Error("cannot prepare a statement");
  }
  return Statement(s);
}

Status Database::Exec(const char* sql) {
  if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) return Error("cannot write");
  return OkStatus();
}

Status Database::Error(std::string_view doing) const {
  return UnavailableError(fmt::format("{} {}: {}: {}", what_, path_, doing,
                                      db_ != nullptr ? sqlite3_errmsg(db_) : "out of memory"));
}

}  // namespace kc::api::internal
