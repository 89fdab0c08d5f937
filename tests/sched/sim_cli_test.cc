// `kc sim` as an admin runs it: a hand-written trace replayed beside FIFO, as text and JSON,
// with the utilisation plot and every decision's reason; `kc sim generate`; and bad input,
// refused with the file, line and column or option named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "sched/trace.h"
#include "tests/support/kc_run.h"
#include "tests/support/repo_root.h"
#include "tests/support/temp_dir.h"

namespace kc::sched {
namespace {

using kc::testing::KcRun;
using kc::testing::TempDir;
using ::testing::HasSubstr;
using Json = nlohmann::json;

KcRun Kc(const std::string& args) { return kc::testing::RunKc(KC_BINARY, args); }
std::string Example(const std::string& path) { return kc::testing::RepoRoot() + path; }
std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
const std::string kCluster = "--inventory " + Example("examples/clusters/dgx-a100x4.yaml");

TEST(SimCliTest, ReportsTheSchedulerBesideFifo) {
  KcRun r = Kc("sim " + kCluster + " --trace " + Example("examples/traces/preemption.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("kuangchao"));
  EXPECT_THAT(r.out, HasSubstr("kuangchao/seed-rule"));
  EXPECT_THAT(r.out, HasSubstr("fifo"));
  EXPECT_THAT(r.out, HasSubstr("queueing delay high p50/p95"));
  EXPECT_THAT(r.out, HasSubstr("preemptions / shrinks / grows"));
  EXPECT_THAT(r.out, HasSubstr("utilisation over time"));
  EXPECT_THAT(r.out, HasSubstr("checkpoint advice from kuangchao's history"));
}

TEST(SimCliTest, JsonPlotAndDecisions) {
  TempDir dir("kc_sim_cli");
  const std::string plot = dir.Path("util.svg"), log = dir.Path("decisions.jsonl");
  KcRun r = Kc("sim " + kCluster + " --trace " + Example("examples/traces/lending.csv") +
               " --json --plot " + plot + " --decisions " + log);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json j = Json::parse(r.out);
  ASSERT_EQ(j["runs"].size(), 3u);
  EXPECT_EQ(j["runs"][0]["policy"], "kuangchao");
  EXPECT_EQ(j["runs"][2]["policy"], "fifo");
  EXPECT_EQ(j["runs"][0]["finished"], 4);
  EXPECT_EQ(j["runs"][0]["preemptions"], 1);
  EXPECT_LE(j["runs"][0]["queue_delay"]["high"]["p95_s"].get<double>(), 60);
  EXPECT_GT(j["runs"][2]["queue_delay"]["high"]["p95_s"].get<double>(), 3600);
  EXPECT_EQ(j["runs"][0]["utilisation_curve"].size(), 200u);
  EXPECT_THAT(Read(plot), HasSubstr("<svg"));
  EXPECT_THAT(Read(plot), HasSubstr("<polyline"));
  // Every decision of the first run, each with its reason.
  std::istringstream lines(Read(log));
  std::string line;
  int n = 0, preempts = 0;
  while (std::getline(lines, line)) {
    Json d = Json::parse(line);
    EXPECT_FALSE(d["reason"].get<std::string>().empty()) << line;
    preempts += d["decision"] == "preempt";
    ++n;
  }
  EXPECT_GE(n, 5);
  EXPECT_EQ(preempts, 1);
}

TEST(SimCliTest, FifoAloneAndPoolsFromAFile) {
  KcRun r = Kc("sim " + kCluster + " --trace " + Example("examples/traces/backfill.csv") +
               " --policy fifo --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json j = Json::parse(r.out);
  ASSERT_EQ(j["runs"].size(), 1u);
  EXPECT_EQ(j["runs"][0]["policy"], "fifo");
  r = Kc("sim " + kCluster + " --trace " + Example("examples/traces/elastic.csv") + " --pools " +
         Example("examples/traces/one-pool.yaml") + " --no-compare --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = Json::parse(r.out);
  ASSERT_EQ(j["runs"].size(), 1u);
  EXPECT_EQ(j["runs"][0]["shrinks"], 1);
  EXPECT_EQ(j["runs"][0]["grows"], 1);
  r = Kc("sim --inventory " + Example("examples/clusters/dgx-a100x16.yaml") + " --trace " +
         Example("examples/traces/backfill.csv") + " --pools " +
         Example("examples/admin/pools.yaml") + " --no-compare");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(SimCliTest, GeneratedTracesLoadAndRepeat) {
  TempDir dir("kc_sim_gen");
  const std::string a = dir.Path("a.csv"), b = dir.Path("b.csv");
  KcRun r = Kc("sim generate --jobs 200 --devices 32 --seed 4 -o " + a);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(Kc("sim generate --jobs 200 --devices 32 --seed 4 -o " + b).exit_code, 0);
  EXPECT_EQ(Read(a), Read(b));
  EXPECT_THAT(Read(a), HasSubstr("Philly"));
  Result<std::vector<TraceJob>> jobs = LoadTrace(a);
  ASSERT_TRUE(jobs.ok()) << jobs.status().message();
  EXPECT_EQ(jobs->size(), 200u);
  r = Kc("sim " + kCluster + " --trace " + a + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json j = Json::parse(r.out);
  EXPECT_EQ(j["runs"][0]["refused"].size(), 0u);
  EXPECT_EQ(Kc("sim generate --jobs 5").out.substr(0, 1), "#");  // standard output
  // The family knobs reach the trace and its header.
  r =
      Kc("sim generate --jobs 300 --devices 64 --size-mix 0,0,1,0 --elastic-fraction 1 "
         "--elastic-min-ratio 0.5 --duration-sigma 1.2 --burstiness 4 -o " +
         a);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(Read(a), HasSubstr("elastic 1 (min ratio 0.5); size mix 0,0,1,0; duration sigma "
                                 "1.2; burstiness 4"));
  jobs = LoadTrace(a);
  ASSERT_TRUE(jobs.ok()) << jobs.status().message();
  for (const TraceJob& job : *jobs) {
    EXPECT_EQ(job.max_devices, 8) << job.job;
    EXPECT_EQ(job.min_devices, 4) << job.job;
  }
}

TEST(SimCliTest, BadInputIsRefusedWithItsPlaceNamed) {
  TempDir dir("kc_sim_bad");
  const std::string trace = dir.Path("t.csv");
  std::ofstream(trace) << "submit_s,job,team,user,class,min_devices,max_devices,duration_s\n"
                          "0,a,t,u,normal,1,1,10\n"
                          "5,b,t,u,normal,8,4,10\n";
  KcRun r = Kc("sim " + kCluster + " --trace " + trace);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("t.csv:3: min_devices: 8 is above max_devices 4"));

  const std::string pools = dir.Path("p.yaml");
  std::ofstream(pools) << "pools:\n  - {name: a, classes: [urgent], rest: true}\n";
  r = Kc("sim " + kCluster + " --trace " + Example("examples/traces/backfill.csv") + " --pools " +
         pools);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("p.yaml:2: pools[0].classes"));

  std::ofstream(pools) << "pools:\n  - {name: a, classes: [normal], devices: 64}\n";
  r = Kc("sim " + kCluster + " --trace " + Example("examples/traces/backfill.csv") + " --pools " +
         pools);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("pool \"a\": asks for 64 devices"));

  // A job above every pool's capacity is refused, with its reason, and the rest run.
  std::ofstream(trace) << "submit_s,job,team,user,class,min_devices,max_devices,duration_s\n"
                          "0,huge,t,u,normal,64,64,10\n"
                          "1,fine,t,u,normal,1,1,10\n";
  r = Kc("sim " + kCluster + " --trace " + trace);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("refused: job huge: refused: asks for at least 64 devices"));

  r = Kc("sim --trace " + trace);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--inventory: required"));
  r = Kc("sim " + kCluster + " --trace " + dir.Path("missing.csv"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("missing.csv"));
  EXPECT_EQ(Kc("sim " + kCluster + " --trace " + trace + " --policy lottery").exit_code, 2);
  r = Kc("sim generate --jobs 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--jobs: must be at least 1"));
  r = Kc("sim generate --size-mix 1,1,1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--size-mix"));
  for (const char* bad :
       {"--burstiness 0", "--duration-sigma -1", "--elastic-min-ratio 1", "--size-mix 0,0,0,0"}) {
    r = Kc(std::string("sim generate --jobs 5 ") + bad);
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_THAT(r.err, HasSubstr(std::string(bad).substr(0, std::string(bad).find(' ')) + ":"))
        << bad;
  }
}

}  // namespace
}  // namespace kc::sched
