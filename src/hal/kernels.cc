// The checked front ends of the kernels: validate, resolve defaults, dispatch to the
// stream's backend.
#include "hal/kernels.h"

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>

#include "base/layer_guard.h"
#include "hal/internal/kernel_backend.h"
#include "hal/internal/span_checks.h"

namespace kc::hal {

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
  }
  return "invalid";
}

namespace {

constexpr int64_t kMaxBlasIndex = INT_MAX;  // cblas takes 32-bit ints (blasint)

internal::KernelBackend& Backend(Stream& stream) { return stream.device().backend(); }

std::string Str(int64_t v) { return std::to_string(v); }

Status CheckDim(int64_t v, const char* name) {
  if (v < 0) return InvalidArgumentError(std::string("sgemm: ") + name + "=" + Str(v) + " < 0");
  if (v > kMaxBlasIndex) {
    return InvalidArgumentError(std::string("sgemm: ") + name + "=" + Str(v) +
                                " exceeds the 32-bit BLAS index");
  }
  return OkStatus();
}

// One matrix operand: `rows` rows of `cols` elements, row r at r * ld, `batch` matrices
// `stride` elements apart.
struct Operand {
  const char* name;
  const char* ld_name;
  int64_t rows;
  int64_t cols;
  int64_t ld;  // as given; 0 = tight
  int64_t stride;
};

// The resolved leading dimension, or kInvalidArgument.
Result<int64_t> ResolveLd(const Operand& x) {
  const int64_t min_ld = std::max<int64_t>(1, x.cols);
  if (x.ld == 0) return min_ld;
  if (x.ld < min_ld) {
    return InvalidArgumentError(std::string("sgemm: ") + x.ld_name + "=" + Str(x.ld) +
                                " < row width " + Str(min_ld));
  }
  if (x.ld > kMaxBlasIndex) {
    return InvalidArgumentError(std::string("sgemm: ") + x.ld_name + "=" + Str(x.ld) +
                                " exceeds the 32-bit BLAS index");
  }
  return x.ld;
}

// Elements one matrix spans.
int64_t Extent(int64_t rows, int64_t cols, int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

// Elements the whole batch spans, or kInvalidArgument when it overflows.
Result<int64_t> BatchExtent(int64_t extent, int64_t batch, int64_t stride, const char* name) {
  if (extent == 0 || batch == 0) return int64_t{0};
  if (stride < 0) {
    return InvalidArgumentError(std::string("sgemm: stride of ") + name + " < 0");
  }
  if (batch > 1 && stride > (INT64_MAX - extent) / (batch - 1)) {
    return InvalidArgumentError(std::string("sgemm: batch of ") + name + " overflows int64");
  }
  return (batch - 1) * stride + extent;
}

template <typename T>
Status CheckOperandSpan(const Stream& stream, DeviceSpan<T> span, int64_t needed,
                        const char* name) {
  KC_RETURN_IF_ERROR(internal::CheckSpan(stream, span, name));
  if (static_cast<uint64_t>(needed) > span.size()) {
    return InvalidArgumentError(std::string("sgemm: ") + name + " has " +
                                std::to_string(span.size()) + " elements, needs " + Str(needed));
  }
  return OkStatus();
}

// The checks every product makes, on typed views of its operands: dimensions, leading
// dimensions (resolved in place from 0 = tight), the extents the batch spans, devices,
// alignment and overlap. `shape` carries the dimensions and leading dimensions.
template <typename TA, typename TC>
Status CheckProduct(const Stream& stream, SgemmStridedBatchedOptions* shape, DeviceSpan<const TA> a,
                    DeviceSpan<const TA> b, DeviceSpan<TC> c) {
  SgemmOptions& g = shape->gemm;
  const SgemmStridedBatchedOptions& o = *shape;
  KC_RETURN_IF_ERROR(CheckDim(g.m, "m"));
  KC_RETURN_IF_ERROR(CheckDim(g.n, "n"));
  KC_RETURN_IF_ERROR(CheckDim(g.k, "k"));
  if (o.batch_count < 0) {
    return InvalidArgumentError("sgemm: batch_count=" + Str(o.batch_count) + " < 0");
  }
  if ((g.trans_a != Transpose::kNo && g.trans_a != Transpose::kYes) ||
      (g.trans_b != Transpose::kNo && g.trans_b != Transpose::kYes)) {
    return InvalidArgumentError("sgemm: unknown Transpose value");
  }
  const bool ta = g.trans_a == Transpose::kYes;
  const bool tb = g.trans_b == Transpose::kYes;
  const Operand oa{"a", "lda", ta ? g.k : g.m, ta ? g.m : g.k, g.lda, o.stride_a};
  const Operand ob{"b", "ldb", tb ? g.n : g.k, tb ? g.k : g.n, g.ldb, o.stride_b};
  const Operand oc{"c", "ldc", g.m, g.n, g.ldc, o.stride_c};
  KC_ASSIGN_OR_RETURN(g.lda, ResolveLd(oa));
  KC_ASSIGN_OR_RETURN(g.ldb, ResolveLd(ob));
  KC_ASSIGN_OR_RETURN(g.ldc, ResolveLd(oc));
  const int64_t extent_a = Extent(oa.rows, oa.cols, g.lda);
  const int64_t extent_b = Extent(ob.rows, ob.cols, g.ldb);
  const int64_t extent_c = Extent(oc.rows, oc.cols, g.ldc);
  if (o.batch_count > 1 && extent_c > 0 && o.stride_c < extent_c) {
    return InvalidArgumentError("sgemm: stride_c=" + Str(o.stride_c) +
                                " makes C matrices overlap (one spans " + Str(extent_c) + ")");
  }
  KC_ASSIGN_OR_RETURN(const int64_t need_a, BatchExtent(extent_a, o.batch_count, o.stride_a, "a"));
  KC_ASSIGN_OR_RETURN(const int64_t need_b, BatchExtent(extent_b, o.batch_count, o.stride_b, "b"));
  KC_ASSIGN_OR_RETURN(const int64_t need_c, BatchExtent(extent_c, o.batch_count, o.stride_c, "c"));
  KC_RETURN_IF_ERROR(CheckOperandSpan(stream, a, need_a, "a"));
  KC_RETURN_IF_ERROR(CheckOperandSpan(stream, b, need_b, "b"));
  KC_RETURN_IF_ERROR(CheckOperandSpan(stream, c, need_c, "c"));
  const DeviceSpan<TC> used_c = c.first(static_cast<size_t>(need_c));
  KC_RETURN_IF_ERROR(
      internal::CheckDisjoint(used_c, a.first(static_cast<size_t>(need_a)), "c", "a"));
  KC_RETURN_IF_ERROR(
      internal::CheckDisjoint(used_c, b.first(static_cast<size_t>(need_b)), "c", "b"));
  return OkStatus();
}

Status CheckedSgemm(Stream& stream, SgemmStridedBatchedOptions o) {
  KC_RETURN_IF_ERROR((CheckProduct<float, float>(stream, &o, o.gemm.a, o.gemm.b, o.gemm.c)));
  if (o.gemm.m == 0 || o.gemm.n == 0 || o.batch_count == 0) return OkStatus();
  return Backend(stream).SgemmStridedBatched(stream, o);
}

// A byte span as elements of T (a trailing partial element is not part of it).
template <typename T, typename B>
auto Typed(DeviceSpan<B> s) {
  using Elem = std::conditional_t<std::is_const_v<B>, const T, T>;
  return DeviceSpan<Elem>(reinterpret_cast<Elem*>(s.data()), s.size() / sizeof(T), s.device());
}

// Gemm's checks with the operands typed as `options` says.
template <typename TA, typename TC>
Status CheckGemmTyped(const Stream& stream, const GemmOptions& o,
                      SgemmStridedBatchedOptions* shape) {
  return CheckProduct<TA, TC>(stream, shape, Typed<TA>(o.a), Typed<TA>(o.b), Typed<TC>(o.c));
}

template <typename Y, typename X>
Status CheckPair(const Stream& stream, DeviceSpan<Y> y, DeviceSpan<X> x, const char* y_name,
                 const char* x_name) {
  KC_RETURN_IF_ERROR(internal::CheckSpan(stream, y, y_name));
  KC_RETURN_IF_ERROR(internal::CheckSpan(stream, x, x_name));
  if (y.size() != x.size()) {
    return InvalidArgumentError(std::string(y_name) + " has " + std::to_string(y.size()) +
                                " elements, " + x_name + " " + std::to_string(x.size()));
  }
  return internal::CheckDisjoint(y, x, y_name, x_name);
}

template <typename T>
Status CheckedScale(Stream& stream, DeviceSpan<T> x, double alpha) {
  KC_RETURN_IF_ERROR(internal::CheckSpan(stream, x, "scale x"));
  if (x.empty()) return OkStatus();
  return Backend(stream).Scale(stream, DataTypeOf<T>::value, x.data(), x.size(), alpha);
}

template <typename T>
Status CheckedAxpy(Stream& stream, DeviceSpan<T> y, double alpha, DeviceSpan<const T> x) {
  KC_RETURN_IF_ERROR(CheckPair(stream, y, x, "axpy y", "axpy x"));
  if (y.empty()) return OkStatus();
  return Backend(stream).Axpy(stream, DataTypeOf<T>::value, y.data(), alpha, x.data(), y.size());
}

template <typename T>
Status CheckedFill(Stream& stream, DeviceSpan<T> x, T value) {
  KC_RETURN_IF_ERROR(internal::CheckSpan(stream, x, "fill x"));
  if (x.empty()) return OkStatus();
  return Backend(stream).Fill(stream, DataTypeOf<T>::value, x.data(), x.size(), &value);
}

template <typename D, typename S>
Status CheckedConvert(Stream& stream, DeviceSpan<D> dst, DeviceSpan<const S> src) {
  KC_RETURN_IF_ERROR(CheckPair(stream, dst, src, "convert dst", "convert src"));
  if (dst.empty()) return OkStatus();
  return Backend(stream).Convert(stream, DataTypeOf<D>::value, dst.data(), DataTypeOf<S>::value,
                                 src.data(), dst.size());
}

}  // namespace

Status Sgemm(Stream& stream, const SgemmOptions& options) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedSgemm(stream, {.gemm = options, .batch_count = 1});
}

