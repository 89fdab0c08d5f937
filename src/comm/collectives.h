// Collectives over a Transport (as gloo's allreduce_ring.h): blocking free functions, each
// taking an options struct and returning Status (STYLE.md §2). Allreduce comes as ring
// (bandwidth-optimal), recursive doubling (latency-optimal) and hierarchical (per host, then
// across hosts); see docs/design/collectives.md for when to use which.
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
#include <optional>
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

// What an all-reduce's data travels as between ranks.
enum class WireFormat : uint8_t {
  kNative = 0,  // the data's own type
  // f32 sums and averages only: each value sent as bf16 (rounded to nearest even), half the
  // bytes; additions stay in f32. The ring rounds every partial sum it sends and the final
  // value once, on every rank alike (the owner of a chunk keeps the rounded value it sends),
  // so the ranks end bit-identical. Recursive doubling sends f32 (it is for small messages).
  kBf16 = 1,
};

struct AllreduceOptions {
  std::span<std::byte> data;  // at least count elements of dtype, aligned for it; in place
  size_t count = 0;
  hal::DataType dtype = hal::DataType::kF32;
  ReduceOp op = ReduceOp::kSum;
  TimePoint deadline;  // on transport.clock()
  uint64_t tag = 0;    // distinguishes collectives running concurrently on one transport
  Lane lane = Lane::kGradient;
  WireFormat wire = WireFormat::kNative;
};
// kInvalidArgument "NAME: the bf16 wire carries f32 sums and averages only, not TYPE OP" for
// the bf16 wire with anything else; OK otherwise (the native wire takes every type and op).
Status CheckWire(std::string_view name, hal::DataType dtype, ReduceOp op, WireFormat wire);

// Ring reduce-scatter then ring all-gather: 2 (size - 1) steps, each moving one chunk.
// Afterwards every rank's data holds op over all ranks' inputs. size 1: a no-op (avg too).
// kInvalidArgument: a bad dtype or op, avg of an integer type, data too small or misaligned,
// the bf16 wire for anything but an f32 sum or average.
Status Allreduce(Transport& transport, const AllreduceOptions& options);

// Recursive doubling: every rank exchanges its whole buffer with partner rank ^ 2^k for
// k < log2(p), p the largest power of two <= size; the size - p extra ranks first fold their
// data into a partner and get the result back at the end (2 more steps). ceil(log2 size)
// (+2) steps of count elements each: for small messages. Operands are always combined
// lower-rank block first, so every rank's result is bit-identical (floats included), though
// it may differ in the last bits from Allreduce's (the ring sums in another order). Avg:
// every rank scales the full sum by 1/size. Same arguments and errors as Allreduce.
Status AllreduceRecursiveDoubling(Transport& transport, const AllreduceOptions& options);

// Allreduce algorithms, for configs and dispatch by name. kDirect (the shared-memory path) is
// named here for config parsing only; no function in this file implements it.
enum class Algorithm : uint8_t {
  kAuto = 0,
  kRing = 1,
  kRecursiveDoubling = 2,
  kHierarchical = 3,
  kDirect = 4,
};
// "auto", "ring", "recursive_doubling", "hierarchical", "direct".
std::string_view AlgorithmName(Algorithm algorithm);
// The inverse of AlgorithmName; also accepts "rd" and "hier". nullopt for any other string.
std::optional<Algorithm> AlgorithmFromName(std::string_view name);

// Three phases over sub-group views of `transport` (comm/subgroup_transport.h):
//   1. Reduce inside each host to its leader (the host's lowest rank; binomial tree),
//   2. the leaders allreduce among themselves with `leaders` (kRing, kRecursiveDoubling, or
//      kAuto: recursive doubling up to 64 KiB of data, ring above),
//   3. each leader broadcasts the result inside its host.
// host_of_rank[r] is rank r's host id (any int; size() entries, equal on every rank). Avg
// scales once, on the leaders after phase 2, by the whole group's size. Results equal the
// flat Allreduce's up to float rounding order, and are bit-identical on every rank.
// kInvalidArgument (nothing sent): Allreduce's, plus host_of_rank.size() != size(),
// options.tag > kMaxSubgroupTag, `leaders` not one of the three above, or a transport that
// is itself a sub-group view. Messages use options.tag under salts 0xFFF1..0xFFF3 (one per
// phase), which callers' own sub-group views must not reuse. Failures abort `transport`
// with context "allreduce_hierarchical step=<phase> rank=R: <inner context>: ...".
Status AllreduceHierarchical(Transport& transport, std::span<const int> host_of_rank,
                             const AllreduceOptions& options, Algorithm leaders = Algorithm::kRing);

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

struct ReduceOptions {
  std::span<std::byte> data;  // at least count elements of dtype, aligned for it
  size_t count = 0;
  hal::DataType dtype = hal::DataType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  TimePoint deadline;  // on transport.clock()
  uint64_t tag = 0;
  Lane lane = Lane::kGradient;
};
// Binomial tree to `root`: ceil(log2(size)) rounds. Afterwards the root's data holds op over
// all ranks' inputs (avg: scaled by 1/size on the root only); every other rank's data is
// unchanged (inner tree nodes combine in a scratch copy). Operands are combined in the
// order of rank relative to the root. kInvalidArgument: Allreduce's, or root outside
// [0, size).
Status Reduce(Transport& transport, const ReduceOptions& options);

struct BarrierOptions {
  TimePoint deadline;
  uint64_t tag = 0;
  Lane lane = Lane::kControl;
};
// Dissemination barrier (ceil(log2(size)) rounds of 1-byte messages): returns OK once every
// rank has entered it.
Status Barrier(Transport& transport, const BarrierOptions& options);

}  // namespace kc::comm
