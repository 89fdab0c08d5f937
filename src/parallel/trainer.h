// Training of the GPT on one rank of a t x p x d plan (tensor, pipeline and data parallel;
// TrainerOptions says how ranks map to groups). Each step loads this rank's share of the
// global batch (even, or not: parallel/batch_share.h), runs forward and backward, reduces the
// gradients across ranks through L2 gradient buckets as the backward produces them (a bucket's
// all-reduce starts the moment its last gradient is final, so communication hides behind the rest
// of the backward), clips, and applies AdamW. Every rank runs the same steps; with the same global
// batch and seed the loss does not depend on the rank count (up to float summation order).
//
// The step loop itself (cadence, progress, checkpoints) belongs to the caller: the resilient
// runner of L5 (fault/runner.h), driven by its elastic worker (fault/elastic_worker.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/status.h"
#include "comm/bucket.h"
#include "comm/communicator.h"
#include "hal/compute.h"
#include "parallel/data/loader.h"
#include "parallel/gpt_model.h"
#include "parallel/model_spec.h"
#include "parallel/optimizer.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/plan.h"
#include "parallel/precision.h"
#include "parallel/timeline.h"

namespace kc::parallel {

class TensorParallelLink;  // trainer.cc: a TensorParallelGroup over a sub-communicator
class CudaGpt;             // cuda/cuda_gpt.h
class CudaAdamW;

// How gradients cross ranks.
enum class GradSync : uint8_t {
  // Fused buckets, each all-reduced as soon as it is complete, in the background while the
  // backward goes on (the default).
  kBucketed = 0,
  kPerTensor = 1,  // one all-reduce per tensor after the backward, waited in turn (baseline)
};
std::string_view GradSyncName(GradSync sync);  // "bucketed", "per-tensor"
Result<GradSync> ParseGradSync(std::string_view name);

struct TrainerOptions {
  // The model; its batch_per_rank is not read: plan.micro_batch_size is the micro-batch.
  ModelSpec spec;
  // The plan this rank runs, as planned (and approved): t x p x d must be the communicator's
  // size (d: this generation's replicas), and EngineSupports(plan, device) must accept it.
  // Ranks are numbered Megatron's way, tensor-parallel rank fastest, then replica, then stage:
  // rank = (stage * d + replica) * t + tp_rank, so a tensor-parallel group is t consecutive ranks
  // (the launcher keeps consecutive ranks on neighbouring cores of one host: the fastest links).
  // t: each rank holds its shard of every layer (GptOptions::tensor_parallel) and all-reduces
  // within its group on the activation lane; data-parallel buckets, ZeRO-1 and the pipeline run
  // per tensor-parallel rank. p: stage s holds BalanceStages' layers and runs the schedule's
  // passes over micro_batches micro-batches, activations and their gradients crossing stages by
  // send/recv on the activation lane (interleaved: v model chunks per stage; stage s holds
  // virtual stages s, s + p, ...). micro_batches: the rank's batch is micro_batches x
  // micro_batch_size sequences, run as that many forward/backward passes whose gradients add up
  // (the buckets start after the last one). zero_stage 1: the optimizer's moments and update
  // sharded over the replicas (each updates its 1/d of the parameters, then the parameters are
  // all-gathered). recompute (GptOptions::recompute): each layer's forward runs again in the
  // backward; not with ZB-H1.
  ParallelPlan plan;
  LoaderOptions data;        // seq_len, batch, rank and world_size are set from the rest
  LoaderOptions validation;  // empty manifest and files: no validation
  int64_t total_steps = 0;   // for the learning-rate schedule
  hal::ComputeDevice* device = nullptr;  // not owned; outlives the trainer
  comm::Communicator* comm = nullptr;    // not owned; null for one rank
  int compute_threads = 1;  // threads sharing each pass, by sequences (GptOptions::threads)
  // Sequences per step over all data-parallel replicas; 0: plan.global_batch() (even shares).
  // Else replica k takes ShareOfBatch(global_batch, d, k, ...) of it (parallel/batch_share.h:
  // 32 over 3 replicas as 11, 11, 10), cut into micro-batches as near plan.micro_batch_size x
  // plan.micro_batches as it allows, and its gradient and loss count for its share of the
  // global batch's tokens (a weighted mean, not a mean of the replicas' means), so the loss does
  // not depend on how the batch is split.
  int64_t global_batch = 0;
  GradSync grad_sync = GradSync::kBucketed;
  int64_t bucket_bytes = 2 << 20;
  // What the data-parallel gradient all-reduces send: f32, or bf16 (comm::WireFormat: half the
  // bytes on the ring, additions in f32; every replica ends with the same gradients).
  comm::WireFormat grad_wire = comm::WireFormat::kNative;
  // fp32, or bf16 mixed precision (CUDA devices only). On a CUDA device the model is
  // cuda/cuda_gpt.h's, whole on each rank: data parallelism only (EngineSupports), its
  // gradients averaged through host memory after the backward.
  Precision precision = Precision::kFp32;
  // Where each step's spans go (data, forward, backward, optimizer, and the communication
  // the step waits for); not owned; null: none.
  Timeline* timeline = nullptr;
};

// What one step did, on this rank. Times are seconds of wall clock.
struct StepStats {
  int64_t step = 0;  // 0-based index of the step just taken
  double loss = 0;   // mean over the global batch (all-reduced)
  double lr = 0;
  double grad_norm = 0;       // of the averaged gradient, before clipping
  double step_s = 0;          // the whole step
  double compute_s = 0;       // forward, backward and optimizer: step_s - comm_exposed_s
  double comm_exposed_s = 0;  // waiting for or running communication on the step's path
  double tp_comm_s = 0;       // of which the tensor-parallel all-reduces inside the passes
  int64_t tokens = 0;         // in the global batch
  // With pipelining, per stage: the share of the pipeline's time (from the step's first pass
  // to the last stage's last, the slowest stage's) that the stage spent outside its forward
  // and backward passes: waiting for inputs, and the flush. Every rank gets every stage's.
  std::vector<double> stage_bubble;
};

// A parameter tensor as one rank holds it, for checkpoints (the fault layer decides who saves
// what): the whole tensor's name and shape, how this rank's shard is cut from it, the shard's
// values, and the AdamW moments of the parts of it this rank's optimizer updates.
struct StateTensor {
  std::string name;            // ParameterTensors' name
  std::vector<int64_t> shape;  // the whole tensor's
  TpSplit split = TpSplit::kReplicated;
  int tp_rank = 0;
  int tp_size = 1;
  std::span<float> values;  // this rank's shard, all of it
  struct Moments {
    int64_t offset = 0;     // into the shard
    std::span<float> m, v;  // the first and second moments of [offset, offset + m.size())
  };
  std::vector<Moments> moments;  // this rank's optimizer slots in it (ZeRO-1: a part)
  // A tied wte's second copy (on the last pipeline stage): the same values as the first's.
  bool second_copy = false;
};

class Trainer {
 public:
  // Opens the loaders, allocates the model and optimizer, initialises the parameters from
  // spec.training.seed and makes every rank's copy identical (a broadcast from rank 0).
  // Collective when comm is set: every rank calls Create with the same spec.
  static Result<std::unique_ptr<Trainer>> Create(const TrainerOptions& options);
  ~Trainer();

