#include "apps/kc/train_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace kc::app {

TrainSummary Summarise(const std::vector<StepRecord>& steps) {
  TrainSummary s;
  s.steps = static_cast<int64_t>(steps.size());
  if (steps.empty()) return s;
  const size_t skip = steps.size() > 1 ? std::clamp<size_t>(steps.size() / 10, 1, 10) : 0;
  s.first_loss = steps.front().loss;
  const size_t tail = std::min<size_t>(10, steps.size());
  double last = 0;
  for (size_t i = steps.size() - tail; i < steps.size(); ++i) last += steps[i].loss;
  s.last_loss = last / static_cast<double>(tail);
  double time = 0, compute = 0, comm = 0, tokens = 0;
  std::vector<double> ms, comm_ms, tp_ms;
  for (size_t i = 0; i < steps.size(); ++i) {
    s.total_s += steps[i].step_s;
    if (i < skip) continue;
    time += steps[i].step_s;
    compute += steps[i].compute_s;
    comm += steps[i].comm_exposed_s;
    tokens += static_cast<double>(steps[i].tokens);
    ms.push_back(steps[i].step_s * 1e3);
    comm_ms.push_back(steps[i].comm_exposed_s * 1e3);
    tp_ms.push_back(steps[i].tp_comm_s * 1e3);
  }
  s.measured_steps = static_cast<int64_t>(ms.size());
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  s.step_ms_median = median(ms);
  s.comm_exposed_ms_median = median(comm_ms);
  s.tp_comm_ms_median = median(tp_ms);
  if (time > 0) {
    s.tokens_per_s = tokens / time;
    s.device_utilisation = compute / time;
    s.exposed_comm_share = comm / time;
  }
  s.comm_exposed_ms = comm * 1e3 / static_cast<double>(ms.size());
  const size_t stages = steps.back().stage_bubble.size();
  for (size_t st = 0; st < stages; ++st) {
    std::vector<double> b;
    for (size_t i = skip; i < steps.size(); ++i) {
      if (st < steps[i].stage_bubble.size()) b.push_back(steps[i].stage_bubble[st]);
    }
    s.stage_bubble.push_back(b.empty() ? 0 : median(b));
  }
  return s;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t total = static_cast<int64_t>(std::llround(seconds));
  const int64_t h = total / 3600, m = (total / 60) % 60, sec = total % 60;
  return h > 0 ? fmt::format("{}:{:02}:{:02}", h, m, sec) : fmt::format("{}:{:02}", m, sec);
}

namespace {
std::string Rate(double tokens_per_s) {
  if (tokens_per_s >= 1e6) return fmt::format("{:.2f}M tok/s", tokens_per_s / 1e6);
  if (tokens_per_s >= 1e4) return fmt::format("{:.1f}k tok/s", tokens_per_s / 1e3);
  return fmt::format("{:.0f} tok/s", tokens_per_s);
}
}  // namespace

std::string ProgressLine(int64_t step, int64_t total, double loss, double val, double tokens_per_s,
                         double eta_s, int width) {
  const int digits = static_cast<int>(std::to_string(total).size());
  const double frac = total > 0 ? std::clamp(static_cast<double>(step) / total, 0.0, 1.0) : 0;
  std::string tail = fmt::format(" {:3.0f}%  loss {:.3f}", frac * 100, loss);
  if (val >= 0) tail += fmt::format("  val {:.3f}", val);
  tail += fmt::format("  {}  ETA {}", Rate(tokens_per_s), FormatDuration(eta_s));
  const std::string head = fmt::format("step {:>{}}/{} ", step, digits, total);
  const int bar = std::clamp(width - static_cast<int>(head.size() + tail.size()) - 2, 0, 40);
  std::string line = head;
  if (bar >= 5) {
    const int filled = static_cast<int>(frac * bar);
    line += "[" + std::string(filled, '=') + (filled < bar ? ">" : "") +
            std::string(std::max(0, bar - filled - 1), ' ') + "]";
  }
  line += tail;
  if (static_cast<int>(line.size()) > width && width > 0) line.resize(width);
  return line;
}

std::vector<double> SmoothedLosses(const std::vector<StepRecord>& steps, double weight) {
  std::vector<double> out(steps.size(), std::nan(""));
  double ema = 0;
  int64_t seen = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!std::isfinite(steps[i].loss)) continue;
    ema = weight * ema + (1 - weight) * steps[i].loss;
    ++seen;
    out[i] = ema / (1 - std::pow(weight, static_cast<double>(seen)));
  }
  return out;
}

