// Allreduce time and bus bandwidth of the direct shared-memory engine (comm/shm/shm_direct.h)
// with N rank processes on this host, for user buffers and for registered regions:
//
//   kc_shm_direct_bench --ranks=2 --sizes=4096,1048576,67108864 --op=sum
//
// The parent forks the ranks before it starts any thread, then hosts the TCP store they meet
// through. Rank 0 prints one line per (buffers, size): time per call and busbw =
// 2 (n - 1) / n * bytes / time.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "comm/shm/shm_direct.h"
#include "comm/tcp_store.h"

namespace kc::comm {
namespace {

using namespace std::chrono_literals;

struct Flags {
  int ranks = 2;
  std::vector<size_t> sizes = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
  ReduceOp op = ReduceOp::kSum;
  int64_t staging_bytes = ShmDirectOptions{}.staging_bytes;
  int64_t small_bytes = ShmDirectOptions{}.small_bytes;
  int spin_iterations = ShmDirectOptions{}.spin_iterations;
  double seconds = 0.5;  // per measurement, roughly
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const size_t eq = a.find('=');
    if (eq == std::string_view::npos) return false;
    const std::string_view name = a.substr(0, eq);
    const char* v = argv[i] + eq + 1;
    if (name == "--ranks") {
      f->ranks = std::atoi(v);
    } else if (name == "--sizes") {
      f->sizes.clear();
      for (const char* p = v; *p != '\0';) {
        char* end = nullptr;
        f->sizes.push_back(std::strtoull(p, &end, 10));
        if (end == p) return false;
        p = *end == ',' ? end + 1 : end;
      }
    } else if (name == "--op") {
      const std::string_view op = v;
      if (op == "sum") {
        f->op = ReduceOp::kSum;
      } else if (op == "avg") {
        f->op = ReduceOp::kAvg;
      } else if (op == "max") {
        f->op = ReduceOp::kMax;
      } else {
        return false;
      }
    } else if (name == "--staging_bytes") {
      f->staging_bytes = std::atoll(v);
    } else if (name == "--small_bytes") {
      f->small_bytes = std::atoll(v);
    } else if (name == "--spin_iterations") {
      f->spin_iterations = std::atoi(v);
    } else if (name == "--seconds") {
      f->seconds = std::atof(v);
    } else {
      return false;
    }
  }
  return f->ranks >= 1 && !f->sizes.empty();
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Times `iters` allreduces of data after a barrier; returns seconds per call on this rank.
Result<double> Time(ShmDirectGroup& g, std::span<std::byte> data, ReduceOp op, int iters) {
  const TimePoint deadline = Clock::Real()->Now() + 600s;
  const size_t count = data.size() / sizeof(float);
  KC_RETURN_IF_ERROR(g.Barrier(deadline));
  const double t0 = Now();
  for (int i = 0; i < iters; ++i) {
    KC_RETURN_IF_ERROR(g.Allreduce(data, count, hal::DataType::kF32, op, deadline));
  }
  const double t = (Now() - t0) / iters;
  KC_RETURN_IF_ERROR(g.Barrier(deadline));
  return t;
}

// One rank process. Returns its exit code.
int RunRank(const Flags& f, int rank, int port) {
  auto store = TcpStoreClient::Connect("127.0.0.1", port, Clock::Real()->Now() + 30s);
  if (!store.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, store.status().ToString().c_str());
    return 3;
  }
  auto group = ShmDirectGroup::Create({.store = store.value().get(),
                                       .group = "bench-" + std::to_string(getppid()),
                                       .rank = rank,
                                       .size = f.ranks,
                                       .staging_bytes = f.staging_bytes,
                                       .small_bytes = f.small_bytes,
                                       .spin_iterations = f.spin_iterations});
  if (!group.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, group.status().ToString().c_str());
    return 4;
  }
  ShmDirectGroup& g = *group.value();
  const size_t max_bytes = *std::max_element(f.sizes.begin(), f.sizes.end());
  auto region = g.Allocate(max_bytes, Clock::Real()->Now() + 30s);
  if (!region.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, region.status().ToString().c_str());
    return 5;
  }
  std::vector<float> user(max_bytes / sizeof(float), 1.0f);
  std::span<std::byte> reg = region.value()->data();
  std::fill(reinterpret_cast<float*>(reg.data()),
            reinterpret_cast<float*>(reg.data()) + max_bytes / sizeof(float), 1.0f);
  if (rank == 0) {
    std::printf("ranks=%d op=%s staging_bytes=%lld small_bytes=%lld\n", f.ranks,
                std::string(ReduceOpName(f.op)).c_str(), static_cast<long long>(f.staging_bytes),
                static_cast<long long>(f.small_bytes));
    std::printf("%-10s %12s %8s %12s %12s\n", "buffers", "size_bytes", "iters", "time_us",
                "busbw_GBps");
  }
  for (const bool registered : {false, true}) {
    for (size_t bytes : f.sizes) {
      bytes = bytes / sizeof(float) * sizeof(float);
      std::span<std::byte> data =
          registered ? reg.first(bytes) : std::as_writable_bytes(std::span(user)).first(bytes);
      // A short calibration run picks the iteration count; every rank must agree, so it is
      // derived from a broadcast of rank 0's estimate.
      Result<double> probe = Time(g, data, f.op, 3);
      if (!probe.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, probe.status().ToString().c_str());
        return 6;
      }
      int iters = static_cast<int>(std::clamp(f.seconds / std::max(*probe, 1e-7), 5.0, 200000.0));
      Status s =
          g.Broadcast(std::as_writable_bytes(std::span(&iters, 1)), 0, Clock::Real()->Now() + 60s);
      Result<double> warm = s.ok() ? Time(g, data, f.op, std::max(2, iters / 10)) : s;
      Result<double> t = warm.ok() ? Time(g, data, f.op, iters) : warm.status();
      if (!t.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, t.status().ToString().c_str());
        return 7;
      }
      if (rank == 0) {
        const double n = f.ranks;
        const double busbw = n > 1 ? 2 * (n - 1) / n * static_cast<double>(bytes) / *t : 0;
        std::printf("%-10s %12zu %8d %12.2f %12.3f\n", registered ? "registered" : "user", bytes,
                    iters, *t * 1e6, busbw / 1e9);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace kc::comm

int main(int argc, char** argv) {
  kc::comm::Flags flags;
  if (!kc::comm::ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: %s [--ranks=N] [--sizes=B1,B2,...] [--op=sum|avg|max] "
                 "[--staging_bytes=B] [--small_bytes=B] [--spin_iterations=N] [--seconds=S]\n",
                 argv[0]);
    return 2;
  }
  // Fork every rank before this process starts a thread (the store server's).
  std::vector<int> pipes;
  std::vector<pid_t> pids;
  for (int r = 0; r < flags.ranks; ++r) {
    int fds[2];
    if (pipe(fds) != 0) return 1;
    const pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      close(fds[1]);
      int port = 0;
      if (read(fds[0], &port, sizeof port) != sizeof port) _exit(2);
      std::fflush(stdout);
      _exit(kc::comm::RunRank(flags, r, port));
    }
    close(fds[0]);
    pipes.push_back(fds[1]);
    pids.push_back(pid);
  }
  auto server = kc::comm::TcpStoreServer::Start({.bind_address = "127.0.0.1", .port = 0});
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  const int port = server.value()->port();
  for (int fd : pipes) {
    if (write(fd, &port, sizeof port) != sizeof port) return 1;
    close(fd);
  }
  int rc = 0;
  for (pid_t pid : pids) {
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) rc = 1;
  }
  return rc;
}
