// `kc train` as a user runs it, on a small model and corpus: data parallelism gives the losses
// of one rank, the metrics file and the plot are written, bad input stops the job before any
// worker starts, and a worker's death stops the others.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/support/daemon.h"
#include "tests/support/kc_run.h"
#include "tests/support/temp_dir.h"

namespace kc::parallel {
namespace {

namespace fs = std::filesystem;
using kc::testing::KcRun;
using kc::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

KcRun Kc(const std::string& args) { return kc::testing::RunKc(KC_BINARY, args); }

// Two layers, width 64, 32 tokens: a 20-step run takes about a second per rank.
constexpr char kModel[] = R"(name: test-gpt
layers: 2
hidden: 64
heads: 4
vocab: 257
seq_len: 32
batch_per_rank: 4
training:
  lr: 3e-3
  warmup_steps: 5
  weight_decay: 0.1
  grad_clip: 1.0
  seed: 42
)";

// A corpus with structure to learn: sentences from a small grammar, one document per file.
class Corpus {
 public:
  Corpus() : dir_("kc_train_cli") {
    std::mt19937 gen(7);
    const std::vector<std::string> subjects = {"the cat", "a dog", "my friend", "the old man",
                                               "every child"};
    const std::vector<std::string> verbs = {"sees", "likes", "finds", "carries", "remembers"};
    const std::vector<std::string> objects = {"the red ball", "a small house", "the river",
                                              "some bread", "a long song"};
    for (int f = 0; f < 40; ++f) {
      std::string text;
      for (int s = 0; s < 60; ++s) {
        text += subjects[gen() % subjects.size()] + " " + verbs[gen() % verbs.size()] + " " +
                objects[gen() % objects.size()] + ".\n";
      }
      dir_.Write("text/doc" + std::to_string(f) + ".txt", text);
    }
    model_ = dir_.Write("test-gpt.yaml", kModel);
    KcRun r =
        Kc("data prepare --out " + dir_.Path("data") + " --val-fraction 0.1 " + dir_.Path("text"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  std::string manifest() const { return dir_.Path("data/manifest.json"); }
  const std::string& model() const { return model_; }
  const TempDir& dir() const { return dir_; }

 private:
  TempDir dir_;
  std::string model_;
};

// The shared corpus: prepared once per test process, removed when the process exits.
const Corpus& TheCorpus() {
  static const Corpus corpus;
  return corpus;
}

struct TrainRun {
  KcRun result;
  std::vector<nlohmann::json> records;  // the metrics file, one object per line
  std::vector<double> losses;
};

TrainRun Train(const std::string& model, const std::string& flags, const std::string& name) {
  const Corpus& c = TheCorpus();
  const std::string metrics = c.dir().Path(name + ".jsonl");
  TrainRun run;
  run.result = Kc("train " + model + " --data " + c.manifest() + " --progress none --metrics " +
                  metrics + " --plot " + c.dir().Path(name + ".svg") + " " + flags);
  std::ifstream in(metrics);
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) {
    run.records.push_back(nlohmann::json::parse(line));
    if (run.records.back()["type"] == "step") {
      // After an elastic recovery the steps since the restored state come again.
      const int64_t step = run.records.back()["step"].get<int64_t>();
      while (!steps.empty() && steps.back() >= step) {
        steps.pop_back();
        run.losses.pop_back();
      }
      steps.push_back(step);
      run.losses.push_back(run.records.back()["loss"].get<double>());
    }
  }
  return run;
}

double MaxRelativeDifference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::fabs(a[i]));
  }
  return worst;
}

TEST(KcTrainTest, DataParallelRanksGiveTheLossesOfOneRank) {
  const std::string common = "--steps 20 --global-batch 8 --eval-every 0 --threads-per-rank 1";
  TrainRun one = Train(TheCorpus().model(), common + " --ranks 1", "dp1");
  ASSERT_EQ(one.result.exit_code, 0) << one.result.err;
  ASSERT_EQ(one.losses.size(), 20u);
  for (int ranks : {2, 4}) {
    TrainRun many = Train(TheCorpus().model(), common + " --ranks " + std::to_string(ranks),
                          "dp" + std::to_string(ranks));
    ASSERT_EQ(many.result.exit_code, 0) << many.result.err;
    ASSERT_EQ(many.losses.size(), 20u);
    EXPECT_LT(MaxRelativeDifference(one.losses, many.losses), 1e-5) << ranks << " ranks";
  }
  // The model learns: the grammar is far more predictable than 257 equally likely bytes.
  EXPECT_GT(one.losses.front(), 5.0);
  EXPECT_LT(one.losses.back(), 3.5);
}

// Data-parallel plans with micro-batches and ZeRO-1 train the same global batch: the same
// losses as one rank taking all of it in one pass.
TEST(KcTrainTest, PlansWithMicroBatchesAndZeroGiveTheLossesOfOneRank) {
  const std::string common = "--steps 20 --eval-every 0 --threads-per-rank 1 --plan ";
  TrainRun one = Train(TheCorpus().model(), common + "d=1,micro_batch_size=8", "plan1");
  ASSERT_EQ(one.result.exit_code, 0) << one.result.err;
  ASSERT_EQ(one.losses.size(), 20u);
  for (const char* plan : {"d=2,micro_batch_size=2,micro_batches=2",
                           "d=2,micro_batch_size=2,micro_batches=2,zero_stage=1",
                           "d=4,micro_batch_size=1,micro_batches=2,zero_stage=1",
                           "d=2,micro_batch_size=2,micro_batches=2,recompute=true"}) {
    TrainRun run = Train(TheCorpus().model(), common + plan, "plan");
    ASSERT_EQ(run.result.exit_code, 0) << plan << "\n" << run.result.err;
    ASSERT_EQ(run.losses.size(), 20u) << plan;
    EXPECT_LT(MaxRelativeDifference(one.losses, run.losses), 1e-5) << plan;
    EXPECT_EQ(run.records.front()["global_batch"], 8) << plan;
  }
}