Status SgemmStridedBatched(Stream& stream, const SgemmStridedBatchedOptions& options) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedSgemm(stream, options);
}

Status Gemm(Stream& stream, const GemmOptions& options) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  GemmOptions o = options;
  const bool f32 = o.ab_type == DataType::kF32 && o.c_type == DataType::kF32;
  const bool bf16 =
      o.ab_type == DataType::kBf16 && (o.c_type == DataType::kBf16 || o.c_type == DataType::kF32);
  if (!f32 && !bf16) {
    return InvalidArgumentError("gemm: operands " + std::string(DataTypeName(o.ab_type)) +
                                " with C " + std::string(DataTypeName(o.c_type)) +
                                ": expected f32 with f32, or bf16 with bf16 or f32");
  }
  // The shape checks are Sgemm's, on the operands typed as they are.
  SgemmStridedBatchedOptions shape{.gemm = {.trans_a = o.trans_a,
                                            .trans_b = o.trans_b,
                                            .m = o.m,
                                            .n = o.n,
                                            .k = o.k,
                                            .lda = o.lda,
                                            .ldb = o.ldb,
                                            .ldc = o.ldc},
                                   .batch_count = o.batch_count,
                                   .stride_a = o.stride_a,
                                   .stride_b = o.stride_b,
                                   .stride_c = o.stride_c};
  if (f32) {
    KC_RETURN_IF_ERROR((CheckGemmTyped<float, float>(stream, o, &shape)));
  } else if (o.c_type == DataType::kF32) {
    KC_RETURN_IF_ERROR((CheckGemmTyped<Bf16, float>(stream, o, &shape)));
  } else {
    KC_RETURN_IF_ERROR((CheckGemmTyped<Bf16, Bf16>(stream, o, &shape)));
  }
  o.lda = shape.gemm.lda;
  o.ldb = shape.gemm.ldb;
  o.ldc = shape.gemm.ldc;
  if (o.m == 0 || o.n == 0 || o.batch_count == 0) return OkStatus();
  return Backend(stream).Gemm(stream, o);
}

