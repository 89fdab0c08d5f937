// Test support: what tests that run a cluster (kc init, kcd, agents) share: a small
// inventory, a model that steps in milliseconds, and training data for it. Header-only.
#pragma once

#include <random>
#include <string>

#include "tests/support/kc_run.h"
#include "tests/support/temp_dir.h"

namespace kc::testing {

// A model that steps in milliseconds on two cores.
inline constexpr char kMicroModel[] = R"(name: micro
layers: 1
hidden: 64
heads: 2
vocab: 257
seq_len: 32
batch_per_rank: 4
)";

// Writes a small generated corpus into `dir` and prepares it with `kc` (its binary) as
// DIR/fortunes/manifest.json, where agents whose data root is DIR look by default. Returns
// kc's run (exit code 0 when prepared).
inline KcRun PrepareMicroData(const std::string& kc, const TempDir& dir) {
  std::mt19937 rng(1);
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"};
  std::string text;
  for (int line = 0; line < 3000; ++line) {
    for (int w = 0; w < 12; ++w) text += std::string(words[rng() % 9]) + (w < 11 ? " " : "\n");
  }
  const std::string corpus = dir.Write("corpus.txt", text);
  return RunKc(kc, "data prepare --out " + dir.Path("fortunes") + " " + corpus);
}

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
