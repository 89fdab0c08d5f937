#include "fault/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <span>
#include <thread>

#include "base/check.h"
#include "base/file.h"
#include "comm/hash_store.h"
#include "tests/support/temp_dir.h"

namespace kc::fault {
namespace {

namespace fs = std::filesystem;
using ::kc::testing::TempDir;
using parallel::StateTensor;
using parallel::TpSplit;
using ::testing::HasSubstr;

// A rank's state: tensors over its own storage, moments for `ranges` of each shard.
struct FakeRank {
  std::vector<std::vector<float>> values, m, v;
  std::vector<StateTensor> tensors;
};

struct TensorDef {
  std::string name;
  std::vector<int64_t> shape;
  TpSplit split;
};

const std::vector<TensorDef> kDefs = {{"wte", {11, 4}, TpSplit::kVocab},
                                      {"h.0.mlp.fc.weight", {8, 4}, TpSplit::kRows},
                                      {"h.0.attn.proj.weight", {4, 4}, TpSplit::kColumns},
                                      {"lnf.weight", {4}, TpSplit::kReplicated}};

// The whole tensors' values: distinct per tensor, kind and `salt`.
std::vector<float> Whole(size_t tensor, int kind, float salt) {
  int64_t n = 1;
  for (int64_t d : kDefs[tensor].shape) n *= d;
  std::vector<float> w(static_cast<size_t>(n));
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = salt + static_cast<float>(1000 * tensor + 100 * kind) + static_cast<float>(i) * 0.5f;
  }
  return w;
}

// Rank (tp_rank of t, dp_rank of d with ZeRO-style halves when `zero`) of the state `salt`.
FakeRank MakeRank(int tp_rank, int t, int dp_rank, int d, float salt) {
  FakeRank r;
  r.values.resize(kDefs.size());
  r.m.resize(kDefs.size());
  r.v.resize(kDefs.size());
  for (size_t i = 0; i < kDefs.size(); ++i) {
    const TensorDef& def = kDefs[i];
    const TpSplit split = t > 1 ? def.split : TpSplit::kReplicated;
    int64_t n = 1;
    for (int64_t x : parallel::ShardShape(def.shape, split, t)) n *= x;
    r.values[i].resize(static_cast<size_t>(n));
    parallel::ExtractShard<float>(Whole(i, 0, salt), def.shape, split, tp_rank, t, r.values[i]);
    std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
    parallel::ExtractShard<float>(Whole(i, 1, salt), def.shape, split, tp_rank, t, m);
    parallel::ExtractShard<float>(Whole(i, 2, salt), def.shape, split, tp_rank, t, v);
    // This replica's part of the shard (all of it without ZeRO).
    const int64_t lo = n * dp_rank / d, hi = n * (dp_rank + 1) / d;
    r.m[i].assign(m.begin() + lo, m.begin() + hi);
    r.v[i].assign(v.begin() + lo, v.begin() + hi);
  }
  for (size_t i = 0; i < kDefs.size(); ++i) {
    StateTensor s;
    s.name = kDefs[i].name;
    s.shape = kDefs[i].shape;
    s.split = t > 1 ? kDefs[i].split : TpSplit::kReplicated;
    s.tp_rank = tp_rank;
    s.tp_size = t;
    s.values = r.values[i];
    const int64_t n = static_cast<int64_t>(r.values[i].size());
    s.moments.push_back({n * dp_rank / d, r.m[i], r.v[i]});
    r.tensors.push_back(std::move(s));
  }
  return r;
}

CheckpointInfo Info(int64_t step) {
  return {.step = step,
          .loader_state = "kc-loader/1 epoch=0 position=" + std::to_string(8 * step) +
                          " fingerprint=0000000000000001",
          .plan = {{"t", 1}},
          .model = {{"name", "fake"}}};
}

Status SaveOne(CheckpointWriter& w, FakeRank& r, int64_t step) {
  KC_RETURN_IF_ERROR(w.Save(r.tensors, {}, Info(step)));
  return w.Wait();
}

void ExpectEqualState(FakeRank& got, FakeRank& want) {
  for (size_t i = 0; i < kDefs.size(); ++i) {
    EXPECT_EQ(got.values[i], want.values[i]) << kDefs[i].name;
    EXPECT_EQ(got.m[i], want.m[i]) << kDefs[i].name;
    EXPECT_EQ(got.v[i], want.v[i]) << kDefs[i].name;
  }
}

TEST(CheckpointTest, SavesVerifiesAndRestores) {
  for (bool compress : {false, true}) {
    TempDir dir("kc_ckpt");
    auto w = CheckpointWriter::Create(
        {.dir = dir.Path("ckpt"), .compress = compress, .chunk_bytes = 4096}, 0, 1, nullptr);
    ASSERT_TRUE(w.ok()) << w.status();
    FakeRank saved = MakeRank(0, 1, 0, 1, 0.25f);
    ASSERT_TRUE(SaveOne(**w, saved, 10).ok());
    const SaveStats s = (*w)->last_stats();
    EXPECT_EQ(s.step, 10);
    EXPECT_GT(s.chunks_written, 0);
    EXPECT_EQ(s.raw_bytes, 3 * (44 + 32 + 16 + 4) * 4);

    auto list = ListCheckpoints(dir.Path("ckpt"));
    ASSERT_TRUE(list.ok());
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ((*list)[0].step, 10);
    auto report = VerifyCheckpoint((*list)[0].path);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->ranks, 1);
    EXPECT_EQ(report->raw_bytes, s.raw_bytes);
    auto manifest = ReadManifest((*list)[0].path);
    ASSERT_TRUE(manifest.ok());
    EXPECT_EQ(manifest->loader_state, Info(10).loader_state);
    EXPECT_EQ(manifest->model["name"], "fake");

    FakeRank restored = MakeRank(0, 1, 0, 1, 99.0f);  // other values, overwritten
    ASSERT_TRUE(RestoreTensors((*list)[0].path, restored.tensors).ok());
    ExpectEqualState(restored, saved);
  }
}