// Pipeline plans (GPipe and 1F1B, with and without data parallelism, a layer count the stages
// do not divide) train the same global batch to the same losses as one rank.
TEST(KcTrainTest, PipelinePlansGiveTheLossesOfOneRank) {
  std::string five = kModel;
  five.replace(five.find("layers: 2"), 9, "layers: 5");
  const std::string model = TheCorpus().dir().Write("test-gpt-5.yaml", five);
  const std::string common = "--steps 20 --eval-every 10 --threads-per-rank 1 --plan ";
  TrainRun one = Train(model, common + "d=1,micro_batch_size=8", "pp1");
  ASSERT_EQ(one.result.exit_code, 0) << one.result.err;
  ASSERT_EQ(one.losses.size(), 20u);
  std::map<std::string, std::vector<int64_t>> activations;  // per stage, by plan
  // "p=2": 8 micro-batches of 1, the batch left to follow batch_per_rank (4) per rank.
  for (const char* plan : {"p=2", "p=2,micro_batch_size=2,micro_batches=4",
                           "p=2,micro_batch_size=2,micro_batches=4,schedule=gpipe",
                           "p=2,d=2,micro_batch_size=2,micro_batches=2,zero_stage=1",
                           "p=3,micro_batch_size=2,micro_batches=4",
                           "p=2,micro_batch_size=2,micro_batches=4,schedule=zb-h1",
                           "p=2,micro_batch_size=2,micro_batches=4,recompute=true",
                           "p=3,micro_batch_size=2,micro_batches=4,schedule=zb-h1"}) {
    TrainRun run = Train(model, common + plan, "pp");
    ASSERT_EQ(run.result.exit_code, 0) << plan << "\n" << run.result.err;
    ASSERT_EQ(run.losses.size(), 20u) << plan;
    EXPECT_LT(MaxRelativeDifference(one.losses, run.losses), 1e-5) << plan;
    EXPECT_EQ(run.records.front()["global_batch"], 8) << plan;
    for (const auto& r : run.records) {
      if (r["type"] == "start") {
        activations[plan] = r["stage_activation_bytes"].get<std::vector<int64_t>>();
      }
      // Every step reports each stage's bubble, a fraction of the pipeline's time.
      if (r["type"] == "step") {
        const size_t stages = std::string(plan).starts_with("p=3") ? 3 : 2;
        ASSERT_EQ(r["stage_bubble"].size(), stages) << plan;
        for (const auto& b : r["stage_bubble"]) {
          EXPECT_GE(b.get<double>(), 0.0) << plan;
          EXPECT_LT(b.get<double>(), 1.0) << plan;
        }
      }
      if (r["type"] == "summary") EXPECT_GT(r["bubble_ideal"].get<double>(), 0) << plan;
    }
    EXPECT_THAT(run.result.out, HasSubstr("pipeline bubble")) << plan;
    // Validation passes through the stages too.
    std::vector<double> val_one, val_run;
    for (const auto& r : one.records) {
      if (r["type"] == "val") val_one.push_back(r["loss"].get<double>());
    }
    for (const auto& r : run.records) {
      if (r["type"] == "val") val_run.push_back(r["loss"].get<double>());
    }
    ASSERT_EQ(val_run.size(), val_one.size()) << plan;
    EXPECT_LT(MaxRelativeDifference(val_one, val_run), 1e-5) << plan;
  }
  // Interleaved, v = 2 chunks per stage over 4 layers, with and without data parallelism.
  std::string four = kModel;
  four.replace(four.find("layers: 2"), 9, "layers: 4");
  const std::string model4 = TheCorpus().dir().Write("test-gpt-4.yaml", four);
  TrainRun one4 = Train(model4, common + "d=1,micro_batch_size=8", "pp4");
  ASSERT_EQ(one4.result.exit_code, 0) << one4.result.err;
  for (const char* plan : {"p=2,micro_batch_size=2,micro_batches=4,schedule=interleaved,v=2",
                           "p=2,d=2,micro_batch_size=2,micro_batches=2,schedule=interleaved,v=2,"
                           "zero_stage=1"}) {
    TrainRun run = Train(model4, common + plan, "pp");
    ASSERT_EQ(run.result.exit_code, 0) << plan << "\n" << run.result.err;
    ASSERT_EQ(run.losses.size(), 20u) << plan;
    EXPECT_LT(MaxRelativeDifference(one4.losses, run.losses), 1e-5) << plan;
    EXPECT_THAT(run.result.out, HasSubstr("(p-1)/(vm+p-1)")) << plan;
  }
  // 1F1B keeps p - s micro-batches of activations on stage s (2, then 1), GPipe all m = 4 on
  // every stage: measured as the stages' activation memory.
  const std::vector<int64_t>& f1b = activations["p=2,micro_batch_size=2,micro_batches=4"];
  const std::vector<int64_t>& gpipe =
      activations["p=2,micro_batch_size=2,micro_batches=4,schedule=gpipe"];
  ASSERT_EQ(f1b.size(), 2u);
  ASSERT_EQ(gpipe.size(), 2u);
  EXPECT_GT(f1b[0], 0);
  EXPECT_EQ(gpipe[0], 2 * f1b[0]);  // 4 slots against 2, each the same size
  EXPECT_EQ(gpipe[1], 4 * f1b[1]);  // 4 slots against 1
}

// Tensor-parallel plans, alone and with data parallelism, ZeRO-1, micro-batches, recompute and
// pipelines (1F1B and ZB-H1), train the same global batch to the same losses as one rank. The
// vocabulary (257) divides by neither 2 nor 4: the shards are padded.
TEST(KcTrainTest, TensorParallelPlansGiveTheLossesOfOneRank) {
  const std::string common = "--steps 20 --eval-every 10 --threads-per-rank 1 --plan ";
  TrainRun one = Train(TheCorpus().model(), common + "d=1,micro_batch_size=8", "tp1");
  ASSERT_EQ(one.result.exit_code, 0) << one.result.err;
  ASSERT_EQ(one.losses.size(), 20u);
  auto val_losses = [](const TrainRun& run) {
    std::vector<double> v;
    for (const auto& r : run.records) {
      if (r["type"] == "val") v.push_back(r["loss"].get<double>());
    }
    return v;
  };
  // "t=2": the batch keys left out follow the global batch, batch_per_rank (4) per rank.
  for (const char* plan :
       {"t=2", "t=2,micro_batch_size=8", "t=4,micro_batch_size=4,micro_batches=2",
        "t=2,d=2,micro_batch_size=2,micro_batches=2,zero_stage=1",
        "t=2,micro_batch_size=4,micro_batches=2,recompute=true",
        "t=2,p=2,micro_batch_size=2,micro_batches=4",
        "t=2,p=2,micro_batch_size=2,micro_batches=4,schedule=zb-h1"}) {
    TrainRun run = Train(TheCorpus().model(), common + plan, "tp");
    ASSERT_EQ(run.result.exit_code, 0) << plan << "\n" << run.result.err;
    ASSERT_EQ(run.losses.size(), 20u) << plan;
    EXPECT_LT(MaxRelativeDifference(one.losses, run.losses), 1e-5) << plan;
    EXPECT_LT(MaxRelativeDifference(val_losses(one), val_losses(run)), 1e-5) << plan;
    EXPECT_EQ(run.records.front()["global_batch"], 8) << plan;
    // The all-reduces inside the passes are timed and reported.
    double tp_ms = 0;
    for (const auto& r : run.records) {
      if (r["type"] == "step") tp_ms += r["tp_comm_ms"].get<double>();
    }
    EXPECT_GT(tp_ms, 0) << plan;
    EXPECT_THAT(run.result.out, HasSubstr("tensor parallel t=")) << plan;
  }
}

// A global batch that does not divide by the ranks is split unevenly (8 over 3: 3, 3, 2), each
// rank's gradient weighted by its tokens: the losses are those of one rank.
TEST(KcTrainTest, UnevenSharesOfTheGlobalBatchGiveTheLossesOfOneRank) {
  const std::string common = "--steps 12 --global-batch 8 --eval-every 0 --threads-per-rank 1";
  TrainRun one = Train(TheCorpus().model(), common + " --ranks 1", "uneven1");
  ASSERT_EQ(one.result.exit_code, 0) << one.result.err;
  TrainRun three = Train(TheCorpus().model(), common + " --ranks 3", "uneven3");
  ASSERT_EQ(three.result.exit_code, 0) << three.result.err;
  ASSERT_EQ(three.losses.size(), 12u);
  EXPECT_LE(MaxRelativeDifference(one.losses, three.losses), 1e-5);
  EXPECT_THAT(three.result.out, HasSubstr("global batch 8 x 32"));
}

TEST(KcTrainTest, PerTensorSyncGivesTheSameLossesAsBuckets) {
  const std::string common = "--steps 8 --ranks 2 --eval-every 0 --threads-per-rank 1";
  TrainRun buckets = Train(TheCorpus().model(), common + " --bucket-mb 0.05", "buckets");
  TrainRun per_tensor =
      Train(TheCorpus().model(), common + " --grad-sync per-tensor", "per_tensor");
  ASSERT_EQ(buckets.result.exit_code, 0) << buckets.result.err;
  ASSERT_EQ(per_tensor.result.exit_code, 0) << per_tensor.result.err;
  ASSERT_EQ(buckets.losses.size(), 8u);
  EXPECT_LT(MaxRelativeDifference(buckets.losses, per_tensor.losses), 1e-5);
  // Small buckets: several of them.
  for (const nlohmann::json& r : buckets.records) {
    if (r["type"] == "start") EXPECT_GT(r["grad_buckets"].get<int>(), 2) << r.dump();
  }
}