Status ReduceInto(Stream& stream, const ReduceIntoOptions& o) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  const size_t element = DataTypeSize(o.type);
  if (element == 0) return InvalidArgumentError("reduce: unknown DataType");
  if (o.op != ReduceOp::kSum && o.op != ReduceOp::kProd && o.op != ReduceOp::kMin &&
      o.op != ReduceOp::kMax) {
    return InvalidArgumentError("reduce: unknown ReduceOp");
  }
  KC_RETURN_IF_ERROR(CheckPair(stream, o.dst, o.src, "reduce dst", "reduce src"));
  if (o.dst.size() % element != 0) {
    return InvalidArgumentError("reduce: " + std::to_string(o.dst.size()) +
                                " bytes is not a whole number of " +
                                std::string(DataTypeName(o.type)) + " elements");
  }
  if (o.dst.empty()) return OkStatus();
  // Every DataType's alignment equals its size on the platforms we build for.
  if (reinterpret_cast<uintptr_t>(o.dst.data()) % element != 0 ||
      reinterpret_cast<uintptr_t>(o.src.data()) % element != 0) {
    return InvalidArgumentError("reduce: pointer misaligned for " +
                                std::string(DataTypeName(o.type)));
  }
  return Backend(stream).ReduceInto(stream, o.type, o.op, o.dst.data(), o.src.data(),
                                    o.dst.size() / element);
}

