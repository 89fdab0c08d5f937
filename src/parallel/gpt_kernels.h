// The layers of the GPT, forward and backward, written out as llm.c's train_gpt2.c does:
// one function per layer and direction over flat row-major arrays, no autograd. Matrix
// products go through L1's Sgemm (hal/kernels.h); everything else is plain loops here.
//
// Every function is a template over the element type Real (float for training; double so the
// finite-difference tests in gpt_kernels_test.cc can check each backward tightly, and bf16
// kernels can slot in later). For Real = float the products run on `ctx.stream`; for other
// types they are plain loops (tests only).
//
// Conventions. Shapes are in comments: N = rows (B*T tokens), C = width, OC = output
// width, NH = heads, hd = C / NH, V = vocabulary. Forward functions overwrite their outputs.
// Backward functions:
//   - ADD into the gradient of their input activation (`dinp`), so a residual stream's
//     gradient accumulates in place, unless the comment says "overwrites";
//   - write parameter gradients (`dweight`, `dbias`, ...) when `accumulate` is false and add
//     to them when true (micro-batches add up).
// Nothing allocates; scratch buffers are passed in. Arguments are trusted (the model checks
// shapes once); a failed Sgemm (bad arguments: a bug) returns its Status.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "hal/compute.h"

namespace kc::parallel {

// Where products run. `stream` must be set for Real = float.
struct KernelContext {
  hal::Stream* stream = nullptr;
};

// C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C, row-major, leading dimensions
// in elements; beta == 0 does not read C.
template <typename Real>
Status Gemm(const KernelContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            Real alpha, const Real* a, int64_t lda, const Real* b, int64_t ldb, Real beta, Real* c,
            int64_t ldc);
template <>
Status Gemm<float>(const KernelContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n,
                   int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                   float beta, float* c, int64_t ldc);
template <>
Status Gemm<double>(const KernelContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n,
                    int64_t k, double alpha, const double* a, int64_t lda, const double* b,
                    int64_t ldb, double beta, double* c, int64_t ldc);
// `batch` such products, matrix i of X starting at X + i * stride_x.
template <typename Real>
Status GemmBatched(const KernelContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n,
                   int64_t k, Real alpha, const Real* a, int64_t lda, int64_t stride_a,
                   const Real* b, int64_t ldb, int64_t stride_b, Real beta, Real* c, int64_t ldc,
                   int64_t stride_c, int64_t batch);

// out (B, T, C) = wte[inp[b, t]] + wpe[t]. wte (V, C), wpe (T, C), inp (B, T).
// Vocabulary-parallel (tensor parallelism): wte holds rows [v0, v0 + vl) of the whole; a token
// outside them contributes zeros (the group's all-reduce adds the owner's row), and wpe may be
// null (added on one rank only). The defaults are the whole table.
template <typename Real>
void EncoderForward(Real* out, const int32_t* inp, const Real* wte, const Real* wpe, int64_t B,
                    int64_t T, int64_t C, int64_t v0 = 0, int64_t vl = -1);
// dwte[inp[b, t] - v0] += dout[b, t] for the rows held; dwpe[t] += dout[b, t]. Always adds
// (the caller zeroes or the LM head's product wrote dwte first).
template <typename Real>
void EncoderBackward(Real* dwte, Real* dwpe, const Real* dout, const int32_t* inp, int64_t B,
                     int64_t T, int64_t C, int64_t v0 = 0, int64_t vl = -1);

// out (N, C) = (inp - mean) * rstd * weight + bias per row; saves mean (N) and rstd (N)
// (1 / sqrt(biased variance + eps)) for the backward.
template <typename Real>
void LayerNormForward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight,
                      const Real* bias, int64_t N, int64_t C, float eps);
// dinp (N, C) accumulated into; dweight and dbias (C) as `accumulate` says. Either half may be
// skipped: dinp null computes the weight gradients alone, dweight and dbias null the input
// gradient alone (ZB-H1's split backward).
template <typename Real>
void LayerNormBackward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                       const Real* weight, const Real* mean, const Real* rstd, int64_t N, int64_t C,
                       bool accumulate);

