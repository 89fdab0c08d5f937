// `kc plan` as a user runs it: a simulated cluster's plan with its breakdowns, alternatives,
// baseline and approval verdict; the same as JSON; a plan file kc train reads; the published
// cases; calibration on this machine; `kc train --plan auto`; and bad input.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/support/kc_run.h"
#include "tests/support/repo_root.h"
#include "tests/support/temp_dir.h"

namespace kc::parallel {
namespace {

using kc::testing::KcRun;
using kc::testing::TempDir;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// Every run gets its own configuration directory, so no calibration of the machine leaks in.
KcRun Kc(const TempDir& dir, const std::string& args) {
  return kc::testing::RunKc("XDG_CONFIG_HOME=" + dir.Path("config") + " " + KC_BINARY, args);
}

std::string Example(const std::string& path) { return kc::testing::RepoRoot() + path; }

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(PlanCliTest, PlansAModelOnASimulatedClusterAndExplainsIt) {
  TempDir dir("kc_plan_cli");
  const std::string args = Example("examples/models/gpt2-124m.yaml") + " --cluster " +
                           Example("examples/clusters/dgx-a100x4.yaml") +
                           " --batch 256 --steps 1000";
  KcRun r = Kc(dir, "plan " + args + " --out " + dir.Path("chosen.yaml"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* part :
       {"chosen plan: t=", "step time", "tokens/s", "TFLOP/s per device", "bubble", "memory/device",
        "weights", "gradients", "optimizer", "activations", "comm buffers", "data-parallel",
        "approval        not required", "runtime", "alternatives (", "why it lost",
        "% step time, mostly", "seed's rules:", "as fast"}) {
    EXPECT_THAT(r.out, HasSubstr(part));
  }

  KcRun j = Kc(dir, "plan " + args + " --json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const Json doc = Json::parse(j.out);
  EXPECT_EQ(doc["cluster"]["devices"], 32);
  EXPECT_EQ(doc["global_batch"], 256);
  const Json& plan = doc["chosen"]["plan"];
  EXPECT_EQ(plan["t"].get<int>() * plan["p"].get<int>() * plan["d"].get<int>(), 32);
  const Json& e = doc["chosen"]["estimate"];
  EXPECT_GT(e["step_time_s"].get<double>(), 0);
  EXPECT_TRUE(e["memory"]["fits"].get<bool>());
  EXPECT_NEAR(e["memory"]["total"].get<double>(),
              e["memory"]["weights"].get<double>() + e["memory"]["gradients"].get<double>() +
                  e["memory"]["optimizer_state"].get<double>() +
                  e["memory"]["activations"].get<double>() +
                  e["memory"]["communication_buffers"].get<double>(),
              1);
  ASSERT_FALSE(doc["alternatives"].empty());
  for (const Json& alt : doc["alternatives"]) {
    EXPECT_GE(alt["estimate"]["step_time_s"].get<double>(), e["step_time_s"].get<double>());
    EXPECT_FALSE(alt["reason"].get<std::string>().empty());
  }
  EXPECT_GE(doc["baseline"]["speedup"].get<double>(), 1.0);
  EXPECT_TRUE(doc["fastest_unfit"].is_null());  // 32 GPUs of 80 GB hold every plan of GPT-2
  EXPECT_FALSE(doc["approval"]["required"].get<bool>());
  EXPECT_NEAR(doc["approval"]["runtime_s"].get<double>(), 1000 * e["step_time_s"].get<double>(),
              1e-6);

  // The 1T-parameter GPT on 3,072 A100s: the fastest plan (no recompute) needs more memory
  // than a device has, and is shown as lost on memory.
  KcRun big = Kc(dir, "plan " + Example("examples/models/gpt-1t.yaml") + " --cluster " +
                          Example("examples/clusters/a100x3072.yaml") + " --batch 3072");
  ASSERT_EQ(big.exit_code, 0) << big.err;
  EXPECT_THAT(big.out, HasSubstr("lost on memory: "));
  EXPECT_THAT(big.out, HasSubstr("faster, but needs"));

  // The plan file is the JSON's plan, and kc train's plan reader takes it.
  const std::string written = Read(dir.Path("chosen.yaml"));
  EXPECT_THAT(written, HasSubstr("t: " + std::to_string(plan["t"].get<int>())));
  EXPECT_THAT(written,
              HasSubstr("micro_batches: " + std::to_string(plan["micro_batches"].get<int64_t>())));
}

TEST(PlanCliTest, APlanPastTheApprovalLimitsIsReportedNotWrittenAndExitsThree) {
  TempDir dir("kc_plan_cli");
  const std::string limits =
      dir.Write("limits.yaml", "max_devices: 16\nmax_runtime_hours: 0.001\n");
  const std::string args = Example("examples/models/gpt2-124m.yaml") + " --cluster " +
                           Example("examples/clusters/dgx-a100x4.yaml") +
                           " --batch 256 --steps 1000 --approval-limits ";
  KcRun r = Kc(dir, "plan " + args + limits + " --out " + dir.Path("gated.yaml"));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_THAT(r.out, HasSubstr("approval        REQUIRED: 32 devices, above the limit of 16"));
  EXPECT_THAT(r.out, HasSubstr("expected for 1000 steps"));
  EXPECT_THAT(r.out, HasSubstr("for the resource admin: 32 devices"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("plan written to")));
  EXPECT_THAT(r.err, HasSubstr("needs a resource admin's approval"));
  EXPECT_THAT(r.err, HasSubstr("gated.yaml not written"));
  EXPECT_FALSE(std::filesystem::exists(dir.Path("gated.yaml")));
  KcRun j = Kc(dir, "plan " + args + limits + " --json --out " + dir.Path("gated.yaml"));
  EXPECT_EQ(j.exit_code, 3) << j.err;
  const Json doc = Json::parse(j.out);
  const Json approval = doc["approval"];
  EXPECT_TRUE(approval["required"].get<bool>());
  EXPECT_EQ(approval["reasons"].size(), 2u);
  EXPECT_GT(approval["comm_bytes_per_step"].get<double>(), 0);
  EXPECT_FALSE(doc.contains("written"));
  EXPECT_FALSE(std::filesystem::exists(dir.Path("gated.yaml")));

  // Within the limits the plan is written and the exit status is 0.
  const std::string roomy = dir.Write("roomy.yaml", "max_devices: 64\n");
  KcRun ok = Kc(dir, "plan " + args + roomy + " --out " + dir.Path("ok.yaml"));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("approval        not required"));
  EXPECT_TRUE(std::filesystem::exists(dir.Path("ok.yaml")));

  const std::string bad = dir.Write("bad.yaml", "max_devices: 16\nmax_nodes: 2\n");
  KcRun b = Kc(dir, "plan " + Example("examples/models/gpt2-124m.yaml") + " --cluster " +
                        Example("examples/clusters/dgx-a100x4.yaml") + " --approval-limits " + bad);
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_THAT(b.err, HasSubstr("bad.yaml:2"));
  EXPECT_THAT(b.err, HasSubstr("max_nodes"));
}

// Every case of a published-runs file planned through kc plan --cases, each within 15%, the
// search's choice fitting and at least as fast as the published plan.
Json CheckPublishedCases(const TempDir& dir, const std::string& cases, size_t count) {
  KcRun r = Kc(dir, "plan --cases " + cases + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Json doc = Json::parse(r.out);
  EXPECT_EQ(doc.size(), count);
  for (const Json& c : doc) {
    const double published = c["published"]["tflops_per_device"].get<double>();
    const double predicted = c["predicted"]["model_tflops_per_device"].get<double>();
    EXPECT_NEAR(c["error"].get<double>(), predicted / published - 1, 1e-9);
    EXPECT_LT(std::abs(c["error"].get<double>()), 0.15) << c["id"];
    EXPECT_TRUE(c["chosen"]["estimate"]["memory"]["fits"].get<bool>()) << c["id"];
    EXPECT_GE(c["chosen"]["estimate"]["model_tflops_per_device"].get<double>(),
              predicted * (1 - 1e-9))
        << c["id"];
  }
  return doc;
}

TEST(PlanCliTest, ChecksThePublishedCases) {
  const std::string cases = kc::testing::RepoRoot() + "../shared/data/planner_cases_published.json";
  if (!std::ifstream(cases)) GTEST_SKIP() << "no published cases at " << cases;
  TempDir dir("kc_plan_cli");
  CheckPublishedCases(dir, cases, 7);
  KcRun text = Kc(dir, "plan --cases " + cases);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("narayanan2021_table1_1008.0B"));
}

// The seven kept with the benchmark, Korthikanti et al.'s 530B and 1T given as their paper
// gives them (MFU and iteration time): the MFU is read as a share of the peak.
TEST(PlanCliTest, ChecksTheMorePublishedCasesGivenAsTheirPapersGiveThem) {
  TempDir dir("kc_plan_cli");
  const Json doc =
      CheckPublishedCases(dir, kc::testing::RepoRoot() + "bench/plan/cases_more.json", 7);
  ASSERT_EQ(doc.size(), 7u);
  EXPECT_EQ(doc[5]["id"], "korthikanti2022_table3_5_530B");
  EXPECT_NEAR(doc[5]["published"]["tflops_per_device"].get<double>(), 0.56 * 312, 1e-9);
  EXPECT_NEAR(doc[6]["published"]["tflops_per_device"].get<double>(), 0.563 * 312, 1e-9);
}

// A small case of the published-cases schema: `mem_gb` decides whether anything fits.
std::string SmallCase(const std::string& id, double mem_gb) {
  return fmt::format(R"({{"id": "{}", "model": {{"layers": 4, "hidden": 64, "heads": 4,
      "seq_len": 8, "vocab": 100}}, "global_batch": 8, "cluster": {{"gpus": 4,
      "gpus_per_node": 4, "peak_tflops": 100, "mem_gb": {}, "intra_node_GBps": 100,
      "inter_node_GBps_per_gpu": 10}}, "published": {{"tp": 1, "pp": 2, "dp": 2,
      "tflops_per_gpu": 1}}}})",
                     id, mem_gb);
}