// A save where nothing changed writes no chunk; one changed tensor writes only its chunks.
TEST(CheckpointTest, UnchangedChunksAreNotWrittenAgain) {
  TempDir dir("kc_ckpt");
  auto w = CheckpointWriter::Create({.dir = dir.Path("ckpt"), .keep = 5, .chunk_bytes = 4096}, 0, 1,
                                    nullptr);
  ASSERT_TRUE(w.ok());
  FakeRank r = MakeRank(0, 1, 0, 1, 0.0f);
  ASSERT_TRUE(SaveOne(**w, r, 1).ok());
  const int64_t first = (*w)->last_stats().chunks_written;
  ASSERT_TRUE(SaveOne(**w, r, 2).ok());
  EXPECT_EQ((*w)->last_stats().chunks_written, 0);
  EXPECT_EQ((*w)->last_stats().bytes_written, 0);
  EXPECT_EQ((*w)->last_stats().chunks_reused, first);
  r.values[3][0] += 1;  // lnf.weight: its one chunk
  ASSERT_TRUE(SaveOne(**w, r, 3).ok());
  EXPECT_EQ((*w)->last_stats().chunks_written, 1);
  // Every checkpoint still loads whole, the later ones through the first one's chunks.
  for (int64_t step : {1, 2, 3}) {
    FakeRank got = MakeRank(0, 1, 0, 1, 7.0f);
    const std::string path = dir.Path("ckpt/step-0000000" + std::to_string(step));
    ASSERT_TRUE(RestoreTensors(path, got.tensors).ok()) << step;
    EXPECT_EQ(got.values[3][0], step == 3 ? r.values[3][0] : r.values[3][0] - 1);
    EXPECT_EQ(got.values[0], r.values[0]);
  }
}

