// A fixed set of threads that run one function on every thread at once: how one rank spreads a
// step over its cores (each thread takes a slice of the batch). The caller's thread is
// worker 0, so a pool of one thread starts no thread at all.
//
//   WorkerPool pool(2);
//   pool.Run([&](int k) { ... slice k ... });  // returns when every worker has finished
#pragma once

#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

#include "base/mutex.h"
#include "base/thread_annotations.h"

namespace kc::parallel {

class WorkerPool {
 public:
  // threads >= 1: the caller plus threads - 1 helpers, started now and joined by the
  // destructor.
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

  // Runs fn(0) on the calling thread and fn(k) on helper k for k in [1, threads), and
  // returns when all have returned. One Run at a time (not reentrant); fn must not throw.
  // Allocates nothing: fn is called through a pointer, not copied.
  template <typename F>
  void Run(F&& fn) {
    RunImpl(&fn,
            [](void* f, int worker) { (*static_cast<std::remove_reference_t<F>*>(f))(worker); });
  }

 private:
  using Trampoline = void (*)(void* fn, int worker);
  void RunImpl(void* fn, Trampoline call);
  void HelperLoop(int worker);

  Mutex mu_;
  CondVar start_cv_;
  CondVar done_cv_;
  void* fn_ KC_GUARDED_BY(mu_) = nullptr;
  Trampoline call_ KC_GUARDED_BY(mu_) = nullptr;
  uint64_t generation_ KC_GUARDED_BY(mu_) = 0;
  int pending_ KC_GUARDED_BY(mu_) = 0;
  bool stop_ KC_GUARDED_BY(mu_) = false;
  std::vector<std::thread> helpers_;
};

}  // namespace kc::parallel
