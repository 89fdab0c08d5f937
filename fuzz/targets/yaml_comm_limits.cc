// Communication limits files (kc train --comm-limits, docs/operations/comm-limits.md).
#include "comm/comm_limits_config.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kc::comm::LoadCommLimitsString(kc::fuzz::Text(data, size), "comm-limits.yaml")
      .status()
      .IgnoreError();  // any answer but a crash will do
  return 0;
}
