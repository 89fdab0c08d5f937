// Kernel throughput on a CPU device: OpenBLAS sgemm FLOP/s at a few square sizes with 1 and
// 2 threads, and the fp32 / bf16 reduce-into kernels against a plain memcpy of the same
// buffer size, measured in the same run.
//
//   kc_kernels_bench --benchmark_counters_tabular=true
//
// Counters: FLOP/s = 2 M N K per call; bytes_per_second = the dst buffer's size per call (so
// reduce and memcpy compare on the same payload); traffic = bytes moved through memory (a
// reduce reads two buffers and writes one, a memcpy reads one and writes one).
#include <benchmark/benchmark.h>
#include <sched.h>

#include <cstring>
#include <vector>

#include "base/check.h"
#include "hal/compute.h"
#include "hal/host_probe.h"
#include "hal/kernels.h"

namespace kc::hal {
namespace {

std::unique_ptr<ComputeDevice> OpenCpu(int threads) {
  cpu_set_t set;
  CPU_ZERO(&set);
  KC_CHECK(sched_getaffinity(0, sizeof(set), &set) == 0);
  DeviceDescriptor d;
  d.id = "bench/cpu0";
  d.kind = DeviceKind::kCpu;
  Result<HostInfo> host = ProbeHost();
  if (host.ok() && !host->numa_nodes.empty()) d.numa_node = host->numa_nodes[0].os_index;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &set)) d.cpus.push_back(i);
  }
  Result<std::unique_ptr<ComputeDevice>> device = OpenComputeDevice(d, {.threads = threads});
  KC_CHECK(device.ok()) << device.status();
  return std::move(device).value();
}

DeviceBuffer Alloc(ComputeDevice& device, size_t bytes) {
  Result<DeviceBuffer> buffer = device.Allocate(bytes);
  KC_CHECK(buffer.ok()) << buffer.status();
  return std::move(buffer).value();
}

// Args: n (square size), threads.
void BM_Sgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  auto device = OpenCpu(threads);
  Stream& stream = device->default_stream();
  const size_t elements = static_cast<size_t>(n * n);
  DeviceBuffer a = Alloc(*device, elements * sizeof(float));
  DeviceBuffer b = Alloc(*device, elements * sizeof(float));
  DeviceBuffer c = Alloc(*device, elements * sizeof(float));
  KC_CHECK(Fill(stream, a.As<float>(), 0.5f).ok());
  KC_CHECK(Fill(stream, b.As<float>(), 0.25f).ok());
  KC_CHECK(Fill(stream, c.As<float>(), 0.0f).ok());
  const SgemmOptions options{
      .m = n, .n = n, .k = n, .a = a.As<float>(), .b = b.As<float>(), .c = c.As<float>()};
  for (auto _ : state) {
    KC_CHECK(Sgemm(stream, options).ok());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(n * n * n) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}
BENCHMARK(BM_Sgemm)
    ->ArgNames({"n", "threads"})
    ->ArgsProduct({{256, 512, 1024}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void SetByteCounters(benchmark::State& state, size_t bytes, int buffers_touched) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  state.counters["traffic"] = benchmark::Counter(
      static_cast<double>(bytes) * buffers_touched * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

// Arg: dst size in bytes.
template <typename T>
void BM_ReduceSum(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  auto device = OpenCpu(1);
  Stream& stream = device->default_stream();
  DeviceBuffer dst = Alloc(*device, bytes);
  DeviceBuffer src = Alloc(*device, bytes);
  if constexpr (std::is_same_v<T, Bf16>) {
    KC_CHECK(Fill(stream, dst.As<T>(), FloatToBf16(0.0f)).ok());
    KC_CHECK(Fill(stream, src.As<T>(), FloatToBf16(1.0f)).ok());
  } else {
    KC_CHECK(Fill(stream, dst.As<T>(), T(0)).ok());
    KC_CHECK(Fill(stream, src.As<T>(), T(1)).ok());
  }
  for (auto _ : state) {
    KC_CHECK(ReduceInto(stream, dst.As<T>(), src.As<T>(), ReduceOp::kSum).ok());
    benchmark::ClobberMemory();
  }
  SetByteCounters(state, bytes, 3);
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  auto device = OpenCpu(1);
  DeviceBuffer dst = Alloc(*device, bytes);
  DeviceBuffer src = Alloc(*device, bytes);
  std::memset(src.data(), 1, bytes);
  std::memset(dst.data(), 0, bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  SetByteCounters(state, bytes, 2);
}

void BM_ConvertF32ToBf16(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));  // of the fp32 source
  auto device = OpenCpu(1);
  Stream& stream = device->default_stream();
  DeviceBuffer src = Alloc(*device, bytes);
  DeviceBuffer dst = Alloc(*device, bytes / 2);
  KC_CHECK(Fill(stream, src.As<float>(), 1.5f).ok());
  for (auto _ : state) {
    KC_CHECK(ConvertF32ToBf16(stream, dst.As<Bf16>(), src.As<float>()).ok());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

// 256 KiB sits in L2, 4 MiB around the L3 slice, 64 MiB in DRAM.
#define KC_BYTE_SIZES ->Arg(256 << 10)->Arg(4 << 20)->Arg(64 << 20)
BENCHMARK(BM_Memcpy) KC_BYTE_SIZES;
BENCHMARK(BM_ReduceSum<float>) KC_BYTE_SIZES;
BENCHMARK(BM_ReduceSum<Bf16>) KC_BYTE_SIZES;
BENCHMARK(BM_ConvertF32ToBf16) KC_BYTE_SIZES;
#undef KC_BYTE_SIZES

}  // namespace
}  // namespace kc::hal

BENCHMARK_MAIN();
