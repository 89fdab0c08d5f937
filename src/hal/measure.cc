#include "hal/measure.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "base/layer_guard.h"
#include "hal/fd.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KC_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define KC_CPU_RELAX() asm volatile("yield")
#else
#define KC_CPU_RELAX() \
  do {                 \
  } while (false)
#endif

namespace kc::hal {
namespace {

// ---------------------------------------------------------------------------------------
// Helpers usable in a forked child of a multi-threaded process: system calls, atomics and
// plain loops only (no allocation, no locks, no logging).

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// A 32-bit futex word with a count of sleepers, alone on its cache line in the shared
// mapping. std::atomic<uint32_t> is a plain lock-free 32-bit word, as the futex needs.
struct alignas(64) SharedWord {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> sleepers{0};
};
static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free);

uint32_t* FutexAddress(SharedWord* w) { return reinterpret_cast<uint32_t*>(&w->value); }

// Sleeps while w->value == expected, until woken or CLOCK_MONOTONIC reaches deadline_ns.
void FutexWait(SharedWord* w, uint32_t expected, int64_t deadline_ns) {
  timespec abs{.tv_sec = deadline_ns / 1'000'000'000, .tv_nsec = deadline_ns % 1'000'000'000};
  // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline. Not FUTEX_PRIVATE: the
  // word is shared between processes.
  syscall(SYS_futex, FutexAddress(w), FUTEX_WAIT_BITSET, expected, &abs, nullptr,
          FUTEX_BITSET_MATCH_ANY);
}

void FutexWakeAll(SharedWord* w) {
  syscall(SYS_futex, FutexAddress(w), FUTEX_WAKE, std::numeric_limits<int>::max(), nullptr, nullptr,
          0);
}

// Stores v and wakes sleepers. The seq_cst store followed by the seq_cst load of sleepers
// pairs with Await's seq_cst increment of sleepers followed by its seq_cst load of value:
// either this load sees the sleeper, or the sleeper's load sees v (no lost wake-up).
void Publish(SharedWord* w, uint32_t v) {
  w->value.store(v, std::memory_order_seq_cst);
  if (w->sleepers.load(std::memory_order_seq_cst) != 0) FutexWakeAll(w);
}

constexpr int64_t kSpinNs = 50'000;  // spin this long before sleeping on the futex

// Waits until done(w->value) holds: spins briefly, then sleeps on the futex. Returns false
// when deadline_ns passes first.
template <typename Done>
bool Await(SharedWord* w, Done done, int64_t deadline_ns) {
  // Acquire: the data published before the value (a slot's bytes) is visible after it.
  if (done(w->value.load(std::memory_order_acquire))) return true;
  const int64_t spin_until = NowNs() + kSpinNs;
  for (uint32_t i = 1;; ++i) {
    KC_CPU_RELAX();
    if (done(w->value.load(std::memory_order_acquire))) return true;
    if (i % 64 == 0 && NowNs() >= spin_until) break;
  }
  for (;;) {
    w->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t v = w->value.load(std::memory_order_seq_cst);
    if (done(v)) {
      w->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      return true;
    }
    if (NowNs() >= deadline_ns) {
      w->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      return false;
    }
    FutexWait(w, v, deadline_ns);
    w->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

// Deterministic, position-dependent content: word i of a message with `seed`.
uint64_t PatternWord(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i;  // SplitMix64 finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void FillPattern(uint64_t* words, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) words[i] = PatternWord(seed, i);
}

// Position-dependent, so lost, duplicated or reordered chunks change it.
uint64_t Checksum(const uint64_t* words, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += words[i] * (2 * i + 1);
  return sum;
}

// Child exit codes, mapped to ErrorCodes by the parent.
enum ChildExit : int {
  kChildOk = 0,
  kChildAffinity = 2,
  kChildDeadline = 3,
  kChildNoMemory = 4,
};

// The head of the shared mapping; the slots and the round-trip samples follow it.
struct Control {
  SharedWord produced;               // chunks the sender has written into the ring (sender writes)
  SharedWord consumed;               // chunks the receiver has copied out of it (receiver writes)
  SharedWord arrived;                // barrier arrivals, two per barrier
  SharedWord ping;                   // latency: round trip number sent (sender writes)
  SharedWord pong;                   // latency: round trip number echoed (receiver writes)
  alignas(64) int64_t start_ns = 0;  // sender: start of the timed passes
  int64_t end_ns = 0;                // receiver: end of the timed passes
  uint64_t expected_checksum = 0;    // sender: of the verification message
  uint64_t received_checksum = 0;    // receiver: of what it got
};

// Everything a child needs, computed before fork.
struct ChildPlan {
  Control* control;
  char* slots;           // slots * chunk_bytes bytes in the shared mapping
  int64_t* rtt_ns;       // round_trips samples in the shared mapping
  int64_t* pass_end_ns;  // passes timestamps in the shared mapping (receiver writes)
  int64_t message_bytes;
  int64_t chunk_bytes;
  int slots_count;
  int passes;  // timed passes
  int round_trips;
  int64_t deadline_ns;
  int progress_fd;  // write end of the progress pipe
  pid_t parent;     // the measuring process
  bool pin;
  cpu_set_t cpus;
  bool stall;
};

[[noreturn]] void ChildExitNow(int code) { _exit(code); }

void Notify(const ChildPlan& p, char what) {
  // Progress is advisory: a full pipe (the parent is slow to read) only loses an update.
  [[maybe_unused]] ssize_t n = write(p.progress_fd, &what, 1);
}

// Both processes arrive; returns once both have. k counts barriers from 1.
void Barrier(const ChildPlan& p, uint32_t k) {
  p.control->arrived.value.fetch_add(1, std::memory_order_seq_cst);
  if (p.control->arrived.sleepers.load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(&p.control->arrived);
  }
  if (!Await(
          &p.control->arrived, [k](uint32_t v) { return v >= 2 * k; }, p.deadline_ns)) {
    ChildExitNow(kChildDeadline);
  }
}

char* MapPrivate(int64_t bytes) {
  void* m = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  madvise(m, static_cast<size_t>(bytes), MADV_HUGEPAGE);  // advisory
  return static_cast<char*>(m);
}

void ChildSetup(const ChildPlan& p) {
  // Never outlive the measuring process (it may have died before the prctl took effect).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != p.parent) ChildExitNow(kChildDeadline);
  if (p.pin && sched_setaffinity(0, sizeof(p.cpus), &p.cpus) != 0) ChildExitNow(kChildAffinity);
}

// Sends one message through the ring, chunk counter `next` advancing.
void SendMessage(const ChildPlan& p, const char* src, uint32_t& next) {
  Control* c = p.control;
  for (int64_t off = 0; off < p.message_bytes; off += p.chunk_bytes, ++next) {
    const uint32_t chunk = next;
    // Wait for a free slot: fewer than `slots` chunks in flight.
    if (!Await(
            &c->consumed,
            [&](uint32_t consumed) {
              return chunk - consumed < static_cast<uint32_t>(p.slots_count);
            },
            p.deadline_ns)) {
      ChildExitNow(kChildDeadline);
    }
    const int64_t len = std::min(p.chunk_bytes, p.message_bytes - off);
    std::memcpy(p.slots + (chunk % p.slots_count) * p.chunk_bytes, src + off, len);
    Publish(&c->produced, chunk + 1);
  }
}

void ReceiveMessage(const ChildPlan& p, char* dst, uint32_t& next) {
  Control* c = p.control;
  for (int64_t off = 0; off < p.message_bytes; off += p.chunk_bytes, ++next) {
    const uint32_t chunk = next;
    // Wait until the sender has written this chunk.
    if (!Await(
            &c->produced,
            [chunk](uint32_t produced) { return static_cast<int32_t>(produced - chunk) > 0; },
            p.deadline_ns)) {
      ChildExitNow(kChildDeadline);
    }
    const int64_t len = std::min(p.chunk_bytes, p.message_bytes - off);
    std::memcpy(dst + off, p.slots + (chunk % p.slots_count) * p.chunk_bytes, len);
    Publish(&c->consumed, chunk + 1);
  }
}

[[noreturn]] void RunSender(const ChildPlan& p) {
  ChildSetup(p);
  char* src = MapPrivate(p.message_bytes);
  if (src == nullptr) ChildExitNow(kChildNoMemory);
  const auto words = static_cast<size_t>(p.message_bytes / 8);
  FillPattern(reinterpret_cast<uint64_t*>(src), words, 1);
  uint32_t next = 0;
  Barrier(p, 1);
  SendMessage(p, src, next);  // warm-up: faults in the ring and the receiver's buffer
  Barrier(p, 2);
  p.control->start_ns = NowNs();
  for (int i = 0; i < p.passes; ++i) SendMessage(p, src, next);
  Barrier(p, 3);
  // Latency: ping with the round trip number, wait for its echo.
  Control* c = p.control;
  for (int i = 0; i < p.round_trips; ++i) {
    const auto n = static_cast<uint32_t>(i + 1);
    const int64_t t0 = NowNs();
    Publish(&c->ping, n);
    if (!Await(
            &c->pong, [n](uint32_t v) { return v == n; }, p.deadline_ns)) {
      ChildExitNow(kChildDeadline);
    }
    p.rtt_ns[i] = NowNs() - t0;
  }
  Notify(p, 'l');
  // Verification: a fresh pattern, so stale bytes from earlier passes cannot match.
  FillPattern(reinterpret_cast<uint64_t*>(src), words, 2);
  c->expected_checksum = Checksum(reinterpret_cast<const uint64_t*>(src), words);
  Barrier(p, 4);
  SendMessage(p, src, next);
  ChildExitNow(kChildOk);
}

[[noreturn]] void RunReceiver(const ChildPlan& p) {
  ChildSetup(p);
  if (p.stall) {
    for (;;) pause();  // never answers; the parent's deadline ends it
  }
  char* dst = MapPrivate(p.message_bytes);
  if (dst == nullptr) ChildExitNow(kChildNoMemory);
  std::memset(dst, 0, static_cast<size_t>(p.message_bytes));
  uint32_t next = 0;
  Barrier(p, 1);
  ReceiveMessage(p, dst, next);
  Barrier(p, 2);
  for (int i = 0; i < p.passes; ++i) {
    ReceiveMessage(p, dst, next);
    p.pass_end_ns[i] = NowNs();
    Notify(p, 'p');
  }
  p.control->end_ns = NowNs();
  Barrier(p, 3);
  Control* c = p.control;
  for (int i = 0; i < p.round_trips; ++i) {
    const auto n = static_cast<uint32_t>(i + 1);
    if (!Await(
            &c->ping, [n](uint32_t v) { return v == n; }, p.deadline_ns)) {
      ChildExitNow(kChildDeadline);
    }
    Publish(&c->pong, n);
  }
  Barrier(p, 4);
  ReceiveMessage(p, dst, next);
  c->received_checksum =
      Checksum(reinterpret_cast<const uint64_t*>(dst), static_cast<size_t>(p.message_bytes / 8));
  Notify(p, 'v');
  ChildExitNow(kChildOk);
}

// ---------------------------------------------------------------------------------------
// Parent side.

class SharedMapping {
 public:
  SharedMapping(void* addr, size_t bytes) : addr_(addr), bytes_(bytes) {}
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  ~SharedMapping() { munmap(addr_, bytes_); }
  char* data() const { return static_cast<char*>(addr_); }

 private:
  void* addr_;
  size_t bytes_;
};

// A forked child that is killed and reaped when this goes out of scope unreaped, so no
// return path leaves a zombie or a runaway process.
class Child {
 public:
  Child(pid_t pid, Fd pidfd) : pid_(pid), pidfd_(std::move(pidfd)) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { KillAndReap(); }

  int pidfd() const { return pidfd_.get(); }
  bool reaped() const { return reaped_; }
  // The wait status once reaped.
  int status() const { return status_; }

  // Reaps the child if it has exited; true if it is reaped now.
  bool TryReap() {
    if (reaped_) return true;
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      status_ = status;
    }
    return reaped_;
  }

  void KillAndReap() {
    if (reaped_) return;
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    status_ = status;
  }

 private:
  pid_t pid_;
  Fd pidfd_;
  bool reaped_ = false;
  int status_ = 0;
};

Status ChildStatus(const char* who, int status) {
  if (WIFEXITED(status)) {
    switch (WEXITSTATUS(status)) {
      case kChildOk:
        return OkStatus();
      case kChildAffinity:
        return InvalidArgumentError(std::string(who) + ": cannot pin to the requested CPUs");
      case kChildDeadline:
        return DeadlineExceededError(std::string(who) + ": its peer did not answer in time");
      case kChildNoMemory:
        return ResourceExhaustedError(std::string(who) + ": cannot map its buffer");
      default:
        return InternalError(std::string(who) + ": exited with status " +
                             std::to_string(WEXITSTATUS(status)));
    }
  }
  if (WIFSIGNALED(status)) {
    return InternalError(std::string(who) + ": killed by signal " +
                         std::to_string(WTERMSIG(status)));
  }
  return InternalError(std::string(who) + ": ended in an unknown way");
}

// kInvalidArgument unless every CPU is one this process may run on.
Result<cpu_set_t> CpuSet(const std::vector<int>& cpus, std::string_view what) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    return InternalError("sched_getaffinity: " + std::string(std::strerror(errno)));
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed)) {
      return InvalidArgumentError(std::string(what) + ": cpu " + std::to_string(cpu) +
                                  " is not one this process may use");
    }
    CPU_SET(cpu, &set);
  }
  return set;
}

