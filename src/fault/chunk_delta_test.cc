#include "fault/chunk_delta.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace kc::fault {
namespace {

using ::testing::HasSubstr;

std::vector<std::byte> Bytes(const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Weights before and after a few small updates, as between two saves of a training run.
struct TwoSaves {
  std::vector<float> before, after;
  explicit TwoSaves(size_t n) {
    std::mt19937 rng(7);
    std::normal_distribution<float> w(0.0f, 0.02f), step(0.0f, 1e-4f);
    for (size_t i = 0; i < n; ++i) {
      before.push_back(w(rng));
      after.push_back(before.back() + step(rng));
    }
  }
};

TEST(ChunkDeltaTest, DecodesBitExactlyIncludingNansInfinitiesAndSignedZeros) {
  TwoSaves s(4096);
  s.after[0] = std::numeric_limits<float>::quiet_NaN();
  s.after[1] = -std::numeric_limits<float>::infinity();
  s.after[2] = -0.0f;
  s.before[3] = std::numeric_limits<float>::denorm_min();
  const std::vector<std::byte> base = Bytes(s.before), current = Bytes(s.after);
  Result<std::string> delta = EncodeDelta(current, base);
  ASSERT_TRUE(delta.ok()) << delta.status();
  std::vector<std::byte> out;
  ASSERT_TRUE(DecodeDelta(*delta, base, &out).ok());
  EXPECT_EQ(out, current);
}

TEST(ChunkDeltaTest, ASmallUpdateStoresInLessThanTheChunkAndNoChangeInAlmostNothing) {
  TwoSaves s(1 << 16);
  const std::vector<std::byte> base = Bytes(s.before), current = Bytes(s.after);
  Result<std::string> delta = EncodeDelta(current, base);
  ASSERT_TRUE(delta.ok());
  EXPECT_LT(delta->size(), current.size() * 3 / 4);
  Result<std::string> same = EncodeDelta(base, base);
  ASSERT_TRUE(same.ok());
  EXPECT_LT(same->size(), base.size() / 100);
}

TEST(ChunkDeltaTest, AnotherBaseOrACorruptOrTruncatedDeltaIsNotDecoded) {
  TwoSaves s(1024);
  const std::vector<std::byte> base = Bytes(s.before), current = Bytes(s.after);
  Result<std::string> delta = EncodeDelta(current, base);
  ASSERT_TRUE(delta.ok());
  std::vector<std::byte> out;
  const std::vector<std::byte> shorter(base.begin(), base.end() - 4);
  Status st = DecodeDelta(*delta, shorter, &out);
  EXPECT_EQ(st.code(), ErrorCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr("4092 bytes"));
  EXPECT_EQ(DecodeDelta(delta->substr(0, delta->size() / 2), base, &out).code(),
            ErrorCode::kDataLoss);
  EXPECT_EQ(DecodeDelta("not zstd at all", base, &out).code(), ErrorCode::kDataLoss);
  EXPECT_EQ(EncodeDelta(current, shorter).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kc::fault
