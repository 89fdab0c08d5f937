// Job traces (kc sim --trace): jobs, or an error naming the line and column; a trace written
// back reads the same jobs.
#include "fuzz/fuzz_support.h"
#include "sched/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kc::Result<std::vector<kc::sched::TraceJob>> jobs =
      kc::sched::LoadTraceString(kc::fuzz::Text(data, size), "trace.csv");
  if (!jobs.ok()) return 0;
  const std::string written = kc::sched::TraceToCsv(*jobs);
  kc::Result<std::vector<kc::sched::TraceJob>> again =
      kc::sched::LoadTraceString(written, "written.csv");
  if (!again.ok() || kc::sched::TraceToCsv(*again) != written) abort();
  return 0;
}