Result<pid_t> Fork(const ChildPlan& plan, bool sender) {
  const pid_t pid = fork();
  if (pid < 0) return ResourceExhaustedError("fork: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    if (sender) RunSender(plan);
    RunReceiver(plan);
  }
  return pid;
}

Result<std::unique_ptr<Child>> StartChild(const ChildPlan& plan, bool sender) {
  KC_ASSIGN_OR_RETURN(pid_t pid, Fork(plan, sender));
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  auto child = std::make_unique<Child>(pid, Fd(pidfd));
  if (pidfd < 0) {
    return UnavailableError("pidfd_open (Linux >= 5.3 required): " +
                            std::string(std::strerror(errno)));
  }
  return child;
}

Status ValidateShm(const ShmOptions& o) {
  if (o.message_bytes < 8 || o.message_bytes % 8 != 0) {
    return InvalidArgumentError("shm message_bytes=" + std::to_string(o.message_bytes) +
                                ": expected a positive multiple of 8");
  }
  if (o.chunk_bytes < 8 || o.chunk_bytes % 8 != 0) {
    return InvalidArgumentError("shm chunk_bytes=" + std::to_string(o.chunk_bytes) +
                                ": expected a positive multiple of 8");
  }
  if (o.slots < 1 || o.slots > 1024) {
    return InvalidArgumentError("shm slots=" + std::to_string(o.slots) + ": expected 1 to 1024");
  }
  if (o.total_bytes < 1) return InvalidArgumentError("shm total_bytes: expected > 0");
  if (o.latency_round_trips < 1 || o.latency_round_trips > 10'000'000) {
    return InvalidArgumentError("shm latency_round_trips: expected 1 to 10,000,000");
  }
  if (o.timeout <= Duration::zero()) return InvalidArgumentError("shm timeout: expected > 0");
  const int64_t passes = (o.total_bytes + o.message_bytes - 1) / o.message_bytes;
  const int64_t chunks_per_message = (o.message_bytes + o.chunk_bytes - 1) / o.chunk_bytes;
  if ((passes + 2) * chunks_per_message >= (int64_t{1} << 31)) {
    return InvalidArgumentError("shm: too many chunks; use larger chunk_bytes");
  }
  return OkStatus();
}

}  // namespace

