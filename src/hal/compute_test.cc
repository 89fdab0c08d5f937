#include "hal/compute.h"

#include <cblas.h>
#include <gtest/gtest.h>
#include <hwloc.h>
#include <sched.h>

#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "hal/host_probe.h"

namespace kc::hal {
namespace {

using std::chrono_literals::operator""s;

// The cpus this process may use: the slice a test device covers.
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  KC_CHECK(sched_getaffinity(0, sizeof(set), &set) == 0);
  std::vector<int> cpus;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &set)) cpus.push_back(i);
  }
  return cpus;
}

DeviceDescriptor TestCpu(int index = 0) {
  DeviceDescriptor d;
  d.id = "test/cpu" + std::to_string(index);
  d.kind = DeviceKind::kCpu;
  d.host = "test";
  d.index_on_host = index;
  d.cpus = AllowedCpus();
  Result<HostInfo> host = ProbeHost();
  if (host.ok() && !host->numa_nodes.empty()) d.numa_node = host->numa_nodes[0].os_index;
  return d;
}

std::unique_ptr<ComputeDevice> Open(const DeviceDescriptor& d, ComputeDeviceOptions o = {}) {
  Result<std::unique_ptr<ComputeDevice>> device = OpenComputeDevice(d, o);
  KC_CHECK(device.ok()) << device.status();
  return std::move(device).value();
}

TEST(CpuDeviceTest, OpensASliceWithOneBlasThreadPerCpu) {
  const DeviceDescriptor d = TestCpu();
  auto device = Open(d);
  EXPECT_EQ(device->descriptor().id, d.id);
  EXPECT_EQ(device->id(), (DeviceId{DeviceKind::kCpu, 0}));
  EXPECT_TRUE(device->id().host_accessible());
  EXPECT_EQ(device->threads(), static_cast<int>(d.cpus.size()));
  EXPECT_EQ(openblas_get_num_threads(), device->threads());
  EXPECT_EQ(&device->default_stream().device(), device.get());
}

TEST(CpuDeviceTest, ThreadsOptionSetsOpenBlasThreads) {
  auto one = Open(TestCpu(), {.threads = 1});
  EXPECT_EQ(one->threads(), 1);
  EXPECT_EQ(openblas_get_num_threads(), 1);
  // Process-wide: the device opened last decides.
  auto two = Open(TestCpu(), {.threads = 2});
  EXPECT_EQ(openblas_get_num_threads(), 2);
}

TEST(CpuDeviceTest, RefusesCpusThisProcessMayNotUse) {
  DeviceDescriptor d = TestCpu();
  d.cpus = {CPU_SETSIZE + 5};
  EXPECT_EQ(OpenComputeDevice(d).status().code(), ErrorCode::kInvalidArgument);
  d.cpus = {-1};
  EXPECT_EQ(OpenComputeDevice(d).status().code(), ErrorCode::kInvalidArgument);
}

TEST(CpuDeviceTest, RefusesANumaNodeNotOnThisHost) {
  DeviceDescriptor d = TestCpu();
  d.numa_node = 4000;
  EXPECT_EQ(OpenComputeDevice(d).status().code(), ErrorCode::kInvalidArgument);
}

TEST(CpuDeviceTest, RefusesNegativeThreads) {
  EXPECT_EQ(OpenComputeDevice(TestCpu(), {.threads = -1}).status().code(),
            ErrorCode::kInvalidArgument);
}

TEST(CpuDeviceTest, AMissingCudaDeviceIsNotFoundAndSimulatedRunsNothing) {
  DeviceDescriptor d = TestCpu();
  d.kind = DeviceKind::kCuda;
  d.index_on_host = 4096;  // no host has this GPU, and one without a driver has none at all
  EXPECT_EQ(OpenComputeDevice(d).status().code(), ErrorCode::kNotFound);
  d.kind = DeviceKind::kSimulated;
  EXPECT_EQ(OpenComputeDevice(d).status().code(), ErrorCode::kInvalidArgument);
}

TEST(CpuDeviceTest, BindCallingThreadPinsItToTheSlice) {
  DeviceDescriptor d = TestCpu();
  const int first = d.cpus.front();
  d.cpus = {first};
  auto device = Open(d);
  cpu_set_t after;
  Status bound;
  std::thread t([&] {
    bound = device->BindCallingThread();
    CPU_ZERO(&after);
    KC_CHECK(sched_getaffinity(0, sizeof(after), &after) == 0);
  });
  t.join();
  ASSERT_TRUE(bound.ok()) << bound;
  EXPECT_EQ(CPU_COUNT(&after), 1);
  EXPECT_TRUE(CPU_ISSET(first, &after));
}

TEST(CpuDeviceTest, BindingASliceWithoutCpusChangesNothing) {
  DeviceDescriptor d = TestCpu();
  d.cpus.clear();
  auto device = Open(d);
  EXPECT_TRUE(device->BindCallingThread().ok());
}

