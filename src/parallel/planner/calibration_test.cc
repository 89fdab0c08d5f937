#include "parallel/planner/calibration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace kc::parallel::planner {
namespace {

using ::testing::HasSubstr;

std::vector<EfficiencyPoint> Curve(double e, double h) {
  std::vector<EfficiencyPoint> points;
  for (double size : {1000.0, 4000.0, 16000.0, 64000.0}) {
    points.push_back(
        {.micro_batch_size = 1, .size = size, .seconds = 1, .efficiency = e * size / (size + h)});
  }
  return points;
}

TEST(FitEfficiencyTest, RecoversTheCurveItWasMadeFrom) {
  const EfficiencyFit fit = FitEfficiency(Curve(0.6, 5000));
  EXPECT_NEAR(fit.matmul_efficiency, 0.6, 1e-9);
  EXPECT_NEAR(fit.efficiency_half_size, 5000, 1e-6);
}

TEST(FitEfficiencyTest, AFallingCurveGivesItsMeanAndNoHalfSize) {
  std::vector<EfficiencyPoint> points = Curve(0.5, 0);
  points[0].efficiency = 0.7;  // the smallest size the fastest: caches, not launch overhead
  const EfficiencyFit fit = FitEfficiency(points);
  EXPECT_EQ(fit.efficiency_half_size, 0);
  EXPECT_NEAR(fit.matmul_efficiency, (0.7 + 0.5 * 3) / 4, 1e-12);
}

ModelSpec TinyModel() {
  ModelSpec s;
  s.name = "calib";
  s.layers = 1;
  s.hidden = 32;
  s.heads = 2;
  s.ffn_hidden = 128;
  s.vocab = 64;
  s.seq_len = 16;
  s.batch_per_rank = 2;
  return s;
}

TEST(MeasureComputeTest, TimesEveryDeviceAtEverySize) {
  CalibrationOptions o;
  o.micro_batch_sizes = {1, 2};
  o.repetitions = 1;
  o.device_cpus = {{}, {}};  // two devices, unpinned
  o.peak_flops = 1e9;
  Result<ComputeCalibration> c = MeasureCompute(TinyModel(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->points.size(), 2u);
  for (const EfficiencyPoint& p : c->points) {
    EXPECT_GT(p.seconds, 0);
    EXPECT_GT(p.efficiency, 0);
    EXPECT_DOUBLE_EQ(p.size, static_cast<double>(p.micro_batch_size * 16 * 32));
  }
  EXPECT_GT(c->optimizer_seconds, 0);
  EXPECT_GT(c->fit.matmul_efficiency, 0);
}

TEST(MeasureComputeTest, TimesEveryTensorParallelSizeWithItsPassShares) {
  ModelSpec spec = TinyModel();
  spec.layers = 3;  // a block of its own in the middle
  CalibrationOptions o;
  o.micro_batch_sizes = {2, 1};
  o.tensor_parallel = {2};  // t = 1 is timed too: the optimizer's model
  o.repetitions = 1;
  o.device_cpus = {{}, {}};
  o.peak_flops = 1e9;
  Result<ComputeCalibration> c = MeasureCompute(spec, o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->points.size(), 4u);  // (t, b) in (2, 2), (1, 2), (2, 1), (1, 1)
  for (const EfficiencyPoint& p : c->points) {
    EXPECT_TRUE(p.t == 1 || p.t == 2);
    EXPECT_DOUBLE_EQ(p.size, static_cast<double>(p.micro_batch_size * 16 * 32) / p.t);
    EXPECT_GT(p.seconds, 0);
    EXPECT_GT(p.forward_share, 0);
    EXPECT_LT(p.forward_share, 1);
    EXPECT_GT(p.weight_share, 0);
    EXPECT_LT(p.weight_share, 1);
    EXPECT_GT(p.block_seconds, 0);
    // t = 2 is also timed with its group communicating (both devices one group).
    if (p.t == 2) {
      EXPECT_GT(p.tp_comm_seconds, 0);
    } else {
      EXPECT_EQ(p.tp_comm_seconds, 0);
    }
  }
  const std::vector<MeasuredPass> passes = PassTable(c->points);
  ASSERT_EQ(passes.size(), 4u);
  for (size_t i = 0; i < passes.size(); ++i) {
    EXPECT_DOUBLE_EQ(passes[i].tp_comm_seconds, c->points[i].tp_comm_seconds);
  }
  EXPECT_EQ(EfficiencyTable(c->points).size(), 2u);  // the curve is t = 1's
  // Not asked for, or with devices that t does not divide: not timed communicating.
  o.micro_batch_sizes = {1};
  o.tensor_parallel_comm = false;
  Result<ComputeCalibration> silent = MeasureCompute(spec, o);
  ASSERT_TRUE(silent.ok()) << silent.status();
  o.tensor_parallel_comm = true;
  o.device_cpus = {{}, {}, {}};
  Result<ComputeCalibration> three = MeasureCompute(spec, o);
  ASSERT_TRUE(three.ok()) << three.status();
  for (const auto* r : {&silent, &three}) {
    ASSERT_EQ((*r)->points.size(), 2u);
    for (const EfficiencyPoint& p : (*r)->points) EXPECT_EQ(p.tp_comm_seconds, 0) << p.t;
  }
  // A t that does not split the model is refused.
  o.tensor_parallel = {3};
  EXPECT_EQ(MeasureCompute(spec, o).status().code(), ErrorCode::kInvalidArgument);
}

TEST(MeasureLinksTest, FitsTheRingToTheEnginesAllReduce) {
  Result<LinkCalibration> links = MeasureLinks({.device_cpus = {{}, {}},
                                                .sizes_bytes = {4096, 65536},
                                                .repetitions = 2,
                                                .rounds = 3,
                                                .work_seconds = 1e-4});
  ASSERT_TRUE(links.ok()) << links.status();
  ASSERT_EQ(links->allreduce.size(), 2u);
  EXPECT_EQ(links->allreduce[0].first, 4096);
  EXPECT_GT(links->allreduce[0].second, 0);
  EXPECT_GE(links->latency, 0);
  EXPECT_GE(links->rendezvous_s, 0);
  EXPECT_GE(links->latency * 2, links->rendezvous_s);  // the ring's 2(k-1) steps cover it
  // One rank has no link to measure; a size under one float is refused.
  Result<LinkCalibration> one = MeasureLinks({.device_cpus = {{}}});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->bandwidth, 0);
  EXPECT_EQ(MeasureLinks({.device_cpus = {{}, {}}, .sizes_bytes = {2}}).status().code(),
            ErrorCode::kInvalidArgument);
}

TEST(MeasureOverlapTest, TimesTheBackwardTheAllReduceAndTheTwoTogether) {
  Result<OverlapCalibration> o = MeasureOverlap(
      TinyModel(),
      {.device_cpus = {{}, {}}, .micro_batch_size = 2, .bucket_bytes = 4096, .repetitions = 1});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_GT(o->backward_s, 0);
  EXPECT_GT(o->allreduce_s, 0);
  EXPECT_GT(o->together_s, 0);
  EXPECT_GE(o->fraction, 0);
  EXPECT_LE(o->fraction, 1);
  Result<OverlapCalibration> alone = MeasureOverlap(TinyModel(), {.device_cpus = {{}}});
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->fraction, 0);
}

