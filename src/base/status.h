// Status and Result<T>: the one way every layer reports errors (STYLE.md §4).
// The codes and their retry meaning are documented once in src/api/errors.md.
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "base/check.h"
#include "base/source_location.h"

namespace kc {

// The closed set of error codes. Values equal gRPC's canonical codes, so the interface
// layer returns them unchanged; there is no translation table to drift.
enum class ErrorCode : int {
  kOk = 0,
  // The operation was cancelled by its caller. Do not retry unless the caller asks again.
  kCancelled = 1,
  // The request itself is malformed (bad config key, bad argument). Never retry unchanged.
  kInvalidArgument = 3,
  // A deadline passed before the operation finished. Retry with a new deadline, or escalate.
  kDeadlineExceeded = 4,
  // A named entity (file, job, rank, key) does not exist.
  kNotFound = 5,
  // The entity to create exists already.
  kAlreadyExists = 6,
  // The caller is known but lacks the right. Never retry without a change of rights.
  kPermissionDenied = 7,
  // A quota, queue or rate limit is exhausted. Retry later, with backoff.
  kResourceExhausted = 8,
  // The system is not in a state that allows the call (a boundary violation refused, a
  // communicator not initialised). Do not retry until the state is fixed.
  kFailedPrecondition = 9,
  // The operation was aborted by a concurrent failure (a peer lost mid-collective). Retry at
  // a higher level: rebuild the group, redo the step.
  kAborted = 10,
  // The operation is not implemented or not supported here.
  kUnimplemented = 12,
  // An invariant the system relies on is broken. A bug; not retried.
  kInternal = 13,
  // The service or peer is transiently unreachable. Retry this call, with backoff.
  kUnavailable = 14,
  // Unrecoverable data loss or corruption (a checksum mismatch).
  kDataLoss = 15,
  // The caller has no valid credentials.
  kUnauthenticated = 16,
};

// Every code above, in numeric order; tests and the IDL check iterate over it.
inline constexpr ErrorCode kAllErrorCodes[] = {
    ErrorCode::kOk,
    ErrorCode::kCancelled,
    ErrorCode::kInvalidArgument,
    ErrorCode::kDeadlineExceeded,
    ErrorCode::kNotFound,
    ErrorCode::kAlreadyExists,
    ErrorCode::kPermissionDenied,
    ErrorCode::kResourceExhausted,
    ErrorCode::kFailedPrecondition,
    ErrorCode::kAborted,
    ErrorCode::kUnimplemented,
    ErrorCode::kInternal,
    ErrorCode::kUnavailable,
    ErrorCode::kDataLoss,
    ErrorCode::kUnauthenticated,
};

// "INVALID_ARGUMENT", "OK", ...; "UNKNOWN(n)" is never produced for a valid code.
std::string_view ErrorCodeName(ErrorCode code);

// How a caller reacts to a code. The fault layer decides by code and never parses messages.
enum class Retry {
  kNever,        // fix the input or the state first
  kCall,         // retry this call (with backoff)
  kHigherLevel,  // give up this call; rebuild the group or redo the step
};
Retry RetryFor(ErrorCode code);

// The result of an operation: OK, or an error code with a message and the source location
// that created it. Cheap to copy when OK. Not thread-safe for concurrent mutation.
class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(ErrorCode code, std::string_view message, SourceLocation loc = SourceLocation::current());

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  const char* file() const { return loc_.file; }
  int line() const { return loc_.line; }

  // A copy with "context: " prefixed to the message; OK stays OK. Use when an error crosses
  // a layer, e.g. s.WithContext("allreduce step=12 rank=3").
  Status WithContext(std::string_view context) const;

  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;

  // Explicitly drops an error. Say why in a comment at the call site.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
  SourceLocation loc_;
};

std::ostream& operator<<(std::ostream& os, const Status& s);
std::ostream& operator<<(std::ostream& os, ErrorCode code);

inline Status OkStatus() { return Status(); }

// One factory per code, e.g. InvalidArgumentError("model.heads: expected ...").
#define KC_DECLARE_ERROR_FACTORY(Name, Code)                                                     \
  inline Status Name(std::string_view message, SourceLocation loc = SourceLocation::current()) { \
    return Status(ErrorCode::Code, message, loc);                                                \
  }
