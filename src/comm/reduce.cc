#include "comm/reduce.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

namespace kc::comm {
namespace {

using hal::Bf16;
using hal::DataType;

struct SumOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
struct ProdOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};
struct MinOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      return std::min(a, b);
    } else {
      return std::isnan(a) ? a : std::isnan(b) ? b : std::min(a, b);
    }
  }
};
struct MaxOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      return std::max(a, b);
    } else {
      return std::isnan(a) ? a : std::isnan(b) ? b : std::max(a, b);
    }
  }
};

template <typename T, typename Op>
void Loop(std::byte* dst, const std::byte* a, const std::byte* b, size_t n, Op op) {
  T* d = reinterpret_cast<T*>(dst);
  const T* x = reinterpret_cast<const T*>(a);
  const T* y = reinterpret_cast<const T*>(b);
  if constexpr (std::is_same_v<T, Bf16>) {
    for (size_t i = 0; i < n; ++i) {
      d[i] = hal::FloatToBf16(op(hal::Bf16ToFloat(x[i]), hal::Bf16ToFloat(y[i])));
    }
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = op(x[i], y[i]);
  }
}

template <typename T>
void Typed(ReduceOp op, std::byte* dst, const std::byte* a, const std::byte* b, size_t n) {
  switch (op) {
    case ReduceOp::kProd:
      return Loop<T>(dst, a, b, n, ProdOp{});
    case ReduceOp::kMin:
      return Loop<T>(dst, a, b, n, MinOp{});
    case ReduceOp::kMax:
      return Loop<T>(dst, a, b, n, MaxOp{});
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return Loop<T>(dst, a, b, n, SumOp{});
  }
}

}  // namespace

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "unknown";
}

void ReduceElements(DataType type, ReduceOp op, std::byte* dst, const std::byte* a,
                    const std::byte* b, size_t n) {
  switch (type) {
    case DataType::kF32:
      return Typed<float>(op, dst, a, b, n);
    case DataType::kF64:
      return Typed<double>(op, dst, a, b, n);
    case DataType::kI32:
      return Typed<int32_t>(op, dst, a, b, n);
    case DataType::kI64:
      return Typed<int64_t>(op, dst, a, b, n);
    case DataType::kBf16:
      return Typed<Bf16>(op, dst, a, b, n);
  }
}

void ScaleByInverse(DataType type, std::byte* data, size_t n, int size) {
  if (type == DataType::kF64) {
    double* x = reinterpret_cast<double*>(data);
    for (size_t i = 0; i < n; ++i) x[i] *= 1.0 / size;
  } else if (type == DataType::kF32) {
    float* x = reinterpret_cast<float*>(data);
    for (size_t i = 0; i < n; ++i) x[i] *= 1.0f / static_cast<float>(size);
  } else if (type == DataType::kBf16) {
    Bf16* x = reinterpret_cast<Bf16*>(data);
    for (size_t i = 0; i < n; ++i) {
      x[i] = hal::FloatToBf16(hal::Bf16ToFloat(x[i]) * (1.0f / static_cast<float>(size)));
    }
  }
}

bool IsFloating(DataType type) {
  return type == DataType::kF32 || type == DataType::kF64 || type == DataType::kBf16;
}

Status CheckBuffer(std::string_view what, std::span<const std::byte> data, size_t count,
                   DataType type) {
  const size_t esize = hal::DataTypeSize(type);
  if (esize == 0) return InvalidArgumentError(std::string(what) + ": unknown dtype");
  if (count > data.size() / esize) {
    return InvalidArgumentError(std::string(what) + ": data holds " + std::to_string(data.size()) +
                                " bytes, count " + std::to_string(count) + " needs " +
                                std::to_string(count * esize));
  }
  if (count > 0 && reinterpret_cast<uintptr_t>(data.data()) % esize != 0) {
    return InvalidArgumentError(std::string(what) + ": data is not aligned for " +
                                std::string(hal::DataTypeName(type)));
  }
  return OkStatus();
}

Status CheckReduceArgs(std::string_view what, std::span<const std::byte> data, size_t count,
                       DataType type, ReduceOp op) {
  KC_RETURN_IF_ERROR(CheckBuffer(what, data, count, type));
  if (static_cast<uint8_t>(op) > static_cast<uint8_t>(ReduceOp::kAvg)) {
    return InvalidArgumentError(std::string(what) + ": unknown op");
  }
  if (op == ReduceOp::kAvg && !IsFloating(type)) {
    return InvalidArgumentError(std::string(what) + ": avg of integer type " +
                                std::string(hal::DataTypeName(type)));
  }
  return OkStatus();
}

}  // namespace kc::comm
