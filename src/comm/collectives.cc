#include "comm/collectives.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "base/layer_guard.h"
#include "comm/reduce.h"

namespace kc::comm {
namespace {

Status CheckReduce(std::string_view name, const AllreduceOptions& o) {
  return CheckReduceArgs(name, o.data, o.count, o.dtype, o.op);
}

// Runs the protocol of one collective call: posts requests, waits with the call's deadline,
// and on the first failure aborts the transport and adds "name step=S rank=R" context.
class Session {
 public:
  Session(Transport& t, std::string_view name, TimePoint deadline, uint64_t tag, Lane lane)
      : t_(t), name_(name), deadline_(deadline), tag_(tag), lane_(lane) {}

  // One ring step: sends `out` to `to` and receives `in` from `from`, concurrently.
  // Empty buffers are skipped on both sides (both know the chunk sizes).
  Status Exchange(int step, int to, std::span<const std::byte> out, int from,
                  std::span<std::byte> in) {
    std::shared_ptr<Request> send;
    std::shared_ptr<Request> recv;
    if (!in.empty()) {
      Result<std::shared_ptr<Request>> r = t_.Recv(from, tag_, in);
      if (!r.ok()) return Fail(step, r.status());
      recv = *std::move(r);
    }
    if (!out.empty()) {
      Result<std::shared_ptr<Request>> s = t_.Send(to, tag_, out, lane_);
      if (!s.ok()) return Fail(step, s.status());
      send = *std::move(s);
    }
    if (recv != nullptr) {
      if (Status s = recv->Wait(deadline_); !s.ok()) return Fail(step, s);
    }
    if (send != nullptr) {
      if (Status s = send->Wait(deadline_); !s.ok()) return Fail(step, s);
    }
    return OkStatus();
  }

  Status SendTo(int step, int to, std::span<const std::byte> out) {
    Result<std::shared_ptr<Request>> s = t_.Send(to, tag_, out, lane_);
    if (!s.ok()) return Fail(step, s.status());
    pending_.push_back(*std::move(s));
    return OkStatus();
  }
  Status RecvFrom(int step, int from, std::span<std::byte> in) {
    Result<std::shared_ptr<Request>> r = t_.Recv(from, tag_, in);
    if (!r.ok()) return Fail(step, r.status());
    if (Status s = (*r)->Wait(deadline_); !s.ok()) return Fail(step, s);
    return OkStatus();
  }
  // Waits for every request posted by SendTo.
  Status WaitSends(int step) {
    for (const std::shared_ptr<Request>& r : pending_) {
      if (Status s = r->Wait(deadline_); !s.ok()) return Fail(step, s);
    }
    pending_.clear();
    return OkStatus();
  }

 private:
  Status Fail(int step, const Status& s) {
    t_.Abort(s);  // peers blocked on this rank fail now rather than at their deadline
    return s.WithContext(std::string(name_) + " step=" + std::to_string(step) +
                         " rank=" + std::to_string(t_.rank()));
  }

