// Token shards: round trip, every corruption detected and named, the byte tokenizer, the
// document splitter and the manifest.
#include "parallel/data/token_shard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace kc::parallel {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "kc_shard_" + std::to_string(getpid()) + "_" + name;
}

void PutU64(std::string& bytes, size_t offset, uint64_t v) {
  for (int i = 0; i < 8; ++i) bytes[offset + i] = static_cast<char>(v >> (8 * i));
}

// Rewrites the header checksum, so a test can change a header field and reach the check
// behind it.
void ResealHeader(std::string& bytes) {
  PutU64(bytes, 56, Fnv1a64({reinterpret_cast<const uint8_t*>(bytes.data()), 56}));
}

TEST(TokenShardTest, Fnv1a64MatchesPublishedVectors) {
  EXPECT_EQ(Fnv1a64({}), 0xcbf29ce484222325ULL);
  const std::string a = "a";
  EXPECT_EQ(Fnv1a64({reinterpret_cast<const uint8_t*>(a.data()), a.size()}), 0xaf63dc4c8601ec8cULL);
  const std::string foobar = "foobar";
  EXPECT_EQ(Fnv1a64({reinterpret_cast<const uint8_t*>(foobar.data()), foobar.size()}),
            0x85944171f73967e8ULL);
}

TEST(TokenShardTest, RoundTripsThroughAFile) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 1000; ++i) tokens.push_back(static_cast<uint16_t>((i * 37) % 257));
  const std::string path = TempPath("round_trip.tok");
  ASSERT_TRUE(WriteTokenShard(path, tokens).ok());
  EXPECT_EQ(std::filesystem::file_size(path), kTokenShardHeaderBytes + 2 * tokens.size());
  Result<TokenShard> shard = ReadTokenShard(path);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->tokens, tokens);
  EXPECT_EQ(shard->header.vocab_size, kByteVocabSize);
  EXPECT_EQ(shard->header.eot_token, kByteEotToken);
  EXPECT_EQ(shard->header.token_count, tokens.size());
  std::filesystem::remove(path);
}

TEST(TokenShardTest, EncodesTheDocumentedLayout) {
  const std::vector<uint16_t> tokens = {0x0102, 0x00ff};
  const std::string bytes = EncodeTokenShard(tokens, {.vocab_size = 65536, .eot_token = 7});
  ASSERT_EQ(bytes.size(), 68u);
  EXPECT_EQ(bytes.substr(0, 4), "KCT1");
  EXPECT_EQ(bytes[4], 1);                                           // version
  EXPECT_EQ(bytes[8], 2);                                           // token bytes
  EXPECT_EQ(bytes[14], 1);                                          // vocab 65536 = 0x00010000
  EXPECT_EQ(bytes[16], 7);                                          // eot
  EXPECT_EQ(bytes[24], 2);                                          // token count
  EXPECT_EQ(bytes.substr(64), std::string("\x02\x01\xff\x00", 4));  // little-endian tokens
  Result<TokenShard> shard = ParseTokenShard(bytes, "x");
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->tokens, tokens);
}

TEST(TokenShardTest, EmptyShardIsValid) {
  Result<TokenShard> shard = ParseTokenShard(EncodeTokenShard({}), "empty");
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_TRUE(shard->tokens.empty());
}

struct Corruption {
  std::string name;
  std::function<void(std::string&)> corrupt;
  ErrorCode code;
  std::string message_part;
};

TEST(TokenShardTest, EveryCorruptionIsDetectedWithTheFileAndTheCause) {
  const std::vector<uint16_t> tokens = {72, 105, 256, 33, 10};
  const std::vector<Corruption> cases = {
      {"bad magic", [](std::string& b) { b[0] = 'X'; }, ErrorCode::kDataLoss, "bad magic"},
      {"text file", [](std::string& b) { b = "hello world, not a shard at all......"; },
       ErrorCode::kDataLoss, "not a kc token shard"},
      {"short header", [](std::string& b) { b.resize(40); }, ErrorCode::kDataLoss,
       "shorter than the 64-byte header"},
      {"truncated payload", [](std::string& b) { b.resize(b.size() - 3); }, ErrorCode::kDataLoss,
       "truncated: the header declares 5 tokens"},
      {"trailing bytes", [](std::string& b) { b += "zz"; }, ErrorCode::kDataLoss,
       "2 trailing bytes"},
      {"flipped token", [](std::string& b) { b[64] ^= 1; }, ErrorCode::kDataLoss,
       "payload checksum mismatch"},
      {"flipped header field", [](std::string& b) { b[24] = 4; }, ErrorCode::kDataLoss,
       "header checksum mismatch"},
      {"other version",
       [](std::string& b) {
         b[4] = 2;
         ResealHeader(b);
       },
       ErrorCode::kUnimplemented, "version 2"},
      {"other token width",
       [](std::string& b) {
         b[8] = 4;
         ResealHeader(b);
       },
       ErrorCode::kUnimplemented, "token width 4"},
      {"zero vocab",
       [](std::string& b) {
         b[12] = 0;
         b[13] = 0;
         ResealHeader(b);
       },
       ErrorCode::kDataLoss, "vocab size 0"},
      {"eot outside vocab",
       [](std::string& b) {
         b[16] = 0x10;
         b[17] = 0x01;  // 272
         ResealHeader(b);
       },
       ErrorCode::kDataLoss, "end-of-text token 272"},
      {"reserved bytes",
       [](std::string& b) {
         b[44] = 1;
         ResealHeader(b);
       },
       ErrorCode::kDataLoss, "reserved header bytes"},
      {"token outside vocab",
       [](std::string& b) {
         b[12] = 100;  // vocab 256 -> 100; token 105 at index 1 is now too big
         b[13] = 0;
         b[16] = 0xff;  // no eot, so the eot check passes
         b[17] = 0xff;
         b[18] = 0xff;
         b[19] = 0xff;
         ResealHeader(b);
       },
       ErrorCode::kDataLoss, "token 105 at index 1 is not below the vocab size 100"},
  };
  for (const Corruption& c : cases) {
    std::string bytes = EncodeTokenShard(tokens);
    c.corrupt(bytes);
    const std::string path = TempPath("corrupt.tok");
    std::ofstream(path, std::ios::binary) << bytes;
    Result<TokenShard> shard = ReadTokenShard(path);
    ASSERT_FALSE(shard.ok()) << c.name;
    EXPECT_EQ(shard.status().code(), c.code) << c.name << ": " << shard.status();
    EXPECT_THAT(shard.status().message(), HasSubstr(path + ": ")) << c.name;
    EXPECT_THAT(shard.status().message(), HasSubstr(c.message_part)) << c.name;
    std::filesystem::remove(path);
  }
}

