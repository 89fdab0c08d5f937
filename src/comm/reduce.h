// Element-wise reductions on host memory, shared by every collective algorithm (ring over a
// transport, the direct shared-memory path, hierarchical). Semantics match hal::ReduceInto:
// integers wrap, min/max propagate NaN, bf16 combines in fp32 and rounds once.
//
//   ReduceElements(DataType::kF32, ReduceOp::kSum, dst, a, b, n);  // dst[i] = a[i] + b[i]
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "base/status.h"
#include "hal/compute.h"

namespace kc::comm {

// kAvg is a sum followed by a scale by 1 / size (floating types only).
enum class ReduceOp : uint8_t { kSum = 0, kProd = 1, kMin = 2, kMax = 3, kAvg = 4 };
std::string_view ReduceOpName(ReduceOp op);  // "sum", "prod", "min", "max", "avg"

// dst[i] = op(a[i], b[i]) for i < n; kAvg combines as kSum. dst may equal a or b (the same
// pointer); other overlaps are undefined. Loops are specialised per op so they vectorise.
void ReduceElements(hal::DataType type, ReduceOp op, std::byte* dst, const std::byte* a,
                    const std::byte* b, size_t n);

// x[i] *= 1 / size: fp32 and bf16 in fp32, fp64 in fp64 (as hal::Scale). Integers untouched.
void ScaleByInverse(hal::DataType type, std::byte* data, size_t n, int size);

bool IsFloating(hal::DataType type);

// kInvalidArgument naming `what` unless `data` holds `count` elements of `type` aligned for it.
Status CheckBuffer(std::string_view what, std::span<const std::byte> data, size_t count,
                   hal::DataType type);
// CheckBuffer plus: a known op, and no avg of an integer type.
Status CheckReduceArgs(std::string_view what, std::span<const std::byte> data, size_t count,
                       hal::DataType type, ReduceOp op);

}  // namespace kc::comm
