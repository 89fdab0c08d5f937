// `kc train --resize-file`: the size an elastic run follows, as kc agent keeps it with the
// scheduler's grow and shrink (docs/user-guide/elastic.md).
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "base/mutex.h"

namespace kc::app {

// Follows --resize-file, a JSON file {"ranks": N} that kc agent rewrites (by rename) with
// the scheduler's grow and shrink: each new N is passed to `on_resize`, from a thread of its
// own that looks at the file four times a second. A file that is missing or does not parse
// is passed over (with one warning for each content that does not parse).
class ResizeFollower {
 public:
  ResizeFollower(std::string path, std::function<void(int)> on_resize);
  ~ResizeFollower();
  ResizeFollower(const ResizeFollower&) = delete;
  ResizeFollower& operator=(const ResizeFollower&) = delete;

 private:
  void Loop();

  const std::string path_;
  const std::function<void(int)> on_resize_;
  Mutex mu_;
  CondVar cv_;
  bool done_ KC_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is
};

}  // namespace kc::app
