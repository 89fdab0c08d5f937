#include "parallel/worker_pool.h"

#include "base/check.h"

namespace kc::parallel {

WorkerPool::WorkerPool(int threads) {
  KC_CHECK(threads >= 1) << "WorkerPool of " << threads << " threads";
  for (int k = 1; k < threads; ++k) helpers_.emplace_back([this, k] { HelperLoop(k); });
}

WorkerPool::~WorkerPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  start_cv_.SignalAll();
  for (std::thread& t : helpers_) t.join();
}

void WorkerPool::RunImpl(void* fn, Trampoline call) {
  if (helpers_.empty()) {
    call(fn, 0);
    return;
  }
  {
    MutexLock lock(&mu_);
    KC_CHECK(pending_ == 0) << "WorkerPool::Run is not reentrant";
    fn_ = fn;
    call_ = call;
    pending_ = static_cast<int>(helpers_.size());
    returned_ = 0;
    ++generation_;
  }
  start_cv_.SignalAll();
  call(fn, 0);
  MutexLock lock(&mu_);
  Returned();
  while (pending_ > 0) done_cv_.Wait(&mu_);
  fn_ = nullptr;
  call_ = nullptr;
}

void WorkerPool::HelperLoop(int worker) {
  uint64_t seen = 0;
  while (true) {
    void* fn = nullptr;
    Trampoline call = nullptr;
    {
      MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) start_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      call = call_;
    }
    call(fn, worker);
    bool last = false;
    {
      MutexLock lock(&mu_);
      Returned();
      last = --pending_ == 0;
    }
    if (last) done_cv_.Signal();
  }
}

Status WorkerPool::SyncImpl(void* fn, SyncTrampoline call) {
  if (helpers_.empty()) return call(fn);
  MutexLock lock(&mu_);
  const uint64_t generation = sync_generation_;
  if (++sync_arrived_ + returned_ < threads()) {
    while (sync_generation_ == generation) sync_cv_.Wait(&mu_);
    return sync_status_;
  }
  // The last to arrive: the others wait on the lock's condition while serial runs.
  sync_status_ = returned_ > 0 ? AbortedError("a worker of the pass failed") : call(fn);
  sync_arrived_ = 0;
  ++sync_generation_;
  sync_cv_.SignalAll();
  return sync_status_;
}

void WorkerPool::Returned() {
  ++returned_;
  if (sync_arrived_ == 0 || sync_arrived_ + returned_ < threads()) return;
  sync_status_ = AbortedError("a worker of the pass failed");
  sync_arrived_ = 0;
  ++sync_generation_;
  sync_cv_.SignalAll();
}

}  // namespace kc::parallel