  // One training step. A communication failure (a peer gone) returns its error.
  Result<StepStats> Step();

  // From any thread: fails every communicator the trainer uses (options.comm and the groups
  // split from it), so that a step or an evaluation in flight returns `reason` at once and
  // peers blocked on this rank fail too. The trainer is of no further use.
  void Abort(Status reason);

  // Mean loss over the first `batches` validation batches of every rank (the same ones each
  // time; collective), or
  // kFailedPrecondition when there is no validation data.
  Result<double> Evaluate(int64_t batches);

  // This rank's model: the whole GPT, or its pipeline stage's part (its first chunk when
  // interleaved). REQUIRES: !on_cuda() (the CUDA model is cuda_model()).
  Gpt<float>& model() {
    KC_CHECK(!chunks_.empty()) << "Trainer::model() of a CUDA trainer";
    return *chunks_.front();
  }
  bool on_cuda() const { return cuda_model_ != nullptr; }
  // The bytes of every chunk this rank holds.
  int64_t arena_bytes() const;
  // Every pipeline stage's activation memory (its chunks' slots), the same on every rank; one
  // entry without pipelining.
  const std::vector<int64_t>& stage_activation_bytes() const { return stage_activation_bytes_; }
  int stage() const { return stage_; }
  int stages() const { return stages_; }  // p
  int dp_rank() const { return dp_rank_; }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_; }  // t
  int zero_stage() const { return options_.plan.zero_stage; }

