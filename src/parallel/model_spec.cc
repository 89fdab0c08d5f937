// Reading, writing and sizing a model declaration (docs/user-guide/models.md).
#include "parallel/model_spec.h"

#include <algorithm>
#include <charconv>
#include <sstream>
#include <utility>

#include "base/config.h"

namespace kc::parallel {
namespace {

// Limits that keep every size product (e.g. L*C*F) well inside int64_t.
constexpr double kMaxLayers = 4096;
constexpr double kMaxHidden = 131072;
constexpr double kMaxFfnHidden = 1 << 20;
constexpr double kMaxSeqLen = 1 << 20;
constexpr double kMaxBatch = 1 << 20;
constexpr int64_t kMaxVocab = 65536;  // token ids are uint16

bool IsValidName(const std::string& name) {
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

void ParseTraining(config::Map t, TrainingSpec* training) {
  const TrainingSpec d;
  training->lr = static_cast<float>(t.OptionalDouble("lr", d.lr, config::Positive()));
  training->warmup_steps = t.OptionalInt("warmup_steps", d.warmup_steps, config::NonNegative());
  training->min_lr_fraction = static_cast<float>(
      t.OptionalDouble("min_lr_fraction", d.min_lr_fraction, config::InRange(0.0, 1.0)));
  training->weight_decay =
      static_cast<float>(t.OptionalDouble("weight_decay", d.weight_decay, config::NonNegative()));
  training->grad_clip =
      static_cast<float>(t.OptionalDouble("grad_clip", d.grad_clip, config::NonNegative()));
  std::vector<double> betas = t.OptionalDoubleList("betas", {d.beta1, d.beta2});
  bool betas_ok = betas.size() == 2 &&
                  std::all_of(betas.begin(), betas.end(), [](double b) { return b >= 0 && b < 1; });
  if (t.Has("betas") && !betas_ok) {
    t.Reject("betas", "expected two numbers in [0, 1), as [0.9, 0.95]");
  } else if (betas_ok) {
    training->beta1 = static_cast<float>(betas[0]);
    training->beta2 = static_cast<float>(betas[1]);
  }
  training->eps = static_cast<float>(
      t.OptionalDouble("eps", d.eps, {.min = 0, .max = 1, .min_exclusive = true}));
  training->seed = static_cast<uint64_t>(
      t.OptionalInt("seed", static_cast<int64_t>(d.seed), config::NonNegative()));
}

Result<ModelSpec> ParseModelSpec(config::Document doc) {
  config::Map root = doc.root();
  ModelSpec spec;
  spec.name = root.String("name");
  if (root.Has("name") && !IsValidName(spec.name)) {
    root.Reject("name", "expected a non-empty name of letters, digits, '.', '_' and '-'");
  }
  spec.layers = root.Int("layers", {.min = 1, .max = kMaxLayers});
  spec.hidden = root.Int("hidden", {.min = 1, .max = kMaxHidden});
  // A bad hidden or heads reads as 1, so a divisibility error is never a follow-on error.
  spec.heads = root.Int("heads", {.min = 1, .max = kMaxHidden});
  if (spec.hidden % spec.heads != 0) {
    root.Reject("heads", "expected a divisor of hidden (" + std::to_string(spec.hidden) + ")");
  }
  spec.ffn_hidden =
      root.OptionalInt("ffn_hidden", 4 * spec.hidden, {.min = 1, .max = kMaxFfnHidden});
  spec.vocab = root.OptionalInt("vocab", 256, config::Positive());
  if (spec.vocab > kMaxVocab) {
    root.Reject("vocab", "expected at most 65536 tokens (token ids are uint16)");
  }
  spec.seq_len = root.Int("seq_len", {.min = 1, .max = kMaxSeqLen});
  spec.batch_per_rank = root.Int("batch_per_rank", {.min = 1, .max = kMaxBatch});
  spec.tied_embeddings = root.OptionalBool("tied_embeddings", true);
  spec.layernorm_eps = static_cast<float>(
      root.OptionalDouble("layernorm_eps", 1e-5, {.min = 0, .max = 1, .min_exclusive = true}));
  ParseTraining(root.OptionalMap("training"), &spec.training);
  KC_RETURN_IF_ERROR(doc.Finish());
  return spec;
}

// The shortest decimal that reads back as `x` (as a float).
std::string ShortestFloat(float x) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}

// Elements per block: ln1, qkv, attn proj, ln2, fc, mlp proj (weights and biases).
int64_t BlockParameterCount(const ModelSpec& s) {
  const int64_t C = s.hidden, F = s.ffn_hidden;
  return 4 * C * C + 2 * C * F + 9 * C + F;
}

}  // namespace

Result<ModelSpec> LoadModelSpec(const std::string& path) {
  KC_ASSIGN_OR_RETURN(config::Document doc, config::Document::LoadFile(path));
  return ParseModelSpec(std::move(doc));
}

Result<ModelSpec> LoadModelSpecFromString(std::string_view text, std::string display_name) {
  KC_ASSIGN_OR_RETURN(config::Document doc,
                      config::Document::LoadString(text, std::move(display_name)));
  return ParseModelSpec(std::move(doc));
}

std::string ModelSpecToYaml(const ModelSpec& spec) {
  const TrainingSpec& t = spec.training;
  std::ostringstream out;
  out << "name: \"" << spec.name << "\"\n"
      << "layers: " << spec.layers << "\n"
      << "hidden: " << spec.hidden << "\n"
      << "heads: " << spec.heads << "\n"
      << "ffn_hidden: " << spec.ffn_hidden << "\n"
      << "vocab: " << spec.vocab << "\n"
      << "seq_len: " << spec.seq_len << "\n"
      << "batch_per_rank: " << spec.batch_per_rank << "\n"
      << "tied_embeddings: " << (spec.tied_embeddings ? "true" : "false") << "\n"
      << "layernorm_eps: " << ShortestFloat(spec.layernorm_eps) << "\n"
      << "training:\n"
      << "  lr: " << ShortestFloat(t.lr) << "\n"
      << "  warmup_steps: " << t.warmup_steps << "\n"
      << "  min_lr_fraction: " << ShortestFloat(t.min_lr_fraction) << "\n"
      << "  weight_decay: " << ShortestFloat(t.weight_decay) << "\n"
      << "  grad_clip: " << ShortestFloat(t.grad_clip) << "\n"
      << "  betas: [" << ShortestFloat(t.beta1) << ", " << ShortestFloat(t.beta2) << "]\n"
      << "  eps: " << ShortestFloat(t.eps) << "\n"
      << "  seed: " << t.seed << "\n";
  return out.str();
}

Status ValidateModelSpec(const ModelSpec& spec) {
  // The file format holds every rule; a name that does not fit it is rejected by the read.
  std::string display = "model " + spec.name;
  Result<ModelSpec> reread = LoadModelSpecFromString(ModelSpecToYaml(spec), display);
  if (reread.ok()) return OkStatus();
  // "model NAME:LINE: key: ..." -> "model NAME: key: ...": the line is the generated text's.
  std::string message = reread.status().message();
  if (message.rfind(display + ":", 0) == 0) {
    size_t colon = message.find(": ", display.size());
    if (colon != std::string::npos) message = display + message.substr(colon);
  }
  return InvalidArgumentError(message);
}

std::vector<TensorSpec> ParameterTensors(const ModelSpec& spec) {
  const int64_t L = spec.layers, C = spec.hidden, F = spec.ffn_hidden, V = spec.vocab,
                T = spec.seq_len;
  std::vector<TensorSpec> tensors;
  tensors.reserve(static_cast<size_t>(12 * L + 5));
  int64_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    tensors.push_back({std::move(name), std::move(shape), n, offset});
    offset += n;
  };
  add("wte", {V, C});
  add("wpe", {T, C});
  for (int64_t l = 0; l < L; ++l) {
    std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln1.weight", {C});
    add(h + "ln1.bias", {C});
    add(h + "attn.qkv.weight", {3 * C, C});
    add(h + "attn.qkv.bias", {3 * C});
    add(h + "attn.proj.weight", {C, C});
    add(h + "attn.proj.bias", {C});
    add(h + "ln2.weight", {C});
    add(h + "ln2.bias", {C});
    add(h + "mlp.fc.weight", {F, C});
    add(h + "mlp.fc.bias", {F});
    add(h + "mlp.proj.weight", {C, F});
    add(h + "mlp.proj.bias", {C});
  }
  add("lnf.weight", {C});
  add("lnf.bias", {C});
  if (!spec.tied_embeddings) add("lm_head.weight", {V, C});
  return tensors;
}

std::vector<TensorSpec> ParameterTensorsBackwardOrder(const ModelSpec& spec) {
  std::vector<TensorSpec> tensors = ParameterTensors(spec);
  std::reverse(tensors.begin(), tensors.end());
  return tensors;
}

int64_t NonEmbeddingParameterCount(const ModelSpec& spec) {
  return spec.layers * BlockParameterCount(spec) + 2 * spec.hidden;
}

int64_t ParameterCount(const ModelSpec& spec) {
  const int64_t embedding = spec.vocab * spec.hidden;
  return embedding + spec.seq_len * spec.hidden + NonEmbeddingParameterCount(spec) +
         (spec.tied_embeddings ? 0 : embedding);
}

double TrainingFlopsPerToken(const ModelSpec& spec) {
  const double matmul_params = static_cast<double>(NonEmbeddingParameterCount(spec)) +
                               static_cast<double>(spec.vocab) * static_cast<double>(spec.hidden);
  const double attention = 6.0 * static_cast<double>(spec.layers) *
                           static_cast<double>(spec.seq_len) * static_cast<double>(spec.hidden);
  return 6.0 * matmul_params + attention;
}

}  // namespace kc::parallel
