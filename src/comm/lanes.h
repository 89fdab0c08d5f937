// Priority lanes: the send-side queue a transport thread drains. Traffic is split into
// chunks and put on the wire highest lane first, with a starvation guard for the lower
// lanes (docs/design/lanes-and-rate-limits.md).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"

namespace kc::comm {

// The lanes, highest priority first. The lane follows from the kind of traffic, never from
// who sends it: gradient sync -> kGradient, pipeline activations (and their gradients) ->
// kActivation, control messages (barriers, acks, commands) -> kControl, logging and metrics
// -> kTelemetry. Telemetry can never rank above gradients (the seed's §5.1 incident, where
// logging at top priority stalled gradient sync).
enum class Lane : uint8_t { kGradient = 0, kActivation = 1, kControl = 2, kTelemetry = 3 };

inline constexpr int kNumLanes = 4;
inline constexpr Lane kAllLanes[kNumLanes] = {Lane::kGradient, Lane::kActivation, Lane::kControl,
                                              Lane::kTelemetry};

// "gradient", "activation", "control", "telemetry".
std::string_view LaneName(Lane lane);
// The inverse of LaneName; nullopt for an unknown name.
std::optional<Lane> LaneFromName(std::string_view name);

// How a LaneScheduler splits, bounds and orders traffic. Values come from the admin's
// configuration (comm/comm_limits_config.h); a plain copyable value.
struct LaneOptions {
  // Messages are cut into chunks of at most this many bytes, so a large low-lane message
  // holds the wire for one chunk at a time.
  int64_t chunk_bytes = 256 * 1024;
  // Capacity of each lane's queue, in chunks. A message that needs more than a whole lane
  // is admitted alone into an empty lane.
  int64_t queue_chunks = 1024;
  // Starvation guard: while a higher lane is busy, the lanes below it together still get at
  // least this share of the chunks (one chunk after every floor((1 - s) / s) chunks of
  // strict priority; 0.05 -> 1 in 20). 0 disables the guard. In [0, 0.5].
  double low_lane_min_share = 0.05;
  // The lanes, highest priority first: a permutation of kAllLanes in which kTelemetry comes
  // after kGradient.
  std::array<Lane, kNumLanes> priority = {Lane::kGradient, Lane::kActivation, Lane::kControl,
                                          Lane::kTelemetry};

  // floor((1 - s) / s): chunks sent by strict priority between two guard chunks; 0 when
  // the guard is off.
  int64_t StrictChunksPerGuardChunk() const;
};

// OK, or kInvalidArgument naming the first bad field: chunk_bytes or queue_chunks < 1,
// low_lane_min_share outside [0, 0.5], a priority that is not a permutation of the lanes,
// or telemetry ranked above gradient.
Status ValidateLaneOptions(const LaneOptions& options);

// One message to send on a lane. A plain value.
struct WorkItem {
  uint64_t id = 0;         // the caller's message id, echoed in each chunk
  int64_t size_bytes = 0;  // >= 0; 0 still makes one (empty) chunk
  // Opaque to the scheduler; every chunk of the message carries a copy. The transport that
  // made the item knows its type (e.g. the buffer view and the completion callback) and
  // casts it back. Shared because the chunks leave the queue at different times and the
  // last one to reach the wire decides when the payload may go. May be null.
  std::shared_ptr<void> payload;
};

// One chunk to put on the wire: bytes [offset_bytes, offset_bytes + size_bytes) of message
// `message_id`.
struct Chunk {
  Lane lane = Lane::kGradient;
  uint64_t message_id = 0;
  int64_t offset_bytes = 0;
  int64_t size_bytes = 0;
  int64_t index = 0;  // 0-based position of this chunk in its message
  int64_t count = 1;  // chunks in the message
  std::shared_ptr<void> payload;
  Duration queued_for{};  // from Enqueue's admission to Next, on the scheduler's Clock
  bool guard = false;     // chosen by the starvation guard rather than by strict priority

  bool last() const { return index + 1 == count; }
};

// Counters of one lane since the scheduler was created.
struct LaneMetrics {
  uint64_t enqueued_messages = 0;
  uint64_t enqueued_chunks = 0;
  int64_t enqueued_bytes = 0;
  uint64_t sent_chunks = 0;
  int64_t sent_bytes = 0;
  int64_t depth_chunks = 0;  // queued now
  int64_t depth_bytes = 0;
  int64_t max_depth_chunks = 0;
  Duration total_queued_time{};  // sum over sent chunks of Chunk::queued_for
  // Chunks of this lane sent while a lower lane had chunks queued (this lane preempted it).
  uint64_t preemptions = 0;
  // Chunks of a higher lane sent while this lane had chunks queued.
  uint64_t passed_over = 0;
  // Chunks of this lane sent by the starvation guard.
  uint64_t guard_chunks = 0;
  // Backpressure: Enqueue calls that had to wait for room, those waiting now, and those
  // that gave up at their deadline.
  uint64_t blocked_enqueues = 0;
  int64_t blocked_now = 0;
  uint64_t enqueue_deadline_exceeded = 0;
};

struct LaneSchedulerMetrics {
  std::array<LaneMetrics, kNumLanes> lanes;  // indexed by the Lane's value
  const LaneMetrics& lane(Lane l) const { return lanes[static_cast<size_t>(l)]; }
};

// The send-side queue of a transport: producers Enqueue messages on lanes, the transport's
// thread takes chunks with Next. Next returns the highest non-empty lane's next chunk, except
// that the starvation guard hands one chunk to a waiting lower lane after every
// StrictChunksPerGuardChunk() chunks of strict priority; so a newly queued chunk of the top
// lane waits for at most one other chunk. FIFO within a lane, chunks of a message in order.
// Nothing is ever dropped. Safe for concurrent use (any number of producers; usually one
// consumer).
class LaneScheduler {
 public:
  // kInvalidArgument if ValidateLaneOptions(options) fails. `clock` measures queued time and
  // bounds waits; not owned, and must outlive the scheduler.
  static Result<std::unique_ptr<LaneScheduler>> Create(const LaneOptions& options, Clock* clock);

  // REQUIRES: no call is blocked in Enqueue or Next (Close first, and join the callers).
  virtual ~LaneScheduler() = default;

  // Queues `item` on `lane`, cut into chunks. When the lane lacks room for all its chunks,
  // blocks until the consumer makes room (producers of a lane are admitted in arrival order)
  // or `clock` reaches `deadline`: kDeadlineExceeded, nothing queued. kCancelled after
  // Close() (also for a blocked call), nothing queued. kInvalidArgument for a negative size
  // or an unknown lane.
  virtual Status Enqueue(Lane lane, WorkItem item, TimePoint deadline) = 0;

  // The next chunk to put on the wire. Blocks until one is queued or `clock` reaches
  // `deadline` (kDeadlineExceeded; pass clock->Now() to poll). After Close() it still returns
  // every queued chunk, then kCancelled.
  virtual Result<Chunk> Next(TimePoint deadline) = 0;

  // Wakes every blocked call: later and blocked Enqueue calls return kCancelled; Next drains
  // what is queued, then returns kCancelled. Idempotent; does not block.
  virtual void Close() = 0;

  // A snapshot of the counters; readable at any time.
  virtual LaneSchedulerMetrics metrics() const = 0;

  virtual const LaneOptions& options() const = 0;
};

}  // namespace kc::comm
