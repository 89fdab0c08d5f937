// Pools files (kcd's pools.yaml, kc pools put, kc sim): pools, laid over a two-host cluster.
#include "fuzz/fuzz_support.h"
#include "hal/inventory.h"
#include "hal/topology.h"
#include "sched/pools.h"

namespace {

const kc::hal::Topology& Cluster() {
  static const kc::hal::Topology topology =
      *kc::hal::Topology::Build(*kc::hal::LoadInventoryString(R"(name: test
models:
  cpu-slice: {kind: cpu, memory_gb: 4, peak_tflops_fp32: 0.1, peak_tflops_bf16: 0,
              memory_bandwidth_gbs: 10}
hosts:
  - {name: "h[1-4]", model: cpu-slice, count: 4, network: {bandwidth_gbs: 1, latency_us: 50}}
)",
                                                              "inventory.yaml"));
  return topology;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kc::Result<kc::sched::PoolConfig> pools =
      kc::sched::LoadPoolConfigString(kc::fuzz::Text(data, size), "pools.yaml");
  if (!pools.ok()) return 0;
  kc::sched::PartitionPools(Cluster(), *pools).status().IgnoreError();  // any answer will do
  return 0;
}
