// The figure: process-to-process shared-memory bandwidth against a STREAM-style copy
// measured in the same run, plus the shared-memory latency. Prints a table.
//
//   kc_shm_bandwidth_bench [--size_mib=128] [--passes=8] [--chunk_kib=256] [--slots=8]
//                          [--round_trips=20000] [--smoke]
//
// Like with like (docs/design/measurement.md): the STREAM copy's arrays and the shared-memory
// messages have the same size, both keep their best of the same number of passes, both count
// bytes delivered (copied) per second. The reference is one thread copying on the sender's
// CPU: in the pipeline every byte is copied once by each of the two processes, concurrently,
// so its ideal is one copy's rate. A copy by two threads (printed for context) splits the
// bytes between the cores instead, so its ideal is twice that.
#include <sched.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "hal/measure.h"
#include "hal/probe_server.h"

namespace {

struct Flags {
  int64_t size_mib = 128;  // each STREAM array, and each shared-memory message
  int passes = 8;
  int64_t chunk_kib = 256;
  int slots = 8;
  int round_trips = 20000;
};

template <typename T>
bool ParseFlag(std::string_view arg, std::string_view name, T* out) {
  if (!arg.starts_with(name) || arg.size() <= name.size() || arg[name.size()] != '=') return false;
  std::string_view v = arg.substr(name.size() + 1);
  return std::from_chars(v.data(), v.data() + v.size(), *out).ec == std::errc();
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

}  // namespace

int main(int argc, char** argv) {
  using kc::hal::kMiB;
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--smoke") {
      f = {.size_mib = 2, .passes = 2, .chunk_kib = 256, .slots = 4, .round_trips = 100};
    } else if (!(ParseFlag(a, "--size_mib", &f.size_mib) || ParseFlag(a, "--passes", &f.passes) ||
                 ParseFlag(a, "--chunk_kib", &f.chunk_kib) || ParseFlag(a, "--slots", &f.slots) ||
                 ParseFlag(a, "--round_trips", &f.round_trips))) {
      std::fprintf(stderr, "unknown or malformed flag: %s\n", argv[i]);
      return 2;
    }
  }
  const std::vector<int> cpus = AllowedCpus();
  if (cpus.empty()) {
    std::fprintf(stderr, "sched_getaffinity failed\n");
    return 1;
  }
  const int sender_cpu = cpus.front();
  const int receiver_cpu = cpus.size() > 1 ? cpus[1] : cpus.front();

  std::vector<int> pair_cpus = {sender_cpu};
  if (receiver_cpu != sender_cpu) pair_cpus.push_back(receiver_cpu);
  auto stream1 = kc::hal::MeasureStreamCopy(
      {.array_bytes = f.size_mib * kMiB, .threads = 1, .passes = f.passes, .cpus = {sender_cpu}});
  auto stream_pair = kc::hal::MeasureStreamCopy({.array_bytes = f.size_mib * kMiB,
                                                 .threads = static_cast<int>(pair_cpus.size()),
                                                 .passes = f.passes,
                                                 .cpus = pair_cpus});
  auto shm = kc::hal::MeasureSharedMemory({.total_bytes = f.passes * f.size_mib * kMiB,
                                           .message_bytes = f.size_mib * kMiB,
                                           .chunk_bytes = f.chunk_kib * 1024,
                                           .slots = f.slots,
                                           .sender_cpus = {sender_cpu},
                                           .receiver_cpus = {receiver_cpu},
                                           .latency_round_trips = f.round_trips,
                                           .timeout = std::chrono::seconds(120),
                                           .progress = {},
                                           .stall_receiver_for_test = false});
  for (const kc::Status& s : {stream1.status(), stream_pair.status(), shm.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "measurement failed: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const double gb = 1e9;
  std::string pair = "cpu" + std::to_string(sender_cpu);
  if (receiver_cpu != sender_cpu) pair += "+cpu" + std::to_string(receiver_cpu);
  std::printf("%-46s %8.2f GB/s  (STREAM Copy %.2f)\n",
              ("stream copy, 1 thread, cpu" + std::to_string(sender_cpu)).c_str(),
              stream1->copy_bytes_per_second / gb, stream1->stream_bytes_per_second() / gb);
  std::printf("%-46s %8.2f GB/s  (STREAM Copy %.2f)\n",
              ("stream copy, " + std::to_string(pair_cpus.size()) + " threads, " + pair).c_str(),
              stream_pair->copy_bytes_per_second / gb, stream_pair->stream_bytes_per_second() / gb);
  std::printf("%-46s %8.2f GB/s  (mean %.2f; cpu%d -> cpu%d, %lld MiB)\n",
              "shm process-to-process, best pass", shm->bandwidth / gb, shm->mean_bandwidth / gb,
              sender_cpu, receiver_cpu, static_cast<long long>(shm->bytes_delivered / kMiB));
  std::printf("%-46s %8.2f   (the issue's figure, target >= 0.70)\n",
              "ratio shm / stream copy 1 thread", shm->bandwidth / stream1->copy_bytes_per_second);
  std::printf("%-46s %8.2f   (context: twice the copying cores)\n",
              ("ratio shm / stream copy " + pair).c_str(),
              shm->bandwidth / stream_pair->copy_bytes_per_second);
  std::printf("%-46s %8.3f us\n", "shm latency, one way (median)", shm->latency * 1e6);

  // For scale: the TCP probe over loopback, server and client in this process.
  auto server = kc::hal::ProbeServer::Start({.bind_address = "127.0.0.1",
                                             .port = 0,
                                             .idle_timeout = std::chrono::seconds(60),
                                             .max_connections = 4});
  if (!server.ok()) {
    std::fprintf(stderr, "probe server failed: %s\n", server.status().ToString().c_str());
    return 1;
  }
  auto tcp = kc::hal::MeasureTcpPeer("127.0.0.1", (*server)->port(),
                                     {.bandwidth_bytes = f.passes * f.size_mib * kMiB,
                                      .round_trips = f.round_trips / 10 + 1,
                                      .timeout = std::chrono::seconds(120),
                                      .progress = {}});
  (*server)->Stop();
  if (!tcp.ok()) {
    std::fprintf(stderr, "tcp probe failed: %s\n", tcp.status().ToString().c_str());
    return 1;
  }
  std::printf("%-46s %8.2f GB/s\n", "tcp loopback probe, bytes delivered/s", tcp->bandwidth / gb);
  std::printf("%-46s %8.3f us\n", "tcp loopback latency, one way (median)", tcp->latency * 1e6);
  return 0;
}
