// `kc audit verify`, `kc audit show` (on a log file) and `kc audit query` (kcd's log, over
// the AuditService; so is `kc audit verify` without a file).
#include "apps/kc/audit_command.h"

#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "api/audit_log.h"
#include "apps/kc/kcd_client.h"
#include "kc/v1/audit.grpc.pb.h"

namespace kc::app {
namespace {

struct AuditArgs {
  std::string db;
  std::string key;
  std::string head;
  std::string principal;
  std::string action;
  std::string resource;
  std::string since;
  std::string login;
  int limit = 100;
  bool json = false;
};

int Fail(const Status& s, int code) {
  std::cerr << "kc audit: " << s.message() << "\n";
  return code;
}

// A log to read: nothing is written to it, or to a file that is not one.
Result<std::unique_ptr<api::AuditLog>> OpenExisting(const AuditArgs& a) {
  return api::AuditLog::OpenExisting(a.db, a.key);
}

// Prints the verdict on the log `where`; exit 0 when the chain is intact.
int PrintVerify(const AuditArgs& a, const std::string& where,
                const Result<api::AuditVerifyResult>& v) {
  if (!v.ok()) return Fail(v.status(), kExitFailure);
  if (a.json) {
    std::cout << nlohmann::json{{"ok", v->ok},
                                {"records", v->records},
                                {"first_bad_seq", v->first_bad_seq},
                                {"problem", v->problem},
                                {"head", v->head},
                                {"head_seq", v->head_seq}}
                     .dump(2)
              << "\n";
  } else if (v->ok) {
    std::cout << fmt::format("{}: {} records, chain intact; head {} (record {})\n", where,
                             v->records, v->head, v->head_seq);
  } else {
    std::cout << fmt::format("{}: TAMPERED at record {}: {}\n", where, v->first_bad_seq,
                             Printable(v->problem));
  }
  return v->ok ? kExitOk : kExitFailure;
}

// kcd's log, verified by kcd: the same verdict as for a file.
int RunRemoteVerify(const AuditArgs& a) {
  Result<Session> s = Session::Open(a.login);
  if (!s.ok()) return app::Fail("audit verify", s.status());
  kc::v1::AuditVerifyRequest req;
  req.set_expected_head(a.head);
  kc::v1::AuditVerifyResponse resp;
  if (Status st = s->Call(&kc::v1::AuditService::Stub::Verify, req, &resp); !st.ok()) {
    return app::Fail("audit verify", st);
  }
  return PrintVerify(a, "kcd " + s->config.server + " audit.db",
                     api::AuditVerifyResult{.ok = resp.ok(),
                                            .records = resp.records(),
                                            .first_bad_seq = resp.first_bad_seq(),
                                            .problem = resp.problem(),
                                            .head = resp.head(),
                                            .head_seq = resp.head_seq()});
}

int RunVerify(const AuditArgs& a) {
  if (a.db.empty()) return RunRemoteVerify(a);
  Result<std::unique_ptr<api::AuditLog>> log = OpenExisting(a);
  if (!log.ok()) return Fail(log.status(), kExitBadInput);
  Result<api::AuditVerifyResult> v = (*log)->Verify(a.head);
  if (!v.ok() && v.status().code() == ErrorCode::kFailedPrecondition) {
    return Fail(v.status(), kExitBadInput);
  }
  return PrintVerify(a, a.db, v);
}

void PrintRecord(const api::AuditRecord& r) {
  const auto P = Printable;
  std::cout << fmt::format("{:>6} {:.3f} {} {} {} {}: {}\n", r.seq, r.time_s, P(r.principal),
                           P(r.action), P(r.resource), P(r.outcome), P(r.reason));
}

// --since: a time ago (N seconds, or N followed by s, m, h or d) or a UTC time
// (YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS][Z]); as seconds since the Unix epoch.
Result<double> ParseSince(const std::string& text, double now_s) {
  const auto bad = [&] {
    return InvalidArgumentError(
        fmt::format("--since: \"{}\" is neither a time ago (3600, 90m, 12h, 7d) nor a UTC time "
                    "(2025-05-01, 2025-05-01T12:00:00)",
                    text));
  };
  double n = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, n);
  if (ec == std::errc() && ptr != text.data() && n >= 0 && (ptr == end || ptr + 1 == end)) {
    const char unit = ptr == end ? 's' : *ptr;
    const double seconds = unit == 's'   ? 1
                           : unit == 'm' ? 60
                           : unit == 'h' ? 3600
                           : unit == 'd' ? 86400
                                         : 0;
    if (seconds == 0) return bad();
    return std::max(0.0, now_s - n * seconds);
  }
  std::tm tm = {};
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0;
  char tail = 0;
  const int fields =
      std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%c", &y, &mo, &d, &h, &mi, &sec, &tail);
  const bool date_only = fields == 3 && text.size() == 10;
  if (!date_only && fields < 5) return bad();
  if (fields == 7 && (tail != 'Z' || text.back() != 'Z')) return bad();
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return bad();
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  return static_cast<double>(timegm(&tm));
}

// kcd's log, the records the caller may read.
int RunQuery(const AuditArgs& a) {
  kc::v1::AuditQueryRequest req;
  if (!a.since.empty()) {
    const double now_s =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    Result<double> since = ParseSince(a.since, now_s);
    if (!since.ok()) return app::Fail("audit query", since.status());
    req.set_since_s(*since);
  }
  req.set_principal(a.principal);
  req.set_action(a.action);
  req.set_resource_prefix(a.resource);
  req.set_limit(a.limit);
  return CallAndPrint("audit query", a.login, a.json, &kc::v1::AuditService::Stub::Query, req,
                      [](const kc::v1::AuditQueryResponse& resp) {
                        for (const kc::v1::AuditRecordInfo& r : resp.records()) {
                          PrintRecord({.seq = r.seq(),
                                       .time_s = r.time_s(),
                                       .principal = r.principal(),
                                       .action = r.action(),
                                       .resource = r.resource(),
                                       .outcome = r.outcome(),
                                       .reason = r.reason()});
                        }
                      });
}

int RunShow(const AuditArgs& a) {
  Result<std::unique_ptr<api::AuditLog>> log = OpenExisting(a);
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
      PrintRecord(r);
    }
  }
  if (a.json) std::cout << out.dump(2) << "\n";
  return kExitOk;
}

}  // namespace

