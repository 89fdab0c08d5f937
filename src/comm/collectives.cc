#include "comm/collectives.h"

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/layer_guard.h"
#include "comm/reduce.h"
#include "comm/subgroup_transport.h"

namespace kc::comm {
namespace {

Status CheckReduce(std::string_view name, const AllreduceOptions& o) {
  KC_RETURN_IF_ERROR(CheckReduceArgs(name, o.data, o.count, o.dtype, o.op));
  return CheckWire(name, o.dtype, o.op, o.wire);
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
  // Posts a send without waiting; Await it later.
  Result<std::shared_ptr<Request>> PostSend(int step, int to, std::span<const std::byte> out) {
    Result<std::shared_ptr<Request>> s = t_.Send(to, tag_, out, lane_);
    if (!s.ok()) return Fail(step, s.status());
    return s;
  }
  // Posts a receive without waiting; Await it later.
  Result<std::shared_ptr<Request>> PostRecv(int step, int from, std::span<std::byte> in) {
    Result<std::shared_ptr<Request>> r = t_.Recv(from, tag_, in);
    if (!r.ok()) return Fail(step, r.status());
    return r;
  }
  Status Await(int step, const std::shared_ptr<Request>& r) {
    if (r == nullptr) return OkStatus();
    if (Status s = r->Wait(deadline_); !s.ok()) return Fail(step, s);
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

// The ring's segment size (RingSegments).
constexpr size_t kRingSegmentBytes = 1 << 20;

std::span<std::byte> ChunkBytes(std::span<std::byte> data, size_t count, int size, int index,
                                size_t esize) {
  const ChunkRange c = ChunkOf(count, size, index);
  return data.subspan(c.offset * esize, c.count * esize);
}

// Scratch for received blocks, kept per thread and reused by every call (a thread runs one
// collective at a time; slot 0 and 1 are two buffers one call may use at once). Allocating
// per call would map large buffers afresh each time: on hosts where fresh pages fault in
// slowly (VMs that hand memory back to the host) that costs more than the collective. The
// memory stays with the thread, as large as the largest block it received.
std::span<std::byte> Scratch(int slot, size_t bytes) {
  struct Buffer {
    std::unique_ptr<std::byte[]> data;
    size_t capacity = 0;
  };
  thread_local std::array<Buffer, 2> buffers;
  Buffer& b = buffers[static_cast<size_t>(slot)];
  if (b.capacity < bytes) {
    b.data.reset(new std::byte[bytes]);  // uninitialised: every use writes before reading
    b.capacity = bytes;
  }
  return {b.data.get(), bytes};
}

// Ring reduce-scatter, steps [first_step, first_step + size - 1). Afterwards rank r holds
// the reduced chunk r.
Status RingReduceScatter(Session& session, Transport& t, const AllreduceOptions& o,
                         int first_step) {
  const int n = t.size();
  const int r = t.rank();
  const size_t esize = hal::DataTypeSize(o.dtype);
  const ReduceOp op = o.op == ReduceOp::kAvg ? ReduceOp::kSum : o.op;
  // As large as the largest chunk (chunk 0).
  std::span<std::byte> scratch = Scratch(0, ChunkOf(o.count, n, 0).count * esize);
  for (int s = 0; s < n - 1; ++s) {
    // Step s: send our partial chunk r-s-1 to the right neighbour, receive the left
    // neighbour's partial chunk r-s-2 and fold it into ours. After n-1 steps, chunk r has
    // passed through every rank and ends here fully reduced.
    const int send_chunk = Mod(r - s - 1, n);
    const int recv_chunk = Mod(r - s - 2, n);
    std::span<std::byte> out = ChunkBytes(o.data, o.count, n, send_chunk, esize);
    std::span<std::byte> mine = ChunkBytes(o.data, o.count, n, recv_chunk, esize);
    std::span<std::byte> in = scratch.first(mine.size());
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

// Segments per ring chunk for a chunk of `chunk_bytes`: a chunk travels and is reduced in
// segments, so that a rank reduces (and forwards) one segment while the next is still on the
// wire, instead of waiting for the whole chunk at every step. Fewer and larger segments cost
// fewer messages; more and smaller ones overlap more.
// Between two namespace hosts over a veth shaped to 10 Gbit/s, 1 MiB segments took a 64 MiB
// all-reduce from 77% of the link's measured limit to 94-111% (bench/comm/wire_netns.sh).
int RingSegments(size_t chunk_bytes) {
  return static_cast<int>(
      std::clamp<size_t>((chunk_bytes + kRingSegmentBytes - 1) / kRingSegmentBytes, 1, 1024));
}

// The ring allreduce (Allreduce's body, after argument checks): ring reduce-scatter then
// ring all-gather, 2(n-1) steps, each moving one chunk, pipelined by segments. Step s < n-1
// receives the left neighbour's partial chunk r-s-2 into scratch slot s, folds it into ours
// and sends the result on as step s+1 (the last reduce-scatter step yields chunk r, final,
// which is the all-gather's first send); all-gather step n-1+t receives the final chunk
// r-t-1 in place and forwards it as step n+t. Every step goes segment by segment: segment j
// is reduced and sent on as soon as it has arrived, while segment j+1 is on the wire.
//
// Receives are posted ahead, so that the neighbour's data lands in place as it arrives
// instead of being buffered by the transport as an early (unexpected) message and copied
// again: every reduce-scatter receive before the first send, and the all-gather's receive
// into segment j of chunk c as soon as this rank's send of that segment has completed. A
// receive is never posted into memory a send still reads: the protocol alone would keep the
// two apart (the final value of a chunk exists only after the right neighbour has all of
// this rank's contribution), but through other processes, which neither the transports nor
// TSan see. Messages to the right go in (step, segment) order, as the right neighbour posts
// its receives, so the transport's per-tag order matches them.
Status RingAllreduce(Transport& transport, const AllreduceOptions& o) {
  const int n = transport.size();
  if (n == 1 || o.count == 0) return OkStatus();
  Session session(transport, "allreduce", o.deadline, o.tag, o.lane);
  const int r = transport.rank();
  const int left = Mod(r - 1, n);
  const int right = Mod(r + 1, n);
  const size_t esize = hal::DataTypeSize(o.dtype);
  const ReduceOp op = o.op == ReduceOp::kAvg ? ReduceOp::kSum : o.op;
  const size_t slot = ChunkOf(o.count, n, 0).count * esize;  // the largest chunk
  const int segs = RingSegments(slot);
  std::span<std::byte> scratch = Scratch(0, static_cast<size_t>(n - 1) * slot);
  // Segment j of chunk `index` (mod n): its elements within the chunk's.
  auto part = [&](int index, int j) {
    const ChunkRange c = ChunkOf(o.count, n, Mod(index, n));
    const ChunkRange p = ChunkOf(c.count, segs, j);
    return std::pair{c, p};
  };
  // The segment in the data, and in scratch slot s.
  auto seg = [&](int index, int j) {
    const auto [c, p] = part(index, j);
    return o.data.subspan((c.offset + p.offset) * esize, p.count * esize);
  };
  auto scratch_seg = [&](int s, int index, int j) {
    const auto [c, p] = part(index, j);
    return scratch.subspan(s * slot + p.offset * esize, p.count * esize);
  };
  const int steps = 2 * (n - 1);
  std::vector<std::shared_ptr<Request>> recvs(static_cast<size_t>(steps) * segs);
  std::vector<std::shared_ptr<Request>> sends(static_cast<size_t>(steps) * segs);
  auto at = [segs](int step, int j) { return static_cast<size_t>(step) * segs + j; };
  auto send = [&](int step, int j, std::span<const std::byte> out) -> Status {
    if (out.empty()) return OkStatus();
    KC_ASSIGN_OR_RETURN(sends[at(step, j)], session.PostSend(step, right, out));
    return OkStatus();
  };
  auto recv = [&](int step, int j, std::span<std::byte> in) -> Status {
    if (in.empty()) return OkStatus();
    KC_ASSIGN_OR_RETURN(recvs[at(step, j)], session.PostRecv(step, left, in));
    return OkStatus();
  };
  for (int s = 0; s < n - 1; ++s) {
    for (int j = 0; j < segs; ++j) KC_RETURN_IF_ERROR(recv(s, j, scratch_seg(s, r - s - 2, j)));
  }
  for (int j = 0; j < segs; ++j) KC_RETURN_IF_ERROR(send(0, j, seg(r - 1, j)));
  for (int s = 0; s < n - 1; ++s) {
    for (int j = 0; j < segs; ++j) {
      // Segment j of chunk r-s-1 is sent: the all-gather's final value may come into it.
      KC_RETURN_IF_ERROR(session.Await(s, sends[at(s, j)]));
      KC_RETURN_IF_ERROR(recv(n - 1 + s, j, seg(r - s - 1, j)));
      KC_RETURN_IF_ERROR(session.Await(s, recvs[at(s, j)]));
      std::span<std::byte> mine = seg(r - s - 2, j);
      ReduceElements(o.dtype, op, mine.data(), mine.data(), scratch_seg(s, r - s - 2, j).data(),
                     mine.size() / esize);
      // Avg: the last step completes chunk r, which only this rank owns: scale it once.
      if (s == n - 2 && o.op == ReduceOp::kAvg) {
        ScaleByInverse(o.dtype, mine.data(), mine.size() / esize, n);
      }
      KC_RETURN_IF_ERROR(send(s + 1, j, mine));
    }
  }
  for (int t = 0; t < n - 1; ++t) {
    for (int j = 0; j < segs; ++j) {
      KC_RETURN_IF_ERROR(session.Await(n - 1 + t, recvs[at(n - 1 + t, j)]));
      if (t + 1 < n - 1) KC_RETURN_IF_ERROR(send(n + t, j, seg(r - t - 1, j)));
    }
  }
  for (int step = 0; step < steps; ++step) {
    for (int j = 0; j < segs; ++j) KC_RETURN_IF_ERROR(session.Await(step, sends[at(step, j)]));
  }
  return OkStatus();
}

// The bf16 wire's conversions (round to nearest even, as hal::FloatToBf16).
void ToWire(std::span<const float> in, hal::Bf16* out) {
  for (size_t i = 0; i < in.size(); ++i) out[i] = hal::FloatToBf16(in[i]);
}
void FromWire(const hal::Bf16* in, std::span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = hal::Bf16ToFloat(in[i]);
}
void AddFromWire(const hal::Bf16* in, std::span<float> acc) {
  for (size_t i = 0; i < acc.size(); ++i) acc[i] += hal::Bf16ToFloat(in[i]);
}

// RingAllreduce with the bf16 wire (WireFormat::kBf16), the same steps and segments: every
// send is a bf16 copy of the segment (the partial sums, then the final values), every receive
// lands in a wire buffer of its own, so all of them are posted up front; the reduce-scatter
// adds what it receives into the f32 data, the all-gather writes it in place and forwards the
// received bytes as they are. The owner of a chunk rounds its final values once, keeping
// what it sends, so that every rank ends with the same values.
Status RingAllreduceBf16(Transport& transport, const AllreduceOptions& o) {
  const int n = transport.size();
  if (n == 1 || o.count == 0) return OkStatus();
  Session session(transport, "allreduce", o.deadline, o.tag, o.lane);
  const int r = transport.rank();
  const int left = Mod(r - 1, n);
  const int right = Mod(r + 1, n);
  float* const data = reinterpret_cast<float*>(o.data.data());
  const size_t slot = ChunkOf(o.count, n, 0).count;  // the largest chunk, elements
  const int segs = RingSegments(slot * sizeof(hal::Bf16));
  const int steps = 2 * (n - 1);
  // Wire buffers: a slot per step's receive, and per send of steps 0 .. n-1 (later sends
  // forward what was received).
  hal::Bf16* const received = reinterpret_cast<hal::Bf16*>(
      Scratch(0, static_cast<size_t>(steps) * slot * sizeof(hal::Bf16)).data());
  hal::Bf16* const sent = reinterpret_cast<hal::Bf16*>(
      Scratch(1, static_cast<size_t>(n) * slot * sizeof(hal::Bf16)).data());
  auto part = [&](int index, int j) {
    const ChunkRange c = ChunkOf(o.count, n, Mod(index, n));
    const ChunkRange p = ChunkOf(c.count, segs, j);
    return std::pair{c, p};
  };
  auto seg = [&](int index, int j) {
    const auto [c, p] = part(index, j);
    return std::span<float>(data + c.offset + p.offset, p.count);
  };
  auto wire = [&](hal::Bf16* base, int step, int index, int j) {
    const auto [c, p] = part(index, j);
    return std::span<hal::Bf16>(base + static_cast<size_t>(step) * slot + p.offset, p.count);
  };
  // The chunk step `step` receives: the reduce-scatter's partial chunk r-s-2, then the
  // all-gather's final chunk r-t-1.
  auto received_chunk = [&](int step) {
    return step < n - 1 ? r - step - 2 : r - (step - n + 1) - 1;
  };
  std::vector<std::shared_ptr<Request>> recvs(static_cast<size_t>(steps) * segs);
  std::vector<std::shared_ptr<Request>> sends(static_cast<size_t>(steps) * segs);
  auto at = [segs](int step, int j) { return static_cast<size_t>(step) * segs + j; };
  auto send = [&](int step, int j, std::span<const hal::Bf16> out) -> Status {
    if (out.empty()) return OkStatus();
    KC_ASSIGN_OR_RETURN(sends[at(step, j)], session.PostSend(step, right, std::as_bytes(out)));
    return OkStatus();
  };
  for (int step = 0; step < steps; ++step) {
    for (int j = 0; j < segs; ++j) {
      std::span<hal::Bf16> in = wire(received, step, received_chunk(step), j);
      if (in.empty()) continue;
      KC_ASSIGN_OR_RETURN(recvs[at(step, j)],
                          session.PostRecv(step, left, std::as_writable_bytes(in)));
    }
  }
  for (int j = 0; j < segs; ++j) {
    std::span<hal::Bf16> out = wire(sent, 0, r - 1, j);
    ToWire(seg(r - 1, j), out.data());
    KC_RETURN_IF_ERROR(send(0, j, out));
  }
  for (int s = 0; s < n - 1; ++s) {
    for (int j = 0; j < segs; ++j) {
      KC_RETURN_IF_ERROR(session.Await(s, recvs[at(s, j)]));
      std::span<float> mine = seg(r - s - 2, j);
      AddFromWire(wire(received, s, r - s - 2, j).data(), mine);
      std::span<hal::Bf16> out = wire(sent, s + 1, r - s - 2, j);
      if (s == n - 2) {
        // Chunk r is complete here alone: averaged once, rounded once, kept as sent.
        if (o.op == ReduceOp::kAvg) {
          ScaleByInverse(hal::DataType::kF32, reinterpret_cast<std::byte*>(mine.data()),
                         mine.size(), n);
        }
        ToWire(mine, out.data());
        FromWire(out.data(), mine);
      } else {
        ToWire(mine, out.data());
      }
      KC_RETURN_IF_ERROR(send(s + 1, j, out));
    }
  }
  for (int t = 0; t < n - 1; ++t) {
    const int step = n - 1 + t;
    for (int j = 0; j < segs; ++j) {
      KC_RETURN_IF_ERROR(session.Await(step, recvs[at(step, j)]));
      std::span<hal::Bf16> in = wire(received, step, r - t - 1, j);
      FromWire(in.data(), seg(r - t - 1, j));
      if (t + 1 < n - 1) KC_RETURN_IF_ERROR(send(step + 1, j, in));
    }
  }
  for (int step = 0; step < steps; ++step) {
    for (int j = 0; j < segs; ++j) KC_RETURN_IF_ERROR(session.Await(step, sends[at(step, j)]));
  }
  return OkStatus();
}

// AllreduceRecursiveDoubling's body, after argument checks.
Status RecursiveDoublingAllreduce(Transport& transport, const AllreduceOptions& o) {
  const int n = transport.size();
  if (n == 1 || o.count == 0) return OkStatus();
  Session session(transport, "allreduce_rd", o.deadline, o.tag, o.lane);
  const int r = transport.rank();
  const size_t esize = hal::DataTypeSize(o.dtype);
  const ReduceOp op = o.op == ReduceOp::kAvg ? ReduceOp::kSum : o.op;
  std::span<std::byte> data = o.data.first(o.count * esize);
  std::span<std::byte> scratch = Scratch(0, data.size());
  int p = 1;  // participants: the largest power of two <= n
  int rounds = 0;
  while (p * 2 <= n) {
    p *= 2;
    ++rounds;
  }
  const int extra = n - p;
  // Participant index v stands for ranks {2v, 2v+1} when v < extra, else for rank v + extra:
  // v's block of ranks is contiguous and ordered like v, so "lower v first" is "lower ranks
  // first".
  const auto rank_of = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  int v = r >= 2 * extra ? r - extra : (r % 2 == 1 ? r / 2 : -1);
  // Step 0: among ranks < 2 * extra, even rank 2i hands its data to 2i + 1, which combines
  // (2i's operand first) and stands for both from here on.
  if (r < 2 * extra) {
    if (v < 0) {
      KC_RETURN_IF_ERROR(session.SendTo(0, r + 1, data));
      KC_RETURN_IF_ERROR(session.WaitSends(0));
    } else {
      KC_RETURN_IF_ERROR(session.RecvFrom(0, r - 1, scratch));
      ReduceElements(o.dtype, op, data.data(), scratch.data(), data.data(), o.count);
    }
  }
  if (v >= 0) {
    for (int mask = 1, step = 1; mask < p; mask <<= 1, ++step) {
      // Step k: swap whole buffers with the participant differing in bit k; both combine the
      // lower participant's operand first, so both hold the same bits afterwards.
      const int peer = rank_of(v ^ mask);
      KC_RETURN_IF_ERROR(session.Exchange(step, peer, data, peer, scratch));
      if ((v & mask) == 0) {
        ReduceElements(o.dtype, op, data.data(), data.data(), scratch.data(), o.count);
      } else {
        ReduceElements(o.dtype, op, data.data(), scratch.data(), data.data(), o.count);
      }
    }
    if (o.op == ReduceOp::kAvg) ScaleByInverse(o.dtype, data.data(), o.count, n);
  }
  // Last step: 2i + 1 hands the result back to 2i.
  const int last = rounds + 1;
  if (r < 2 * extra) {
    if (v < 0) {
      KC_RETURN_IF_ERROR(session.RecvFrom(last, r + 1, data));
    } else {
      KC_RETURN_IF_ERROR(session.SendTo(last, r - 1, data));
      KC_RETURN_IF_ERROR(session.WaitSends(last));
    }
  }
  return OkStatus();
}

Status CheckReduceRoot(std::string_view name, const ReduceOptions& o, int size) {
  KC_RETURN_IF_ERROR(CheckReduceArgs(name, o.data, o.count, o.dtype, o.op));
  if (o.root < 0 || o.root >= size) {
    return InvalidArgumentError(std::string(name) + ": root " + std::to_string(o.root) +
                                " outside [0, " + std::to_string(size) + ")");
  }
  return OkStatus();
}

// Reduce's body, after argument checks. With preserve_input false a non-root's data may be
// left holding a partial result (saves a copy when the caller overwrites it anyway).
Status BinomialReduce(Transport& transport, const ReduceOptions& o, bool preserve_input) {
  const int n = transport.size();
  if (n == 1 || o.count == 0) return OkStatus();
  Session session(transport, "reduce", o.deadline, o.tag, o.lane);
  const size_t esize = hal::DataTypeSize(o.dtype);
  const ReduceOp op = o.op == ReduceOp::kAvg ? ReduceOp::kSum : o.op;
  const int vr = Mod(transport.rank() - o.root, n);  // rank relative to the root
  std::span<std::byte> acc = o.data.first(o.count * esize);
  std::span<std::byte> scratch;
  for (int mask = 1, step = 0; mask < n; mask <<= 1, ++step) {
    if ((vr & mask) != 0) {
      // Done: acc holds relative ranks [vr, vr + mask); hand it to the parent vr - mask.
      KC_RETURN_IF_ERROR(session.SendTo(step, Mod(vr - mask + o.root, n), acc));
      return session.WaitSends(step);
    }
    const int child = vr + mask;
    if (child >= n) continue;
    if (scratch.data() == nullptr) {
      scratch = Scratch(0, acc.size());
      if (vr != 0 && preserve_input) {
        std::span<std::byte> copy = Scratch(1, acc.size());
        std::copy(acc.begin(), acc.end(), copy.begin());
        acc = copy;
      }
    }
    // Step: fold in the child's block [child, child + mask), after ours (lower ranks first).
    KC_RETURN_IF_ERROR(session.RecvFrom(step, Mod(child + o.root, n), scratch));
    ReduceElements(o.dtype, op, acc.data(), acc.data(), scratch.data(), o.count);
  }
  // Only the root gets here.
  if (o.op == ReduceOp::kAvg) ScaleByInverse(o.dtype, acc.data(), o.count, n);
  return OkStatus();
}

// Binomial broadcast's body, after argument checks.
Status BinomialBroadcast(Transport& transport, const BroadcastOptions& options) {
  const int n = transport.size();
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

// Salts of AllreduceHierarchical's sub-group views, one per phase (documented in the header).
constexpr uint16_t kSaltHostReduce = 0xFFF1;
constexpr uint16_t kSaltLeaders = 0xFFF2;
constexpr uint16_t kSaltHostBroadcast = 0xFFF3;
// kAuto for the leaders' allreduce: recursive doubling up to this many bytes, ring above.
constexpr size_t kAutoRecursiveDoublingMaxBytes = 64 << 10;

}  // namespace

Status CheckWire(std::string_view name, hal::DataType dtype, ReduceOp op, WireFormat wire) {
  if (wire != WireFormat::kBf16 ||
      (dtype == hal::DataType::kF32 && (op == ReduceOp::kSum || op == ReduceOp::kAvg))) {
    return OkStatus();
  }
  return InvalidArgumentError(
      std::string(name) + ": the bf16 wire carries f32 sums and averages only, not " +
      std::string(hal::DataTypeName(dtype)) + " " + std::string(ReduceOpName(op)));
}

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
  if (options.wire == WireFormat::kBf16) return RingAllreduceBf16(transport, options);
  return RingAllreduce(transport, options);
}

Status AllreduceRecursiveDoubling(Transport& transport, const AllreduceOptions& options) {
  KC_LAYER_ENTRY(Layer::kComm, "communicator");
  KC_RETURN_IF_ERROR(CheckReduce("allreduce_rd", options));
  return RecursiveDoublingAllreduce(transport, options);
}

std::string_view AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kRecursiveDoubling:
      return "recursive_doubling";
    case Algorithm::kHierarchical:
      return "hierarchical";
    case Algorithm::kDirect:
      return "direct";
  }
  return "unknown";
}

std::optional<Algorithm> AlgorithmFromName(std::string_view name) {
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kRecursiveDoubling,
                      Algorithm::kHierarchical, Algorithm::kDirect}) {
    if (name == AlgorithmName(a)) return a;
  }
  if (name == "rd") return Algorithm::kRecursiveDoubling;
  if (name == "hier") return Algorithm::kHierarchical;
  return std::nullopt;
}

Status AllreduceHierarchical(Transport& transport, std::span<const int> host_of_rank,
                             const AllreduceOptions& options, Algorithm leaders) {
  KC_LAYER_ENTRY(Layer::kComm, "communicator");
  constexpr std::string_view kName = "allreduce_hierarchical";
  KC_RETURN_IF_ERROR(CheckReduce(kName, options));
  const int n = transport.size();
  const int r = transport.rank();
  if (host_of_rank.size() != static_cast<size_t>(n)) {
    return InvalidArgumentError(std::string(kName) + ": host_of_rank has " +
                                std::to_string(host_of_rank.size()) + " entries, want " +
                                std::to_string(n));
  }
  if (options.tag > kMaxSubgroupTag) {
    return InvalidArgumentError(std::string(kName) + ": tag does not fit in 48 bits");
  }
  const size_t bytes = options.count * hal::DataTypeSize(options.dtype);
  if (leaders == Algorithm::kAuto) {
    leaders =
        bytes <= kAutoRecursiveDoublingMaxBytes ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
  }
  if (leaders != Algorithm::kRing && leaders != Algorithm::kRecursiveDoubling) {
    return InvalidArgumentError(std::string(kName) + ": leaders must be ring or recursive " +
                                "doubling, not " + std::string(AlgorithmName(leaders)));
  }
  // This rank's host, in ascending rank order (the leader first), and every host's leader
  // (its lowest rank), ascending. Every rank derives the same lists from host_of_rank.
  std::vector<int> host_ranks;
  std::map<int, int> leader_of_host;
  for (int q = 0; q < n; ++q) {
    if (host_of_rank[q] == host_of_rank[r]) host_ranks.push_back(q);
    leader_of_host.try_emplace(host_of_rank[q], q);
  }
  std::vector<int> leader_ranks;
  for (const auto& [host, leader] : leader_of_host) leader_ranks.push_back(leader);
  std::sort(leader_ranks.begin(), leader_ranks.end());
  const bool is_leader = host_ranks.front() == r;

  // The views borrow `transport`, which outlives them: they are destroyed before we return.
  std::shared_ptr<Transport> self(&transport, [](Transport*) {});
  KC_ASSIGN_OR_RETURN(std::unique_ptr<Transport> host_reduce,
                      CreateSubgroupTransport(self, host_ranks, kSaltHostReduce));
  KC_ASSIGN_OR_RETURN(std::unique_ptr<Transport> host_broadcast,
                      CreateSubgroupTransport(self, host_ranks, kSaltHostBroadcast));
  std::unique_ptr<Transport> leader_group;
  if (is_leader) {
    KC_ASSIGN_OR_RETURN(leader_group, CreateSubgroupTransport(self, leader_ranks, kSaltLeaders));
  }
  if (n == 1 || options.count == 0) return OkStatus();

  const auto context = [&](int phase) {
    return std::string(kName) + " step=" + std::to_string(phase) + " rank=" + std::to_string(r);
  };
  const ReduceOp sum_op = options.op == ReduceOp::kAvg ? ReduceOp::kSum : options.op;
  // Phase 1: reduce inside the host to its leader (host sub-rank 0). Non-leaders' data is
  // overwritten in phase 3, so it need not be preserved.
  if (Status s = BinomialReduce(*host_reduce,
                                {.data = options.data,
                                 .count = options.count,
                                 .dtype = options.dtype,
                                 .op = sum_op,
                                 .root = 0,
                                 .deadline = options.deadline,
                                 .tag = options.tag,
                                 .lane = options.lane},
                                /*preserve_input=*/false);
      !s.ok()) {
    return s.WithContext(context(1));
  }
  if (is_leader) {
    // Phase 2: the leaders allreduce the per-host results; avg scales once, by the whole n.
    AllreduceOptions across = options;
    across.op = sum_op;
    Status s = leaders == Algorithm::kRing ? RingAllreduce(*leader_group, across)
                                           : RecursiveDoublingAllreduce(*leader_group, across);
    if (!s.ok()) return s.WithContext(context(2));
    if (options.op == ReduceOp::kAvg) {
      ScaleByInverse(options.dtype, options.data.data(), options.count, n);
    }
  }
  // Phase 3: each leader broadcasts the result inside its host.
  if (Status s = BinomialBroadcast(*host_broadcast, {.data = options.data.first(bytes),
                                                     .root = 0,
                                                     .deadline = options.deadline,
                                                     .tag = options.tag,
                                                     .lane = options.lane});
      !s.ok()) {
    return s.WithContext(context(3));
  }
  return OkStatus();
}

Status Reduce(Transport& transport, const ReduceOptions& options) {
  KC_LAYER_ENTRY(Layer::kComm, "communicator");
  KC_RETURN_IF_ERROR(CheckReduceRoot("reduce", options, transport.size()));
  return BinomialReduce(transport, options, /*preserve_input=*/true);
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
  return BinomialBroadcast(transport, options);
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