TEST(CpuDeviceTest, StreamsAreCountedAndSynchronizeReturnsAtOnce) {
  auto device = Open(TestCpu());
  EXPECT_EQ(device->live_streams(), 1);  // the default stream
  {
    Result<std::unique_ptr<Stream>> s = device->CreateStream();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(device->live_streams(), 2);
    EXPECT_EQ(&(*s)->device(), device.get());
    EXPECT_TRUE(Synchronize(**s, 1s).ok());
  }
  EXPECT_EQ(device->live_streams(), 1);
  EXPECT_TRUE(Synchronize(device->default_stream(), 0s).ok());
}

TEST(MemoryTest, AllocationsAre64ByteAlignedUsableAndPlacedOnTheNode) {
  const DeviceDescriptor d = TestCpu();
  auto device = Open(d);
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{4097}, size_t{1} << 20}) {
    SCOPED_TRACE(bytes);
    Result<DeviceBuffer> buffer = device->Allocate(bytes);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    ASSERT_NE(buffer->data(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % 64, 0u);
    EXPECT_EQ(buffer->size_bytes(), bytes);
    EXPECT_EQ(buffer->device(), device.get());
    std::span<std::byte> host = AsHostSpan(buffer->bytes());
    for (size_t i = 0; i < bytes; ++i) host[i] = std::byte(i * 7);
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(host[i], std::byte(i * 7));
    if (buffer->numa_bound()) {
      // The pages' policy names exactly the descriptor's node.
      hwloc_topology_t topo;
      ASSERT_EQ(hwloc_topology_init(&topo), 0);
      ASSERT_EQ(hwloc_topology_load(topo), 0);
      hwloc_bitmap_t nodes = hwloc_bitmap_alloc();
      hwloc_membind_policy_t policy;
      ASSERT_EQ(hwloc_get_area_membind(topo, buffer->data(), bytes, nodes, &policy,
                                       HWLOC_MEMBIND_BYNODESET),
                0);
      EXPECT_EQ(policy, HWLOC_MEMBIND_BIND);
      EXPECT_EQ(hwloc_bitmap_weight(nodes), 1);
      EXPECT_TRUE(hwloc_bitmap_isset(nodes, static_cast<unsigned>(d.numa_node)));
      hwloc_bitmap_free(nodes);
      hwloc_topology_destroy(topo);
    }
  }
  EXPECT_EQ(device->live_buffers(), 0);
}

TEST(MemoryTest, HonoursAlignmentsBeyondTheDefault) {
  auto device = Open(TestCpu());
  for (size_t alignment : {size_t{1}, size_t{16}, size_t{4096}, size_t{1} << 16}) {
    SCOPED_TRACE(alignment);
    Result<DeviceBuffer> buffer = device->Allocate(100, alignment);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % alignment, 0u);
  }
}

TEST(MemoryTest, WithoutANumaNodeAllocatesFromTheHeap) {
  DeviceDescriptor d = TestCpu();
  d.numa_node = -1;
  auto device = Open(d);
  Result<DeviceBuffer> buffer = device->Allocate(1000);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_FALSE(buffer->numa_bound());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % 64, 0u);
}

TEST(MemoryTest, ZeroBytesGivesAnEmptyBuffer) {
  auto device = Open(TestCpu());
  Result<DeviceBuffer> buffer = device->Allocate(0);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->size_bytes(), 0u);
  EXPECT_TRUE(buffer->As<float>().empty());
}

TEST(MemoryTest, RefusesAlignmentsThatAreNotPowersOfTwo) {
  auto device = Open(TestCpu());
  for (size_t alignment : {size_t{0}, size_t{3}, size_t{48}}) {
    EXPECT_EQ(device->Allocate(64, alignment).status().code(), ErrorCode::kInvalidArgument)
        << alignment;
  }
}

