// Checkpoints: every rank saves the parts of the training state it owns, in content-addressed
// chunks, and rank 0 commits a manifest last. Sharded (each rank writes its own), incremental
// (a chunk whose hash the rank wrote in its previous checkpoint is referenced, not written
// again, and a changed one is stored as a delta against its previous content: fault/chunk_delta.h,
// with a full save every CheckpointOptions::full_every saves to bound the chain), checksummed
// (XXH3-128 of every chunk, and of every rank's index in the manifest), optionally compressed
// (zstd), atomic (temporary name, fsync, rename; the manifest last), asynchronous (a copy to memory
// at the step boundary, persisted by a background thread), and plan-independent: a tensor is saved
// as pieces of the whole tensor, so a checkpoint loads into any plan of the same model (another d,
// t or p).
//
// On disk (docs/operations/checkpoints.md):
//   DIR/step-00000120/MANIFEST.json   the commit: step, data position, plan, model, rank files
//   DIR/step-00000120/rank-00003.json rank 3's pieces: tensor, kind, shard, chunk references
//   DIR/step-00000120/chunks/HASH.bin the chunks this checkpoint wrote (.zst: compressed,
//                                     .xor.zst: a delta against the chunk its reference names)
// A later checkpoint's rank files may reference chunks in an earlier one's directory; retention
// removes a directory's chunks once no kept checkpoint references them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "comm/store.h"
#include "parallel/tensor_parallel.h"
#include "parallel/trainer.h"

namespace kc::fault {

// XXH3-128 of `data`, as 32 hexadecimal digits.
std::string ContentHash(std::span<const std::byte> data);

struct CheckpointOptions {
  std::string dir;                // where the step-N directories go
  int keep = 3;                   // committed checkpoints kept (the newest); at least 1
  bool compress = false;          // zstd (level 1) the chunks
  int64_t chunk_bytes = 4 << 20;  // content is cut into chunks of this size
  // Every full_every-th save of a writer (its first included) stores whole chunks; the saves
  // between store each changed chunk as a delta against the previous save's, so restoring one
  // reads at most full_every - 1 bases. 1: every save full. A writer keeps its previous save in
  // memory for this (twice the snapshot's memory).
  int full_every = 8;
  // Drills (kc train --inject-fault ...:kill-in-persist): called on the persist thread as it
  // starts persisting the checkpoint of `step`.
  std::function<void(int64_t step)> on_persist;
};

// What the manifest records besides the shards.
struct CheckpointInfo {
  int64_t step = 0;          // steps done: training resumes with step + 1
  std::string loader_state;  // parallel::LoaderState::Serialize
  nlohmann::json plan;       // the plan it was saved with (informational: any plan loads it)
  nlohmann::json model;      // the model's fields; loading checks them
};

// Which pieces of the state a rank saves: each element once over all ranks. Replicated
// tensors: tensor-parallel rank 0 only; a tied wte's second copy: never; without ZeRO-1
// replica 0 saves values and moments, with ZeRO-1 each replica its optimizer's part of both.
struct Ownership {
  int dp_rank = 0;
  int tp_rank = 0;
  bool zero = false;
};

// One chunk of a piece: its file (STEP-DIR/chunks/HASH.bin, .zst or .xor.zst, under the
// checkpoint directory), its content hash, its size once decoded; a delta (.xor.zst) also names
// its base, the chunk it was encoded against (itself a delta or not).
struct ChunkRef {
  std::string file;
  std::string hash;
  int64_t bytes = 0;           // a multiple of 4, at most kMaxChunkBytes
  std::vector<ChunkRef> base;  // one for a delta, else none
};
inline constexpr int64_t kMaxChunkBytes = int64_t{1} << 28;
inline constexpr int kMaxDeltaChain = 64;  // bases a chunk reference may nest
// Adds the files `ref` needs to `files`: its own and its bases'.
void AddChunkFiles(const ChunkRef& ref, std::set<std::string>* files);

struct SaveStats {
  int64_t step = 0;
  double stall_s = 0;     // the step's wait: the previous persist, then the copy
  double persist_s = 0;   // the background thread's time for this checkpoint
  int64_t raw_bytes = 0;  // content of this rank's pieces
  int64_t chunks_written = 0;
  int64_t chunks_reused = 0;  // unchanged since this rank's previous checkpoint
  int64_t chunks_delta = 0;   // of chunks_written, stored as deltas against the previous save
  int64_t bytes_written = 0;  // chunk bytes on disk, written now
};

// One rank's saver. Not thread-safe: the training thread calls Save and Wait.
class CheckpointWriter {
 public:
  // `store` (not owned; null for one rank): each rank announces its committed rank file there
  // and rank 0 waits for all of them before it writes the manifest.
  static Result<std::unique_ptr<CheckpointWriter>> Create(const CheckpointOptions& options,
                                                          int rank, int ranks, comm::Store* store);
  ~CheckpointWriter();  // waits for the persist in flight

  // Allocates (and touches) the memory Save will copy `tensors` into, so that the first
  // checkpoint's step does not pay for faulting it in. Optional.
  void Prepare(std::span<const parallel::StateTensor> tensors, const Ownership& owner);

