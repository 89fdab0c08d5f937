// The files kc train follows while it runs, which another process (kc agent, kc diagnose)
// rewrites whole (by rename): --resize-file, the size an elastic run follows with the
// scheduler's grow and shrink (docs/user-guide/elastic.md), and inspect.json beside the
// metrics, a request to say where every rank is (docs/user-guide/diagnose.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "base/mutex.h"

namespace kc::app {

// Follows `path` from a thread of its own that looks at it four times a second: each new
// content that `parse` accepts (returns true for) is acted on there; one that it refuses is
// passed over with one warning naming the file and `expected`. A missing file is passed over.
class FileFollower {
 public:
  FileFollower(std::string path, std::string expected,
               std::function<bool(const std::string&)> parse);
  ~FileFollower();
  FileFollower(const FileFollower&) = delete;
  FileFollower& operator=(const FileFollower&) = delete;

 private:
  void Loop();

  const std::string path_;
  const std::string expected_;
  const std::function<bool(const std::string&)> parse_;
  Mutex mu_;
  CondVar cv_;
  bool done_ KC_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is
};

// --resize-file: {"ranks": N} or, for a run across hosts, {"ranks": N, "hosts": "H:N,..."}
// (the hosts and their ranks from now on), kc agent's; each new N or hosts goes to `on_resize`
// (hosts "" when not given).
std::function<bool(const std::string&)> ResizeParser(
    std::function<void(int, const std::string&)> on_resize);
// inspect.json: {"request": N}, kc diagnose's or kc agent's; each new N goes to `on_request`.
std::function<bool(const std::string&)> InspectParser(std::function<void(int64_t)> on_request);

}  // namespace kc::app