// --grad-wire bf16: the gradients' all-reduces send bf16 (over TCP here, where the ring runs):
// the losses follow the fp32 wire's closely but not to the bit, and the run record says so.
TEST(KcTrainTest, TheBf16GradientWireFollowsTheFp32LossesClosely) {
  const std::string common =
      "--steps 8 --ranks 2 --eval-every 0 --threads-per-rank 1 --transport tcp";
  TrainRun fp32 = Train(TheCorpus().model(), common, "wire_fp32");
  TrainRun bf16 = Train(TheCorpus().model(), common + " --grad-wire bf16", "wire_bf16");
  ASSERT_EQ(fp32.result.exit_code, 0) << fp32.result.err;
  ASSERT_EQ(bf16.result.exit_code, 0) << bf16.result.err;
  ASSERT_EQ(bf16.losses.size(), 8u);
  EXPECT_EQ(bf16.losses[0], fp32.losses[0]);  // before any update
  EXPECT_NE(bf16.losses, fp32.losses);
  EXPECT_LT(MaxRelativeDifference(bf16.losses, fp32.losses), 1e-2);
  EXPECT_EQ(bf16.records.front()["grad_wire"], "bf16");
  KcRun bad = Kc("train " + TheCorpus().model() + " --data " + TheCorpus().manifest() +
                 " --grad-wire fp16");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--grad-wire fp16: expected fp32 or bf16"));
}

