// Generations and rendezvous on a Store: how a group of ranks forms, and how the survivors of
// a failure form the next group without the old one getting in the way. The design and what
// the fault layer gets are in docs/design/rendezvous.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "comm/store.h"

namespace kc::comm {

// The counter holding the current generation number (decimal; absent means 0).
inline constexpr std::string_view kGenerationKey = "kc/generation";

// "kc/gen/<generation>/": the key space of one generation. Everything a generation's members
// write goes under it (WithPrefix(&store, GenerationPrefix(g))), so a rank still running an
// old generation writes only into that generation's space.
std::string GenerationPrefix(int64_t generation);

// The current generation: 0 until the first AdvanceGeneration. Errors are the store's.
Result<int64_t> CurrentGeneration(Store& store);

struct GenerationAdvance {
  int64_t generation = 0;  // the current generation after the call: from + 1 or later
  bool advanced = false;   // this call made the change; exactly one caller per step does
};

// Moves the current generation from `from` to `from + 1` with one CompareSet, so when several
// survivors race from the same `from` exactly one advance happens and every caller learns the
// new number. If the generation is already past `from`, nothing changes and the current
// number is returned (advanced = false). kInvalidArgument for from < 0; kFailedPrecondition
// when the store's generation is behind `from` or is not a number; otherwise the store's
// errors. Blocks only for the store's round trips.
Result<GenerationAdvance> AdvanceGeneration(Store& store, int64_t from);

struct RendezvousOptions {
  int64_t generation = 0;  // the group to join: CurrentGeneration() or AdvanceGeneration()
  std::string address;     // how peers reach this member, opaque bytes ("10.0.0.3:29500")
  int world_size = 0;      // members the generation waits for
  TimePoint deadline;      // on store.clock()
};

struct RendezvousResult {
  int64_t generation = 0;
  int rank = 0;  // 0..world_size-1, in order of arrival
  int world_size = 0;
  std::vector<std::string> addresses;  // addresses[r] is rank r's; addresses[rank] is ours
};

// Joins generation options.generation: takes a rank in order of arrival (an atomic Add under
// the generation's prefix), publishes the address under it, and blocks until all world_size
// members have published theirs or the deadline passes. Every member gets the same
// addresses. Errors, each naming the generation:
//   kInvalidArgument    world_size < 1, generation < 0, or an address over kMaxValueBytes;
//   kAborted            the generation is stale (the store's is newer) or already has
//                       world_size members: join the current generation instead;
//   kFailedPrecondition the generation has not been started by AdvanceGeneration;
//   kDeadlineExceeded   not every member arrived before the deadline;
//   the store's errors (kUnavailable, ...) otherwise.
// A member that joined and then failed is not replaced: the others time out, and the
// survivors advance to the next generation.
Result<RendezvousResult> Rendezvous(Store& store, const RendezvousOptions& options);

}  // namespace kc::comm