std::string LossCurveSvg(const std::string& title, const std::vector<StepRecord>& steps,
                         const std::vector<ValRecord>& val) {
  constexpr double kW = 720, kH = 420, kLeft = 60, kRight = 20, kTop = 40, kBottom = 50;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  double max_step = 1, lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const StepRecord& s : steps) {
    max_step = std::max(max_step, static_cast<double>(s.step));
    if (std::isfinite(s.loss)) lo = std::min(lo, s.loss), hi = std::max(hi, s.loss);
  }
  for (const ValRecord& v : val) {
    max_step = std::max(max_step, static_cast<double>(v.step));
    if (std::isfinite(v.loss)) lo = std::min(lo, v.loss), hi = std::max(hi, v.loss);
  }
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi - lo < 1e-9) hi = lo + 1;
  lo = std::max(0.0, lo - 0.05 * (hi - lo));
  hi += 0.05 * (hi - lo);
  auto x = [&](double step) { return kLeft + pw * step / max_step; };
  auto y = [&](double loss) { return kTop + ph * (1 - (loss - lo) / (hi - lo)); };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} "
      "{1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" font-size=\"15\">{3}</text>\n",
      kW, kH, kLeft, title);
  // Axes, ticks and grid.
  svg += fmt::format(
      "<g stroke=\"#333\"><line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\"/>"
      "<line x1=\"{0}\" y1=\"{3}\" x2=\"{0}\" y2=\"{1}\"/></g>\n",
      kLeft, kTop + ph, kLeft + pw, kTop);
  for (int i = 0; i <= 5; ++i) {
    const double loss = lo + (hi - lo) * i / 5;
    const double step = max_step * i / 5;
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:.2f}</text>\n"
        "<text x=\"{6:.1f}\" y=\"{7}\" text-anchor=\"middle\">{8:.0f}</text>\n",
        kLeft, y(loss), kLeft + pw, kLeft - 6, y(loss) + 4, loss, x(step), kTop + ph + 18, step);
  }
  svg += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n"
      "<text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">loss "
      "(cross-entropy, nats/token)</text>\n",
      kLeft + pw / 2, kH - 12, kTop + ph / 2, kTop + ph / 2);
  // Training loss: raw and smoothed (exponential moving average, as TensorBoard's slider).
  auto polyline = [&](const std::vector<std::pair<double, double>>& pts, const char* style) {
    std::string p = fmt::format("<polyline fill=\"none\" {} points=\"", style);
    for (const auto& [sx, sy] : pts) p += fmt::format("{:.1f},{:.1f} ", x(sx), y(sy));
    return p + "\"/>\n";
  };
  std::vector<std::pair<double, double>> raw, smooth;
  const std::vector<double> smoothed = SmoothedLosses(steps);
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!std::isfinite(steps[i].loss)) continue;
    raw.emplace_back(static_cast<double>(steps[i].step), steps[i].loss);
    smooth.emplace_back(static_cast<double>(steps[i].step), smoothed[i]);
  }
  svg += polyline(raw, "stroke=\"#9ecae1\" stroke-width=\"1\"");
  svg += polyline(smooth, "stroke=\"#08519c\" stroke-width=\"2\"");
  std::vector<std::pair<double, double>> vpts;
  for (const ValRecord& v : val) {
    vpts.emplace_back(static_cast<double>(v.step), v.loss);
    svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"#d94801\"/>\n",
                       x(static_cast<double>(v.step)), y(v.loss));
  }
  if (vpts.size() > 1) svg += polyline(vpts, "stroke=\"#d94801\" stroke-width=\"1.5\"");
  // Legend.
  const double lx = kLeft + pw - 170;
  svg += fmt::format(
      "<g><line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#08519c\" stroke-width=\"2\"/>"
      "<text x=\"{3}\" y=\"{4}\">train (smoothed)</text>"
      "<circle cx=\"{5}\" cy=\"{6}\" r=\"3.5\" fill=\"#d94801\"/>"
      "<text x=\"{3}\" y=\"{7}\">validation</text></g>\n",
      lx, kTop + 10, lx + 20, lx + 28, kTop + 14, lx + 10, kTop + 28, kTop + 32);
  svg += "</svg>\n";
  return svg;
}

}  // namespace kc::app