TEST(KcTrainTest, WritesMetricsPlotAndSummary) {
  TrainRun run = Train(TheCorpus().model(), "--steps 6 --ranks 2 --eval-every 3", "report");
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  std::vector<std::string> types;
  for (const nlohmann::json& r : run.records) types.push_back(r["type"]);
  EXPECT_EQ(types, (std::vector<std::string>{"run", "start", "step", "step", "step", "val", "step",
                                             "step", "step", "val", "summary"}));
  const nlohmann::json& summary = run.records.back();
  EXPECT_EQ(summary["ranks"], 2);
  EXPECT_EQ(summary["steps"], 6);
  EXPECT_GT(summary["tokens_per_s"].get<double>(), 0);
  const double util = summary["device_utilisation"].get<double>();
  const double comm = summary["exposed_comm_share"].get<double>();
  EXPECT_GT(util, 0);
  EXPECT_LE(util, 1.0 + 1e-9);
  EXPECT_NEAR(util + comm, 1.0, 1e-6);   // compute and exposed communication make up the step
  EXPECT_EQ(run.records[5]["step"], 3);  // validation after step 3
  for (const char* key : {"loss", "lr", "grad_norm", "step_ms", "compute_ms", "comm_exposed_ms",
                          "tokens", "tokens_per_s"}) {
    EXPECT_TRUE(run.records[2].contains(key)) << key;
  }
  EXPECT_EQ(run.records[2]["tokens"], 2 * 4 * 32);  // two ranks' batches of 4 x 32
  // The summary on stdout names the seed's metrics.
  EXPECT_THAT(run.result.out, HasSubstr("device util"));
  EXPECT_THAT(run.result.out, HasSubstr("exposed comm"));
  EXPECT_THAT(run.result.out, HasSubstr("tokens/s"));
  std::ifstream svg(TheCorpus().dir().Path("report.svg"));
  const std::string plot((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_THAT(plot, HasSubstr("<svg"));
  EXPECT_THAT(plot, HasSubstr("<polyline"));
  EXPECT_THAT(plot, HasSubstr("</svg>"));
}

// More threads than cores: a warning, and MFU against the cores there are, not one per thread.
TEST(KcTrainTest, OversubscribedCoresAreSaidAndMfuCountsTheCoresThereAre) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int cores = CPU_COUNT(&set);
  TrainRun run = Train(TheCorpus().model(), "--steps 2 --threads-per-rank 256", "oversubscribed");
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  EXPECT_THAT(run.result.err, HasSubstr("1 ranks x 256 threads oversubscribe the"));
  EXPECT_THAT(run.result.out, Not(HasSubstr("of 256 cores")));
  if (cores > 0 && cores < 256) {
    EXPECT_THAT(run.result.out, HasSubstr("of " + std::to_string(cores) + " core"));
  }
}

TEST(KcTrainTest, TraceHoldsEveryRanksSpansInOneFile) {
  const std::string trace = TheCorpus().dir().Path("traces/run.json");
  TrainRun run =
      Train(TheCorpus().model(), "--steps 3 --ranks 2 --eval-every 0 --trace " + trace, "trace");
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  std::ifstream in(trace);
  const nlohmann::json json = nlohmann::json::parse(in);
  std::map<std::pair<int, std::string>, int> count;
  for (const nlohmann::json& e : json["traceEvents"]) {
    if (e["ph"] == "X") ++count[{e["pid"].get<int>(), e["name"].get<std::string>()}];
  }
  for (int rank : {0, 1}) {
    for (const char* name : {"data", "forward", "backward", "wait for gradient buckets",
                             "all-reduce loss", "optimizer"}) {
      EXPECT_EQ((count[{rank, name}]), 3) << "rank " << rank << " " << name;
    }
  }
  // The ranks' parts are joined and gone.
  EXPECT_FALSE(fs::exists(trace + ".rank0.part"));
  EXPECT_FALSE(fs::exists(trace + ".rank1.part"));
}

TEST(KcTrainTest, ExportWritesModelParametersAndBatches) {
  const std::string dir = TheCorpus().dir().Path("export");
  TrainRun run =
      Train(TheCorpus().model(), "--steps 3 --ranks 2 --eval-every 0 --export " + dir, "export");
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  std::ifstream in(dir + "/model.json");
  const nlohmann::json model = nlohmann::json::parse(in);
  EXPECT_EQ(model["batch"], 8);  // the global batch
  EXPECT_EQ(model["steps"], 3);
  const int64_t params =
      257 * 64 + 32 * 64 + 2 * (4 * 64 * 64 + 2 * 64 * 256 + 9 * 64 + 256) + 2 * 64;
  EXPECT_EQ(fs::file_size(dir + "/params.bin"), static_cast<uintmax_t>(params * 4));
  EXPECT_EQ(fs::file_size(dir + "/batches.bin"), static_cast<uintmax_t>(3 * 2 * 8 * 32 * 4));
}

// Bad input: a clear message, exit 2, and no worker started (no metrics file written).
class KcTrainBadInputTest : public ::testing::Test {
 protected:
  KcRun Expect2(const std::string& model, const std::string& flags) {
    const std::string metrics = TheCorpus().dir().Path("bad.jsonl");
    fs::remove(metrics);
    KcRun r = Kc("train " + model + " --progress none --metrics " + metrics + " " + flags);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_FALSE(fs::exists(metrics)) << "a rejected run wrote metrics";
    EXPECT_THAT(r.err, Not(HasSubstr("[rank")));
    return r;
  }
  std::string Model(const std::string& name, const std::string& text) {
    return TheCorpus().dir().Write(name, text);
  }
  std::string data() { return " --data " + TheCorpus().manifest(); }
};

TEST_F(KcTrainBadInputTest, UnknownModelKeyNamesFileAndLine) {
  const std::string m = Model("typo.yaml", std::string(kModel) + "hiden: 64\n");
  KcRun r = Expect2(m, data());
  EXPECT_THAT(r.err, HasSubstr("typo.yaml:14"));
  EXPECT_THAT(r.err, HasSubstr("hiden"));
}

TEST_F(KcTrainBadInputTest, HostsFlagsNameWhatIsWrong) {
  const std::string ranks = data() + " --ranks 4";
  for (const auto& [flags, want] : std::vector<std::pair<std::string, std::string>>{
           {" --hosts h1 --listen 127.0.0.1", "--hosts: \"h1\" is not HOST:RANKS"},
           {" --hosts h1:2,h2:x --listen 127.0.0.1", "--hosts: \"h2:x\" is not HOST:RANKS"},
           {" --hosts h1:2,h1:2 --listen 127.0.0.1", "--hosts: host h1 is given twice"},
           {" --hosts h1:2,h2:1 --listen 127.0.0.1", "--hosts: 3 rank slots for 4 ranks"},
           {" --hosts h1:2,h2:2", "--hosts needs --listen ADDR[:PORT]"},
           {" --hosts h1:2,h2:2 --listen 127.0.0.1 --host-timeout 0",
            "--host-timeout: must be above 0"},
           {" --share h1", "needs --rendezvous ADDR:PORT"},
           {" --share h1 --rendezvous nowhere", "--rendezvous: \"nowhere\" is not ADDR:PORT"}}) {
    KcRun r = Expect2(TheCorpus().model(), ranks + flags);
    EXPECT_THAT(r.err, HasSubstr(want)) << flags;
  }
}

TEST_F(KcTrainBadInputTest, HeadsNotDividingHidden) {
  std::string text = kModel;
  text.replace(text.find("heads: 4"), 8, "heads: 5");
  KcRun r = Expect2(Model("heads.yaml", text), data());
  EXPECT_THAT(r.err, HasSubstr("heads.yaml:4: heads"));
}

TEST_F(KcTrainBadInputTest, SequenceLongerThanTheData) {
  std::string text = kModel;
  text.replace(text.find("seq_len: 32"), 11, "seq_len: 900000");
  KcRun r = Expect2(Model("long.yaml", text), data());
  EXPECT_THAT(r.err, HasSubstr("seq_len"));
}

TEST_F(KcTrainBadInputTest, MissingManifestAndMissingShard) {
  KcRun r = Expect2(TheCorpus().model(), "--data " + TheCorpus().dir().Path("nowhere.json"));
  EXPECT_THAT(r.err, HasSubstr("nowhere.json"));
  // A manifest whose shard is gone.
  const std::string copy = TheCorpus().dir().Path("copy");
  fs::create_directories(copy);
  fs::copy_file(TheCorpus().manifest(), copy + "/manifest.json");
  r = Expect2(TheCorpus().model(), "--data " + copy + "/manifest.json");
  EXPECT_THAT(r.err, HasSubstr("train_00000.tok: cannot open"));
}

TEST_F(KcTrainBadInputTest, MoreRanksThanTheBatchSplitsInto) {
  KcRun r = Expect2(TheCorpus().model(), data() + " --ranks 4 --global-batch 2");
  EXPECT_THAT(r.err, HasSubstr("--global-batch 2 cannot be split over 4 ranks"));
  r = Expect2(TheCorpus().model(), data() + " --ranks 3 --global-batch 2");
  EXPECT_THAT(r.err, HasSubstr("each needs at least one sequence"));
}

TEST_F(KcTrainBadInputTest, PlansThatCannotRunSayWhy) {
  KcRun r = Expect2(TheCorpus().model(), data() + " --ranks 2 --plan d=3");
  EXPECT_THAT(r.err, HasSubstr("t*p*d = 1*1*3 = 3, but there are 2 ranks; with t=1 p=1, d=2"));
  r = Expect2(TheCorpus().model(), data() + " --plan t=3");
  EXPECT_THAT(r.err, HasSubstr("t=3 does not divide the 4 heads of model test-gpt; t in 1, 2 or 4 "
                               "works"));
  r = Expect2(TheCorpus().model(),
              data() + " --plan t=2 --export " + TheCorpus().dir().Path("tp-export"));
  EXPECT_THAT(r.err, HasSubstr("--export with tensor parallelism (t > 1)"));
  r = Expect2(TheCorpus().model(), data() + " --plan p=3,micro_batches=4 --global-batch 4");
  EXPECT_THAT(r.err, HasSubstr("p=3"));
  r = Expect2(TheCorpus().model(), data() + " --plan p=2,micro_batches=1 --global-batch 1");
  EXPECT_THAT(r.err, HasSubstr("micro_batches"));
  r = Expect2(TheCorpus().model(), data() + " --plan d=2,micro_batches=3 --global-batch 8");
  EXPECT_THAT(r.err, HasSubstr("micro_batch_size*micro_batches*d = 1*3*2 = 6, but the global "
                               "batch is 8"));
  r = Expect2(TheCorpus().model(), data() + " --plan d=2,mcro_batches=3");
  EXPECT_THAT(r.err, HasSubstr("mcro_batches"));
}

// Checked before any GPU is looked for, so the same on machines with and without one.
TEST_F(KcTrainBadInputTest, DevicesPrecisionsAndWhatRunsOnAGpuSayWhy) {
  KcRun r = Expect2(TheCorpus().model(), data() + " --device gpu");
  EXPECT_THAT(r.err, HasSubstr("--device gpu: expected cpu or cuda"));
  r = Expect2(TheCorpus().model(), data() + " --precision fp16");
  EXPECT_THAT(r.err, HasSubstr("--precision fp16: expected fp32 or bf16"));
  r = Expect2(TheCorpus().model(), data() + " --precision bf16");
  EXPECT_THAT(r.err, HasSubstr("bf16 trains on CUDA devices only; add --device cuda"));
  r = Expect2(TheCorpus().model(), data() + " --device cuda --ranks 2 --plan t=2");
  EXPECT_THAT(r.err, HasSubstr("on GPUs the engine runs data-parallel plans only"));
  r = Expect2(TheCorpus().model(),
              data() + " --device cuda --export " + TheCorpus().dir().Path("gpu-export"));
  EXPECT_THAT(r.err, HasSubstr("--export with --device cuda"));
}

TEST_F(KcTrainBadInputTest, HeartbeatTimeoutUnderTwoPeriods) {
  KcRun r = Expect2(TheCorpus().model(),
                    data() + " --ranks 2 --heartbeat-period 1 --heartbeat-timeout 1.5");
  EXPECT_THAT(r.err, HasSubstr("--heartbeat-period/--heartbeat-timeout"));
  EXPECT_THAT(r.err, HasSubstr("at least two periods"));
}

TEST_F(KcTrainBadInputTest, VocabSmallerThanTheData) {
  std::string text = kModel;
  text.replace(text.find("vocab: 257"), 10, "vocab: 256");
  KcRun r = Expect2(Model("vocab.yaml", text), data());
  EXPECT_THAT(r.err, HasSubstr("vocab 256 is smaller than the data's vocab_size 257"));
}

TEST(KcTrainTest, AWorkerThatDiesStopsTheOthers) {
  TrainRun run =
      Train(TheCorpus().model(),
            "--steps 20 --ranks 3 --eval-every 0 --threads-per-rank 1 --inject-fault 1:3", "fault");
  EXPECT_EQ(run.result.exit_code, 1);
  EXPECT_THAT(run.result.err, HasSubstr("rank 1 failed"));
  EXPECT_THAT(run.result.err, HasSubstr("injected fault before step 3"));
  EXPECT_THAT(run.result.err, HasSubstr("the other ranks were stopped"));
  // Step 3 needs rank 1's gradients, so no rank gets past step 2 (rank 0 may be stopped before
  // it reports step 2).
  EXPECT_LE(run.losses.size(), 2u);
}

// A rank that is alive but silent (stopped, as a wedged or swapped-out process) is found by its
// missing heartbeats, named, and killed with the rest; nothing else would end the job before
// --timeout.
TEST(KcTrainTest, ASilentRankIsDeclaredFailedByItsHeartbeats) {
  TrainRun run = Train(TheCorpus().model(),
                       "--steps 20 --ranks 2 --eval-every 0 --threads-per-rank 1 --timeout 600 "
                       "--inject-fault 1:3:stop --heartbeat-period 0.1 --heartbeat-timeout 1",
                       "silent");
  EXPECT_EQ(run.result.exit_code, 1);
  EXPECT_THAT(run.result.err, HasSubstr("injected fault before step 3 (--inject-fault, stop)"));
  EXPECT_THAT(run.result.err, HasSubstr("rank 1 sent no heartbeat for"));
  EXPECT_THAT(run.result.err, HasSubstr("(--heartbeat-timeout 1 s): declared failed and killed"));
  EXPECT_THAT(run.result.err, Not(HasSubstr("rank 0 sent no heartbeat")));
  EXPECT_LE(run.losses.size(), 2u);
}

// ----- Checkpoints (L5).

std::vector<double> LossesFrom(const TrainRun& run, int64_t first_step) {
  std::vector<double> out;
  for (const auto& r : run.records) {
    if (r["type"] == "step" && r["step"].get<int64_t>() > first_step) {
      out.push_back(r["loss"].get<double>());
    }
  }
  return out;
}

int64_t ResumedFrom(const TrainRun& run) {
  for (const auto& r : run.records) {
    if (r["type"] == "resume") return r["step"].get<int64_t>();
  }
  return -1;
}

// Every rank killed (one dies, the launcher stops the others) and started again: the run
// resumes from its last checkpoint and continues with exactly the losses of a run that was
// never interrupted.
TEST(KcCheckpointTest, AKilledRunResumesWithTheUninterruptedLosses) {
  const std::string common = "--steps 20 --eval-every 0 --threads-per-rank 1 --ranks 2 ";
  TrainRun full = Train(TheCorpus().model(), common, "ck_full");
  ASSERT_EQ(full.result.exit_code, 0) << full.result.err;
  const std::string dir = TheCorpus().dir().Path("ck_kill");
  const std::string flags = common + "--checkpoint-dir " + dir + " --checkpoint-every 5";
  TrainRun killed = Train(TheCorpus().model(), flags + " --inject-fault 1:14", "ck_killed");
  EXPECT_EQ(killed.result.exit_code, 1);
  TrainRun resumed = Train(TheCorpus().model(), flags, "ck_resumed");
  ASSERT_EQ(resumed.result.exit_code, 0) << resumed.result.err;
  EXPECT_THAT(resumed.result.err, HasSubstr("resuming from"));
  // Checkpoints are persisted in the background: the one after step 10 normally, else 5's.
  const int64_t from = ResumedFrom(resumed);
  EXPECT_TRUE(from == 10 || from == 5) << from;
  ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(20 - from));
  EXPECT_LT(MaxRelativeDifference(LossesFrom(full, from), resumed.losses), 1e-6);
  EXPECT_THAT(resumed.result.out, HasSubstr("resumed         from step"));
  // The summary reports the checkpoints this run saved (after steps 15 and 20).
  for (const auto& r : resumed.records) {
    if (r["type"] == "summary") EXPECT_EQ(r["checkpoints"], from == 10 ? 2 : 3);
  }
}

