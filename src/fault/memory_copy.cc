#include "fault/memory_copy.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <set>

#include "base/layer_guard.h"

namespace kc::fault {
namespace {

// Point-to-point tags of the copies, above those the engine's pipeline uses.
constexpr uint64_t kHeaderTag = (uint64_t{1} << 39) | 1;
constexpr uint64_t kDataTag = (uint64_t{1} << 39) | 2;
constexpr int64_t kMagic = 0x6b632d636f7079;  // "kc-copy"

// What travels ahead of a copy's values.
struct Header {
  int64_t magic = kMagic;
  int64_t stage = 0;
  int64_t tp_rank = 0;
  int64_t steps = 0;
  int64_t epoch = 0;
  int64_t position = 0;
  uint64_t fingerprint = 0;
  int64_t values = 0;
};

Header HeaderOf(const StateSnapshot& s) {
  return {.stage = s.stage,
          .tp_rank = s.tp_rank,
          .steps = s.steps,
          .epoch = s.loader.epoch,
          .position = s.loader.position,
          .fingerprint = s.loader.fingerprint,
          .values = static_cast<int64_t>(s.data.size())};
}

// A received header's snapshot, its values still to come. kDataLoss for one that is not a
// copy's.
Result<StateSnapshot> SnapshotOf(const Header& h, int from) {
  if (h.magic != kMagic || h.values < 0 || h.values > (int64_t{1} << 40) || h.steps < 0) {
    return DataLossError(fmt::format("in-memory copy from rank {}: not a copy's header", from));
  }
  StateSnapshot s{
      .valid = true,
      .stage = static_cast<int>(h.stage),
      .tp_rank = static_cast<int>(h.tp_rank),
      .steps = h.steps,
      .loader = {.epoch = h.epoch, .position = h.position, .fingerprint = h.fingerprint},
      .data = {}};
  s.data.resize(static_cast<size_t>(h.values));
  return s;
}

// Point-to-point operations in flight and the first error met: every one is waited for, even
// after one failed, since its buffer must outlive it.
class Pending {
 public:
  void Add(Result<std::shared_ptr<comm::Work>> w) {
    if (w.ok()) {
      works_.push_back(*std::move(w));
    } else {
      Fail(w.status());
    }
  }
  void Fail(Status s) {
    if (first_.ok() && !s.ok()) first_ = std::move(s);
  }
  // Waits for all added so far; the first error of any (sticky).
  Status WaitAll() {
    for (const std::shared_ptr<comm::Work>& w : works_) Fail(w->Wait());
    works_.clear();
    return first_;
  }

