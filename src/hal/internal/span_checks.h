// Argument checks shared by the front ends of copies and kernels: every failure is
// kInvalidArgument naming the argument.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "hal/compute.h"

namespace kc::hal::internal {

// A null pointer with a nonzero size; a non-empty span on another device than `device`; a
// pointer misaligned for T.
template <typename T>
Status CheckSpanOn(DeviceSpan<T> s, DeviceId device, const char* name) {
  if (s.empty()) return OkStatus();
  if (s.data() == nullptr) {
    return InvalidArgumentError(std::string(name) + ": null pointer with size " +
                                std::to_string(s.size()));
  }
  if (s.device() != device) {
    return InvalidArgumentError(std::string(name) + ": memory of device ordinal " +
                                std::to_string(s.device().ordinal) + ", not the stream's");
  }
  if (reinterpret_cast<uintptr_t>(s.data()) % alignof(T) != 0) {
    return InvalidArgumentError(std::string(name) + ": pointer misaligned for its type");
  }
  return OkStatus();
}

template <typename T>
Status CheckSpan(const Stream& stream, DeviceSpan<T> s, const char* name) {
  return CheckSpanOn(s, stream.device().id(), name);
}

// Non-empty spans whose byte ranges intersect.
template <typename T, typename U>
Status CheckDisjoint(DeviceSpan<T> a, DeviceSpan<U> b, const char* a_name, const char* b_name) {
  if (a.empty() || b.empty() || a.device() != b.device()) return OkStatus();
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(a.data());
  const uintptr_t b0 = reinterpret_cast<uintptr_t>(b.data());
  if (a0 < b0 + b.size_bytes() && b0 < a0 + a.size_bytes()) {
    return InvalidArgumentError(std::string(a_name) + " and " + b_name + " overlap");
  }
  return OkStatus();
}

}  // namespace kc::hal::internal
