// The numeric precision of training.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace kc::parallel {

enum class Precision : uint8_t {
  kFp32 = 0,  // everything in fp32
  // Mixed precision: activations and the products' operands in bf16 (fp32 accumulation), with
  // fp32 master weights, parameter gradients and optimizer moments (CUDA devices only).
  kBf16 = 1,
};
std::string_view PrecisionName(Precision precision);  // "fp32", "bf16"
// kInvalidArgument naming the choices for anything but "fp32" and "bf16".
Result<Precision> ParsePrecision(std::string_view name);

}  // namespace kc::parallel
