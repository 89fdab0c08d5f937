// A thin SQLite helper for kcd's stores: a connection opened with WAL and synchronous commits,
// statements that finalize themselves, and errors that name the file. Not thread-safe; each
// store serialises its connection with its own mutex.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kc::api::internal {

class Statement {
 public:
  Statement() = default;
  explicit Statement(sqlite3_stmt* s) : s_(s) {}
  ~Statement() { sqlite3_finalize(s_); }
  Statement(Statement&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Statement& operator=(Statement&&) = delete;
  Statement(const Statement&) = delete;

  sqlite3_stmt* get() const { return s_; }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(s_, i, v); }
  void Bind(int i, double v) { sqlite3_bind_double(s_, i, v); }
  // Text; an empty view binds '' (never NULL).
  void Bind(int i, std::string_view v) {
    sqlite3_bind_text(s_, i, v.empty() ? "" : v.data(), static_cast<int>(v.size()),
                      SQLITE_TRANSIENT);
  }
  // Optional values bind NULL when unset, and read back as nullopt from NULL.
  void Bind(int i, std::optional<int64_t> v) {
    v ? Bind(i, *v) : static_cast<void>(sqlite3_bind_null(s_, i));
  }
  void Bind(int i, std::optional<double> v) {
    v ? Bind(i, *v) : static_cast<void>(sqlite3_bind_null(s_, i));
  }
  std::optional<int64_t> OptInt(int col) const {
    if (sqlite3_column_type(s_, col) == SQLITE_NULL) return std::nullopt;
    return Int(col);
  }
  std::optional<double> OptDouble(int col) const {
    if (sqlite3_column_type(s_, col) == SQLITE_NULL) return std::nullopt;
    return Double(col);
  }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int Step() { return sqlite3_step(s_); }
  int64_t Int(int col) const { return sqlite3_column_int64(s_, col); }
  double Double(int col) const { return sqlite3_column_double(s_, col); }
  std::string Text(int col) const {
    const unsigned char* t = sqlite3_column_text(s_, col);
    return t == nullptr ? "" : reinterpret_cast<const char*>(t);
  }

 private:
  sqlite3_stmt* s_ = nullptr;
};

class Database {
 public:
  Database() = default;
  ~Database() { sqlite3_close(db_); }
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  // Opens or creates `path` with WAL, synchronous=FULL, and runs `schema` (idempotent SQL).
  // kUnavailable naming the file and `what` (e.g. "audit log") when it cannot.
  Status Open(const std::string& path, std::string_view what, const char* schema);
  // Opens `path`, which must exist, as it is: no file is created, no schema or setting is
  // written (reading a file to learn whether it is what it should be changes nothing).
  // kNotFound when it does not exist; kUnavailable when it cannot be opened.
  Status OpenExisting(const std::string& path, std::string_view what);
  Result<Statement> Prepare(std::string_view sql) const;
  Status Exec(const char* sql);
  // kUnavailable: "WHAT PATH: DOING: sqlite's message".
  Status Error(std::string_view doing) const;
  sqlite3* handle() const { return db_; }

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
  std::string what_;
};

}  // namespace kc::api::internal
