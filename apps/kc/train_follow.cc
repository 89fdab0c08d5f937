#include "apps/kc/train_follow.h"

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "base/clock.h"

namespace kc::app {

using Json = nlohmann::json;

FileFollower::FileFollower(std::string path, std::string expected,
                           std::function<bool(const std::string&)> parse)
    : path_(std::move(path)),
      expected_(std::move(expected)),
      parse_(std::move(parse)),
      thread_([this] { Loop(); }) {}

FileFollower::~FileFollower() {
  {
    MutexLock lock(&mu_);
    done_ = true;
    cv_.SignalAll();
  }
  thread_.join();
}

void FileFollower::Loop() {
  std::string seen;
  MutexLock lock(&mu_);
  while (!done_) {
    std::ifstream in(path_);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in && text != seen) {
      seen = text;
      if (!parse_(text)) {
        std::cerr << "kc train: warning: " << path_ << ": expected " << expected_ << "; ignored\n";
      }
    }
    AwaitWithDeadline(Clock::Real(), &cv_, &mu_,
                      Clock::Real()->Now() + std::chrono::milliseconds(250),
                      [this]() KC_REQUIRES(mu_) { return done_; });
  }
}

namespace {

// The integer `key` of a JSON object in [low, high], or nullopt.
std::optional<int64_t> IntegerAt(const std::string& text, const char* key, int64_t low,
                                 int64_t high) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  const Json* v = j.is_object() && j.contains(key) ? &j[key] : nullptr;
  if (v == nullptr || !v->is_number_integer() || v->get<int64_t>() < low ||
      v->get<int64_t>() > high) {
    return std::nullopt;
  }
  return v->get<int64_t>();
}

}  // namespace

std::function<bool(const std::string&)> ResizeParser(
    std::function<void(int, const std::string&)> on_resize) {
  auto asked = std::make_shared<std::pair<int, std::string>>(-1, "");
  return [on_resize = std::move(on_resize), asked](const std::string& text) {
    const std::optional<int64_t> ranks =
        IntegerAt(text, "ranks", 1, std::numeric_limits<int>::max());
    if (!ranks) return false;
    const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    std::string hosts;
    if (j.contains("hosts")) {
      if (!j["hosts"].is_string() || j["hosts"].get<std::string>().empty()) return false;
      hosts = j["hosts"].get<std::string>();
    }
    std::pair<int, std::string> now(static_cast<int>(*ranks), std::move(hosts));
    if (now != *asked) {
      *asked = std::move(now);
      on_resize(asked->first, asked->second);
    }
    return true;
  };
}

std::function<bool(const std::string&)> InspectParser(std::function<void(int64_t)> on_request) {
  return [on_request = std::move(on_request)](const std::string& text) {
    const std::optional<int64_t> request =
        IntegerAt(text, "request", 1, std::numeric_limits<int64_t>::max());
    if (!request) return false;
    on_request(*request);
    return true;
  };
}

}  // namespace kc::app
