// Test support: kcd over a cluster directory, in the test's own process, serving plaintext on
// a loopback port, and a channel to it. Header-only.
#pragma once

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "api/control_plane.h"

namespace kc::testing {

struct KcdInProcess {
  std::unique_ptr<api::Kcd> kcd;
  std::shared_ptr<grpc::Channel> channel;
};

// Starts kcd on `options.dir` (kc init's directory) with `options` on 127.0.0.1, any port.
inline Result<KcdInProcess> StartKcdInProcess(api::KcdOptions options) {
  options.listen = "127.0.0.1:0";
  options.insecure_loopback = true;
  KC_ASSIGN_OR_RETURN(std::unique_ptr<api::Kcd> kcd, api::Kcd::Start(options));
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(
      fmt::format("127.0.0.1:{}", kcd->port()), grpc::InsecureChannelCredentials());
  return KcdInProcess{.kcd = std::move(kcd), .channel = std::move(channel)};
}

}  // namespace kc::testing
