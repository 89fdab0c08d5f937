// Grouping files (kc topo --groups): named groups of the devices of a known inventory.
#include "fuzz/fuzz_support.h"
#include "hal/grouping.h"
#include "hal/inventory.h"

namespace {

const kc::hal::TopologySpec& Spec() {
  static const kc::hal::TopologySpec spec = *kc::hal::LoadInventoryString(R"(name: test
models:
  gpu: {kind: cuda, memory_gb: 80, peak_tflops_fp32: 19.5, peak_tflops_bf16: 312,
        memory_bandwidth_gbs: 2039}
hosts:
  - {name: "dgx[00-01]", model: gpu, count: 8, network: {bandwidth_gbs: 25, latency_us: 5}}
)",
                                                                          "inventory.yaml");
  return spec;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kc::Result<std::vector<kc::hal::Group>> groups =
      kc::hal::LoadGroupingString(kc::fuzz::Text(data, size), "groups.yaml", Spec());
  if (groups.ok()) kc::hal::GroupingToYaml(*groups, Spec());
  return 0;
}
