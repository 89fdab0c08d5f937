#include "parallel/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <utility>

#include "base/check.h"
#include "base/layer_guard.h"

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
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
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
Gpt<Real>::Gpt(ModelSpec spec, int64_t batch, int64_t first_layer, int64_t end_layer,
               hal::ComputeDevice* device, TensorParallelGroup* tp)
    : spec_(std::move(spec)),
      batch_(batch),
      first_layer_(first_layer),
      end_layer_(end_layer),
      device_(device),
      tp_(tp),
      tp_rank_(tp != nullptr ? tp->rank() : 0),
      tp_size_(tp != nullptr ? tp->size() : 1),
      attn_width_(spec_.hidden / tp_size_),
      local_heads_(spec_.heads / tp_size_),
      ffn_width_(spec_.ffn_hidden / tp_size_),
      vocab_rows_(VocabShard(spec_.vocab, tp_size_)),
      vocab_begin_(tp_rank_ * vocab_rows_),
      vocab_valid_(std::clamp<int64_t>(spec_.vocab - vocab_begin_, 0, vocab_rows_)) {
  ctx_.stream = &device_->default_stream();
  // The stage's tensors in forward order, offsets counted afresh: wte (for the embeddings, or
  // a tied head's copy), wpe, the blocks, the final LayerNorm and an untied head.
  const std::vector<TensorSpec> all = ParameterTensors(spec_);
  const int per_layer = kTensorsPerLayer;
  const int global_lnf = 2 + static_cast<int>(spec_.layers) * per_layer;
  auto take = [&](int global) {
    TensorSpec t = all[static_cast<size_t>(global)];
    const TpSplit split = tp_size_ > 1 ? TensorParallelSplit(t.name) : TpSplit::kReplicated;
    t.shape = ShardShape(t.shape, split, tp_size_);
    t.num_elements = 1;
    for (int64_t d : t.shape) t.num_elements *= d;
    t.offset = tensors_.empty() ? 0 : tensors_.back().offset + tensors_.back().num_elements;
    tensors_.push_back(std::move(t));
    global_index_.push_back(global);
    splits_.push_back(split);
    return static_cast<int>(tensors_.size()) - 1;
  };
  if (has_embedding() || (has_head() && spec_.tied_embeddings)) wte_ = take(0);
  if (has_embedding()) wpe_ = take(1);
  layer_base_ = static_cast<int>(tensors_.size());
  for (int64_t l = first_layer_; l < end_layer_; ++l) {
    for (int t = 0; t < per_layer; ++t) take(2 + static_cast<int>(l) * per_layer + t);
  }
  if (has_head()) {
    lnf_ = take(global_lnf);
    take(global_lnf + 1);
    head_ = spec_.tied_embeddings ? wte_ : take(global_lnf + 2);
  }
}

template <typename Real>
Result<std::unique_ptr<Gpt<Real>>> Gpt<Real>::Create(const ModelSpec& spec,
                                                     hal::ComputeDevice* device,
                                                     const GptOptions& options) {
  KC_LAYER_ENTRY(Layer::kParallel, "model");
  KC_RETURN_IF_ERROR(ValidateModelSpec(spec));
  KC_CHECK(device != nullptr);
  if (options.batch < 0) {
    return InvalidArgumentError("model " + spec.name + ": batch " + std::to_string(options.batch) +
                                " is negative");
  }
  const int64_t batch = options.batch == 0 ? spec.batch_per_rank : options.batch;
  if (options.threads < 1) {
    return InvalidArgumentError("model " + spec.name + ": threads " +
                                std::to_string(options.threads) + " must be at least 1");
  }
  const int64_t end = options.end_layer == 0 ? spec.layers : options.end_layer;
  if (options.first_layer < 0 || options.first_layer >= end || end > spec.layers) {
    return InvalidArgumentError("model " + spec.name + ": stage layers [" +
                                std::to_string(options.first_layer) + ", " + std::to_string(end) +
                                ") must be a non-empty range within the " +
                                std::to_string(spec.layers) + " layers");
  }
  if (options.recompute && options.split_backward) {
    return InvalidArgumentError("model " + spec.name +
                                ": recompute with a split backward (zb-h1) is not supported: the "
                                "weight pass needs the activations recompute drops");
  }
  if (options.slots < 1) {
    return InvalidArgumentError("model " + spec.name + ": slots " + std::to_string(options.slots) +
                                " must be at least 1");
  }
  if (TensorParallelGroup* tp = options.tensor_parallel; tp != nullptr) {
    KC_RETURN_IF_ERROR(ValidateTensorParallel(spec, tp->size()));
    if (tp->rank() < 0 || tp->rank() >= tp->size()) {
      return InvalidArgumentError("model " + spec.name + ": tensor-parallel rank " +
                                  std::to_string(tp->rank()) + " outside [0, " +
                                  std::to_string(tp->size()) + ")");
    }
  }
  std::unique_ptr<Gpt> model(
      new Gpt(spec, batch, options.first_layer, end, device, options.tensor_parallel));
  // Whole sequences per worker, as even as they go; never more workers than sequences.
  const int64_t workers = std::min<int64_t>(options.threads, batch);
  for (int64_t w = 0; w < workers; ++w) {
    model->slices_.emplace_back(batch * w / workers, batch * (w + 1) / workers);
  }
  KC_RETURN_IF_ERROR(model->Allocate(options.slots, options.split_backward, options.recompute));
  return model;
}