Result<ShmMeasurement> MeasureSharedMemory(const ShmOptions& options) {
  KC_LAYER_ENTRY(Layer::kHal, "measure");
  KC_RETURN_IF_ERROR(ValidateShm(options));
  KC_ASSIGN_OR_RETURN(cpu_set_t sender_cpus, CpuSet(options.sender_cpus, "shm sender_cpus"));
  KC_ASSIGN_OR_RETURN(cpu_set_t receiver_cpus, CpuSet(options.receiver_cpus, "shm receiver_cpus"));
  const int passes =
      static_cast<int>((options.total_bytes + options.message_bytes - 1) / options.message_bytes);

  // Shared mapping: Control | slots | round-trip samples, each part page aligned.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto round_up = [page](size_t n) { return (n + page - 1) / page * page; };
  const size_t control_bytes = round_up(sizeof(Control));
  const size_t slot_bytes = round_up(static_cast<size_t>(options.slots * options.chunk_bytes));
  const size_t rtt_bytes = round_up(sizeof(int64_t) * options.latency_round_trips);
  const size_t pass_bytes = round_up(sizeof(int64_t) * passes);
  const size_t bytes = control_bytes + slot_bytes + rtt_bytes + pass_bytes;
  void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (addr == MAP_FAILED) {
    return ResourceExhaustedError("shm: mmap of " + std::to_string(bytes) +
                                  " bytes: " + std::strerror(errno));
  }
  SharedMapping shared(addr, bytes);
  auto* control = new (shared.data()) Control();

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return ResourceExhaustedError("shm: pipe: " + std::string(std::strerror(errno)));
  }
  Fd progress_read(pipe_fds[0]);
  Fd progress_write(pipe_fds[1]);

  const int64_t deadline_ns =
      NowNs() + std::chrono::duration_cast<std::chrono::nanoseconds>(options.timeout).count();
  ChildPlan plan{.control = control,
                 .slots = shared.data() + control_bytes,
                 .rtt_ns = reinterpret_cast<int64_t*>(shared.data() + control_bytes + slot_bytes),
                 .pass_end_ns = reinterpret_cast<int64_t*>(shared.data() + control_bytes +
                                                           slot_bytes + rtt_bytes),
                 .message_bytes = options.message_bytes,
                 .chunk_bytes = options.chunk_bytes,
                 .slots_count = options.slots,
                 .passes = passes,
                 .round_trips = options.latency_round_trips,
                 .deadline_ns = deadline_ns,
                 .progress_fd = progress_write.get(),
                 .parent = getpid(),
                 .pin = !options.sender_cpus.empty(),
                 .cpus = sender_cpus,
                 .stall = false};
  KC_ASSIGN_OR_RETURN(std::unique_ptr<Child> sender, StartChild(plan, /*sender=*/true));
  plan.pin = !options.receiver_cpus.empty();
  plan.cpus = receiver_cpus;
  plan.stall = options.stall_receiver_for_test;
  KC_ASSIGN_OR_RETURN(std::unique_ptr<Child> receiver, StartChild(plan, /*sender=*/false));
  progress_write.Reset();

  // Supervise: progress bytes from the pipe, exits from the pidfds, all until the deadline.
  int passes_done = 0;
  bool latency_done = false;
  bool verified = false;
  auto report = [&](std::string_view what) {
    if (!options.progress) return;
    const double fraction =
        0.8 * passes_done / passes + (latency_done ? 0.15 : 0.0) + (verified ? 0.04 : 0.0);
    options.progress(fraction, what);
  };
  report("shm bandwidth");
  Child* children[2] = {sender.get(), receiver.get()};
  const char* names[2] = {"shm sender", "shm receiver"};
  for (;;) {
    if (sender->reaped() && receiver->reaped()) break;
    const int64_t left_ns = deadline_ns - NowNs();
    if (left_ns <= 0) {
      sender->KillAndReap();
      receiver->KillAndReap();
      return DeadlineExceededError(
          "shm measurement: no result within " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::milliseconds>(options.timeout).count()) +
          " ms; both processes killed");
    }
    pollfd fds[3] = {
        {.fd = progress_read.get(), .events = POLLIN, .revents = 0},
        {.fd = sender->reaped() ? -1 : sender->pidfd(), .events = POLLIN, .revents = 0},
        {.fd = receiver->reaped() ? -1 : receiver->pidfd(), .events = POLLIN, .revents = 0}};
    const int wait_ms = static_cast<int>(std::min<int64_t>(left_ns / 1'000'000 + 1, 1 << 30));
    const int n = poll(fds, 3, wait_ms);
    if (n < 0 && errno != EINTR) {
      return InternalError("shm: poll: " + std::string(std::strerror(errno)));
    }
    if (fds[0].revents & POLLIN) {
      char buf[256];
      ssize_t got;
      while ((got = read(progress_read.get(), buf, sizeof(buf))) > 0) {
        for (ssize_t i = 0; i < got; ++i) {
          if (buf[i] == 'p') ++passes_done;
          if (buf[i] == 'l') latency_done = true;
          if (buf[i] == 'v') verified = true;
        }
      }
      report(latency_done ? "shm verify" : passes_done == passes ? "shm latency" : "shm bandwidth");
    }
    for (int i = 0; i < 2; ++i) {
      if (!children[i]->TryReap()) continue;
      Status s = ChildStatus(names[i], children[i]->status());
      if (!s.ok()) {
        // The first failure decides; the other child cannot finish without its peer.
        children[1 - i]->KillAndReap();
        return s.WithContext("shm measurement");
      }
    }
  }

  if (control->received_checksum != control->expected_checksum) {
    return DataLossError("shm measurement: the receiver's checksum differs from the sender's");
  }
  ShmMeasurement m;
  m.bytes_delivered = int64_t{passes} * options.message_bytes;
  m.seconds = static_cast<double>(control->end_ns - control->start_ns) * 1e-9;
  // The best pass, as STREAM keeps its best pass: the least disturbed by other work.
  int64_t best_ns = std::numeric_limits<int64_t>::max();
  for (int i = 0; i < passes; ++i) {
    const int64_t begin = i == 0 ? control->start_ns : plan.pass_end_ns[i - 1];
    best_ns = std::min(best_ns, plan.pass_end_ns[i] - begin);
  }
  m.bandwidth = static_cast<double>(options.message_bytes) /
                (static_cast<double>(std::max<int64_t>(best_ns, 1)) * 1e-9);
  m.mean_bandwidth = m.seconds > 0 ? static_cast<double>(m.bytes_delivered) / m.seconds : 0;
  std::vector<int64_t> rtt(plan.rtt_ns, plan.rtt_ns + options.latency_round_trips);
  std::nth_element(rtt.begin(), rtt.begin() + rtt.size() / 2, rtt.end());
  m.latency = static_cast<double>(rtt[rtt.size() / 2]) * 1e-9 / 2;
  if (options.progress) options.progress(1.0, "shm done");
  return m;
}

