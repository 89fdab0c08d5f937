// Helpers shared by the model's tests (gpt_model_test.cc, tensor_parallel_test.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "base/check.h"
#include "hal/compute.h"

namespace kc::parallel::testing {

// The host CPU as a compute device.
inline std::unique_ptr<hal::ComputeDevice> Cpu() {
  auto device = hal::OpenComputeDevice({.id = "test/cpu0", .kind = hal::DeviceKind::kCpu});
  KC_CHECK(device.ok()) << device.status();
  return std::move(device).value();
}

// n tokens in [0, vocab), deterministic in `seed`.
inline std::vector<int32_t> Tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(gen() % vocab);
  return t;
}

}  // namespace kc::parallel::testing
