// Gradient-lane latency of the shm transport under a telemetry flood: two ranks in two
// processes ping-pong 4 KiB on Lane::kGradient, first alone, then while another thread of
// each rank streams 64 MiB messages on Lane::kTelemetry between the same two ranks.
//
//   kc_shm_lanes_bench [--iters=N] [--flood_bytes=B] [--bidir] [--spin=N]
//
// Prints the median and p99 round trip of both phases and their ratio. Not a test: nothing
// is asserted, timings depend on the machine.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "comm/shm/shm_transport.h"
#include "comm/tcp_store.h"
#include "comm/transport.h"

namespace kc::comm {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kPingTag = 1;
constexpr uint64_t kPongTag = 2;
constexpr uint64_t kByeTag = 3;  // rank 0 has drained rank 1's flood; rank 1 may close
constexpr uint64_t kFloodTag = 100;
constexpr size_t kPingBytes = 4096;
// The first 8 bytes of a ping: what the echoing rank should do.
constexpr uint64_t kCmdPing = 0;
constexpr uint64_t kCmdDone = 1;  // bytes 8..16 carry the flood messages rank 0 sent

struct Flags {
  int iters = 2000;
  int64_t flood_bytes = 64 << 20;
  bool bidir = false;
  int spin = -1;  // -1: ShmTransportOptions' default
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&](std::string_view name) -> const char* {
      return a.starts_with(name) ? argv[i] + name.size() : nullptr;
    };
    if (const char* iters = value("--iters=")) {
      f.iters = std::atoi(iters);
    } else if (const char* bytes = value("--flood_bytes=")) {
      f.flood_bytes = std::atoll(bytes);
    } else if (const char* spin = value("--spin=")) {
      f.spin = std::atoi(spin);
    } else if (a == "--bidir") {
      f.bidir = true;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      std::exit(2);
    }
  }
  return f;
}

TimePoint Far() { return Clock::Real()->Now() + 60s; }

void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "pid %d: %s: %s\n", getpid(), what, s.ToString().c_str());
    std::_Exit(1);
  }
}

template <typename T>
T Value(Result<T> r, const char* what) {
  Check(r.status(), what);
  return std::move(r).value();
}

// Streams flood messages to `peer` on the telemetry lane, two in flight, until `stop`.
// Returns how many it sent.
int64_t FloodSend(Transport* t, int peer, int64_t bytes, const std::atomic<bool>& stop,
                  std::latch* started) {
  std::vector<std::byte> a(static_cast<size_t>(bytes), std::byte{1});
  std::vector<std::byte> b(static_cast<size_t>(bytes), std::byte{2});
  std::shared_ptr<Request> in_flight[2];
  int64_t sent = 0;
  for (int i = 0; !stop.load(); ++i) {
    std::shared_ptr<Request>& slot = in_flight[i % 2];
    if (slot != nullptr) Check(slot->Wait(Far()), "flood send");
    slot = Value(t->Send(peer, kFloodTag, i % 2 == 0 ? a : b, Lane::kTelemetry), "flood post");
    ++sent;
    if (i == 1) started->count_down();
  }
  for (auto& slot : in_flight) {
    if (slot != nullptr) Check(slot->Wait(Far()), "flood send");
  }
  return sent;
}

// Receives flood messages from `peer`, two Recvs posted at all times (so the messages land
// straight in a posted buffer), until `target` (set later, -1 until then) arrived. The
// Recv posted past the target stays pending until the transport goes.
void FloodRecv(Transport* t, int peer, int64_t bytes, const std::atomic<int64_t>& target) {
  std::vector<std::byte> bufs[2] = {std::vector<std::byte>(static_cast<size_t>(bytes)),
                                    std::vector<std::byte>(static_cast<size_t>(bytes))};
  std::shared_ptr<Request> posted[2];
  for (int k = 0; k < 2; ++k) posted[k] = Value(t->Recv(peer, kFloodTag, bufs[k]), "flood post");
  for (int64_t received = 0;; ++received) {
    std::shared_ptr<Request>& r = posted[received % 2];
    for (;;) {
      const int64_t want = target.load();
      if (want >= 0 && received >= want) return;
      // Bounded waits so that the loop notices the final count; the benchmark only.
      Status s = r->Wait(Clock::Real()->Now() + 20ms);
      if (s.ok()) break;
      if (s.code() != ErrorCode::kDeadlineExceeded) Check(s, "flood recv");
    }
    r = Value(t->Recv(peer, kFloodTag, bufs[received % 2]), "flood post");
  }
}

double Micros(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

struct Summary {
  double median_us;
  double p99_us;
};

Summary Summarise(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)]};
}

// Rank 0: `iters` ping-pongs; round trips in microseconds.
std::vector<double> PingPong(Transport* t, int iters) {
  std::vector<std::byte> ping(kPingBytes), pong(kPingBytes);
  std::vector<double> out;
  out.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    std::memcpy(ping.data(), &kCmdPing, sizeof kCmdPing);
    const auto start = std::chrono::steady_clock::now();
    auto r = Value(t->Recv(1, kPongTag, pong), "pong post");
    auto s = Value(t->Send(1, kPingTag, ping, Lane::kGradient), "ping post");
    Check(r->Wait(Far()), "pong");
    out.push_back(Micros(std::chrono::steady_clock::now() - start));
    Check(s->Wait(Far()), "ping");
  }
  return out;
}

ShmTransportOptions Options(Store* store, const std::string& group, int rank, const Flags& f) {
  ShmTransportOptions o{.store = store, .group = group, .rank = rank, .size = 2};
  if (f.spin >= 0) o.spin_iterations = f.spin;
  return o;
}

