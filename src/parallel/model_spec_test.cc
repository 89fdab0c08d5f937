#include "parallel/model_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/repo_root.h"

namespace kc::parallel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using kc::testing::RepoRoot;

std::string Example(const std::string& name) {
  return RepoRoot() + "examples/models/" + name + ".yaml";
}

constexpr const char* kTiny = R"(name: tiny
layers: 4
hidden: 256
heads: 4
seq_len: 128
batch_per_rank: 8
)";

constexpr const char* kGpt2 = R"(name: gpt2
layers: 12
hidden: 768
heads: 12
vocab: 50257
seq_len: 1024
batch_per_rank: 8
)";

ModelSpec MustLoad(std::string_view text) {
  Result<ModelSpec> spec = LoadModelSpecFromString(text, "m.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : ModelSpec{};
}

// `text` with the first `from` replaced by `to`.
std::string Edit(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// The message of a load that must fail with kInvalidArgument.
std::string LoadError(std::string_view text) {
  Result<ModelSpec> spec = LoadModelSpecFromString(text, "m.yaml");
  EXPECT_FALSE(spec.ok());
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), ErrorCode::kInvalidArgument) << spec.status();
  return spec.status().message();
}

TEST(ModelSpecTest, ShippedExamplesLoad) {
  Result<ModelSpec> tiny = LoadModelSpec(Example("gpt-tiny"));
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->name, "gpt-tiny");
  EXPECT_EQ(tiny->layers, 4);
  EXPECT_EQ(tiny->hidden, 256);
  EXPECT_EQ(tiny->heads, 4);
  EXPECT_EQ(tiny->ffn_hidden, 1024);
  EXPECT_EQ(tiny->vocab, 257);
  EXPECT_EQ(tiny->seq_len, 128);
  EXPECT_EQ(tiny->batch_per_rank, 8);
  EXPECT_TRUE(tiny->tied_embeddings);
  EXPECT_EQ(tiny->head_dim(), 64);
  EXPECT_EQ(tiny->tokens_per_rank_step(), 1024);

  Result<ModelSpec> small = LoadModelSpec(Example("gpt-small"));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->layers, 6);
  EXPECT_EQ(small->hidden, 384);
  EXPECT_EQ(small->heads, 6);
  EXPECT_EQ(small->ffn_hidden, 1536);
  EXPECT_EQ(small->vocab, 257);
  EXPECT_EQ(small->seq_len, 256);
  EXPECT_EQ(small->batch_per_rank, 8);
  EXPECT_EQ(ParameterCount(*small), 10'844'544);

  Result<ModelSpec> gpt2 = LoadModelSpec(Example("gpt2-124m"));
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_EQ(ParameterCount(*gpt2), 124'439'808);
  EXPECT_FLOAT_EQ(gpt2->training.lr, 6e-4f);
  EXPECT_EQ(gpt2->training.warmup_steps, 700);
  EXPECT_FLOAT_EQ(gpt2->training.beta2, 0.95f);
}

