#include "parallel/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <utility>

#include "base/check.h"

namespace kc::parallel {
namespace {

// SplitMix64: the generator behind initialisation, the same on every platform.
uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A uniform double in (0, 1).
double Uniform(uint64_t* state) {
  return (static_cast<double>(SplitMix64(state) >> 11) + 0.5) * 0x1.0p-53;
}

// Fills x with N(0, stddev) values (Box-Muller), deterministic in `seed`.
template <typename Real>
void FillNormal(std::span<Real> x, double stddev, uint64_t seed) {
  uint64_t state = seed;
  for (size_t i = 0; i < x.size(); i += 2) {
    const double r = std::sqrt(-2.0 * std::log(Uniform(&state)));
    const double a = 2.0 * std::numbers::pi * Uniform(&state);
    x[i] = static_cast<Real>(stddev * r * std::cos(a));
    if (i + 1 < x.size()) x[i + 1] = static_cast<Real>(stddev * r * std::sin(a));
  }
}

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Carves aligned regions out of one buffer; a first pass with no base only counts.
class Carver {
 public:
  explicit Carver(std::byte* base) : base_(base) {}
  template <typename T>
  T* Take(int64_t count) {
    constexpr size_t kAlign = hal::ComputeDevice::kDefaultAlignment;
    used_ = (used_ + kAlign - 1) / kAlign * kAlign;
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += static_cast<size_t>(count) * sizeof(T);
    return p;
  }
  size_t used() const { return used_; }

