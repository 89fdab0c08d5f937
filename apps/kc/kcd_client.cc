#include "apps/kc/kcd_client.h"

#include <google/protobuf/util/json_util.h>

#include <iostream>

#include "apps/kc/command.h"

namespace kc::app {

std::string LoginPath(const std::string& flag) {
  return flag.empty() ? UserConfigPath("login.json") : flag;
}

int Fail(std::string_view what, const Status& s) {
  std::cerr << "kc: " << what << ": " << Printable(s.message()) << "\n";
  return s.code() == ErrorCode::kInvalidArgument || s.code() == ErrorCode::kNotFound ? kExitBadInput
                                                                                     : kExitFailure;
}

Result<Session> Session::Open(const std::string& login) {
  Session s;
  KC_ASSIGN_OR_RETURN(s.config, api::LoadClientConfig(LoginPath(login)));
  KC_ASSIGN_OR_RETURN(s.channel, api::ConnectToKcd(s.config));
  return s;
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);  // our own messages: cannot fail
  return out;
}

}  // namespace kc::app
