#include "fault/elastic.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <tuple>

#include "base/layer_guard.h"
#include "parallel/batch_share.h"

namespace kc::fault {

using Json = nlohmann::json;

int Generation::rank_of(int worker) const {
  for (size_t r = 0; r < members.size(); ++r) {
    if (members[r].worker == worker) return static_cast<int>(r);
  }
  return -1;
}

Json Generation::ToJson() const {
  Json m = Json::array();
  for (const Member& x : members) m.push_back({x.worker, x.has_state});
  return {{"number", number},
          {"d", d},
          {"micro_batch_size", micro_batch_size},
          {"micro_batches", micro_batches},
          {"members", m},
          {"spares", spares},
          {"from_checkpoint", from_checkpoint},
          {"stop", stop},
          {"done", done},
          {"reason", reason}};
}

Result<Generation> Generation::FromJson(const Json& j) {
  try {
    Generation g;
    g.number = j.at("number").get<int64_t>();
    g.d = j.at("d").get<int>();
    g.micro_batch_size = j.at("micro_batch_size").get<int64_t>();
    g.micro_batches = j.at("micro_batches").get<int64_t>();
    for (const Json& m : j.at("members")) {
      g.members.push_back({.worker = m.at(0).get<int>(), .has_state = m.at(1).get<bool>()});
    }
    g.spares = j.at("spares").get<std::vector<int>>();
    g.from_checkpoint = j.at("from_checkpoint").get<bool>();
    g.stop = j.at("stop").get<bool>();
    g.done = j.at("done").get<bool>();
    g.reason = j.at("reason").get<std::string>();
    return g;
  } catch (const Json::exception& e) {
    return InvalidArgumentError(std::string("generation record: ") + e.what());
  }
}

namespace {

// Replica 0's micro-batching of its share of the global batch with d replicas.
std::pair<int64_t, int64_t> Batching(const ElasticShape& s, int d) {
  Result<parallel::BatchShare> share =
      parallel::ShareOfBatch(s.global_batch, d, 0, s.micro_batch_size, s.micro_batches);
  if (!share.ok()) return {s.micro_batch_size, s.micro_batches};  // d is never above G here
  return {share->micro_batch_size, share->micro_batches};
}

}  // namespace

Generation FirstGeneration(const ElasticShape& shape, int ranks) {
  Generation g;
  g.d = ranks / (shape.t * shape.p);
  std::tie(g.micro_batch_size, g.micro_batches) = Batching(shape, g.d);
  for (int w = 0; w < ranks; ++w) g.members.push_back({.worker = w, .has_state = true});
  g.reason = "start";
  return g;
}

int UsableReplicas(const ElasticShape& shape, int workers) {
  const int tp = shape.t * shape.p;
  return static_cast<int>(
      std::min<int64_t>({static_cast<int64_t>(workers / tp),
                         static_cast<int64_t>(shape.max_ranks / tp), shape.global_batch}));
}

Result<Generation> NextGeneration(const Generation& current, const ElasticShape& shape,
                                  std::vector<int> alive, bool zero_sharded, std::string reason) {
  const int tp = shape.t * shape.p;
  if (tp < 1 || shape.global_batch < 1 || shape.micro_batch_size < 1 || shape.micro_batches < 1) {
    return InvalidArgumentError("elastic: bad shape");
  }
  std::sort(alive.begin(), alive.end());
  alive.erase(std::unique(alive.begin(), alive.end()), alive.end());
  const std::set<int> up(alive.begin(), alive.end());

  // Whole replicas of the current generation, in its replica order.
  std::vector<std::vector<int>> whole;  // per replica: workers by (stage, tp_rank)
  for (int k = 0; k < current.d; ++k) {
    std::vector<int> workers;
    for (int s = 0; s < shape.p; ++s) {
      for (int r = 0; r < shape.t; ++r) {
        const size_t rank = static_cast<size_t>((s * current.d + k) * shape.t + r);
        if (rank < current.members.size() && up.count(current.members[rank].worker) != 0) {
          workers.push_back(current.members[rank].worker);
        }
      }
    }
    if (static_cast<int>(workers.size()) == tp) whole.push_back(std::move(workers));
  }
  std::set<int> in_whole;
  for (const auto& w : whole) in_whole.insert(w.begin(), w.end());
  std::vector<int> others;  // alive, without a whole replica's state
  for (int w : alive) {
    if (in_whole.count(w) == 0) others.push_back(w);
  }

  Generation next;
  next.number = current.number + 1;
  next.reason = std::move(reason);
  int d = UsableReplicas(shape, static_cast<int>(alive.size()));
  if (d * tp < shape.min_ranks || d == 0) {
    // Below the minimum: one whole replica (if any) restores and saves a checkpoint.
    next.stop = true;
    d = whole.empty() ? 0 : 1;
  }
  next.d = d;
  if (d > 0) std::tie(next.micro_batch_size, next.micro_batches) = Batching(shape, d);
  // Replicas: whole ones first, then the others in groups of t * p.
  std::vector<std::vector<Member>> replicas;
  for (const auto& w : whole) {
    if (static_cast<int>(replicas.size()) == d) break;
    std::vector<Member> r;
    for (int x : w) r.push_back({.worker = x, .has_state = true});
    replicas.push_back(std::move(r));
  }
  size_t next_other = 0;
  while (static_cast<int>(replicas.size()) < d && !next.stop) {
    std::vector<Member> r;
    for (int i = 0; i < tp; ++i) r.push_back({.worker = others[next_other++], .has_state = false});
    replicas.push_back(std::move(r));
  }
  next.members.resize(static_cast<size_t>(d * tp));
  for (int k = 0; k < d; ++k) {
    for (int s = 0; s < shape.p; ++s) {
      for (int r = 0; r < shape.t; ++r) {
        next.members[static_cast<size_t>((s * d + k) * shape.t + r)] =
            replicas[static_cast<size_t>(k)][static_cast<size_t>(s * shape.t + r)];
      }
    }
  }
  for (int w : alive) {
    if (next.rank_of(w) < 0) next.spares.push_back(w);
  }
  // Without a whole replica, or with sharded optimizer state after a loss, state comes from a
  // checkpoint; then nobody's own state counts.
  const bool lost_someone = static_cast<int>(whole.size()) < current.d;
  next.from_checkpoint = whole.empty() || (zero_sharded && lost_someone);
  if (next.from_checkpoint) {
    for (Member& m : next.members) m.has_state = false;
  }
  return next;
}

std::string GenerationKey(int64_t number) {
  return "kc/elastic/generation/" + std::to_string(number);
}

Status AnnounceGeneration(comm::Store& store, const Generation& generation) {
  KC_RETURN_IF_ERROR(store.Set(GenerationKey(generation.number), generation.ToJson().dump()));
  return store.Set(kCurrentGenerationKey, std::to_string(generation.number));
}

Result<Generation> AwaitGeneration(comm::Store& store, int64_t number, TimePoint deadline) {
  KC_ASSIGN_OR_RETURN(std::string text, store.Get(GenerationKey(number), deadline));
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(GenerationKey(number) + ": not JSON");
  return Generation::FromJson(j);
}

Result<std::unique_ptr<GenerationWatch>> GenerationWatch::Start(comm::Store* store, int64_t current,
                                                                std::function<void()> on_next) {
  if (store == nullptr) return InvalidArgumentError("generation watch: no store");
  std::unique_ptr<GenerationWatch> w(new GenerationWatch(store, current, std::move(on_next)));
  w->thread_ = std::thread([p = w.get()] { p->Loop(); });
  return w;
}

GenerationWatch::~GenerationWatch() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

void GenerationWatch::Loop() {
  const std::string keys[1] = {GenerationKey(current_ + 1)};
  while (!stop_.load(std::memory_order_acquire)) {
    // Short waits, so that destroying the watch does not wait long.
    const Status s = store_->Wait(keys, store_->clock()->Now() + std::chrono::milliseconds(100));
    if (s.ok()) {
      fired_.store(true, std::memory_order_release);
      on_next_();
      return;
    }
    if (s.code() != ErrorCode::kDeadlineExceeded) {
      // The store is gone (the supervisor ended): nothing more will be announced.
      return;
    }
  }
}

StateSnapshot TakeSnapshot(parallel::Trainer& trainer, const parallel::LoaderState& loader) {
  StateSnapshot s;
  s.valid = true;
  s.stage = trainer.stage();
  s.tp_rank = trainer.tp_rank();
  s.steps = trainer.steps_done();
  s.loader = loader;
  for (const parallel::StateTensor& t : trainer.StateTensors()) {
    s.data.insert(s.data.end(), t.values.begin(), t.values.end());
    for (const parallel::StateTensor::Moments& m : t.moments) {
      s.data.insert(s.data.end(), m.m.begin(), m.m.end());
      s.data.insert(s.data.end(), m.v.begin(), m.v.end());
    }
  }
  return s;
}

Status ApplySnapshot(const StateSnapshot& s, parallel::Trainer* trainer) {
  if (!s.valid) return FailedPreconditionError("state snapshot: empty");
  if (s.stage != trainer->stage() || s.tp_rank != trainer->tp_rank()) {
    return FailedPreconditionError("state snapshot: of stage " + std::to_string(s.stage) +
                                   " tensor-parallel rank " + std::to_string(s.tp_rank) +
                                   ", not this rank's");
  }
  std::vector<parallel::StateTensor> tensors = trainer->StateTensors();
  size_t total = 0;
  for (const parallel::StateTensor& t : tensors) {
    total += t.values.size();
    for (const parallel::StateTensor::Moments& m : t.moments) total += m.m.size() + m.v.size();
  }
  if (total != s.data.size()) {
    return FailedPreconditionError("state snapshot: " + std::to_string(s.data.size()) +
                                   " values, this rank holds " + std::to_string(total));
  }
  size_t at = 0;
  auto take = [&](std::span<float> to) {
    std::copy_n(s.data.begin() + static_cast<std::ptrdiff_t>(at), to.size(), to.begin());
    at += to.size();
  };
  for (parallel::StateTensor& t : tensors) {
    take(t.values);
    for (parallel::StateTensor::Moments& m : t.moments) {
      take(m.m);
      take(m.v);
    }
  }
  return trainer->RestoreProgress(s.steps, s.loader);
}

namespace {

Status Broadcast(comm::Communicator* c, std::span<std::byte> bytes, int root) {
  if (bytes.empty()) return OkStatus();
  KC_ASSIGN_OR_RETURN(auto work, c->Broadcast(bytes, root));
  return work->Wait();
}

Result<double> AllreduceOne(comm::Communicator* c, double value, comm::ReduceOp op) {
  double v[1] = {value};
  KC_ASSIGN_OR_RETURN(auto work, c->Allreduce(std::span<double>(v, 1), op));
  KC_RETURN_IF_ERROR(work->Wait());
  return v[0];
}

}  // namespace

Result<ReplicaRestore> RestoreFromReplicas(parallel::Trainer* trainer, comm::Communicator* world,
                                           bool has_state) {
  KC_LAYER_ENTRY(Layer::kFault, "elastic");
  if (trainer->zero_stage() != 0) {
    return FailedPreconditionError(
        "elastic restore: ZeRO-1 shards the optimizer state over the replicas; load a "
        "checkpoint instead");
  }
  if (world == nullptr) {  // one rank: its own state or none
    if (!has_state) return FailedPreconditionError("elastic restore: no state survived");
    return ReplicaRestore{.step = trainer->steps_done()};
  }
  // The newest step anyone holds; each position's donor is its lowest replica holding it.
  const double mine = has_state ? static_cast<double>(trainer->steps_done()) : -1.0;
  KC_ASSIGN_OR_RETURN(const double target, AllreduceOne(world, mine, comm::ReduceOp::kMax));
  KC_ASSIGN_OR_RETURN(
      std::unique_ptr<comm::Communicator> position,
      world->Split(trainer->stage() * 4096 + trainer->tp_rank(), trainer->dp_rank()));
  const bool holds = has_state && mine == target && target >= 0;
  const int replicas = position->size();
  KC_ASSIGN_OR_RETURN(
      const double best,
      AllreduceOne(position.get(), holds ? replicas - position->rank() : 0, comm::ReduceOp::kMax));
  KC_ASSIGN_OR_RETURN(const double everywhere,
                      AllreduceOne(world, best > 0 ? 1 : 0, comm::ReduceOp::kMin));
  if (everywhere < 1) {
    return FailedPreconditionError("elastic restore: no surviving replica holds step " +
                                   std::to_string(static_cast<int64_t>(target)) +
                                   " for every pipeline stage and "
                                   "tensor-parallel rank");
  }
  const int donor = replicas - static_cast<int>(best);
  ReplicaRestore out{.step = static_cast<int64_t>(target), .donor_dp = donor};
  const bool receiving = position->rank() != donor;

  int64_t progress[3] = {0, 0, 0};  // steps, loader epoch, loader position
  uint64_t fingerprint = 0;
  if (!receiving) {
    const parallel::LoaderState s = trainer->loader().state();
    progress[0] = trainer->steps_done();
    progress[1] = s.epoch;
    progress[2] = s.position;
    fingerprint = s.fingerprint;
  }
  KC_RETURN_IF_ERROR(Broadcast(position.get(), std::as_writable_bytes(std::span(progress)), donor));
  KC_RETURN_IF_ERROR(
      Broadcast(position.get(), std::as_writable_bytes(std::span(&fingerprint, 1)), donor));
  std::vector<parallel::StateTensor> tensors = trainer->StateTensors();
  for (parallel::StateTensor& t : tensors) {
    KC_RETURN_IF_ERROR(Broadcast(position.get(), std::as_writable_bytes(t.values), donor));
    if (receiving) out.bytes += static_cast<int64_t>(t.values.size_bytes());
    for (parallel::StateTensor::Moments& m : t.moments) {
      KC_RETURN_IF_ERROR(Broadcast(position.get(), std::as_writable_bytes(m.m), donor));
      KC_RETURN_IF_ERROR(Broadcast(position.get(), std::as_writable_bytes(m.v), donor));
      if (receiving) out.bytes += static_cast<int64_t>(2 * m.m.size_bytes());
    }
  }
  KC_RETURN_IF_ERROR(trainer->RestoreProgress(
      progress[0], {.epoch = progress[1], .position = progress[2], .fingerprint = fingerprint}));
  return out;
}

}  // namespace kc::fault
