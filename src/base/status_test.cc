#include "base/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>

namespace kc {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, FactoryCarriesCodeMessageAndLocation) {
  Status s = InvalidArgumentError("model.heads: bad");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "model.heads: bad");
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: model.heads: bad");
  EXPECT_NE(std::string(s.file()).find("status_test.cc"), std::string::npos);
  EXPECT_GT(s.line(), 0);
}

TEST(StatusTest, WithContextPrefixesErrorsAndKeepsOk) {
  Status s = UnavailableError("peer closed").WithContext("allreduce step=12 rank=3");
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable);
  EXPECT_EQ(s.message(), "allreduce step=12 rank=3: peer closed");
  EXPECT_TRUE(OkStatus().WithContext("anything").ok());
}

TEST(StatusTest, EveryCodeHasADistinctName) {
  std::set<std::string_view> names;
  for (ErrorCode c : kAllErrorCodes) {
    EXPECT_NE(ErrorCodeName(c), "UNKNOWN");
    EXPECT_TRUE(names.insert(ErrorCodeName(c)).second) << ErrorCodeName(c);
  }
}

TEST(StatusTest, RetryMeaningFollowsTheCode) {
  EXPECT_EQ(RetryFor(ErrorCode::kUnavailable), Retry::kCall);
  EXPECT_EQ(RetryFor(ErrorCode::kAborted), Retry::kHigherLevel);
  EXPECT_EQ(RetryFor(ErrorCode::kFailedPrecondition), Retry::kNever);
  EXPECT_EQ(RetryFor(ErrorCode::kInvalidArgument), Retry::kNever);
  EXPECT_EQ(RetryFor(ErrorCode::kDataLoss), Retry::kNever);
}

TEST(StatusTest, CodesMatchGrpcCanonicalValues) {
  EXPECT_EQ(static_cast<int>(ErrorCode::kInvalidArgument), 3);
  EXPECT_EQ(static_cast<int>(ErrorCode::kResourceExhausted), 8);
  EXPECT_EQ(static_cast<int>(ErrorCode::kUnavailable), 14);
  EXPECT_EQ(static_cast<int>(ErrorCode::kUnauthenticated), 16);
}

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  KC_ASSIGN_OR_RETURN(int h, Half(x));
  KC_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  KC_RETURN_IF_ERROR(Half(x));
  return OkStatus();
}

TEST(ResultTest, HoldsValueOrError) {
  Result<int> r = Half(8);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 4);
  Result<int> e = Half(3);
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(e.value_or(-1), -1);
}

TEST(ResultTest, AssignOrReturnPropagatesTheFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "odd: 3");
}

TEST(ResultTest, ReturnIfErrorAcceptsResults) {
  EXPECT_TRUE(CheckEven(2).ok());
  EXPECT_EQ(CheckEven(1).code(), ErrorCode::kInvalidArgument);
}

TEST(ResultTest, HoldsMoveOnlyValues) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

TEST(ResultDeathTest, ValueOfErrorAborts) {
  Result<int> e = Half(3);
  EXPECT_DEATH((void)e.value(), "value\\(\\) of an error Result");
}

TEST(CheckDeathTest, FailedCheckAbortsWithMessage) {
  int rank = 5;
  EXPECT_DEATH({ KC_CHECK(rank < 4) << "rank=" << rank; }, "Check failed: rank < 4 rank=5");
}

}  // namespace
}  // namespace kc
