// kcd's Prometheus metrics, scraped over HTTP as Prometheus does: jobs by phase, the
// dispatcher's queue and passes, the permission checks' latency; and the text format's rules.
#include "api/metrics.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <sstream>
#include <string>

#include "api/control_plane.h"
#include "kc/v1/jobs.grpc.pb.h"
#include "kc/v1/permission.grpc.pb.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, AHistogramsBucketsAreCumulativeWithSumAndCount) {
  LatencyHistogram h;
  h.Observe(0.0002);
  h.Observe(0.003);
  h.Observe(20);
  std::string out;
  h.Append(&out, "x_seconds", "what x takes");
  EXPECT_THAT(out, HasSubstr("# TYPE x_seconds histogram\n"));
  EXPECT_THAT(out, HasSubstr("x_seconds_bucket{le=\"0.0001\"} 0\n"));
  EXPECT_THAT(out, HasSubstr("x_seconds_bucket{le=\"0.0005\"} 1\n"));
  EXPECT_THAT(out, HasSubstr("x_seconds_bucket{le=\"0.005\"} 2\n"));
  EXPECT_THAT(out, HasSubstr("x_seconds_bucket{le=\"10\"} 2\n"));
  EXPECT_THAT(out, HasSubstr("x_seconds_bucket{le=\"+Inf\"} 3\n"));
  EXPECT_THAT(out, HasSubstr("x_seconds_sum 20.0032\n"));
  EXPECT_THAT(out, HasSubstr("x_seconds_count 3\n"));
}

TEST(MetricsTest, LabelValuesAreEscaped) {
  std::string out;
  AppendMetric(&out, "kc_job_step", "gauge", "steps",
               {{.labels = {{"name", "a \"b\"\\c\nd"}, {"job", "7"}}, .value = 12}});
  EXPECT_THAT(out, HasSubstr("kc_job_step{name=\"a \\\"b\\\"\\\\c\\nd\",job=\"7\"} 12\n"));
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  std::string t = s.str();
  t.erase(t.find_last_not_of('\n') + 1);
  return t;
}

// The value of the sample line that starts with `series` ("kc_jobs{phase=\"pending\"}"); -1
// when there is none.
double Sample(const std::string& page, const std::string& series) {
  std::istringstream lines(page);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

TEST(MetricsTest, KcdServesItsMetricsOverHttp) {
  kc::testing::TempDir dir("kc_metrics");
  ASSERT_TRUE(InitCluster({.dir = dir.path(), .admin = "root"}).ok());
  const std::string token = Read(dir.Path("admin.token"));
  Result<std::unique_ptr<Kcd>> kcd = Kcd::Start({.dir = dir.path(),
                                                 .listen = "127.0.0.1:0",
                                                 .insecure_loopback = true,
                                                 .metrics_listen = "127.0.0.1:0"});
  ASSERT_TRUE(kcd.ok()) << kcd.status().message();
  ASSERT_GT((*kcd)->metrics_port(), 0);
  auto channel = grpc::CreateChannel(fmt::format("127.0.0.1:{}", (*kcd)->port()),
                                     grpc::InsecureChannelCredentials());
  {  // Two permission checks and a submission.
    for (int i = 0; i < 2; ++i) {
      grpc::ClientContext ctx;
      ctx.AddMetadata("authorization", "Bearer " + token);
      kc::v1::PermissionCheckRequest req;
      req.set_action("topology.write");
      req.mutable_resource()->set_kind("topology");
      kc::v1::PermissionCheckResponse resp;
      ASSERT_TRUE(kc::v1::PermissionService::NewStub(channel)->Check(&ctx, req, &resp).ok());
    }
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    kc::v1::SubmitJobRequest req;
    req.set_name("first");
    req.set_devices(2);
    kc::v1::JobInfo job;
    ASSERT_TRUE(kc::v1::JobService::NewStub(channel)->Submit(&ctx, req, &job).ok());
  }
  httplib::Client http("127.0.0.1", (*kcd)->metrics_port());
  httplib::Result page = http.Get("/metrics");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(page->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
  const std::string& text = page->body;
  // The job is pending, queued or already failed (no topology: it cannot run), but it is
  // counted once, in one phase, and every phase has its line.
  double jobs = 0;
  for (const char* phase : {"pending", "approval_required", "queued", "running", "paused",
                            "succeeded", "failed", "cancelled"}) {
    const double n = Sample(text, fmt::format("kc_jobs{{phase=\"{}\"}}", phase));
    ASSERT_GE(n, 0) << phase << "\n" << text;
    jobs += n;
  }
  EXPECT_EQ(jobs, 1) << text;
  EXPECT_EQ(Sample(text, "kc_permission_check_seconds_count"), 2) << text;
  EXPECT_GT(Sample(text, "kc_permission_check_seconds_sum"), 0) << text;
  EXPECT_GE(Sample(text, "kc_scheduler_queue_depth"), 0) << text;
  EXPECT_EQ(Sample(text, "kc_agents_registered"), 0) << text;
  EXPECT_GE(Sample(text, "kc_scheduler_pass_seconds_count"), 1) << text;
  EXPECT_THAT(text, HasSubstr("# TYPE kc_job_step gauge\n"));
  EXPECT_EQ(http.Get("/other")->status, 404);
  (*kcd)->Shutdown();
}

TEST(MetricsTest, ABadMetricsAddressIsRefusedNamingTheFlag) {
  Result<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("nonsense", [] { return ""; });
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("--metrics-listen nonsense: expected HOST:PORT"));
}

}  // namespace
}  // namespace kc::api
