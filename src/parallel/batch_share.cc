#include "parallel/batch_share.h"

#include <fmt/format.h>

#include <algorithm>

namespace kc::parallel {

Result<BatchShare> ShareOfBatch(int64_t global_batch, int replicas, int replica,
                                int64_t micro_batch_size, int64_t micro_batches) {
  if (replicas < 1 || replica < 0 || replica >= replicas) {
    return InvalidArgumentError(
        fmt::format("batch share: replica {} of {} replicas", replica, replicas));
  }
  if (global_batch < replicas) {
    return InvalidArgumentError(
        fmt::format("a global batch of {} sequences cannot be split over {} replicas: each needs "
                    "at least one",
                    global_batch, replicas));
  }
  if (micro_batch_size < 1 || micro_batches < 1) {
    return InvalidArgumentError("batch share: micro_batch_size and micro_batches must be >= 1");
  }
  const int64_t d = replicas, r = replica;
  const int64_t base = global_batch / d, extra = global_batch % d;
  BatchShare s;
  s.sequences = base + (r < extra ? 1 : 0);
  s.offset = r * base + std::min(r, extra);
  if (s.sequences % micro_batch_size == 0) {
    s.micro_batch_size = micro_batch_size;
    s.micro_batches = s.sequences / micro_batch_size;
  } else if (s.sequences % micro_batches == 0) {
    s.micro_batch_size = s.sequences / micro_batches;
    s.micro_batches = micro_batches;
  } else {
    s.micro_batch_size = s.sequences;
    s.micro_batches = 1;
  }
  return s;
}

}  // namespace kc::parallel
