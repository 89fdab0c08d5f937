// LaneScheduler: per-lane FIFO queues of messages, cut into chunks as they leave.
#include "comm/lanes.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <string>
#include <utility>

#include "base/check.h"
#include "base/layer_guard.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "comm/transport.h"

namespace kc::comm {

std::string_view LaneName(Lane lane) {
  switch (lane) {
    case Lane::kGradient:
      return "gradient";
    case Lane::kActivation:
      return "activation";
    case Lane::kControl:
      return "control";
    case Lane::kTelemetry:
      return "telemetry";
  }
  return "unknown";
}

std::optional<Lane> LaneFromName(std::string_view name) {
  for (Lane lane : kAllLanes) {
    if (LaneName(lane) == name) return lane;
  }
  return std::nullopt;
}

int64_t LaneOptions::StrictChunksPerGuardChunk() const {
  if (!(low_lane_min_share > 0)) return 0;
  // The epsilon keeps shares such as 0.05 (19.000000000000004 or 18.999999999999996 before
  // rounding) on the intended integer.
  return std::max<int64_t>(
      1, static_cast<int64_t>(std::floor((1 - low_lane_min_share) / low_lane_min_share + 1e-9)));
}

Status ValidateLaneOptions(const LaneOptions& options) {
  if (options.chunk_bytes < 1) {
    return InvalidArgumentError("lanes: chunk_bytes must be >= 1, got " +
                                std::to_string(options.chunk_bytes));
  }
  if (options.queue_chunks < 1) {
    return InvalidArgumentError("lanes: queue_chunks must be >= 1, got " +
                                std::to_string(options.queue_chunks));
  }
  if (!(options.low_lane_min_share >= 0 && options.low_lane_min_share <= 0.5)) {
    return InvalidArgumentError("lanes: low_lane_min_share must be in [0, 0.5], got " +
                                std::to_string(options.low_lane_min_share));
  }
  std::array<int, kNumLanes> position{};
  position.fill(-1);
  for (int p = 0; p < kNumLanes; ++p) {
    const auto value = static_cast<size_t>(options.priority[static_cast<size_t>(p)]);
    if (value >= kNumLanes || position[value] >= 0) {
      return InvalidArgumentError(
          "lanes: priority must name each of gradient, activation, control, telemetry once");
    }
    position[value] = p;
  }
  if (position[static_cast<size_t>(Lane::kTelemetry)] <
      position[static_cast<size_t>(Lane::kGradient)]) {
    return InvalidArgumentError(
        "lanes: telemetry cannot rank above gradient (logging at top priority stalls gradient "
        "sync)");
  }
  return OkStatus();
}

namespace {

// One queued message; its chunks are cut as they leave.
struct PendingMessage {
  WorkItem item;
  int64_t num_chunks;
  int64_t next_chunk;
  TimePoint enqueued_at;
};

// One lane's queue, its line of blocked producers and its counters.
struct LaneQueue {
  std::deque<PendingMessage> messages;
  std::deque<uint64_t> line;  // tickets of blocked producers, in arrival order
  // Chunks of other lanes sent since this lane last sent, while it had chunks queued: the
  // guard serves the lower lane that has waited longest.
  int64_t passed_run = 0;
  LaneMetrics metrics;
};

class LaneSchedulerImpl final : public LaneScheduler {
 public:
  LaneSchedulerImpl(const LaneOptions& options, Clock* clock)
      : options_(options), strict_per_guard_(options.StrictChunksPerGuardChunk()), clock_(clock) {
    for (int p = 0; p < kNumLanes; ++p) {
      position_[static_cast<size_t>(options_.priority[static_cast<size_t>(p)])] = p;
    }
  }

  ~LaneSchedulerImpl() override {
    MutexLock lock(&mu_);
    for (const LaneQueue& q : lanes_) {
      KC_CHECK(q.line.empty()) << "LaneScheduler destroyed while Enqueue calls wait";
    }
  }

  Status Enqueue(Lane lane, WorkItem item, TimePoint deadline) override;
  Result<Chunk> Next(TimePoint deadline) override;
  void Close() override;
  LaneSchedulerMetrics metrics() const override;
  const LaneOptions& options() const override { return options_; }

 private:
  // Whether a message of `chunks` chunks may join `q` now. A message larger than a whole
  // lane is admitted into an empty lane, so it cannot wait forever.
  bool Fits(const LaneQueue& q, int64_t chunks) const KC_REQUIRES(mu_) {
    return q.metrics.depth_chunks == 0 || q.metrics.depth_chunks + chunks <= options_.queue_chunks;
  }
  void Admit(LaneQueue& q, WorkItem item, int64_t chunks) KC_REQUIRES(mu_);
  // The priority position to send from next, and whether the guard chose it. Updates the
  // guard state and the preemption counters. REQUIRES: queued_chunks_ > 0.
  int Pick(bool* guard) KC_REQUIRES(mu_);