// Rank 1 (the child): echoes pings; floods back if --bidir. Never returns.
[[noreturn]] void RunEchoRank(int port_fd, const std::string& group, const Flags& f) {
  int port = 0;
  if (read(port_fd, &port, sizeof port) != sizeof port) _exit(2);
  auto store = Value(TcpStoreClient::Connect("127.0.0.1", port, Far()), "store connect");
  auto t = Value(CreateShmTransport(Options(store.get(), group, 1, f)), "create rank 1");

  std::atomic<int64_t> target{-1};
  std::atomic<bool> stop{false};
  std::latch started(1);
  std::jthread flood_in([&] { FloodRecv(t.get(), 0, f.flood_bytes, target); });
  int64_t flood_sent = 0;
  std::jthread flood_out;
  if (f.bidir) {
    flood_out =
        std::jthread([&] { flood_sent = FloodSend(t.get(), 0, f.flood_bytes, stop, &started); });
  }
  std::vector<std::byte> ping(kPingBytes), pong(kPingBytes);
  for (;;) {
    Check(Value(t->Recv(0, kPingTag, ping), "ping post")->Wait(Far()), "ping");
    uint64_t cmd;
    std::memcpy(&cmd, ping.data(), sizeof cmd);
    if (cmd == kCmdDone) {
      int64_t n;
      std::memcpy(&n, ping.data() + 8, sizeof n);
      target.store(n);
      stop.store(true);
      if (flood_out.joinable()) flood_out.join();
      std::memcpy(pong.data(), &flood_sent, sizeof flood_sent);
    }
    Check(Value(t->Send(0, kPongTag, pong, Lane::kGradient), "pong post")->Wait(Far()), "pong");
    if (cmd == kCmdDone) break;
  }
  flood_in.join();
  // Closing fails rank 0's Recv posted past its flood target: wait until it has stopped.
  Check(Value(t->Recv(0, kByeTag, {}), "bye post")->Wait(Far()), "bye");
  t.reset();
  _exit(0);
}

int Main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  const std::string group = "shm-lanes-bench-" + std::to_string(getpid());
  int port_pipe[2];
  if (pipe(port_pipe) != 0) return 1;
  // Fork before any thread starts.
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    close(port_pipe[1]);
    RunEchoRank(port_pipe[0], group, f);
  }
  close(port_pipe[0]);
  auto server =
      Value(TcpStoreServer::Start({.bind_address = "127.0.0.1", .port = 0}), "store server");
  const int port = server->port();
  if (write(port_pipe[1], &port, sizeof port) != sizeof port) return 1;
  auto store = Value(TcpStoreClient::Connect("127.0.0.1", port, Far()), "store connect");
  auto t = Value(CreateShmTransport(Options(store.get(), group, 0, f)), "create rank 0");

  PingPong(t.get(), std::max(100, f.iters / 10));  // warm-up
  const Summary idle = Summarise(PingPong(t.get(), f.iters));

  std::atomic<bool> stop{false};
  std::atomic<int64_t> target{-1};
  std::latch started(1);
  int64_t flood_sent = 0;
  std::jthread flood_out(
      [&] { flood_sent = FloodSend(t.get(), 1, f.flood_bytes, stop, &started); });
  std::jthread flood_in;
  if (f.bidir) flood_in = std::jthread([&] { FloodRecv(t.get(), 1, f.flood_bytes, target); });
  started.wait();  // the first two flood messages are posted
  const auto flood_start = std::chrono::steady_clock::now();
  const Summary loaded = Summarise(PingPong(t.get(), f.iters));
  const double loaded_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - flood_start).count();
  stop.store(true);
  flood_out.join();

  // Tell rank 1 how many flood messages to expect; its answer carries its own count.
  std::vector<std::byte> done(kPingBytes), answer(kPingBytes);
  std::memcpy(done.data(), &kCmdDone, sizeof kCmdDone);
  std::memcpy(done.data() + 8, &flood_sent, sizeof flood_sent);
  auto r = Value(t->Recv(1, kPongTag, answer), "done post");
  Check(Value(t->Send(1, kPingTag, done, Lane::kGradient), "done")->Wait(Far()), "done");
  Check(r->Wait(Far()), "done answer");
  int64_t child_sent;
  std::memcpy(&child_sent, answer.data(), sizeof child_sent);
  target.store(child_sent);
  if (flood_in.joinable()) flood_in.join();
  Check(Value(t->Send(1, kByeTag, {}, Lane::kControl), "bye post")->Wait(Far()), "bye");
  int wstatus = 0;
  waitpid(child, &wstatus, 0);

  std::printf("shm lanes bench: 2 processes, %d round trips of %zu B on the gradient lane\n",
              f.iters, kPingBytes);
  std::printf("  unloaded:               median %8.1f us   p99 %8.1f us\n", idle.median_us,
              idle.p99_us);
  std::printf(
      "  %s %lld MiB telemetry flood: median %8.1f us   p99 %8.1f us   (%lld flood msgs "
      "in %.2f s, %.2f GB/s)\n",
      f.bidir ? "bidir" : "0->1", static_cast<long long>(f.flood_bytes >> 20), loaded.median_us,
      loaded.p99_us, static_cast<long long>(flood_sent), loaded_s,
      double(flood_sent) * double(f.flood_bytes) / loaded_s / 1e9);
  std::printf("  ratio loaded/unloaded:  median %8.2fx   p99 %8.2fx\n",
              loaded.median_us / idle.median_us, loaded.p99_us / idle.p99_us);
  const bool child_ok = WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
  if (!child_ok) std::fprintf(stderr, "rank 1 exited with wait status %d\n", wstatus);
  return child_ok ? 0 : 1;
}

}  // namespace
}  // namespace kc::comm

int main(int argc, char** argv) { return kc::comm::Main(argc, argv); }
