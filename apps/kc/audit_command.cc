// `kc audit verify` and `kc audit show`.
#include "apps/kc/audit_command.h"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "api/audit_log.h"

namespace kc::app {
namespace {

struct AuditArgs {
  std::string db;
  std::string head;
  std::string principal;
  std::string action;
  int limit = 100;
  bool json = false;
};

int Fail(const Status& s, int code) {
  std::cerr << "kc audit: " << s.message() << "\n";
  return code;
}

Result<std::unique_ptr<api::AuditLog>> OpenExisting(const std::string& db) {
  // Opening creates a log; reading one that does not exist is a mistake.
  if (!std::filesystem::exists(db)) return NotFoundError(db + ": no such audit log");
  return api::AuditLog::Open(db);
}

int RunVerify(const AuditArgs& a) {
  Result<std::unique_ptr<api::AuditLog>> log = OpenExisting(a.db);
  if (!log.ok()) return Fail(log.status(), kExitBadInput);
  Result<api::AuditVerifyResult> v = (*log)->Verify(a.head);
  if (!v.ok()) return Fail(v.status(), kExitFailure);
  if (a.json) {
    std::cout << nlohmann::json{{"ok", v->ok},
                                {"records", v->records},
                                {"first_bad_seq", v->first_bad_seq},
                                {"problem", v->problem},
                                {"head", v->head}}
                     .dump(2)
              << "\n";
  } else if (v->ok) {
    std::cout << fmt::format("{}: {} records, chain intact; head {}\n", a.db, v->records, v->head);
  } else {
    std::cout << fmt::format("{}: TAMPERED at record {}: {}\n", a.db, v->first_bad_seq, v->problem);
  }
  return v->ok ? kExitOk : kExitFailure;
}

int RunShow(const AuditArgs& a) {
  Result<std::unique_ptr<api::AuditLog>> log = OpenExisting(a.db);
  if (!log.ok()) return Fail(log.status(), kExitBadInput);
  Result<std::vector<api::AuditRecord>> rows =
      (*log)->Query({.principal = a.principal, .action = a.action, .limit = a.limit});
  if (!rows.ok()) return Fail(rows.status(), kExitFailure);
  nlohmann::json out = nlohmann::json::array();
  for (const api::AuditRecord& r : *rows) {
    if (a.json) {
      out.push_back({{"seq", r.seq},
                     {"time_s", r.time_s},
                     {"principal", r.principal},
                     {"action", r.action},
                     {"resource", r.resource},
                     {"outcome", r.outcome},
                     {"reason", r.reason},
                     {"hash", r.hash}});
    } else {
      std::cout << fmt::format("{:>6} {:.3f} {} {} {} {}: {}\n", r.seq, r.time_s, r.principal,
                               r.action, r.resource, r.outcome, r.reason);
    }
  }
  if (a.json) std::cout << out.dump(2) << "\n";
  return kExitOk;
}

}  // namespace

void AddAuditCommand(CLI::App& app, Action* action) {
  CLI::App* audit = app.add_subcommand("audit", "Verify and read an audit log");
  audit->require_subcommand(1);
  auto a = std::make_shared<AuditArgs>();
  CLI::App* verify = audit->add_subcommand(
      "verify", "Check the hash chain: exit 1 if a record was edited, moved or deleted");
  verify->add_option("db", a->db, "The audit database (SQLite)")->required();
  verify->add_option("--head", a->head,
                     "The last record's hash as remembered elsewhere: also detects records "
                     "removed from the end");
  verify->add_flag("--json", a->json, "Print the result as JSON");
  verify->callback([action, a] { *action = [a] { return RunVerify(*a); }; });
  CLI::App* show = audit->add_subcommand("show", "Print audit records");
  show->add_option("db", a->db, "The audit database (SQLite)")->required();
  show->add_option("--principal", a->principal, "Only this principal's records");
  show->add_option("--action", a->action, "Only this action, or a family ending in '.' (job.)");
  show->add_option("--limit", a->limit, "At most this many records (default 100)")
      ->check(CLI::PositiveNumber);
  show->add_flag("--json", a->json, "Print the records as JSON");
  show->callback([action, a] { *action = [a] { return RunShow(*a); }; });
}

}  // namespace kc::app
