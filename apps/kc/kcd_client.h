// What the kc commands that talk to kcd share: the login file, a session that calls any of
// kcd's services with the user's token, errors as exit codes, and replies as JSON.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include <iostream>
#include <memory>
#include <string>
#include <string_view>

#include "api/client.h"
#include "apps/kc/command.h"
#include "base/status.h"

namespace kc::app {

// The login file `flag` names, else CONFIG/kc/login.json.
std::string LoginPath(const std::string& flag);

// Prints `s` as `kc: WHAT: message` and returns its exit code: kExitBadInput for
// kInvalidArgument and kNotFound, else kExitFailure.
int Fail(std::string_view what, const Status& s);

// `m` as protobuf JSON with the proto's field names, unset scalars included.
std::string ToJson(const google::protobuf::Message& m);

// A connection to kcd as the logged-in user. Not thread-safe; one per command.
struct Session {
  api::ClientConfig config;
  std::shared_ptr<grpc::Channel> channel;

  // Connects with the login file `login` ("" for the default): kNotFound saying to run
  // `kc login` when there is none; kInvalidArgument for a bad one.
  static Result<Session> Open(const std::string& login);

  // Calls `method` of a service's stub (e.g. &kc::v1::JobService::Stub::Get) with the user's
  // token; blocks for at most 30 s. Returns kcd's status as a kc Status.
  template <typename Stub, typename Req, typename Resp>
  Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*), const Req& req,
              Resp* resp) {
    Stub stub(channel);
    grpc::ClientContext ctx;
    api::PrepareCall(config, &ctx);
    return api::FromGrpc((stub.*method)(&ctx, req, resp));
  }
};

// A whole command that makes one call: opens the session of `login`, calls `method` with
// `req` and prints the reply, as JSON with `json`, else with `print(reply)`. Returns the exit
// code; a failure is reported as `kc: WHAT: message` (Fail).
template <typename Stub, typename Req, typename Resp, typename Print>
int CallAndPrint(std::string_view what, const std::string& login, bool json,
                 grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
                 const Req& req, Print print) {
  Result<Session> s = Session::Open(login);
  if (!s.ok()) return Fail(what, s.status());
  Resp resp;
  if (Status st = s->Call(method, req, &resp); !st.ok()) return Fail(what, st);
  if (json) {
    std::cout << ToJson(resp) << "\n";
  } else {
    print(resp);
  }
  return kExitOk;
}

}  // namespace kc::app
