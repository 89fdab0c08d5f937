// Elastic recovery: when a rank is lost the survivors go on as the next generation of the job
// instead of the whole job restarting, and ranks that come back (or replacements) join a later
// generation. The supervisor (fault::Supervisor) decides each generation and
// announces it through the rendezvous store; every worker watches for the announcement, aborts
// its communicator when it comes (so a collective blocked on a lost or stopped peer returns at
// once), rebuilds its communicator and engine as the generation's rank, and brings its state to
// the newest step a surviving data-parallel replica holds, by a broadcast from that replica.
//
//   Supervisor:  KC_ASSIGN_OR_RETURN(Generation next, NextGeneration(current, shape, alive));
//                KC_RETURN_IF_ERROR(AnnounceGeneration(store, next));
//   Worker:      auto watch = GenerationWatch::Start(&store, g.number, [&] { comm->Abort({}); });
//                ... runner->Run() fails ...
//                KC_ASSIGN_OR_RETURN(Generation next, AwaitGeneration(store, g.number + 1, dl));
//                ... rebuild; RestoreFromReplicas(trainer, world, member.has_state) ...
//
// fault::Supervisor (supervisor.h) and fault::ElasticWorker (elastic_worker.h) are these two
// sides. Design: docs/design/elastic-recovery.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "comm/communicator.h"
#include "comm/store.h"
#include "parallel/trainer.h"

namespace kc::fault {

// What does not change from one generation to the next: the plan's t and p, and the global
// batch (so the loss trajectory does not depend on how many replicas are left). Any count of
// replicas up to the global batch can train it: each takes its share, evenly or not
// (parallel/batch_share.h), cut into micro-batches as near the first generation's as it allows.
struct ElasticShape {
  int t = 1;
  int p = 1;
  int64_t global_batch = 1;      // sequences per step over all replicas
  int64_t micro_batch_size = 1;  // the first generation's (the plan's)
  int64_t micro_batches = 1;     // the first generation's (the plan's)
  int min_ranks = 1;             // fewer: the job stops (with a checkpoint)
  int max_ranks = 1;             // more alive workers than this wait as spares
};

struct Member {
  int worker = 0;          // the worker's lasting id: its first rank, or later ids for new ones
  bool has_state = false;  // it carries its position's state from the previous generation
};

// One generation of the job: who is in it, in rank order, and the layout they run.
struct Generation {
  int64_t number = 0;
  int d = 1;  // data-parallel replicas; members.size() == t * p * d
  // Replica 0's micro-batching of its share (the others' differ when the shares do).
  int64_t micro_batch_size = 1;
  int64_t micro_batches = 1;
  // Rank r = (stage * d + replica) * t + tp_rank is members[r] (trainer.h's numbering).
  std::vector<Member> members;
  std::vector<int> spares;  // alive workers left out; they wait for a later generation
  // The members' state cannot come from a replica (none is whole, or ZeRO-1 sharded it): they
  // load the newest good checkpoint instead.
  bool from_checkpoint = false;
  // Below min_ranks: the members (one whole replica, if any survived) restore, save a
  // checkpoint and exit; nobody trains on.
  bool stop = false;
  bool done = false;   // the job has finished: spares exit
  std::string reason;  // why this generation began, for logs and the fault record

  int rank_of(int worker) const;  // -1 when not a member
  nlohmann::json ToJson() const;
  static Result<Generation> FromJson(const nlohmann::json& j);
};

// The first generation: workers 0..ranks-1 in rank order, with the plan's layout.
Generation FirstGeneration(const ElasticShape& shape, int ranks);

// The most data-parallel replicas `workers` alive workers can form under `shape`: whole groups
// of t * p, at most max_ranks of them and at most the global batch (a sequence each); 0 when
// not one.
int UsableReplicas(const ElasticShape& shape, int workers);

// The supervisor's choice after `current`: `alive` are the workers running now (members,
// spares and newcomers alike). Whole replicas of `current` (every one of their t * p members
// alive) keep their state and go first; the other alive workers fill further replicas, whose
// state is broadcast to them. d is the largest count of replicas that the alive workers,
// max_ranks and the global batch allow: every survivor of a data-parallel run trains, the
// replicas taking uneven shares of the global batch when it does not divide by d (32 over 3:
// 11, 11, 10). Below min_ranks the generation is a stop. `zero_sharded`:
// optimizer state is sharded over the replicas, so a lost replica's part is gone and every
// generation after a loss restores from a checkpoint.
Result<Generation> NextGeneration(const Generation& current, const ElasticShape& shape,
                                  std::vector<int> alive, bool zero_sharded, std::string reason);

// The store key generation `number` is announced under.
std::string GenerationKey(int64_t number);
// The newest announced generation's number (decimal), set by AnnounceGeneration.
inline constexpr std::string_view kCurrentGenerationKey = "kc/elastic/current";
// Sets the generation's key, then kCurrentGenerationKey.
Status AnnounceGeneration(comm::Store& store, const Generation& generation);
// Blocks until generation `number` is announced or `deadline` (kDeadlineExceeded).
Result<Generation> AwaitGeneration(comm::Store& store, int64_t number, TimePoint deadline);

// A thread that waits on its own store connection for the generation after `current` and then
// calls `on_next` (once; from that thread), e.g. to abort the communicator of `current`.
class GenerationWatch {
 public:
  static Result<std::unique_ptr<GenerationWatch>> Start(comm::Store* store, int64_t current,
                                                        std::function<void()> on_next);
  ~GenerationWatch();  // stops the thread (within a poll interval)
  bool fired() const { return fired_.load(std::memory_order_acquire); }

 private:
  GenerationWatch(comm::Store* store, int64_t current, std::function<void()> on_next)
      : store_(store), current_(current), on_next_(std::move(on_next)) {}
  void Loop();

  comm::Store* const store_;
  const int64_t current_;
  const std::function<void()> on_next_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

// A rank's own state, copied out of its engine when a generation ends, to be put into the
// engine of the next (where the rank keeps its pipeline stage and tensor-parallel rank).
struct StateSnapshot {
  bool valid = false;
  int stage = 0;
  int tp_rank = 0;
  int64_t steps = 0;
  parallel::LoaderState loader;  // where the data stood after `steps` steps
  std::vector<float> data;       // every StateTensor's values, then its moments' m and v
};
// `loader`: the loader's state after the trainer's last completed step (a failed step may
// have advanced the loader; the parameters and moments are still those of the last step).
StateSnapshot TakeSnapshot(parallel::Trainer& trainer, const parallel::LoaderState& loader);
// kFailedPrecondition (nothing changed) when the snapshot is of another position or shape.
Status ApplySnapshot(const StateSnapshot& snapshot, parallel::Trainer* trainer);

struct ReplicaRestore {
  int64_t step = 0;   // the steps done of the state every member now holds
  int donor_dp = 0;   // the replica this rank's state came from (its own when it had it)
  int64_t bytes = 0;  // state bytes this rank received (0 on the donor)
};

// Collective on the generation's communicator `world`, after every member built its trainer:
// brings every rank to the newest step that, for every (stage, tensor-parallel rank) position,
// some member with state holds; that member's parameters, optimizer moments, step count and
// data position are broadcast to the other replicas of its position. kFailedPrecondition when
// some position has no member with that step (the caller loads a checkpoint instead), or with
// ZeRO-1 (the moments are sharded over the replicas). `world` null: a generation of one rank,
// which holds its own state or none.
Result<ReplicaRestore> RestoreFromReplicas(parallel::Trainer* trainer, comm::Communicator* world,
                                           bool has_state);

}  // namespace kc::fault
