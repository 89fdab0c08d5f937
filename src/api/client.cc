#include "api/client.h"

#include <fmt/format.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "base/file.h"

namespace kc::api {

Result<ClientConfig> LoadClientConfig(const std::string& path) {
  Result<std::string> text = ReadWholeFile(path);
  if (!text.ok()) {
    if (text.status().code() == ErrorCode::kNotFound) {
      return NotFoundError(fmt::format("{}: not logged in (run kc login, or kc up)", path));
    }
    return text.status();
  }
  return ParseClientConfig(*text, path);
}

Result<ClientConfig> ParseClientConfig(std::string_view text, const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgumentError(fmt::format("{}: not a JSON object", path));
  ClientConfig c;
  for (auto [key, out] : {std::pair{"server", &c.server}, {"ca", &c.ca_pem}, {"token", &c.token}}) {
    if (!j.contains(key) || !j[key].is_string()) {
      return InvalidArgumentError(fmt::format("{}: {}: expected a string", path, key));
    }
    *out = j[key].get<std::string>();
  }
  if (j.contains("insecure")) {
    if (!j["insecure"].is_boolean()) {
      return InvalidArgumentError(fmt::format("{}: insecure: expected true or false", path));
    }
    c.insecure = j["insecure"].get<bool>();
  }
  return c;
}

Status SaveClientConfig(const std::string& path, const ClientConfig& c) {
  const nlohmann::json j = {
      {"server", c.server}, {"ca", c.ca_pem}, {"token", c.token}, {"insecure", c.insecure}};
  return SaveSecret(path, j.dump(2) + "\n");
}

Status SaveSecret(const std::string& path, std::string_view text) {
  return WriteFileDurably(path, text, {.mode = 0600});
}

Result<std::shared_ptr<grpc::Channel>> ConnectToKcd(const ClientConfig& c) {
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (c.insecure) {
    const std::string host = c.server.substr(0, c.server.rfind(':'));
    if (host != "127.0.0.1" && host != "localhost" && host != "[::1]") {
      return InvalidArgumentError(
          fmt::format("{}: plaintext is allowed only to a loopback address", c.server));
    }
    creds = grpc::InsecureChannelCredentials();
  } else {
    if (c.ca_pem.empty()) {
      return InvalidArgumentError(fmt::format("{}: no CA certificate to check kcd's", c.server));
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = c.ca_pem;
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);
  // Reconnect within a second of kcd coming back (gRPC's default backoff grows to minutes):
  // agents keep their jobs running across a kcd restart and must report back soon after.
  // (The minimum also bounds one connection attempt, TLS handshake included: on a host busy
  // training it must not be short.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(c.server, creds, args);
}

void PrepareCall(const ClientConfig& c, grpc::ClientContext* context,
                 std::chrono::milliseconds timeout) {
  context->AddMetadata("authorization", "Bearer " + c.token);
  context->set_deadline(std::chrono::system_clock::now() + timeout);
}

Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return OkStatus();
  return Status(static_cast<ErrorCode>(s.error_code()), s.error_message());
}

void UseSystemResolver() { setenv("GRPC_DNS_RESOLVER", "native", /*overwrite=*/0); }

}  // namespace kc::api
