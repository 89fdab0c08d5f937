#include "base/status.h"

#include <string>

namespace kc {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "OK";
    case ErrorCode::kCancelled:
      return "CANCELLED";
    case ErrorCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case ErrorCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case ErrorCode::kNotFound:
      return "NOT_FOUND";
    case ErrorCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case ErrorCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case ErrorCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case ErrorCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case ErrorCode::kAborted:
      return "ABORTED";
    case ErrorCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case ErrorCode::kInternal:
      return "INTERNAL";
    case ErrorCode::kUnavailable:
      return "UNAVAILABLE";
    case ErrorCode::kDataLoss:
      return "DATA_LOSS";
    case ErrorCode::kUnauthenticated:
      return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

Retry RetryFor(ErrorCode code) {
  switch (code) {
    case ErrorCode::kUnavailable:
    case ErrorCode::kResourceExhausted:
    case ErrorCode::kDeadlineExceeded:
      return Retry::kCall;
    case ErrorCode::kAborted:
      return Retry::kHigherLevel;
    default:
      return Retry::kNever;
  }
}

Status::Status(ErrorCode code, std::string_view message, SourceLocation loc)
    : code_(code), message_(message), loc_(loc) {}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  Status s = *this;
  s.message_ = std::string(context) + ": " + message_;
  return s;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(ErrorCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }
std::ostream& operator<<(std::ostream& os, ErrorCode code) { return os << ErrorCodeName(code); }

}  // namespace kc
