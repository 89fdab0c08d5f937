// In-memory copies of the training state on another host, in the manner of Gemini (Wang et
// al., SOSP 2023): every few steps each rank keeps a copy of its own state (parameters,
// optimizer moments, step count, data position) and sends one to a rank of another host, its
// holder. When a loss takes every replica of a (pipeline stage, tensor-parallel rank) position,
// no surviving replica can broadcast it (elastic.h), but the holder of that position's copy
// still can: the next generation rolls every position back to the newest step whose copies
// all survived, instead of reading the newest checkpoint.
//
//   MemoryCopies copies;
//   after step n (every k steps, every rank):  copies.Exchange(trainer, loader, world);
//   in the next generation, instead of a checkpoint:
//       Result<MemoryRestore> r = copies.Restore(&trainer, world, checkpoint_step);
//
// Design: docs/design/elastic-recovery.md (in-memory copies).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "comm/communicator.h"
#include "fault/elastic.h"
#include "parallel/trainer.h"

namespace kc::fault {

// The rank that holds `rank`'s copy: the rank with the same place among its host's ranks on
// the next host (hosts in the order their first rank comes; the place wraps on a host with
// fewer ranks); with one host, the next rank. `hosts`: each rank's host index
// (comm::Communicator::hosts()). Itself only when it is alone.
int CopyHolder(std::span<const int> hosts, int rank);

struct MemoryRestore {
  int64_t step = 0;   // the step every member now holds
  int donor = 0;      // the rank this rank's state came from (its own when it held it)
  int64_t bytes = 0;  // state bytes this rank received (0 when it held its copy)
};

// One rank's copies: its own and those it holds for others, all of one exchange's step.
// Run on the rank's training thread.
class MemoryCopies {
 public:
  // Collective on `world` (every rank after the same step): copies this rank's state (the
  // trainer's, with `loader` after its last step), sends it to its holder and receives the
  // copies it holds. The old copies stay until both are done. With world null (one rank) it
  // keeps its own copy only.
  Status Exchange(parallel::Trainer& trainer, const parallel::LoaderState& loader,
                  comm::Communicator* world);

  // Collective on `world` (every member of the generation, each with the trainer it built):
  // the newest step for which some member holds a copy of every (stage, tensor-parallel rank)
  // position of the plan; each member gets its position's copy from the lowest rank holding
  // it. kFailedPrecondition (nothing changed) when no step has every position's copy, with
  // ZeRO-1 (the moments are sharded over the replicas), or when every member sees a checkpoint
  // newer than that step (`checkpoint_step`: this rank's newest good one, -1: none).
  Result<MemoryRestore> Restore(parallel::Trainer* trainer, comm::Communicator* world,
                                int64_t checkpoint_step) const;

  // The step of the copies held (-1: none) and their bytes.
  int64_t step() const { return copies_.empty() ? -1 : copies_.front().steps; }
  int64_t bytes() const;

 private:
  std::vector<StateSnapshot> copies_;  // this rank's own first
};

}  // namespace kc::fault