TEST(TokenShardTest, MissingFileIsNotFoundNamingIt) {
  Result<TokenShard> shard = ReadTokenShard("/nonexistent/dir/train_00000.tok");
  ASSERT_FALSE(shard.ok());
  EXPECT_EQ(shard.status().code(), ErrorCode::kNotFound);
  EXPECT_THAT(shard.status().message(), HasSubstr("/nonexistent/dir/train_00000.tok"));
}

TEST(TokenShardTest, UnwritableDirectoryIsUnavailableNamingTheFile) {
  Status s = WriteTokenShard("/nonexistent/dir/x.tok", std::vector<uint16_t>{1, 2});
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent/dir/x.tok"));
}

TEST(ByteTokenizerTest, EachByteIsOneTokenIncludingUtf8) {
  std::vector<uint16_t> tokens;
  ByteTokenize("Hi!\n", &tokens);
  EXPECT_EQ(tokens, (std::vector<uint16_t>{72, 105, 33, 10}));
  tokens.push_back(kByteEotToken);
  ByteTokenize("\xc3\xa9", &tokens);  // "é" in UTF-8: two bytes, two tokens
  EXPECT_EQ(tokens, (std::vector<uint16_t>{72, 105, 33, 10, 256, 0xc3, 0xa9}));
  EXPECT_EQ(ByteDetokenize(tokens), "Hi!\n<|endoftext|>\xc3\xa9");
  const std::vector<int32_t> wide = {65, 256, 300};
  EXPECT_EQ(ByteDetokenize(wide), "A<|endoftext|><|300|>");
}

TEST(SplitDocumentsTest, SplitsAtSeparatorLinesAndDropsEmptyDocuments) {
  const std::string text = "first\nline two\n%\nsecond\r\n%\r\n%\nthird, no newline";
  EXPECT_THAT(SplitDocuments(text, "%"),
              ::testing::ElementsAre("first\nline two\n", "second\r\n", "third, no newline"));
  EXPECT_THAT(SplitDocuments("%\n%\n", "%"), ::testing::IsEmpty());
  EXPECT_THAT(SplitDocuments("a % b\n", "%"), ::testing::ElementsAre("a % b\n"));
  EXPECT_THAT(SplitDocuments(text, ""), ::testing::ElementsAre(text));
  EXPECT_THAT(SplitDocuments("", ""), ::testing::IsEmpty());
}

TEST(TokenManifestTest, RoundTripsAndRejectsBadFieldsByName) {
  const std::string path = TempPath("manifest.json");
  TokenManifest m;
  m.train = {{"train_00000.tok", 10}, {"train_00001.tok", 4}};
  m.val = {{"val_00000.tok", 3}};
  ASSERT_TRUE(WriteTokenManifest(path, m).ok());
  Result<TokenManifest> back = ReadTokenManifest(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->train.size(), 2u);
  EXPECT_EQ(back->train[1].file, "train_00001.tok");
  EXPECT_EQ(back->train[1].tokens, 4u);
  EXPECT_EQ(back->val[0].tokens, 3u);
  EXPECT_EQ(back->vocab_size, kByteVocabSize);

  std::ofstream(path) << R"({"format": "kc-token-shards", "version": 1, "tokenizer": "byte",
    "vocab_size": 257, "eot_token": 256, "train": [{"file": "a.tok", "tokens": -1}], "val": []})";
  Result<TokenManifest> bad = ReadTokenManifest(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr(path + ": train[0].tokens"));

  std::ofstream(path) << "{not json";
  EXPECT_EQ(ReadTokenManifest(path).status().code(), ErrorCode::kInvalidArgument);
  std::filesystem::remove(path);
  EXPECT_EQ(ReadTokenManifest(path).status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace kc::parallel
