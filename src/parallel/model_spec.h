// The model declaration: a GPT-style decoder-only transformer read from a YAML file
// (examples/models/), its parameter tensors in registration order, and its size and cost.
// Format, defaults and error messages: docs/user-guide/models.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kc::parallel {

// Optimizer and schedule settings (AdamW, linear warmup then cosine decay), the `training:`
// section. The schedule and update rules: parallel/optimizer.h.
struct TrainingSpec {
  float lr = 3e-4f;              // peak learning rate, reached after warmup_steps
  int64_t warmup_steps = 0;      // linear warmup from 0 to lr; 0 = none
  float min_lr_fraction = 0.1f;  // cosine decay ends at lr * this at the last step
  float weight_decay = 0.0f;     // AdamW decoupled decay, applied to the 2-D (matrix) tensors
  float grad_clip = 1.0f;        // clip the global gradient L2 norm to this; 0 = no clipping
  float beta1 = 0.9f;            // AdamW first-moment decay
  float beta2 = 0.95f;           // AdamW second-moment decay
  float eps = 1e-8f;             // AdamW denominator epsilon
  uint64_t seed = 1337;          // parameter initialisation and data order

  friend bool operator==(const TrainingSpec&, const TrainingSpec&) = default;
};

// A GPT-2-style decoder-only transformer (pre-LayerNorm, GELU MLP, learned positions), as
// llm.c's train_gpt2.c. A plain copyable value. Dims: L = layers, C = hidden, NH = heads,
// F = ffn_hidden, V = vocab, T = seq_len, B = batch_per_rank.
struct ModelSpec {
  std::string name;             // letters, digits, '.', '_', '-'
  int64_t layers = 0;           // L, transformer blocks
  int64_t hidden = 0;           // C, the residual stream width
  int64_t heads = 0;            // NH, attention heads; divides C
  int64_t ffn_hidden = 0;       // F, MLP inner width; the file's default is 4*C
  int64_t vocab = 256;          // V, token ids 0..V-1 (uint16); 256 = bytes
  int64_t seq_len = 0;          // T, tokens per sequence (the context length)
  int64_t batch_per_rank = 0;   // B, sequences per rank per step
  bool tied_embeddings = true;  // the LM head reuses wte; else its own lm_head.weight
  float layernorm_eps = 1e-5f;
  TrainingSpec training;

  int64_t head_dim() const { return hidden / heads; }  // REQUIRES: heads > 0
  int64_t tokens_per_rank_step() const { return batch_per_rank * seq_len; }

  friend bool operator==(const ModelSpec&, const ModelSpec&) = default;
};

// Reads the model file at `path`. Returns kNotFound if the file does not exist, and
// kInvalidArgument as "FILE:LINE: key.path: what" for anything the file gets wrong: an
// unknown key (with a did-you-mean), a wrong type, a missing required key, a value out of
// range (zero or negative sizes, vocab above 65536), heads not dividing hidden, a bad name,
// betas not two numbers in [0, 1). Blocks on file I/O only.
Result<ModelSpec> LoadModelSpec(const std::string& path);

// As LoadModelSpec, for YAML text in memory; `display_name` stands for the file in errors.
Result<ModelSpec> LoadModelSpecFromString(std::string_view text, std::string display_name);

// The model file for `spec`, with every key written out. Loading it gives back an equal
// spec when `spec` is valid.
std::string ModelSpecToYaml(const ModelSpec& spec);

// OK if `spec` (built in code, say) satisfies every rule a model file must; else
// kInvalidArgument naming the field, as "<model NAME>:LINE: heads: ...".
Status ValidateModelSpec(const ModelSpec& spec);

// One parameter tensor of the model, row-major.
struct TensorSpec {
  std::string name;            // "wte", "h.0.attn.qkv.weight", "lnf.bias", ...
  std::vector<int64_t> shape;  // e.g. {3*C, C} for a qkv weight ([out, in] for matrices)
  int64_t num_elements = 0;    // the product of shape
  int64_t offset = 0;          // elements before this tensor in the forward-order arena

  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

// Every parameter tensor in forward (registration) order, packed back to back (offsets
// count elements from 0):
//   wte (V, C), wpe (T, C),
//   per layer l = 0..L-1, prefix "h.l.":
//     ln1.weight (C), ln1.bias (C), attn.qkv.weight (3*C, C), attn.qkv.bias (3*C),
//     attn.proj.weight (C, C), attn.proj.bias (C), ln2.weight (C), ln2.bias (C),
//     mlp.fc.weight (F, C), mlp.fc.bias (F), mlp.proj.weight (C, F), mlp.proj.bias (C),
//   lnf.weight (C), lnf.bias (C), and lm_head.weight (V, C) only if !tied_embeddings.
// REQUIRES: ValidateModelSpec(spec).ok().
std::vector<TensorSpec> ParameterTensors(const ModelSpec& spec);

// ParameterTensors in reverse: the order backward produces gradients, in which gradient
// buckets are filled. Offsets still refer to the forward-order arena.
std::vector<TensorSpec> ParameterTensorsBackwardOrder(const ModelSpec& spec);

// The number of parameters, the sum of ParameterTensors' element counts:
//   V*C + T*C + L*(4*C*C + 2*C*F + 9*C + F) + 2*C  (+ V*C if untied).
// GPT-2 124M (L=12, C=768, V=50257, T=1024, tied) gives 124,439,808.
// REQUIRES: ValidateModelSpec(spec).ok().
int64_t ParameterCount(const ModelSpec& spec);

// Parameters outside the embeddings (wte, wpe) and the LM head: the transformer blocks and
// the final LayerNorm, L*(4*C*C + 2*C*F + 9*C + F) + 2*C.
// REQUIRES: ValidateModelSpec(spec).ok().
int64_t NonEmbeddingParameterCount(const ModelSpec& spec);

// Training FLOPs (forward + backward) per token, the estimate MFU is measured against:
//   6 * (NonEmbeddingParameterCount + V*C) + 6 * L * T * C.
// 6*N is 2 FLOPs per parameter forward and 4 backward (Kaplan et al. 2020, "Scaling Laws
// for Neural Language Models", Table 1); V*C is the logits matmul, counted whether or not it
// is tied to wte (as Chinchilla, Hoffmann et al. 2022, App. F, counts it); 6*L*T*C is
// attention's QK^T and AV with the causal mask (Kaplan's 2*L*T*C forward, times 3). The
// embedding lookups are gathers and count nothing. See docs/user-guide/models.md.
// REQUIRES: ValidateModelSpec(spec).ok().
double TrainingFlopsPerToken(const ModelSpec& spec);

}  // namespace kc::parallel
