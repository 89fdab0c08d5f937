#include "parallel/cuda/cuda_gpt_kernels.h"

#include <algorithm>
#include <climits>
#include <string>

#include "base/check.h"

namespace kc::parallel {
namespace {

// The kernels, in the order of gpt_kernels.h, after hal::KernelPrelude() (bf16_t, bf2f, f2bf,
// GRID_STRIDE). Compiled with KC_BF16=0 or 1 (the type of activations); nothing is #included.
// Reductions accumulate in fp32; bf16 values widen exactly and round to nearest even once when
// stored.
constexpr const char* kSource = R"CUDA(
#if KC_BF16
typedef bf16_t act_t;
__device__ __forceinline__ float ld(act_t x) { return bf2f(x); }
__device__ __forceinline__ act_t st(float f) { return f2bf(f); }
#else
typedef float act_t;
__device__ __forceinline__ float ld(act_t x) { return x; }
__device__ __forceinline__ act_t st(float f) { return f; }
#endif
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Over the whole block (blockDim.x a multiple of 32, at most 1024; blockDim.y == 1); every
// thread gets the result. `shared` holds 32 floats.
__device__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // the previous reduction's readers are done with `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? shared[lane] : 0.0f);
}
__device__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? shared[lane] : NEG_INF);
}

// out (BT, C) = wte[inp] + wpe[t].
extern "C" __global__ void gpt_encoder_forward(act_t* out, const int* inp, const float* wte,
                                               const float* wpe, int BT, int T, int C) {
  GRID_STRIDE(i, (u64)BT * C) {
    const int bt = (int)(i / C), c = (int)(i % C), t = bt % T;
    out[i] = st(wte[(u64)inp[bt] * C + c] + wpe[(u64)t * C + c]);
  }
}
extern "C" __global__ void gpt_encoder_backward(float* dwte, float* dwpe, const act_t* dout,
                                                const int* inp, int BT, int T, int C) {
  GRID_STRIDE(i, (u64)BT * C) {
    const int bt = (int)(i / C), c = (int)(i % C), t = bt % T;
    const float d = ld(dout[i]);
    atomicAdd(&dwte[(u64)inp[bt] * C + c], d);
    atomicAdd(&dwpe[(u64)t * C + c], d);
  }
}

// One warp per row.
extern "C" __global__ void gpt_layernorm_forward(act_t* out, float* mean, float* rstd,
                                                 const act_t* inp, const float* w, const float* b,
                                                 int N, int C, float eps) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= N) return;
  const act_t* x = inp + (u64)row * C;
  float s = 0.0f;
  for (int i = lane; i < C; i += 32) s += ld(x[i]);
  const float m = warp_sum(s) / (float)C;
  float v = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float d = ld(x[i]) - m;
    v += d * d;
  }
  v = warp_sum(v) / (float)C;
  const float r = 1.0f / sqrtf(v + eps);
  act_t* o = out + (u64)row * C;
  for (int i = lane; i < C; i += 32) o[i] = st((ld(x[i]) - m) * r * w[i] + b[i]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}
