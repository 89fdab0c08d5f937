// The audit log: every state-changing call and every denial (principal, action, resource,
// outcome, reason, time), append-only in an SQLite database and chained with a key: each
// record carries the HMAC-SHA256, under a key only kcd's directory holds (DIR/audit.key, 0600),
// of its fields and of the previous record's MAC. The newest record the writers know of (the
// head: its seq and MAC, itself MAC'ed) is kept beside the log (DIR/audit.head) and by the
// process that writes, so that an edited, reordered, deleted or re-chained record, and records
// removed from the end, are detected by Verify. Docs: docs/operations/roles.md ("The audit
// log"); design: docs/design/audit-chain-and-agent-identity.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kc::api {

struct AuditRecord {
  int64_t seq = 0;    // set by Append: 1, 2, ... in order
  double time_s = 0;  // seconds since the Unix epoch
  std::string principal;
  std::string action;    // "job.submit", "fault.detected", ...
  std::string resource;  // "job/42", "pool/high", ...
  std::string outcome;   // "ok", "denied", "failed", "override", ...
  std::string reason;
  std::string prev_hash;  // set by Append: the previous record's hash (64 zeros for the first)
  std::string hash;       // set by Append: HMAC-SHA256 (hex) of this record and prev_hash
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
  int64_t head_seq = 0;       // and its seq
};

struct AuditVerifyOptions {
  // A MAC noted elsewhere (by an admin, from kcd): some record must have it. "" for none.
  std::string expected_head;
  // If set, called after each record is checked, with its seq (to show a long walk's progress).
  // The log is not locked meanwhile: it may append from here.
  std::function<void(int64_t seq)> on_record;
};

// A point of the chain: record `seq` has MAC `hash` (seq 0: the empty log, 64 zeros).
struct AuditHead {
  int64_t seq = 0;
  std::string hash;
};

// The files beside a log at PATH (DIR/audit.db): its key (DIR/audit.key) and head file
// (DIR/audit.head).
std::string AuditKeyPath(const std::string& log_path);
std::string AuditHeadPath(const std::string& log_path);

// Safe for concurrent use (one connection, serialised by a mutex; Verify reads on its own).
class AuditLog {
 public:
  // Opens or creates the log at `path` to write it (WAL, synchronous commits; UPDATE and
  // DELETE refused by triggers). A new log gets a new key (0600) and head file; an existing
  // one must have both and must extend its head. kUnavailable naming the file when it cannot
  // be opened or is not an audit log; kFailedPrecondition when its key is missing; kDataLoss
  // when its head file is missing or changed, or it no longer holds the record its head names
  // (records were removed from its end, or it was re-chained).
  static Result<std::unique_ptr<AuditLog>> Open(const std::string& path);
  // Opens an existing log to read and verify it, writing nothing to it: not even a table to a
  // file that is not a log. `key_path` "" is the key beside it. kNotFound when there is no such
  // file; kInvalidArgument when it is not an audit log. Without its key, Query works and
  // Verify is kFailedPrecondition.
  static Result<std::unique_ptr<AuditLog>> OpenExisting(const std::string& path,
                                                        const std::string& key_path = "");
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Appends `record` (its seq and MACs are set here), commits it durably, then records the new
  // head in the head file, before returning it completed. kDataLoss, appending nothing, when
  // the log no longer extends the head this log knows (records were removed from its end or it
  // was re-chained behind the writer's back); kUnavailable when a write fails;
  // kFailedPrecondition for a log opened with OpenExisting. Blocks on the fsyncs.
  Result<AuditRecord> Append(AuditRecord record);

  // Records matching `query`, in seq order.
  Result<std::vector<AuditRecord>> Query(const AuditQuery& query) const;

  // Walks the chain on a connection of its own (other calls go on meanwhile): every record's
  // seq follows the last, links to its MAC, and has the MAC of its fields under the key; the
  // log holds the record the head file names, and the head this process knows, with their
  // MACs; and, when given, `expected_head` (a MAC noted elsewhere, by an admin or from kcd) is
  // some record's. The first problem is reported, not an error: errors are for a log that
  // cannot be read, or whose key is not there (kFailedPrecondition).
  Result<AuditVerifyResult> Verify(const AuditVerifyOptions& options) const;
  Result<AuditVerifyResult> Verify(const std::string& expected_head = "") const {
    return Verify(AuditVerifyOptions{.expected_head = expected_head});
  }

  // The hash of the last record (64 zeros when empty), as the file has it now.
  std::string head() const;
  // The head this process keeps: the newest of the records it appended, saw at the log's end
  // when it appended, or found in the head file when it opened the log.
  AuditHead known_head() const;

 private:
  struct Impl;
  explicit AuditLog(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// HMAC-SHA256 (hex) under `key` of a record's fields and prev_hash, as Append computes it.
std::string AuditRecordHash(const AuditRecord& r, std::string_view key);

}  // namespace kc::api
