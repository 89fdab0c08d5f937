#include "api/quotas.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

TEST(QuotasTest, OverQuotaIsRefusedWithTheNumbers) {
  const Quota q{.max_devices = 64, .max_device_hours = 1000, .max_storage_gb = 500};
  EXPECT_TRUE(CheckQuota("team vision", q, {.devices = 56}, {.devices = 8}).ok());
  Status s = CheckQuota("team vision", q, {.devices = 60}, {.devices = 8});
  EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted);
  EXPECT_THAT(s.message(),
              HasSubstr("team vision: over quota: max_devices 64: 60 in use + 8 asked = 68"));
  s = CheckQuota("user ann", q, {.device_hours = 990}, {.devices = 1, .device_hours = 20});
  EXPECT_THAT(s.message(), HasSubstr("max_device_hours 1000 device-h: 990 device-h in use"));
  s = CheckQuota("user ann", q, {.storage_gb = 499}, {.storage_gb = 2});
  EXPECT_THAT(s.message(), HasSubstr("max_storage_gb 500 GB"));
  EXPECT_TRUE(CheckQuota("user ann", Quota{}, {.devices = 1 << 20}, {.devices = 1 << 20}).ok());
  EXPECT_TRUE(RuntimeExhausted(q, {.device_hours = 1000}));
  EXPECT_FALSE(RuntimeExhausted(q, {.device_hours = 999}));
  EXPECT_FALSE(RuntimeExhausted(Quota{}, {.device_hours = 1e9}));
}

TEST(QuotasTest, IncreaseRequestsAreApprovedOrDeniedOnce) {
  testing::TempDir dir("kc_quotas");
  const std::string path = dir.Path("kcd.db");
  int64_t approved = 0, denied = 0;
  {
    Result<std::unique_ptr<QuotaStore>> store = QuotaStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status().message();
    QuotaStore& qs = **store;
    EXPECT_FALSE(qs.Get(QuotaSubject::kTeam, "vision")->max_devices.has_value());  // unlimited
    ASSERT_TRUE(qs.Set(QuotaSubject::kTeam, "vision", {.max_devices = 32}).ok());
    EXPECT_EQ(qs.Get(QuotaSubject::kTeam, "vision")->max_devices, 32);
    Result<QuotaRequest> r = qs.Request({.subject = QuotaSubject::kTeam,
                                         .name = "vision",
                                         .requester = "ann",
                                         .wanted = {.max_devices = 64, .max_device_hours = 500},
                                         .reason = "the big run"});
    ASSERT_TRUE(r.ok()) << r.status().message();
    approved = r->id;
    Result<QuotaRequest> other = qs.Request({.subject = QuotaSubject::kUser,
                                             .name = "bob",
                                             .requester = "bob",
                                             .wanted = {.max_devices = 1000},
                                             .reason = ""});
    ASSERT_TRUE(other.ok());
    denied = other->id;
    EXPECT_EQ(qs.Requests(RequestState::kPending)->size(), 2u);
    Result<QuotaRequest> d = qs.Decide(approved, true, "vera", "fine");
    ASSERT_TRUE(d.ok()) << d.status().message();
    EXPECT_EQ(d->state, RequestState::kApproved);
    ASSERT_TRUE(qs.Decide(denied, false, "vera", "too much").ok());
    Result<QuotaRequest> again = qs.Decide(approved, false, "root", "changed my mind");
    EXPECT_EQ(again.status().code(), ErrorCode::kFailedPrecondition);
    EXPECT_THAT(again.status().message(), HasSubstr("already approved by vera"));
    EXPECT_EQ(qs.Decide(999, true, "vera", "").status().code(), ErrorCode::kNotFound);
    EXPECT_EQ(qs.Request({.subject = QuotaSubject::kUser,
                          .name = "",
                          .requester = "x",
                          .wanted = {},
                          .reason = ""})
                  .status()
                  .code(),
              ErrorCode::kInvalidArgument);
  }
  // Durable: the approved quota is in force after reopening; the denied one never was.
  Result<std::unique_ptr<QuotaStore>> store = QuotaStore::Open(path);
  ASSERT_TRUE(store.ok());
  Result<Quota> q = (*store)->Get(QuotaSubject::kTeam, "vision");
  EXPECT_EQ(q->max_devices, 64);
  EXPECT_EQ(q->max_device_hours, 500);
  EXPECT_FALSE(q->max_storage_gb.has_value());
  EXPECT_FALSE((*store)->Get(QuotaSubject::kUser, "bob")->max_devices.has_value());
  Result<std::vector<QuotaRequest>> all = (*store)->Requests(std::nullopt);
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].state, RequestState::kDenied);
  EXPECT_EQ((*all)[1].decision_reason, "too much");
}

}  // namespace
}  // namespace kc::api
