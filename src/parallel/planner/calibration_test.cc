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
  ASSERT_EQ(back->options.efficiency_points.size(), 4u);  // the points drive the estimate
  EXPECT_DOUBLE_EQ(back->options.efficiency_points[0].first, 1000);
  EXPECT_DOUBLE_EQ(back->options.efficiency_points[0].second, c.points[0].efficiency);

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
