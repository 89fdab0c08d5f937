#include "sched/trace_gen.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace kc::sched {
namespace {

using ::testing::HasSubstr;

std::vector<TraceJob> Generate(const SyntheticTraceOptions& options) {
  Result<std::vector<TraceJob>> jobs = GenerateSyntheticTrace(options);
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  return jobs.ok() ? std::move(jobs).value() : std::vector<TraceJob>{};
}

bool SameJob(const TraceJob& a, const TraceJob& b) {
  return a.submit_s == b.submit_s && a.job == b.job && a.team == b.team && a.user == b.user &&
         a.job_class == b.job_class && a.min_devices == b.min_devices &&
         a.max_devices == b.max_devices && a.duration_s == b.duration_s && a.kind == b.kind &&
         a.pool == b.pool && a.tp == b.tp && a.checkpoint_s == b.checkpoint_s &&
         a.faults_per_hour == b.faults_per_hour;
}

// Offered load over the trace's own span: work / (devices * (last submit - first submit)).
double RealizedLoad(const std::vector<TraceJob>& jobs, int devices) {
  double work = 0;
  for (const TraceJob& j : jobs) work += j.duration_s * j.max_devices;
  return work / (devices * (jobs.back().submit_s - jobs.front().submit_s));
}

double Share(const std::vector<TraceJob>& jobs, const std::function<bool(const TraceJob&)>& f) {
  return static_cast<double>(std::count_if(jobs.begin(), jobs.end(), f)) / jobs.size();
}

TEST(TraceGenTest, SameSeedGivesSameTrace) {
  SyntheticTraceOptions options{.jobs = 500, .seed = 42};
  std::vector<TraceJob> a = Generate(options);
  std::vector<TraceJob> b = Generate(options);
  ASSERT_EQ(a.size(), 500u);
  ASSERT_EQ(b.size(), 500u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(SameJob(a[i], b[i])) << "row " << i;
}

TEST(TraceGenTest, DifferentSeedsGiveDifferentTraces) {
  std::vector<TraceJob> a = Generate({.jobs = 500, .seed = 1});
  std::vector<TraceJob> b = Generate({.jobs = 500, .seed = 2});
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += SameJob(a[i], b[i]);
  EXPECT_LT(same, 10);
}

TEST(TraceGenTest, OfferedLoadMatchesTheOption) {
  for (double load : {0.5, 1.0, 2.5}) {
    for (double diurnal : {0.0, 0.5}) {
      std::vector<TraceJob> jobs =
          Generate({.jobs = 5000, .load = load, .seed = 7, .diurnal_amplitude = diurnal});
      EXPECT_NEAR(RealizedLoad(jobs, 256) / load, 1.0, 0.10)
          << "load=" << load << " diurnal=" << diurnal;
    }
  }
}

TEST(TraceGenTest, SizeMixFollowsPhillyBuckets) {
  std::vector<TraceJob> jobs = Generate({.jobs = 5000, .seed = 3});
  // Sizes on 8-device hosts: 1 | 2, 4 | 8 | 16, 32, 64, 128.
  EXPECT_NEAR(Share(jobs, [](const TraceJob& j) { return j.max_devices == 1; }),
              kSizeBucketShares[0], 0.03);
  EXPECT_NEAR(
      Share(jobs, [](const TraceJob& j) { return j.max_devices == 2 || j.max_devices == 4; }),
      kSizeBucketShares[1], 0.02);
  EXPECT_NEAR(Share(jobs, [](const TraceJob& j) { return j.max_devices == 8; }),
              kSizeBucketShares[2], 0.02);
  EXPECT_NEAR(Share(jobs, [](const TraceJob& j) { return j.max_devices > 8; }),
              kSizeBucketShares[3], 0.015);
}

TEST(TraceGenTest, EmptyBucketsGiveTheirShareToTheOthers) {
  // One device per host: no sub-host or one-host sizes, so 1 device or 2^k hosts.
  std::vector<TraceJob> jobs = Generate({.jobs = 5000, .devices = 64, .devices_per_host = 1});
  double single = kSizeBucketShares[0] / (kSizeBucketShares[0] + kSizeBucketShares[3]);
  EXPECT_NEAR(Share(jobs, [](const TraceJob& j) { return j.max_devices == 1; }), single, 0.03);
  // A cap of one device leaves only single-device jobs.
  jobs = Generate({.jobs = 200, .devices = 4, .max_job_fraction = 0.25});
  EXPECT_EQ(Share(jobs, [](const TraceJob& j) { return j.max_devices == 1; }), 1.0);
}

TEST(TraceGenTest, EveryJobIsValid) {
  std::vector<SyntheticTraceOptions> cases = {
      {.jobs = 3000},
      {.jobs = 3000, .devices = 64, .devices_per_host = 4, .seed = 5, .max_job_fraction = 1},
      {.jobs = 3000, .devices = 48, .devices_per_host = 6, .seed = 6},
      {.jobs = 3000, .devices = 16, .devices_per_host = 1, .seed = 8, .elastic_fraction = 1},
      {.jobs = 3000, .devices = 1000, .devices_per_host = 8, .max_job_fraction = 0.1},
  };
  for (const SyntheticTraceOptions& o : cases) {
    SCOPED_TRACE("devices=" + std::to_string(o.devices) +
                 " per_host=" + std::to_string(o.devices_per_host));
    std::vector<TraceJob> jobs = Generate(o);
    ASSERT_EQ(jobs.size(), static_cast<size_t>(o.jobs));
    EXPECT_EQ(jobs.front().submit_s, 0);
    std::set<std::string> names;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const TraceJob& j = jobs[i];
      if (i > 0) {
        EXPECT_LE(jobs[i - 1].submit_s, j.submit_s) << j.job;
      }
      EXPECT_TRUE(names.insert(j.job).second) << j.job;
      EXPECT_GE(j.min_devices, 1) << j.job;
      EXPECT_LE(j.min_devices, j.max_devices) << j.job;
      EXPECT_EQ(j.max_devices % j.min_devices, 0) << j.job;
      EXPECT_LE(j.max_devices, o.max_job_fraction * o.devices) << j.job;
      for (int n : {j.min_devices, j.max_devices}) {
        // At most one host, or whole hosts.
        EXPECT_TRUE(n <= o.devices_per_host || n % o.devices_per_host == 0) << j.job;
      }
      if (o.devices_per_host == 8 || o.devices_per_host == 4 || o.devices_per_host == 1) {
        EXPECT_EQ(j.max_devices & (j.max_devices - 1), 0) << j.job << " not a power of two";
      }
      EXPECT_GE(j.duration_s, 60) << j.job;
      EXPECT_LE(j.duration_s, 14 * 86400) << j.job;
      EXPECT_TRUE(j.job_class == "high" || j.job_class == "normal" || j.job_class == "preemptible")
          << j.job;
      EXPECT_THAT(j.user, HasSubstr(j.team + "-u")) << j.job;
      EXPECT_EQ(j.kind, "");
      EXPECT_EQ(j.pool, "");
      EXPECT_EQ(j.tp, 1);
      EXPECT_EQ(j.checkpoint_s, -1);
      EXPECT_GE(j.faults_per_hour, 0);
    }
  }
}

TEST(TraceGenTest, ClassAndElasticMixesFollowTheFractions) {
  std::vector<TraceJob> jobs =
      Generate({.jobs = 5000, .seed = 11, .high_fraction = 0.1, .preemptible_fraction = 0.4});
  EXPECT_NEAR(Share(jobs, [](const TraceJob& j) { return j.job_class == "high"; }), 0.1, 0.02);
  EXPECT_NEAR(Share(jobs, [](const TraceJob& j) { return j.job_class == "preemptible"; }), 0.4,
              0.03);
  std::vector<TraceJob> multi;
  std::copy_if(jobs.begin(), jobs.end(), std::back_inserter(multi),
               [](const TraceJob& j) { return j.max_devices > 1; });
  EXPECT_NEAR(Share(multi, [](const TraceJob& j) { return j.min_devices < j.max_devices; }), 0.30,
              0.05);
  for (const TraceJob& j : multi) {
    if (j.min_devices < j.max_devices) {
      EXPECT_TRUE(j.min_devices * 2 == j.max_devices || j.min_devices * 4 == j.max_devices)
          << j.job;
    }
  }
  EXPECT_EQ(Share(jobs, [](const TraceJob& j) { return j.max_devices == 1 && j.min_devices != 1; }),
            0.0);
}

TEST(TraceGenTest, RunTimesAreHeavyTailedLikePhilly) {
  std::vector<TraceJob> jobs = Generate({.jobs = 5000, .seed = 13});
  std::vector<double> d;
  for (const TraceJob& j : jobs) d.push_back(j.duration_s);
  std::sort(d.begin(), d.end());
  double median_min = d[d.size() / 2] / 60;
  double p90_h = d[d.size() * 9 / 10] / 3600;
  // Targets: median ~26 min, 90th percentile ~25 h (docs/design/synthetic-traces.md).
  EXPECT_GT(median_min, 15);
  EXPECT_LT(median_min, 45);
  EXPECT_GT(p90_h, 12);
  EXPECT_LT(p90_h, 50);
  // Larger jobs run longer: the median of multi-host jobs is several times the single-device one.
  std::vector<double> single, multi_host;
  for (const TraceJob& j : jobs) {
    if (j.max_devices == 1) single.push_back(j.duration_s);
    if (j.max_devices > 8) multi_host.push_back(j.duration_s);
  }
  std::sort(single.begin(), single.end());
  std::sort(multi_host.begin(), multi_host.end());
  EXPECT_GT(multi_host[multi_host.size() / 2], 3 * single[single.size() / 2]);
}

TEST(TraceGenTest, FewJobsFailRepeatedly) {
  std::vector<TraceJob> jobs = Generate({.jobs = 5000, .seed = 17});
  EXPECT_NEAR(Share(jobs, [](const TraceJob& j) { return j.faults_per_hour > 0; }), 0.02, 0.01);
  for (const TraceJob& j : jobs) {
    if (j.faults_per_hour > 0) {
      EXPECT_GE(j.faults_per_hour, 2) << j.job;
      EXPECT_LE(j.faults_per_hour, 6) << j.job;
    }
  }
}

TEST(TraceGenTest, DiurnalArrivalsPeakInTheFirstHalfOfTheDay) {
  // Rate 1 + a*sin(2*pi*t/day): more arrivals in [0 h, 12 h) than in [12 h, 24 h) of each day.
  auto ratio = [](double amplitude) {
    std::vector<TraceJob> jobs =
        Generate({.jobs = 5000, .seed = 19, .diurnal_amplitude = amplitude});
    double day = 0, night = 0;
    for (const TraceJob& j : jobs) (std::fmod(j.submit_s, 86400) < 43200 ? day : night) += 1;
    return day / night;
  };
  // Expected (1 + 2a/pi) / (1 - 2a/pi): 3.7 for a = 0.9, 1 for a = 0.
  EXPECT_GT(ratio(0.9), 2.5);
  EXPECT_NEAR(ratio(0.0), 1.0, 0.2);
}

TEST(TraceGenTest, OneJobArrivesAtZero) {
  std::vector<TraceJob> jobs = Generate({.jobs = 1});
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].submit_s, 0);
  EXPECT_EQ(jobs[0].job, "job0");
}