// The input gradient, one warp per row (llm.c's two reductions).
extern "C" __global__ void gpt_layernorm_backward(act_t* dinp, const act_t* dout, const act_t* inp,
                                                  const float* w, const float* mean,
                                                  const float* rstd, int N, int C, int overwrite) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= N) return;
  const act_t* x = inp + (u64)row * C;
  const act_t* d = dout + (u64)row * C;
  act_t* di = dinp + (u64)row * C;
  const float m = mean[row], s = rstd[row];
  float a = 0.0f, bn = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float norm = (ld(x[i]) - m) * s;
    const float dn = w[i] * ld(d[i]);
    a += dn;
    bn += dn * norm;
  }
  a = warp_sum(a) / (float)C;
  bn = warp_sum(bn) / (float)C;
  for (int i = lane; i < C; i += 32) {
    const float norm = (ld(x[i]) - m) * s;
    const float g = (w[i] * ld(d[i]) - a - norm * bn) * s;
    di[i] = st(overwrite ? g : ld(di[i]) + g);
  }
}
// Column sums over a chunk of rows per block: block (32, 8), grid (ceil(C / 32), chunks).
// dw[c] += sum_r dout[r, c] * norm[r, c]; db[c] += sum_r dout[r, c].
extern "C" __global__ void gpt_layernorm_param_backward(float* dw, float* db, const act_t* dout,
                                                        const act_t* inp, const float* mean,
                                                        const float* rstd, int N, int C,
                                                        int rows_per_block) {
  __shared__ float sw[8][33];
  __shared__ float sb[8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  const int r0 = blockIdx.y * rows_per_block;
  const int r1 = min(N, r0 + rows_per_block);
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
    for (int r = r0 + ty; r < r1; r += 8) {
      const float d = ld(dout[(u64)r * C + c]);
      aw += (ld(inp[(u64)r * C + c]) - mean[r]) * rstd[r] * d;
      ab += d;
    }
  }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && c < C) {
    for (int k = 1; k < 8; ++k) {
      aw += sw[k][tx];
      ab += sb[k][tx];
    }
    atomicAdd(&dw[c], aw);
    atomicAdd(&db[c], ab);
  }
}
extern "C" __global__ void gpt_column_sum(float* out, const act_t* in, int N, int OC,
                                          int rows_per_block) {
  __shared__ float s[8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  const int r0 = blockIdx.y * rows_per_block;
  const int r1 = min(N, r0 + rows_per_block);
  float a = 0.0f;
  if (c < OC) {
    for (int r = r0 + ty; r < r1; r += 8) a += ld(in[(u64)r * OC + c]);
  }
  s[ty][tx] = a;
  __syncthreads();
  if (ty == 0 && c < OC) {
    for (int k = 1; k < 8; ++k) a += s[k][tx];
    atomicAdd(&out[c], a);
  }
}

extern "C" __global__ void gpt_add_bias(act_t* out, const float* bias, int N, int OC) {
  GRID_STRIDE(i, (u64)N * OC) out[i] = st(ld(out[i]) + bias[i % OC]);
}
extern "C" __global__ void gpt_residual_forward(act_t* out, const act_t* a, const act_t* b, u64 n) {
  GRID_STRIDE(i, n) out[i] = st(ld(a[i]) + ld(b[i]));
}

// GELU (tanh), as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
#define GELU_S 0.7978845608028654f
#define GELU_C 0.044715f
extern "C" __global__ void gpt_gelu_forward(act_t* out, const act_t* inp, u64 n) {
  GRID_STRIDE(i, n) {
    const float x = ld(inp[i]);
    out[i] = st(x / (1.0f + expf(-1.5957691216057308f * (x + GELU_C * x * x * x))));
  }
}
extern "C" __global__ void gpt_gelu_backward(act_t* dinp, const act_t* inp, const act_t* dout,
                                             u64 n) {
  GRID_STRIDE(i, n) {
    const float x = ld(inp[i]);
    const float sig = 1.0f / (1.0f + expf(-2.0f * GELU_S * (x + GELU_C * x * x * x)));
    const float local =
        sig + 2.0f * x * sig * (1.0f - sig) * GELU_S * (1.0f + 3.0f * GELU_C * x * x);
    dinp[i] = st(local * ld(dout[i]));
  }
}

// out (B, NH, T, hd) from columns [off + h*hd, off + (h+1)*hd) of the rows (B, T) of width w.
extern "C" __global__ void gpt_split_heads(act_t* out, const act_t* in, int B, int T, int NH,
                                           int hd, int w, int off) {
  GRID_STRIDE(i, (u64)B * NH * T * hd) {
    const int d = (int)(i % hd);
    u64 r = i / hd;
    const int t = (int)(r % T);
    r /= T;
    const int h = (int)(r % NH), b = (int)(r / NH);
    out[i] = in[((u64)b * T + t) * w + off + h * hd + d];
  }
}
extern "C" __global__ void gpt_merge_heads(act_t* out, const act_t* in, int B, int T, int NH,
                                           int hd, int w, int off) {
  GRID_STRIDE(i, (u64)B * NH * T * hd) {
    const int d = (int)(i % hd);
    u64 r = i / hd;
    const int t = (int)(r % T);
    r /= T;
    const int h = (int)(r % NH), b = (int)(r / NH);
    out[((u64)b * T + t) * w + off + h * hd + d] = in[i];
  }
}

// One warp per row of T scores; row r is position r % T.
extern "C" __global__ void gpt_softmax_causal_forward(act_t* att, int rows, int T) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int t = row % T;
  act_t* x = att + (u64)row * T;
  float mx = NEG_INF;
  for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, ld(x[j]));
  mx = warp_max(mx);
  float s = 0.0f;
  for (int j = lane; j <= t; j += 32) s += expf(ld(x[j]) - mx);
  const float inv = 1.0f / warp_sum(s);
  for (int j = lane; j < T; j += 32) x[j] = st(j <= t ? expf(ld(x[j]) - mx) * inv : 0.0f);
}
extern "C" __global__ void gpt_softmax_causal_backward(act_t* datt, const act_t* att, int rows,
                                                       int T) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int t = row % T;
  const act_t* a = att + (u64)row * T;
  act_t* d = datt + (u64)row * T;
  float dot = 0.0f;
  for (int j = lane; j <= t; j += 32) dot += ld(a[j]) * ld(d[j]);
  dot = warp_sum(dot);
  for (int j = lane; j < T; j += 32) d[j] = st(j <= t ? ld(a[j]) * (ld(d[j]) - dot) : 0.0f);
}

