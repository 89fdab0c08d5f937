#include "comm/internal/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

#include "hal/fd.h"

namespace kc::comm::internal {

void Mapping::Reset() {
  if (addr_ != nullptr) munmap(addr_, bytes_);
  addr_ = nullptr;
}

void UnlinkGuard::Unlink() {
  if (!name_.empty()) shm_unlink(name_.c_str());
  name_.clear();
}

Status ErrnoStatus(std::string_view what, int err) {
  std::string msg = std::string(what) + ": " + std::strerror(err);
  if (err == ENOMEM || err == ENOSPC || err == EMFILE || err == ENFILE) {
    return ResourceExhaustedError(msg);
  }
  return UnavailableError(msg);
}

namespace {

Result<Mapping> MapFd(int fd, const std::string& name, int64_t bytes) {
  void* addr = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) return ErrnoStatus("mmap " + name, errno);
  return Mapping(addr, static_cast<size_t>(bytes));
}

}  // namespace

Result<NewSegment> CreateSegment(const std::string& name, int64_t bytes) {
  hal::Fd fd(shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  if (!fd.valid()) return ErrnoStatus("shm_open " + name, errno);
  auto unlink = std::make_unique<UnlinkGuard>(name);
  if (ftruncate(fd.get(), bytes) != 0) return ErrnoStatus("ftruncate " + name, errno);
  KC_ASSIGN_OR_RETURN(Mapping m, MapFd(fd.get(), name, bytes));
  return NewSegment{std::move(unlink), std::move(m)};
}

Result<Mapping> MapExisting(const std::string& name, int peer, int64_t bytes) {
  hal::Fd fd(shm_open(name.c_str(), O_RDWR, 0));
  if (!fd.valid()) {
    return ErrnoStatus("shm_open " + name + " of rank " + std::to_string(peer), errno);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat " + name, errno);
  if (st.st_size != bytes) {
    return DataLossError("shm segment " + name + " of rank " + std::to_string(peer) + " has " +
                         std::to_string(st.st_size) + " bytes, expected " + std::to_string(bytes));
  }
  return MapFd(fd.get(), name, bytes);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, FutexWord(word), FUTEX_WAKE, std::numeric_limits<int>::max(), nullptr, nullptr,
          0);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  const timespec timeout{.tv_sec = static_cast<time_t>(timeout_ns / 1000000000),
                         .tv_nsec = static_cast<long>(timeout_ns % 1000000000)};
  syscall(SYS_futex, FutexWord(word), FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

std::string SegmentPrefix(std::string_view prefix, std::string_view group) {
  std::string out(prefix);
  for (char c : group.substr(0, 96)) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    out += plain ? c : '_';
  }
  return out + "-";
}

std::string RandomHex() {
  std::random_device rd;
  const uint64_t v = (uint64_t{rd()} << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool ProcessDead(pid_t pid) {
  if (kill(pid, 0) == 0 || errno != ESRCH) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
    hal::Fd fd(open(path, O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return false;
    char buf[512];
    const ssize_t n = read(fd.get(), buf, sizeof buf - 1);
    if (n <= 0) return false;
    buf[n] = '\0';
    const char* paren = std::strrchr(buf, ')');  // the command name may hold anything
    if (paren == nullptr || paren[1] != ' ') return false;
    return paren[2] == 'Z' || paren[2] == 'X';
  }
  return true;
}

}  // namespace kc::comm::internal