template <typename Real>
Status Gpt<Real>::Allocate(int slots, bool split_backward, bool recompute) {
  recompute_ = recompute;
  // This rank's widths (the whole model's without tensor parallelism).
  const int64_t C = spec_.hidden, Ca = attn_width_, NH = local_heads_, F = ffn_width_;
  const int64_t V = vocab_rows_, T = spec_.seq_len, B = batch_, BT = B * T;
  const int64_t P = tensors_.back().offset + tensors_.back().num_elements;
  const int64_t layers = end_layer_ - first_layer_;
  // Two passes over the same layout: count, then assign.
  auto layout = [&](std::byte* base) {
    Carver c(base);
    Real* params = c.Take<Real>(P);
    Real* grads = c.Take<Real>(P);
    params_ = {params, static_cast<size_t>(P)};
    own_grads_ = {grads, static_cast<size_t>(P)};
    // Workers after the first write their gradients here, then add them in.
    const int64_t extra = static_cast<int64_t>(slices_.size()) - 1;
    worker_arena_ = {c.Take<Real>(extra * P), static_cast<size_t>(extra * P)};
    auto take_layer = [&] {
      LayerActs a;
      a.ln1 = c.Take<Real>(BT * C);
      a.ln1_mean = c.Take<Real>(BT);
      a.ln1_rstd = c.Take<Real>(BT);
      a.qkv = c.Take<Real>(BT * 3 * Ca);
      a.att = c.Take<Real>(B * NH * T * T);
      a.atty = c.Take<Real>(BT * Ca);
      a.residual2 = c.Take<Real>(BT * C);
      a.ln2 = c.Take<Real>(BT * C);
      a.ln2_mean = c.Take<Real>(BT);
      a.ln2_rstd = c.Take<Real>(BT);
      a.fch = c.Take<Real>(BT * F);
      a.fch_gelu = c.Take<Real>(BT * F);
      a.residual3 = c.Take<Real>(BT * C);
      return a;
    };
    slots_.assign(static_cast<size_t>(slots), SlotActs{});
    const size_t before_slots = c.used();
    if (recompute) recompute_layer_ = take_layer();
    for (SlotActs& s : slots_) {
      s.input = c.Take<Real>(BT * C);
      s.layers.assign(static_cast<size_t>(layers), LayerActs{});
      for (LayerActs& a : s.layers) {
        if (recompute) {  // the output only: the next layer's input
          a.residual3 = c.Take<Real>(BT * C);
          continue;
        }
        a = take_layer();
      }
      if (has_head()) {
        s.lnf = c.Take<Real>(BT * C);
        s.lnf_mean = c.Take<Real>(BT);
        s.lnf_rstd = c.Take<Real>(BT);
        s.logits = c.Take<Real>(BT * V);
        s.losses = c.Take<Real>(BT);
      }
      if (has_embedding()) s.tokens = c.Take<int32_t>(BT);
      if (split_backward) {
        s.grads.assign(static_cast<size_t>(layers), LayerGrads{});
        for (LayerGrads& g : s.grads) {
          g.fcproj_out = c.Take<Real>(BT * C);
          g.fc_out = c.Take<Real>(BT * F);
          g.ln2_out = c.Take<Real>(BT * C);
          g.proj_out = c.Take<Real>(BT * C);
          g.qkv_out = c.Take<Real>(BT * 3 * Ca);
          g.ln1_out = c.Take<Real>(BT * C);
        }
        if (has_head()) s.lnf_out_grad = c.Take<Real>(BT * C);
        if (has_embedding()) s.input_grad = c.Take<Real>(BT * C);
      }
    }
    activation_bytes_ = static_cast<int64_t>(c.used() - before_slots);
    dres_ = c.Take<Real>(BT * C);
    dtmp_ = c.Take<Real>(BT * C);
    dqkv_ = c.Take<Real>(BT * 3 * Ca);
    dfch_ = c.Take<Real>(BT * F);
    datt_ = c.Take<Real>(B * NH * T * T);
    datty_ = c.Take<Real>(BT * Ca);
    if (has_head()) {
      ce_max_ = c.Take<Real>(BT);
      ce_sums_ = c.Take<Real>(2 * BT);
    }
    return c.used();
  };
  const size_t bytes = layout(nullptr);
  KC_ASSIGN_OR_RETURN(arena_, device_->Allocate(bytes));
  layout(static_cast<std::byte*>(arena_.data()));
  std::fill(params_.begin(), params_.end(), Real{0});
  std::fill(own_grads_.begin(), own_grads_.end(), Real{0});
  grads_.clear();
  for (const TensorSpec& t : tensors_) {
    grads_.push_back(
        own_grads_.subspan(static_cast<size_t>(t.offset), static_cast<size_t>(t.num_elements)));
  }
  worker_grads_.assign(slices_.size() - 1, {});
  for (size_t w = 0; w + 1 < slices_.size(); ++w) {
    std::span<Real> arena =
        worker_arena_.subspan(w * static_cast<size_t>(P), static_cast<size_t>(P));
    for (const TensorSpec& t : tensors_) {
      worker_grads_[w].push_back(
          arena.subspan(static_cast<size_t>(t.offset), static_cast<size_t>(t.num_elements)));
    }
  }
  // One stream per worker: a stream is used by one thread at a time.
  ctxs_.assign(1, ctx_);
  for (size_t w = 1; w < slices_.size(); ++w) {
    KC_ASSIGN_OR_RETURN(std::unique_ptr<hal::Stream> stream, device_->CreateStream());
    ctxs_.push_back({.stream = stream.get()});
    streams_.push_back(std::move(stream));
  }
  arrivals_ = std::make_unique<std::atomic<int>[]>(tensors_.size());
  worker_status_.assign(slices_.size(), OkStatus());
  worker_loss_.assign(slices_.size(), 0.0);
  pool_ = std::make_unique<WorkerPool>(static_cast<int>(slices_.size()));
  return OkStatus();
}