// One block per row.
extern "C" __global__ void gpt_crossentropy(act_t* logits, float* losses, const int* targets,
                                            int N, int V, int ldv, float grad_scale) {
  __shared__ float shared[32];
  const int row = blockIdx.x;
  act_t* x = logits + (u64)row * ldv;
  float mx = NEG_INF;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, ld(x[j]));
  mx = block_max(mx, shared);
  float s = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(ld(x[j]) - mx);
  s = block_sum(s, shared);
  const int target = targets[row];
  const float xt = ld(x[target]);
  if (threadIdx.x == 0) losses[row] = logf(s) + mx - xt;
  if (grad_scale == 0.0f) return;
  __syncthreads();  // every thread has read x[target] before it is overwritten
  const float inv = 1.0f / s;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float g = grad_scale * expf(ld(x[j]) - mx) * inv;
    if (j == target) g -= grad_scale;
    x[j] = st(g);
  }
}

extern "C" __global__ void gpt_squared_sum(float* partials, const float* x, u64 n) {
  __shared__ float shared[32];
  float s = 0.0f;
  GRID_STRIDE(i, n) {
    const float v = x[i];
    s += v * v;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// torch.optim.AdamW over the arena; `bounds` cut it into tensors, `decay` marks the decayed.
extern "C" __global__ void gpt_adamw(float* p, act_t* p_act, const float* g, float* m, float* v,
                                     const long long* bounds, const unsigned char* decay,
                                     int tensors, u64 n, float b1, float b2, float eps,
                                     float step_size, float inv_sqrt_c2, float scale, float keep) {
  GRID_STRIDE(i, n) {
    int lo = 0, hi = tensors - 1;  // the last tensor whose bound is <= i
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (bounds[mid] <= (long long)i) lo = mid; else hi = mid - 1;
    }
    const float gi = g[i] * scale;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i] * (decay[lo] ? keep : 1.0f) - step_size * mi / (sqrtf(vi) * inv_sqrt_c2 + eps);
    p[i] = pi;
    if (p_act != 0) p_act[i] = st(pi);
  }
}
)CUDA";

constexpr uint32_t kBlock = 256;
constexpr int kRowsPerBlock = 256;  // of the column-sum kernels

Status CheckInt(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) {
    return InvalidArgumentError(std::string("cuda gpt kernels: ") + what + "=" + std::to_string(v) +
                                " does not fit in int32");
  }
  return OkStatus();
}

uint32_t Blocks(int64_t n, int64_t per_block) {
  return static_cast<uint32_t>(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, 65536));
}

}  // namespace

hal::KernelSource CudaGptKernels::Source(Precision precision) {
  return {.name = precision == Precision::kBf16 ? "gpt_kernels_bf16" : "gpt_kernels_fp32",
          .code = std::string(hal::KernelPrelude()) + kSource,
          .options = {precision == Precision::kBf16 ? "-DKC_BF16=1" : "-DKC_BF16=0"}};
}

Result<std::unique_ptr<CudaGptKernels>> CudaGptKernels::Create(hal::ComputeDevice* device,
                                                               Precision precision) {
  KC_ASSIGN_OR_RETURN(std::unique_ptr<hal::KernelModule> module,
                      hal::CompileKernels(*device, Source(precision)));
  return std::unique_ptr<CudaGptKernels>(new CudaGptKernels(precision, std::move(module)));
}

Result<hal::KernelFunction> CudaGptKernels::Get(const char* name) {
  auto it = functions_.find(name);
  if (it != functions_.end()) return it->second;
  KC_ASSIGN_OR_RETURN(hal::KernelFunction fn, module_->Function(name));
  functions_.emplace(name, fn);
  return fn;
}

template <typename... Args>
Status CudaGptKernels::Run(hal::Stream& s, const char* name, const hal::LaunchShape& shape,
                           const Args&... args) {
  KC_ASSIGN_OR_RETURN(hal::KernelFunction fn, Get(name));
  return hal::Launch(s, fn, shape, args...);
}

