// `kc bench comm --op wire`: the limit a collective over TCP is measured against. Every rank
// streams to its right neighbour and from its left at once, over plain TCP sockets between
// the same addresses the transport uses, with the same socket options, one thread, no
// protocol: what the links and the kernel carry at most. A ring all-reduce's bus bandwidth
// is the bytes each rank sends per second, so this row's bus bandwidth is its ceiling.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "comm/store.h"
#include "hal/fd.h"

namespace kc::app {

class WireRing {
 public:
  // Listens on `bind`, publishes the address under `group` in the store, connects to rank
  // (rank + 1) % size and accepts (rank - 1) % size. A world of one rank has no links.
  static Result<std::unique_ptr<WireRing>> Connect(comm::Store& store, const std::string& group,
                                                   int rank, int size, const std::string& bind,
                                                   TimePoint deadline);

  // Sends `out` to the right neighbour while receiving in.size() bytes from the left.
  // kUnavailable when a neighbour goes away, kDeadlineExceeded at `deadline` (steady clock).
  Status Stream(std::span<const std::byte> out, std::span<std::byte> in, TimePoint deadline);

 private:
  WireRing(int right, hal::Fd right_fd, int left, hal::Fd left_fd)
      : right_(right), left_(left), right_fd_(std::move(right_fd)), left_fd_(std::move(left_fd)) {}

  int right_ = -1;
  int left_ = -1;
  hal::Fd right_fd_;
  hal::Fd left_fd_;
};

}  // namespace kc::app