  // Immutable after construction.
  const LaneOptions options_;
  const int64_t strict_per_guard_;
  Clock* const clock_;                     // not owned; outlives this (Create's contract)
  std::array<int, kNumLanes> position_{};  // Lane value -> position in options_.priority

  mutable Mutex mu_;
  CondVar not_empty_;  // a chunk was queued, or Close
  CondVar room_;       // a lane's line moved or its queue shrank, or Close
  // Guarded by mu_.
  std::array<LaneQueue, kNumLanes> lanes_ KC_GUARDED_BY(mu_);  // by priority position
  int64_t queued_chunks_ KC_GUARDED_BY(mu_) = 0;               // over all lanes
  int64_t strict_since_guard_ KC_GUARDED_BY(mu_) = 0;
  uint64_t next_ticket_ KC_GUARDED_BY(mu_) = 0;
  bool closed_ KC_GUARDED_BY(mu_) = false;
};

Status LaneSchedulerImpl::Enqueue(Lane lane, WorkItem item, TimePoint deadline) {
  KC_LAYER_ENTRY(Layer::kComm, "lanes");
  if (static_cast<size_t>(lane) >= kNumLanes) {
    return InvalidArgumentError("lanes: unknown lane " + std::to_string(static_cast<int>(lane)));
  }
  if (item.size_bytes < 0) {
    return InvalidArgumentError("lanes: negative message size " + std::to_string(item.size_bytes));
  }
  const int64_t chunks = std::max<int64_t>(
      1, item.size_bytes / options_.chunk_bytes + (item.size_bytes % options_.chunk_bytes != 0));

  MutexLock lock(&mu_);
  if (closed_) return CancelledError("lanes: scheduler closed");
  LaneQueue& q = lanes_[static_cast<size_t>(position_[static_cast<size_t>(lane)])];
  if (q.line.empty() && Fits(q, chunks)) {
    Admit(q, std::move(item), chunks);
    return OkStatus();
  }
  // Wait in line: producers of a lane are admitted in arrival order, so a large message is
  // not overtaken forever by small ones that fit sooner.
  const uint64_t ticket = next_ticket_++;
  q.line.push_back(ticket);
  ++q.metrics.blocked_enqueues;
  ++q.metrics.blocked_now;
  const bool ready = AwaitWithDeadline(clock_, &room_, &mu_, deadline, [&]() KC_REQUIRES(mu_) {
    return closed_ || (q.line.front() == ticket && Fits(q, chunks));
  });
  q.line.erase(std::find(q.line.begin(), q.line.end(), ticket));
  --q.metrics.blocked_now;
  room_.SignalAll();  // the next producer in line may fit now
  if (closed_) return CancelledError("lanes: scheduler closed while waiting for room");
  if (!ready) {
    ++q.metrics.enqueue_deadline_exceeded;
    return DeadlineExceededError("lanes: no room on lane " + std::string(LaneName(lane)) +
                                 " before the deadline");
  }
  Admit(q, std::move(item), chunks);
  return OkStatus();
}

void LaneSchedulerImpl::Admit(LaneQueue& q, WorkItem item, int64_t chunks) {
  LaneMetrics& m = q.metrics;
  ++m.enqueued_messages;
  m.enqueued_chunks += static_cast<uint64_t>(chunks);
  m.enqueued_bytes += item.size_bytes;
  m.depth_chunks += chunks;
  m.depth_bytes += item.size_bytes;
  m.max_depth_chunks = std::max(m.max_depth_chunks, m.depth_chunks);
  queued_chunks_ += chunks;
  q.messages.push_back(PendingMessage{.item = std::move(item),
                                      .num_chunks = chunks,
                                      .next_chunk = 0,
                                      .enqueued_at = clock_->Now()});
  not_empty_.SignalAll();
}

int LaneSchedulerImpl::Pick(bool* guard) {
  int top = 0;
  while (top < kNumLanes - 1 && lanes_[static_cast<size_t>(top)].metrics.depth_chunks == 0) ++top;
  KC_DCHECK(lanes_[static_cast<size_t>(top)].metrics.depth_chunks > 0);
  // The waiting lower lane that was passed over longest (the higher one on a tie).
  int starved = -1;
  for (int p = top + 1; p < kNumLanes; ++p) {
    const LaneQueue& q = lanes_[static_cast<size_t>(p)];
    if (q.metrics.depth_chunks > 0 &&
        (starved < 0 || q.passed_run > lanes_[static_cast<size_t>(starved)].passed_run)) {
      starved = p;
    }
  }
  int pick = top;
  *guard = false;
  if (starved < 0) {
    strict_since_guard_ = 0;  // nothing below waits
  } else if (strict_per_guard_ > 0 && strict_since_guard_ >= strict_per_guard_) {
    pick = starved;
    *guard = true;
    strict_since_guard_ = 0;
  } else {
    ++strict_since_guard_;
  }
  bool preempted_lower = false;
  for (int p = 0; p < kNumLanes; ++p) {
    LaneQueue& q = lanes_[static_cast<size_t>(p)];
    if (p == pick || q.metrics.depth_chunks == 0) continue;
    ++q.passed_run;
    if (p > pick) {
      ++q.metrics.passed_over;
      preempted_lower = true;
    }
  }
  LaneQueue& chosen = lanes_[static_cast<size_t>(pick)];
  chosen.passed_run = 0;
  if (preempted_lower) ++chosen.metrics.preemptions;
  if (*guard) ++chosen.metrics.guard_chunks;
  return pick;
}

Result<Chunk> LaneSchedulerImpl::Next(TimePoint deadline) {
  KC_LAYER_ENTRY(Layer::kComm, "lanes");
  MutexLock lock(&mu_);
  AwaitWithDeadline(clock_, &not_empty_, &mu_, deadline,
                    [&]() KC_REQUIRES(mu_) { return closed_ || queued_chunks_ > 0; });
  if (queued_chunks_ == 0) {
    if (closed_) return CancelledError("lanes: scheduler closed and drained");
    return DeadlineExceededError("lanes: nothing to send before the deadline");
  }
  bool guard = false;
  const int pos = Pick(&guard);
  LaneQueue& q = lanes_[static_cast<size_t>(pos)];
  PendingMessage& msg = q.messages.front();

  Chunk chunk;
  chunk.lane = options_.priority[static_cast<size_t>(pos)];
  chunk.message_id = msg.item.id;
  chunk.index = msg.next_chunk;
  chunk.count = msg.num_chunks;
  chunk.offset_bytes = msg.next_chunk * options_.chunk_bytes;
  chunk.size_bytes = std::min(options_.chunk_bytes, msg.item.size_bytes - chunk.offset_bytes);
  chunk.queued_for = clock_->Now() - msg.enqueued_at;
  chunk.guard = guard;
  if (++msg.next_chunk == msg.num_chunks) {
    chunk.payload = std::move(msg.item.payload);
    q.messages.pop_front();
  } else {
    chunk.payload = msg.item.payload;
  }

  LaneMetrics& m = q.metrics;
  ++m.sent_chunks;
  m.sent_bytes += chunk.size_bytes;
  --m.depth_chunks;
  m.depth_bytes -= chunk.size_bytes;
  m.total_queued_time += chunk.queued_for;
  --queued_chunks_;
  if (!q.line.empty()) room_.SignalAll();
  return chunk;
}

void LaneSchedulerImpl::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  not_empty_.SignalAll();
  room_.SignalAll();
}

LaneSchedulerMetrics LaneSchedulerImpl::metrics() const {
  MutexLock lock(&mu_);
  LaneSchedulerMetrics out;
  for (int p = 0; p < kNumLanes; ++p) {
    out.lanes[static_cast<size_t>(options_.priority[static_cast<size_t>(p)])] =
        lanes_[static_cast<size_t>(p)].metrics;
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<LaneScheduler>> LaneScheduler::Create(const LaneOptions& options,
                                                             Clock* clock) {
  KC_LAYER_ENTRY(Layer::kComm, "lanes");
  KC_CHECK(clock != nullptr) << "LaneScheduler needs a clock";
  KC_RETURN_IF_ERROR(ValidateLaneOptions(options));
  return std::unique_ptr<LaneScheduler>(std::make_unique<LaneSchedulerImpl>(options, clock));
}

LinkStats& LinkStats::operator+=(const LinkStats& o) {
  if (o.lanes) {
    if (!lanes) lanes.emplace();
    for (size_t l = 0; l < o.lanes->lanes.size(); ++l) {
      LaneMetrics& m = lanes->lanes[l];
      const LaneMetrics& x = o.lanes->lanes[l];
      m.enqueued_messages += x.enqueued_messages;
      m.enqueued_chunks += x.enqueued_chunks;
      m.enqueued_bytes += x.enqueued_bytes;
      m.sent_chunks += x.sent_chunks;
      m.sent_bytes += x.sent_bytes;
      m.depth_chunks += x.depth_chunks;
      m.depth_bytes += x.depth_bytes;
      m.max_depth_chunks = std::max(m.max_depth_chunks, x.max_depth_chunks);
      m.total_queued_time += x.total_queued_time;
      m.preemptions += x.preemptions;
      m.passed_over += x.passed_over;
      m.guard_chunks += x.guard_chunks;
      m.blocked_enqueues += x.blocked_enqueues;
      m.blocked_now += x.blocked_now;
      m.enqueue_deadline_exceeded += x.enqueue_deadline_exceeded;
    }
  }
  connections += o.connections;
  retransmits += o.retransmits;
  max_rtt_s = std::max(max_rtt_s, o.max_rtt_s);
  return *this;
}

}  // namespace kc::comm
