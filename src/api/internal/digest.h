// Small helpers the api stores share: SHA-256 and HMAC-SHA256 as hex, and wall-clock seconds.
#pragma once

#include <string>
#include <string_view>

namespace kc::api::internal {

// SHA-256 of `data`, as 64 lowercase hex digits.
std::string Sha256Hex(std::string_view data);

// HMAC-SHA256 of `data` under `key`, as 64 lowercase hex digits.
std::string HmacSha256Hex(std::string_view key, std::string_view data);

// `bytes` random bytes from the system's source, as lowercase hex; "" if the source failed.
std::string RandomHex(int bytes);

// Seconds since the Unix epoch, now.
double WallSeconds();

}  // namespace kc::api::internal