TEST(TraceGenTest, KnobsShapeSizesElasticityRunTimesAndBursts) {
  const SyntheticTraceOptions base = {.jobs = 4000, .devices = 128, .seed = 3};
  SyntheticTraceOptions o = base;
  o.size_mix = {0, 0, 1, 0};  // one whole host each
  o.elastic_fraction = 1;
  o.elastic_min_ratio = 0.5;
  Result<std::vector<TraceJob>> hosts = GenerateSyntheticTrace(o);
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  for (const TraceJob& j : *hosts) {
    EXPECT_EQ(j.max_devices, 8) << j.job;
    EXPECT_EQ(j.min_devices, 4) << j.job;
  }
  // The spread of ln(run time) follows duration_sigma (clipping narrows the wide one a little).
  auto spread = [](const std::vector<TraceJob>& jobs) {
    std::vector<double> v;
    for (const TraceJob& j : jobs) v.push_back(std::log(j.duration_s));
    std::sort(v.begin(), v.end());
    return v[v.size() * 84 / 100] - v[v.size() * 16 / 100];  // about 2 sigma
  };
  o = base;
  o.size_mix = {1, 0, 0, 0};
  o.duration_sigma = 0.5;
  Result<std::vector<TraceJob>> narrow = GenerateSyntheticTrace(o);
  o.duration_sigma = 2.0;
  Result<std::vector<TraceJob>> wide = GenerateSyntheticTrace(o);
  ASSERT_TRUE(narrow.ok() && wide.ok());
  EXPECT_NEAR(spread(*narrow), 1.0, 0.15);
  EXPECT_NEAR(spread(*wide), 4.0, 0.6);
  // Bursty arrivals: the squared coefficient of variation of the gaps grows with burstiness.
  auto cv2 = [](const std::vector<TraceJob>& jobs) {
    std::vector<double> gaps;
    for (size_t i = 1; i < jobs.size(); ++i)
      gaps.push_back(jobs[i].submit_s - jobs[i - 1].submit_s);
    double mean = 0, var = 0;
    for (double g : gaps) mean += g / static_cast<double>(gaps.size());
    for (double g : gaps) var += (g - mean) * (g - mean) / static_cast<double>(gaps.size());
    return var / (mean * mean);
  };
  o = base;
  o.diurnal_amplitude = 0;
  Result<std::vector<TraceJob>> poisson = GenerateSyntheticTrace(o);
  o.burstiness = 8;
  Result<std::vector<TraceJob>> bursty = GenerateSyntheticTrace(o);
  ASSERT_TRUE(poisson.ok() && bursty.ok());
  EXPECT_NEAR(cv2(*poisson), 1.0, 0.2);
  EXPECT_GT(cv2(*bursty), 5.0);
}

