#include "hal/measure.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>

#include <cmath>
#include <string>
#include <vector>

namespace kc::hal {
namespace {

// No child of this process is left, running or as a zombie.
void ExpectNoChildren() {
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

// The first two CPUs this process may use (one when it may use only one).
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

ShmOptions SmallShm() {
  std::vector<int> cpus = AllowedCpus();
  return ShmOptions{.total_bytes = 8 * kMiB,
                    .message_bytes = 2 * kMiB,
                    .chunk_bytes = 256 * 1024,
                    .slots = 4,
                    .sender_cpus = {cpus.front()},
                    .receiver_cpus = {cpus.back()},
                    .latency_round_trips = 200,
                    .timeout = std::chrono::seconds(60),
                    .progress = {},
                    .stall_receiver_for_test = false};
}

TEST(MeasureShmTest, DeliversVerifiedBytesWithPositiveBandwidthAndLatency) {
  Result<ShmMeasurement> m = MeasureSharedMemory(SmallShm());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->bytes_delivered, 8 * kMiB);
  EXPECT_GT(m->bandwidth, 0);
  EXPECT_TRUE(std::isfinite(m->bandwidth));
  EXPECT_GT(m->seconds, 0);
  EXPECT_GT(m->latency, 0);
  EXPECT_TRUE(std::isfinite(m->latency));
  ExpectNoChildren();
}

TEST(MeasureShmTest, UnpinnedWithUnevenChunksAndOneSlotStillVerifies) {
  // A message that is not a whole number of chunks, a total that is not a whole number of
  // messages, a single slot (no pipelining): the protocol's edge cases.
  ShmOptions o = SmallShm();
  o.sender_cpus.clear();
  o.receiver_cpus.clear();
  o.total_bytes = 3 * kMiB + 8;
  o.message_bytes = kMiB + 24;
  o.chunk_bytes = 100'000;
  o.slots = 1;
  Result<ShmMeasurement> m = MeasureSharedMemory(o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->bytes_delivered, 3 * (kMiB + 24));
  ExpectNoChildren();
}

TEST(MeasureShmTest, ProgressRisesToOne) {
  ShmOptions o = SmallShm();
  std::vector<double> seen;
  o.progress = [&seen](double fraction, std::string_view what) {
    EXPECT_FALSE(what.empty());
    seen.push_back(fraction);
  };
  Result<ShmMeasurement> m = MeasureSharedMemory(o);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_FALSE(seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i], seen[i - 1]);
  EXPECT_EQ(seen.front(), 0.0);
  EXPECT_EQ(seen.back(), 1.0);
}

TEST(MeasureShmTest, AStalledReceiverHitsTheDeadlineAndIsReaped) {
  ShmOptions o = SmallShm();
  o.stall_receiver_for_test = true;
  o.timeout = std::chrono::milliseconds(200);
  bool finished = false;
  o.progress = [&finished](double fraction, std::string_view) { finished = fraction == 1.0; };
  Result<ShmMeasurement> m = MeasureSharedMemory(o);
  EXPECT_EQ(m.status().code(), ErrorCode::kDeadlineExceeded) << m.status();
  EXPECT_FALSE(finished);
  ExpectNoChildren();
}

TEST(MeasureShmTest, ACpuThisProcessMayNotUseIsAnInvalidArgument) {
  ShmOptions o = SmallShm();
  o.receiver_cpus = {CPU_SETSIZE + 1};
  EXPECT_EQ(MeasureSharedMemory(o).status().code(), ErrorCode::kInvalidArgument);
  o.receiver_cpus = {-1};
  EXPECT_EQ(MeasureSharedMemory(o).status().code(), ErrorCode::kInvalidArgument);
  ExpectNoChildren();
}

TEST(MeasureShmTest, BadSizesAreInvalidArguments) {
  ShmOptions o = SmallShm();
  o.message_bytes = 12;  // not a multiple of 8
  EXPECT_EQ(MeasureSharedMemory(o).status().code(), ErrorCode::kInvalidArgument);
  o = SmallShm();
  o.chunk_bytes = 0;
  EXPECT_EQ(MeasureSharedMemory(o).status().code(), ErrorCode::kInvalidArgument);
  o = SmallShm();
  o.slots = 0;
  EXPECT_EQ(MeasureSharedMemory(o).status().code(), ErrorCode::kInvalidArgument);
  o = SmallShm();
  o.latency_round_trips = 0;
  EXPECT_EQ(MeasureSharedMemory(o).status().code(), ErrorCode::kInvalidArgument);
  o = SmallShm();
  o.timeout = Duration::zero();
  EXPECT_EQ(MeasureSharedMemory(o).status().code(), ErrorCode::kInvalidArgument);
}

TEST(MeasureStreamTest, CopiesAtAPositiveRate) {
  Result<StreamMeasurement> m =
      MeasureStreamCopy({.array_bytes = 4 * kMiB, .threads = 1, .passes = 2, .cpus = {}});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(m->copy_bytes_per_second, 0);
  EXPECT_TRUE(std::isfinite(m->copy_bytes_per_second));
  EXPECT_DOUBLE_EQ(m->stream_bytes_per_second(), 2 * m->copy_bytes_per_second);
}

TEST(MeasureStreamTest, SplitsUnevenArraysOverPinnedThreads) {
  Result<StreamMeasurement> m = MeasureStreamCopy(
      {.array_bytes = 3 * kMiB + 5, .threads = 3, .passes = 2, .cpus = AllowedCpus()});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(m->copy_bytes_per_second, 0);
}

TEST(MeasureStreamTest, BadArgumentsAreInvalidArguments) {
  EXPECT_EQ(
      MeasureStreamCopy({.array_bytes = 0, .threads = 1, .passes = 1, .cpus = {}}).status().code(),
      ErrorCode::kInvalidArgument);
  EXPECT_EQ(MeasureStreamCopy({.array_bytes = kMiB, .threads = 0, .passes = 1, .cpus = {}})
                .status()
                .code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(MeasureStreamCopy({.array_bytes = kMiB, .threads = 1, .passes = 0, .cpus = {}})
                .status()
                .code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(MeasureStreamCopy({.array_bytes = kMiB, .threads = 1, .passes = 1, .cpus = {-1}})
                .status()
                .code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kc::hal

namespace kc::hal {
namespace {

TEST(MeasureSgemmTest, ReportsAPositiveFiniteRate) {
  Result<double> flops = MeasureSgemmFlops({.n = 64, .threads = 1, .repetitions = 2});
  ASSERT_TRUE(flops.ok()) << flops.status();
  EXPECT_GT(*flops, 0);
  EXPECT_TRUE(std::isfinite(*flops));
}

TEST(MeasureSgemmTest, RejectsNonPositiveSizes) {
  EXPECT_EQ(MeasureSgemmFlops({.n = 0}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(MeasureSgemmFlops({.threads = 0}).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kc::hal