template <typename... Args>
Status CudaGptKernels::RunElementwise(hal::Stream& s, const char* name, int64_t n,
                                      const Args&... args) {
  if (n == 0) return OkStatus();
  return Run(s, name, {.grid_x = Blocks(n, kBlock), .block_x = kBlock}, args...);
}

Status CudaGptKernels::EncoderForward(hal::Stream& s, void* out, const int32_t* inp,
                                      const float* wte, const float* wpe, int64_t B, int64_t T,
                                      int64_t C) {
  KC_RETURN_IF_ERROR(CheckInt(B * T, "B*T"));
  const int bt = static_cast<int>(B * T), t = static_cast<int>(T), c = static_cast<int>(C);
  return RunElementwise(s, "gpt_encoder_forward", B * T * C, out, inp, wte, wpe, bt, t, c);
}

Status CudaGptKernels::EncoderBackward(hal::Stream& s, float* dwte, float* dwpe, const void* dout,
                                       const int32_t* inp, int64_t B, int64_t T, int64_t C) {
  KC_RETURN_IF_ERROR(CheckInt(B * T, "B*T"));
  const int bt = static_cast<int>(B * T), t = static_cast<int>(T), c = static_cast<int>(C);
  return RunElementwise(s, "gpt_encoder_backward", B * T * C, dwte, dwpe, dout, inp, bt, t, c);
}

Status CudaGptKernels::LayerNormForward(hal::Stream& s, void* out, float* mean, float* rstd,
                                        const void* inp, const float* weight, const float* bias,
                                        int64_t N, int64_t C, float eps) {
  KC_RETURN_IF_ERROR(CheckInt(N, "N"));
  const int n = static_cast<int>(N), c = static_cast<int>(C);
  return Run(s, "gpt_layernorm_forward", {.grid_x = Blocks(N, kBlock / 32), .block_x = kBlock}, out,
             mean, rstd, inp, weight, bias, n, c, eps);
}

Status CudaGptKernels::LayerNormBackward(hal::Stream& s, void* dinp, float* dweight, float* dbias,
                                         const void* dout, const void* inp, const float* weight,
                                         const float* mean, const float* rstd, int64_t N, int64_t C,
                                         bool overwrite) {
  KC_RETURN_IF_ERROR(CheckInt(N, "N"));
  const int n = static_cast<int>(N), c = static_cast<int>(C), ow = overwrite ? 1 : 0;
  KC_RETURN_IF_ERROR(Run(s, "gpt_layernorm_backward",
                         {.grid_x = Blocks(N, kBlock / 32), .block_x = kBlock}, dinp, dout, inp,
                         weight, mean, rstd, n, c, ow));
  const int rows = kRowsPerBlock;
  return Run(s, "gpt_layernorm_param_backward",
             {.grid_x = Blocks(C, 32),
              .grid_y = static_cast<uint32_t>((N + rows - 1) / rows),
              .block_x = 32,
              .block_y = 8},
             dweight, dbias, dout, inp, mean, rstd, n, c, rows);
}

Status CudaGptKernels::AddBias(hal::Stream& s, void* out, const float* bias, int64_t N,
                               int64_t OC) {
  KC_RETURN_IF_ERROR(CheckInt(N, "N"));
  const int n = static_cast<int>(N), oc = static_cast<int>(OC);
  return RunElementwise(s, "gpt_add_bias", N * OC, out, bias, n, oc);
}

Status CudaGptKernels::BiasBackward(hal::Stream& s, float* dbias, const void* dout, int64_t N,
                                    int64_t OC) {
  KC_RETURN_IF_ERROR(CheckInt(N, "N"));
  if (N == 0) return OkStatus();
  const int n = static_cast<int>(N), oc = static_cast<int>(OC), rows = kRowsPerBlock;
  return Run(s, "gpt_column_sum",
             {.grid_x = Blocks(OC, 32),
              .grid_y = static_cast<uint32_t>((N + rows - 1) / rows),
              .block_x = 32,
              .block_y = 8},
             dbias, dout, n, oc, rows);
}

Status CudaGptKernels::Residual(hal::Stream& s, void* out, const void* a, const void* b,
                                int64_t n) {
  const unsigned long long count = static_cast<unsigned long long>(n);
  return RunElementwise(s, "gpt_residual_forward", n, out, a, b, count);
}

