// Job files (kc submit) and the spec kcd stores and agents receive: a job, or an error naming
// the file, line and key; a spec travels as its text and reads back the same.
#include "api/job_spec.h"
#include "fuzz/fuzz_support.h"

namespace {

// A model file beside the job file, for inputs naming `model: m.yaml`.
const std::string& ModelFile() {
  static const std::string path = kc::fuzz::WriteScratch(
      "m.yaml",
      "name: m\nlayers: 1\nhidden: 64\nheads: 2\nvocab: 257\nseq_len: 32\nbatch_per_rank: 4\n");
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ModelFile();
  const std::string_view text = kc::fuzz::Text(data, size);
  kc::Result<kc::api::JobSpec> job = kc::api::LoadJobFile(kc::fuzz::WriteScratch("job.yaml", text));
  if (job.ok()) {
    const std::string wire = kc::api::JobSpecText(*job);
    kc::Result<kc::api::JobSpec> again = kc::api::ParseJobSpec(wire, "spec");
    if (!again.ok() || kc::api::JobSpecText(*again) != wire) abort();
  }
  kc::api::ParseJobSpec(text, "spec").IgnoreError();  // as kcd and agents read one
  return 0;
}