 private:
  std::vector<std::shared_ptr<comm::Work>> works_;
  Status first_;
};

std::span<const std::byte> BytesOf(const Header& h) { return std::as_bytes(std::span(&h, 1)); }
std::span<std::byte> BytesOf(Header& h) { return std::as_writable_bytes(std::span(&h, 1)); }

}  // namespace

int CopyHolder(std::span<const int> hosts, int rank) {
  const int n = static_cast<int>(hosts.size());
  if (n <= 1) return rank;
  std::vector<int> order;  // host indices, in the order their first rank comes
  for (int h : hosts) {
    if (std::find(order.begin(), order.end(), h) == order.end()) order.push_back(h);
  }
  if (order.size() == 1) return (rank + 1) % n;
  const int host = hosts[static_cast<size_t>(rank)];
  const int place = static_cast<int>(std::count(hosts.begin(), hosts.begin() + rank, host));
  const size_t at =
      static_cast<size_t>(std::find(order.begin(), order.end(), host) - order.begin());
  const int next = order[(at + 1) % order.size()];
  std::vector<int> there;
  for (int r = 0; r < n; ++r) {
    if (hosts[static_cast<size_t>(r)] == next) there.push_back(r);
  }
  return there[static_cast<size_t>(place) % there.size()];
}

int64_t MemoryCopies::bytes() const {
  int64_t b = 0;
  for (const StateSnapshot& s : copies_) b += static_cast<int64_t>(s.data.size() * sizeof(float));
  return b;
}

Status MemoryCopies::Exchange(parallel::Trainer& trainer, const parallel::LoaderState& loader,
                              comm::Communicator* world) {
  KC_LAYER_ENTRY(Layer::kFault, "memory_copy");
  std::vector<StateSnapshot> next;
  next.push_back(TakeSnapshot(trainer, loader));
  if (world == nullptr || world->size() == 1) {
    copies_ = std::move(next);
    return OkStatus();
  }
  const std::vector<int>& hosts = world->hosts();
  const int me = world->rank();
  const int holder = CopyHolder(hosts, me);
  std::vector<int> senders;  // the ranks whose copies this one holds
  for (int q = 0; q < world->size(); ++q) {
    if (q != me && CopyHolder(hosts, q) == me) senders.push_back(q);
  }
  Pending pending;
  // Sizes first: a stage's state is its own size.
  const Header mine = HeaderOf(next.front());
  std::vector<Header> theirs(senders.size());
  if (holder != me) pending.Add(world->Send(holder, BytesOf(mine), kHeaderTag));
  for (size_t i = 0; i < senders.size(); ++i) {
    pending.Add(world->Recv(senders[i], BytesOf(theirs[i]), kHeaderTag));
  }
  KC_RETURN_IF_ERROR(pending.WaitAll());
  for (size_t i = 0; i < senders.size(); ++i) {
    KC_ASSIGN_OR_RETURN(StateSnapshot s, SnapshotOf(theirs[i], senders[i]));
    next.push_back(std::move(s));
  }
  if (holder != me) {
    pending.Add(world->Send(holder, std::as_bytes(std::span(next.front().data)), kDataTag));
  }
  for (size_t i = 0; i < senders.size(); ++i) {
    pending.Add(
        world->Recv(senders[i], std::as_writable_bytes(std::span(next[i + 1].data)), kDataTag));
  }
  KC_RETURN_IF_ERROR(pending.WaitAll());
  copies_ = std::move(next);
  return OkStatus();
}

Result<MemoryRestore> MemoryCopies::Restore(parallel::Trainer* trainer, comm::Communicator* world,
                                            int64_t checkpoint_step) const {
  KC_LAYER_ENTRY(Layer::kFault, "memory_copy");
  if (trainer->zero_stage() != 0) {
    return FailedPreconditionError(
        "in-memory copies: ZeRO-1 shards the optimizer state over the replicas; load a "
        "checkpoint instead");
  }
  const int t = trainer->tp_size();
  const int positions = trainer->stages() * t;
  const int n = world == nullptr ? 1 : world->size();
  const int me = world == nullptr ? 0 : world->rank();
  // One row a rank: the step of its copy of each position (-1: none), its newest checkpoint's
  // step and its position now. Each rank fills its own; a max over the ranks gathers them.
  const int width = positions + 2;
  std::vector<double> table(static_cast<size_t>(n * width), -1.0);
  double* row = &table[static_cast<size_t>(me * width)];
  for (const StateSnapshot& c : copies_) {
    const int k = c.stage * t + c.tp_rank;
    if (c.tp_rank < t && k < positions) {
      row[k] = std::max(row[k], static_cast<double>(c.steps));
    }
  }
  row[positions] = static_cast<double>(checkpoint_step);
  row[positions + 1] = static_cast<double>(trainer->stage() * t + trainer->tp_rank());
  if (world != nullptr) {
    KC_ASSIGN_OR_RETURN(auto w, world->Allreduce(std::span<double>(table), comm::ReduceOp::kMax));
    KC_RETURN_IF_ERROR(w->Wait());
  }
  auto at = [&](int r, int k) { return table[static_cast<size_t>(r * width + k)]; };

  // The newest step some rank holds of every position; each position's donor is the lowest
  // rank holding it.
  std::set<double, std::greater<>> steps;
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < positions; ++k) {
      if (at(r, k) >= 0) steps.insert(at(r, k));
    }
  }
  std::vector<int> donor(static_cast<size_t>(positions), -1);
  double step = -1;
  std::string missing = "no rank holds one";
  for (double s : steps) {
    std::fill(donor.begin(), donor.end(), -1);
    for (int k = 0; k < positions; ++k) {
      for (int r = 0; r < n && donor[static_cast<size_t>(k)] < 0; ++r) {
        if (at(r, k) == s) donor[static_cast<size_t>(k)] = r;
      }
    }
    const auto lacking = std::find(donor.begin(), donor.end(), -1);
    if (lacking == donor.end()) {
      step = s;
      break;
    }
    if (missing == "no rank holds one") {
      const int k = static_cast<int>(lacking - donor.begin());
      missing = fmt::format("the newest, of step {}, lacks stage {} tensor-parallel rank {}",
                            static_cast<int64_t>(s), k / t, k % t);
    }
  }
  if (step < 0) {
    return FailedPreconditionError(
        "in-memory copies: no step has a copy of every pipeline "
        "stage and tensor-parallel rank (" +
        missing + ")");
  }
  double checkpoint = at(0, positions);
  for (int r = 1; r < n; ++r) checkpoint = std::min(checkpoint, at(r, positions));
  if (checkpoint > step) {
    return FailedPreconditionError(
        fmt::format("in-memory copies: the checkpoint of step {} is newer than the copies' step {}",
                    static_cast<int64_t>(checkpoint), static_cast<int64_t>(step)));
  }

  auto copy_of = [&](int k) -> const StateSnapshot* {
    for (const StateSnapshot& c : copies_) {
      if (c.stage * t + c.tp_rank == k && static_cast<double>(c.steps) == step) return &c;
    }
    return nullptr;
  };
  const int mine = trainer->stage() * t + trainer->tp_rank();
  MemoryRestore out{.step = static_cast<int64_t>(step), .donor = donor[static_cast<size_t>(mine)]};
  Pending pending;
  // Every copy this rank gives, posted before it waits for its own.
  std::vector<Header> given;
  given.reserve(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    const int k = static_cast<int>(at(q, positions + 1));
    if (q == me || donor[static_cast<size_t>(k)] != me) continue;
    const StateSnapshot* c = copy_of(k);
    given.push_back(HeaderOf(*c));
    pending.Add(world->Send(q, BytesOf(given.back()), kHeaderTag));
    pending.Add(world->Send(q, std::as_bytes(std::span(c->data)), kDataTag));
  }
  Status applied;
  if (out.donor == me) {
    applied = ApplySnapshot(*copy_of(mine), trainer);
  } else {
    pending.Fail([&]() -> Status {
      Header h;
      KC_ASSIGN_OR_RETURN(auto header, world->Recv(out.donor, BytesOf(h), kHeaderTag));
      KC_RETURN_IF_ERROR(header->Wait());
      KC_ASSIGN_OR_RETURN(StateSnapshot s, SnapshotOf(h, out.donor));
      KC_ASSIGN_OR_RETURN(
          auto values, world->Recv(out.donor, std::as_writable_bytes(std::span(s.data)), kDataTag));
      KC_RETURN_IF_ERROR(values->Wait());
      out.bytes = static_cast<int64_t>(s.data.size() * sizeof(float));
      applied = ApplySnapshot(s, trainer);
      return OkStatus();
    }());
  }
  KC_RETURN_IF_ERROR(pending.WaitAll());
  // A copy of another shape than this rank's: not a precondition the caller can fall back
  // from quietly.
  if (!applied.ok()) return InternalError("in-memory copies: " + applied.message());
  return out;
}

}  // namespace kc::fault