  // Copies this rank's pieces of `tensors` to memory, first waiting for the previous persist,
  // then starts persisting them in the background. The previous persist's failure is returned
  // here (that checkpoint is not committed). The stall is in last_stats() once persisted.
  Status Save(std::span<const parallel::StateTensor> tensors, const Ownership& owner,
              const CheckpointInfo& info);
  // Waits for the persist in flight; its status.
  Status Wait();
  // From any thread: the group that would commit the persist in flight is gone; rank 0 stops
  // waiting for the other ranks' files: it commits if they are all there already, else the
  // persist fails with kAborted and that checkpoint is not committed.
  void Abandon() { abandoned_.store(true, std::memory_order_release); }
  // A persist is running in the background.
  bool persisting() const { return persisting_.load(std::memory_order_acquire); }
  // The last persisted checkpoint's figures (after Wait, or the next Save); step -1 before
  // the first.
  SaveStats last_stats() const;

 private:
  CheckpointWriter(CheckpointOptions options, int rank, int ranks, comm::Store* store);
  struct Piece;
  // Lists this rank's pieces of `tensors` into pieces_; returns their values.
  size_t ListPieces(std::span<const parallel::StateTensor> tensors, const Ownership& owner);
  Status Persist();
  // The references the previous save wrote for piece `piece` of this one, or null when that
  // save had other pieces.
  const std::vector<ChunkRef>* BaseRefs(size_t piece) const;

  const CheckpointOptions options_;
  const int rank_;
  const int ranks_;
  comm::Store* const store_;
  std::vector<Piece> pieces_;  // this snapshot's, their content in snapshot_
  std::vector<float> snapshot_;
  CheckpointInfo info_;
  // The last persisted save: its content (the base of this save's deltas), its pieces, the
  // references it wrote for each piece, and how many delta saves since a full one it was.
  std::vector<float> base_;
  std::vector<Piece> base_pieces_;
  std::vector<std::vector<ChunkRef>> base_refs_;
  int base_depth_ = 0;
  std::thread persist_;
  std::atomic<bool> abandoned_{false};
  std::atomic<bool> persisting_{false};
  Status persist_status_;
  SaveStats stats_;
  SaveStats last_;
};

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;  // DIR/step-N
};
// Committed checkpoints under `dir` (those with a manifest), newest first; not verified.
// An absent directory has none.
Result<std::vector<CheckpointEntry>> ListCheckpoints(const std::string& dir);

// A checkpoint's files as read back, every field checked: a manifest or rank file that is not
// JSON, lacks a key, has one of the wrong type or out of range, or names a file outside its
// checkpoint directory is kDataLoss as "FILE: key.path: what was expected" (a file written by
// someone else is data, never trusted to be what the writer made).

// A piece of a tensor one rank saved: `count` values at `offset` of tensor-parallel shard
// `tp_rank` of `tp_size`.
struct PieceIndex {
  std::string tensor;
  std::string kind;  // "param", "exp_avg", "exp_avg_sq"
  std::vector<int64_t> shape;
  parallel::TpSplit split = parallel::TpSplit::kReplicated;
  int tp_rank = 0;
  int tp_size = 1;
  int64_t offset = 0;
  int64_t count = 0;  // whose bytes the chunks hold: 4 * count
  std::vector<ChunkRef> chunks;
};

// A rank file (rank-NNNNN.json): the pieces one rank saved.
struct RankIndex {
  int rank = 0;
  std::vector<PieceIndex> pieces;
};

// A manifest (MANIFEST.json): the commit of one checkpoint.
struct Manifest {
  int64_t step = 0;
  std::string loader_state;
  nlohmann::json plan;   // an object (informational)
  nlohmann::json model;  // an object: the model's fields
  int ranks = 0;
  bool compress = false;
  int64_t chunk_bytes = 0;
  double created_unix = 0;
  struct RankFile {
    std::string file;  // rank-NNNNN.json
    std::string hash;  // of its text
  };
  std::vector<RankFile> rank_files;
};

// Parses a manifest's or a rank file's text; `file` names it in errors.
Result<Manifest> ParseManifest(std::string_view text, const std::string& file);
Result<RankIndex> ParseRankFile(std::string_view text, const std::string& file);

// The manifest of the checkpoint at `path`: kDataLoss naming the file and key when unreadable.
Result<Manifest> ReadManifest(const std::string& path);

struct VerifyReport {
  int ranks = 0;
  int64_t pieces = 0;
  int64_t chunks = 0;
  int64_t raw_bytes = 0;
  int64_t stored_bytes = 0;
};
// Reads the manifest, every rank file (its hash against the manifest's) and every chunk it
// references (decompressed and hashed): kDataLoss naming the file and the fault.
Result<VerifyReport> VerifyCheckpoint(const std::string& path);

// The newest checkpoint under `dir` that verifies; a line per newer one that did not goes to
// `skipped` ("PATH: reason"). kNotFound when there is none.
Result<CheckpointEntry> LatestGoodCheckpoint(const std::string& dir,
                                             std::vector<std::string>* skipped);

// Loads the checkpoint at `path` into `tensors` (their values, and their moments): each is
// put together whole from the pieces every rank saved and cut into this rank's shard, so any
// plan of the same model loads it. Every chunk read is verified. kDataLoss for a corrupt or
// missing chunk, kInvalidArgument for a tensor the checkpoint lacks or has another shape of.
Status RestoreTensors(const std::string& path, std::span<parallel::StateTensor> tensors);

// Keeps the newest `keep` committed checkpoints under `dir` and removes the rest, and every
// chunk no kept checkpoint references in directories older than the newest commit (abandoned
// attempts included). Rank 0 calls it after a commit.
Status PruneCheckpoints(const std::string& dir, int keep);

}  // namespace kc::fault
