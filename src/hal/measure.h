// Measures how fast this host moves bytes: a STREAM-style memory copy, and a
// process-to-process copy through shared memory (what `kc topo probe` writes into the
// topology for CPU slices). Protocol and counting conventions: docs/design/measurement.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "hal/compute.h"
#include "hal/cpu_devices.h"
#include "hal/host_probe.h"

namespace kc::hal {

// Progress of a measurement for the CLI: `fraction` rises from 0 to 1 (reached on success),
// `what` names the phase ("shm bandwidth", "shm latency", ...). Called on the caller's
// thread, never concurrently; it must not call back into the measurement.
using ProgressFn = std::function<void(double fraction, std::string_view what)>;

inline constexpr int64_t kMiB = int64_t{1} << 20;

struct ShmOptions {
  // Bytes delivered in the timed passes; rounded up to whole messages.
  int64_t total_bytes = 1024 * kMiB;
  // One pass: the sender's private source buffer to the receiver's private destination.
  // Compare with a STREAM copy of arrays of this size (docs/design/measurement.md).
  int64_t message_bytes = 128 * kMiB;
  // The ring between them: `slots` slots of `chunk_bytes` in the shared mapping.
  int64_t chunk_bytes = 256 * 1024;
  int slots = 8;
  // CPUs each process is pinned to (OS indices); empty: left where the OS puts it.
  std::vector<int> sender_cpus;
  std::vector<int> receiver_cpus;
  // 8-byte ping-pongs timed for the latency.
  int latency_round_trips = 10000;
  // For the whole measurement; past it both processes are killed.
  Duration timeout = std::chrono::seconds(60);
  ProgressFn progress;  // may be empty
  // Fault injection for tests: the receiving process stops answering after it starts.
  bool stall_receiver_for_test = false;
};

struct ShmMeasurement {
  // Bytes delivered per second in the best timed pass (one message), as STREAM keeps its
  // best pass; mean_bandwidth is over all timed passes.
  double bandwidth = 0;
  double mean_bandwidth = 0;
  double latency = 0;           // seconds one way: median round trip / 2, 8-byte message
  int64_t bytes_delivered = 0;  // in the timed passes
  double seconds = 0;           // the timed passes took
};

// Forks a sender and a receiver process, each pinned to its CPUs, joined by an anonymous
// shared mapping holding a ring of chunk slots; measures the bytes per second the sender's
// buffer reaches the receiver's (each byte counted once: bytes delivered), then the
// one-way latency of an 8-byte message, then sends a fresh pattern once more and checks the
// receiver's checksum of it. Blocks for the measurement, up to options.timeout.
// Returns kInvalidArgument for bad sizes or a CPU this process may not use,
// kDeadlineExceeded when the timeout passes (the children are killed), kDataLoss when the
// checksum differs, kResourceExhausted when memory or processes cannot be had, kInternal
// when a child dies. Both children are always reaped before it returns. Real time only:
// the waits are kernel timeouts across processes, so no Clock is injected.
Result<ShmMeasurement> MeasureSharedMemory(const ShmOptions& options);

struct StreamOptions {
  int64_t array_bytes = 128 * kMiB;  // each of the two arrays; make it much larger than caches
  int threads = 1;                   // each copies its own contiguous part
  int passes = 8;                    // the best is kept
  std::vector<int> cpus;             // thread i pinned to cpus[i % size]; empty: not pinned
};

struct StreamMeasurement {
  // Array bytes copied per second (a[i] = b[i] over the whole array, best pass): the same
  // "bytes delivered" convention as ShmMeasurement::bandwidth.
  double copy_bytes_per_second = 0;
  // What STREAM itself reports for Copy: bytes read plus bytes written per second.
  double stream_bytes_per_second() const { return 2 * copy_bytes_per_second; }
};

// A STREAM-style copy a[i] = b[i] (memcpy per thread) over two arrays, in this process.
// kInvalidArgument for sizes or counts < 1 or a CPU this process may not use;
// kResourceExhausted when the arrays cannot be allocated. Blocks for passes full copies.
Result<StreamMeasurement> MeasureStreamCopy(const StreamOptions& options);

}  // namespace kc::hal

namespace kc::hal {

struct SgemmRateOptions {
  int64_t n = 512;      // square matrices n x n
  int threads = 1;      // BLAS threads (process-wide in OpenBLAS)
  int repetitions = 8;  // the best is kept
};

// The fp32 matrix-multiply rate one CPU slice of `threads` cores reaches through the device
// kernels (hal/kernels.h): 2n^3 FLOP per call over the best wall time. This is what a CPU
// device's peak_flops_fp32 is set from. Takes well under a second for n = 512.
Result<double> MeasureSgemmFlops(const SgemmRateOptions& options);

struct GemmRateOptions {
  DataType type = DataType::kF32;  // of A, B and C: kF32 or kBf16
  int64_t n = 8192;                // square matrices n x n
  int repetitions = 20;            // products timed back to back, after one warm-up
};

// The matrix-multiply rate `device` reaches through hal::Gemm (fp32 accumulation): 2n^3 FLOP
// per product over the mean wall time of `repetitions` products enqueued back to back. The
// operands are pseudo-random (never zeros, which some devices multiply faster). What MFU on a
// GPU is measured against; n = 8192 in bf16 takes a few tens of milliseconds on an H100.
// kUnimplemented where the device has no such product (bf16 on CPU).
Result<double> MeasureGemmFlops(ComputeDevice& device, const GemmRateOptions& options);

// What `kc topo probe` and `kc plan --calibrate` measure on this host: a one-core STREAM
// copy, the one-core sgemm rate and, when the process may use two or more cores, a
// shared-memory copy between the first two.
struct HostMeasureOptions {
  bool quick = false;   // smaller arrays and fewer passes: about 1 s, less accurate
  ProgressFn progress;  // may be empty; fraction over the whole measurement
};

struct HostMeasurement {
  StreamMeasurement stream;
  double sgemm_flops_per_core = 0;
  std::optional<ShmMeasurement> shm;  // empty with one core
  CpuMeasurements cpu;                // the above in the form MakeCpuDevices takes
};

// Runs the three measurements on the cores of `info` (the caller's cpuset). Errors as the
// measurement that failed, its name prefixed ("stream copy: ...", "sgemm: ...",
// "shared memory: ...").
Result<HostMeasurement> MeasureHost(const HostInfo& info, const HostMeasureOptions& options);

}  // namespace kc::hal
