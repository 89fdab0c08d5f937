#include "parallel/timeline.h"

#include <fmt/format.h>

namespace kc::parallel {

const char* SpanKindName(SpanKind kind) {
  switch (kind) {
    case SpanKind::kCompute:
      return "compute";
    case SpanKind::kComm:
      return "comm";
    case SpanKind::kData:
      return "data";
  }
  return "unknown";
}

std::string Timeline::ChromeTraceEvents(int rank) const {
  using std::chrono::duration;
  std::string out = fmt::format(
      "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"rank "
      "{0}\"}}}},\n{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{0},\"tid\":0,"
      "\"args\":{{\"sort_index\":{0}}}}}",
      rank);
  for (const Span& s : spans_) {
    const double ts = duration<double, std::micro>(s.start.time_since_epoch()).count();
    const double dur = duration<double, std::micro>(s.end - s.start).count();
    out += fmt::format(
        ",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":0,\"ts\":{:.3f},"
        "\"dur\":{:.3f},\"args\":{{\"step\":{}}}}}",
        s.name, SpanKindName(s.kind), rank, ts, dur, s.step);
  }
  return out;
}

double Timeline::Seconds(SpanKind kind) const {
  double total = 0;
  for (const Span& s : spans_) {
    if (s.kind == kind) total += std::chrono::duration<double>(s.end - s.start).count();
  }
  return total;
}

}  // namespace kc::parallel
