// The TCP store's frames (src/comm/doc/store_protocol.md) and the key and value checks every
// Store implementation shares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "comm/store.h"

namespace kc::comm::internal {

// kInvalidArgument unless 1 <= key.size() <= kMaxKeyBytes; `op` names the call ("store set").
Status ValidateKey(std::string_view op, std::string_view key);
// kInvalidArgument when value.size() > kMaxValueBytes.
Status ValidateValue(std::string_view op, std::string_view key, std::string_view value);
// The key for messages: quoted, non-printable bytes escaped, long keys cut to 64 bytes.
std::string QuoteKey(std::string_view key);
// A decimal int64 counter value (as Add stores it); nullopt when `value` is not one.
std::optional<int64_t> ParseCounter(std::string_view value);

// "KCS1" as the first four bytes of every frame (read little-endian).
inline constexpr uint32_t kMagic = 0x3153434b;
inline constexpr size_t kHeaderBytes = 24;
// A request body longer than this is skipped unread and answered with kInvalidArgument. It
// fits the largest valid request: a CompareSet with a full-size expected and desired value.
inline constexpr size_t kMaxRequestBodyBytes = 2 * kMaxValueBytes + kMaxKeyBytes + 64;
// Replies carry at most one value; error messages are cut to kMaxMessageBytes.
inline constexpr size_t kMaxMessageBytes = 4096;
inline constexpr size_t kMaxReplyBodyBytes = kMaxValueBytes + 64;
// The server caps a Get or Wait timeout at this; longer waits end with kDeadlineExceeded.
inline constexpr uint64_t kMaxTimeoutMs = uint64_t{30} * 24 * 3600 * 1000;

enum class Op : uint8_t {
  kSet = 1,
  kGet = 2,
  kWait = 3,
  kAdd = 4,
  kCompareSet = 5,
  kDelete = 6,
  kCheck = 7,
  // The connection's credential: one "key", the server's token. A server with a token answers
  // every other request on a connection that has not said it with kPermissionDenied.
  kHello = 8,
};
std::string_view OpName(Op op);  // "set", "get", ...

// The fixed 24-byte header in front of every request and reply body.
struct Header {
  uint32_t body_bytes = 0;
  uint64_t request_id = 0;
  Op op = Op::kSet;
  ErrorCode code = ErrorCode::kOk;  // always kOk in requests
};

// Writes the header's 24 bytes at `out`.
void EncodeHeader(const Header& h, unsigned char* out);
// Reads a header; false when the magic, the op, the reserved bytes or the code are not valid.
bool DecodeHeader(const unsigned char* in, Header* h);

// One request. The views point into the caller's arguments (encoding) or into the received
// body (decoding) and are valid as long as those are.
struct Request {
  Op op = Op::kSet;
  uint64_t request_id = 0;
  uint64_t timeout_ms = 0;                   // kGet, kWait
  int64_t delta = 0;                         // kAdd
  std::vector<std::string_view> keys;        // exactly one except for kWait and kCheck
  std::string_view value;                    // kSet: the value; kCompareSet: desired
  std::optional<std::string_view> expected;  // kCompareSet
};

// Appends the request's frame (header and body) to *out.
void EncodeRequest(const Request& r, std::string* out);
// Parses the body of a request with header `h` into *r; false when the body is malformed
// (fields overrun it, bytes are left over, a flag is not 0 or 1, a single-key op has a
// count). Limits are not checked here: see CheckRequestLimits.
bool DecodeRequestBody(const Header& h, std::string_view body, Request* r);
// kInvalidArgument when a key or value of a well-formed request breaks the limits.
Status CheckRequestLimits(const Request& r);

// One reply. On an error only `message` is meaningful.
struct Reply {
  Op op = Op::kSet;
  uint64_t request_id = 0;
  ErrorCode code = ErrorCode::kOk;
  std::string_view message;  // code != kOk
  std::string_view value;    // kGet: the value; kCompareSet: the current value if present
  int64_t number = 0;        // kAdd: the new value
  bool flag = false;         // kDelete: existed; kCheck: all present; kCompareSet: swapped
  bool present = false;      // kCompareSet: the key exists after the call
};

// Appends the reply's frame to *out (a message longer than kMaxMessageBytes is cut).
void EncodeReply(const Reply& r, std::string* out);
// Parses the body of a reply with header `h`; false when malformed.
bool DecodeReplyBody(const Header& h, std::string_view body, Reply* r);

}  // namespace kc::comm::internal
