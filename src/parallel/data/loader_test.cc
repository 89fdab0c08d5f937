// DataLoader: determinism from the seed, disjoint ranks, save/restore, epoch rollover, bad
// input.
#include "parallel/data/loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "parallel/data/token_shard.h"

namespace kc::parallel {
namespace {

using ::testing::HasSubstr;

// A temp directory holding shards whose token i (counted over all shards) is i % modulus,
// so a window's first input says where it came from. Removed in the destructor.
class ShardDir {
 public:
  explicit ShardDir(const std::vector<size_t>& shard_tokens, uint32_t modulus = 250) {
    static int n = 0;
    dir_ =
        ::testing::TempDir() + "kc_loader_" + std::to_string(getpid()) + "_" + std::to_string(n++);
    std::filesystem::create_directories(dir_);
    TokenManifest manifest;
    size_t next = 0;
    for (size_t i = 0; i < shard_tokens.size(); ++i) {
      std::vector<uint16_t> tokens;
      for (size_t t = 0; t < shard_tokens[i]; ++t) {
        tokens.push_back(static_cast<uint16_t>((next++) % modulus));
      }
      const std::string name = "train_0000" + std::to_string(i) + ".tok";
      const TokenShardHeader header{.vocab_size = std::max(modulus, kByteVocabSize)};
      KC_CHECK(WriteTokenShard(dir_ + "/" + name, tokens, header).ok());
      files_.push_back(dir_ + "/" + name);
      manifest.train.push_back({name, tokens.size()});
    }
    KC_CHECK(WriteTokenManifest(manifest_path(), manifest).ok());
  }
  ~ShardDir() { std::filesystem::remove_all(dir_); }
  const std::vector<std::string>& files() const { return files_; }
  std::string manifest_path() const { return dir_ + "/manifest.json"; }

 private:
  std::string dir_;
  std::vector<std::string> files_;
};

std::unique_ptr<DataLoader> Open(const LoaderOptions& options) {
  Result<std::unique_ptr<DataLoader>> loader = OpenDataLoader(options);
  KC_CHECK(loader.ok()) << loader.status().ToString();
  return std::move(loader).value();
}

// The next `steps` batches' inputs, concatenated.
std::vector<int32_t> Take(DataLoader& loader, int steps) {
  std::vector<int32_t> out;
  Batch b;
  for (int i = 0; i < steps; ++i) {
    loader.Next(&b);
    out.insert(out.end(), b.inputs.begin(), b.inputs.end());
  }
  return out;
}

TEST(DataLoaderTest, TargetsAreInputsShiftedByOneToken) {
  ShardDir data({1000}, /*modulus=*/65536);
  auto loader = Open({.manifest = data.manifest_path(), .seq_len = 16, .batch = 4, .seed = 3});
  EXPECT_EQ(loader->num_tokens(), 1000);
  EXPECT_EQ(loader->num_windows(), 999 / 16);
  EXPECT_EQ(loader->vocab_size(), 65536u);
  Batch b;
  loader->Next(&b);
  ASSERT_EQ(b.inputs.size(), 4u * 16);
  ASSERT_EQ(b.targets.size(), 4u * 16);
  for (int row = 0; row < 4; ++row) {
    EXPECT_EQ(b.inputs[row * 16] % 16, 0) << "windows start every seq_len tokens";
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(b.targets[row * 16 + t], b.inputs[row * 16 + t] + 1);
    }
  }
}

TEST(DataLoaderTest, SameSeedSameBatchesOtherSeedOthers) {
  ShardDir data({3000, 1500});
  LoaderOptions o{.files = data.files(), .seq_len = 32, .batch = 2, .seed = 42};
  auto a = Open(o);
  auto b = Open(o);
  EXPECT_EQ(Take(*a, 20), Take(*b, 20));
  o.seed = 43;
  auto c = Open(o);
  auto d = Open({.files = data.files(), .seq_len = 32, .batch = 2, .seed = 42});
  EXPECT_NE(Take(*c, 5), Take(*d, 5));
}

TEST(DataLoaderTest, PermutationIsPinnedAcrossPlatforms) {
  // A change here changes every run's data order: bump the state tag if it is deliberate.
  EXPECT_EQ(DeterministicPermutation(8, 1), (std::vector<uint64_t>{4, 3, 2, 7, 5, 6, 0, 1}));
  std::vector<uint64_t> p = DeterministicPermutation(1000, 9);
  std::sort(p.begin(), p.end());
  for (uint64_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], i);
  EXPECT_TRUE(DeterministicPermutation(0, 1).empty());
}