TEST(MemoryTest, ImpossibleSizeIsResourceExhausted) {
  auto device = Open(TestCpu());
  EXPECT_EQ(device->Allocate(size_t{1} << 62).status().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(device->Allocate(SIZE_MAX).status().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(device->live_buffers(), 0);
  // The heap path too.
  DeviceDescriptor unbound = TestCpu();
  unbound.numa_node = -1;
  auto heap = Open(unbound);
  EXPECT_EQ(heap->Allocate(size_t{1} << 62).status().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(heap->Allocate(SIZE_MAX - 8, 4096).status().code(), ErrorCode::kResourceExhausted);
}

TEST(MemoryTest, BuffersMoveAndFreeExactlyOnce) {
  auto device = Open(TestCpu());
  Result<DeviceBuffer> a = device->Allocate(256);
  ASSERT_TRUE(a.ok());
  void* const data = a->data();
  DeviceBuffer b = std::move(a).value();
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(device->live_buffers(), 1);
  DeviceBuffer c;
  c = std::move(b);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(b.device(), nullptr);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(device->live_buffers(), 1);
  c.Reset();
  EXPECT_EQ(device->live_buffers(), 0);
  EXPECT_EQ(c.data(), nullptr);
}

TEST(MemoryDeathTest, DestroyingTheDeviceBeforeItsBuffersIsABug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenBLAS has started threads
  EXPECT_DEATH(
      {
        auto device = Open(TestCpu());
        Result<DeviceBuffer> buffer = device->Allocate(64);
        KC_CHECK(buffer.ok());
        device.reset();
      },
      "still live");
}

TEST(MemoryTest, TypedViewsCoverWholeElementsOnTheDevice) {
  auto device = Open(TestCpu());
  Result<DeviceBuffer> buffer = device->Allocate(20);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ(buffer->As<float>().size(), 5u);
  EXPECT_EQ(buffer->As<double>().size(), 2u);
  EXPECT_EQ(buffer->As<Bf16>().size(), 10u);
  EXPECT_EQ(buffer->As<float>().device(), device->id());
  DeviceSpan<const float> view = buffer->As<float>().subspan(1, 3);
  EXPECT_EQ(view.size(), 3u);
  EXPECT_EQ(view.data(), static_cast<const float*>(buffer->data()) + 1);
  EXPECT_EQ(AsBytes(view).size(), 12u);
}

class MemoryCopyTest : public ::testing::Test {
 protected:
  void SetUp() override { device_ = Open(TestCpu()); }
  Stream& stream() { return device_->default_stream(); }
  DeviceBuffer Alloc(size_t bytes) { return std::move(device_->Allocate(bytes)).value(); }
  std::unique_ptr<ComputeDevice> device_;
};

TEST_F(MemoryCopyTest, HostToDeviceToDeviceToHostRoundTrips) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{13}, size_t{100003}}) {
    SCOPED_TRACE(n);
    std::vector<float> host(n);
    std::iota(host.begin(), host.end(), 0.5f);
    DeviceBuffer a = Alloc(n * sizeof(float));
    DeviceBuffer b = Alloc(n * sizeof(float));
    ASSERT_TRUE(CopyHostToDevice(stream(), a.As<float>(), std::span<const float>(host)).ok());
    ASSERT_TRUE(CopyDeviceToDevice(stream(), b.As<float>(), a.As<float>()).ok());
    std::vector<float> back(n, -1.0f);
    ASSERT_TRUE(CopyDeviceToHost(stream(), std::span<float>(back), b.As<float>()).ok());
    ASSERT_TRUE(Synchronize(stream(), 10s).ok());
    EXPECT_EQ(back, host);
  }
}

TEST_F(MemoryCopyTest, RefusesMismatchedSizesNullsOverlapsAndOtherDevices) {
  DeviceBuffer a = Alloc(64 * sizeof(float));
  DeviceSpan<float> d = a.As<float>();
  std::vector<float> host(64, 1.0f);
  const std::span<const float> h(host);
  EXPECT_EQ(CopyHostToDevice(stream(), d.first(63), h).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(CopyHostToDevice(stream(), DeviceSpan<float>(nullptr, 64, device_->id()), h).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(
      CopyHostToDevice(stream(), d, std::span<const float>(static_cast<const float*>(nullptr), 64))
          .code(),
      ErrorCode::kInvalidArgument);
  EXPECT_EQ(CopyDeviceToDevice(stream(), d.subspan(0, 32), d.subspan(16, 32)).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(CopyDeviceToDevice(stream(), d.subspan(0, 32), d.subspan(0, 32)).code(),
            ErrorCode::kInvalidArgument);
  const DeviceSpan<float> elsewhere(d.data(), d.size(), DeviceId{DeviceKind::kCpu, 7});
  EXPECT_EQ(CopyHostToDevice(stream(), elsewhere, h).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(CopyDeviceToHost(stream(), std::span<float>(host), elsewhere).code(),
            ErrorCode::kInvalidArgument);
  // Disjoint halves of one buffer are fine.
  EXPECT_TRUE(CopyDeviceToDevice(stream(), d.subspan(0, 32), d.subspan(32, 32)).ok());
}

TEST_F(MemoryCopyTest, CopiesBetweenTwoCpuDevicesOnEitherStream) {
  auto other = Open(TestCpu(1));
  DeviceBuffer mine = Alloc(8 * sizeof(int64_t));
  DeviceBuffer theirs = std::move(other->Allocate(8 * sizeof(int64_t))).value();
  std::vector<int64_t> host = {1, -2, 3, -4, 5, -6, 7, INT64_MIN};
  ASSERT_TRUE(CopyHostToDevice(stream(), mine.As<int64_t>(), std::span<const int64_t>(host)).ok());
  ASSERT_TRUE(
      CopyDeviceToDevice(other->default_stream(), theirs.As<int64_t>(), mine.As<int64_t>()).ok());
  std::vector<int64_t> back(8);
  ASSERT_TRUE(
      CopyDeviceToHost(other->default_stream(), std::span<int64_t>(back), theirs.As<int64_t>())
          .ok());
  EXPECT_EQ(back, host);
  // A third device's stream may not copy between the two.
  auto third = Open(TestCpu(2));
  EXPECT_EQ(
      CopyDeviceToDevice(third->default_stream(), theirs.As<int64_t>(), mine.As<int64_t>()).code(),
      ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kc::hal
