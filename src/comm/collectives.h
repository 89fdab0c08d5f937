// Ring collectives over a Transport (as gloo's allreduce_ring.h): blocking free functions,
// each taking an options struct and returning Status (STYLE.md §2).
//
//   KC_RETURN_IF_ERROR(Allreduce(*transport, {.data = std::as_writable_bytes(std::span(grad)),
//                                             .count = grad.size(),
//                                             .dtype = hal::DataType::kF32,
//                                             .op = ReduceOp::kAvg,
//                                             .deadline = clock->Now() + 10s}));
//
// Every rank of the group calls the same collective with the same count, dtype, op, root
// and tag, in the same order. Data is host memory, worked on in place.
//
// Chunking: ReduceScatter, Allgather and Allreduce split `count` elements into size()
// chunks; chunk i has count / size elements, plus one when i < count % size (ChunkOf). Chunks
// may be empty (count < size); count 0 is a no-op.
//
// Errors: bad arguments return kInvalidArgument before anything is sent (the transport is
// left alone). Any failure after that (a transport error, a deadline read on the
// transport's clock, kDeadlineExceeded) aborts the transport with that status, so that
// peers blocked on this rank fail at once instead of waiting for their deadline, and is
// returned with context, e.g. "allreduce step=3 rank=1: ...". An aborted transport stays
// failed (sticky): rebuild the group to continue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"
#include "comm/lanes.h"
#include "comm/reduce.h"
#include "comm/transport.h"
#include "hal/compute.h"

namespace kc::comm {

// Elements [offset, offset + count) of a buffer of `total` elements split into `size` chunks.
struct ChunkRange {
  size_t offset = 0;
  size_t count = 0;
};
ChunkRange ChunkOf(size_t total, int size, int index);

struct AllreduceOptions {
  std::span<std::byte> data;  // at least count elements of dtype, aligned for it; in place
  size_t count = 0;
  hal::DataType dtype = hal::DataType::kF32;
  ReduceOp op = ReduceOp::kSum;
  TimePoint deadline;  // on transport.clock()
  uint64_t tag = 0;    // distinguishes collectives running concurrently on one transport
  Lane lane = Lane::kGradient;
};
// Ring reduce-scatter then ring all-gather: 2 (size - 1) steps, each moving one chunk.
// Afterwards every rank's data holds op over all ranks' inputs. size 1: a no-op (avg too).
// kInvalidArgument: a bad dtype or op, avg of an integer type, data too small or misaligned.
Status Allreduce(Transport& transport, const AllreduceOptions& options);

// Same fields as Allreduce. Afterwards this rank's chunk (ChunkOf(count, size, rank)) of
// data holds op over all ranks' inputs of that chunk; the other chunks hold partial sums.
using ReduceScatterOptions = AllreduceOptions;
Status ReduceScatter(Transport& transport, const ReduceScatterOptions& options);

struct AllgatherOptions {
  std::span<std::byte> data;  // at least count elements of dtype; in place
  size_t count = 0;
  hal::DataType dtype = hal::DataType::kF32;
  TimePoint deadline;
  uint64_t tag = 0;
  Lane lane = Lane::kGradient;
};
// Each rank contributes its chunk (ChunkOf(count, size, rank)) of data; afterwards every
// rank's data holds every rank's chunk. Ring: size - 1 steps.
Status Allgather(Transport& transport, const AllgatherOptions& options);

struct BroadcastOptions {
  std::span<std::byte> data;  // the root's bytes are copied into every rank's data
  int root = 0;
  TimePoint deadline;
  uint64_t tag = 0;
  Lane lane = Lane::kGradient;
};
// Binomial tree: ceil(log2(size)) rounds. Every rank passes a buffer of the same size.
Status Broadcast(Transport& transport, const BroadcastOptions& options);

struct BarrierOptions {
  TimePoint deadline;
  uint64_t tag = 0;
  Lane lane = Lane::kControl;
};
// Dissemination barrier (ceil(log2(size)) rounds of 1-byte messages): returns OK once every
// rank has entered it.
Status Barrier(Transport& transport, const BarrierOptions& options);

}  // namespace kc::comm