// A corrupt newest checkpoint (a flipped byte, a truncated file, a lost chunk) is skipped
// with the reason, and the previous one is used.
TEST(CheckpointTest, ACorruptNewestCheckpointFallsBackToThePreviousOne) {
  struct Damage {
    const char* what;
    std::function<void(const fs::path&)> apply;
  };
  auto first_chunk = [](const fs::path& step) {
    return fs::directory_iterator(step / "chunks")->path();
  };
  const Damage damages[] = {
      {"flipped byte",
       [&](const fs::path& step) {
         const fs::path c = first_chunk(step);
         const auto at = static_cast<std::streamoff>(fs::file_size(c) / 2);
         std::fstream f(c, std::ios::in | std::ios::out | std::ios::binary);
         f.seekg(at);
         char b = 0;
         f.read(&b, 1);
         f.seekp(at);
         b = static_cast<char>(b ^ 0x10);
         f.write(&b, 1);
       }},
      {"truncated chunk",
       [&](const fs::path& step) {
         const fs::path c = first_chunk(step);
         fs::resize_file(c, fs::file_size(c) - 1);
       }},
      {"missing chunk", [&](const fs::path& step) { fs::remove(first_chunk(step)); }},
      {"truncated manifest",
       [&](const fs::path& step) { fs::resize_file(step / "MANIFEST.json", 20); }},
      {"edited rank file", [&](const fs::path& step) {
         std::ofstream(step / "rank-00000.json", std::ios::app) << " ";
       }}};
  for (const Damage& d : damages) {
    TempDir dir("kc_ckpt");
    auto w =
        CheckpointWriter::Create({.dir = dir.Path("ckpt"), .chunk_bytes = 4096}, 0, 1, nullptr);
    ASSERT_TRUE(w.ok());
    FakeRank old_state = MakeRank(0, 1, 0, 1, 1.0f);
    FakeRank new_state = MakeRank(0, 1, 0, 1, 2.0f);  // every chunk differs
    ASSERT_TRUE(SaveOne(**w, old_state, 5).ok());
    ASSERT_TRUE(SaveOne(**w, new_state, 6).ok());
    d.apply(dir.Path("ckpt/step-00000006"));
    std::vector<std::string> skipped;
    auto good = LatestGoodCheckpoint(dir.Path("ckpt"), &skipped);
    ASSERT_TRUE(good.ok()) << d.what << ": " << good.status();
    EXPECT_EQ(good->step, 5) << d.what;
    ASSERT_EQ(skipped.size(), 1u) << d.what;
    EXPECT_THAT(skipped[0], HasSubstr("step-00000006")) << d.what;
    FakeRank got = MakeRank(0, 1, 0, 1, 9.0f);
    ASSERT_TRUE(RestoreTensors(good->path, got.tensors).ok()) << d.what;
    ExpectEqualState(got, old_state);
    // Loading the damaged one directly fails with the file named.
    FakeRank bad = MakeRank(0, 1, 0, 1, 9.0f);
    Status s = RestoreTensors(dir.Path("ckpt/step-00000006"), bad.tensors);
    EXPECT_FALSE(s.ok()) << d.what;
    EXPECT_EQ(s.code(), ErrorCode::kDataLoss) << d.what << ": " << s;
  }
}

TEST(CheckpointTest, RetentionKeepsTheNewestAndTheChunksTheyNeed) {
  TempDir dir("kc_ckpt");
  auto w = CheckpointWriter::Create(
      {.dir = dir.Path("ckpt"), .keep = 2, .chunk_bytes = 4096, .full_every = 1}, 0, 1, nullptr);
  ASSERT_TRUE(w.ok());
  FakeRank r = MakeRank(0, 1, 0, 1, 0.0f);
  for (int64_t step = 1; step <= 5; ++step) {
    r.values[3][0] = static_cast<float>(step);  // lnf changes; the rest is the first's chunks
    ASSERT_TRUE(SaveOne(**w, r, step).ok());
  }
  auto list = ListCheckpoints(dir.Path("ckpt"));
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step, 5);
  EXPECT_EQ((*list)[1].step, 4);
  // Step 1's directory stays for the chunks the kept ones still use; 2 and 3 are gone.
  EXPECT_TRUE(fs::exists(dir.Path("ckpt/step-00000001/chunks")));
  EXPECT_FALSE(fs::exists(dir.Path("ckpt/step-00000001/MANIFEST.json")));
  EXPECT_FALSE(fs::exists(dir.Path("ckpt/step-00000002")));
  EXPECT_FALSE(fs::exists(dir.Path("ckpt/step-00000003")));
  for (const CheckpointEntry& e : *list) EXPECT_TRUE(VerifyCheckpoint(e.path).ok()) << e.path;
}