// Started again after its last checkpoint already holds every step asked for (killed after
// it, a job requeued): nothing is left to train; it says so and succeeds, recording the step.
TEST(KcCheckpointTest, ARunWhoseCheckpointReachesItsStepsIsDone) {
  const std::string dir = TheCorpus().dir().Path("ck_done");
  const std::string flags = "--steps 4 --eval-every 0 --threads-per-rank 1 --checkpoint-dir " + dir;
  TrainRun first = Train(TheCorpus().model(), flags, "ck_done1");
  ASSERT_EQ(first.result.exit_code, 0) << first.result.err;
  TrainRun again = Train(TheCorpus().model(), flags, "ck_done2");
  ASSERT_EQ(again.result.exit_code, 0) << again.result.err;
  EXPECT_THAT(again.result.err, HasSubstr("is at step 4: the 4 steps asked for are done"));
  EXPECT_TRUE(again.losses.empty());
  ASSERT_EQ(again.records.size(), 2u);
  EXPECT_EQ(again.records[1]["type"], "done");
  EXPECT_EQ(again.records[1]["checkpoint_step"], 4);
  // An explicit --resume of it is a mistake, named as before.
  TrainRun explicit_resume =
      Train(TheCorpus().model(), flags + " --resume " + dir + "/step-00000004", "ck_done3");
  EXPECT_NE(explicit_resume.result.exit_code, 0);
}

// SIGTERM (a scheduler taking the devices back) stops every rank after the same step with a
// checkpoint of it; the same command then goes on from exactly there, with the losses of a
// run that was never stopped (the same --steps: the learning-rate schedule spans them).
TEST(KcCheckpointTest, SigtermStopsEveryRankAfterTheSameStepWithACheckpoint) {
  const std::string common = "--eval-every 0 --threads-per-rank 1 --ranks 2 ";
  TrainRun full = Train(TheCorpus().model(), common + "--steps 60", "stop_full");
  ASSERT_EQ(full.result.exit_code, 0) << full.result.err;
  const std::string dir = TheCorpus().dir().Path("stop_ckpt");
  const std::string metrics = TheCorpus().dir().Path("stop_stopped.jsonl");
  kc::testing::Daemon run(std::string(KC_BINARY) + " train " + TheCorpus().model() + " --data " +
                          TheCorpus().manifest() + " --progress none --metrics " + metrics +
                          " --checkpoint-dir " + dir + " " + common + "--steps 60");
  // Three steps done (polling the file the run writes: nothing else says so).
  const auto steps_done = [&] {
    std::ifstream in(metrics);
    int n = 0;
    for (std::string line; std::getline(in, line);)
      n += line.find("\"type\":\"step\"") != line.npos;
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (steps_done() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(run.Stop(SIGTERM), 128 + SIGTERM);
  int64_t last_step = 0, checkpoint = 0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json r = nlohmann::json::parse(line);
    if (r["type"] == "step") last_step = r["step"].get<int64_t>();
    if (r["type"] == "checkpoint") checkpoint = r["step"].get<int64_t>();
  }
  ASSERT_GE(last_step, 3);
  ASSERT_LT(last_step, 60);
  EXPECT_EQ(checkpoint, last_step);
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(last_step));
  EXPECT_TRUE(fs::exists(fs::path(dir) / name / "MANIFEST.json"));

  TrainRun resumed =
      Train(TheCorpus().model(), common + "--steps 60 --checkpoint-dir " + dir, "stop_resumed");
  ASSERT_EQ(resumed.result.exit_code, 0) << resumed.result.err;
  EXPECT_EQ(ResumedFrom(resumed), last_step);
  ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(60 - last_step));
  EXPECT_LT(MaxRelativeDifference(LossesFrom(full, last_step), resumed.losses), 1e-6);
}