TEST(PlanCliTest, ACaseThatCannotBePlannedIsReportedAndTheOthersGoOn) {
  TempDir dir("kc_plan_cli");
  // "tight" is well formed but nothing fits in its 1 kB devices: exit 1.
  const std::string unplanned =
      dir.Write("u.json", "[" + SmallCase("first", 80) + "," + SmallCase("tight", 1e-6) + "," +
                              SmallCase("last", 80) + "]");
  KcRun r = Kc(dir, "plan --cases " + unplanned);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("first "));
  EXPECT_THAT(r.out, HasSubstr("last "));
  EXPECT_THAT(r.out, HasSubstr("assumed  first: v=2 (unstated)"));
  EXPECT_THAT(r.err, HasSubstr("does not fit"));
  EXPECT_THAT(r.err, HasSubstr("1 of 3 cases not planned (0 malformed)"));
  KcRun j = Kc(dir, "plan --cases " + unplanned + " --json");
  EXPECT_EQ(j.exit_code, 1) << j.err;
  const Json doc = Json::parse(j.out);
  ASSERT_EQ(doc.size(), 3u);
  EXPECT_TRUE(doc[0]["ok"].get<bool>());
  EXPECT_FALSE(doc[1]["ok"].get<bool>());
  EXPECT_THAT(doc[1]["message"].get<std::string>(), HasSubstr("does not fit"));
  EXPECT_TRUE(doc[2]["ok"].get<bool>());
  EXPECT_EQ(doc[2]["chosen"]["plan"]["t"].get<int>() * doc[2]["chosen"]["plan"]["p"].get<int>() *
                doc[2]["chosen"]["plan"]["d"].get<int>(),
            4);

  // A malformed case is named with its key; the rest are planned; exit 2.
  const std::string malformed = dir.Write(
      "m.json", "[" + SmallCase("first", 80) + R"(, {"id": "q"}, )" + SmallCase("last", 80) + "]");
  KcRun m = Kc(dir, "plan --cases " + malformed);
  EXPECT_EQ(m.exit_code, 2) << m.err;
  EXPECT_THAT(m.err, HasSubstr("case 2 (q): model"));
  EXPECT_THAT(m.out, ::testing::ContainsRegex("q +not planned: "));
  EXPECT_THAT(m.out, HasSubstr("last "));
}