 private:
  std::byte* base_;
  size_t used_ = 0;
};

}  // namespace

template <typename Real>
Gpt<Real>::Gpt(ModelSpec spec, int64_t batch, hal::ComputeDevice* device)
    : spec_(std::move(spec)), batch_(batch), device_(device) {
  ctx_.stream = &device_->default_stream();
  tensors_ = ParameterTensors(spec_);
}

template <typename Real>
Result<std::unique_ptr<Gpt<Real>>> Gpt<Real>::Create(const ModelSpec& spec,
                                                     hal::ComputeDevice* device,
                                                     const GptOptions& options) {
  KC_RETURN_IF_ERROR(ValidateModelSpec(spec));
  KC_CHECK(device != nullptr);
  if (options.batch < 0) {
    return InvalidArgumentError("model " + spec.name + ": batch " + std::to_string(options.batch) +
                                " is negative");
  }
  const int64_t batch = options.batch == 0 ? spec.batch_per_rank : options.batch;
  std::unique_ptr<Gpt> model(new Gpt(spec, batch, device));
  KC_RETURN_IF_ERROR(model->Allocate());
  return model;
}

template <typename Real>
Status Gpt<Real>::Allocate() {
  const int64_t L = spec_.layers, C = spec_.hidden, NH = spec_.heads, F = spec_.ffn_hidden;
  const int64_t V = spec_.vocab, T = spec_.seq_len, B = batch_, BT = B * T;
  const int64_t P = ParameterCount(spec_);
  // Two passes over the same layout: count, then assign.
  auto layout = [&](std::byte* base) {
    Carver c(base);
    Real* params = c.Take<Real>(P);
    Real* grads = c.Take<Real>(P);
    params_ = {params, static_cast<size_t>(P)};
    own_grads_ = {grads, static_cast<size_t>(P)};
    encoded_ = c.Take<Real>(BT * C);
    layers_.assign(static_cast<size_t>(L), LayerActs{});
    for (LayerActs& a : layers_) {
      a.ln1 = c.Take<Real>(BT * C);
      a.ln1_mean = c.Take<Real>(BT);
      a.ln1_rstd = c.Take<Real>(BT);
      a.qkv = c.Take<Real>(BT * 3 * C);
      a.att = c.Take<Real>(B * NH * T * T);
      a.atty = c.Take<Real>(BT * C);
      a.residual2 = c.Take<Real>(BT * C);
      a.ln2 = c.Take<Real>(BT * C);
      a.ln2_mean = c.Take<Real>(BT);
      a.ln2_rstd = c.Take<Real>(BT);
      a.fch = c.Take<Real>(BT * F);
      a.fch_gelu = c.Take<Real>(BT * F);
      a.residual3 = c.Take<Real>(BT * C);
    }
    lnf_ = c.Take<Real>(BT * C);
    lnf_mean_ = c.Take<Real>(BT);
    lnf_rstd_ = c.Take<Real>(BT);
    logits_ = c.Take<Real>(BT * V);
    losses_ = c.Take<Real>(BT);
    inputs_ = c.Take<int32_t>(BT);
    dres_ = c.Take<Real>(BT * C);
    dtmp_ = c.Take<Real>(BT * C);
    dqkv_ = c.Take<Real>(BT * 3 * C);
    dfch_ = c.Take<Real>(BT * F);
    datt_ = c.Take<Real>(B * NH * T * T);
    return c.used();
  };
  const size_t bytes = layout(nullptr);
  KC_ASSIGN_OR_RETURN(arena_, device_->Allocate(bytes));
  layout(static_cast<std::byte*>(arena_.data()));
  std::fill(params_.begin(), params_.end(), Real{0});
  std::fill(own_grads_.begin(), own_grads_.end(), Real{0});
  grads_.clear();
  for (const TensorSpec& t : tensors_) {
    grads_.push_back(own_grads_.subspan(static_cast<size_t>(t.offset),
                                        static_cast<size_t>(t.num_elements)));
  }
  return OkStatus();
}

template <typename Real>
std::span<Real> Gpt<Real>::param(int tensor) {
  const TensorSpec& t = tensors_.at(static_cast<size_t>(tensor));
  return params_.subspan(static_cast<size_t>(t.offset), static_cast<size_t>(t.num_elements));
}

template <typename Real>
std::span<Real> Gpt<Real>::grad(int tensor) {
  return grads_.at(static_cast<size_t>(tensor));
}

template <typename Real>
void Gpt<Real>::SetGradientStorage(std::vector<std::span<Real>> storage) {
  KC_CHECK(storage.size() == tensors_.size())
      << "gradient storage for " << storage.size() << " tensors, model has " << tensors_.size();
  for (size_t i = 0; i < storage.size(); ++i) {
    KC_CHECK(static_cast<int64_t>(storage[i].size()) == tensors_[i].num_elements)
        << tensors_[i].name << ": gradient storage of " << storage[i].size() << " elements";
  }
  grads_ = std::move(storage);
}

template <typename Real>
void Gpt<Real>::InitParameters(uint64_t seed) {
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(spec_.layers));
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorSpec& t = tensors_[i];
    std::span<Real> p = param(static_cast<int>(i));
    if (t.shape.size() == 2) {
      const bool residual = EndsWith(t.name, "attn.proj.weight") || EndsWith(t.name, "mlp.proj.weight");
      // One stream per tensor: a tensor's values do not depend on the shapes before it.
      uint64_t stream_seed = seed ^ (0x5851f42d4c957f2dull * (i + 1));
      FillNormal(p, residual ? residual_std : 0.02, SplitMix64(&stream_seed));
    } else {
      const bool is_ln_weight = EndsWith(t.name, "ln1.weight") || EndsWith(t.name, "ln2.weight") ||
                                t.name == "lnf.weight";
      std::fill(p.begin(), p.end(), is_ln_weight ? Real{1} : Real{0});
    }
  }
}

