// The admin commands against kcd in its own process, as a team's users run them: `kc quota`
// requests, decisions and who may make them; `kc audit query` and the remote `kc audit
// verify`; `kc pools` and `kc cluster topology`, read by everyone and replaced by admins.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/daemon.h"
#include "tests/support/inventories.h"
#include "tests/support/kc_run.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using kc::testing::Daemon;
using kc::testing::KcRun;
using kc::testing::kTwoCpuHosts;
using kc::testing::TempDir;
using ::testing::HasSubstr;

// Team vision: alice submits, rob administers it; olga observes.
constexpr char kUsers[] = R"(users:
  - {name: admin, role: system_admin}
  - {name: alice, role: submitter, teams: [vision]}
  - {name: rob, role: resource_admin, teams: [vision]}
  - {name: olga, role: observer}
teams:
  - {name: vision, admins: [rob]}
)";

// Protobuf's JSON writes 64-bit integers as strings.
int64_t Int(const nlohmann::json& v) {
  return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
}

// Expects `r` to have exited with `code`, saying `what` on stderr.
void ExpectRefused(const KcRun& r, int code, const std::string& what) {
  EXPECT_EQ(r.exit_code, code) << r.err;
  EXPECT_THAT(r.err, HasSubstr(what));
}

class AdminCliTest : public ::testing::Test {
 protected:
  // A cluster with the users above, kcd serving it, and each user logged in.
  void SetUp() override {
    const std::string cluster = dir_.Path("cluster");
    KcRun init =
        Kc(fmt::format("init {} --inventory {}", cluster, dir_.Write("inv.yaml", kTwoCpuHosts)));
    ASSERT_EQ(init.exit_code, 0) << init.err;
    std::ifstream in(cluster + "/roles.yaml");
    std::stringstream roles;
    roles << in.rdbuf();
    std::string text = roles.str();
    const size_t users = text.find("users:");
    ASSERT_NE(users, std::string::npos) << text;
    dir_.Write("cluster/roles.yaml", text.substr(0, users) + kUsers);

    kcd_ = std::make_unique<Daemon>(
        fmt::format("{} --dir {} --listen 127.0.0.1:0", KCD_BINARY, cluster));
    const std::string line = kcd_->WaitForLine("listening on");
    const size_t colon = line.rfind(':', line.find(" ("));
    ASSERT_NE(colon, std::string::npos) << kcd_->output();
    const std::string server = fmt::format("--server localhost:{} --ca {}/tls/ca.pem",
                                           std::stoi(line.substr(colon + 1)), cluster);
    for (const char* user : {"alice", "rob", "olga"}) {
      const std::string token = dir_.Path(std::string(user) + ".token");
      KcRun issue = Kc(fmt::format("token issue {} --dir {} --out {}", user, cluster, token));
      ASSERT_EQ(issue.exit_code, 0) << issue.err;
      KcRun login = As(user, fmt::format("login {} --token-file {}", server, token));
      ASSERT_EQ(login.exit_code, 0) << login.err;
    }
    KcRun login = As("admin", fmt::format("login {} --token-file {}/admin.token", server, cluster));
    ASSERT_EQ(login.exit_code, 0) << login.err;
  }

  KcRun Kc(const std::string& args) { return kc::testing::RunKc(KC_BINARY, args); }

  // kc as `user`, through the login file kept for it.
  KcRun As(const std::string& user, const std::string& args) {
    return Kc(fmt::format("{} --login {}", args, dir_.Path(user + ".login.json")));
  }

  // `args` as `user`, which must succeed, with --json: the parsed output.
  nlohmann::json Json(const std::string& user, const std::string& args) {
    KcRun r = As(user, args + " --json");
    EXPECT_EQ(r.exit_code, 0) << args << ": " << r.err;
    return nlohmann::json::parse(r.out, nullptr, false);
  }

  // Alice asks for `what` of team vision; returns the request's id.
  int64_t AliceRequests(const std::string& what) {
    nlohmann::json r =
        Json("alice", "quota request --team vision " + what + " --reason 'bigger runs'");
    EXPECT_EQ(r["state"], "pending") << r.dump();
    EXPECT_EQ(r["requester"], "alice");
    return Int(r["id"]);
  }