// A model small enough to calibrate in a second, of `layers` layers.
std::string CalibModel(const TempDir& dir, int layers) {
  return dir.Write("m.yaml", fmt::format(R"(name: calib-gpt
layers: {}
hidden: 64
heads: 4
vocab: 257
seq_len: 32
batch_per_rank: 4
)",
                                         layers));
}

TEST(PlanCliTest, CalibratesThisMachineAndTrainAutoRunsTheChoice) {
  TempDir dir("kc_plan_cli");
  const std::string model = CalibModel(dir, 1);
  KcRun r = Kc(dir, "plan " + model + " --calibrate --quick --devices 1 --batch 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json doc = Json::parse(r.out);
  EXPECT_EQ(doc["devices"], 1);
  EXPECT_EQ(doc["points"].size(), 4u);  // micro-batch 1, 2, 4, 8
  EXPECT_GT(doc["matmul_efficiency"].get<double>(), 0);
  EXPECT_GT(doc["optimizer_step_bytes"].get<double>(), 0);
  // Every plan kc train runs for a batch of 4 on one device: micro-batch 1, 2 or 4, with and
  // without recompute.
  ASSERT_EQ(doc["predictions"].size(), 6u);
  for (const Json& p : doc["predictions"]) {
    EXPECT_EQ(p["plan"]["t"], 1);
    EXPECT_EQ(p["plan"]["p"], 1);
    EXPECT_GT(p["estimate"]["step_time_s"].get<double>(), 0);
  }
  const std::string saved = doc["written"].get<std::string>();
  EXPECT_TRUE(std::filesystem::exists(saved));

  // The local cluster is now the calibration.
  KcRun local = Kc(dir, "plan " + model + " --devices 1 --batch 4");
  ASSERT_EQ(local.exit_code, 0) << local.err;
  EXPECT_THAT(local.out, HasSubstr("[calibration "));
  // Calibrated with this model: no note that another model's efficiencies stand in.
  EXPECT_THAT(local.out, ::testing::Not(HasSubstr("stand in for")));
  KcRun tp = Kc(dir, "plan " + model + " --devices 1 --fixed-t 2");
  EXPECT_EQ(tp.exit_code, 2);
  EXPECT_THAT(tp.err, HasSubstr("fixed t=2: it does not divide the 1 devices"));

  // kc train --plan auto picks from the same search and records the choice.
  TempDir data("kc_plan_cli_data");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  data.Write("text/a.txt", text);
  KcRun prep = Kc(dir, "data prepare --out " + data.Path("data") + " " + data.Path("text"));
  ASSERT_EQ(prep.exit_code, 0) << prep.err;
  KcRun train =
      Kc(dir, "train " + model + " --plan auto --ranks 1 --steps 2 --progress none " + "--data " +
                  data.Path("data/manifest.json") + " --out " + data.Path("run"));
  ASSERT_EQ(train.exit_code, 0) << train.err;
  EXPECT_THAT(train.err, HasSubstr("--plan auto: t=1,p=1,d=1,"));
  EXPECT_THAT(train.out, HasSubstr("the planner predicted"));
  const std::string metrics = Read(data.Path("run/metrics.jsonl"));
  const Json run = Json::parse(metrics.substr(0, metrics.find('\n')));
  EXPECT_THAT(run["plan"].get<std::string>(), HasSubstr("t=1,p=1,d=1,"));
  EXPECT_GT(run["predicted_step_s"].get<double>(), 0);
}

// A calibration of two CPU devices with passes at t = 1 and t = 2: the search offers this
// machine's tensor-parallel and pipeline plans too, priced from the passes, and never recompute
// with ZB-H1.
TEST(PlanCliTest, RealDevicesGetEveryPlanTheEngineRunsPricedByTheirCalibration) {
  TempDir dir("kc_plan_cli");
  const std::string model = CalibModel(dir, 4);
  std::string points;
  for (int t : {1, 2}) {
    for (int b : {1, 2, 4}) {
      if (!points.empty()) points += ",";
      points += fmt::format(
          R"({{"micro_batch_size": {}, "t": {}, "size": {}, "seconds": {}, "efficiency": 0.3,
              "forward_share": 0.33, "weight_share": 0.25, "block_seconds": {}}})",
          b, t, b * 32 * 64 / t, 0.01 * b / t, 0.002 * b / t);
    }
  }
  const std::string calibration = dir.Write("cal.json", R"({"kc_calibration": 1, "host": "h",
      "model": "calib-gpt", "cpus_per_device": 1,
      "cluster": {"devices": 2, "devices_per_node": 2, "peak_flops": 1e11, "memory_bytes": 8e9,
        "memory_bandwidth": 1e10, "intra_node_bandwidth": 3e9, "intra_node_latency": 1e-6,
        "inter_node_bandwidth": 3e9, "inter_node_latency": 1e-6, "oversubscription": 1},
      "options": {"activation_bytes": 4, "param_bytes": 4, "gradient_bytes": 4,
        "optimizer_bytes": 8, "matmul_efficiency": 0.3, "efficiency_half_size": 0,
        "dp_overlap_fraction": 0, "optimizer_step_bytes": 100, "usable_memory_fraction": 0.9,
        "dp_bucket_bytes": 2097152},
      "points": [)" + points + "]}");
  KcRun r = Kc(dir, "plan " + model + " --cluster " + calibration + " --batch 8 --top 1000 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json doc = Json::parse(r.out);
  EXPECT_EQ(doc["cluster"]["devices"], 2);
  std::vector<Json> plans = {doc["chosen"]};
  for (const Json& alt : doc["alternatives"]) plans.push_back(alt);
  bool tensor = false, pipeline = false;
  for (const Json& p : plans) {
    const Json& plan = p["plan"];
    tensor = tensor || plan["t"] == 2;
    pipeline = pipeline || plan["p"] == 2;
    EXPECT_FALSE(plan["schedule"] == "zb-h1" && plan["recompute"].get<bool>() && plan["p"] == 2);
    // A measured (t, b) is priced from its pass: m micro-batches of `seconds` at p = 1.
    if (plan["p"] == 1 && !plan["recompute"].get<bool>() && plan["micro_batch_size"] <= 4) {
      const double seconds = 0.01 * plan["micro_batch_size"].get<int>() / plan["t"].get<int>();
      EXPECT_NEAR(p["estimate"]["compute_s"].get<double>(),
                  plan["micro_batches"].get<int>() * seconds, 1e-9)
          << plan.dump();
    }
  }
  EXPECT_TRUE(tensor);
  EXPECT_TRUE(pipeline);
}