// A corrupt newest checkpoint is skipped with its reason and the previous one is used; kc ckpt
// verify finds the same.
TEST(KcCheckpointTest, ACorruptNewestCheckpointFallsBackToThePreviousOne) {
  const std::string common = "--steps 20 --eval-every 0 --threads-per-rank 1 --ranks 2 ";
  TrainRun full = Train(TheCorpus().model(), common, "ck_corrupt_full");
  ASSERT_EQ(full.result.exit_code, 0) << full.result.err;
  const std::string dir = TheCorpus().dir().Path("ck_corrupt");
  const std::string flags = common + "--checkpoint-every 5 --checkpoint-dir " + dir;
  TrainRun first = Train(TheCorpus().model(), flags + " --inject-fault 0:17", "ck_corrupt1");
  EXPECT_EQ(first.result.exit_code, 1);
  int64_t newest = 0;  // 15 normally (persisted in the background: maybe 10)
  for (const auto& e : fs::directory_iterator(dir)) {
    if (fs::exists(e.path() / "MANIFEST.json")) {
      newest = std::max<int64_t>(newest, std::stoll(e.path().filename().string().substr(5)));
    }
  }
  ASSERT_GE(newest, 10);
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(newest));
  const std::string newest_dir = dir + "/" + name;
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(newest - 5));
  const std::string previous_dir = dir + "/" + name;
  // One byte of one chunk of the newest checkpoint.
  const fs::path chunk = fs::directory_iterator(fs::path(newest_dir) / "chunks")->path();
  {
    std::fstream f(chunk, std::ios::in | std::ios::out | std::ios::binary);
    char b = 0;
    f.read(&b, 1);
    f.seekp(0);
    b = static_cast<char>(b ^ 1);
    f.write(&b, 1);
  }
  KcRun verify = Kc("ckpt verify " + dir);
  EXPECT_EQ(verify.exit_code, 1);
  EXPECT_THAT(verify.out, HasSubstr("CORRUPT  " + newest_dir));
  // The damaged chunk is named: a whole one's checksum fails, a delta no longer decodes.
  EXPECT_THAT(verify.out, HasSubstr(chunk.filename().string()));
  EXPECT_THAT(verify.out, HasSubstr("would resume from " + previous_dir));
  TrainRun second = Train(TheCorpus().model(), flags, "ck_corrupt2");
  ASSERT_EQ(second.result.exit_code, 0) << second.result.err;
  EXPECT_THAT(second.result.err, HasSubstr("skipping corrupt checkpoint " + newest_dir));
  EXPECT_THAT(second.result.err, HasSubstr("resuming from " + previous_dir));
  EXPECT_EQ(ResumedFrom(second), newest - 5);
  EXPECT_LT(MaxRelativeDifference(LossesFrom(full, newest - 5), second.losses), 1e-6);
  // The people's view: listed, inspected.
  KcRun ls = Kc("ckpt ls " + dir);
  EXPECT_EQ(ls.exit_code, 0);
  EXPECT_THAT(ls.out, HasSubstr("test-gpt"));
  KcRun inspect = Kc("ckpt inspect " + dir + "/step-00000020");
  EXPECT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_THAT(inspect.out, HasSubstr("training resumes with step 21"));
  EXPECT_THAT(inspect.out, HasSubstr("h.1.mlp.fc.weight"));
}

// A checkpoint saved with one plan loads into another: d=4 (ZeRO-1) into d=2, t=2 into t=1,
// p=2 into p=1, and one rank's into t=2 x p=2; the resumed losses are those of one rank
// trained throughout.
TEST(KcCheckpointTest, ACheckpointLoadsIntoAnotherPlan) {
  const std::string common = "--steps 20 --eval-every 0 --threads-per-rank 1 --plan ";
  TrainRun one = Train(TheCorpus().model(), common + "micro_batch_size=8", "ck_plan_one");
  ASSERT_EQ(one.result.exit_code, 0) << one.result.err;
  const std::pair<const char*, const char*> cases[] = {
      {"d=4,micro_batch_size=2,zero_stage=1", "d=2,micro_batch_size=4"},
      {"t=2,micro_batch_size=8", "micro_batch_size=8"},
      {"p=2,micro_batch_size=2,micro_batches=4", "micro_batch_size=8"},
      {"micro_batch_size=8", "t=2,p=2,micro_batch_size=2,micro_batches=4"}};
  int n = 0;
  for (const auto& [saved, loaded] : cases) {
    const std::string dir = TheCorpus().dir().Path("ck_plan" + std::to_string(n++));
    TrainRun a =
        Train(TheCorpus().model(),
              "--checkpoint-every 10 --checkpoint-dir " + dir + " " + common + saved, "ck_plan_a");
    ASSERT_EQ(a.result.exit_code, 0) << saved << "\n" << a.result.err;
    TrainRun b = Train(TheCorpus().model(), "--resume " + dir + "/step-00000010 " + common + loaded,
                       "ck_plan_b");
    ASSERT_EQ(b.result.exit_code, 0) << saved << " -> " << loaded << "\n" << b.result.err;
    EXPECT_EQ(ResumedFrom(b), 10) << saved << " -> " << loaded;
    ASSERT_EQ(b.losses.size(), 10u) << saved << " -> " << loaded;
    EXPECT_LT(MaxRelativeDifference(LossesFrom(one, 10), b.losses), 1e-5)
        << saved << " -> " << loaded;
  }
}

// --checkpoint-every auto: each interval is sqrt(2 C MTBF) from the measured cost C, every
// rank checkpoints at rank 0's steps (the manifests commit), and the next checkpoint comes
// that many steps later.
TEST(KcCheckpointTest, AutoIntervalIsYoungDalyFromTheMeasuredCost) {
  const std::string dir = TheCorpus().dir().Path("ck_auto");
  TrainRun run =
      Train(TheCorpus().model(),
            "--steps 16 --eval-every 0 --threads-per-rank 1 --ranks 2 --checkpoint-dir " + dir +
                " --checkpoint-keep 20 --checkpoint-every auto --mtbf 0.0005",  // 1.8 s
            "ck_auto");
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  std::vector<int64_t> saved;
  std::map<int64_t, int64_t> every;  // checkpoint step -> steps to the next
  for (const auto& r : run.records) {
    if (r["type"] == "checkpoint") saved.push_back(r["step"].get<int64_t>());
    if (r["type"] == "checkpoint_interval") {
      const double cost = r["cost_s"].get<double>(), interval = r["interval_s"].get<double>();
      EXPECT_GE(cost, 0);
      EXPECT_NEAR(interval, std::sqrt(2 * cost * 1.8), 1e-9 * (1 + interval));
      every[r["step"].get<int64_t>()] = r["every_steps"].get<int64_t>();
    }
  }
  ASSERT_GE(saved.size(), 2u);
  EXPECT_EQ(saved.front(), 1);  // measured early
  EXPECT_EQ(saved.back(), 16);
  for (size_t i = 0; i + 1 < saved.size(); ++i) {
    const auto it = every.find(saved[i]);
    const int64_t next = it == every.end() ? saved[i] + 1 : saved[i] + it->second;
    EXPECT_EQ(saved[i + 1], std::min<int64_t>(next, 16)) << "after step " << saved[i];
  }
  KcRun verify = Kc("ckpt verify " + dir);
  EXPECT_EQ(verify.exit_code, 0) << verify.out;
  KcRun bad = Kc("train " + TheCorpus().model() + " --data " + TheCorpus().manifest() +
                 " --steps 2 --checkpoint-every auto --checkpoint-dir " + dir);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--checkpoint-every auto: needs --mtbf HOURS"));
  // The advice file (a cluster agent's) stands for --mtbf, not beside it, and only with auto.
  for (const auto& [flags, want] : std::vector<std::pair<std::string, std::string>>{
           {" --checkpoint-every auto --mtbf 1 --advice-file a.json",
            "--mtbf and --advice-file: give one"},
           {" --checkpoint-every 2 --advice-file a.json",
            "--advice-file: only with --checkpoint-every auto"}}) {
    bad = Kc("train " + TheCorpus().model() + " --data " + TheCorpus().manifest() +
             " --steps 2 --checkpoint-dir " + dir + flags);
    EXPECT_EQ(bad.exit_code, 2) << flags;
    EXPECT_THAT(bad.err, HasSubstr(want)) << flags;
  }
}

