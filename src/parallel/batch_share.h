// How a step's global batch is split over data-parallel replicas, evenly or not: the first
// G mod d replicas take one sequence more (32 sequences over 3 replicas: 11, 11, 10), so any
// count of replicas up to G can train on the same global batch. Each replica's gradient and loss
// are then weighted by its share (Trainer), which keeps the loss trajectory that of one rank.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace kc::parallel {

struct BatchShare {
  int64_t offset = 0;     // the replica's first sequence within the step's global batch
  int64_t sequences = 0;  // its share
  // The share as equal micro-batches: the plan's micro_batch_size when it divides the share,
  // else the plan's count of micro-batches when that does, else one micro-batch of the share.
  int64_t micro_batch_size = 0;
  int64_t micro_batches = 0;
};

// Replica `replica` of `replicas`' share of `global_batch` sequences, cut into micro-batches as
// near the plan's (`micro_batch_size` x `micro_batches`) as the share allows. kInvalidArgument
// when there are fewer sequences than replicas, or for a replica outside [0, replicas) or a
// micro-batching below 1.
Result<BatchShare> ShareOfBatch(int64_t global_batch, int replicas, int replica,
                                int64_t micro_batch_size, int64_t micro_batches);

}  // namespace kc::parallel