// A mixed inventory is also priced stage by stage on its own devices, stages sized to them.
TEST(PlanCliTest, AMixedClusterIsPricedOnItsOwnDevicesWithStagesSizedToThem) {
  TempDir dir("kc_plan_cli");
  const std::string args = Example("examples/models/gpt2-124m.yaml") + " --cluster " +
                           Example("examples/clusters/mixed-generations.yaml") + " --batch 256";
  KcRun r = Kc(dir, "plan " + args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("mixed cluster, each stage priced on its own devices"));
  EXPECT_THAT(r.out, HasSubstr("best on the devices"));
  EXPECT_THAT(r.out, HasSubstr("on H100-SXM5-80GB"));
  KcRun j = Kc(dir, "plan " + args + " --json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const Json d = Json::parse(j.out)["on_devices"];
  const Json& best = d["best"];
  EXPECT_LE(best["sized"]["step_time_s"].get<double>(),
            d["chosen"]["balanced"]["step_time_s"].get<double>());
  int layers = 0;
  for (const Json& stage : best["sized"]["stages"]) layers += stage["layers"].get<int>();
  EXPECT_EQ(layers, 12);
  // A uniform cluster has no such section.
  KcRun uniform = Kc(dir, "plan " + Example("examples/models/gpt2-124m.yaml") + " --cluster " +
                              Example("examples/clusters/dgx-a100x4.yaml") + " --batch 256");
  ASSERT_EQ(uniform.exit_code, 0) << uniform.err;
  EXPECT_THAT(uniform.out, ::testing::Not(HasSubstr("mixed cluster")));
}

TEST(PlanCliTest, BadInputSaysWhatIsWrong) {
  TempDir dir("kc_plan_cli");
  const std::string gpt2 = Example("examples/models/gpt2-124m.yaml");
  const std::string cluster = Example("examples/clusters/dgx-a100x4.yaml");

  KcRun r = Kc(dir, "plan");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("a model file is required"));
  r = Kc(dir, "plan " + dir.Path("none.yaml") + " --cluster " + cluster);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("none.yaml"));
  r = Kc(dir, "plan " + gpt2 + " --cluster " + dir.Path("nocluster.yaml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("nocluster.yaml"));
  const std::string broken = dir.Write("broken.yaml", "name: x\nhosts: 3\n");
  r = Kc(dir, "plan " + gpt2 + " --cluster " + broken);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("broken.yaml:"));

  // A model that cannot fit at all: what would.
  const std::string small = dir.Write("small.yaml", R"(name: small
models:
  g: {kind: simulated, memory_gb: 0.5, peak_tflops_fp32: 10, peak_tflops_bf16: 100,
      memory_bandwidth_gbs: 900}
hosts:
  - {name: n0, model: g, count: 2, intra_host: {kind: nvlink, bandwidth_gbs: 100, latency_us: 2}}
)");
  r = Kc(dir, "plan " + gpt2 + " --cluster " + small + " --batch 8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("does not fit on 2 devices"));
  EXPECT_THAT(r.err, HasSubstr("would do"));

  // An impossible constraint is named: gpt2-124m has 12 heads, so t=5 splits nothing.
  r = Kc(dir, "plan " + gpt2 + " --cluster " + cluster + " --fixed-t 5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("t=5"));
  // Pipeline stages at most 1 and t fixed at 1 leave d = 32, which cannot split 7 sequences.
  r = Kc(dir, "plan " + gpt2 + " --cluster " + cluster + " --batch 7 --fixed-t 1 --max-p 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("global batch of 7"));
  EXPECT_THAT(r.err, HasSubstr("with the constraints t=1 p<=1"));
  r = Kc(dir, "plan --cases " + dir.Write("c.json", "[{\"id\": \"q\"}]"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("case 1 (q): model"));
}

}  // namespace
}  // namespace kc::parallel
