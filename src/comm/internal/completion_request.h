// The Request every transport hands out: completed once by its progress thread, waited on
// by the caller with a deadline on the transport's clock.
#pragma once

#include <optional>
#include <utility>

#include "base/clock.h"
#include "base/layer_guard.h"
#include "base/mutex.h"
#include "comm/transport.h"

namespace kc::comm::internal {

// Safe for concurrent use.
class CompletionRequest final : public Request {
 public:
  // `clock` is the transport's and outlives the request (the transport's options say so);
  // `component` names the transport in the layer guard and in messages (a literal).
  CompletionRequest(Clock* clock, const char* component) : clock_(clock), component_(component) {}

  Status Wait(TimePoint deadline) override {
    KC_LAYER_ENTRY(Layer::kComm, component_);
    MutexLock lock(&mu_);
    if (!AwaitWithDeadline(clock_, &cv_, &mu_, deadline,
                           [this]() KC_REQUIRES(mu_) { return result_.has_value(); })) {
      return DeadlineExceededError(std::string(component_) +
                                   ": request still pending at its deadline");
    }
    return *result_;
  }

  std::optional<Status> Test() override {
    MutexLock lock(&mu_);
    return result_;
  }

  // The first completion decides the result; later ones are ignored.
  void Complete(Status s) {
    MutexLock lock(&mu_);
    if (result_.has_value()) return;
    result_ = std::move(s);
    cv_.SignalAll();
  }

 private:
  Clock* const clock_;
  const char* const component_;
  Mutex mu_;
  CondVar cv_;
  std::optional<Status> result_ KC_GUARDED_BY(mu_);
};

}  // namespace kc::comm::internal