template <typename Real>
std::span<Real> Gpt<Real>::stage_input(int slot) {
  if (has_embedding()) return {};
  return {slots_.at(static_cast<size_t>(slot)).input, static_cast<size_t>(tokens() * spec_.hidden)};
}

template <typename Real>
std::span<const Real> Gpt<Real>::stage_output(int slot) {
  if (has_head()) return {};
  return {slots_.at(static_cast<size_t>(slot)).layers.back().residual3,
          static_cast<size_t>(tokens() * spec_.hidden)};
}

template <typename Real>
std::span<Real> Gpt<Real>::grad_output() {
  if (has_head()) return {};
  return {dres_, static_cast<size_t>(tokens() * spec_.hidden)};
}

template <typename Real>
std::span<const Real> Gpt<Real>::grad_input() {
  if (has_embedding()) return {};
  return {dres_, static_cast<size_t>(tokens() * spec_.hidden)};
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
void InitParameterTensor(const ModelSpec& spec, int index, uint64_t seed, std::span<Real> values) {
  const std::vector<TensorSpec> whole = ParameterTensors(spec);
  const TensorSpec& t = whole.at(static_cast<size_t>(index));
  KC_CHECK(values.size() == static_cast<size_t>(t.num_elements))
      << "InitParameterTensor " << t.name << ": " << values.size() << " values for "
      << t.num_elements;
  if (t.shape.size() == 2) {
    const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(spec.layers));
    const bool residual =
        EndsWith(t.name, "attn.proj.weight") || EndsWith(t.name, "mlp.proj.weight");
    // One stream per tensor: a tensor's values do not depend on the shapes before it.
    const uint64_t g = static_cast<uint64_t>(index);
    uint64_t stream_seed = seed ^ (0x5851f42d4c957f2dull * (g + 1));
    FillNormal(values, residual ? residual_std : 0.02, SplitMix64(&stream_seed));
  } else {
    const bool is_ln_weight =
        EndsWith(t.name, "ln1.weight") || EndsWith(t.name, "ln2.weight") || t.name == "lnf.weight";
    std::fill(values.begin(), values.end(), is_ln_weight ? Real{1} : Real{0});
  }
}

template <typename Real>
void Gpt<Real>::InitParameters(uint64_t seed) {
  const std::vector<TensorSpec> whole = ParameterTensors(spec_);
  std::vector<Real> values;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorSpec& t = whole[static_cast<size_t>(global_index_[i])];
    // The whole tensor's values; a shard takes its part of them.
    values.assign(static_cast<size_t>(t.num_elements), Real{0});
    InitParameterTensor<Real>(spec_, global_index_[i], seed, values);
    ExtractShard<Real>(values, t.shape, splits_[i], tp_rank_, tp_size_, param(static_cast<int>(i)));
  }
}

template <typename Real>
Status Gpt<Real>::AllReduce(Real* data, int64_t count, comm::ReduceOp op) {
  if (tp_ == nullptr) return OkStatus();
  return pool_->Sync(
      [&] { return tp_->AllReduce(std::span<Real>(data, static_cast<size_t>(count)), op); });
}

