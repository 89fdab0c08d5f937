// Model files (kc train, kc plan, the model a job file names): any text is a model or a
// "FILE:LINE: key: ..." error; a model read back from the file it writes is the same model.
#include "fuzz/fuzz_support.h"
#include "parallel/model_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kc::Result<kc::parallel::ModelSpec> spec =
      kc::parallel::LoadModelSpecFromString(kc::fuzz::Text(data, size), "model.yaml");
  if (!spec.ok()) return 0;
  const std::string text = kc::parallel::ModelSpecToYaml(*spec);
  kc::Result<kc::parallel::ModelSpec> again =
      kc::parallel::LoadModelSpecFromString(text, "written.yaml");
  if (!again.ok() || kc::parallel::ModelSpecToYaml(*again) != text) abort();
  return 0;
}