Status Scale(Stream& stream, DeviceSpan<float> x, float alpha) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedScale(stream, x, alpha);
}
Status Scale(Stream& stream, DeviceSpan<double> x, double alpha) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedScale(stream, x, alpha);
}
Status Scale(Stream& stream, DeviceSpan<Bf16> x, float alpha) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedScale(stream, x, alpha);
}

Status Axpy(Stream& stream, DeviceSpan<float> y, float alpha, DeviceSpan<const float> x) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedAxpy(stream, y, alpha, x);
}
Status Axpy(Stream& stream, DeviceSpan<double> y, double alpha, DeviceSpan<const double> x) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedAxpy(stream, y, alpha, x);
}
Status Axpy(Stream& stream, DeviceSpan<Bf16> y, float alpha, DeviceSpan<const Bf16> x) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedAxpy(stream, y, alpha, x);
}

Status Fill(Stream& stream, DeviceSpan<float> x, float value) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedFill(stream, x, value);
}
Status Fill(Stream& stream, DeviceSpan<double> x, double value) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedFill(stream, x, value);
}
Status Fill(Stream& stream, DeviceSpan<int32_t> x, int32_t value) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedFill(stream, x, value);
}
Status Fill(Stream& stream, DeviceSpan<int64_t> x, int64_t value) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedFill(stream, x, value);
}
Status Fill(Stream& stream, DeviceSpan<Bf16> x, Bf16 value) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedFill(stream, x, value);
}

Status ConvertF32ToBf16(Stream& stream, DeviceSpan<Bf16> dst, DeviceSpan<const float> src) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedConvert(stream, dst, src);
}
Status ConvertBf16ToF32(Stream& stream, DeviceSpan<float> dst, DeviceSpan<const Bf16> src) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return CheckedConvert(stream, dst, src);
}

}  // namespace kc::hal