template <typename Real>
Result<double> Gpt<Real>::Forward(std::span<const int32_t> inputs,
                                  std::span<const int32_t> targets, double grad_scale) {
  const int64_t L = spec_.layers, C = spec_.hidden, NH = spec_.heads, F = spec_.ffn_hidden;
  const int64_t V = spec_.vocab, T = spec_.seq_len, B = batch_, BT = B * T;
  const float eps = spec_.layernorm_eps;
  if (static_cast<int64_t>(inputs.size()) != BT || static_cast<int64_t>(targets.size()) != BT) {
    return InvalidArgumentError("model " + spec_.name + ": forward of " +
                                std::to_string(inputs.size()) + " inputs and " +
                                std::to_string(targets.size()) + " targets, expected B*T = " +
                                std::to_string(BT));
  }
  for (int64_t i = 0; i < BT; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V || targets[i] < 0 || targets[i] >= V) {
      return InvalidArgumentError("model " + spec_.name + ": token " +
                                  std::to_string(inputs[i] < 0 || inputs[i] >= V ? inputs[i]
                                                                                 : targets[i]) +
                                  " at position " + std::to_string(i) + " is outside the vocab of " +
                                  std::to_string(V));
    }
  }
  std::copy(inputs.begin(), inputs.end(), inputs_);

  EncoderForward(encoded_, inputs_, P(0), P(1), B, T, C);
  const Real* residual = encoded_;
  for (int64_t l = 0; l < L; ++l) {
    LayerActs& a = layers_[l];
    auto p = [&](LayerTensor t) { return P(LayerIndex(l, t)); };
    LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, p(kLn1W), p(kLn1B), BT, C, eps);
    KC_RETURN_IF_ERROR(MatmulForward(ctx_, a.qkv, a.ln1, p(kQkvW), p(kQkvB), BT, C, 3 * C));
    KC_RETURN_IF_ERROR(AttentionForward(ctx_, a.atty, a.att, a.qkv, B, T, C, NH));
    // The projection lands in residual2, then the residual is added in place.
    KC_RETURN_IF_ERROR(MatmulForward(ctx_, a.residual2, a.atty, p(kProjW), p(kProjB), BT, C, C));
    ResidualForward(a.residual2, a.residual2, residual, BT * C);
    LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p(kLn2W), p(kLn2B), BT, C, eps);
    KC_RETURN_IF_ERROR(MatmulForward(ctx_, a.fch, a.ln2, p(kFcW), p(kFcB), BT, C, F));
    GeluForward(a.fch_gelu, a.fch, BT * F);
    KC_RETURN_IF_ERROR(
        MatmulForward(ctx_, a.residual3, a.fch_gelu, p(kFcProjW), p(kFcProjB), BT, F, C));
    ResidualForward(a.residual3, a.residual3, a.residual2, BT * C);
    residual = a.residual3;
  }
  const int lnf = 2 + static_cast<int>(L) * kTensorsPerLayer;
  LayerNormForward(lnf_, lnf_mean_, lnf_rstd_, residual, P(lnf), P(lnf + 1), BT, C, eps);
  const Real* head = spec_.tied_embeddings ? P(0) : P(lnf + 2);
  KC_RETURN_IF_ERROR(MatmulForward<Real>(ctx_, logits_, lnf_, head, nullptr, BT, C, V));
  const double sum =
      CrossEntropy(logits_, losses_, targets.data(), BT, V, static_cast<Real>(grad_scale));
  have_grad_ = grad_scale != 0;
  return sum / static_cast<double>(BT);
}