class DataLoaderRanksTest : public ::testing::TestWithParam<int> {};

TEST_P(DataLoaderRanksTest, RanksTakeDisjointWindowsCoveringEachGlobalBatch) {
  const int world = GetParam();
  ShardDir data({2000, 777}, /*modulus=*/65536);
  const int64_t T = 8, B = 3;
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(Open({.files = data.files(),
                          .seq_len = T,
                          .batch = B,
                          .rank = r,
                          .world_size = world,
                          .seed = 5}));
  }
  // One rank with the whole global batch sees exactly the union, in rank order.
  auto whole = Open({.files = data.files(), .seq_len = T, .batch = B * world, .seed = 5});
  const int64_t steps = ranks[0]->steps_per_epoch();
  EXPECT_EQ(steps, whole->steps_per_epoch());
  std::set<int32_t> seen;  // first inputs: tokens are unique, so they name the window
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<int32_t> joined;
    for (int r = 0; r < world; ++r) {
      Batch b;
      ranks[r]->Next(&b);
      EXPECT_EQ(b.step, s);
      joined.insert(joined.end(), b.inputs.begin(), b.inputs.end());
      for (int64_t row = 0; row < B; ++row) seen.insert(b.inputs[row * T]);
    }
    Batch w;
    whole->Next(&w);
    ASSERT_EQ(joined, w.inputs) << "step " << s;
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), steps * B * world)
      << "a window was handed out twice in one epoch";
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DataLoaderRanksTest, ::testing::Values(1, 2, 3, 4));

TEST(DataLoaderTest, UnevenSharesCoverEachGlobalBatchInRankOrder) {
  // 10 sequences over 3 ranks: 4, 3, 3. Joined in rank order they are one rank's global batch,
  // so a restored state carries over between even and uneven splits.
  ShardDir data({3000}, /*modulus=*/65536);
  const int64_t T = 8, G = 10;
  auto whole = Open({.files = data.files(), .seq_len = T, .batch = G, .seed = 3});
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(Open({.files = data.files(),
                          .seq_len = T,
                          .batch = r == 0 ? 4 : 3,
                          .rank = r,
                          .world_size = 3,
                          .global_batch = G,
                          .seed = 3}));
  }
  EXPECT_EQ(ranks[2]->steps_per_epoch(), whole->steps_per_epoch());
  for (int s = 0; s < 5; ++s) {
    std::vector<int32_t> joined;
    for (auto& r : ranks) {
      std::vector<int32_t> part = Take(*r, 1);
      joined.insert(joined.end(), part.begin(), part.end());
    }
    EXPECT_EQ(joined, Take(*whole, 1)) << "step " << s;
  }
  EXPECT_EQ(ranks[1]->state(), whole->state());
  // A batch that is not the rank's share is refused.
  Result<std::unique_ptr<DataLoader>> wrong = OpenDataLoader({.files = data.files(),
                                                              .seq_len = T,
                                                              .batch = 4,
                                                              .rank = 2,
                                                              .world_size = 3,
                                                              .global_batch = G});
  EXPECT_EQ(wrong.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("is not rank 2's share"));
}

TEST(DataLoaderTest, RestoredStateContinuesIdentically) {
  ShardDir data({5000});
  LoaderOptions o{.manifest = data.manifest_path(), .seq_len = 10, .batch = 4, .seed = 11};
  auto a = Open(o);
  Take(*a, 7);  // mid-epoch
  const std::string saved = a->state().Serialize();
  EXPECT_THAT(saved, HasSubstr("kc-loader/1 epoch=0 position=28 fingerprint="));
  const std::vector<int32_t> expected = Take(*a, 300);  // crosses epoch boundaries

  auto b = Open(o);
  Result<LoaderState> state = LoaderState::Parse(saved);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE(b->Restore(*state).ok());
  EXPECT_EQ(Take(*b, 300), expected);
  EXPECT_EQ(a->state(), b->state());
}

