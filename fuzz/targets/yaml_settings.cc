// Settings files (kc --config, $KC_CONFIG, kc config check): settings, or an error; settings
// written back read the same.
#include "base/settings.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kc::Result<kc::Settings> s = kc::LoadSettingsString(kc::fuzz::Text(data, size), "kc.yaml");
  if (!s.ok()) return 0;
  const std::string written = kc::SettingsToYaml(*s);
  kc::Result<kc::Settings> again = kc::LoadSettingsString(written, "written.yaml");
  if (!again.ok() || kc::SettingsToYaml(*again) != written) abort();
  return 0;
}