template <typename Real>
Status Gpt<Real>::Backward(bool accumulate, const std::function<Status(int tensor)>& on_ready) {
  if (!have_grad_) {
    return FailedPreconditionError("model " + spec_.name +
                                   ": Backward without a Forward that computed the loss gradient");
  }
  have_grad_ = false;
  const int64_t L = spec_.layers, C = spec_.hidden, NH = spec_.heads, F = spec_.ffn_hidden;
  const int64_t V = spec_.vocab, T = spec_.seq_len, B = batch_, BT = B * T;
  const int lnf = 2 + static_cast<int>(L) * kTensorsPerLayer;
  const int head = spec_.tied_embeddings ? 0 : lnf + 2;

  // LM head: dlnf = dlogits * W; dW = dlogits^T * lnf.
  KC_RETURN_IF_ERROR(MatmulBackward<Real>(ctx_, dtmp_, G(head), nullptr, logits_, lnf_, P(head),
                                          BT, C, V, accumulate));
  if (!spec_.tied_embeddings) KC_RETURN_IF_ERROR(on_ready(head));
  std::fill(dres_, dres_ + BT * C, Real{0});
  const Real* last = L > 0 ? layers_[L - 1].residual3 : encoded_;
  LayerNormBackward(dres_, G(lnf), G(lnf + 1), dtmp_, last, P(lnf), lnf_mean_, lnf_rstd_, BT, C,
                    accumulate);
  KC_RETURN_IF_ERROR(on_ready(lnf + 1));
  KC_RETURN_IF_ERROR(on_ready(lnf));

  for (int64_t l = L - 1; l >= 0; --l) {
    LayerActs& a = layers_[l];
    const Real* residual = l == 0 ? encoded_ : layers_[l - 1].residual3;
    auto p = [&](LayerTensor t) { return P(LayerIndex(l, t)); };
    auto g = [&](LayerTensor t) { return G(LayerIndex(l, t)); };
    auto ready = [&](LayerTensor t) { return on_ready(LayerIndex(l, t)); };
    // MLP: residual3 = residual2 + proj(gelu(fc(ln2(residual2)))).
    KC_RETURN_IF_ERROR(MatmulBackward(ctx_, dfch_, g(kFcProjW), g(kFcProjB), dres_, a.fch_gelu,
                                      p(kFcProjW), BT, F, C, accumulate));
    KC_RETURN_IF_ERROR(ready(kFcProjB));
    KC_RETURN_IF_ERROR(ready(kFcProjW));
    GeluBackward(dfch_, a.fch, dfch_, BT * F);
    KC_RETURN_IF_ERROR(MatmulBackward(ctx_, dtmp_, g(kFcW), g(kFcB), dfch_, a.ln2, p(kFcW), BT, C,
                                      F, accumulate));
    KC_RETURN_IF_ERROR(ready(kFcB));
    KC_RETURN_IF_ERROR(ready(kFcW));
    LayerNormBackward(dres_, g(kLn2W), g(kLn2B), dtmp_, a.residual2, p(kLn2W), a.ln2_mean,
                      a.ln2_rstd, BT, C, accumulate);
    KC_RETURN_IF_ERROR(ready(kLn2B));
    KC_RETURN_IF_ERROR(ready(kLn2W));
    // Attention: residual2 = residual + proj(attention(qkv(ln1(residual)))).
    KC_RETURN_IF_ERROR(MatmulBackward(ctx_, dtmp_, g(kProjW), g(kProjB), dres_, a.atty, p(kProjW),
                                      BT, C, C, accumulate));
    KC_RETURN_IF_ERROR(ready(kProjB));
    KC_RETURN_IF_ERROR(ready(kProjW));
    KC_RETURN_IF_ERROR(AttentionBackward(ctx_, dqkv_, datt_, dtmp_, a.qkv, a.att, B, T, C, NH));
    KC_RETURN_IF_ERROR(MatmulBackward(ctx_, dtmp_, g(kQkvW), g(kQkvB), dqkv_, a.ln1, p(kQkvW), BT,
                                      C, 3 * C, accumulate));
    KC_RETURN_IF_ERROR(ready(kQkvB));
    KC_RETURN_IF_ERROR(ready(kQkvW));
    LayerNormBackward(dres_, g(kLn1W), g(kLn1B), dtmp_, residual, p(kLn1W), a.ln1_mean,
                      a.ln1_rstd, BT, C, accumulate);
    KC_RETURN_IF_ERROR(ready(kLn1B));
    KC_RETURN_IF_ERROR(ready(kLn1W));
  }

  // Embeddings. A tied wte already holds the LM head's part.
  if (!accumulate) {
    std::fill(G(1), G(1) + T * C, Real{0});
    if (!spec_.tied_embeddings) std::fill(G(0), G(0) + V * C, Real{0});
  }
  EncoderBackward(G(0), G(1), dres_, inputs_, B, T, C);
  KC_RETURN_IF_ERROR(on_ready(1));
  return on_ready(0);
}

template class Gpt<float>;
template class Gpt<double>;

}  // namespace kc::parallel