template <typename Real>
Result<double> Gpt<Real>::Forward(int slot, std::span<const int32_t> inputs,
                                  std::span<const int32_t> targets, double grad_scale) {
  KC_LAYER_ENTRY(Layer::kParallel, "model");
  const int64_t V = spec_.vocab, BT = tokens();
  if (slot < 0 || slot >= slots()) {
    return InvalidArgumentError("model " + spec_.name + ": slot " + std::to_string(slot) +
                                " outside [0, " + std::to_string(slots()) + ")");
  }
  const int64_t want_inputs = has_embedding() ? BT : 0, want_targets = has_head() ? BT : 0;
  if (static_cast<int64_t>(inputs.size()) != want_inputs ||
      static_cast<int64_t>(targets.size()) != want_targets) {
    return InvalidArgumentError(
        "model " + spec_.name + ": forward of " + std::to_string(inputs.size()) + " inputs and " +
        std::to_string(targets.size()) + " targets, expected " + std::to_string(want_inputs) +
        " and " + std::to_string(want_targets) + " (B*T where the stage takes them)");
  }
  for (int64_t i = 0; i < want_inputs; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V) {
      return InvalidArgumentError("model " + spec_.name + ": token " + std::to_string(inputs[i]) +
                                  " at position " + std::to_string(i) +
                                  " is outside the vocab of " + std::to_string(V));
    }
  }
  for (int64_t i = 0; i < want_targets; ++i) {
    if (targets[i] < 0 || targets[i] >= V) {
      return InvalidArgumentError("model " + spec_.name + ": token " + std::to_string(targets[i]) +
                                  " at position " + std::to_string(i) +
                                  " is outside the vocab of " + std::to_string(V));
    }
  }
  SlotActs& s = slots_[static_cast<size_t>(slot)];
  if (has_embedding()) std::copy(inputs.begin(), inputs.end(), s.tokens);
  pool_->Run([&](int k) {
    worker_status_[k] =
        ForwardSlice(k, s, targets.data(), static_cast<Real>(grad_scale), &worker_loss_[k]);
  });
  for (const Status& st : worker_status_) KC_RETURN_IF_ERROR(st);
  s.have_grad = grad_scale != 0;
  if (!has_head()) return 0.0;
  double sum = 0;
  for (double x : worker_loss_) sum += x;
  return sum / static_cast<double>(BT);
}

template <typename Real>
Status Gpt<Real>::ForwardSlice(int k, SlotActs& s, const int32_t* targets, Real grad_scale,
                               double* loss_sum) {
  const int64_t C = spec_.hidden;
  const int64_t V = vocab_rows_, T = spec_.seq_len, BT_all = batch_ * T;
  const float eps = spec_.layernorm_eps;
  const KernelContext& ctx = ctxs_[k];
  // This worker's sequences [b0, b0 + B): rows [b0 * T, (b0 + B) * T) of every activation.
  const int64_t b0 = slices_[k].first, B = slices_[k].second - b0, BT = B * T;
  auto rows = [&](Real* base, int64_t width) { return base + b0 * T * width; };
  Real* input = rows(s.input, C);
  if (has_embedding()) {
    // Vocabulary-parallel: each rank adds the rows it holds (wpe on one rank), then the sum.
    EncoderForward(input, s.tokens + b0 * T, P(wte_), tp_rank_ == 0 ? P(wpe_) : nullptr, B, T, C,
                   vocab_begin_, vocab_rows_);
    KC_RETURN_IF_ERROR(AllReduce(s.input, BT_all * C));
  }
  const Real* residual = input;
  for (int64_t l = first_layer_; l < end_layer_; ++l) {
    const LayerActs whole = LayerFor(s, l);
    KC_RETURN_IF_ERROR(LayerForward(k, whole, residual, l));
    residual = rows(whole.residual3, C);
  }
  if (!has_head()) return OkStatus();
  Real* lnf_out = rows(s.lnf, C);
  LayerNormForward(lnf_out, rows(s.lnf_mean, 1), rows(s.lnf_rstd, 1), residual, P(lnf_),
                   P(lnf_ + 1), BT, C, eps);
  Real* logits = rows(s.logits, V);
  KC_RETURN_IF_ERROR(MatmulForward<Real>(ctx, logits, lnf_out, P(head_), nullptr, BT, C, V));
  // The loss over the vocabulary shards: the rows' maxima, then their sums, across the group.
  const int32_t* tg = targets + b0 * T;
  CrossEntropyMax(logits, rows(ce_max_, 1), BT, V, vocab_valid_);
  KC_RETURN_IF_ERROR(AllReduce(ce_max_, BT_all, comm::ReduceOp::kMax));
  CrossEntropySums(logits, rows(ce_max_, 1), tg, vocab_begin_, BT, V, vocab_valid_,
                   rows(ce_sums_, 2));
  KC_RETURN_IF_ERROR(AllReduce(ce_sums_, 2 * BT_all));
  *loss_sum = CrossEntropyFinish(logits, rows(s.losses, 1), rows(ce_max_, 1), rows(ce_sums_, 2), tg,
                                 vocab_begin_, BT, V, vocab_valid_, grad_scale);
  return OkStatus();
}

template <typename Real>
typename Gpt<Real>::LayerActs Gpt<Real>::LayerFor(const SlotActs& s, int64_t l) const {
  const LayerActs& own = s.layers[static_cast<size_t>(l - first_layer_)];
  if (!recompute_) return own;
  LayerActs a = recompute_layer_;
  a.residual3 = own.residual3;
  return a;
}