// Training's small updates to every value, as between two saves: each value moves by a
// fraction of itself.
void Nudge(FakeRank& r, float by) {
  for (auto* kind : {&r.values, &r.m, &r.v}) {
    for (std::vector<float>& t : *kind) {
      for (size_t i = 0; i < t.size(); ++i) t[i] *= 1.0f + by * static_cast<float>(i % 7 + 1);
    }
  }
}

// Every value changes between saves, so no chunk is reused: the saves between full ones store
// deltas, smaller than whole chunks, and every checkpoint restores bit-exactly.
TEST(CheckpointTest, SavesBetweenFullOnesStoreDeltasAndRestoreBitExactly) {
  for (bool compress : {false, true}) {
    TempDir dir("kc_ckpt");
    auto w = CheckpointWriter::Create({.dir = dir.Path("ckpt"),
                                       .keep = 10,
                                       .compress = compress,
                                       .chunk_bytes = 4096,
                                       .full_every = 3},
                                      0, 1, nullptr);
    ASSERT_TRUE(w.ok());
    FakeRank r = MakeRank(0, 1, 0, 1, 0.5f);
    std::vector<FakeRank> saved;
    std::vector<SaveStats> stats;
    for (int64_t step = 1; step <= 5; ++step) {
      if (step > 1) Nudge(r, 1e-4f);
      ASSERT_TRUE(SaveOne(**w, r, step).ok());
      stats.push_back((*w)->last_stats());
      saved.push_back(r);
    }
    for (size_t i = 0; i < stats.size(); ++i) {
      const bool full = i % 3 == 0;  // saves 1 and 4
      EXPECT_EQ(stats[i].chunks_reused, 0) << i;
      if (full) {
        EXPECT_EQ(stats[i].chunks_delta, 0) << i;
      } else {
        // Every chunk but the few so small that zstd's frame outweighs them.
        EXPECT_GE(stats[i].chunks_delta, stats[i].chunks_written * 2 / 3) << i;
        EXPECT_LT(stats[i].bytes_written, stats[0].bytes_written) << i;
      }
    }
    for (int64_t step = 1; step <= 5; ++step) {
      const std::string path = dir.Path("ckpt/step-0000000" + std::to_string(step));
      ASSERT_TRUE(VerifyCheckpoint(path).ok()) << path;
      FakeRank got = MakeRank(0, 1, 0, 1, 7.0f);
      ASSERT_TRUE(RestoreTensors(path, got.tensors).ok()) << path;
      ExpectEqualState(got, saved[static_cast<size_t>(step - 1)]);
    }
  }
}

// A delta whose base is damaged does not decode: the checkpoints resting on it are skipped,
// each naming the base, and the newest one that does not rest on it is used.
TEST(CheckpointTest, ACheckpointOnADamagedBaseIsSkipped) {
  TempDir dir("kc_ckpt");
  auto w = CheckpointWriter::Create({.dir = dir.Path("ckpt"), .keep = 10, .chunk_bytes = 4096}, 0,
                                    1, nullptr);
  ASSERT_TRUE(w.ok());
  FakeRank r = MakeRank(0, 1, 0, 1, 0.5f);
  std::vector<FakeRank> saved;
  for (int64_t step = 1; step <= 3; ++step) {
    if (step > 1) Nudge(r, 1e-4f);
    ASSERT_TRUE(SaveOne(**w, r, step).ok());
    saved.push_back(r);
  }
  // Step 2's chunks are deltas on step 1's and the base of step 3's.
  fs::path chunk;
  for (const fs::directory_entry& e :
       fs::directory_iterator(dir.Path("ckpt/step-00000002/chunks"))) {
    if (e.path().string().ends_with(".xor.zst")) chunk = e.path();
  }
  ASSERT_FALSE(chunk.empty());
  std::ofstream(chunk, std::ios::binary | std::ios::trunc) << "not the delta it was";
  std::vector<std::string> skipped;
  auto good = LatestGoodCheckpoint(dir.Path("ckpt"), &skipped);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->step, 1);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_THAT(skipped[0], HasSubstr("step-00000003"));
  EXPECT_THAT(skipped[0], HasSubstr("its base: chunk step-00000002/chunks/"));
  EXPECT_THAT(skipped[1], HasSubstr("step-00000002"));
  FakeRank got = MakeRank(0, 1, 0, 1, 7.0f);
  ASSERT_TRUE(RestoreTensors(good->path, got.tensors).ok());
  ExpectEqualState(got, saved[0]);
}