  TempDir dir_{"kc_admin_cli"};
  std::unique_ptr<Daemon> kcd_;
};

TEST_F(AdminCliTest, ATeamQuotaIncreaseIsRequestedApprovedAndInForce) {
  nlohmann::json before = Json("alice", "quota show --team vision");
  EXPECT_EQ(before["subject"], "team");
  EXPECT_FALSE(before["limits"].contains("max_devices")) << before.dump();  // unlimited

  const int64_t id = AliceRequests("--devices 8 --device-hours 100");
  nlohmann::json pending = Json("rob", "quota requests");
  ASSERT_EQ(pending["requests"].size(), 1u) << pending.dump();
  EXPECT_EQ(Int(pending["requests"][0]["id"]), id);
  EXPECT_EQ(Int(pending["requests"][0]["wanted"]["max_devices"]), 8);

  KcRun approve = As("rob", fmt::format("quota approve {} --note 'until June'", id));
  ASSERT_EQ(approve.exit_code, 0) << approve.err;
  EXPECT_THAT(approve.out, HasSubstr("approved by rob: until June"));

  nlohmann::json after = Json("alice", "quota show --team vision");
  EXPECT_EQ(Int(after["limits"]["max_devices"]), 8) << after.dump();
  EXPECT_EQ(after["limits"]["max_device_hours"], 100.0);
  EXPECT_FALSE(after["limits"].contains("max_storage_gb"));
  EXPECT_EQ(Json("rob", "quota requests")["requests"].size(), 0u);
  EXPECT_EQ(Json("rob", "quota requests --all")["requests"][0]["state"], "approved");
  KcRun text = As("alice", "quota show --team vision");
  EXPECT_THAT(text.out, HasSubstr("in use of 8"));

  // The admin sees the request and the decision in kcd's audit log; alice only her own.
  nlohmann::json records = Json("admin", "audit query --action quota. --since 1h");
  std::vector<std::string> seen;
  for (const nlohmann::json& r : records["records"]) {
    seen.push_back(r["action"].get<std::string>() + " " + r["principal"].get<std::string>() + " " +
                   r["resource"].get<std::string>() + " " + r["outcome"].get<std::string>());
  }
  const std::string resource = fmt::format("quota-request/{}", id);
  EXPECT_THAT(seen, ::testing::ElementsAre("quota.request alice " + resource + " ok",
                                           "quota.approve rob " + resource + " ok"));
  const nlohmann::json hers = Json("alice", "audit query --action quota.");
  for (const nlohmann::json& r : hers["records"]) {
    EXPECT_EQ(r["principal"], "alice");
  }
  KcRun verify = As("admin", "audit verify");
  EXPECT_EQ(verify.exit_code, 0) << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("chain intact"));
}

TEST_F(AdminCliTest, ADeniedRequestLeavesTheQuotaAndIsDecidedOnce) {
  const int64_t id = AliceRequests("--devices 2");
  ExpectRefused(As("rob", fmt::format("quota deny {}", id)), 2, "--reason");

  KcRun deny = As("rob", fmt::format("quota deny {} --reason 'not now'", id));
  ASSERT_EQ(deny.exit_code, 0) << deny.err;
  EXPECT_THAT(deny.out, HasSubstr("denied by rob: not now"));
  EXPECT_FALSE(Json("alice", "quota show --team vision")["limits"].contains("max_devices"));

  // FAILED_PRECONDITION, naming the command and the decision made.
  ExpectRefused(As("rob", fmt::format("quota approve {}", id)), 1,
                fmt::format("quota approve {}: quota request {}: already denied by rob", id, id));
}

TEST_F(AdminCliTest, OnlyTheTeamsAdminsDecideAndBadInputIsNamed) {
  const int64_t id = AliceRequests("--devices 16");
  ExpectRefused(As("alice", fmt::format("quota approve {}", id)), 1, "submitter");
  ExpectRefused(As("olga", fmt::format("quota approve {}", id)), 1, "observer");
  EXPECT_EQ(As("olga", "quota requests").exit_code, 1);
  EXPECT_EQ(Json("alice", "quota show --team vision")["limits"].size(), 0u);

  ExpectRefused(As("rob", "quota approve 999"), 2, "999");  // NOT_FOUND
  ExpectRefused(As("alice", "quota request --devices 4 --reason x"), 2, "--user or --team");
  ExpectRefused(As("admin", "audit query --since yesterday"), 2, "--since");
  // Quotas of users and teams the roles file does not name do not exist.
  ExpectRefused(As("admin", "quota show --team nope"), 2, "no team \"nope\"");
  ExpectRefused(As("admin", "quota request --user ghost --devices 4 --reason x"), 2,
                "no user \"ghost\"");
  // Submitters may not verify the chain.
  EXPECT_EQ(As("alice", "audit verify").exit_code, 1);
}

