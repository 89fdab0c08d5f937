// The CPU backend's element-wise loops: plain loops over restrict pointers that the compiler
// vectorises. No argument checks (hal/kernels.cc did them); inputs and outputs never
// overlap. N is the element count throughout.
#pragma once

#include <cstddef>

#include "hal/compute.h"
#include "hal/kernels.h"

namespace kc::hal::cpu {

// dst[i] = op(dst[i], src[i]) for N elements of `type`; semantics as hal::ReduceInto.
void ReduceInto(DataType type, ReduceOp op, void* dst, const void* src, size_t N);

void Scale(float* x, size_t N, float alpha);
void Scale(double* x, size_t N, double alpha);
void Scale(Bf16* x, size_t N, float alpha);

void Axpy(float* y, float alpha, const float* x, size_t N);
void Axpy(double* y, double alpha, const double* x, size_t N);
void Axpy(Bf16* y, float alpha, const Bf16* x, size_t N);

void ConvertF32ToBf16(Bf16* dst, const float* src, size_t N);
void ConvertBf16ToF32(float* dst, const Bf16* src, size_t N);

}  // namespace kc::hal::cpu
