// `kc data prepare` as a user runs it: text files and directories in, shards and a manifest
// out that the loader opens; bad flags exit 2 naming the flag, unreadable input names the file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "parallel/data/loader.h"
#include "parallel/data/token_shard.h"
#include "tests/support/kc_run.h"
#include "tests/support/temp_dir.h"

namespace kc::parallel {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using kc::testing::KcRun;

KcRun Kc(const std::string& args) { return kc::testing::RunKc(KC_BINARY, args); }

// A fresh temp directory, removed with everything in it at the end of the test.
class TempDir : public kc::testing::TempDir {
 public:
  TempDir() : kc::testing::TempDir("kc_data_cli") {}
};

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(KcDataPrepareTest, DirectoryOfTextBecomesShardsTheLoaderReads) {
  TempDir in;
  in.Write("a.txt", Repeat("The quick brown fox jumps over the lazy dog.\n", 40));
  in.Write("sub/b.txt", Repeat("Pack my box with five dozen liquor jugs.\n", 40));
  in.Write("sub/c.dat", std::string("\x00\x01\x02 binary index", 16));
  fs::create_symlink(fs::path(in.path()) / "a.txt", fs::path(in.path()) / "a.u8");
  TempDir out;
  KcRun r = Kc("data prepare --out " + out.path() + " --shard-tokens 1000 --val-fraction 0.2 " +
               in.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("skipped  1 binary file"));
  EXPECT_THAT(r.out, HasSubstr("read     2 text files, 3440 bytes, 2 documents"));

  std::ifstream mf(out.path() + "/manifest.json");
  nlohmann::json m = nlohmann::json::parse(mf);
  EXPECT_EQ(m["vocab_size"], 257);
  EXPECT_EQ(m["eot_token"], 256);
  // 3440 bytes + 2 end-of-text tokens; val takes whole documents: one of the two.
  const uint64_t total = 3442;
  EXPECT_EQ(m["train_tokens"].get<uint64_t>() + m["val_tokens"].get<uint64_t>(), total);
  EXPECT_EQ(m["val"].size(), 2u) << "1801 or 1641 tokens in shards of at most 1000";
  EXPECT_GE(m["train"].size(), 2u);

  // Every token of the corpus is in the shards: the text back, documents separated by EOT.
  std::string text;
  for (const char* split : {"val", "train"}) {
    for (const auto& s : m[split]) {
      Result<TokenShard> shard = ReadTokenShard(out.path() + "/" + s["file"].get<std::string>());
      ASSERT_TRUE(shard.ok()) << shard.status();
      EXPECT_EQ(shard->tokens.size(), s["tokens"].get<uint64_t>());
      EXPECT_LE(shard->tokens.size(), 1000u);
      text += ByteDetokenize(shard->tokens);
    }
  }
  const std::string a = Repeat("The quick brown fox jumps over the lazy dog.\n", 40);
  const std::string b = Repeat("Pack my box with five dozen liquor jugs.\n", 40);
  EXPECT_TRUE(text == a + "<|endoftext|>" + b + "<|endoftext|>" ||
              text == b + "<|endoftext|>" + a + "<|endoftext|>")
      << text.substr(0, 200);

  Result<std::unique_ptr<DataLoader>> loader = OpenDataLoader(
      {.manifest = out.path() + "/manifest.json", .seq_len = 64, .batch = 4, .seed = 1});
  ASSERT_TRUE(loader.ok()) << loader.status();
  Batch batch;
  (*loader)->Next(&batch);
  EXPECT_EQ(batch.inputs.size(), 4u * 64);
}

TEST(KcDataPrepareTest, DocumentSeparatorSplitsFortuneStyleFiles) {
  TempDir in;
  const std::string f = in.Write("fortunes", "One.\n%\nTwo,\ntwo lines.\n%\nThree.\n");
  TempDir out;
  KcRun r = Kc("data prepare --out " + out.path() + " --val-fraction 0 --doc-separator % " + f);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("3 documents"));
  Result<TokenShard> shard = ReadTokenShard(out.path() + "/train_00000.tok");
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->tokens.size(), 5u + 16u + 7u + 3u);  // three texts, three EOTs
  EXPECT_FALSE(fs::exists(out.path() + "/val_00000.tok"));
}

TEST(KcDataPrepareTest, SameSeedSameShardsAndRerunsRemoveStaleShards) {
  TempDir in;
  for (int i = 0; i < 20; ++i) in.Write("doc" + std::to_string(i), Repeat("x", i + 1) + "\n");
  TempDir out1, out2;
  ASSERT_EQ(Kc("data prepare --seed 9 --shard-tokens 10 --out " + out1.path() + " " + in.path())
                .exit_code,
            0);
  ASSERT_EQ(Kc("data prepare --seed 9 --shard-tokens 10 --out " + out2.path() + " " + in.path())
                .exit_code,
            0);
  auto read = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(read(out1.path() + "/manifest.json"), read(out2.path() + "/manifest.json"));
  EXPECT_EQ(read(out1.path() + "/train_00003.tok"), read(out2.path() + "/train_00003.tok"));
  ASSERT_EQ(Kc("data prepare --seed 9 --out " + out1.path() + " " + in.path()).exit_code, 0);
  EXPECT_TRUE(fs::exists(out1.path() + "/train_00000.tok"));
  EXPECT_FALSE(fs::exists(out1.path() + "/train_00001.tok")) << "stale shard left behind";
}

TEST(KcDataPrepareTest, BadFlagsExitTwoNamingTheFlag) {
  TempDir in;
  const std::string f = in.Write("t.txt", "hello\n");
  const std::string out = in.path() + "/out";
  for (const auto& [args, flag] :
       std::vector<std::pair<std::string, std::string>>{{"--shard-tokens 0", "--shard-tokens"},
                                                        {"--val-fraction 1.5", "--val-fraction"},
                                                        {"--val-fraction -0.1", "--val-fraction"},
                                                        {"--val-fraction abc", "--val-fraction"},
                                                        {"--seed -3", "--seed"}}) {
    KcRun r = Kc("data prepare --out " + out + " " + args + " " + f);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_THAT(r.err, HasSubstr(flag)) << args;
  }
  KcRun no_out = Kc("data prepare " + f);
  EXPECT_EQ(no_out.exit_code, 2);
  EXPECT_THAT(no_out.err, HasSubstr("--out"));
  EXPECT_FALSE(fs::exists(out)) << "nothing is written on bad input";
}

TEST(KcDataPrepareTest, MissingOrBinaryInputExitsTwoNamingTheFile) {
  TempDir in;
  const std::string bin = in.Write("blob.bin", std::string("ab\0cd", 5));
  KcRun missing = Kc("data prepare --out " + in.path() + "/o /nonexistent/corpus.txt");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("/nonexistent/corpus.txt"));
  KcRun binary = Kc("data prepare --out " + in.path() + "/o " + bin);
  EXPECT_EQ(binary.exit_code, 2);
  EXPECT_THAT(binary.err, HasSubstr(bin + ": binary file"));
  const std::string empty_dir = in.path() + "/empty";
  fs::create_directories(empty_dir);
  KcRun empty = Kc("data prepare --out " + in.path() + "/o " + empty_dir);
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_THAT(empty.err, HasSubstr("no text"));
}

TEST(KcDataPrepareTest, UnwritableOutputExitsOneNamingIt) {
  TempDir in;
  const std::string f = in.Write("t.txt", "hello\n");
  const std::string blocker = in.Write("file", "not a directory");
  KcRun r = Kc("data prepare --out " + blocker + "/shards " + f);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(blocker + "/shards"));
}

}  // namespace
}  // namespace kc::parallel