  Transport& t_;
  std::string_view name_;
  TimePoint deadline_;
  uint64_t tag_;
  Lane lane_;
  std::vector<std::shared_ptr<Request>> pending_;
};

int Mod(int a, int n) { return ((a % n) + n) % n; }

std::span<std::byte> ChunkBytes(std::span<std::byte> data, size_t count, int size, int index,
                                size_t esize) {
  const ChunkRange c = ChunkOf(count, size, index);
  return data.subspan(c.offset * esize, c.count * esize);
}

// Ring reduce-scatter, steps [first_step, first_step + size - 1). Afterwards rank r holds
// the reduced chunk r.
Status RingReduceScatter(Session& session, Transport& t, const AllreduceOptions& o,
                         int first_step) {
  const int n = t.size();
  const int r = t.rank();
  const size_t esize = hal::DataTypeSize(o.dtype);
  const ReduceOp op = o.op == ReduceOp::kAvg ? ReduceOp::kSum : o.op;
  // One scratch buffer per call, as large as the largest chunk (chunk 0). Allocating per call
  // is a known cost; a communicator-owned arena is the follow-up.
  std::vector<std::byte> scratch(ChunkOf(o.count, n, 0).count * esize);
  for (int s = 0; s < n - 1; ++s) {
    // Step s: send our partial chunk r-s-1 to the right neighbour, receive the left
    // neighbour's partial chunk r-s-2 and fold it into ours. After n-1 steps, chunk r has
    // passed through every rank and ends here fully reduced.
    const int send_chunk = Mod(r - s - 1, n);
    const int recv_chunk = Mod(r - s - 2, n);
    std::span<std::byte> out = ChunkBytes(o.data, o.count, n, send_chunk, esize);
    std::span<std::byte> mine = ChunkBytes(o.data, o.count, n, recv_chunk, esize);
    std::span<std::byte> in = std::span(scratch).first(mine.size());
    KC_RETURN_IF_ERROR(session.Exchange(first_step + s, Mod(r + 1, n), out, Mod(r - 1, n), in));
    ReduceElements(o.dtype, op, mine.data(), mine.data(), in.data(), mine.size() / esize);
  }
  return OkStatus();
}

// Ring all-gather, steps [first_step, first_step + size - 1). Rank r starts with chunk r.
Status RingAllgather(Session& session, Transport& t, std::span<std::byte> data, size_t count,
                     size_t esize, int first_step) {
  const int n = t.size();
  const int r = t.rank();
  for (int s = 0; s < n - 1; ++s) {
    // Step s: forward chunk r-s (ours at s=0, then the one just received) to the right
    // neighbour, and receive chunk r-s-1 from the left neighbour straight into place.
    std::span<std::byte> out = ChunkBytes(data, count, n, Mod(r - s, n), esize);
    std::span<std::byte> in = ChunkBytes(data, count, n, Mod(r - s - 1, n), esize);
    KC_RETURN_IF_ERROR(session.Exchange(first_step + s, Mod(r + 1, n), out, Mod(r - 1, n), in));
  }
  return OkStatus();
}

}  // namespace

ChunkRange ChunkOf(size_t total, int size, int index) {
  const size_t n = static_cast<size_t>(size);
  const size_t i = static_cast<size_t>(index);
  const size_t base = total / n;
  const size_t extra = total % n;
  return {.offset = i * base + std::min(i, extra), .count = base + (i < extra ? 1 : 0)};
}

Status Allreduce(Transport& transport, const AllreduceOptions& options) {
  KC_LAYER_ENTRY(Layer::kComm, "communicator");
  KC_RETURN_IF_ERROR(CheckReduce("allreduce", options));
  const int n = transport.size();
  if (n == 1 || options.count == 0) return OkStatus();
  Session session(transport, "allreduce", options.deadline, options.tag, options.lane);
  // Steps 0 .. n-2: reduce-scatter, leaving rank r with the reduced chunk r.
  KC_RETURN_IF_ERROR(RingReduceScatter(session, transport, options, 0));
  const size_t esize = hal::DataTypeSize(options.dtype);
  // Avg: scale only the chunk this rank owns, so each element is scaled exactly once.
  if (options.op == ReduceOp::kAvg) {
    std::span<std::byte> mine = ChunkBytes(options.data, options.count, n, transport.rank(), esize);
    ScaleByInverse(options.dtype, mine.data(), mine.size() / esize, n);
  }
  // Steps n-1 .. 2n-3: all-gather the reduced chunks.
  return RingAllgather(session, transport, options.data, options.count, esize, n - 1);
}

Status ReduceScatter(Transport& transport, const ReduceScatterOptions& options) {
  KC_LAYER_ENTRY(Layer::kComm, "communicator");
  KC_RETURN_IF_ERROR(CheckReduce("reduce_scatter", options));
  const int n = transport.size();
  if (n == 1 || options.count == 0) return OkStatus();
  Session session(transport, "reduce_scatter", options.deadline, options.tag, options.lane);
  KC_RETURN_IF_ERROR(RingReduceScatter(session, transport, options, 0));
  if (options.op == ReduceOp::kAvg) {
    const size_t esize = hal::DataTypeSize(options.dtype);
    std::span<std::byte> mine = ChunkBytes(options.data, options.count, n, transport.rank(), esize);
    ScaleByInverse(options.dtype, mine.data(), mine.size() / esize, n);
  }
  return OkStatus();
}

Status Allgather(Transport& transport, const AllgatherOptions& options) {
  KC_LAYER_ENTRY(Layer::kComm, "communicator");
  KC_RETURN_IF_ERROR(CheckBuffer("allgather", options.data, options.count, options.dtype));
  const int n = transport.size();
  if (n == 1 || options.count == 0) return OkStatus();
  Session session(transport, "allgather", options.deadline, options.tag, options.lane);
  return RingAllgather(session, transport, options.data, options.count,
                       hal::DataTypeSize(options.dtype), 0);
}

Status Broadcast(Transport& transport, const BroadcastOptions& options) {
  KC_LAYER_ENTRY(Layer::kComm, "communicator");
  const int n = transport.size();
  if (options.root < 0 || options.root >= n) {
    return InvalidArgumentError("broadcast: root " + std::to_string(options.root) +
                                " outside [0, " + std::to_string(n) + ")");
  }
  if (n == 1 || options.data.empty()) return OkStatus();
  Session session(transport, "broadcast", options.deadline, options.tag, options.lane);
  const int vr = Mod(transport.rank() - options.root, n);  // rank relative to the root
  // Receive: a non-root rank gets the data from its parent, vr minus its lowest set bit.
  int mask = 1;
  int step = 0;
  while (mask < n) {
    if ((vr & mask) != 0) {
      KC_RETURN_IF_ERROR(session.RecvFrom(step, Mod(vr - mask + options.root, n), options.data));
      break;
    }
    mask <<= 1;
    ++step;
  }
  // Forward: send to children vr + mask for every lower bit, largest subtree first.
  for (mask >>= 1; mask > 0; mask >>= 1) {
    ++step;
    if (vr + mask < n) {
      KC_RETURN_IF_ERROR(session.SendTo(step, Mod(vr + mask + options.root, n), options.data));
    }
  }
  return session.WaitSends(step);
}

Status Barrier(Transport& transport, const BarrierOptions& options) {
  KC_LAYER_ENTRY(Layer::kComm, "communicator");
  const int n = transport.size();
  if (n == 1) return OkStatus();
  Session session(transport, "barrier", options.deadline, options.tag, options.lane);
  const int r = transport.rank();
  const std::byte token_out{1};
  std::byte token_in{0};
  int step = 0;
  for (int k = 1; k < n; k <<= 1, ++step) {
    // Round k: tell rank r+k we are here and wait for rank r-k; after ceil(log2 n) rounds
    // every rank has heard, directly or transitively, from every other.
    KC_RETURN_IF_ERROR(session.Exchange(step, Mod(r + k, n), std::span(&token_out, 1),
                                        Mod(r - k, n), std::span(&token_in, 1)));
  }
  return OkStatus();
}

}  // namespace kc::comm
