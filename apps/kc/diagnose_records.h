// kc diagnose's shared pieces: what a run recorded, a finding, and the numbers read from them
// (apps/kc/diagnose_command.cc reads and judges the records; apps/kc/diagnose_live.cc asks a
// running run and its hosts). Docs: docs/user-guide/diagnose.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kc/v1/train_job.pb.h"

namespace kc::app::diagnose {

using Json = nlohmann::json;

struct Finding {
  int layer = 1;         // 1..4: L1 devices, L2 comm, L3 plan, L4 scheduler and faults
  bool fault = false;    // a cause found (else a warning worth a look)
  std::string what;      // the verdict, one line
  std::string evidence;  // the numbers behind it
  std::string fix;
};

// What the run recorded.
struct RunRecords {
  Json header;               // the "run" record
  Json summary;              // the "summary" record, or null (the run did not finish)
  std::vector<Json> steps;   // "step" records, the last of each step
  std::vector<Json> faults;  // faults.jsonl
  std::vector<Json> ranks;   // "ranks" records: each rank's compute time per step
  // A kcd job's: its history (phase changes and notes), and whether it ran on this machine
  // (else the cores here say nothing of its ranks').
  std::vector<Json> history;
  bool here = true;
  // The launcher's cores' rates as the run started (the header's "start", RunReport.start).
  std::optional<kc::v1::HostLoadReport> start;
};

// j[key] when it is a number, else `fallback`.
inline double Number(const Json& j, const char* key, double fallback = -1) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace kc::app::diagnose
