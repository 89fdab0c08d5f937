// The login file (CONFIG/kc/login.json, every kc command that talks to kcd): a login, or an
// error naming the file and the key.
#include "api/client.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kc::api::ParseClientConfig(kc::fuzz::Text(data, size), "login.json").status().IgnoreError();
  return 0;
}
