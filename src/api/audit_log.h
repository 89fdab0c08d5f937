// The audit log: every state-changing call and every denial (principal, action, resource,
// outcome, reason, time), append-only and hash-chained in an SQLite database, so that an
// edited, reordered or deleted record is detected by Verify. Docs: docs/operations/roles.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace kc::api {

struct AuditRecord {
  int64_t seq = 0;    // set by Append: 1, 2, ... in order
  double time_s = 0;  // seconds since the Unix epoch
  std::string principal;
  std::string action;    // "job.submit", "fault.detected", ...
  std::string resource;  // "job/42", "pool/high", ...
  std::string outcome;   // "ok", "denied", "failed", ...
  std::string reason;
  std::string prev_hash;  // set by Append: the previous record's hash (64 zeros for the first)
  std::string hash;       // set by Append: SHA-256 (hex) of this record and prev_hash
};

struct AuditQuery {
  std::string principal;        // "" = any
  std::string action;           // "" = any; a prefix ending in '.' ("job.") matches a family
  std::string resource_prefix;  // "" = any; else resources starting with it ("job/")
  double since_s = 0;
  int64_t after_seq = 0;  // records with seq > after_seq (paging)
  int limit = 1000;
};

struct AuditVerifyResult {
  bool ok = true;
  int64_t records = 0;
  int64_t first_bad_seq = 0;  // 0 when ok
  std::string problem;        // what is wrong with it, "" when ok
  std::string head;           // the last record's hash
};

// Safe for concurrent use (one connection, serialised by a mutex).
class AuditLog {
 public:
  // Opens or creates the log at `path` (WAL, synchronous commits; UPDATE and DELETE refused
  // by triggers). kUnavailable naming the file when it cannot be opened or is not an audit
  // log.
  static Result<std::unique_ptr<AuditLog>> Open(const std::string& path);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Appends `record` (its seq and hashes are set here) and commits it durably before
  // returning it completed. kUnavailable when the database write fails. Blocks on one fsync.
  Result<AuditRecord> Append(AuditRecord record);

  // Records matching `query`, in seq order.
  Result<std::vector<AuditRecord>> Query(const AuditQuery& query) const;

  // Walks the chain: every record's seq follows the last, links to its hash and hashes to its
  // own. With `expected_head` (a hash remembered elsewhere, e.g. by kcd or an admin), records
  // deleted from the end are detected too. The first problem is reported, not an error:
  // errors are for a database that cannot be read.
  Result<AuditVerifyResult> Verify(const std::string& expected_head = "") const;

  // The hash of the last record (64 zeros when empty).
  std::string head() const;

 private:
  struct Impl;
  explicit AuditLog(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// SHA-256 (hex) of a record's fields and prev_hash, as Append computes it.
std::string AuditRecordHash(const AuditRecord& r);

}  // namespace kc::api
