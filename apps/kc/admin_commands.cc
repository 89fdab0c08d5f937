// `kc quota ...`, `kc pools`, `kc cluster topology`: kcd's QuotaService, PoolService and
// TopologyService, called with the logged-in user's token.
#include "apps/kc/admin_commands.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <iostream>
#include <memory>
#include <string>

#include "apps/kc/kcd_client.h"
#include "base/file.h"
#include "kc/v1/pools.grpc.pb.h"
#include "kc/v1/quotas.grpc.pb.h"
#include "kc/v1/topology.grpc.pb.h"

namespace kc::app {
namespace {

using kc::v1::PoolService;
using kc::v1::QuotaService;
using kc::v1::TopologyService;

struct Args {
  std::string user, team, reason, file, login;
  int64_t devices = -1, id = 0;
  double device_hours = -1, storage_gb = -1;
  bool json = false, all = false;
};

// A limit asked for: -1 (the default) leaves it unset, so a negative one is refused here.
CLI::Validator NotNegative() {
  return CLI::Validator(
      [](std::string& v) { return v.starts_with('-') ? std::string("must not be negative") : ""; },
      "", "NOT NEGATIVE");
}

void AddLoginAndJson(CLI::App* c, Args* a) {
  c->add_option("--login", a->login, "Login file (default CONFIG/kc/login.json)");
  c->add_flag("--json", a->json, "Print JSON");
}

std::string Limit(bool set, double limit, std::string_view unit = "") {
  return set ? fmt::format("{:g}{}", limit, unit) : std::string("unlimited");
}

std::string Limits(const kc::v1::QuotaLimits& l) {
  return fmt::format("devices {}, device-hours {}, storage {}",
                     Limit(l.has_max_devices(), static_cast<double>(l.max_devices())),
                     Limit(l.has_max_device_hours(), l.max_device_hours()),
                     Limit(l.has_max_storage_gb(), l.max_storage_gb(), " GB"));
}

void PrintQuota(const kc::v1::QuotaInfo& q) {
  const kc::v1::QuotaLimits& l = q.limits();
  std::cout << fmt::format("{} {}\n", Printable(q.subject()), Printable(q.name()))
            << fmt::format("  devices       {:>10} in use of {}\n", q.usage().devices(),
                           Limit(l.has_max_devices(), static_cast<double>(l.max_devices())))
            << fmt::format("  device-hours  {:>10.2f} used of {}\n", q.usage().device_hours(),
                           Limit(l.has_max_device_hours(), l.max_device_hours()))
            << fmt::format("  storage GB    {:>10.2f} used of {}\n", q.usage().storage_gb(),
                           Limit(l.has_max_storage_gb(), l.max_storage_gb()));
}

void PrintRequest(const kc::v1::QuotaRequestInfo& r) {
  const auto P = Printable;
  std::string line = fmt::format("quota request {} ({} {}, by {}): {}", r.id(), P(r.subject()),
                                 P(r.name()), P(r.requester()), P(r.state()));
  if (!r.decided_by().empty()) line += " by " + P(r.decided_by());
  if (!r.decision_reason().empty()) line += ": " + P(r.decision_reason());
  std::cout << line << "\n  wanted: " << Limits(r.wanted()) << "\n";
}

void PrintRequests(const kc::v1::ListQuotaRequestsResponse& resp) {
  constexpr std::string_view kRow = "{:>5}  {:<5} {:<12} {:<10} {:<9} {:<52} {}\n";
  std::cout << fmt::format(kRow, "ID", "OF", "NAME", "BY", "STATE", "WANTED", "REASON");
  for (const kc::v1::QuotaRequestInfo& r : resp.requests()) {
    std::cout << fmt::format(kRow, r.id(), Printable(r.subject()), Printable(r.name()),
                             Printable(r.requester()), Printable(r.state()), Limits(r.wanted()),
                             Printable(r.reason()));
  }
}

// The subject and name of --user U / --team T; neither: the caller itself when `self_ok`.
// kInvalidArgument naming the options otherwise.
Status Subject(const Args& a, bool self_ok, std::string* subject, std::string* name) {
  if (!a.user.empty() && !a.team.empty()) {
    return InvalidArgumentError("--user, --team: give one, not both");
  }
  if (a.user.empty() && a.team.empty() && !self_ok) {
    return InvalidArgumentError("--user or --team: one is required");
  }
  *subject = a.team.empty() ? "user" : "team";
  *name = a.team.empty() ? a.user : a.team;
  return OkStatus();
}

int QuotaShow(const Args& a) {
  kc::v1::GetQuotaRequest req;
  if (Status s = Subject(a, true, req.mutable_subject(), req.mutable_name()); !s.ok()) {
    return Fail("quota show", s);
  }
  return CallAndPrint("quota show", a.login, a.json, &QuotaService::Stub::Get, req, PrintQuota);
}

int QuotaRequest(const Args& a) {
  kc::v1::QuotaIncreaseRequest req;
  if (Status s = Subject(a, false, req.mutable_subject(), req.mutable_name()); !s.ok()) {
    return Fail("quota request", s);
  }
  if (a.reason.empty()) {
    return Fail("quota request", InvalidArgumentError("--reason: must not be empty"));
  }
  if (a.devices >= 0) req.mutable_wanted()->set_max_devices(a.devices);
  if (a.device_hours >= 0) req.mutable_wanted()->set_max_device_hours(a.device_hours);
  if (a.storage_gb >= 0) req.mutable_wanted()->set_max_storage_gb(a.storage_gb);
  req.set_reason(a.reason);
  return CallAndPrint("quota request", a.login, a.json, &QuotaService::Stub::RequestIncrease, req,
                      PrintRequest);
}

int QuotaDecide(const Args& a, bool approve) {
  kc::v1::DecideQuotaRequest req;
  req.set_id(a.id);
  req.set_reason(a.reason);
  return CallAndPrint(fmt::format("quota {} {}", approve ? "approve" : "deny", a.id), a.login,
                      a.json, approve ? &QuotaService::Stub::Approve : &QuotaService::Stub::Deny,
                      req, PrintRequest);
}

void AddQuota(CLI::App& app, Action* action) {
  CLI::App* quota =
      app.add_subcommand("quota", "Read quotas, ask for more, and decide requests (kcd)");
  quota->require_subcommand(1);
  // One subcommand runs: they share the arguments.
  auto a = std::make_shared<Args>();
  const auto add = [&](const char* name, const char* help, std::function<int(const Args&)> run) {
    CLI::App* c = quota->add_subcommand(name, help);
    AddLoginAndJson(c, a.get());
    c->callback([action, a, run] { *action = [a, run] { return run(*a); }; });
    return c;
  };

  CLI::App* show = add("show", "A user's or team's quota and its usage now", QuotaShow);
  show->add_option("--user", a->user, "This user (default: you)");
  show->add_option("--team", a->team, "This team");

  CLI::App* request =
      add("request", "Ask for a new quota; it replaces the current one whole", QuotaRequest);
  request->add_option("--user", a->user, "For this user (yourself, or a member of your team)");
  request->add_option("--team", a->team, "For this team");
  request->add_option("--devices", a->devices, "max_devices wanted (default: unlimited)")
      ->check(NotNegative());
  request->add_option("--device-hours", a->device_hours, "max_device_hours wanted (unlimited)")
      ->check(NotNegative());
  request->add_option("--storage-gb", a->storage_gb, "max_storage_gb wanted (unlimited)")
      ->check(NotNegative());
  request->add_option("--reason", a->reason, "Why, for the admin who decides")->required();

  CLI::App* requests =
      add("requests", "The requests you may decide (pending ones)", [](const Args& x) {
        kc::v1::ListQuotaRequestsRequest req;
        req.set_all(x.all);
        return CallAndPrint("quota requests", x.login, x.json, &QuotaService::Stub::ListRequests,
                            req, PrintRequests);
      });
  requests->add_flag("--all", a->all, "Decided ones too");

  CLI::App* approve = add("approve", "Approve a pending request: its quota is in force at once",
                          [](const Args& x) { return QuotaDecide(x, true); });
  approve->add_option("id", a->id, "The request's id (kc quota requests)")->required();
  approve->add_option("--note,--reason", a->reason, "Recorded with the decision");
  CLI::App* deny = add("deny", "Deny a pending request; the quota stays",
                       [](const Args& x) { return QuotaDecide(x, false); });
  deny->add_option("id", a->id, "The request's id (kc quota requests)")->required();
  deny->add_option("--reason", a->reason, "Why, recorded with the decision")->required();
}

void PrintPools(const google::protobuf::RepeatedPtrField<kc::v1::PoolInfo>& pools) {
  constexpr std::string_view kRow = "{:<16} {:>7}  {:<24} {:<16} {:<5} {}\n";
  std::cout << fmt::format(kRow, "POOL", "DEVICES", "CLASSES", "TEAMS", "LEND", "HOSTS");
  for (const kc::v1::PoolInfo& p : pools) {
    std::cout << fmt::format(
        kRow, Printable(p.name()), p.devices(),
        Printable(fmt::to_string(fmt::join(p.classes(), ","))),
        p.teams().empty() ? "(all)" : Printable(fmt::to_string(fmt::join(p.teams(), ","))),
        p.lend() ? "yes" : "no", Printable(fmt::to_string(fmt::join(p.hosts(), ","))));
  }
}

void PrintTopology(const kc::v1::TopologyInfo& t) {
  std::cout << fmt::format("topology: {} hosts, {} devices; sha256 {}\n  hosts: {}\n",
                           t.hosts_size(), t.devices(), Printable(t.sha256()),
                           Printable(fmt::to_string(fmt::join(t.hosts(), ", "))));
}

// `NAME [--json]` runs `read`; `NAME put FILE [--json]` runs `put` with the file's text.
void AddReadAndPut(CLI::App* c, std::string name, const char* put_help, Action* action,
                   std::function<int(const Args&)> read,
                   std::function<int(const Args&, const std::string& text)> put) {
  auto a = std::make_shared<Args>();
  AddLoginAndJson(c, a.get());
  CLI::App* p = c->add_subcommand("put", put_help);
  p->add_option("file", a->file, "The new file (YAML)")->required();
  AddLoginAndJson(p, a.get());
  // CLI11 runs a subcommand's callback before its parent's: the parent leaves `put` chosen.
  c->callback([action, a, read, p] {
    if (!p->parsed()) *action = [a, read] { return read(*a); };
  });
  p->callback([action, a, put, name] {
    *action = [a, put, name] {
      Result<std::string> text = ReadWholeFile(a->file);
      if (!text.ok()) return Fail(name + " put " + a->file, text.status());
      return put(*a, *text);
    };
  });
}

void AddPools(CLI::App& app, Action* action) {
  AddReadAndPut(
      app.add_subcommand("pools", "The cluster's pools as kcd's scheduler lays them (kcd)"),
      "pools", "Replace the cluster's pools.yaml (system admins); applies when kcd restarts",
      action,
      [](const Args& a) {
        return CallAndPrint("pools", a.login, a.json, &PoolService::Stub::List,
                            kc::v1::ListPoolsRequest(), [](const kc::v1::ListPoolsResponse& r) {
                              PrintPools(r.pools());
                              if (r.defaults()) {
                                std::cout << "(the cluster has no pools.yaml: one pool of every "
                                             "device)\n";
                              }
                            });
      },
      [](const Args& a, const std::string& text) {
        kc::v1::PutPoolsRequest req;
        req.set_pools(text);
        return CallAndPrint("pools put " + a.file, a.login, a.json, &PoolService::Stub::Put, req,
                            [](const kc::v1::PutPoolsResponse& r) {
                              PrintPools(r.pools());
                              std::cout << "pools.yaml replaced; " << r.note() << "\n";
                            });
      });
}

void AddCluster(CLI::App& app, Action* action) {
  CLI::App* cluster = app.add_subcommand("cluster", "The cluster's configuration as kcd serves it");
  cluster->require_subcommand(1);
  CLI::App* topology = cluster->add_subcommand(
      "topology", "The cluster's topology, its inventory file (kcd); `kc topo` probes this host");
  auto inventory = std::make_shared<bool>(false);
  topology->add_flag("--inventory", *inventory,
                     "Print the inventory file as stored (to edit, then put)");
  AddReadAndPut(
      topology, "cluster topology",
      "Replace the cluster's topology.yaml (system admins); applies when kcd restarts", action,
      [inventory](const Args& a) {
        return CallAndPrint("cluster topology", a.login, a.json, &TopologyService::Stub::Get,
                            kc::v1::GetTopologyRequest(),
                            [inventory](const kc::v1::TopologyInfo& t) {
                              if (*inventory) {
                                std::cout << t.inventory();
                              } else {
                                PrintTopology(t);
                              }
                            });
      },
      [](const Args& a, const std::string& text) {
        kc::v1::PutTopologyRequest req;
        req.set_inventory(text);
        return CallAndPrint("cluster topology put " + a.file, a.login, a.json,
                            &TopologyService::Stub::Put, req,
                            [](const kc::v1::PutTopologyResponse& r) {
                              PrintTopology(r.topology());
                              std::cout << "topology.yaml replaced; " << r.note() << "\n";
                            });
      });
}

}  // namespace

void AddAdminCommands(CLI::App& app, Action* action) {
  AddQuota(app, action);
  AddPools(app, action);
  AddCluster(app, action);
}

}  // namespace kc::app