TEST(DataLoaderTest, RestoreAcrossWorldSizesWithTheSameGlobalBatch) {
  ShardDir data({4000});
  auto single = Open({.files = data.files(), .seq_len = 10, .batch = 4, .seed = 2});
  Take(*single, 30);
  const LoaderState saved = single->state();
  const std::vector<int32_t> expected = Take(*single, 5);
  std::vector<int32_t> joined;
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(Open(
        {.files = data.files(), .seq_len = 10, .batch = 2, .rank = r, .world_size = 2, .seed = 2}));
    ASSERT_TRUE(ranks.back()->Restore(saved).ok());
  }
  for (int s = 0; s < 5; ++s) {
    for (auto& r : ranks) {
      std::vector<int32_t> part = Take(*r, 1);
      joined.insert(joined.end(), part.begin(), part.end());
    }
  }
  EXPECT_EQ(joined, expected);
}

TEST(DataLoaderTest, EpochsRollOverWithANewOrderAndCoverEveryWindow) {
  ShardDir data({1 + 10 * 12});  // exactly 12 windows of seq_len 10
  auto loader = Open({.files = data.files(), .seq_len = 10, .batch = 4, .seed = 1});
  ASSERT_EQ(loader->num_windows(), 12);
  ASSERT_EQ(loader->steps_per_epoch(), 3);
  std::vector<std::multiset<int32_t>> epochs(2);
  std::vector<std::vector<int32_t>> orders(2);
  Batch b;
  for (int e = 0; e < 2; ++e) {
    for (int s = 0; s < 3; ++s) {
      loader->Next(&b);
      EXPECT_EQ(b.epoch, e);
      EXPECT_EQ(b.step, s);
      for (int r = 0; r < 4; ++r) {
        epochs[e].insert(b.inputs[r * 10]);
        orders[e].push_back(b.inputs[r * 10]);
      }
    }
  }
  const std::multiset<int32_t> every = {0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110};
  EXPECT_EQ(epochs[0], every);
  EXPECT_EQ(epochs[1], every);
  EXPECT_NE(orders[0], orders[1]);
  loader->Next(&b);
  EXPECT_EQ(b.epoch, 2);
  EXPECT_EQ(b.step, 0);
}

TEST(DataLoaderTest, WindowsNeverCrossShards) {
  ShardDir data({25, 25});  // two windows of seq_len 12 per shard; none across the seam
  auto loader = Open({.files = data.files(), .seq_len = 12, .batch = 4, .seed = 7});
  ASSERT_EQ(loader->num_windows(), 4);
  Batch b;
  loader->Next(&b);
  std::multiset<int32_t> starts;
  for (int r = 0; r < 4; ++r) starts.insert(b.inputs[r * 12]);
  EXPECT_EQ(starts, (std::multiset<int32_t>{0, 12, 25, 37}));
}

TEST(DataLoaderTest, SequenceLongerThanTheDataIsRejectedWithTheSizes) {
  ShardDir data({100, 64});
  Result<std::unique_ptr<DataLoader>> l =
      OpenDataLoader({.files = data.files(), .seq_len = 100, .batch = 1});
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(l.status().message(), HasSubstr("seq_len 100 is longer than the data"));
  EXPECT_THAT(l.status().message(), HasSubstr("needs 101 tokens"));
  EXPECT_THAT(l.status().message(), HasSubstr(data.files()[0] + ") has 100"));
  EXPECT_TRUE(OpenDataLoader({.files = data.files(), .seq_len = 99, .batch = 1}).ok());
}

TEST(DataLoaderTest, TooFewWindowsForOneGlobalBatchIsRejected) {
  ShardDir data({101});  // 10 windows of seq_len 10
  Result<std::unique_ptr<DataLoader>> l = OpenDataLoader(
      {.files = data.files(), .seq_len = 10, .batch = 3, .rank = 0, .world_size = 4});
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(l.status().message(), HasSubstr("10 sequences"));
  EXPECT_THAT(l.status().message(), HasSubstr("global batch of 12 (batch 3 x world_size 4)"));
}

TEST(DataLoaderTest, MissingShardIsNotFoundNamingIt) {
  ShardDir data({100, 100});
  std::filesystem::remove(data.files()[1]);
  Result<std::unique_ptr<DataLoader>> l =
      OpenDataLoader({.manifest = data.manifest_path(), .seq_len = 8, .batch = 1});
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), ErrorCode::kNotFound);
  EXPECT_THAT(l.status().message(), HasSubstr(data.files()[1]));
  l = OpenDataLoader({.manifest = "/nonexistent/manifest.json", .seq_len = 8, .batch = 1});
  EXPECT_EQ(l.status().code(), ErrorCode::kNotFound);
}

