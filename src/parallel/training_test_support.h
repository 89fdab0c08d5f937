// Test support for tests that train (trainer_test.cc here, the fault layer's runtime tests): a
// model small enough to step in a millisecond and a corpus with structure to learn, written to
// a temporary directory. Header-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "hal/compute.h"
#include "parallel/data/token_shard.h"
#include "parallel/model_spec.h"
#include "tests/support/temp_dir.h"

namespace kc::parallel::testing {

// One layer, width 32, 16 tokens a sequence.
inline ModelSpec TinyModel() {
  Result<ModelSpec> spec = LoadModelSpecFromString(R"(name: tiny
layers: 1
hidden: 32
heads: 2
vocab: 257
seq_len: 16
batch_per_rank: 2
training:
  lr: 3e-3
  warmup_steps: 2
  weight_decay: 0.1
  grad_clip: 1.0
  seed: 7
)",
                                                   "tiny.yaml");
  KC_CHECK(spec.ok()) << spec.status();
  return *spec;
}

// Sentences of a small grammar as byte tokens: a train split of two shards and a val split.
class TinyCorpus {
 public:
  TinyCorpus() : dir_("kc_tiny_corpus") {
    std::mt19937 gen(11);
    const std::vector<std::string> words = {"the cat ", "a dog ",  "sees ", "likes ",
                                            "the ball", "a house", ". ",    "and "};
    TokenManifest manifest;
    auto shard = [&](const std::string& name, int sentences, std::vector<ManifestShard>* list) {
      std::vector<uint16_t> tokens;
      for (int s = 0; s < sentences; ++s) {
        ByteTokenize(words[gen() % 2] + words[2 + gen() % 2] + words[4 + gen() % 2] + words[6],
                     &tokens);
      }
      KC_CHECK(WriteTokenShard(dir_.Path(name), tokens).ok());
      list->push_back({name, tokens.size()});
    };
    shard("train_00000.tok", 300, &manifest.train);
    shard("train_00001.tok", 200, &manifest.train);
    shard("val_00000.tok", 60, &manifest.val);
    KC_CHECK(WriteTokenManifest(manifest_path(), manifest).ok());
  }
  std::string manifest_path() const { return dir_.Path("manifest.json"); }
  LoaderOptions train() const { return {.manifest = manifest_path(), .split = "train"}; }
  LoaderOptions val() const { return {.manifest = manifest_path(), .split = "val"}; }

 private:
  kc::testing::TempDir dir_;
};

// The largest |a[i] - b[i]| / |a[i]| over the steps both have (a loss trajectory against
// another); their sizes must agree too.
inline double MaxRelativeDifference(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::fabs(a[i]));
  }
  return worst;
}

// The host CPU as a compute device with one thread.
inline std::unique_ptr<hal::ComputeDevice> OneCore(int index) {
  auto device = hal::OpenComputeDevice(
      {.id = "test/cpu" + std::to_string(index), .kind = hal::DeviceKind::kCpu}, {.threads = 1});
  KC_CHECK(device.ok()) << device.status();
  return std::move(device).value();
}

}  // namespace kc::parallel::testing
