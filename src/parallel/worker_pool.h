// A fixed set of threads that run one function on every thread at once: how one rank spreads a
// step over its cores (each thread takes a slice of the batch). The caller's thread is
// worker 0, so a pool of one thread starts no thread at all.
//
//   WorkerPool pool(2);
//   pool.Run([&](int k) { ... slice k ... });  // returns when every worker has finished
//
// Inside a Run, Sync makes the workers meet: a step that needs every slice done (tensor
// parallelism's all-reduce of a whole activation) runs once, between two halves of the slices.
#pragma once

#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
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

  // Called by every worker inside a Run, as many times and at the same points: the last to
  // arrive runs serial() (a Status-returning callable, on its own thread) while the others
  // wait, and every one returns serial's Status. A worker whose function has returned counts
  // as arrived for the rest of the Run, so one that fails early holds nobody up: a Sync
  // completed that way does not run serial and returns kAborted. With one thread it just runs
  // serial().
  template <typename F>
  Status Sync(F&& serial) {
    return SyncImpl(&serial, [](void* f) -> Status {
      return (*static_cast<std::remove_reference_t<F>*>(f))();
    });
  }

 private:
  using Trampoline = void (*)(void* fn, int worker);
  using SyncTrampoline = Status (*)(void* fn);
  void RunImpl(void* fn, Trampoline call);
  Status SyncImpl(void* fn, SyncTrampoline call);
  void HelperLoop(int worker);
  // A worker's function has returned; completes a Sync it was the last to hold up.
  void Returned() KC_REQUIRES(mu_);

  Mutex mu_;
  CondVar start_cv_;
  CondVar done_cv_;
  void* fn_ KC_GUARDED_BY(mu_) = nullptr;
  Trampoline call_ KC_GUARDED_BY(mu_) = nullptr;
  uint64_t generation_ KC_GUARDED_BY(mu_) = 0;
  int pending_ KC_GUARDED_BY(mu_) = 0;
  bool stop_ KC_GUARDED_BY(mu_) = false;
  // This Run's workers whose function returned, and the Sync in progress.
  int returned_ KC_GUARDED_BY(mu_) = 0;
  int sync_arrived_ KC_GUARDED_BY(mu_) = 0;
  uint64_t sync_generation_ KC_GUARDED_BY(mu_) = 0;
  Status sync_status_ KC_GUARDED_BY(mu_);
  CondVar sync_cv_;
  std::vector<std::thread> helpers_;
};

}  // namespace kc::parallel