KC_DECLARE_ERROR_FACTORY(CancelledError, kCancelled)
KC_DECLARE_ERROR_FACTORY(InvalidArgumentError, kInvalidArgument)
KC_DECLARE_ERROR_FACTORY(DeadlineExceededError, kDeadlineExceeded)
KC_DECLARE_ERROR_FACTORY(NotFoundError, kNotFound)
KC_DECLARE_ERROR_FACTORY(AlreadyExistsError, kAlreadyExists)
KC_DECLARE_ERROR_FACTORY(PermissionDeniedError, kPermissionDenied)
KC_DECLARE_ERROR_FACTORY(ResourceExhaustedError, kResourceExhausted)
KC_DECLARE_ERROR_FACTORY(FailedPreconditionError, kFailedPrecondition)
KC_DECLARE_ERROR_FACTORY(AbortedError, kAborted)
KC_DECLARE_ERROR_FACTORY(UnimplementedError, kUnimplemented)
KC_DECLARE_ERROR_FACTORY(InternalError, kInternal)
KC_DECLARE_ERROR_FACTORY(UnavailableError, kUnavailable)
KC_DECLARE_ERROR_FACTORY(DataLossError, kDataLoss)
KC_DECLARE_ERROR_FACTORY(UnauthenticatedError, kUnauthenticated)
#undef KC_DECLARE_ERROR_FACTORY

// A value of type T, or the Status saying why there is none (like absl::StatusOr).
// Not thread-safe for concurrent mutation.
template <typename T>
class [[nodiscard]] Result {
 public:
  // REQUIRES: !status.ok(). An OK status without a value is a bug.
  Result(Status status) : rep_(std::move(status)) {  // NOLINT: implicit by design
    KC_CHECK(!std::get<Status>(rep_).ok()) << "Result constructed from an OK Status";
  }
  Result(const T& value) : rep_(value) {}        // NOLINT: implicit by design
  Result(T&& value) : rep_(std::move(value)) {}  // NOLINT: implicit by design
  template <typename U>
  requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, T> &&
           !std::is_same_v<std::decay_t<U>, Status> && !std::is_same_v<std::decay_t<U>, Result<T>>)
      Result(U&& value)
      : rep_(std::in_place_type<T>, std::forward<U>(value)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(rep_); }

  // OK when a value is held.
  Status status() const& { return ok() ? Status() : std::get<Status>(rep_); }
  Status status() && { return ok() ? Status() : std::get<Status>(std::move(rep_)); }

  // REQUIRES: ok(). Checked: reading the value of an error is a bug.
  const T& value() const& {
    CheckOk();
    return std::get<T>(rep_);
  }
  T& value() & {
    CheckOk();
    return std::get<T>(rep_);
  }
  T&& value() && {
    CheckOk();
    return std::get<T>(std::move(rep_));
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

  // The value, or `fallback` when there is none.
  T value_or(T fallback) const& { return ok() ? std::get<T>(rep_) : std::move(fallback); }

  void IgnoreError() const {}

 private:
  void CheckOk() const {
    KC_CHECK(ok()) << "value() of an error Result: " << std::get<Status>(rep_).ToString();
  }
  std::variant<Status, T> rep_;
};

namespace internal_status {
inline const Status& AsStatus(const Status& s) { return s; }
template <typename T>
Status AsStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace internal_status

}  // namespace kc

#define KC_STATUS_CONCAT_INNER(a, b) a##b
#define KC_STATUS_CONCAT(a, b) KC_STATUS_CONCAT_INNER(a, b)

// Returns the Status of `expr` (a Status or a Result) from the enclosing function if it is
// not OK.
#define KC_RETURN_IF_ERROR(expr)                                     \
  do {                                                               \
    ::kc::Status kc_status_ = ::kc::internal_status::AsStatus(expr); \
    if (!kc_status_.ok()) return kc_status_;                         \
  } while (false)

// KC_ASSIGN_OR_RETURN(auto x, ComputeX()): evaluates a Result; on error returns its Status,
// else moves the value into `lhs`.
#define KC_ASSIGN_OR_RETURN(lhs, expr) \
  KC_ASSIGN_OR_RETURN_IMPL(KC_STATUS_CONCAT(kc_result_, __LINE__), lhs, expr)
#define KC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return std::move(tmp).status(); \
  lhs = std::move(tmp).value()
