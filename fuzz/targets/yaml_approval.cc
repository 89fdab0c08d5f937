// Plan approval limits (kcd's plan-approval.yaml).
#include "fuzz/fuzz_support.h"
#include "parallel/planner/approval.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kc::parallel::planner::LoadApprovalLimitsFromString(kc::fuzz::Text(data, size),
                                                      "plan-approval.yaml")
      .status()
      .IgnoreError();  // any answer but a crash will do
  return 0;
}
