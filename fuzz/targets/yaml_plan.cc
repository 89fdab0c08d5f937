// Plan files (kc plan --out, kc train --plan FILE) and the --plan flag's one-line form.
#include "fuzz/fuzz_support.h"
#include "parallel/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = kc::fuzz::Text(data, size);
  kc::Result<kc::parallel::ParallelPlan> plan = kc::parallel::LoadPlanFromString(text, "plan.yaml");
  if (plan.ok()) {
    const std::string written = kc::parallel::PlanToYaml(*plan);
    kc::Result<kc::parallel::ParallelPlan> again =
        kc::parallel::LoadPlanFromString(written, "written.yaml");
    if (!again.ok() || kc::parallel::PlanToYaml(*again) != written) abort();
  }
  kc::parallel::ParsePlanFlag(text).IgnoreError();  // any answer but a crash will do
  return 0;
}