  // Every parameter tensor this rank holds, with views of its values and moments (valid while
  // the trainer is): what a checkpoint saves and restores. On a CUDA device the views are of
  // a host copy, which each call refreshes from the device (it waits for the device).
  std::vector<StateTensor> StateTensors();
  // After restoring StateTensors' values and moments: the steps taken and where the data
  // stands, so the next Step is the one after the checkpoint's (learning rate, bias
  // corrections, batches); on a CUDA device it also uploads the restored values.
  // kInvalidArgument for a loader state of other data.
  Status RestoreProgress(int64_t steps, const LoaderState& loader);
  DataLoader& loader() { return *loader_; }
  int64_t steps_done() const { return step_; }
  int64_t grad_buckets() const { return buckets_ != nullptr ? buckets_->num_buckets() : 0; }

 private:
  explicit Trainer(TrainerOptions options);
  Status Init();
  // Records [from, now) of this step on the timeline, if any, and returns now.
  std::chrono::steady_clock::time_point Span(const char* name, SpanKind kind,
                                             std::chrono::steady_clock::time_point from);
  // The training and validation loaders of this rank's replica.
  Status OpenLoaders();
  // This replica's share of the global batch (options_.global_batch): sets the micro-batching
  // in options_ and share_weight_.
  Status ApplyShare();
  // What each token's loss gradient is scaled by: d / the global batch's tokens.
  double GradScale() const;
  // Init and Step on a CUDA device.
  Status InitCuda();
  Result<StepStats> StepCuda();
  // The sub-communicators of a plan with t > 1 or p > 1 (collective, in one order).
  Status InitGroups();
  Status InitPipeline();
  Status SyncGradients(double* comm_s);
  // The mean of a per-replica value over the data-parallel replicas; with pipelining the
  // value is the last stage's (the others pass 0).
  Result<double> AverageAcrossRanks(double value);
  // The L2 norm of the whole (averaged) gradient; every rank gets the same.
  Result<double> GradNorm();
  // One pass of the pipeline schedule; `comm_s` collects the time spent waiting on peers.
  Status RunPipelineOp(const PipeOp& op, std::span<const int32_t> inputs,
                       std::span<const int32_t> targets, double grad_scale, bool last_backward,
                       bool first_backward, double* loss, double* comm_s);

  TrainerOptions options_;
  int tp_ = 1;                // t
  int tp_rank_ = 0;           // this rank's place in its tensor-parallel group
  int world_ = 1;             // data-parallel replicas (d)
  int dp_rank_ = 0;           // this rank's replica
  int stage_ = 0;             // this rank's pipeline stage
  int stages_ = 1;            // p
  int v_ = 1;                 // model chunks per stage (interleaved)
  int64_t global_batch_ = 0;  // sequences per step over the replicas
  double share_weight_ = 1;   // this replica's share of the global batch, times d (1: even)
  comm::Communicator* dp_comm_ = nullptr;  // the replicas of this stage (options_.comm when p = 1)
  std::unique_ptr<comm::Communicator> dp_owned_;
  std::unique_ptr<comm::Communicator> tp_comm_;     // this rank's tensor-parallel group
  std::unique_ptr<TensorParallelLink> tp_link_;     // the models' view of tp_comm_
  std::unique_ptr<comm::Communicator> pipe_comm_;   // this replica's stages
  std::unique_ptr<comm::Communicator> embed_comm_;  // first and last stage: tied wte gradients
  std::vector<PipeOp> ops_;                         // this stage's passes, in order
  int wte_chunk_ = -1;  // the chunk and tensor of a tied wte that is one of two copies
  int wte_tensor_ = -1;
  double pass_s_ = 0;  // this step's forward and backward time on this stage
  std::vector<int64_t> stage_activation_bytes_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<DataLoader> validation_;
  LoaderState validation_start_;
  std::vector<std::unique_ptr<Gpt<float>>> chunks_;  // v of them; one without interleaving
  std::unique_ptr<AdamW<float>> optimizer_;
  std::unique_ptr<comm::GradientBuckets> buckets_;
  std::vector<std::vector<int>> bucket_index_;  // per chunk: tensor -> its index in the buckets
  // The optimizer's slots, in its order: which chunk and tensor, from which element.
  struct SlotRef {
    int chunk = 0;
    int tensor = 0;
    int64_t offset = 0;
    int64_t count = 0;
  };
  std::vector<SlotRef> slot_refs_;
  Batch batch_;
  int64_t step_ = 0;
  // On a CUDA device: the model, its optimizer, and host memory for the gradients' all-reduce
  // and for StateTensors (values, then the moments).
  std::unique_ptr<CudaGpt> cuda_model_;
  std::unique_ptr<CudaAdamW> cuda_optimizer_;
  std::vector<float> host_grads_;
  std::vector<float> host_state_;
};

}  // namespace kc::parallel
