// Cost per chunk of the lane scheduler (Enqueue + Next on one thread, the real clock) and of
// an uncontended rate-limiter admission (docs/design/lanes-and-rate-limits.md).
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>

#include "base/clock.h"
#include "comm/lanes.h"
#include "comm/rate_limit.h"

namespace kc::comm {
namespace {

std::unique_ptr<LaneScheduler> MakeScheduler(benchmark::State& state) {
  Result<std::unique_ptr<LaneScheduler>> s = LaneScheduler::Create(LaneOptions{}, Clock::Real());
  if (!s.ok()) state.SkipWithError(s.status().ToString().c_str());
  return s.ok() ? std::move(s).value() : nullptr;
}

// One single-chunk message enqueued and taken per iteration.
void BM_EnqueueNextOneChunk(benchmark::State& state) {
  auto s = MakeScheduler(state);
  if (s == nullptr) return;
  const TimePoint deadline = Clock::Real()->Now() + std::chrono::hours(1);
  uint64_t id = 0;
  for (auto _ : state) {
    Status st = s->Enqueue(Lane::kGradient, {.id = id++, .size_bytes = 4096}, deadline);
    Result<Chunk> c = s->Next(deadline);
    benchmark::DoNotOptimize(st);
    benchmark::DoNotOptimize(c);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EnqueueNextOneChunk);

// A 64 MiB message (256 chunks of 256 KiB) per iteration: the per-chunk cost of Next.
void BM_EnqueueNextLargeMessage(benchmark::State& state) {
  auto s = MakeScheduler(state);
  if (s == nullptr) return;
  const TimePoint deadline = Clock::Real()->Now() + std::chrono::hours(1);
  const int64_t chunks = 256;
  uint64_t id = 0;
  for (auto _ : state) {
    Status st = s->Enqueue(Lane::kTelemetry,
                           {.id = id++, .size_bytes = chunks * s->options().chunk_bytes}, deadline);
    benchmark::DoNotOptimize(st);
    for (int64_t i = 0; i < chunks; ++i) {
      Result<Chunk> c = s->Next(deadline);
      benchmark::DoNotOptimize(c);
    }
  }
  state.SetItemsProcessed(state.iterations() * chunks);
}
BENCHMARK(BM_EnqueueNextLargeMessage);

// Every lane busy, so each Next runs the priority pick and the starvation guard.
void BM_NextAllLanesBusy(benchmark::State& state) {
  auto s = MakeScheduler(state);
  if (s == nullptr) return;
  const TimePoint deadline = Clock::Real()->Now() + std::chrono::hours(1);
  uint64_t id = 0;
  for (Lane lane : kAllLanes) {
    for (int i = 0; i < 64; ++i) {
      s->Enqueue(lane, {.id = id++, .size_bytes = 4096}, deadline).IgnoreError();  // room
    }
  }
  for (auto _ : state) {
    Result<Chunk> c = s->Next(deadline);
    if (!c.ok()) {
      state.SkipWithError(c.status().ToString().c_str());
      break;
    }
    // Put the chunk back at the end of its lane, so every lane stays busy.
    Status st = s->Enqueue(c->lane, {.id = id++, .size_bytes = 4096}, deadline);
    benchmark::DoNotOptimize(st);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_NextAllLanesBusy);

// An admission that never waits: the limiter's fixed cost per operation.
void BM_RateLimiterAcquireUncontended(benchmark::State& state) {
  Result<std::unique_ptr<RateLimiter>> limiter = RateLimiter::Create(
      {.ops_per_second = 1e12, .bytes_per_second = 1e18, .burst_ops = 1e12, .burst_bytes = 1e18},
      Clock::Real());
  if (!limiter.ok()) {
    state.SkipWithError(limiter.status().ToString().c_str());
    return;
  }
  const TimePoint deadline = Clock::Real()->Now() + std::chrono::hours(1);
  for (auto _ : state) {
    Status st = (*limiter)->Acquire(4096, deadline);
    benchmark::DoNotOptimize(st);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RateLimiterAcquireUncontended);

}  // namespace
}  // namespace kc::comm

BENCHMARK_MAIN();
