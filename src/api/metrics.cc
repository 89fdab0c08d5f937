#include "api/metrics.h"

#include <fmt/format.h>
#include <httplib.h>

#include <charconv>
#include <cmath>
#include <thread>

namespace kc::api {

void LatencyHistogram::Observe(double seconds) {
  size_t b = 0;
  while (b < kBounds.size() && seconds > kBounds[b]) ++b;
  buckets_[b].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<int64_t>(std::llround(std::max(0.0, seconds) * 1e9)),
                    std::memory_order_relaxed);
}

void LatencyHistogram::Append(std::string* out, std::string_view name,
                              std::string_view help) const {
  *out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t cumulative = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    cumulative += buckets_[b].load(std::memory_order_relaxed);
    const std::string le = b < kBounds.size() ? fmt::format("{}", kBounds[b]) : "+Inf";
    *out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, le, cumulative);
  }
  *out += fmt::format("{}_sum {}\n{}_count {}\n", name,
                      static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9, name,
                      count_.load(std::memory_order_relaxed));
}

namespace {

std::string Escape(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

void AppendMetric(std::string* out, std::string_view name, std::string_view type,
                  std::string_view help, const std::vector<MetricSample>& samples) {
  *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  for (const MetricSample& s : samples) {
    std::string labels;
    for (const auto& [k, v] : s.labels) {
      labels += fmt::format("{}{}=\"{}\"", labels.empty() ? "" : ",", k, Escape(v));
    }
    *out += fmt::format("{}{}{} {}\n", name, labels.empty() ? "" : "{",
                        labels.empty() ? "" : labels + "}", s.value);
  }
}

struct MetricsServer::Impl {
  httplib::Server server;
  std::thread thread;
  std::string host;
  int port = 0;
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                            std::function<std::string()> render) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      std::from_chars(listen.data() + colon + 1, listen.data() + listen.size(), port).ec !=
          std::errc() ||
      port < 0 || port > 65535) {
    return InvalidArgumentError(fmt::format("--metrics-listen {}: expected HOST:PORT", listen));
  }
  const std::string host = listen.substr(0, colon);
  auto impl = std::make_unique<Impl>();
  impl->host = host;
  impl->server.Get("/metrics",
                   [render = std::move(render)](const httplib::Request&, httplib::Response& res) {
                     res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
                   });
  impl->port = port == 0 ? impl->server.bind_to_any_port(host)
                         : (impl->server.bind_to_port(host, port) ? port : -1);
  if (impl->port <= 0) {
    return UnavailableError(fmt::format("--metrics-listen {}: cannot listen there", listen));
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->server.listen_after_bind(); });
  // Serving before it is handed out: a stop before the loop began would not end it.
  while (!impl->server.is_running() && impl->thread.joinable()) std::this_thread::yield();
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int MetricsServer::port() const { return impl_->port; }

std::string MetricsServer::url() const {
  return fmt::format("http://{}:{}/metrics", impl_->host, impl_->port);
}

}  // namespace kc::api
