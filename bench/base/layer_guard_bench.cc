// Cost of the runtime boundary guard on the hot path when nothing is violated, against the
// same call without a guard, measured in the same run (bench/base/guard_overhead.py prints
// the difference). The bar: < 20 ns per guarded call.
#include <benchmark/benchmark.h>

#include "base/layer_guard.h"

namespace kc {
namespace {

[[gnu::noinline]] Status PlainEntry(int* counter) {
  ++*counter;
  benchmark::DoNotOptimize(counter);
  return OkStatus();
}

[[gnu::noinline]] Status GuardedEntry(int* counter) {
  KC_LAYER_ENTRY(Layer::kComm, "communicator");
  ++*counter;
  benchmark::DoNotOptimize(counter);
  return OkStatus();
}

[[gnu::noinline]] Status GuardedBlockingEntry(int* counter) {
  KC_LAYER_BLOCKING_ENTRY(Layer::kComm, "communicator", counter);
  ++*counter;
  benchmark::DoNotOptimize(counter);
  return OkStatus();
}

// Calls `entry` from inside an L3 frame, as the engine calls into comm.
template <Status (*Entry)(int*)>
void RunFromParallelLayer(benchmark::State& state) {
  LayerScope engine(Layer::kParallel, "engine", EntryKind::kNonBlocking, nullptr, __func__);
  int counter = 0;
  for (auto _ : state) {
    Status s = Entry(&counter);
    benchmark::DoNotOptimize(s);
  }
  if (BoundaryMonitor::Global().count(ViolationKind::kUpwardCall) != 0) {
    state.SkipWithError("a violation was recorded: the benchmark is not measuring the hot path");
  }
}

void BM_Baseline(benchmark::State& state) { RunFromParallelLayer<PlainEntry>(state); }
void BM_Guarded(benchmark::State& state) { RunFromParallelLayer<GuardedEntry>(state); }
void BM_GuardedBlocking(benchmark::State& state) {
  RunFromParallelLayer<GuardedBlockingEntry>(state);
}

BENCHMARK(BM_Baseline);
BENCHMARK(BM_Guarded);
BENCHMARK(BM_GuardedBlocking);

}  // namespace
}  // namespace kc

BENCHMARK_MAIN();
