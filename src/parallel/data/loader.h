// The training data loader: fixed-length windows of token shards, shuffled per epoch from a
// seed, split across ranks, with a position that checkpoints can save and restore.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kc::parallel {

struct LoaderOptions {
  // Where the tokens come from: a manifest.json written by `kc data prepare` (its `split`,
  // "train" or "val"), or, when `manifest` is empty, these shard files in this order.
  std::string manifest;
  std::string split = "train";
  std::vector<std::string> files;
  int64_t seq_len = 0;  // T: tokens per sequence; each window holds T + 1 tokens
  int64_t batch = 0;    // B: sequences per rank per step
  int rank = 0;
  int world_size = 1;
  // G: sequences per step over all ranks; 0: batch * world_size (every rank takes B). Else the
  // ranks take uneven shares (ShareOfBatch in parallel/batch_share.h: the first G mod
  // world_size ranks one sequence more), and `batch` must be this rank's share.
  int64_t global_batch = 0;
  uint64_t seed = 0;  // the same seed gives the same batches on every machine
};

// Where a loader stands: `position` windows of epoch `epoch` have been handed out, all ranks
// together (a multiple of batch * world_size). `fingerprint` identifies the data, seq_len and
// seed it belongs to, so a state is never applied to other data by mistake.
struct LoaderState {
  int64_t epoch = 0;
  int64_t position = 0;
  uint64_t fingerprint = 0;

  // "kc-loader/1 epoch=E position=P fingerprint=HEX": one line, for a checkpoint.
  std::string Serialize() const;
  // INVALID_ARGUMENT when `text` is not a serialised LoaderState.
  static Result<LoaderState> Parse(std::string_view text);

  friend bool operator==(const LoaderState&, const LoaderState&) = default;
};

// One step's sequences for one rank.
struct Batch {
  int64_t epoch = 0;  // the epoch and step within it that this batch is
  int64_t step = 0;
  std::vector<int32_t> inputs;   // (B, T)
  std::vector<int32_t> targets;  // (B, T): inputs shifted left by one token
};

// Windows of seq_len + 1 tokens start every seq_len tokens within each shard (the last token
// of one window is the first of the next) and never cross shards. Every epoch visits the
// windows in a new permutation of the seed and epoch; step s of an epoch hands permuted
// windows [s*G, (s+1)*G) to the ranks in rank order, each its share (B each when
// G = batch * world_size), so the global batch does not depend on the rank count. The
// windows left over after the last full step are skipped that epoch (a different set each
// epoch). All shards are held in memory. Not thread-safe; owned by the training loop.
class DataLoader {
 public:
  virtual ~DataLoader() = default;

  // Fills *batch with this rank's next B sequences (resizing its vectors) and advances,
  // rolling over to the next epoch when this one has no full step left.
  virtual void Next(Batch* batch) = 0;

  // The position before the next call to Next().
  virtual LoaderState state() const = 0;

  // Continues from `state`: the following batches are exactly those that followed it.
  // FAILED_PRECONDITION when its fingerprint is of other data, seq_len or seed, or its
  // position is not a step boundary of this loader's global batch or is past the epoch.
  virtual Status Restore(const LoaderState& state) = 0;

  virtual int64_t steps_per_epoch() const = 0;
  virtual int64_t num_windows() const = 0;  // in all shards together
  virtual int64_t num_tokens() const = 0;   // in all shards together
  virtual uint32_t vocab_size() const = 0;
};

// Opens the loader. Reads and validates every shard. INVALID_ARGUMENT for bad options
// (naming the field), for a seq_len longer than every shard, or for data holding fewer
// windows than one global batch; NOT_FOUND for a missing manifest or shard file; DATA_LOSS
// for a corrupt shard or one whose token count or vocab disagrees with the manifest.
Result<std::unique_ptr<DataLoader>> OpenDataLoader(const LoaderOptions& options);

// The permutation of 0..n-1 that `seed` gives: Fisher-Yates driven by SplitMix64, the same
// on every platform and compiler. The loader shuffles with it; `kc data prepare` too.
std::vector<uint64_t> DeterministicPermutation(uint64_t n, uint64_t seed);

}  // namespace kc::parallel
