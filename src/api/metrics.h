// kcd's metrics in Prometheus' text exposition format (version 0.0.4), served over HTTP by
// MetricsServer: GET /metrics. What is exposed: docs/operations/metrics.md.
//
//   LatencyHistogram checks;                       // one per thing timed, shared by threads
//   checks.Observe(0.0004);
//   std::string text;
//   checks.Append(&text, "kc_permission_check_seconds", "PermissionService.Check, served");
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kc::api {

// A histogram of durations with fixed buckets (0.1 ms to 10 s), safe for concurrent Observe.
class LatencyHistogram {
 public:
  static constexpr std::array<double, 10> kBounds = {0.0001, 0.0005, 0.001, 0.005, 0.01,
                                                     0.05,   0.1,    0.5,   1,     10};
  void Observe(double seconds);
  // Appends "# HELP", "# TYPE NAME histogram", the cumulative buckets, _sum and _count.
  void Append(std::string* out, std::string_view name, std::string_view help) const;

 private:
  std::array<std::atomic<int64_t>, kBounds.size() + 1> buckets_{};  // the last: +Inf
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> sum_ns_{0};
};

// One sample of a gauge or counter, with its labels as (name, value) pairs.
struct MetricSample {
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};

// Appends a metric family: "# HELP", "# TYPE" (gauge or counter) and one line per sample, label
// values escaped as the format wants (backslash, double quote, newline).
void AppendMetric(std::string* out, std::string_view name, std::string_view type,
                  std::string_view help, const std::vector<MetricSample>& samples);

// An HTTP server for GET /metrics (anything else: 404), on a thread of its own.
class MetricsServer {
 public:
  // Listens on HOST:PORT (port 0: any free one); `render` makes the page, called on the server's
  // thread for each scrape. kInvalidArgument for an address that is not HOST:PORT,
  // kUnavailable when it cannot be bound.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                      std::function<std::string()> render);
  ~MetricsServer();  // stops serving
  int port() const;
  std::string url() const;  // "http://HOST:PORT/metrics", as scrapers are given it

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kc::api