void AddAuditCommand(CLI::App& app, Action* action) {
  CLI::App* audit = app.add_subcommand("audit", "Verify and read an audit log, or kcd's");
  audit->require_subcommand(1);
  auto a = std::make_shared<AuditArgs>();
  CLI::App* verify = audit->add_subcommand(
      "verify",
      "Check the keyed chain: exit 1 if a record was edited, moved, deleted or re-chained, or "
      "records were removed from the end");
  verify->add_option("db", a->db, "The audit database (SQLite); none: ask kcd about its log");
  verify->add_option("--key", a->key, "With db: the chain's key (default: audit.key beside it)");
  verify->add_option("--head", a->head,
                     "A head hash noted earlier (kc audit verify prints it): the log must still "
                     "hold that record");
  verify->add_flag("--json", a->json, "Print the result as JSON");
  verify->add_option("--login", a->login, "Without db: login file (default CONFIG/kc/login.json)");
  verify->callback([action, a] { *action = [a] { return RunVerify(*a); }; });
  CLI::App* show = audit->add_subcommand("show", "Print audit records");
  show->add_option("db", a->db, "The audit database (SQLite)")->required();
  show->add_option("--principal", a->principal, "Only this principal's records");
  show->add_option("--action", a->action, "Only this action, or a family ending in '.' (job.)");
  show->add_option("--limit", a->limit, "At most this many records (default 100)")
      ->check(CLI::PositiveNumber);
  show->add_flag("--json", a->json, "Print the records as JSON");
  show->callback([action, a] { *action = [a] { return RunShow(*a); }; });
  CLI::App* query =
      audit->add_subcommand("query", "Print the records of kcd's log that you may read");
  query->add_option("--principal", a->principal, "Only this principal's records");
  query->add_option("--action", a->action, "Only this action, or a family ending in '.' (quota.)");
  query->add_option("--resource", a->resource,
                    "Only resources starting with this (job/42, quota-request/)");
  query->add_option("--since", a->since,
                    "Only records since a time ago (3600, 90m, 12h, 7d) or a UTC time "
                    "(2025-05-01, 2025-05-01T12:00:00Z)");
  query->add_option("--limit", a->limit, "At most this many records (default 100)")
      ->check(CLI::PositiveNumber);
  query->add_flag("--json", a->json, "Print the records as JSON");
  query->add_option("--login", a->login, "Login file (default CONFIG/kc/login.json)");
  query->callback([action, a] { *action = [a] { return RunQuery(*a); }; });
}

}  // namespace kc::app