// Retention keeps the bases the kept checkpoints' deltas rest on, in the directories of
// checkpoints no longer kept, and removes what nothing rests on.
TEST(CheckpointTest, RetentionKeepsTheBasesOfKeptDeltas) {
  TempDir dir("kc_ckpt");
  auto w = CheckpointWriter::Create(
      {.dir = dir.Path("ckpt"), .keep = 1, .chunk_bytes = 4096, .full_every = 3}, 0, 1, nullptr);
  ASSERT_TRUE(w.ok());
  FakeRank r = MakeRank(0, 1, 0, 1, 0.5f);
  for (int64_t step = 1; step <= 5; ++step) {
    if (step > 1) Nudge(r, 1e-4f);
    ASSERT_TRUE(SaveOne(**w, r, step).ok());
  }
  // Step 5 is a delta on 4, a full save: 1 to 3 hold nothing step 5 needs.
  for (const char* gone : {"step-00000001", "step-00000002", "step-00000003"}) {
    EXPECT_FALSE(fs::exists(dir.Path("ckpt") + "/" + gone)) << gone;
  }
  EXPECT_TRUE(fs::exists(dir.Path("ckpt/step-00000004/chunks")));
  EXPECT_FALSE(fs::exists(dir.Path("ckpt/step-00000004/MANIFEST.json")));
  FakeRank got = MakeRank(0, 1, 0, 1, 7.0f);
  ASSERT_TRUE(RestoreTensors(dir.Path("ckpt/step-00000005"), got.tensors).ok());
  ExpectEqualState(got, r);
}

