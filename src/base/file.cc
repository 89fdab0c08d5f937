#include "base/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace kc {
namespace {

Status Errno(const std::string& what, const std::string& path) {
  return UnavailableError(what + " \"" + path + "\": " + std::strerror(errno));
}

}  // namespace

namespace {

// Writes data to a temporary file (created with options.mode), optionally fsyncs it, renames it
// to path.
Status WriteAndRename(const std::string& path, std::span<const std::byte> data, bool sync,
                      const WriteOptions& options = {}) {
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : ".";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return UnavailableError("cannot create \"" + dir.string() + "\": " + ec.message());
  static std::atomic<uint64_t> calls{0};
  const std::string tmp = options.unique_temp
                              ? path + ".tmp." + std::to_string(getpid()) + "." +
                                    std::to_string(calls.fetch_add(1, std::memory_order_relaxed))
                              : path + ".tmp";
  // A leftover temporary file keeps its old mode through O_TRUNC: start afresh.
  unlink(tmp.c_str());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, options.mode);
  if (fd < 0) return Errno("cannot create", tmp);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status s = Errno("cannot write", tmp);
      close(fd);
      unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (sync && fsync(fd) != 0) {
    Status s = Errno("cannot sync", tmp);
    close(fd);
    unlink(tmp.c_str());
    return s;
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Errno("cannot rename to", path);
    unlink(tmp.c_str());
    return s;
  }
  return OkStatus();
}

Status SyncPath(const std::string& path, bool directory) {
  const int fd = open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  const int r = fsync(fd);
  close(fd);
  if (r != 0) return Errno("cannot sync", path);
  return OkStatus();
}

std::string DirOf(const std::string& path) {
  const std::filesystem::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : ".";
}

}  // namespace

Status WriteFileDurably(const std::string& path, std::span<const std::byte> data,
                        const WriteOptions& options) {
  KC_RETURN_IF_ERROR(WriteAndRename(path, data, /*sync=*/true, options));
  return SyncPath(DirOf(path), /*directory=*/true);
}

Status WriteFileAtomically(const std::string& path, std::span<const std::byte> data) {
  return WriteAndRename(path, data, /*sync=*/false);
}

Status SyncFiles(std::span<const std::string> paths) {
  std::vector<std::string> dirs;
  for (const std::string& p : paths) {
    KC_RETURN_IF_ERROR(SyncPath(p, /*directory=*/false));
    std::string d = DirOf(p);
    if (std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(std::move(d));
  }
  for (const std::string& d : dirs) KC_RETURN_IF_ERROR(SyncPath(d, /*directory=*/true));
  return OkStatus();
}

Result<std::string> ReadWholeFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError("no such file \"" + path + "\"");
    return Errno("cannot open", path);
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = Errno("cannot read", path);
      close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

}  // namespace kc