TEST(ModelSpecTest, MissingFileIsNotFound) {
  Result<ModelSpec> spec = LoadModelSpec(RepoRoot() + "examples/models/no-such-model.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), ErrorCode::kNotFound);
}

TEST(ModelSpecTest, OptionalKeysTakeTheirDefaults) {
  ModelSpec spec = MustLoad(kTiny);
  EXPECT_EQ(spec.ffn_hidden, 4 * 256);
  EXPECT_EQ(spec.vocab, 256);
  EXPECT_TRUE(spec.tied_embeddings);
  EXPECT_FLOAT_EQ(spec.layernorm_eps, 1e-5f);
  EXPECT_EQ(spec.training, TrainingSpec{});
  EXPECT_FLOAT_EQ(spec.training.lr, 3e-4f);
  EXPECT_FLOAT_EQ(spec.training.grad_clip, 1.0f);
  EXPECT_EQ(spec.training.seed, 1337u);
}

TEST(ModelSpecTest, EveryKeyIsRead) {
  ModelSpec spec = MustLoad(std::string(kTiny) + R"(ffn_hidden: 640
vocab: 300
tied_embeddings: false
layernorm_eps: 1e-6
training:
  lr: 0.001
  warmup_steps: 5
  weight_decay: 0.1
  grad_clip: 0
  betas: [0.8, 0.99]
  eps: 1e-6
  seed: 7
)");
  EXPECT_EQ(spec.ffn_hidden, 640);
  EXPECT_EQ(spec.vocab, 300);
  EXPECT_FALSE(spec.tied_embeddings);
  EXPECT_FLOAT_EQ(spec.layernorm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(spec.training.lr, 1e-3f);
  EXPECT_EQ(spec.training.warmup_steps, 5);
  EXPECT_FLOAT_EQ(spec.training.weight_decay, 0.1f);
  EXPECT_FLOAT_EQ(spec.training.grad_clip, 0.0f);
  EXPECT_FLOAT_EQ(spec.training.beta1, 0.8f);
  EXPECT_FLOAT_EQ(spec.training.beta2, 0.99f);
  EXPECT_FLOAT_EQ(spec.training.eps, 1e-6f);
  EXPECT_EQ(spec.training.seed, 7u);
}

TEST(ModelSpecTest, GptTinyParameterCountMatchesTheFormulaAndTheTensors) {
  ModelSpec spec = MustLoad(kTiny);
  // C = 256, F = 1024, V = 256, T = 128, L = 4, tied.
  const int64_t wte = 256 * 256, wpe = 128 * 256;
  const int64_t block = 2 * 256                    // ln1
                        + 3 * 256 * 256 + 3 * 256  // qkv
                        + 256 * 256 + 256          // attn proj
                        + 2 * 256                  // ln2
                        + 1024 * 256 + 1024        // fc
                        + 256 * 1024 + 256;        // mlp proj
  const int64_t lnf = 2 * 256;
  const int64_t expected = wte + wpe + 4 * block + lnf;
  EXPECT_EQ(expected, 3'257'856);
  EXPECT_EQ(ParameterCount(spec), expected);
  EXPECT_EQ(NonEmbeddingParameterCount(spec), 4 * block + lnf);

  int64_t sum = 0;
  for (const TensorSpec& t : ParameterTensors(spec)) sum += t.num_elements;
  EXPECT_EQ(sum, expected);
}

TEST(ModelSpecTest, Gpt2SmallHasTheWellKnownParameterCount) {
  ModelSpec spec = MustLoad(kGpt2);
  EXPECT_EQ(ParameterCount(spec), 124'439'808);
  int64_t sum = 0;
  for (const TensorSpec& t : ParameterTensors(spec)) sum += t.num_elements;
  EXPECT_EQ(sum, 124'439'808);
  EXPECT_EQ(NonEmbeddingParameterCount(spec), 124'439'808 - 50257 * 768 - 1024 * 768);
}

TEST(ModelSpecTest, UntiedEmbeddingsAddAnLmHead) {
  ModelSpec tied = MustLoad(kTiny);
  ModelSpec untied = MustLoad(std::string(kTiny) + "tied_embeddings: false\n");
  EXPECT_EQ(ParameterCount(untied), ParameterCount(tied) + 256 * 256);
  std::vector<TensorSpec> tensors = ParameterTensors(untied);
  ASSERT_FALSE(tensors.empty());
  EXPECT_EQ(tensors.back().name, "lm_head.weight");
  EXPECT_THAT(tensors.back().shape, ElementsAre(256, 256));
  EXPECT_EQ(ParameterTensors(tied).back().name, "lnf.bias");
}

TEST(ModelSpecTest, TensorsComeInForwardOrderPackedBackToBack) {
  ModelSpec spec = MustLoad(std::string(kTiny) + "ffn_hidden: 640\nvocab: 300\n");
  std::vector<TensorSpec> tensors = ParameterTensors(spec);
  ASSERT_EQ(tensors.size(), 2u + 4u * 12u + 2u);
  std::vector<std::string> block = {"ln1.weight",    "ln1.bias",         "attn.qkv.weight",
                                    "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
                                    "ln2.weight",    "ln2.bias",         "mlp.fc.weight",
                                    "mlp.fc.bias",   "mlp.proj.weight",  "mlp.proj.bias"};
  std::vector<std::string> names = {"wte", "wpe"};
  for (int l = 0; l < 4; ++l) {
    for (const std::string& b : block) names.push_back("h." + std::to_string(l) + "." + b);
  }
  names.push_back("lnf.weight");
  names.push_back("lnf.bias");
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(tensors[i].name, names[i]);
    EXPECT_EQ(tensors[i].offset, offset) << tensors[i].name;
    int64_t product = 1;
    for (int64_t d : tensors[i].shape) product *= d;
    EXPECT_EQ(tensors[i].num_elements, product) << tensors[i].name;
    offset += tensors[i].num_elements;
  }
  EXPECT_EQ(offset, ParameterCount(spec));
  EXPECT_THAT(tensors[0].shape, ElementsAre(300, 256));   // wte (V, C)
  EXPECT_THAT(tensors[1].shape, ElementsAre(128, 256));   // wpe (T, C)
  EXPECT_THAT(tensors[2].shape, ElementsAre(256));        // ln1.weight (C)
  EXPECT_THAT(tensors[4].shape, ElementsAre(768, 256));   // qkv.weight (3C, C)
  EXPECT_THAT(tensors[5].shape, ElementsAre(768));        // qkv.bias (3C)
  EXPECT_THAT(tensors[6].shape, ElementsAre(256, 256));   // attn.proj.weight (C, C)
  EXPECT_THAT(tensors[10].shape, ElementsAre(640, 256));  // mlp.fc.weight (F, C)
  EXPECT_THAT(tensors[11].shape, ElementsAre(640));       // mlp.fc.bias (F)
  EXPECT_THAT(tensors[12].shape, ElementsAre(256, 640));  // mlp.proj.weight (C, F)
  EXPECT_THAT(tensors[13].shape, ElementsAre(256));       // mlp.proj.bias (C)
}

TEST(ModelSpecTest, BackwardOrderIsTheReverseWithForwardOffsets) {
  ModelSpec spec = MustLoad(kTiny);
  std::vector<TensorSpec> forward = ParameterTensors(spec);
  std::vector<TensorSpec> backward = ParameterTensorsBackwardOrder(spec);
  ASSERT_EQ(backward.size(), forward.size());
  for (size_t i = 0; i < forward.size(); ++i) {
    EXPECT_EQ(backward[i], forward[forward.size() - 1 - i]);
  }
  EXPECT_EQ(backward.front().name, "lnf.bias");
  EXPECT_EQ(backward[2].name, "h.3.mlp.proj.bias");
  EXPECT_EQ(backward.back().name, "wte");
  EXPECT_EQ(backward.back().offset, 0);
}

TEST(ModelSpecTest, FlopsPerTokenFollowTheDocumentedFormula) {
  ModelSpec spec = MustLoad(kGpt2);
  const double n = 124'439'808.0 - 50257.0 * 768 - 1024.0 * 768;  // non-embedding
  const double expected = 6 * (n + 50257.0 * 768) + 6 * 12.0 * 1024 * 768;
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(spec), expected);
  // Tying changes the parameter count, not the work.
  ModelSpec untied = spec;
  untied.tied_embeddings = false;
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(untied), expected);
  // gpt-tiny, as docs/user-guide/models.md lists it (2.01e7).
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(MustLoad(kTiny)),
                   6.0 * (3'257'856 - 256 * 256 - 128 * 256 + 256 * 256) + 6.0 * 4 * 128 * 256);
}

