#include "parallel/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace kc::parallel {
namespace {

using ::testing::HasSubstr;

ModelSpec Model(int64_t layers = 6, int64_t heads = 6) {
  ModelSpec s;
  s.name = "m";
  s.layers = layers;
  s.hidden = 384;
  s.heads = heads;
  s.ffn_hidden = 1536;
  s.vocab = 257;
  s.seq_len = 256;
  s.batch_per_rank = 8;
  return s;
}

std::string Rejected(const ParallelPlan& plan, const ModelSpec& spec, int world,
                     int64_t global_batch) {
  Status s = ValidatePlan(plan, spec, world, global_batch);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << PlanToString(plan);
  return s.message();
}

TEST(PlanTest, FileFlagAndStringAgree) {
  Result<ParallelPlan> file = LoadPlanFromString(
      "t: 2\np: 2\nd: 1\nmicro_batch_size: 2\nmicro_batches: 8\nschedule: interleaved\nv: 3\n"
      "recompute: true\nzero_stage: 1\n",
      "plan.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->t, 2);
  EXPECT_EQ(file->schedule, Schedule::kInterleaved);
  EXPECT_EQ(file->v, 3);
  EXPECT_TRUE(file->recompute);
  EXPECT_EQ(file->zero_stage, 1);
  EXPECT_EQ(file->world(), 4);
  EXPECT_EQ(file->global_batch(), 16);
  Result<ParallelPlan> flag = ParsePlanFlag(
      "t=2,p=2,d=1,micro_batch_size=2,micro_batches=8,schedule=interleaved,v=3,recompute=true,"
      "zero_stage=1");
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(*flag, *file);
  // The one-line form reads back as printed, or with commas; so does the YAML.
  std::string line = PlanToString(*file);
  EXPECT_EQ(*ParsePlanFlag(line), *file);
  EXPECT_EQ(*ParsePlanFlag("  t=2  p=2 d=1,micro_batch_size=2 micro_batches=8 schedule=interleaved "
                           "v=3 recompute=true zero_stage=1 "),
            *file);
  std::replace(line.begin(), line.end(), ' ', ',');
  EXPECT_EQ(*ParsePlanFlag(line), *file);
  EXPECT_EQ(*LoadPlanFromString(PlanToYaml(*file), "again"), *file);
  // Defaults: one rank, 1F1B.
  EXPECT_EQ(*ParsePlanFlag("d=1"), ParallelPlan{});
}

TEST(PlanTest, BadFilesAndFlagsNameTheKey) {
  Result<ParallelPlan> r = LoadPlanFromString("t: 2\npipline: 2\n", "plan.yaml");
  EXPECT_THAT(r.status().message(), HasSubstr("plan.yaml:2: pipline"));
  r = LoadPlanFromString("t: 0\n", "plan.yaml");
  EXPECT_THAT(r.status().message(), HasSubstr("plan.yaml:1: t"));
  r = LoadPlanFromString("schedule: 2f2b\n", "plan.yaml");
  EXPECT_THAT(r.status().message(), HasSubstr("schedule"));
  r = ParsePlanFlag("t=2,p");
  EXPECT_THAT(r.status().message(), HasSubstr("--plan: \"p\" is not key=value"));
  r = ParsePlanFlag("t=2,zero_stage=7");
  EXPECT_THAT(r.status().message(), HasSubstr("--plan:1: zero_stage"));
}

TEST(PlanTest, ValidPlansPass) {
  const ModelSpec m = Model();
  for (const char* text :
       {"t=2,p=2,d=1,micro_batch_size=2,micro_batches=8", "t=1,p=3,d=1,micro_batches=16",
        "t=1,p=2,d=2,micro_batch_size=2,micro_batches=4,schedule=zb-h1",
        "t=1,p=2,d=2,micro_batch_size=1,micro_batches=8,schedule=interleaved,v=3",
        "t=6,p=1,d=1,micro_batch_size=16",
        "t=1,p=4,d=1,micro_batches=2,schedule=gpipe,"
        "micro_batch_size=8"}) {
    Result<ParallelPlan> plan = ParsePlanFlag(text);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const Status s = ValidatePlan(*plan, m, plan->world(), 16);
    EXPECT_TRUE(s.ok()) << text << ": " << s;
  }
}

TEST(PlanTest, EveryRuleSaysWhatWouldWork) {
  const ModelSpec m = Model();
  ParallelPlan plan;
  plan.t = 2;
  plan.p = 2;
  plan.micro_batches = 8;
  plan.micro_batch_size = 2;
  EXPECT_THAT(Rejected(plan, m, 8, 0),
              HasSubstr("t*p*d = 2*2*1 = 4, but there are 8 ranks; with t=2 p=2, d=2 fits 8"));
  EXPECT_THAT(Rejected(plan, m, 6, 0), HasSubstr("t*p must divide 6: it is one of 1, 2, 3 or 6"));

  ParallelPlan t4 = plan;
  t4.t = 4;
  t4.p = 1;
  EXPECT_THAT(Rejected(t4, m, 4, 0),
              HasSubstr("t=4 does not divide the 6 heads of model m; t in 1, 2, 3 or 6 works"));
  // Every t that works is listed, above the rank count too (the ranks follow the plan).
  ParallelPlan t3 = t4;
  t3.t = 3;
  EXPECT_THAT(Rejected(t3, Model(6, 4), 3, 0),
              HasSubstr("t=3 does not divide the 4 heads of model m; t in 1, 2 or 4 works"));
  ModelSpec odd_ffn = Model(6, 4);
  odd_ffn.ffn_hidden = 1538;
  EXPECT_THAT(Rejected(t4, odd_ffn, 4, 0), HasSubstr("does not divide ffn_hidden 1538"));

  ParallelPlan deep = plan;
  deep.t = 1;
  deep.p = 8;
  deep.micro_batches = 8;
  EXPECT_THAT(Rejected(deep, m, 8, 0), HasSubstr("p*v = 8*1 model chunks for the 6 layers"));

  ParallelPlan v2 = plan;
  v2.v = 2;
  EXPECT_THAT(Rejected(v2, m, 4, 0), HasSubstr("v > 1) need schedule interleaved"));
  v2.schedule = Schedule::kInterleaved;
  v2.v = 2;  // 6 layers over p=2: 3 per stage
  EXPECT_THAT(Rejected(v2, m, 4, 0),
              HasSubstr("v=2 does not divide the 3 layers per stage (6 layers over p=2); v in 3"));
  ParallelPlan v_odd_p = v2;
  v_odd_p.t = 1;
  v_odd_p.p = 4;
  v_odd_p.v = 2;
  EXPECT_THAT(Rejected(v_odd_p, Model(9, 6), 4, 0),
              HasSubstr("p=4 does not divide the 9 layers (interleaved); interleaving needs "
                        "layers divisible by p*v: p in 1, 3 or 9"));
  ParallelPlan v_m = v2;
  v_m.v = 3;
  v_m.micro_batches = 5;
  EXPECT_THAT(Rejected(v_m, m, 4, 0), HasSubstr("micro_batches=5 is not a multiple of p=2"));

  ParallelPlan few = plan;
  few.micro_batches = 1;
  EXPECT_THAT(Rejected(few, m, 4, 0),
              HasSubstr("micro_batches=1 < p=2 with schedule 1f1b; 1f1b needs at least one "
                        "micro-batch per stage: micro_batches >= 2"));
  few.schedule = Schedule::kGpipe;
  EXPECT_TRUE(ValidatePlan(few, m, 4, 0).ok());

  EXPECT_THAT(Rejected(plan, m, 4, 32),
              HasSubstr("micro_batch_size*micro_batches*d = 2*8*1 = 16, but the global batch "
                        "is 32 sequences; each of the d=1 replicas takes 32 sequences"));
}

TEST(PlanTest, Divisors) {
  EXPECT_EQ(Divisors(12), (std::vector<int64_t>{1, 2, 3, 4, 6, 12}));
  EXPECT_EQ(Divisors(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(Divisors(49), (std::vector<int64_t>{1, 7, 49}));
}

TEST(PlanTest, BatchKeysLeftOutFollowTheGlobalBatch) {
  const ParallelPlan given = *ParsePlanFlag("t=2");
  PlanKeys stated;
  ASSERT_TRUE(ParsePlanFlag("t=2", &stated).ok());
  EXPECT_FALSE(stated.micro_batch_size);
  EXPECT_FALSE(stated.micro_batches);
  // Without a pipeline: one micro-batch of each replica's share.
  ParallelPlan plan = FillBatchDefaults(given, stated, 16);
  EXPECT_EQ(plan.micro_batch_size, 16);
  EXPECT_EQ(plan.micro_batches, 1);
  ParallelPlan dp = given;
  dp.d = 4;
  plan = FillBatchDefaults(dp, stated, 16);
  EXPECT_EQ(plan.micro_batch_size, 4);
  EXPECT_EQ(plan.global_batch(), 16);

  // With p stages: the most micro-batches up to 4p that divide the share.
  ParallelPlan pipe = *ParsePlanFlag("p=2", &stated);
  plan = FillBatchDefaults(pipe, stated, 16);
  EXPECT_EQ(plan.micro_batches, 8);
  EXPECT_EQ(plan.micro_batch_size, 2);
  plan = FillBatchDefaults(pipe, stated, 12);
  EXPECT_EQ(plan.micro_batches, 6);
  ParallelPlan three = *ParsePlanFlag("p=3,schedule=interleaved,v=2", &stated);
  plan = FillBatchDefaults(three, stated, 8);  // no multiple of 3 divides 8: left for the rules
  EXPECT_EQ(plan.micro_batches, 1);
  plan = FillBatchDefaults(three, stated, 18);
  EXPECT_EQ(plan.micro_batches, 9);  // 3, 6 or 9 of 2, 3 or 2; 9 is the most up to 12
  EXPECT_EQ(plan.micro_batch_size, 2);

  // One key stated: the other follows.
  ParallelPlan m4 = *ParsePlanFlag("d=2,micro_batches=4", &stated);
  EXPECT_TRUE(stated.micro_batches);
  EXPECT_FALSE(stated.micro_batch_size);
  plan = FillBatchDefaults(m4, stated, 16);
  EXPECT_EQ(plan.micro_batch_size, 2);
  ParallelPlan b2 = *ParsePlanFlag("d=2,micro_batch_size=2", &stated);
  plan = FillBatchDefaults(b2, stated, 16);
  EXPECT_EQ(plan.micro_batches, 4);
  // What does not divide stays, and the rules say what would.
  plan = FillBatchDefaults(m4, PlanKeys{.micro_batches = true}, 10);
  EXPECT_EQ(plan.micro_batch_size, 1);
  EXPECT_THAT(Rejected(plan, Model(), 2, 10), HasSubstr("each of the d=2 replicas takes 5"));

  // Both stated: the plan as it is.
  ParallelPlan both = *ParsePlanFlag("micro_batch_size=2,micro_batches=3", &stated);
  EXPECT_EQ(FillBatchDefaults(both, stated, 16), both);
  // A file says the same.
  ASSERT_TRUE(LoadPlanFromString("t: 2\nmicro_batches: 2\n", "plan.yaml", &stated).ok());
  EXPECT_TRUE(stated.micro_batches);
  EXPECT_FALSE(stated.micro_batch_size);
}

}  // namespace
}  // namespace kc::parallel