// ---------------------------------------------------------------------------------------
// STREAM-style copy.

namespace {

struct MunmapDeleter {
  size_t bytes;
  void operator()(char* p) const { munmap(p, bytes); }
};
using MappedBuffer = std::unique_ptr<char, MunmapDeleter>;

Result<MappedBuffer> MapBuffer(int64_t bytes) {
  char* p = MapPrivate(bytes);
  if (p == nullptr) {
    return ResourceExhaustedError("stream: mmap of " + std::to_string(bytes) +
                                  " bytes: " + std::strerror(errno));
  }
  return MappedBuffer(p, MunmapDeleter{static_cast<size_t>(bytes)});
}

}  // namespace

Result<StreamMeasurement> MeasureStreamCopy(const StreamOptions& options) {
  KC_LAYER_ENTRY(Layer::kHal, "measure");
  if (options.array_bytes < 1) return InvalidArgumentError("stream array_bytes: expected > 0");
  if (options.threads < 1 || options.threads > 4096) {
    return InvalidArgumentError("stream threads=" + std::to_string(options.threads) +
                                ": expected 1 to 4096");
  }
  if (options.passes < 1) return InvalidArgumentError("stream passes: expected > 0");
  KC_ASSIGN_OR_RETURN(cpu_set_t allowed, CpuSet(options.cpus, "stream cpus"));
  (void)allowed;
  KC_ASSIGN_OR_RETURN(MappedBuffer a, MapBuffer(options.array_bytes));
  KC_ASSIGN_OR_RETURN(MappedBuffer b, MapBuffer(options.array_bytes));

  const int threads = options.threads;
  // Thread t owns [begin(t), begin(t + 1)): it touches its part first (so its pages are
  // local to it) and copies it each pass.
  auto begin = [&](int t) { return options.array_bytes * t / threads; };
  double best_seconds = std::numeric_limits<double>::infinity();
  std::chrono::steady_clock::time_point pass_start;
  int pass = -1;  // -1: the first-touch phase
  // The completion step runs on one thread between phases, with all others blocked.
  auto on_phase = [&]() noexcept {
    const auto now = std::chrono::steady_clock::now();
    if (pass >= 0) {
      best_seconds =
          std::min(best_seconds, std::chrono::duration<double>(now - pass_start).count());
    }
    ++pass;
    pass_start = std::chrono::steady_clock::now();
  };
  std::barrier sync(threads, on_phase);
  auto work = [&](int t) {
    if (!options.cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(options.cpus[t % options.cpus.size()], &set);
      pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // checked by CpuSet above
    }
    char* dst = a.get() + begin(t);
    char* src = b.get() + begin(t);
    const auto len = static_cast<size_t>(begin(t + 1) - begin(t));
    std::memset(dst, 0, len);
    std::memset(src, 1, len);
    sync.arrive_and_wait();  // first touch done; pass 0 starts
    for (int i = 0; i < options.passes; ++i) {
      std::memcpy(dst, src, len);  // a[i] = b[i]
      sync.arrive_and_wait();
    }
  };
  // Every part runs on a new thread, so pinning never changes the caller's affinity.
  {
    std::vector<std::jthread> workers;
    workers.reserve(threads);
    try {
      for (int t = 0; t < threads; ++t) workers.emplace_back(work, t);
    } catch (const std::system_error& e) {
      // The started workers wait at the barrier for the missing ones: drop those from it so
      // the started ones run to completion and are joined.
      for (size_t t = workers.size(); t < static_cast<size_t>(threads); ++t) {
        sync.arrive_and_drop();
      }
      return ResourceExhaustedError(std::string("stream: cannot start threads: ") + e.what());
    }
  }
  StreamMeasurement m;
  m.copy_bytes_per_second = static_cast<double>(options.array_bytes) / best_seconds;
  return m;
}