TEST(DataLoaderTest, ShardDisagreeingWithTheManifestIsDataLoss) {
  ShardDir data({100, 100});
  ASSERT_TRUE(WriteTokenShard(data.files()[1], std::vector<uint16_t>(50, 1)).ok());
  Result<std::unique_ptr<DataLoader>> l =
      OpenDataLoader({.manifest = data.manifest_path(), .seq_len = 8, .batch = 1});
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), ErrorCode::kDataLoss);
  EXPECT_THAT(l.status().message(), HasSubstr("holds 50 tokens but"));
}

TEST(DataLoaderTest, BadOptionsNameTheField) {
  ShardDir data({100});
  const std::vector<std::string> files = data.files();
  struct Case {
    LoaderOptions options;
    std::string field;
  };
  const std::vector<Case> cases = {
      {{.seq_len = 8, .batch = 1}, "manifest or shard files"},
      {{.manifest = data.manifest_path(), .files = files, .seq_len = 8, .batch = 1},
       "manifest or shard files"},
      {{.manifest = data.manifest_path(), .split = "test", .seq_len = 8, .batch = 1}, "split"},
      {{.files = files, .seq_len = 0, .batch = 1}, "seq_len"},
      {{.files = files, .seq_len = 8, .batch = 0}, "batch"},
      {{.files = files, .seq_len = 8, .batch = 1, .world_size = 0}, "world_size"},
      {{.files = files, .seq_len = 8, .batch = 1, .rank = 2, .world_size = 2}, "rank"},
      {{.manifest = data.manifest_path(), .split = "val", .seq_len = 8, .batch = 1}, "no val"},
  };
  for (const Case& c : cases) {
    Result<std::unique_ptr<DataLoader>> l = OpenDataLoader(c.options);
    ASSERT_FALSE(l.ok()) << c.field;
    EXPECT_EQ(l.status().code(), ErrorCode::kInvalidArgument) << l.status();
    EXPECT_THAT(l.status().message(), HasSubstr(c.field));
  }
}

TEST(DataLoaderTest, ForeignOrMisalignedStateIsRefused) {
  ShardDir data({2000});
  auto a = Open({.files = data.files(), .seq_len = 10, .batch = 4, .seed = 1});
  Take(*a, 3);
  LoaderState s = a->state();
  auto other_seed = Open({.files = data.files(), .seq_len = 10, .batch = 4, .seed = 2});
  EXPECT_EQ(other_seed->Restore(s).code(), ErrorCode::kFailedPrecondition);
  auto other_len = Open({.files = data.files(), .seq_len = 11, .batch = 4, .seed = 1});
  EXPECT_EQ(other_len->Restore(s).code(), ErrorCode::kFailedPrecondition);
  auto other_batch = Open({.files = data.files(), .seq_len = 10, .batch = 5, .seed = 1});
  Status misaligned = other_batch->Restore(s);  // position 12 is not a multiple of 5
  EXPECT_EQ(misaligned.code(), ErrorCode::kFailedPrecondition);
  EXPECT_THAT(misaligned.message(), HasSubstr("step boundary"));
  s.position = 1'000'000;
  EXPECT_EQ(a->Restore(s).code(), ErrorCode::kFailedPrecondition);
}

TEST(LoaderStateTest, SerializesAndRejectsMalformedText) {
  const LoaderState s{.epoch = 3, .position = 96, .fingerprint = 0xdeadbeef01234567ULL};
  EXPECT_EQ(s.Serialize(), "kc-loader/1 epoch=3 position=96 fingerprint=deadbeef01234567");
  Result<LoaderState> back = LoaderState::Parse(s.Serialize() + "\n");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
  for (const char* bad :
       {"", "kc-loader/2 epoch=3 position=96 fingerprint=1", "kc-loader/1 epoch=3 position=96",
        "kc-loader/1 epoch=x position=96 fingerprint=1",
        "kc-loader/1 epoch=3 position=-1 fingerprint=1",
        "kc-loader/1 epoch=3 position=96 fingerprint=1 extra"}) {
    EXPECT_EQ(LoaderState::Parse(bad).status().code(), ErrorCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace kc::parallel