TEST(TraceGenTest, RejectsBadOptionsNamingTheFlag) {
  struct Case {
    std::function<void(SyntheticTraceOptions&)> set;
    std::string flag;
  };
  std::vector<Case> cases = {
      {[](auto& o) { o.jobs = 0; }, "--jobs"},
      {[](auto& o) { o.devices = -1; }, "--devices"},
      {[](auto& o) { o.devices_per_host = 0; }, "--devices-per-host"},
      {[](auto& o) { o.teams = 0; }, "--teams"},
      {[](auto& o) { o.load = 0; }, "--load"},
      {[](auto& o) { o.load = std::nan(""); }, "--load"},
      {[](auto& o) { o.load = INFINITY; }, "--load"},
      {[](auto& o) { o.high_fraction = -0.1; }, "--high-fraction"},
      {[](auto& o) { o.preemptible_fraction = 1.5; }, "--preemptible-fraction"},
      {[](auto& o) { o.elastic_fraction = std::nan(""); }, "--elastic-fraction"},
      {[](auto& o) { o.max_job_fraction = 1.01; }, "--max-job-fraction"},
      {[](auto& o) { o.high_fraction = 0.5, o.preemptible_fraction = 0.6; }, "--high-fraction"},
      {[](auto& o) { o.devices = 4, o.max_job_fraction = 0.2; }, "--max-job-fraction"},
      {[](auto& o) { o.diurnal_amplitude = 1; }, "--diurnal-amplitude"},
      {[](auto& o) { o.elastic_min_ratio = 1; }, "--elastic-min-ratio"},
      {[](auto& o) {
         o.size_mix = {0, 0, 0, 0};
       },
       "--size-mix"},
      {[](auto& o) {
         o.size_mix = {1, -1, 0, 0};
       },
       "--size-mix"},
      {[](auto& o) {
         o.size_mix = {0, 0, 0, 1}, o.devices = 8;
       },
       "--size-mix"},
      {[](auto& o) { o.duration_sigma = 0; }, "--duration-sigma"},
      {[](auto& o) { o.burstiness = 0; }, "--burstiness"},
  };
  for (const Case& c : cases) {
    SyntheticTraceOptions options;
    c.set(options);
    Result<std::vector<TraceJob>> jobs = GenerateSyntheticTrace(options);
    ASSERT_FALSE(jobs.ok()) << c.flag;
    EXPECT_EQ(jobs.status().code(), ErrorCode::kInvalidArgument) << c.flag;
    EXPECT_THAT(jobs.status().message(), HasSubstr(c.flag + ":")) << jobs.status();
  }
  Result<std::vector<TraceJob>> jobs = GenerateSyntheticTrace({.jobs = 0});
  ASSERT_FALSE(jobs.ok());
  EXPECT_EQ(jobs.status().message(), "--jobs: must be at least 1, got 0");
}

}  // namespace
}  // namespace kc::sched