// out (N, OC) = inp (N, C) * weight^T + bias; weight (OC, C), bias (OC) or null.
template <typename Real>
Status MatmulForward(const KernelContext& ctx, Real* out, const Real* inp, const Real* weight,
                     const Real* bias, int64_t N, int64_t C, int64_t OC);
// out (N, OC) += bias (OC) per row: a row-parallel layer's bias, after its all-reduce.
template <typename Real>
void BiasForward(Real* out, const Real* bias, int64_t N, int64_t OC);
// dinp (N, C) OVERWRITTEN with dout * weight (skipped when dinp is null); dweight (OC, C) and
// dbias (OC, null when there is no bias) as `accumulate` says (skipped when dweight is null).
template <typename Real>
Status MatmulBackward(const KernelContext& ctx, Real* dinp, Real* dweight, Real* dbias,
                      const Real* dout, const Real* inp, const Real* weight, int64_t N, int64_t C,
                      int64_t OC, bool accumulate);

// Causal multi-head self-attention. qkv (B, T, 3C): q, k, v side by side, head h in columns
// [h*hd, (h+1)*hd) of each. att (B, NH, T, T) receives the softmax probabilities (above the
// diagonal: 0); out (B, T, C) the heads' outputs side by side. Scores are scaled by
// 1 / sqrt(hd).
template <typename Real>
Status AttentionForward(const KernelContext& ctx, Real* out, Real* att, const Real* qkv, int64_t B,
                        int64_t T, int64_t C, int64_t NH);
// dqkv (B, T, 3C) OVERWRITTEN. datt (B, NH, T, T) is scratch.
template <typename Real>
Status AttentionBackward(const KernelContext& ctx, Real* dqkv, Real* datt, const Real* dout,
                         const Real* qkv, const Real* att, int64_t B, int64_t T, int64_t C,
                         int64_t NH);

// GELU, the tanh approximation of GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename Real>
void GeluForward(Real* out, const Real* inp, int64_t n);
// dinp OVERWRITTEN with gelu'(inp) * dout; dinp may be dout (in place).
template <typename Real>
void GeluBackward(Real* dinp, const Real* inp, const Real* dout, int64_t n);

// out = a + b, element-wise over n.
template <typename Real>
void ResidualForward(Real* out, const Real* a, const Real* b, int64_t n);

// Cross-entropy of logits (N, V) against targets (N), each in [0, V). Writes each row's loss
// to losses (N) and returns their sum. With `grad_scale` != 0, also OVERWRITES logits with
// the gradient of grad_scale * sum(losses): grad_scale * (softmax(row) - onehot(target)).
template <typename Real>
double CrossEntropy(Real* logits, Real* losses, const int32_t* targets, int64_t N, int64_t V,
                    Real grad_scale);

// Vocabulary-parallel cross-entropy (Megatron's): logits (N, Vl) are columns [v0, v0 + Vl) of
// the whole, the first `valid` of them real (the rest padding, ignored), in three steps around
// two all-reduces over the group. CrossEntropyMax writes each row's largest logit to mx (N),
// to be all-reduced with max; CrossEntropySums writes each row's sum of exp(logit - mx) and
// its target's logit (0 where another rank holds the target) to sums (N, 2), to be
// all-reduced with sum; CrossEntropyFinish then gives each row's loss (losses, N), returns
// their sum and, with grad_scale != 0, OVERWRITES the logits with their gradient as
// CrossEntropy does (padding: 0). With the whole vocabulary on one rank (v0 = 0,
// Vl = valid = V) the three give exactly CrossEntropy's values.
template <typename Real>
void CrossEntropyMax(const Real* logits, Real* mx, int64_t N, int64_t Vl, int64_t valid);
template <typename Real>
void CrossEntropySums(const Real* logits, const Real* mx, const int32_t* targets, int64_t v0,
                      int64_t N, int64_t Vl, int64_t valid, Real* sums);
template <typename Real>
double CrossEntropyFinish(Real* logits, Real* losses, const Real* mx, const Real* sums,
                          const int32_t* targets, int64_t v0, int64_t N, int64_t Vl, int64_t valid,
                          Real grad_scale);

}  // namespace kc::parallel
