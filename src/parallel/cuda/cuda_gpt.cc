#include "parallel/cuda/cuda_gpt.h"

#include <cmath>
#include <string>
#include <utility>

#include "base/check.h"
#include "base/layer_guard.h"
#include "hal/kernels.h"
#include "parallel/gpt_model.h"

namespace kc::parallel {
namespace {

constexpr int64_t kNormBlocks = 1024;  // GradSquaredNorm's partial sums
constexpr size_t kAlign = 256;

// Lays regions out in one buffer: a first pass counts (base null), the second hands out
// pointers into the allocated buffer.
class Layout {
 public:
  explicit Layout(void* base) : base_(static_cast<std::byte*>(base)) {}
  void* Take(int64_t count, size_t element_bytes) {
    used_ = (used_ + kAlign - 1) / kAlign * kAlign;
    void* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += static_cast<size_t>(count) * element_bytes;
    return p;
  }
  float* F32(int64_t count) { return static_cast<float*>(Take(count, sizeof(float))); }
  size_t used() const { return used_; }

 private:
  std::byte* base_;
  size_t used_ = 0;
};

// Elements one batch of `batch` row-major (rows, cols) matrices with leading dimension ld,
// `stride` apart, spans.
int64_t Span(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

}  // namespace

CudaGpt::~CudaGpt() = default;

Result<std::unique_ptr<CudaGpt>> CudaGpt::Create(const ModelSpec& spec, hal::ComputeDevice* device,
                                                 const Options& options) {
  KC_LAYER_ENTRY(Layer::kParallel, "model");
  KC_CHECK(device != nullptr);
  KC_RETURN_IF_ERROR(ValidateModelSpec(spec));
  const int64_t batch = options.batch > 0 ? options.batch : spec.batch_per_rank;
  if (batch < 1) {
    return InvalidArgumentError("model " + spec.name + ": batch " + std::to_string(batch) +
                                " must be at least 1");
  }
  std::unique_ptr<CudaGpt> m(new CudaGpt(spec, batch, device, options.timeout));
  KC_ASSIGN_OR_RETURN(m->kernels_, CudaGptKernels::Create(device, options.precision));
  m->act_bytes_ = m->kernels_->act_bytes();
  KC_RETURN_IF_ERROR(m->Allocate());
  KC_RETURN_IF_ERROR(m->ZeroGradients());
  KC_RETURN_IF_ERROR(m->Synchronize());
  return m;
}

Status CudaGpt::Allocate() {
  const int64_t L = spec_.layers, C = spec_.hidden, F = spec_.ffn_hidden, NH = spec_.heads,
                T = spec_.seq_len, B = batch_, BT = B * T, V = spec_.vocab;
  tensors_ = ParameterTensors(spec_);
  num_parameters_ = tensors_.back().offset + tensors_.back().num_elements;
  head_ = spec_.tied_embeddings ? 0 : static_cast<int>(tensors_.size()) - 1;
  lnf_ = 2 + static_cast<int>(L) * kTensorsPerLayer;
  KC_CHECK(tensors_[static_cast<size_t>(lnf_)].name == "lnf.weight");
  vocab_ld_ = (V + 63) / 64 * 64;
  const bool bf16 = precision() == Precision::kBf16;
  const size_t a = act_bytes_;

  // fp32: master weights, gradients, statistics, losses, norm partials.
  auto lay_f32 = [&](Layout& f) {
    params_ = hal::DeviceSpan<float>(f.F32(num_parameters_), static_cast<size_t>(num_parameters_),
                                     device_->id());
    grads_ = hal::DeviceSpan<float>(f.F32(num_parameters_), static_cast<size_t>(num_parameters_),
                                    device_->id());
    layers_.assign(static_cast<size_t>(L), LayerActs{});
    for (LayerActs& la : layers_) {
      la.ln1_mean = f.F32(BT);
      la.ln1_rstd = f.F32(BT);
      la.ln2_mean = f.F32(BT);
      la.ln2_rstd = f.F32(BT);
    }
    lnf_mean_ = f.F32(BT);
    lnf_rstd_ = f.F32(BT);
    losses_ = f.F32(BT);
    partials_ = f.F32(kNormBlocks);
  };
  // Activations (and the bf16 weights).
  auto lay_act = [&](Layout& x) {
    if (bf16) {
      params_bf16_ =
          hal::DeviceSpan<hal::Bf16>(static_cast<hal::Bf16*>(x.Take(num_parameters_, 2)),
                                     static_cast<size_t>(num_parameters_), device_->id());
    }
    const size_t before = x.used();
    resid_.assign(static_cast<size_t>(L + 1), nullptr);
    resid_[0] = x.Take(BT * C, a);
    for (int64_t l = 0; l < L; ++l) {
      LayerActs& la = layers_[static_cast<size_t>(l)];
      la.ln1 = x.Take(BT * C, a);
      la.q = x.Take(BT * C, a);
      la.k = x.Take(BT * C, a);
      la.v = x.Take(BT * C, a);
      la.att = x.Take(B * NH * T * T, a);
      la.atty = x.Take(BT * C, a);
      la.res2 = x.Take(BT * C, a);
      la.ln2 = x.Take(BT * C, a);
      la.fch = x.Take(BT * F, a);
      la.fchg = x.Take(BT * F, a);
      resid_[static_cast<size_t>(l + 1)] = x.Take(BT * C, a);
    }
    lnf_out_ = x.Take(BT * C, a);
    logits_ = x.Take(BT * vocab_ld_, a);
    activation_bytes_ = static_cast<int64_t>(x.used() - before);
    qkv_ = x.Take(BT * 3 * C, a);
    y_ = x.Take(BT * C, a);
    tmp_ = x.Take(BT * C, a);
    dres_ = x.Take(BT * C, a);
    dfch_ = x.Take(BT * F, a);
    datt_ = x.Take(B * NH * T * T, a);
    dq_ = x.Take(BT * C, a);
    dk_ = x.Take(BT * C, a);
    dv_ = x.Take(BT * C, a);
  };
  Layout count_f32(nullptr), count_act(nullptr);
  lay_f32(count_f32);
  lay_act(count_act);
  KC_ASSIGN_OR_RETURN(f32_arena_, device_->Allocate(count_f32.used(), kAlign));
  KC_ASSIGN_OR_RETURN(act_arena_, device_->Allocate(count_act.used(), kAlign));
  KC_ASSIGN_OR_RETURN(i32_arena_,
                      device_->Allocate(2 * static_cast<size_t>(BT) * 4 + kAlign, kAlign));
  Layout f32(f32_arena_.data()), act(act_arena_.data());
  lay_f32(f32);
  lay_act(act);
  Layout ints(i32_arena_.data());
  tokens_ = static_cast<int32_t*>(ints.Take(BT, 4));
  targets_ = static_cast<int32_t*>(ints.Take(BT, 4));
  arena_bytes_ = static_cast<int64_t>(f32_arena_.size_bytes() + act_arena_.size_bytes() +
                                      i32_arena_.size_bytes());
  host_losses_.assign(static_cast<size_t>(BT), 0.0f);
  return OkStatus();
}

const void* CudaGpt::W(int i) const {
  if (precision() == Precision::kBf16) {
    return params_bf16_.data() + tensors_[static_cast<size_t>(i)].offset;
  }
  return P(i);
}

Status CudaGpt::InitParameters(uint64_t seed) {
  std::vector<float> values(static_cast<size_t>(num_parameters_));
  for (size_t i = 0; i < tensors_.size(); ++i) {
    InitParameterTensor<float>(
        spec_, static_cast<int>(i), seed,
        std::span<float>(values).subspan(static_cast<size_t>(tensors_[i].offset),
                                         static_cast<size_t>(tensors_[i].num_elements)));
  }
  return SetParameters(values);
}

Status CudaGpt::SetParameters(std::span<const float> values) {
  if (values.size() != static_cast<size_t>(num_parameters_)) {
    return InvalidArgumentError("model " + spec_.name + ": " + std::to_string(values.size()) +
                                " parameter values for " + std::to_string(num_parameters_));
  }
  KC_RETURN_IF_ERROR(hal::CopyHostToDevice<float>(stream(), params_, values));
  KC_RETURN_IF_ERROR(RefreshComputeCopy());
  return Synchronize();
}

Status CudaGpt::GetParameters(std::span<float> values) {
  if (values.size() != static_cast<size_t>(num_parameters_)) {
    return InvalidArgumentError("model " + spec_.name + ": room for " +
                                std::to_string(values.size()) + " parameter values, it has " +
                                std::to_string(num_parameters_));
  }
  KC_RETURN_IF_ERROR(hal::CopyDeviceToHost<float>(stream(), values, params_));
  return Synchronize();
}

Status CudaGpt::RefreshComputeCopy() {
  if (precision() != Precision::kBf16) return OkStatus();
  return hal::ConvertF32ToBf16(stream(), params_bf16_, params_);
}

Status CudaGpt::ZeroGradients() { return hal::Fill(stream(), grads_, 0.0f); }

Status CudaGpt::Synchronize() { return hal::Synchronize(stream(), timeout_); }

Status CudaGpt::Mm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c,
                   hal::DataType c_type, int64_t ldc, int64_t batch, int64_t stride_a,
                   int64_t stride_b, int64_t stride_c) {
  const hal::DataType ab = kernels_->act_type();
  const size_t ab_bytes = act_bytes_, c_bytes = hal::DataTypeSize(c_type);
  const int64_t na = Span(trans_a ? k : m, trans_a ? m : k, lda, batch, stride_a);
  const int64_t nb = Span(trans_b ? n : k, trans_b ? k : n, ldb, batch, stride_b);
  const int64_t nc = Span(m, n, ldc, batch, stride_c);
  const hal::DeviceId id = device_->id();
  return hal::Gemm(stream(),
                   {.trans_a = trans_a ? hal::Transpose::kYes : hal::Transpose::kNo,
                    .trans_b = trans_b ? hal::Transpose::kYes : hal::Transpose::kNo,
                    .m = m,
                    .n = n,
                    .k = k,
                    .alpha = alpha,
                    .ab_type = ab,
                    .a = {static_cast<const std::byte*>(a), static_cast<size_t>(na) * ab_bytes, id},
                    .lda = lda,
                    .b = {static_cast<const std::byte*>(b), static_cast<size_t>(nb) * ab_bytes, id},
                    .ldb = ldb,
                    .beta = beta,
                    .c_type = c_type,
                    .c = {static_cast<std::byte*>(c), static_cast<size_t>(nc) * c_bytes, id},
                    .ldc = ldc,
                    .batch_count = batch,
                    .stride_a = stride_a,
                    .stride_b = stride_b,
                    .stride_c = stride_c});
}

Result<double> CudaGpt::Forward(std::span<const int32_t> inputs, std::span<const int32_t> targets,
                                double grad_scale) {
  KC_LAYER_ENTRY(Layer::kParallel, "model");
  const int64_t BT = tokens(), C = spec_.hidden, V = spec_.vocab, L = spec_.layers;
  if (inputs.size() != static_cast<size_t>(BT) || targets.size() != static_cast<size_t>(BT)) {
    return InvalidArgumentError("model " + spec_.name + ": " + std::to_string(inputs.size()) +
                                " inputs and " + std::to_string(targets.size()) +
                                " targets, expected B*T = " + std::to_string(BT) + " each");
  }
  for (std::span<const int32_t> s : {inputs, targets}) {
    for (int32_t tok : s) {
      if (tok < 0 || tok >= V) {
        return InvalidArgumentError("model " + spec_.name + ": token " + std::to_string(tok) +
                                    " outside the vocabulary [0, " + std::to_string(V) + ")");
      }
    }
  }
  hal::Stream& s = stream();
  const hal::DeviceId id = device_->id();
  KC_RETURN_IF_ERROR(hal::CopyHostToDevice<int32_t>(
      s, hal::DeviceSpan<int32_t>(tokens_, static_cast<size_t>(BT), id), inputs));
  KC_RETURN_IF_ERROR(hal::CopyHostToDevice<int32_t>(
      s, hal::DeviceSpan<int32_t>(targets_, static_cast<size_t>(BT), id), targets));
  KC_RETURN_IF_ERROR(
      kernels_->EncoderForward(s, resid_[0], tokens_, P(0), P(1), batch_, spec_.seq_len, C));
  for (int64_t l = 0; l < L; ++l) KC_RETURN_IF_ERROR(LayerForward(l));
  KC_RETURN_IF_ERROR(kernels_->LayerNormForward(s, lnf_out_, lnf_mean_, lnf_rstd_,
                                                resid_[static_cast<size_t>(L)], P(lnf_),
                                                P(lnf_ + 1), BT, C, spec_.layernorm_eps));
  // logits (BT, V) = lnf (BT, C) * head^T (C, V), rows vocab_ld_ apart.
  KC_RETURN_IF_ERROR(Mm(false, true, BT, V, C, 1.0f, lnf_out_, C, W(head_), C, 0.0f, logits_,
                        kernels_->act_type(), vocab_ld_));
  KC_RETURN_IF_ERROR(kernels_->CrossEntropy(s, logits_, losses_, targets_, BT, V, vocab_ld_,
                                            static_cast<float>(grad_scale)));
  KC_RETURN_IF_ERROR(hal::CopyDeviceToHost<float>(
      s, host_losses_, hal::DeviceSpan<const float>(losses_, static_cast<size_t>(BT), id)));
  KC_RETURN_IF_ERROR(Synchronize().WithContext("model " + spec_.name + " forward"));
  have_grad_ = grad_scale != 0;
  double sum = 0;
  for (float loss : host_losses_) sum += static_cast<double>(loss);
  return sum / static_cast<double>(BT);
}

Status CudaGpt::LayerForward(int64_t l) {
  hal::Stream& s = stream();
  const int64_t C = spec_.hidden, F = spec_.ffn_hidden, NH = spec_.heads, T = spec_.seq_len,
                B = batch_, BT = B * T, hd = C / NH;
  const hal::DataType act = kernels_->act_type();
  const LayerActs& la = layers_[static_cast<size_t>(l)];
  const void* x = resid_[static_cast<size_t>(l)];
  auto idx = [&](LayerTensor t) { return LayerIndex(l, t); };
  const float eps = spec_.layernorm_eps;
  // Attention: LayerNorm, the qkv product, heads apart, causal softmax of the scaled scores.
  KC_RETURN_IF_ERROR(kernels_->LayerNormForward(s, la.ln1, la.ln1_mean, la.ln1_rstd, x,
                                                P(idx(kLn1W)), P(idx(kLn1B)), BT, C, eps));
  KC_RETURN_IF_ERROR(
      Mm(false, true, BT, 3 * C, C, 1.0f, la.ln1, C, W(idx(kQkvW)), C, 0.0f, qkv_, act, 3 * C));
  KC_RETURN_IF_ERROR(kernels_->AddBias(s, qkv_, P(idx(kQkvB)), BT, 3 * C));
  KC_RETURN_IF_ERROR(kernels_->SplitHeads(s, la.q, qkv_, B, T, NH, hd, 3 * C, 0));
  KC_RETURN_IF_ERROR(kernels_->SplitHeads(s, la.k, qkv_, B, T, NH, hd, 3 * C, C));
  KC_RETURN_IF_ERROR(kernels_->SplitHeads(s, la.v, qkv_, B, T, NH, hd, 3 * C, 2 * C));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  KC_RETURN_IF_ERROR(Mm(false, true, T, T, hd, scale, la.q, hd, la.k, hd, 0.0f, la.att, act, T,
                        B * NH, T * hd, T * hd, T * T));
  KC_RETURN_IF_ERROR(kernels_->SoftmaxCausalForward(s, la.att, B * NH * T, T));
  KC_RETURN_IF_ERROR(Mm(false, false, T, hd, T, 1.0f, la.att, T, la.v, hd, 0.0f, y_, act, hd,
                        B * NH, T * T, T * hd, T * hd));
  KC_RETURN_IF_ERROR(kernels_->MergeHeads(s, la.atty, y_, B, T, NH, hd, C, 0));
  // The projection and the residual.
  KC_RETURN_IF_ERROR(
      Mm(false, true, BT, C, C, 1.0f, la.atty, C, W(idx(kProjW)), C, 0.0f, tmp_, act, C));
  KC_RETURN_IF_ERROR(kernels_->AddBias(s, tmp_, P(idx(kProjB)), BT, C));
  KC_RETURN_IF_ERROR(kernels_->Residual(s, la.res2, x, tmp_, BT * C));
  // The MLP and the residual.
  KC_RETURN_IF_ERROR(kernels_->LayerNormForward(s, la.ln2, la.ln2_mean, la.ln2_rstd, la.res2,
                                                P(idx(kLn2W)), P(idx(kLn2B)), BT, C, eps));
  KC_RETURN_IF_ERROR(
      Mm(false, true, BT, F, C, 1.0f, la.ln2, C, W(idx(kFcW)), C, 0.0f, la.fch, act, F));
  KC_RETURN_IF_ERROR(kernels_->AddBias(s, la.fch, P(idx(kFcB)), BT, F));
  KC_RETURN_IF_ERROR(kernels_->GeluForward(s, la.fchg, la.fch, BT * F));
  KC_RETURN_IF_ERROR(
      Mm(false, true, BT, C, F, 1.0f, la.fchg, F, W(idx(kFcProjW)), F, 0.0f, tmp_, act, C));
  KC_RETURN_IF_ERROR(kernels_->AddBias(s, tmp_, P(idx(kFcProjB)), BT, C));
  return kernels_->Residual(s, resid_[static_cast<size_t>(l + 1)], la.res2, tmp_, BT * C);
}

Status CudaGpt::Backward() {
  KC_LAYER_ENTRY(Layer::kParallel, "model");
  if (!have_grad_) {
    return FailedPreconditionError("model " + spec_.name +
                                   ": Backward needs a training Forward (grad_scale != 0) first");
  }
  have_grad_ = false;
  hal::Stream& s = stream();
  const int64_t BT = tokens(), C = spec_.hidden, V = spec_.vocab, L = spec_.layers;
  // The LM head: the gradient of lnf's output, and the head's weight gradient.
  KC_RETURN_IF_ERROR(Mm(false, false, BT, C, V, 1.0f, logits_, vocab_ld_, W(head_), C, 0.0f, tmp_,
                        kernels_->act_type(), C));
  KC_RETURN_IF_ERROR(Mm(true, false, V, C, BT, 1.0f, logits_, vocab_ld_, lnf_out_, C, 1.0f,
                        G(head_), hal::DataType::kF32, C));
  KC_RETURN_IF_ERROR(kernels_->LayerNormBackward(s, dres_, G(lnf_), G(lnf_ + 1), tmp_,
                                                 resid_[static_cast<size_t>(L)], P(lnf_), lnf_mean_,
                                                 lnf_rstd_, BT, C, true));
  for (int64_t l = L - 1; l >= 0; --l) KC_RETURN_IF_ERROR(LayerBackward(l));
  return kernels_->EncoderBackward(s, G(0), G(1), dres_, tokens_, batch_, spec_.seq_len, C);
}

Status CudaGpt::LayerBackward(int64_t l) {
  hal::Stream& s = stream();
  const int64_t C = spec_.hidden, F = spec_.ffn_hidden, NH = spec_.heads, T = spec_.seq_len,
                B = batch_, BT = B * T, hd = C / NH;
  const hal::DataType act = kernels_->act_type();
  const hal::DataType f32 = hal::DataType::kF32;
  const LayerActs& la = layers_[static_cast<size_t>(l)];
  const void* x = resid_[static_cast<size_t>(l)];
  auto idx = [&](LayerTensor t) { return LayerIndex(l, t); };
  // dres_ holds the gradient of the layer's output. The MLP: output = res2 + fcproj(gelu(fc)).
  KC_RETURN_IF_ERROR(kernels_->BiasBackward(s, G(idx(kFcProjB)), dres_, BT, C));
  KC_RETURN_IF_ERROR(
      Mm(true, false, C, F, BT, 1.0f, dres_, C, la.fchg, F, 1.0f, G(idx(kFcProjW)), f32, F));
  KC_RETURN_IF_ERROR(
      Mm(false, false, BT, F, C, 1.0f, dres_, C, W(idx(kFcProjW)), F, 0.0f, dfch_, act, F));
  KC_RETURN_IF_ERROR(kernels_->GeluBackward(s, dfch_, la.fch, dfch_, BT * F));
  KC_RETURN_IF_ERROR(kernels_->BiasBackward(s, G(idx(kFcB)), dfch_, BT, F));
  KC_RETURN_IF_ERROR(
      Mm(true, false, F, C, BT, 1.0f, dfch_, F, la.ln2, C, 1.0f, G(idx(kFcW)), f32, C));
  KC_RETURN_IF_ERROR(
      Mm(false, false, BT, C, F, 1.0f, dfch_, F, W(idx(kFcW)), C, 0.0f, tmp_, act, C));
  // Through ln2 into the residual stream: dres_ becomes the gradient of res2.
  KC_RETURN_IF_ERROR(kernels_->LayerNormBackward(s, dres_, G(idx(kLn2W)), G(idx(kLn2B)), tmp_,
                                                 la.res2, P(idx(kLn2W)), la.ln2_mean, la.ln2_rstd,
                                                 BT, C, false));
  // The attention: res2 = x + proj(atty).
  KC_RETURN_IF_ERROR(kernels_->BiasBackward(s, G(idx(kProjB)), dres_, BT, C));
  KC_RETURN_IF_ERROR(
      Mm(true, false, C, C, BT, 1.0f, dres_, C, la.atty, C, 1.0f, G(idx(kProjW)), f32, C));
  KC_RETURN_IF_ERROR(
      Mm(false, false, BT, C, C, 1.0f, dres_, C, W(idx(kProjW)), C, 0.0f, tmp_, act, C));
  KC_RETURN_IF_ERROR(kernels_->SplitHeads(s, y_, tmp_, B, T, NH, hd, C, 0));  // dy
  // datt = dy v^T; dv = att^T dy; the softmax's backward; dq = scale datt k; dk = scale datt^T q.
  KC_RETURN_IF_ERROR(Mm(false, true, T, T, hd, 1.0f, y_, hd, la.v, hd, 0.0f, datt_, act, T, B * NH,
                        T * hd, T * hd, T * T));
  KC_RETURN_IF_ERROR(Mm(true, false, T, hd, T, 1.0f, la.att, T, y_, hd, 0.0f, dv_, act, hd, B * NH,
                        T * T, T * hd, T * hd));
  KC_RETURN_IF_ERROR(kernels_->SoftmaxCausalBackward(s, datt_, la.att, B * NH * T, T));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  KC_RETURN_IF_ERROR(Mm(false, false, T, hd, T, scale, datt_, T, la.k, hd, 0.0f, dq_, act, hd,
                        B * NH, T * T, T * hd, T * hd));
  KC_RETURN_IF_ERROR(Mm(true, false, T, hd, T, scale, datt_, T, la.q, hd, 0.0f, dk_, act, hd,
                        B * NH, T * T, T * hd, T * hd));
  KC_RETURN_IF_ERROR(kernels_->MergeHeads(s, qkv_, dq_, B, T, NH, hd, 3 * C, 0));
  KC_RETURN_IF_ERROR(kernels_->MergeHeads(s, qkv_, dk_, B, T, NH, hd, 3 * C, C));
  KC_RETURN_IF_ERROR(kernels_->MergeHeads(s, qkv_, dv_, B, T, NH, hd, 3 * C, 2 * C));
  // The qkv product and ln1: dres_ becomes the gradient of the layer's input.
  KC_RETURN_IF_ERROR(kernels_->BiasBackward(s, G(idx(kQkvB)), qkv_, BT, 3 * C));
  KC_RETURN_IF_ERROR(
      Mm(true, false, 3 * C, C, BT, 1.0f, qkv_, 3 * C, la.ln1, C, 1.0f, G(idx(kQkvW)), f32, C));
  KC_RETURN_IF_ERROR(
      Mm(false, false, BT, C, 3 * C, 1.0f, qkv_, 3 * C, W(idx(kQkvW)), C, 0.0f, tmp_, act, C));
  return kernels_->LayerNormBackward(s, dres_, G(idx(kLn1W)), G(idx(kLn1B)), tmp_, x, P(idx(kLn1W)),
                                     la.ln1_mean, la.ln1_rstd, BT, C, false);
}

Result<double> CudaGpt::GradSquaredNorm() {
  KC_RETURN_IF_ERROR(kernels_->SquaredSumPartials(stream(), partials_, kNormBlocks, grads_.data(),
                                                  num_parameters_));
  std::vector<float> partials(static_cast<size_t>(kNormBlocks));
  KC_RETURN_IF_ERROR(hal::CopyDeviceToHost<float>(
      stream(), partials, hal::DeviceSpan<const float>(partials_, partials.size(), device_->id())));
  KC_RETURN_IF_ERROR(Synchronize());
  double sum = 0;
  for (float p : partials) sum += static_cast<double>(p);
  return sum;
}

Result<std::unique_ptr<CudaAdamW>> CudaAdamW::Create(const TrainingSpec& training, CudaGpt* model) {
  std::unique_ptr<CudaAdamW> opt(new CudaAdamW(training, model));
  const size_t n = static_cast<size_t>(model->num_parameters());
  hal::ComputeDevice& device = model->device();
  hal::Stream& s = model->stream();
  KC_ASSIGN_OR_RETURN(opt->moments_, device.Allocate(2 * n * sizeof(float)));
  KC_RETURN_IF_ERROR(hal::Fill(s, opt->moments_.As<float>(), 0.0f));
  // The table: bounds (int64) then decay flags, the matrices decayed.
  const std::vector<TensorSpec>& tensors = model->tensors();
  std::vector<int64_t> bounds;
  std::vector<uint8_t> decay;
  for (const TensorSpec& t : tensors) {
    bounds.push_back(t.offset);
    decay.push_back(t.shape.size() == 2 ? 1 : 0);
  }
  bounds.push_back(model->num_parameters());
  const size_t bounds_bytes = bounds.size() * sizeof(int64_t);
  KC_ASSIGN_OR_RETURN(opt->table_, device.Allocate(bounds_bytes + decay.size()));
  KC_RETURN_IF_ERROR(hal::CopyHostToDevice(s, opt->table_.bytes().first(bounds_bytes),
                                           std::as_bytes(std::span<const int64_t>(bounds))));
  KC_RETURN_IF_ERROR(hal::CopyHostToDevice(s,
                                           opt->table_.bytes().subspan(bounds_bytes, decay.size()),
                                           std::as_bytes(std::span<const uint8_t>(decay))));
  KC_RETURN_IF_ERROR(model->Synchronize());
  return opt;
}

Status CudaAdamW::Step(double lr, double grad_scale) {
  ++steps_;
  // As AdamW<float>: the betas rounded to fp32 first, the corrections from them in double.
  const double b1 = static_cast<float>(training_.beta1), b2 = static_cast<float>(training_.beta2);
  const float correction1 = static_cast<float>(1.0 - std::pow(b1, static_cast<double>(steps_)));
  const float correction2 = static_cast<float>(1.0 - std::pow(b2, static_cast<double>(steps_)));
  const int tensors = static_cast<int>(model_->tensors().size());
  const auto* table = static_cast<const std::byte*>(table_.data());
  CudaAdamWArgs args{
      .params = model_->params().data(),
      .params_act =
          model_->precision() == Precision::kBf16 ? model_->compute_params().data() : nullptr,
      .grads = model_->grads().data(),
      .m = moments().data(),
      .v = moments().data() + model_->num_parameters(),
      .bounds = reinterpret_cast<const int64_t*>(table),
      .decay = reinterpret_cast<const uint8_t*>(table + (tensors + 1) * sizeof(int64_t)),
      .tensors = tensors,
      .n = model_->num_parameters(),
      .beta1 = static_cast<float>(b1),
      .beta2 = static_cast<float>(b2),
      .eps = static_cast<float>(training_.eps),
      .step_size = static_cast<float>(lr) / correction1,
      .inv_sqrt_c2 = 1.0f / std::sqrt(correction2),
      .grad_scale = static_cast<float>(grad_scale),
      .keep = static_cast<float>(1.0 - lr * training_.weight_decay)};
  return model_->kernels().AdamW(model_->stream(), args);
}

}  // namespace kc::parallel
