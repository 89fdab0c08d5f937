#include "comm/rendezvous.h"

#include <memory>
#include <utility>

#include "base/layer_guard.h"
#include "comm/internal/store_wire.h"

namespace kc::comm {
namespace {

// Under GenerationPrefix(g): the rendezvous's own keys.
constexpr std::string_view kRendezvousPrefix = "rdzv/";
constexpr std::string_view kArrivalsKey = "arrivals";     // counter: members that came
constexpr std::string_view kWorldSizeKey = "world_size";  // set once by the first member
std::string AddressKey(int64_t rank) { return "addr/" + std::to_string(rank); }

// Returns `expr`'s Status with `context` put before its message.
#define KC_STORE_RETURN_IF_ERROR(context, expr) \
  KC_RETURN_IF_ERROR(::kc::internal_status::AsStatus(expr).WithContext(context))

}  // namespace

std::string GenerationPrefix(int64_t generation) {
  return "kc/gen/" + std::to_string(generation) + "/";
}

Result<int64_t> CurrentGeneration(Store& store) {
  KC_LAYER_ENTRY(Layer::kComm, "store");
  // Adding 0 reads the counter and creates it at 0 the first time, in one atomic step.
  Result<int64_t> current = store.Add(kGenerationKey, 0);
  if (!current.ok()) return current.status().WithContext("current generation");
  return current;
}

Result<GenerationAdvance> AdvanceGeneration(Store& store, int64_t from) {
  KC_LAYER_ENTRY(Layer::kComm, "store");
  const std::string where = "advance generation from=" + std::to_string(from);
  if (from < 0) return InvalidArgumentError(where + ": generations start at 0");
  // Make sure the counter exists, so "absent" and "0" need no separate case below.
  Result<int64_t> current = store.Add(kGenerationKey, 0);
  KC_STORE_RETURN_IF_ERROR(where, current);
  if (*current == from) {
    // Exactly one of the racers from `from` swaps; the others see its result.
    Result<CompareSetResult> r =
        store.CompareSet(kGenerationKey, std::to_string(from), std::to_string(from + 1));
    KC_STORE_RETURN_IF_ERROR(where, r);
    if (r->swapped) return GenerationAdvance{.generation = from + 1, .advanced = true};
    const std::optional<int64_t> now =
        r->current.has_value() ? internal::ParseCounter(*r->current) : std::nullopt;
    if (!now.has_value()) {
      return FailedPreconditionError(where + ": the generation key " +
                                     internal::QuoteKey(kGenerationKey) +
                                     " holds no number (deleted or overwritten?)");
    }
    current = *now;
  }
  if (*current < from) {
    return FailedPreconditionError(where + ": the store is at generation " +
                                   std::to_string(*current) +
                                   ", behind the caller (was the store restarted?)");
  }
  return GenerationAdvance{.generation = *current, .advanced = false};
}

Result<RendezvousResult> Rendezvous(Store& store, const RendezvousOptions& options) {
  KC_LAYER_ENTRY(Layer::kComm, "store");
  const std::string where = "rendezvous generation=" + std::to_string(options.generation);
  if (options.world_size < 1 || options.generation < 0) {
    return InvalidArgumentError(where + " world_size=" + std::to_string(options.world_size) +
                                ": world_size must be at least 1 and generation at least 0");
  }
  KC_STORE_RETURN_IF_ERROR(where,
                           internal::ValidateValue("rendezvous", "address", options.address));

  // 1. Only the current generation can be joined: an old one's members are told to move on.
  Result<int64_t> current = store.Add(kGenerationKey, 0);
  KC_STORE_RETURN_IF_ERROR(where, current);
  if (options.generation < *current) {
    return AbortedError(where + ": stale, the current generation is " + std::to_string(*current));
  }
  if (options.generation > *current) {
    return FailedPreconditionError(where + ": not started, the current generation is " +
                                   std::to_string(*current));
  }
  const std::unique_ptr<Store> gen =
      WithPrefix(&store, GenerationPrefix(options.generation) + std::string(kRendezvousPrefix));

  // 2. Agree on the size: the first member records it, the others must match it.
  const std::string size = std::to_string(options.world_size);
  Result<CompareSetResult> recorded = gen->CompareSet(kWorldSizeKey, std::nullopt, size);
  KC_STORE_RETURN_IF_ERROR(where, recorded);
  if (!recorded->swapped && recorded->current != size) {
    return FailedPreconditionError(where + ": members disagree on world_size, this one has " +
                                   size + " and the generation " +
                                   recorded->current.value_or("none"));
  }

  // 3. Take a rank in order of arrival.
  Result<int64_t> arrivals = gen->Add(kArrivalsKey, 1);
  KC_STORE_RETURN_IF_ERROR(where, arrivals);
  const int64_t rank = *arrivals - 1;
  if (rank >= options.world_size) {
    return AbortedError(where + ": already has its " + size + " members; join the next generation");
  }

  // 4. Publish our address under our rank.
  KC_STORE_RETURN_IF_ERROR(where, gen->Set(AddressKey(rank), options.address));

  // 5. Wait for every member's address, then read them in rank order.
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(options.world_size));
  for (int r = 0; r < options.world_size; ++r) keys.push_back(AddressKey(r));
  KC_STORE_RETURN_IF_ERROR(where + " rank=" + std::to_string(rank),
                           gen->Wait(keys, options.deadline));
  RendezvousResult result{.generation = options.generation,
                          .rank = static_cast<int>(rank),
                          .world_size = options.world_size,
                          .addresses = {}};
  result.addresses.reserve(keys.size());
  for (const std::string& k : keys) {
    Result<std::string> address = gen->Get(k, options.deadline);
    KC_STORE_RETURN_IF_ERROR(where + " rank=" + std::to_string(rank), address);
    result.addresses.push_back(*std::move(address));
  }
  return result;
}

#undef KC_STORE_RETURN_IF_ERROR

}  // namespace kc::comm