// Saved by 2 tensor-parallel ranks x 2 ZeRO-1 replicas (4 writers, one manifest), loaded into
// one rank holding everything, and into t=2 without ZeRO: every value where it belongs.
TEST(CheckpointTest, ShardsSavedWithOnePlanLoadIntoAnother) {
  TempDir dir("kc_ckpt");
  comm::HashStore store;
  std::vector<FakeRank> ranks;
  for (int rank = 0; rank < 4; ++rank) ranks.push_back(MakeRank(rank % 2, 2, rank / 2, 2, 0.5f));
  std::vector<std::thread> threads;
  std::vector<Status> status(4);
  for (int rank = 0; rank < 4; ++rank) {
    threads.emplace_back([&, rank] {
      auto w =
          CheckpointWriter::Create({.dir = dir.Path("ckpt"), .chunk_bytes = 4096}, rank, 4, &store);
      if (!w.ok()) {
        status[static_cast<size_t>(rank)] = w.status();
        return;
      }
      FakeRank& r = ranks[static_cast<size_t>(rank)];
      Status s =
          (*w)->Save(r.tensors, {.dp_rank = rank / 2, .tp_rank = rank % 2, .zero = true}, Info(7));
      status[static_cast<size_t>(rank)] = s.ok() ? (*w)->Wait() : s;
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : status) ASSERT_TRUE(s.ok()) << s;
  const std::string path = dir.Path("ckpt/step-00000007");
  auto report = VerifyCheckpoint(path);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->ranks, 4);

  FakeRank one = MakeRank(0, 1, 0, 1, 42.0f);
  ASSERT_TRUE(RestoreTensors(path, one.tensors).ok());
  FakeRank want_one = MakeRank(0, 1, 0, 1, 0.5f);
  ExpectEqualState(one, want_one);
  for (int tp = 0; tp < 2; ++tp) {
    FakeRank two = MakeRank(tp, 2, 0, 1, 42.0f);
    ASSERT_TRUE(RestoreTensors(path, two.tensors).ok());
    FakeRank want = MakeRank(tp, 2, 0, 1, 0.5f);
    ExpectEqualState(two, want);
  }
}

TEST(CheckpointTest, ATensorTheCheckpointLacksOrShapesDifferentlyIsRefused) {
  TempDir dir("kc_ckpt");
  auto w = CheckpointWriter::Create({.dir = dir.Path("ckpt")}, 0, 1, nullptr);
  ASSERT_TRUE(w.ok());
  FakeRank r = MakeRank(0, 1, 0, 1, 0.0f);
  ASSERT_TRUE(SaveOne(**w, r, 1).ok());
  FakeRank other = MakeRank(0, 1, 0, 1, 0.0f);
  other.tensors[1].name = "h.9.mlp.fc.weight";
  Status s = RestoreTensors(dir.Path("ckpt/step-00000001"), other.tensors);
  EXPECT_THAT(s.message(), HasSubstr("has no param of tensor h.9.mlp.fc.weight"));
  FakeRank reshaped = MakeRank(0, 1, 0, 1, 0.0f);
  reshaped.tensors[2].shape = {2, 8};
  s = RestoreTensors(dir.Path("ckpt/step-00000001"), reshaped.tensors);
  EXPECT_THAT(s.message(), HasSubstr("h.0.attn.proj.weight has shape [4,4] there, [2,8]"));
}

TEST(CheckpointTest, BadOptionsAreRefused) {
  EXPECT_THAT(CheckpointWriter::Create({.dir = ""}, 0, 1, nullptr).status().message(),
              HasSubstr("empty path"));
  EXPECT_THAT(CheckpointWriter::Create({.dir = "x", .keep = 0}, 0, 1, nullptr).status().message(),
              HasSubstr("keep 0"));
  EXPECT_THAT(CheckpointWriter::Create({.dir = "x"}, 0, 2, nullptr).status().message(),
              HasSubstr("rendezvous store"));
}

// Manifests and rank files are data from disk: every malformed one is a kDataLoss naming the
// file and the key, never an exception, never a read outside the checkpoint, never an
// allocation of the size a file claims.
TEST(CheckpointTest, MalformedManifestsAndRankFilesAreRefusedNamingFileAndKey) {
  const std::string good_rank =
      R"({"format":"kc-checkpoint-rank/1","rank":0,"pieces":[{"tensor":"w","kind":"param",)"
      R"("shape":[2,2],"split":"replicated","tp_rank":0,"tp_size":1,"offset":0,"count":4,)"
      R"("chunks":[{"file":"step-00000001/chunks/0123456789abcdef0123456789abcdef.bin",)"
      R"("hash":"0123456789abcdef0123456789abcdef","bytes":16}]}]})";
  ASSERT_TRUE(ParseRankFile(good_rank, "rank-00000.json").ok());
  // `text` with `from` replaced by `to`.
  const auto with = [](std::string text, const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    KC_CHECK(at != std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  const auto rank_with = [&](const std::string& from, const std::string& to) {
    return with(good_rank, from, to);
  };
  struct Case {
    std::string text, want;
  };
  for (const Case& c : std::vector<Case>{
           {rank_with(R"("bytes":16)", R"("bytes":-16)"), "pieces[0].chunks[0].bytes: expected"},
           {rank_with(R"("bytes":16)", R"("bytes":4611686018427387904)"), "chunks[0].bytes"},
           {rank_with(R"("bytes":16)", R"("bytes":18)"), "a multiple of 4"},
           {rank_with(R"("bytes":16)", R"("bytes":"16")"), "chunks[0].bytes"},
           {rank_with(R"("step-00000001/chunks/)", R"("../../../etc/)"),
            "chunks[0].file: expected STEP-DIR/chunks/HASH.bin, .zst or .xor.zst"},
           {rank_with(R"(.bin",)", R"(.bin","base":{}, )"), "chunks[0].base: only a delta"},
           {rank_with(R"(.bin",)", R"(.xor.zst",)"), "chunks[0].base: missing (the file is a"},
           {rank_with(R"("tp_rank":0)", R"("tp_rank":3)"), "pieces[0].tp_rank"},
           {rank_with(R"("count":4)", R"("count":-1)"), "pieces[0].count"},
           {rank_with(R"("offset":0)", R"("offset":-8)"), "pieces[0].offset"},
           {rank_with(R"("shape":[2,2])", R"("shape":[4294967296,4294967296])"), "shape[1]"},
           {rank_with(R"("kind":"param")", R"("kind":7)"), "pieces[0].kind"},
           {rank_with(R"("split":"replicated")", R"("split":"diagonal")"), "pieces[0].split"},
           {rank_with(R"(,"pieces":[)", R"(,"pieces":{}, "x":[)"), "pieces: expected a list"},
           {"[1, 2]", "not a JSON object"},
       }) {
    Result<RankIndex> r = ParseRankFile(c.text, "rank-00000.json");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), ErrorCode::kDataLoss) << c.text;
    EXPECT_THAT(r.status().message(), HasSubstr("rank-00000.json: ")) << c.text;
    EXPECT_THAT(r.status().message(), HasSubstr(c.want)) << c.text;
  }
  const std::string good_manifest =
      R"({"format":"kc-checkpoint/1","step":6,"loader_state":"s","plan":{},"model":{},)"
      R"("ranks":1,"compress":false,"chunk_bytes":4096,"created_unix":1.7e9,)"
      R"("rank_files":[{"file":"rank-00000.json","hash":"0123456789abcdef0123456789abcdef"}]})";
  ASSERT_TRUE(ParseManifest(good_manifest, "MANIFEST.json").ok());
  const auto manifest_with = [&](const std::string& from, const std::string& to) {
    return with(good_manifest, from, to);
  };
  for (const Case& c : std::vector<Case>{
           {manifest_with(
                R"([{"file":"rank-00000.json","hash":"0123456789abcdef0123456789abcdef"}])",
                "[{}]"),
            "rank_files[0].file: missing"},
           {manifest_with(R"("step":6)", R"("step":"six")"), "step: expected an integer"},
           {manifest_with(R"("step":6)", R"("step":-6)"), "step: expected an integer"},
           {manifest_with(R"("rank-00000.json")", R"("../../MANIFEST.json")"),
            "rank_files[0].file: expected rank-N.json"},
           {manifest_with(R"("model":{})", R"("model":[])"), "model: expected an object"},
           {manifest_with(R"("created_unix":1.7e9)", R"("created_unix":1e300)"), "created_unix"},
       }) {
    Result<Manifest> m = ParseManifest(c.text, "MANIFEST.json");
    ASSERT_FALSE(m.ok()) << c.text;
    EXPECT_EQ(m.status().code(), ErrorCode::kDataLoss) << c.text;
    EXPECT_THAT(m.status().message(), HasSubstr("MANIFEST.json: " + c.want)) << c.text;
  }
}

// A rank file that passes its hash (someone wrote the manifest for it) but claims a chunk far
// past the shard, or pieces cut two ways, is refused before anything is written out of bounds.
TEST(CheckpointTest, RestoringFromAForgedRankFileFailsCleanly) {
  TempDir dir("kc_ckpt");
  auto w = CheckpointWriter::Create({.dir = dir.Path("ckpt"), .chunk_bytes = 4096}, 0, 1, nullptr);
  ASSERT_TRUE(w.ok());
  FakeRank r = MakeRank(0, 1, 0, 1, 1.0f);
  ASSERT_TRUE(SaveOne(**w, r, 3).ok());
  const fs::path step = dir.Path("ckpt/step-00000003");
  Result<std::string> text = ReadWholeFile((step / "rank-00000.json").string());
  ASSERT_TRUE(text.ok());
  nlohmann::json rank = nlohmann::json::parse(*text);
  rank["pieces"][0]["offset"] = 1 << 30;
  const std::string forged = rank.dump(1);
  ASSERT_TRUE(WriteFileDurably((step / "rank-00000.json").string(), forged).ok());
  Result<std::string> m = ReadWholeFile((step / "MANIFEST.json").string());
  ASSERT_TRUE(m.ok());
  nlohmann::json manifest = nlohmann::json::parse(*m);
  manifest["rank_files"][0]["hash"] = ContentHash(std::as_bytes(std::span(forged)));
  ASSERT_TRUE(WriteFileDurably((step / "MANIFEST.json").string(), manifest.dump(1)).ok());
  FakeRank got = MakeRank(0, 1, 0, 1, 9.0f);
  const Status s = RestoreTensors(step.string(), got.tensors);
  EXPECT_EQ(s.code(), ErrorCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("runs past its shard"));
}

}  // namespace
}  // namespace kc::fault