Status CudaGptKernels::GeluForward(hal::Stream& s, void* out, const void* inp, int64_t n) {
  const unsigned long long count = static_cast<unsigned long long>(n);
  return RunElementwise(s, "gpt_gelu_forward", n, out, inp, count);
}

Status CudaGptKernels::GeluBackward(hal::Stream& s, void* dinp, const void* inp, const void* dout,
                                    int64_t n) {
  const unsigned long long count = static_cast<unsigned long long>(n);
  return RunElementwise(s, "gpt_gelu_backward", n, dinp, inp, dout, count);
}

Status CudaGptKernels::Heads(hal::Stream& s, const char* kernel, void* out, const void* in,
                             int64_t B, int64_t T, int64_t NH, int64_t hd, int64_t ld,
                             int64_t offset) {
  KC_RETURN_IF_ERROR(CheckInt(B * T * ld, "B*T*ld"));
  const int b = static_cast<int>(B), t = static_cast<int>(T), nh = static_cast<int>(NH),
            h = static_cast<int>(hd), w = static_cast<int>(ld), off = static_cast<int>(offset);
  return RunElementwise(s, kernel, B * NH * T * hd, out, in, b, t, nh, h, w, off);
}

Status CudaGptKernels::SplitHeads(hal::Stream& s, void* out, const void* in, int64_t B, int64_t T,
                                  int64_t NH, int64_t hd, int64_t ld, int64_t offset) {
  return Heads(s, "gpt_split_heads", out, in, B, T, NH, hd, ld, offset);
}

Status CudaGptKernels::MergeHeads(hal::Stream& s, void* out, const void* in, int64_t B, int64_t T,
                                  int64_t NH, int64_t hd, int64_t ld, int64_t offset) {
  return Heads(s, "gpt_merge_heads", out, in, B, T, NH, hd, ld, offset);
}

Status CudaGptKernels::SoftmaxCausalForward(hal::Stream& s, void* att, int64_t rows, int64_t T) {
  KC_RETURN_IF_ERROR(CheckInt(rows, "rows"));
  const int r = static_cast<int>(rows), t = static_cast<int>(T);
  return Run(s, "gpt_softmax_causal_forward",
             {.grid_x = Blocks(rows, kBlock / 32), .block_x = kBlock}, att, r, t);
}

Status CudaGptKernels::SoftmaxCausalBackward(hal::Stream& s, void* datt, const void* att,
                                             int64_t rows, int64_t T) {
  KC_RETURN_IF_ERROR(CheckInt(rows, "rows"));
  const int r = static_cast<int>(rows), t = static_cast<int>(T);
  return Run(s, "gpt_softmax_causal_backward",
             {.grid_x = Blocks(rows, kBlock / 32), .block_x = kBlock}, datt, att, r, t);
}

Status CudaGptKernels::CrossEntropy(hal::Stream& s, void* logits, float* losses,
                                    const int32_t* targets, int64_t N, int64_t V, int64_t ldv,
                                    float grad_scale) {
  KC_RETURN_IF_ERROR(CheckInt(N, "N"));
  KC_RETURN_IF_ERROR(CheckInt(ldv, "ldv"));
  if (N == 0) return OkStatus();
  const int n = static_cast<int>(N), v = static_cast<int>(V), l = static_cast<int>(ldv);
  const uint32_t block = V >= 4096 ? 1024 : 256;
  return Run(s, "gpt_crossentropy", {.grid_x = static_cast<uint32_t>(N), .block_x = block}, logits,
             losses, targets, n, v, l, grad_scale);
}

Status CudaGptKernels::SquaredSumPartials(hal::Stream& s, float* partials, int64_t blocks,
                                          const float* x, int64_t n) {
  KC_CHECK(blocks >= 1 && blocks <= 65536);
  const unsigned long long count = static_cast<unsigned long long>(n);
  return Run(s, "gpt_squared_sum", {.grid_x = static_cast<uint32_t>(blocks), .block_x = kBlock},
             partials, x, count);
}

Status CudaGptKernels::AdamW(hal::Stream& s, const CudaAdamWArgs& a) {
  const unsigned long long n = static_cast<unsigned long long>(a.n);
  const long long* bounds = reinterpret_cast<const long long*>(a.bounds);
  const unsigned char* decay = a.decay;
  return RunElementwise(s, "gpt_adamw", a.n, a.params, a.params_act, a.grads, a.m, a.v, bounds,
                        decay, a.tensors, n, a.beta1, a.beta2, a.eps, a.step_size, a.inv_sqrt_c2,
                        a.grad_scale, a.keep);
}

}  // namespace kc::parallel