TEST(KcCheckpointTest, ACheckpointOfAnotherModelIsRefused) {
  const std::string dir = TheCorpus().dir().Path("ck_model");
  TrainRun a =
      Train(TheCorpus().model(),
            "--steps 2 --eval-every 0 --threads-per-rank 1 --checkpoint-dir " + dir, "ck_model_a");
  ASSERT_EQ(a.result.exit_code, 0) << a.result.err;
  std::string wider = kModel;
  wider.replace(wider.find("hidden: 64"), 10, "hidden: 32");
  const std::string model = TheCorpus().dir().Write("test-gpt-32.yaml", wider);
  TrainRun b = Train(model, "--steps 4 --eval-every 0 --threads-per-rank 1 --checkpoint-dir " + dir,
                     "ck_model_b");
  EXPECT_EQ(b.result.exit_code, 1);
  EXPECT_THAT(b.result.err, HasSubstr("saved from a model with hidden 64, this one has 32"));
  EXPECT_THAT(b.result.err, HasSubstr("a checkpoint loads into the same model only"));
  TrainRun c =
      Train(TheCorpus().model(),
            "--steps 2 --eval-every 0 --threads-per-rank 1 --checkpoint-dir " + dir, "ck_model_c");
  // The refused model wrote nothing: the first model's checkpoint is whole, and done.
  EXPECT_EQ(c.result.exit_code, 0) << c.result.err;
  EXPECT_THAT(c.result.err, HasSubstr("is at step 2: the 2 steps asked for are done"));
}

}  // namespace
// ----- Elastic recovery (L5).

std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// 4 ranks, a global batch of 12: 3 survivors take 4 sequences each.
constexpr char kElasticFlags[] =
    "--steps 10 --ranks 4 --global-batch 12 --threads-per-rank 1 --eval-every 0 ";

const std::vector<double>& UninterruptedElasticLosses() {
  static const std::vector<double> losses = [] {
    TrainRun run = Train(TheCorpus().model(), kElasticFlags, "elastic_baseline");
    EXPECT_EQ(run.result.exit_code, 0) << run.result.err;
    return run.losses;
  }();
  return losses;
}

// A worker of a 4-rank run dies by kill -9 as its forward starts, inside the gradient
// all-reduce, or while a checkpoint is being persisted, or stops (found by its heartbeats).
// The 3 survivors go on as generation 1 with the state of the last completed step, and the
// run completes with the losses of an uninterrupted run.
class KcElasticTest : public ::testing::TestWithParam<const char*> {};

TEST_P(KcElasticTest, TheSurvivorsGoOnWithTheUninterruptedLosses) {
  const std::string how = GetParam();
  const std::string name = "elastic_" + how;
  const std::string faults = TheCorpus().dir().Path(name + "_faults.jsonl");
  const std::string ckpt = TheCorpus().dir().Path(name + "_ckpt");
  fs::remove(faults);
  fs::remove_all(ckpt);
  std::string flags = std::string(kElasticFlags) + "--min-ranks 2 --inject-fault 2:5:" + how +
                      " --fault-log " + faults;
  if (how == "kill-in-persist") flags += " --checkpoint-dir " + ckpt + " --checkpoint-every 4";
  if (how == "stop") flags += " --heartbeat-period 0.1 --heartbeat-timeout 1";
  TrainRun run = Train(TheCorpus().model(), flags, name);
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  EXPECT_THAT(run.result.err, HasSubstr("injected fault before step 5 (--inject-fault, " + how));
  EXPECT_THAT(run.result.err, HasSubstr("worker 2 failed"));
  EXPECT_THAT(run.result.err, HasSubstr("generation 1 goes on with 3 ranks (d=3)"));
  if (how == "stop") {
    EXPECT_THAT(run.result.err, HasSubstr("sent no heartbeat"));
    // The hang report names the stopped rank: the others wait in an all-reduce it never entered.
    EXPECT_THAT(run.result.err, ::testing::ContainsRegex("hang report: allreduce #[0-9]+ of [^ ]+ "
                                                         "\\([0-9.]+ MB\\): worker 2 has not "
                                                         "entered it"));
  }

  const std::vector<double>& base = UninterruptedElasticLosses();
  ASSERT_EQ(run.losses.size(), base.size());
  EXPECT_LE(MaxRelativeDifference(run.losses, base), 1e-5);

  // The fault events: detected, then recovered from a replica at step 4 with nothing lost.
  const std::vector<nlohmann::json> events = ReadJsonLines(faults);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["event"], "detected");
  EXPECT_EQ(events[0]["worker"], 2);
  EXPECT_EQ(events[0]["generation"], 1);
  EXPECT_EQ(events[1]["event"], "recovered");
  EXPECT_EQ(events[1]["source"], "replica");
  EXPECT_EQ(events[1]["ranks"], 3);
  EXPECT_EQ(events[1]["step"], 4);
  EXPECT_EQ(events[1]["steps_lost"], 0);
  EXPECT_GT(events[1]["duration_s"].get<double>(), 0);
  EXPECT_EQ(run.records.back()["type"], "summary");
  EXPECT_EQ(run.records.back()["faults"], 1);
  EXPECT_THAT(run.result.out, HasSubstr("faults          1; generation 1 with 3 ranks"));

  if (how == "kill-in-persist") {
    // The checkpoint being persisted when the worker died was never committed; the new
    // generation's are, and verify.
    EXPECT_FALSE(fs::exists(ckpt + "/step-00000004/MANIFEST.json"));
    KcRun verify = Kc("ckpt verify " + ckpt);
    EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
    EXPECT_THAT(verify.out, HasSubstr("step-00000008  (3 ranks"));
    EXPECT_THAT(verify.out, HasSubstr("step-00000010  (3 ranks"));
  }
}

INSTANTIATE_TEST_SUITE_P(Faults, KcElasticTest,
                         ::testing::Values("kill-in-forward", "kill-in-allreduce",
                                           "kill-in-persist", "stop"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::erase(n, '-');
                           return n;
                         });

// With --max-restarts a replacement worker starts, joins the next generation when it is up
// and takes the state by broadcast: the job grows back to 4 ranks. The run is long enough
// (100 steps, about a second) for the new process to be up before the survivors finish; one that
// is not in time is stopped as the run completes, and the job does not grow.
TEST(KcElasticGrowTest, AReplacementJoinsAndTheJobGrowsBack) {
  const std::string common =
      "--steps 100 --ranks 4 --global-batch 12 --threads-per-rank 1 --eval-every 0 ";
  TrainRun base = Train(TheCorpus().model(), common, "elastic_grow_base");
  ASSERT_EQ(base.result.exit_code, 0) << base.result.err;
  const std::string faults = TheCorpus().dir().Path("elastic_grow_faults.jsonl");
  fs::remove(faults);
  TrainRun run = Train(TheCorpus().model(),
                       common +
                           "--min-ranks 2 --max-restarts 1 --inject-fault 1:3:kill "
                           "--fault-log " +
                           faults,
                       "elastic_grow");
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  EXPECT_THAT(run.result.err, HasSubstr("started replacement worker 4"));
  EXPECT_THAT(run.result.err, HasSubstr("worker 4 joined: generation"));
  EXPECT_THAT(run.result.err, HasSubstr("goes on with 4 ranks (d=4)"));
  ASSERT_EQ(run.losses.size(), base.losses.size());
  EXPECT_LE(MaxRelativeDifference(run.losses, base.losses), 1e-5);
  bool joined = false, recovered_with_4 = false;
  for (const nlohmann::json& e : ReadJsonLines(faults)) {
    joined = joined || (e["event"] == "joined" && e["worker"] == 4);
    recovered_with_4 = recovered_with_4 || (e["event"] == "recovered" && e["ranks"] == 4);
  }
  EXPECT_TRUE(joined);
  EXPECT_TRUE(recovered_with_4);
}

