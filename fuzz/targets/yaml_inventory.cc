// Inventory (topology) files (kc init --inventory, kc cluster topology put, kcd's
// topology.yaml): an inventory or an error; one that loads builds a topology or says why not.
#include "fuzz/fuzz_support.h"
#include "hal/inventory.h"
#include "hal/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kc::Result<kc::hal::TopologySpec> spec =
      kc::hal::LoadInventoryString(kc::fuzz::Text(data, size), "topology.yaml");
  if (!spec.ok()) return 0;
  // Building a topology is quadratic in the devices: the fuzzer's small inputs stay small.
  if (spec->devices.size() > 512) return 0;
  kc::hal::InventoryToYaml(*spec).status().IgnoreError();             // any answer will do
  kc::hal::Topology::Build(*std::move(spec)).status().IgnoreError();  // any answer will do
  return 0;
}
