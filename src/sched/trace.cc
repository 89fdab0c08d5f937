#include "sched/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "base/file.h"

namespace kc::sched {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

std::vector<std::string_view> SplitFields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t comma = line.find(',', start);
    out.push_back(Trim(line.substr(start, comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::optional<double> ParseNumber(std::string_view s) {
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<int> ParseCount(std::string_view s) {
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

Result<std::vector<TraceJob>> LoadTrace(const std::string& path) {
  KC_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  return LoadTraceString(text, path);
}

Result<std::vector<TraceJob>> LoadTraceString(std::string_view text, std::string display_name) {
  std::vector<TraceJob> jobs;
  std::map<std::string, int, std::less<>> column;  // name -> field index
  size_t num_fields = 0;
  std::set<std::string, std::less<>> names;
  int line_no = 0;
  bool have_header = false;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? nl : nl - pos);
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    ++line_no;
    std::string_view trimmed = Trim(line);
    if (trimmed.empty() || trimmed.front() == '#') continue;
    std::vector<std::string_view> fields = SplitFields(trimmed);
    auto error = [&](std::string_view col, std::string_view what) {
      return InvalidArgumentError(fmt::format("{}:{}: {}: {}", display_name, line_no, col, what));
    };
    if (!have_header) {
      for (size_t i = 0; i < fields.size(); ++i) {
        if (!column.emplace(std::string(fields[i]), static_cast<int>(i)).second) {
          return error(fields[i], "column named twice in the header");
        }
      }
      for (std::string_view required : kTraceRequiredColumns) {
        if (!column.contains(required)) {
          return error(required, fmt::format("missing column (a trace's header names {})",
                                             fmt::join(kTraceRequiredColumns, ",")));
        }
      }
      num_fields = fields.size();
      have_header = true;
      continue;
    }
    if (fields.size() != num_fields) {
      return error("row", fmt::format("expected {} fields as in the header, got {}", num_fields,
                                      fields.size()));
    }
    auto field = [&](std::string_view name) -> std::optional<std::string_view> {
      auto it = column.find(name);
      if (it == column.end()) return std::nullopt;
      return fields[it->second];
    };
    TraceJob j;
    auto number = [&](std::string_view name, double* out) -> Status {
      std::optional<std::string_view> f = field(name);
      if (!f || f->empty()) return OkStatus();
      std::optional<double> v = ParseNumber(*f);
      if (!v) return error(name, fmt::format("expected a number, got \"{}\"", *f));
      *out = *v;
      return OkStatus();
    };
    auto count = [&](std::string_view name, int* out) -> Status {
      std::optional<std::string_view> f = field(name);
      if (!f || f->empty()) return OkStatus();
      std::optional<int> v = ParseCount(*f);
      if (!v) return error(name, fmt::format("expected a whole number, got \"{}\"", *f));
      *out = *v;
      return OkStatus();
    };
    for (std::string_view required : kTraceRequiredColumns) {
      if (field(required)->empty()) return error(required, "empty value");
    }
    KC_RETURN_IF_ERROR(number("submit_s", &j.submit_s));
    j.job = std::string(*field("job"));
    j.team = std::string(*field("team"));
    j.user = std::string(*field("user"));
    j.job_class = std::string(*field("class"));
    KC_RETURN_IF_ERROR(count("min_devices", &j.min_devices));
    KC_RETURN_IF_ERROR(count("max_devices", &j.max_devices));
    KC_RETURN_IF_ERROR(number("duration_s", &j.duration_s));
    if (auto f = field("kind")) j.kind = std::string(*f);
    if (auto f = field("pool")) j.pool = std::string(*f);
    KC_RETURN_IF_ERROR(count("tp", &j.tp));
    KC_RETURN_IF_ERROR(number("checkpoint_s", &j.checkpoint_s));
    KC_RETURN_IF_ERROR(number("faults_per_hour", &j.faults_per_hour));

    if (j.submit_s < 0) return error("submit_s", "must not be negative");
    if (!(j.duration_s > 0)) return error("duration_s", "must be positive");
    if (j.job_class != "high" && j.job_class != "normal" && j.job_class != "preemptible") {
      return error("class",
                   fmt::format("expected high, normal or preemptible, got \"{}\"", j.job_class));
    }
    if (j.min_devices < 1) return error("min_devices", "must be at least 1");
    if (j.min_devices > j.max_devices) {
      return error("min_devices",
                   fmt::format("{} is above max_devices {}", j.min_devices, j.max_devices));
    }
    if (j.tp < 1) return error("tp", "must be at least 1");
    if (j.min_devices % j.tp != 0 || j.max_devices % j.tp != 0) {
      return error("tp", fmt::format("{} must divide min_devices {} and max_devices {}", j.tp,
                                     j.min_devices, j.max_devices));
    }
    if (j.faults_per_hour < 0) return error("faults_per_hour", "must not be negative");
    if (!names.insert(j.job).second) {
      return error("job", fmt::format("\"{}\" is used by an earlier row", j.job));
    }
    jobs.push_back(std::move(j));
  }
  if (!have_header) {
    return InvalidArgumentError(fmt::format("{}: no header line (a trace starts with {})",
                                            display_name, fmt::join(kTraceRequiredColumns, ",")));
  }
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const TraceJob& a, const TraceJob& b) { return a.submit_s < b.submit_s; });
  return jobs;
}

std::string TraceToCsv(const std::vector<TraceJob>& jobs) {
  bool kind = false, pool = false, tp = false, ckpt = false, faults = false;
  for (const TraceJob& j : jobs) {
    kind |= !j.kind.empty();
    pool |= !j.pool.empty();
    tp |= j.tp != 1;
    ckpt |= j.checkpoint_s >= 0;
    faults |= j.faults_per_hour > 0;
  }
  std::string out = fmt::format("{}", fmt::join(kTraceRequiredColumns, ","));
  if (kind) out += ",kind";
  if (pool) out += ",pool";
  if (tp) out += ",tp";
  if (ckpt) out += ",checkpoint_s";
  if (faults) out += ",faults_per_hour";
  out += "\n";
  for (const TraceJob& j : jobs) {
    out += fmt::format("{},{},{},{},{},{},{},{}", j.submit_s, j.job, j.team, j.user, j.job_class,
                       j.min_devices, j.max_devices, j.duration_s);
    if (kind) out += "," + j.kind;
    if (pool) out += "," + j.pool;
    if (tp) out += fmt::format(",{}", j.tp);
    if (ckpt) out += j.checkpoint_s >= 0 ? fmt::format(",{}", j.checkpoint_s) : ",";
    if (faults) out += fmt::format(",{}", j.faults_per_hour);
    out += "\n";
  }
  return out;
}

}  // namespace kc::sched
