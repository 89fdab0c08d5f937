#include "apps/kc/train_resize.h"

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/clock.h"

namespace kc::app {

ResizeFollower::ResizeFollower(std::string path, std::function<void(int)> on_resize)
    : path_(std::move(path)), on_resize_(std::move(on_resize)), thread_([this] { Loop(); }) {}

ResizeFollower::~ResizeFollower() {
  {
    MutexLock lock(&mu_);
    done_ = true;
    cv_.SignalAll();
  }
  thread_.join();
}

void ResizeFollower::Loop() {
  using Json = nlohmann::json;
  std::string seen;
  int asked = -1;
  MutexLock lock(&mu_);
  while (!done_) {
    std::ifstream in(path_);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in && text != seen) {
      seen = text;
      const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      const Json* ranks = j.is_object() && j.contains("ranks") ? &j["ranks"] : nullptr;
      if (ranks == nullptr || !ranks->is_number_integer() || ranks->get<int64_t>() < 1 ||
          ranks->get<int64_t>() > std::numeric_limits<int>::max()) {
        std::cerr << "kc train: warning: --resize-file " << path_
                  << ": expected {\"ranks\": N} with N at least 1; ignored\n";
      } else if (ranks->get<int>() != asked) {
        asked = ranks->get<int>();
        on_resize_(asked);
      }
    }
    AwaitWithDeadline(Clock::Real(), &cv_, &mu_,
                      Clock::Real()->Now() + std::chrono::milliseconds(250),
                      [this]() KC_REQUIRES(mu_) { return done_; });
  }
}

}  // namespace kc::app