// A resource admin asks for her own team's quota: someone else decides it.
TEST_F(AdminCliTest, NoOneButASystemAdminDecidesTheirOwnRequest) {
  const int64_t id =
      Int(Json("rob", "quota request --team vision --devices 64 --reason mine")["id"]);
  ExpectRefused(As("rob", fmt::format("quota approve {}", id)), 1, "never on its own request");
  EXPECT_EQ(Json("rob", "quota requests")["requests"].size(), 0u);
  KcRun approve = As("admin", fmt::format("quota approve {} --note 'checked'", id));
  EXPECT_EQ(approve.exit_code, 0) << approve.err;
}

// Records cut from the end of kcd's log, with the head file that named them, while kcd runs:
// kcd still holds the head, so `kc audit verify` says so, kcd appends nothing more, and a
// restarted kcd refuses to start on the log.
TEST_F(AdminCliTest, KcdNoticesRecordsCutFromTheEndOfItsLog) {
  AliceRequests("--devices 4");
  KcRun before = As("admin", "audit verify");
  ASSERT_EQ(before.exit_code, 0) << before.err;
  const std::string cluster = dir_.Path("cluster");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((cluster + "/audit.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "DROP TRIGGER audit_no_delete; DELETE FROM audit WHERE seq > "
                         "(SELECT MAX(seq) - 2 FROM audit);",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  std::filesystem::remove(cluster + "/audit.head");

  KcRun verify = As("admin", "audit verify");
  EXPECT_EQ(verify.exit_code, 1) << verify.out << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("removed from the end"));
  // A change kcd would record is refused rather than recorded on the cut log.
  EXPECT_EQ(As("alice", "quota request --team vision --devices 2 --reason x").exit_code, 1);
  kcd_->Stop(SIGTERM);
  Daemon again(fmt::format("{} --dir {} --listen 127.0.0.1:0", KCD_BINARY, cluster));
  EXPECT_EQ(again.WaitForLine("listening on"), "");
  EXPECT_NE(again.Stop(SIGTERM), 0);
}

TEST_F(AdminCliTest, PoolsAndTopologyAreReadByAllAndReplacedByAdmins) {
  nlohmann::json pools = Json("alice", "pools");
  EXPECT_EQ(pools["defaults"], true);
  ASSERT_FALSE(pools["pools"].empty()) << pools.dump();
  int64_t devices = 0;
  for (const nlohmann::json& p : pools["pools"]) devices += Int(p["devices"]);
  EXPECT_EQ(devices, 4);
  EXPECT_THAT(As("olga", "pools").out, HasSubstr("the cluster has no pools.yaml"));

  nlohmann::json topo = Json("alice", "cluster topology");
  EXPECT_EQ(topo["hosts"], nlohmann::json::array({"h1", "h2"}));
  EXPECT_EQ(topo["devices"], 4);
  EXPECT_EQ(As("alice", "cluster topology --inventory").out, kTwoCpuHosts);

  ExpectRefused(
      As("admin", "cluster topology put " + dir_.Write("bad.yaml", "name: x\nhosts: 3\n")), 2,
      "topology.yaml:");
  EXPECT_EQ(As("alice", "cluster topology put " + dir_.Path("inv.yaml")).exit_code, 1);
  KcRun good = As("admin", "cluster topology put " + dir_.Path("inv.yaml"));
  EXPECT_EQ(good.exit_code, 0) << good.err;
  EXPECT_THAT(good.out, HasSubstr("topology.yaml replaced"));
  ExpectRefused(As("admin", "pools put " + dir_.Path("nope.yaml")), 2, "nope.yaml");
}

}  // namespace
}  // namespace kc::api
