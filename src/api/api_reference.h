// The API reference (docs/reference/api.md), generated from the IDL: every service and method
// with its comments, request and response fields, declared errors, rate limit and the
// permission-table action it checks. kc_api_reference writes it; a test keeps the committed
// file equal to what the IDL generates.
#pragma once

#include <google/protobuf/descriptor.pb.h>

#include <string>

#include "base/status.h"

namespace kc::api {

// The reference as Markdown for `files`: the compiled descriptor set of proto/kc with source
// info (protoc --include_source_info, without imports), as the build writes it (kc_idl's
// KC_IDL_SOURCE_INFO_SET). kInvalidArgument when the set does not build (a missing import).
Result<std::string> ApiReferenceMarkdown(const google::protobuf::FileDescriptorSet& files);

}  // namespace kc::api