TEST(ModelSpecTest, YamlRoundTripGivesAnEqualSpec) {
  for (const char* name : {"gpt-tiny", "gpt-small", "gpt2-124m"}) {
    Result<ModelSpec> spec = LoadModelSpec(Example(name));
    ASSERT_TRUE(spec.ok()) << spec.status();
    std::string yaml = ModelSpecToYaml(*spec);
    Result<ModelSpec> again = LoadModelSpecFromString(yaml, name);
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
    EXPECT_EQ(*again, *spec) << yaml;
  }
  ModelSpec odd = MustLoad(std::string(kTiny) +
                           "tied_embeddings: false\nlayernorm_eps: 3.3e-7\n"
                           "training: {lr: 0.1, betas: [0, 0.999], seed: 0}\n");
  Result<ModelSpec> again = LoadModelSpecFromString(ModelSpecToYaml(odd), "odd");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, odd);
}

TEST(ModelSpecTest, ValidateNamesTheBadField) {
  ModelSpec spec = MustLoad(kTiny);
  EXPECT_TRUE(ValidateModelSpec(spec).ok());
  spec.heads = 3;
  Status s = ValidateModelSpec(spec);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "model tiny: heads: expected a divisor of hidden (256), got \"3\"");
  spec.heads = 4;
  spec.seq_len = 0;
  EXPECT_THAT(ValidateModelSpec(spec).message(), StartsWith("model tiny: seq_len: expected"));
  spec.seq_len = 128;
  spec.name = "a b";
  EXPECT_THAT(ValidateModelSpec(spec).message(), StartsWith("model a b: name: expected"));
}

TEST(ModelSpecTest, UnknownKeysAreRejectedWithASuggestion) {
  EXPECT_EQ(LoadError(Edit(kTiny, "heads: 4\n", "heads: 4\nhead: 4\n")),
            "m.yaml:5: head: unknown key, did you mean \"heads\"?");
  EXPECT_EQ(LoadError(std::string(kTiny) + "training:\n  weight_decy: 0.1\n"),
            "m.yaml:8: training.weight_decy: unknown key, did you mean \"weight_decay\"?");
  EXPECT_THAT(LoadError(std::string(kTiny) + "dropout: 0.1\n"), StartsWith("m.yaml:7: dropout:"));
}

TEST(ModelSpecTest, HeadsMustDivideHidden) {
  EXPECT_EQ(LoadError(Edit(kTiny, "heads: 4", "heads: 5")),
            "m.yaml:4: heads: expected a divisor of hidden (256), got \"5\"");
  EXPECT_EQ(LoadError(Edit(kTiny, "heads: 4", "heads: 512")),
            "m.yaml:4: heads: expected a divisor of hidden (256), got \"512\"");
}