template <typename Real>
Status Gpt<Real>::LayerForward(int k, const LayerActs& whole, const Real* residual, int64_t l) {
  const int64_t C = spec_.hidden, Ca = attn_width_, NH = local_heads_, F = ffn_width_;
  const int64_t T = spec_.seq_len, BT_all = batch_ * T;
  const int64_t b0 = slices_[k].first, B = slices_[k].second - b0, BT = B * T;
  const KernelContext& ctx = ctxs_[k];
  const LayerActs a = Slice(whole, b0);
  const float eps = spec_.layernorm_eps;
  auto p = [&](LayerTensor t) { return P(LayerIndex(l, t)); };
  LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, p(kLn1W), p(kLn1B), BT, C, eps);
  // Column-parallel qkv (this rank's heads), attention, row-parallel projection: a partial sum
  // over the heads until the all-reduce; then the bias and the residual.
  KC_RETURN_IF_ERROR(MatmulForward(ctx, a.qkv, a.ln1, p(kQkvW), p(kQkvB), BT, C, 3 * Ca));
  KC_RETURN_IF_ERROR(AttentionForward(ctx, a.atty, a.att, a.qkv, B, T, Ca, NH));
  KC_RETURN_IF_ERROR(MatmulForward<Real>(ctx, a.residual2, a.atty, p(kProjW), nullptr, BT, Ca, C));
  KC_RETURN_IF_ERROR(AllReduce(whole.residual2, BT_all * C));
  BiasForward(a.residual2, p(kProjB), BT, C);
  ResidualForward(a.residual2, a.residual2, residual, BT * C);
  // The MLP the same way: column-parallel fc, row-parallel projection.
  LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p(kLn2W), p(kLn2B), BT, C, eps);
  KC_RETURN_IF_ERROR(MatmulForward(ctx, a.fch, a.ln2, p(kFcW), p(kFcB), BT, C, F));
  GeluForward(a.fch_gelu, a.fch, BT * F);
  KC_RETURN_IF_ERROR(
      MatmulForward<Real>(ctx, a.residual3, a.fch_gelu, p(kFcProjW), nullptr, BT, F, C));
  KC_RETURN_IF_ERROR(AllReduce(whole.residual3, BT_all * C));
  BiasForward(a.residual3, p(kFcProjB), BT, C);
  ResidualForward(a.residual3, a.residual3, a.residual2, BT * C);
  return OkStatus();
}

template <typename Real>
typename Gpt<Real>::LayerActs Gpt<Real>::Slice(const LayerActs& a, int64_t b0) const {
  const int64_t C = spec_.hidden, Ca = attn_width_, NH = local_heads_, F = ffn_width_;
  const int64_t T = spec_.seq_len;
  const int64_t r = b0 * T;
  return {.ln1 = a.ln1 + r * C,
          .ln1_mean = a.ln1_mean + r,
          .ln1_rstd = a.ln1_rstd + r,
          .qkv = a.qkv + r * 3 * Ca,
          .att = a.att + b0 * NH * T * T,
          .atty = a.atty + r * Ca,
          .residual2 = a.residual2 + r * C,
          .ln2 = a.ln2 + r * C,
          .ln2_mean = a.ln2_mean + r,
          .ln2_rstd = a.ln2_rstd + r,
          .fch = a.fch + r * F,
          .fch_gelu = a.fch_gelu + r * F,
          .residual3 = a.residual3 + r * C};
}

template <typename Real>
Status Gpt<Real>::Backward(int slot, bool accumulate,
                           const std::function<Status(int tensor)>& on_ready) {
  return RunBackward(slot, Pass::kWhole, accumulate, on_ready);
}

template <typename Real>
Status Gpt<Real>::BackwardInput(int slot) {
  return RunBackward(slot, Pass::kInput, false, nullptr);
}

template <typename Real>
Status Gpt<Real>::BackwardWeight(int slot, bool accumulate,
                                 const std::function<Status(int tensor)>& on_ready) {
  return RunBackward(slot, Pass::kWeight, accumulate, on_ready);
}

template <typename Real>
Status Gpt<Real>::RunBackward(int slot, Pass pass, bool accumulate,
                              const std::function<Status(int tensor)>& on_ready) {
  KC_LAYER_ENTRY(Layer::kParallel, "model");
  if (slot < 0 || slot >= slots()) {
    return InvalidArgumentError("model " + spec_.name + ": slot " + std::to_string(slot) +
                                " outside [0, " + std::to_string(slots()) + ")");
  }
  SlotActs& s = slots_[static_cast<size_t>(slot)];
  if (pass != Pass::kWhole && s.grads.empty() && end_layer_ > first_layer_) {
    return FailedPreconditionError("model " + spec_.name +
                                   ": a split backward needs GptOptions::split_backward");
  }
  if (pass == Pass::kWeight) {
    if (!s.have_input_grad) {
      return FailedPreconditionError("model " + spec_.name + ": BackwardWeight of slot " +
                                     std::to_string(slot) + " without its BackwardInput");
    }
    s.have_input_grad = false;
  } else {
    if (!s.have_grad) {
      return FailedPreconditionError(
          "model " + spec_.name + ": Backward without a Forward that computed the loss gradient");
    }
    s.have_grad = false;
    s.have_input_grad = pass == Pass::kInput;
  }
  for (size_t i = 0; i < tensors_.size(); ++i) arrivals_[i].store(0, std::memory_order_relaxed);
  pool_->Run([&](int k) {
    worker_status_[k] = pass == Pass::kWeight ? WeightSlice(k, s, accumulate, on_ready)
                                              : BackwardSlice(k, s, pass, accumulate, on_ready);
  });
  for (const Status& st : worker_status_) KC_RETURN_IF_ERROR(st);
  return OkStatus();
}

