#include "parallel/precision.h"

#include <string>

namespace kc::parallel {

std::string_view PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
  }
  return "unknown";
}

Result<Precision> ParsePrecision(std::string_view name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  return InvalidArgumentError("precision '" + std::string(name) + "': expected fp32 or bf16");
}

}  // namespace kc::parallel