TEST(MeasureComputeTest, RejectsBadOptions) {
  CalibrationOptions o;
  o.peak_flops = 1e9;
  EXPECT_EQ(MeasureCompute(TinyModel(), o).status().code(), ErrorCode::kInvalidArgument);
  o.device_cpus = {{}};
  o.micro_batch_sizes = {0};
  EXPECT_EQ(MeasureCompute(TinyModel(), o).status().code(), ErrorCode::kInvalidArgument);
  ModelSpec bad = TinyModel();
  bad.heads = 3;
  o.micro_batch_sizes = {1};
  EXPECT_EQ(MeasureCompute(bad, o).status().code(), ErrorCode::kInvalidArgument);
}

TEST(CalibrationFileTest, RoundTripsAndNamesAMissingKey) {
  Calibration c;
  c.host = "h";
  c.model = "m";
  c.cpus_per_device = 2;
  c.cluster.devices = 3;
  c.cluster.devices_per_node = 3;
  c.cluster.peak_flops = 1.5e11;
  c.cluster.memory_bytes = 8e9;
  c.cluster.memory_bandwidth = 2e10;
  c.cluster.intra_node_bandwidth = 1e10;
  c.cluster.intra_node_latency = 1e-6;
  c.cluster.inter_node_bandwidth = 1e10;
  c.cluster.inter_node_latency = 1e-6;
  c.options.matmul_efficiency = 0.61;
  c.options.efficiency_half_size = 1234;
  c.options.optimizer_step_bytes = 77;
  c.points = Curve(0.6, 100);
  c.points[1].t = 2;
  c.points[1].forward_share = 0.3;
  c.points[1].weight_share = 0.25;
  c.points[1].block_seconds = 0.1;
  c.points[1].tp_comm_seconds = 0.125;
  c.cluster.oversubscription = 2;
  const std::string text = CalibrationToJson(c);
  Result<Calibration> back = CalibrationFromJson(text, "cal.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->host, "h");
  EXPECT_EQ(back->cpus_per_device, 2);
  EXPECT_EQ(back->cluster.devices, 3);
  EXPECT_DOUBLE_EQ(back->cluster.peak_flops, 1.5e11);
  EXPECT_DOUBLE_EQ(back->options.matmul_efficiency, 0.61);
  EXPECT_DOUBLE_EQ(back->options.efficiency_half_size, 1234);
  EXPECT_DOUBLE_EQ(back->options.optimizer_step_bytes, 77);
  EXPECT_EQ(back->points.size(), 4u);
  EXPECT_DOUBLE_EQ(back->cluster.oversubscription, 2);
  EXPECT_EQ(back->cluster.device, hal::DeviceKind::kCpu);
  ASSERT_EQ(back->options.efficiency_points.size(), 3u);  // the t = 1 points drive the curve
  EXPECT_DOUBLE_EQ(back->options.efficiency_points[0].first, 1000);
  EXPECT_DOUBLE_EQ(back->options.efficiency_points[0].second, c.points[0].efficiency);
  ASSERT_EQ(back->options.measured_passes.size(), 4u);  // and every point times its plans
  EXPECT_DOUBLE_EQ(back->points[1].tp_comm_seconds, 0.125);
  EXPECT_DOUBLE_EQ(back->options.measured_passes[1].tp_comm_seconds, 0.125);
  EXPECT_EQ(back->options.measured_passes[1].t, 2);
  EXPECT_DOUBLE_EQ(back->options.measured_passes[1].forward_share, 0.3);
  EXPECT_DOUBLE_EQ(back->options.measured_passes[1].weight_share, 0.25);
  EXPECT_DOUBLE_EQ(back->options.measured_passes[1].block_seconds, 0.1);

  // A file from before the per-t points reads as t = 1 points without shares.
  std::string old = text;
  for (const char* key : {"\"t\"", "\"forward_share\"", "\"weight_share\"", "\"block_seconds\"",
                          "\"oversubscription\"", "\"tp_comm_seconds\""}) {
    for (size_t at = old.find(key); at != std::string::npos; at = old.find(key)) {
      old.replace(at, std::string(key).size(), "\"unused\"");
    }
  }
  Result<Calibration> before = CalibrationFromJson(old, "old.json");
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->points[1].t, 1);
  EXPECT_EQ(before->points[1].forward_share, 0);
  EXPECT_EQ(before->points[1].tp_comm_seconds, 0);
  EXPECT_DOUBLE_EQ(before->cluster.oversubscription, 1);

  std::string broken = text;
  broken.replace(broken.find("\"peak_flops\""), 12, "\"peak_flop\"");
  Result<Calibration> bad = CalibrationFromJson(broken, "cal.json");
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("cal.json: cluster.peak_flops"));
  EXPECT_THAT(CalibrationFromJson("{\"x\": 1}", "c.json").status().message(),
              HasSubstr("not a calibration file"));
  EXPECT_THAT(CalibrationFromJson("{", "c.json").status().message(), HasSubstr("not JSON"));
}

}  // namespace
}  // namespace kc::parallel::planner