template <typename Real>
Status Gpt<Real>::TensorDone(int tensor, const std::function<Status(int)>& on_ready) {
  const int workers = static_cast<int>(slices_.size());
  if (workers == 1) return on_ready(tensor);
  // The last worker to finish a tensor adds the others' parts into the real gradient and
  // announces it. acq_rel: every worker's writes happen before the last one's reads.
  if (arrivals_[tensor].fetch_add(1, std::memory_order_acq_rel) + 1 < workers) return OkStatus();
  std::span<Real> g = grads_[tensor];
  for (int w = 1; w < workers; ++w) {
    const Real* part = worker_grads_[w - 1][tensor].data();
    for (size_t i = 0; i < g.size(); ++i) g[i] += part[i];
  }
  MutexLock lock(&ready_mu_);
  return on_ready(tensor);
}

template <typename Real>
Status Gpt<Real>::BackwardSlice(int k, SlotActs& s, Pass pass, bool accumulate,
                                const std::function<Status(int)>& on_ready) {
  const int64_t C = spec_.hidden, Ca = attn_width_, NH = local_heads_, F = ffn_width_;
  const int64_t V = vocab_rows_, T = spec_.seq_len, BT_all = batch_ * T;
  const KernelContext& ctx = ctxs_[k];
  const int64_t b0 = slices_[k].first, B = slices_[k].second - b0, BT = B * T;
  auto rows = [&](Real* base, int64_t width) { return base + b0 * T * width; };
  // Worker 0 writes the real gradients; the others their own copies (always overwritten),
  // added in by TensorDone. The input pass writes none: its weight pointers are null, and
  // the output gradients the weight pass needs land in the slot instead of the scratch.
  const bool whole = pass == Pass::kWhole;
  const std::vector<std::span<Real>>& grads = k == 0 ? grads_ : worker_grads_[k - 1];
  const bool acc = k == 0 ? accumulate : false;
  auto G = [&](int i) { return whole ? grads[i].data() : nullptr; };
  auto done = [&](int i) { return whole ? TensorDone(i, on_ready) : OkStatus(); };
  Real* dres = rows(dres_, C);
  Real* datt = datt_ + b0 * NH * T * T;
  Real* input = rows(s.input, C);
  auto acts = [&](int64_t l) { return Slice(LayerFor(s, l), b0); };
  // Where an output gradient goes (every worker's rows): the shared scratch, or the slot's copy
  // for the weight pass.
  auto keep = [&](Real* scratch, Real* kept) { return whole ? scratch : kept; };

  if (has_head()) {
    // LM head: dlnf = dlogits * W (a partial sum over the vocabulary shards); dW = dlogits^T *
    // lnf.
    Real* dlnf_all = keep(dtmp_, s.lnf_out_grad);
    Real* dlnf = rows(dlnf_all, C);
    KC_RETURN_IF_ERROR(MatmulBackward<Real>(ctx, dlnf, G(head_), nullptr, rows(s.logits, V),
                                            rows(s.lnf, C), P(head_), BT, C, V, acc));
    // The head's own weight is final now, and so is a tied head's copy of wte on a stage
    // without the embeddings.
    if (!spec_.tied_embeddings || !has_embedding()) KC_RETURN_IF_ERROR(done(head_));
    KC_RETURN_IF_ERROR(AllReduce(dlnf_all, BT_all * C));
    std::fill(dres, dres + BT * C, Real{0});
    LayerNormBackward(dres, G(lnf_), G(lnf_ + 1), dlnf, acts(end_layer_ - 1).residual3, P(lnf_),
                      rows(s.lnf_mean, 1), rows(s.lnf_rstd, 1), BT, C, acc);
    KC_RETURN_IF_ERROR(done(lnf_ + 1));
    KC_RETURN_IF_ERROR(done(lnf_));
  }
  // Otherwise dres holds grad_output(), the caller's.

  for (int64_t l = end_layer_ - 1; l >= first_layer_; --l) {
    const LayerActs a = acts(l);
    LayerGrads* kept = whole ? nullptr : &s.grads[static_cast<size_t>(l - first_layer_)];
    const Real* residual = l == first_layer_ ? input : acts(l - 1).residual3;
    // Recompute: this layer's activations again, from its kept input.
    if (recompute_) KC_RETURN_IF_ERROR(LayerForward(k, LayerFor(s, l), residual, l));
    auto p = [&](LayerTensor t) { return P(LayerIndex(l, t)); };
    auto g = [&](LayerTensor t) { return whole ? G(LayerIndex(l, t)) : nullptr; };
    auto ready = [&](LayerTensor t) { return done(LayerIndex(l, t)); };
    Real* dfch = rows(keep(dfch_, whole ? nullptr : kept->fc_out), F);
    Real* dln2_all = keep(dtmp_, whole ? nullptr : kept->ln2_out);
    Real* dqkv = rows(keep(dqkv_, whole ? nullptr : kept->qkv_out), 3 * Ca);
    Real* dln1_all = keep(dtmp_, whole ? nullptr : kept->ln1_out);
    Real* dln2 = rows(dln2_all, C);
    Real* dln1 = rows(dln1_all, C);
    Real* datty = rows(datty_, Ca);
    if (!whole) std::copy(dres, dres + BT * C, rows(kept->fcproj_out, C));
    // MLP: residual3 = residual2 + proj(gelu(fc(ln2(residual2)))). The column-parallel fc's
    // input gradient is a partial sum over the hidden units: all-reduced before the LayerNorm.
    KC_RETURN_IF_ERROR(MatmulBackward(ctx, dfch, g(kFcProjW), g(kFcProjB), dres, a.fch_gelu,
                                      p(kFcProjW), BT, F, C, acc));
    KC_RETURN_IF_ERROR(ready(kFcProjB));
    KC_RETURN_IF_ERROR(ready(kFcProjW));
    GeluBackward(dfch, a.fch, dfch, BT * F);
    KC_RETURN_IF_ERROR(
        MatmulBackward(ctx, dln2, g(kFcW), g(kFcB), dfch, a.ln2, p(kFcW), BT, C, F, acc));
    KC_RETURN_IF_ERROR(ready(kFcB));
    KC_RETURN_IF_ERROR(ready(kFcW));
    KC_RETURN_IF_ERROR(AllReduce(dln2_all, BT_all * C));
    LayerNormBackward(dres, g(kLn2W), g(kLn2B), dln2, a.residual2, p(kLn2W), a.ln2_mean, a.ln2_rstd,
                      BT, C, acc);
    KC_RETURN_IF_ERROR(ready(kLn2B));
    KC_RETURN_IF_ERROR(ready(kLn2W));
    if (!whole) std::copy(dres, dres + BT * C, rows(kept->proj_out, C));
    // Attention: residual2 = residual + proj(attention(qkv(ln1(residual)))), likewise.
    KC_RETURN_IF_ERROR(
        MatmulBackward(ctx, datty, g(kProjW), g(kProjB), dres, a.atty, p(kProjW), BT, Ca, C, acc));
    KC_RETURN_IF_ERROR(ready(kProjB));
    KC_RETURN_IF_ERROR(ready(kProjW));
    KC_RETURN_IF_ERROR(AttentionBackward(ctx, dqkv, datt, datty, a.qkv, a.att, B, T, Ca, NH));
    KC_RETURN_IF_ERROR(
        MatmulBackward(ctx, dln1, g(kQkvW), g(kQkvB), dqkv, a.ln1, p(kQkvW), BT, C, 3 * Ca, acc));
    KC_RETURN_IF_ERROR(ready(kQkvB));
    KC_RETURN_IF_ERROR(ready(kQkvW));
    KC_RETURN_IF_ERROR(AllReduce(dln1_all, BT_all * C));
    LayerNormBackward(dres, g(kLn1W), g(kLn1B), dln1, residual, p(kLn1W), a.ln1_mean, a.ln1_rstd,
                      BT, C, acc);
    KC_RETURN_IF_ERROR(ready(kLn1B));
    KC_RETURN_IF_ERROR(ready(kLn1W));
  }
  if (!has_embedding()) return OkStatus();  // dres is grad_input()
  if (!whole) {
    std::copy(dres, dres + BT * C, rows(s.input_grad, C));
    return OkStatus();
  }

  return EmbeddingBackward(k, s, dres, accumulate, on_ready);
}