TEST(ModelSpecTest, ABadHiddenGivesNoFollowOnDivisorError) {
  EXPECT_EQ(LoadError(Edit(kTiny, "hidden: 256", "hidden: big")),
            "m.yaml:3: hidden: expected an integer in [1, 131072], got \"big\"");
}

TEST(ModelSpecTest, VocabAboveUint16IsRejected) {
  EXPECT_EQ(LoadError(std::string(kTiny) + "vocab: 65537\n"),
            "m.yaml:7: vocab: expected at most 65536 tokens (token ids are uint16), got \"65537\"");
  EXPECT_TRUE(LoadModelSpecFromString(std::string(kTiny) + "vocab: 65536\n", "m.yaml").ok());
}

TEST(ModelSpecTest, ZeroOrNegativeSizesAreRejected) {
  EXPECT_EQ(LoadError(Edit(kTiny, "layers: 4", "layers: 0")),
            "m.yaml:2: layers: expected an integer in [1, 4096], got \"0\"");
  EXPECT_EQ(LoadError(Edit(kTiny, "seq_len: 128", "seq_len: -1")),
            "m.yaml:5: seq_len: expected an integer in [1, 1048576], got \"-1\"");
  EXPECT_EQ(LoadError(Edit(kTiny, "batch_per_rank: 8", "batch_per_rank: 0")),
            "m.yaml:6: batch_per_rank: expected an integer in [1, 1048576], got \"0\"");
  EXPECT_EQ(LoadError(std::string(kTiny) + "ffn_hidden: 0\n"),
            "m.yaml:7: ffn_hidden: expected an integer in [1, 1048576], got \"0\"");
  EXPECT_EQ(LoadError(std::string(kTiny) + "vocab: 0\n"),
            "m.yaml:7: vocab: expected a positive integer, got \"0\"");
  EXPECT_EQ(LoadError(std::string(kTiny) + "layernorm_eps: 0\n"),
            "m.yaml:7: layernorm_eps: expected a number in (0, 1], got \"0\"");
  EXPECT_EQ(LoadError(std::string(kTiny) + "training: {lr: -0.1}\n"),
            "m.yaml:7: training.lr: expected a positive number, got \"-0.1\"");
  EXPECT_EQ(LoadError(std::string(kTiny) + "training: {warmup_steps: -5}\n"),
            "m.yaml:7: training.warmup_steps: expected a non-negative integer, got \"-5\"");
}

TEST(ModelSpecTest, WrongTypesAreRejected) {
  EXPECT_THAT(LoadError(Edit(kTiny, "layers: 4", "layers: \"4\"")),
              StartsWith("m.yaml:2: layers: expected an integer in [1, 4096], got \"4\""));
  EXPECT_EQ(LoadError(Edit(kTiny, "hidden: 256", "hidden: 256.0")),
            "m.yaml:3: hidden: expected an integer in [1, 131072], got \"256.0\"");
  EXPECT_EQ(LoadError(std::string(kTiny) + "tied_embeddings: yes\n"),
            "m.yaml:7: tied_embeddings: expected true or false, got \"yes\"");
  EXPECT_THAT(LoadError(std::string(kTiny) + "training: 3\n"),
              StartsWith("m.yaml:7: training: expected a map"));
  EXPECT_THAT(LoadError(std::string(kTiny) + "training: {betas: [0.9, x]}\n"),
              StartsWith("m.yaml:7: training.betas[1]: expected a number"));
}

TEST(ModelSpecTest, MissingRequiredKeysAreRejected) {
  EXPECT_EQ(LoadError(Edit(kTiny, "heads: 4\n", "")), "m.yaml:1: heads: required key is missing");
  EXPECT_EQ(LoadError(Edit(kTiny, "name: tiny\n", "")), "m.yaml:1: name: required key is missing");
}

TEST(ModelSpecTest, BadBetasAndNamesAreRejected) {
  EXPECT_EQ(LoadError(std::string(kTiny) + "training: {betas: [0.9]}\n"),
            "m.yaml:7: training.betas: expected two numbers in [0, 1), as [0.9, 0.95]");
  EXPECT_EQ(LoadError(std::string(kTiny) + "training: {betas: [0.9, 1]}\n"),
            "m.yaml:7: training.betas: expected two numbers in [0, 1), as [0.9, 0.95]");
  EXPECT_THAT(LoadError(Edit(kTiny, "name: tiny", "name: \"my model\"")),
              StartsWith("m.yaml:1: name: expected a non-empty name of letters"));
  EXPECT_THAT(LoadError(Edit(kTiny, "name: tiny", "name: \"\"")),
              HasSubstr("name: expected a non-empty name"));
}

}  // namespace
}  // namespace kc::parallel
