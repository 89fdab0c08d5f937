// Tensor parallelism (Megatron-LM's layout) apart from the model's arithmetic: how each GPT
// parameter is split over the t ranks of a tensor-parallel group, a rank's shard of a whole
// tensor and back, and the group collective the model calls in the middle of its passes.
//
// The split, per block: the attention's qkv and the MLP's first layer are column-parallel
// (each rank computes its heads / its 1/t of the hidden units, so their weights and biases
// are split over the output rows); the attention projection and the MLP's second layer are
// row-parallel (split over the input columns; each rank's product is a partial sum, all-reduced
// once per block in the forward; their biases are whole and added after). The embeddings and the
// LM head are split over the vocabulary, padded to a multiple of t. LayerNorms, wpe and the
// row-parallel biases are replicated: every rank computes the same gradient for them.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "comm/reduce.h"
#include "hal/compute.h"
#include "parallel/model_spec.h"

namespace kc::parallel {

enum class TpSplit : uint8_t {
  kReplicated = 0,  // every rank holds all of it
  kVocab = 1,       // rows are the vocabulary, ceil(V / t) per rank (wte, lm_head.weight)
  kRows = 2,        // dim 0, the output features (mlp.fc.weight and .bias)
  kQkvRows = 3,     // dim 0 in three blocks q, k, v, each split (attn.qkv.weight and .bias)
  kColumns = 4,     // dim 1, the input features (attn.proj.weight, mlp.proj.weight)
};
std::string_view TpSplitName(TpSplit split);  // "replicated", "vocab", "rows", ...

// How the tensor named `name` (ParameterTensors' names) is split.
TpSplit TensorParallelSplit(std::string_view name);

// The vocabulary rows each rank holds: ceil(vocab / t); rank r's are [r * shard, ...), and
// those at or past `vocab` are padding (zero, and left out of the softmax).
int64_t VocabShard(int64_t vocab, int t);

// The shape of one rank's shard of a tensor of `shape` split as `split` over t ranks.
std::vector<int64_t> ShardShape(std::span<const int64_t> shape, TpSplit split, int t);

// Copies rank's shard of `whole` (of `shape`) into `shard` (ShardShape's element count);
// padding rows become 0. InsertShard is the reverse (padding dropped): gathering the t shards
// rebuilds the whole tensor.
template <typename Real>
void ExtractShard(std::span<const Real> whole, std::span<const int64_t> shape, TpSplit split,
                  int rank, int t, std::span<Real> shard);
template <typename Real>
void InsertShard(std::span<const Real> shard, std::span<const int64_t> shape, TpSplit split,
                 int rank, int t, std::span<Real> whole);

// kInvalidArgument unless t >= 1 divides the model's heads and ffn_hidden; the message names
// the constraint that failed and the t that would work.
Status ValidateTensorParallel(const ModelSpec& spec, int t);

// One rank's view of its tensor-parallel group: the collective the model runs inside its
// passes. Every member calls AllReduce with the same count and type in the same order; it
// blocks until the result is in `data`, the same on every member.
class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Status AllReduce(std::span<std::byte> data, size_t count, hal::DataType type,
                           comm::ReduceOp op) = 0;

  template <typename Real>
  Status AllReduce(std::span<Real> data, comm::ReduceOp op) {
    return AllReduce(std::as_writable_bytes(data), data.size(), hal::DataTypeOf<Real>::value, op);
  }
};

}  // namespace kc::parallel
