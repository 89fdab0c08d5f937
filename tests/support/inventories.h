// Test support: small cluster inventories (docs/user-guide/inventory.md) for tests that run
// `kc init` and kcd. Header-only.
#pragma once

namespace kc::testing {

// Two hosts, h1 and h2, of two CPU devices each.
inline constexpr char kTwoCpuHosts[] = R"(name: test
models:
  cpu-slice: {kind: cpu, memory_gb: 4, peak_tflops_fp32: 0.1, peak_tflops_bf16: 0,
              memory_bandwidth_gbs: 10}
hosts:
  - {name: h1, model: cpu-slice, count: 2, network: {bandwidth_gbs: 1, latency_us: 50}}
  - {name: h2, model: cpu-slice, count: 2, network: {bandwidth_gbs: 1, latency_us: 50}}
)";

}  // namespace kc::testing