Result<HostMeasurement> MeasureHost(const HostInfo& info, const HostMeasureOptions& options) {
  const int64_t size = options.quick ? 32 * kMiB : 256 * kMiB;
  std::vector<int> cpus;
  for (const NumaNode& n : info.numa_nodes) cpus.insert(cpus.end(), n.cpus.begin(), n.cpus.end());
  const int phases = cpus.size() >= 2 ? 3 : 2;
  auto report = [&](int phase, double fraction, std::string_view what) {
    if (options.progress) options.progress((phase + fraction) / phases, what);
  };

  HostMeasurement m;
  report(0, 0, "STREAM-style copy (one core)");
  Result<StreamMeasurement> stream = MeasureStreamCopy({.array_bytes = size,
                                                        .threads = 1,
                                                        .passes = options.quick ? 2 : 5,
                                                        .cpus = {cpus.empty() ? 0 : cpus[0]}});
  if (!stream.ok()) return stream.status().WithContext("stream copy");
  m.stream = *stream;
  m.cpu.memory_bandwidth_per_core = stream->stream_bytes_per_second();

  report(1, 0, "sgemm rate (one core)");
  Result<double> flops = MeasureSgemmFlops({.n = options.quick ? 256 : 512, .threads = 1});
  if (!flops.ok()) return flops.status().WithContext("sgemm");
  m.sgemm_flops_per_core = *flops;
  m.cpu.flops_fp32_per_core = *flops;

  if (cpus.size() >= 2) {
    ShmOptions opts;
    opts.total_bytes = size;
    opts.message_bytes = std::min<int64_t>(opts.message_bytes, size);
    opts.sender_cpus = {cpus[0]};
    opts.receiver_cpus = {cpus[1]};
    opts.latency_round_trips = options.quick ? 1000 : 10000;
    opts.progress = [&](double f, std::string_view what) { report(2, f, what); };
    Result<ShmMeasurement> shm = MeasureSharedMemory(opts);
    if (!shm.ok()) return shm.status().WithContext("shared memory");
    m.shm = *shm;
    m.cpu.shm_bandwidth = shm->bandwidth;
    m.cpu.shm_latency = shm->latency;
  }
  if (options.progress) options.progress(1, "done");
  return m;
}

}  // namespace kc::hal
