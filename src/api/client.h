// How kc, agents and tools reach kcd: the server's address, the cluster's CA (every
// connection is TLS, plaintext only to loopback when asked), and a bearer token. `kc login`
// keeps these in the user's configuration directory (login.json, mode 0600).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "base/status.h"

namespace kc::api {

struct ClientConfig {
  std::string server = "localhost:7470";
  std::string ca_pem;     // the cluster's CA certificate (PEM); unused with insecure
  std::string token;      // "kc_..."
  bool insecure = false;  // plaintext: refused unless the server is on loopback
};

// Reads / writes login.json. Load: kNotFound, saying to run `kc login`, when the file does not
// exist; kInvalidArgument naming the file and the key for a bad one. Save writes it with mode
// 0600 through a temporary file and a rename.
Result<ClientConfig> LoadClientConfig(const std::string& path);
// As LoadClientConfig, for the file's text; `display_name` stands for it in errors.
Result<ClientConfig> ParseClientConfig(std::string_view text, const std::string& display_name);
Status SaveClientConfig(const std::string& path, const ClientConfig& config);

// Writes `text` to `path` created with mode 0600 (never readable by others, not even briefly),
// durably, through a temporary file and a rename; creates the parent directories.
Status SaveSecret(const std::string& path, std::string_view text);

// A channel to kcd. kInvalidArgument for plaintext to a non-loopback address or TLS without
// a CA.
Result<std::shared_ptr<grpc::Channel>> ConnectToKcd(const ClientConfig& config);

// Makes gRPC resolve names with the system's resolver (getaddrinfo) rather than c-ares, unless
// GRPC_DNS_RESOLVER already chooses. Debian's gRPC with c-ares freed resolver state on one of
// its threads while a call used it (TSan reported it in kc job show, and one kc job show in a
// full test run died of a double free). Called first in kc's and kcd's main, before any channel.
void UseSystemResolver();

// Prepares `context` for a call: the bearer token, and a deadline `timeout` from now.
void PrepareCall(const ClientConfig& config, grpc::ClientContext* context,
                 std::chrono::milliseconds timeout = std::chrono::seconds(30));

// A gRPC status as a kc Status (the codes are the same numbers).
Status FromGrpc(const grpc::Status& status);

}  // namespace kc::api
