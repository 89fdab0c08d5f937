#include "api/api_reference.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/file.h"
#include "tests/support/repo_root.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

google::protobuf::FileDescriptorSet Idl() {
  google::protobuf::FileDescriptorSet set;
  Result<std::string> bytes = ReadWholeFile(KC_IDL_SOURCE_INFO_SET);
  EXPECT_TRUE(bytes.ok()) << bytes.status().message();
  EXPECT_TRUE(bytes.ok() && set.ParseFromString(*bytes));
  return set;
}

TEST(ApiReferenceTest, ShowsCommentsErrorsLimitsAndPermissions) {
  Result<std::string> md = ApiReferenceMarkdown(Idl());
  ASSERT_TRUE(md.ok()) << md.status().message();
  EXPECT_THAT(*md, HasSubstr("## kc.v1.QuotaService\n"));
  EXPECT_THAT(*md, HasSubstr("### Approve\n\n`rpc Approve(kc.v1.DecideQuotaRequest) returns "
                             "(kc.v1.QuotaRequestInfo)`\n\nApproves a pending request"));
  EXPECT_THAT(*md, HasSubstr("| permission | `quota.approve`: system_admin any, resource_admin "
                             "team, submitter -, observer - |"));
  EXPECT_THAT(*md, HasSubstr("| errors | `NOT_FOUND`, `UNAUTHENTICATED`, `PERMISSION_DENIED`, "
                             "`FAILED_PRECONDITION`, `RESOURCE_EXHAUSTED` |"));
  EXPECT_THAT(*md, HasSubstr("| rate limit | 1 calls/s, burst 5, per caller |"));
  EXPECT_THAT(*md, HasSubstr("| `max_devices` | 1 | optional int64 | Devices held at once"));
  EXPECT_THAT(*md, HasSubstr("| `SERVING` | 1 | Ready to take calls. |"));
}

// The committed reference is what the IDL generates (regenerate: docs/development.md).
TEST(ApiReferenceTest, TheDocsAreGeneratedFromTheIdl) {
  Result<std::string> md = ApiReferenceMarkdown(Idl());
  ASSERT_TRUE(md.ok()) << md.status().message();
  Result<std::string> doc = ReadWholeFile(kc::testing::RepoRoot() + "docs/reference/api.md");
  ASSERT_TRUE(doc.ok()) << doc.status().message();
  EXPECT_TRUE(*doc == *md)
      << "docs/reference/api.md is stale: run "
         "`cmake --build build/release --target kc_api_reference_update` and commit it";
}

}  // namespace
}  // namespace kc::api
