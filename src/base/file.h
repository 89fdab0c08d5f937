// Whole-file reads and crash-safe writes: what checkpoints, state files and reports need.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kc {

// How a file is written.
struct WriteOptions {
  // The file's permissions, given when it is created (the process's umask applies), so a file
  // meant for its owner alone (0600) is never readable by others, not even for a moment.
  mode_t mode = 0644;
  // A temporary name of this call's own ("<path>.tmp.PID.N") instead of "<path>.tmp", for a
  // file that several processes may replace at once.
  bool unique_temp = false;
};

// Writes `data` to `path` so that after a crash the file is either the old one or the whole
// new one: into "<path>.tmp" (parent directories created), fsync, rename over `path`, fsync of
// the directory. kUnavailable naming the file and the system's reason on failure (the
// temporary file is removed).
Status WriteFileDurably(const std::string& path, std::span<const std::byte> data,
                        const WriteOptions& options = {});
inline Status WriteFileDurably(const std::string& path, std::string_view text,
                               const WriteOptions& options = {}) {
  return WriteFileDurably(path, std::as_bytes(std::span<const char>(text.data(), text.size())),
                          options);
}

// Writes `data` to "<path>.tmp" and renames it over `path`, without waiting for the disk:
// readers never see a partial file, but after a crash it may be missing or empty. Follow with
// SyncFiles before anything that must not outlive the data (a manifest that names it).
Status WriteFileAtomically(const std::string& path, std::span<const std::byte> data);

// fsync of every file in `paths`, then of each directory holding them: after it, files written
// with WriteFileAtomically survive a crash. Many files written first and synced together let
// the kernel write them back at once instead of one after another.
Status SyncFiles(std::span<const std::string> paths);

// The whole file. kNotFound when it does not exist, kUnavailable for other errors; both name
// the file.
Result<std::string> ReadWholeFile(const std::string& path);

}  // namespace kc