template <typename Real>
Status Gpt<Real>::EmbeddingBackward(int k, const SlotActs& s, const Real* dout, bool accumulate,
                                    const std::function<Status(int)>& on_ready) {
  const int64_t C = spec_.hidden, V = vocab_rows_, T = spec_.seq_len;
  const int64_t b0 = slices_[k].first, B = slices_[k].second - b0;
  const std::vector<std::span<Real>>& grads = k == 0 ? grads_ : worker_grads_[k - 1];
  Real* dwte = grads[wte_].data();
  Real* dwpe = grads[wpe_].data();
  // A tied wte on a stage with the head already holds the head's part.
  if (k != 0 || !accumulate) {
    std::fill(dwpe, dwpe + T * C, Real{0});
    if (!(has_head() && spec_.tied_embeddings)) std::fill(dwte, dwte + V * C, Real{0});
  }
  // Every rank of a tensor-parallel group gets the same (whole) dwpe and its rows of dwte.
  EncoderBackward(dwte, dwpe, dout, s.tokens + b0 * T, B, T, C, vocab_begin_, vocab_rows_);
  KC_RETURN_IF_ERROR(TensorDone(wpe_, on_ready));
  return TensorDone(wte_, on_ready);
}

template <typename Real>
Status Gpt<Real>::WeightSlice(int k, SlotActs& s, bool accumulate,
                              const std::function<Status(int)>& on_ready) {
  const int64_t C = spec_.hidden, Ca = attn_width_, F = ffn_width_;
  const int64_t V = vocab_rows_, T = spec_.seq_len;
  const KernelContext& ctx = ctxs_[k];
  const int64_t b0 = slices_[k].first, B = slices_[k].second - b0, BT = B * T;
  auto rows = [&](Real* base, int64_t width) { return base + b0 * T * width; };
  const std::vector<std::span<Real>>& grads = k == 0 ? grads_ : worker_grads_[k - 1];
  const bool acc = k == 0 ? accumulate : false;
  auto G = [&](int i) { return grads[i].data(); };
  auto done = [&](int i) { return TensorDone(i, on_ready); };
  auto acts = [&](int64_t l) { return Slice(s.layers[static_cast<size_t>(l - first_layer_)], b0); };
  // The same products as the whole backward's weight halves, in its order, from the output
  // gradients the input pass kept.
  if (has_head()) {
    KC_RETURN_IF_ERROR(MatmulBackward<Real>(ctx, nullptr, G(head_), nullptr, rows(s.logits, V),
                                            rows(s.lnf, C), P(head_), BT, C, V, acc));
    if (!spec_.tied_embeddings || !has_embedding()) KC_RETURN_IF_ERROR(done(head_));
    LayerNormBackward<Real>(nullptr, G(lnf_), G(lnf_ + 1), rows(s.lnf_out_grad, C),
                            acts(end_layer_ - 1).residual3, P(lnf_), rows(s.lnf_mean, 1),
                            rows(s.lnf_rstd, 1), BT, C, acc);
    KC_RETURN_IF_ERROR(done(lnf_ + 1));
    KC_RETURN_IF_ERROR(done(lnf_));
  }
  for (int64_t l = end_layer_ - 1; l >= first_layer_; --l) {
    const LayerActs a = acts(l);
    const LayerGrads& d = s.grads[static_cast<size_t>(l - first_layer_)];
    const Real* residual = l == first_layer_ ? rows(s.input, C) : acts(l - 1).residual3;
    auto p = [&](LayerTensor t) { return P(LayerIndex(l, t)); };
    auto g = [&](LayerTensor t) { return G(LayerIndex(l, t)); };
    auto ready = [&](LayerTensor t) { return done(LayerIndex(l, t)); };
    KC_RETURN_IF_ERROR(MatmulBackward<Real>(ctx, nullptr, g(kFcProjW), g(kFcProjB),
                                            rows(d.fcproj_out, C), a.fch_gelu, p(kFcProjW), BT, F,
                                            C, acc));
    KC_RETURN_IF_ERROR(ready(kFcProjB));
    KC_RETURN_IF_ERROR(ready(kFcProjW));
    KC_RETURN_IF_ERROR(MatmulBackward<Real>(ctx, nullptr, g(kFcW), g(kFcB), rows(d.fc_out, F),
                                            a.ln2, p(kFcW), BT, C, F, acc));
    KC_RETURN_IF_ERROR(ready(kFcB));
    KC_RETURN_IF_ERROR(ready(kFcW));
    LayerNormBackward<Real>(nullptr, g(kLn2W), g(kLn2B), rows(d.ln2_out, C), a.residual2, p(kLn2W),
                            a.ln2_mean, a.ln2_rstd, BT, C, acc);
    KC_RETURN_IF_ERROR(ready(kLn2B));
    KC_RETURN_IF_ERROR(ready(kLn2W));
    KC_RETURN_IF_ERROR(MatmulBackward<Real>(ctx, nullptr, g(kProjW), g(kProjB), rows(d.proj_out, C),
                                            a.atty, p(kProjW), BT, Ca, C, acc));
    KC_RETURN_IF_ERROR(ready(kProjB));
    KC_RETURN_IF_ERROR(ready(kProjW));
    KC_RETURN_IF_ERROR(MatmulBackward<Real>(ctx, nullptr, g(kQkvW), g(kQkvB),
                                            rows(d.qkv_out, 3 * Ca), a.ln1, p(kQkvW), BT, C, 3 * Ca,
                                            acc));
    KC_RETURN_IF_ERROR(ready(kQkvB));
    KC_RETURN_IF_ERROR(ready(kQkvW));
    LayerNormBackward<Real>(nullptr, g(kLn1W), g(kLn1B), rows(d.ln1_out, C), residual, p(kLn1W),
                            a.ln1_mean, a.ln1_rstd, BT, C, acc);
    KC_RETURN_IF_ERROR(ready(kLn1B));
    KC_RETURN_IF_ERROR(ready(kLn1W));
  }
  if (!has_embedding()) return OkStatus();
  return EmbeddingBackward(k, s, rows(s.input_grad, C), accumulate, on_ready);
}

template void InitParameterTensor<float>(const ModelSpec&, int, uint64_t, std::span<float>);
template void InitParameterTensor<double>(const ModelSpec&, int, uint64_t, std::span<double>);
template class Gpt<float>;
template class Gpt<double>;

}  // namespace kc::parallel
