// The transport: one rank's ordered, reliable message channels to the other ranks of a
// group, over one kind of link (as gloo's transport/pair.h). Collectives are written against
// this interface; backends live in comm/shm/ (processes of one host) and comm/tcp/ (hosts).
//
//   KC_ASSIGN_OR_RETURN(auto t, CreateShmTransport({.store = store, .rank = r, .size = n}));
//   KC_ASSIGN_OR_RETURN(auto send, t->Send(peer, tag, bytes, Lane::kGradient));
//   KC_ASSIGN_OR_RETURN(auto recv, t->Recv(peer, tag, into));
//   KC_RETURN_IF_ERROR(send->Wait(deadline));
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "comm/lanes.h"

namespace kc::comm {

// One posted send or receive. Safe for concurrent use.
class Request {
 public:
  virtual ~Request() = default;

  // Blocks until the request completes or `deadline` passes on the transport's clock.
  // OK: a send's buffer may be reused; a receive's buffer holds the message.
  // kDeadlineExceeded: still pending (Wait again, or give up and Abort the transport).
  // kInvalidArgument: a receive whose posted size differs from the message's.
  // kUnavailable / kAborted: the peer was lost or the transport aborted (sticky: every
  // pending and later request of the transport fails with it).
  // kUnavailable, not sticky: the peer closed (destroyed) its transport; only requests to and
  // from that peer fail, after what it sent before closing has been received.
  virtual Status Wait(TimePoint deadline) = 0;
  // nullopt while pending; else what Wait would return.
  virtual std::optional<Status> Test() = 0;
};

// What a transport's links did since it was made (Transport::link_stats): a plain value.
struct LinkStats {
  // Its send queues' lanes, summed over peers; absent where it has none (shared memory).
  std::optional<LaneSchedulerMetrics> lanes;
  int connections = 0;       // TCP connections
  uint64_t retransmits = 0;  // TCP segments retransmitted over them (TCP_INFO)
  double max_rtt_s = 0;      // the largest smoothed round-trip time among them
  LinkStats& operator+=(const LinkStats& o);
};

// A rank's endpoint. Send/Recv are safe for concurrent use from several threads.
class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Clock* clock() const = 0;

  // Posts a send of `data` to `peer` with `tag` on `lane`; returns at once. The buffer must
  // stay valid and unchanged until the request completes. Messages from one rank to another
  // with the same tag arrive in posting order; a higher lane's traffic overtakes a lower
  // lane's queued bytes. Zero-length messages are allowed.
  // kInvalidArgument for a bad peer (self included); the sticky error once failed.
  virtual Result<std::shared_ptr<Request>> Send(int peer, uint64_t tag,
                                                std::span<const std::byte> data,
                                                Lane lane = Lane::kGradient) = 0;
  // Posts a receive of exactly data.size() bytes from `peer` with `tag` into `data`; returns
  // at once. Receives from one peer with one tag match messages in order.
  virtual Result<std::shared_ptr<Request>> Recv(int peer, uint64_t tag,
                                                std::span<std::byte> data) = 0;

  // OK, or the first fatal error (sticky until the group is rebuilt with a new transport).
  virtual Status status() const = 0;
  // Fails the transport with `reason` (kAborted if reason is OK): every pending request
  // completes with it and peers see the connection close. Idempotent.
  virtual void Abort(Status reason) = 0;
  // Its links' counters (safe from any thread); a transport without lanes or sockets has none.
  virtual LinkStats link_stats() const { return {}; }
};

}  // namespace kc::comm