// Four ranks that lose one go on with all three survivors (16 sequences as 6, 5, 5), with the
// losses of a run that never failed.
TEST(KcElasticUnevenTest, FourRanksThatLoseOneGoOnWithAllThreeSurvivors) {
  const std::string common = "--steps 10 --global-batch 16 --threads-per-rank 1 --eval-every 0 ";
  TrainRun base = Train(TheCorpus().model(), common + "--ranks 1", "elastic_uneven_base");
  ASSERT_EQ(base.result.exit_code, 0) << base.result.err;
  TrainRun run =
      Train(TheCorpus().model(), common + "--ranks 4 --min-ranks 2 --inject-fault 1:4:kill",
            "elastic_uneven");
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  EXPECT_THAT(run.result.err, HasSubstr("generation 1 goes on with 3 ranks (d=3)"));
  ASSERT_EQ(run.losses.size(), base.losses.size());
  EXPECT_LE(MaxRelativeDifference(run.losses, base.losses), 1e-5);
}

// Below --min-ranks the job stops: the survivors save what they hold and exit; the same
// command resumes from that checkpoint.
TEST(KcElasticStopTest, BelowMinRanksTheJobStopsWithACheckpoint) {
  const std::string ckpt = TheCorpus().dir().Path("elastic_stop_ckpt");
  fs::remove_all(ckpt);
  // t=2, d=2: losing rank 3 leaves one whole replica of 2 ranks, below 3.
  const std::string flags =
      "--steps 8 --ranks 4 --plan t=2,d=2,micro_batch_size=4 --threads-per-rank 1 "
      "--eval-every 0 --min-ranks 3 --checkpoint-dir " +
      ckpt;
  TrainRun stopped = Train(TheCorpus().model(), flags + " --inject-fault 3:4:kill", "elastic_stop");
  EXPECT_EQ(stopped.result.exit_code, 1);
  EXPECT_THAT(stopped.result.err,
              HasSubstr("3 workers left (2 of them make whole replicas of t*p = 2 ranks), below "
                        "--min-ranks 3: the job stopped with a checkpoint"));
  // Step 3, or 2 when the loss failed the survivors' step 3 before its update.
  const bool at3 = fs::exists(ckpt + "/step-00000003/MANIFEST.json");
  EXPECT_TRUE(at3 || fs::exists(ckpt + "/step-00000002/MANIFEST.json"));
  TrainRun resumed = Train(TheCorpus().model(), flags, "elastic_stop_resumed");
  ASSERT_EQ(resumed.result.exit_code, 0) << resumed.result.err;
  EXPECT_EQ(ResumedFrom(resumed), at3 ? 3 : 2);
  EXPECT_EQ(resumed.losses.size(), at3 ? 5u : 6u);
}

// With ZeRO-1 a lost rank's part of the optimizer state is gone: the survivors load the newest
// committed checkpoint and go on from there, with the uninterrupted run's losses.
TEST(KcElasticCheckpointTest, ShardedStateComesBackFromTheCheckpoint) {
  const std::string ckpt = TheCorpus().dir().Path("elastic_zero_ckpt");
  const std::string faults = TheCorpus().dir().Path("elastic_zero_faults.jsonl");
  fs::remove_all(ckpt);
  fs::remove(faults);
  const std::string flags =
      std::string(kElasticFlags) + "--plan d=4,zero_stage=1,micro_batch_size=3";
  TrainRun base = Train(TheCorpus().model(), flags, "elastic_zero_base");
  ASSERT_EQ(base.result.exit_code, 0) << base.result.err;
  TrainRun run = Train(TheCorpus().model(),
                       flags + " --min-ranks 2 --checkpoint-dir " + ckpt +
                           " --checkpoint-every 2 --inject-fault 1:7:kill --fault-log " + faults,
                       "elastic_zero");
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  EXPECT_THAT(run.result.err, HasSubstr("generation 1 goes on with 3 ranks (d=3)"));
  ASSERT_EQ(run.losses.size(), base.losses.size());
  EXPECT_LE(MaxRelativeDifference(run.losses, base.losses), 1e-5);
  const std::vector<nlohmann::json> events = ReadJsonLines(faults);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1]["event"], "recovered");
  EXPECT_EQ(events[1]["source"], "checkpoint");
  // The newest committed checkpoint: every rank persisted step 4 before it saved step 6, but
  // the commit (the manifest, once every rank's persist is known) may lag behind under load,
  // so it is one of the three the run saved before the failure.
  const int64_t step = events[1]["step"].get<int64_t>();
  EXPECT_TRUE(step == 2 || step == 4 || step == 6) << step;
  // Steps reported when the launcher saw the death, then run again: at most 6 - step (the
  // last step's report may still be in the pipe).
  EXPECT_LE(events[1]["steps_lost"].get<int64_t>(), 6 - step);
  EXPECT_GE(events[1]["steps_lost"].get<int64_t>(), 0);
}

TEST_F(KcTrainBadInputTest, MemoryCopyEveryIsStepsOrAuto) {
  for (const std::string v : {"often", "-3", ""}) {
    KcRun r = Expect2(TheCorpus().model(), data() + " --memory-copy-every '" + v + "'");
    EXPECT_THAT(r.err, HasSubstr("--memory-copy-every " + v +
                                 ": expected a number of steps (0: no copies) or auto"));
  }
}

TEST_F(KcTrainBadInputTest, ElasticOptions) {
  KcRun r = Expect2(TheCorpus().model(), data() + " --ranks 2 --min-ranks 3");
  EXPECT_THAT(r.err, HasSubstr("--min-ranks 3: must be between 1 and --ranks (2)"));
  r = Expect2(TheCorpus().model(), data() + " --ranks 2 --max-restarts 1");
  EXPECT_THAT(r.err, HasSubstr("--max-restarts 1: replacements join an elastic job"));
  r = Expect2(TheCorpus().model(), data() + " --ranks 2 --inject-fault 1:2:kill-in-persist");
  EXPECT_THAT(r.err, HasSubstr("kill-in-persist needs --checkpoint-dir"));
  r = Expect2(TheCorpus().model(), data() + " --ranks 2 --inject-fault 1:2:explode");
  EXPECT_THAT(r.err, HasSubstr("HOW one of exit, kill, stop"));
  r = Expect2(TheCorpus().model(), data() + " --ranks 2 --min-ranks 1 --max-ranks 1");
  EXPECT_THAT(r.err, HasSubstr("--max-ranks 1: must be at least --ranks (2)"));
  r = Expect2(TheCorpus().model(), data() + " --ranks 1 --max-ranks 2");
  EXPECT_THAT(r.err, HasSubstr("--max-ranks 2: a run grows within [--min-ranks, --max-ranks]"));
  r = Expect2(TheCorpus().model(), data() + " --ranks 2 --resize-file size.json");
  EXPECT_THAT(r.err, HasSubstr("--resize-file: only for an elastic run"));
}

}  // namespace kc::parallel
