// Gradient buckets (fusion): small tensors are coalesced into flat buckets of a configured
// size and each bucket is all-reduced as one operation, as soon as its last tensor is ready,
// so the reduction of early buckets overlaps the rest of the backward pass (as the Reducer
// of torch DDP does).
//
//   KC_ASSIGN_OR_RETURN(auto buckets, GradientBuckets::Create(comm, grads_in_backward_order,
//                                                              {.bucket_bytes = 25 << 20}));
//   for each step:
//     ... backward produces gradient i ...
//     KC_RETURN_IF_ERROR(buckets->MarkReady(i));   // may start bucket b's all-reduce
//     KC_RETURN_IF_ERROR(buckets->Finish());       // waits, copies results into the tensors
//
// Buckets are filled in registration order (register in backward order); a tensor larger
// than bucket_bytes gets a bucket of its own. Buckets start in index order on every rank,
// whatever order tensors become ready in, so every rank submits the same collectives in
// the same order. After AdoptViews() gradients are written straight into view(i) and
// nothing is copied; otherwise MarkReady copies the tensor in and Finish copies it back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "comm/communicator.h"
#include "comm/reduce.h"
#include "hal/compute.h"

namespace kc::comm {

struct BucketOptions {
  int64_t bucket_bytes = 25 << 20;  // > 0
  hal::DataType dtype = hal::DataType::kF32;
  ReduceOp op = ReduceOp::kAvg;
  OpOptions op_options;  // lane, timeout, algorithm of each bucket's all-reduce
};

class GradientBuckets {
 public:
  // Not thread-safe: one thread (the backward pass) calls MarkReady and Finish.
  // `comm` is not owned and must outlive this. Each tensor is a byte span holding a whole
  // number of dtype elements; they must stay valid. Allocates the buckets through the
  // communicator (collective: every rank calls Create with the same sizes).
  static Result<std::unique_ptr<GradientBuckets>> Create(
      Communicator* comm, std::span<const std::span<std::byte>> tensors,
      const BucketOptions& options);
  virtual ~GradientBuckets() = default;

  virtual int num_buckets() const = 0;
  virtual int bucket_of(int tensor) const = 0;
  // Where tensor i lives inside its bucket.
  virtual std::span<std::byte> view(int tensor) = 0;
  // From now on tensor i is view(i) (torch DDP's gradient_as_bucket_view): the caller
  // writes gradients there, and MarkReady and Finish copy nothing.
  virtual void AdoptViews() = 0;

  // Tensor i holds this step's gradient. Copies it into its bucket (unless views adopted);
  // when that completes a bucket, starts the all-reduce of every complete bucket not yet
  // started, in index order. kInvalidArgument for a bad index; kFailedPrecondition if i was
  // already marked this step; the communicator's error if a start fails.
  virtual Status MarkReady(int tensor) = 0;
  // Waits for every bucket's all-reduce and copies the results into the tensors, then
  // starts a new step. kFailedPrecondition naming the first tensor not marked ready (nothing
  // is waited or copied); else the first failure of a bucket's all-reduce.
  virtual Status Finish() = 0;
};

// Fuses `tensors` into buckets and all-reduces them in place: one call for many small
// tensors (e.g. parameters to average at the start of training).
Status AllreduceCoalesced(Communicator& comm, std::span<const std::span<std::byte>> tensors,
                          const BucketOptions& options);

}  // namespace kc::comm
