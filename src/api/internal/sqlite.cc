#include "api/internal/sqlite.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kc::api::internal {

Status Database::Open(const std::string& path, std::string_view what, const char* schema) {
  path_ = path;
  what_ = std::string(what);
  // kcd's databases hold token hashes, jobs' specs and logs, the audit trail: its owner's
  // alone. A new file is made 0600 before SQLite opens it (its -wal and -shm files take the
  // same mode); one made before with a wider mode is narrowed. An existing file is never opened
  // here: closing a descriptor of it would drop the locks this process's SQLite connections
  // hold on it (POSIX locks are per process).
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      close(fd);
    } else if (errno != EEXIST) {
      return UnavailableError(
          fmt::format("{} {}: cannot create: {}", what_, path_, strerror(errno)));
    }
  } else if ((st.st_mode & 077) != 0 && chmod(path.c_str(), 0600) != 0) {
    return UnavailableError(
        fmt::format("{} {}: cannot make it 0600: {}", what_, path_, strerror(errno)));
  }
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

Status Database::OpenExisting(const std::string& path, std::string_view what) {
  path_ = path;
  what_ = std::string(what);
  if (access(path.c_str(), F_OK) != 0) {
    return NotFoundError(fmt::format("{}: no such {}", path, what));
  }
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    return Error("cannot open");
  }
  sqlite3_busy_timeout(db_, 10000);
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
