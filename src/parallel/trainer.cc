#include "parallel/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>
#include <utility>

#include "base/check.h"
#include "base/layer_guard.h"
#include "comm/collectives.h"
#include "hal/kernels.h"
#include "parallel/batch_share.h"
#include "parallel/cuda/cuda_gpt.h"
#include "parallel/engine_support.h"

namespace kc::parallel {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <typename T>
std::span<std::byte> Bytes(std::span<T> s) {
  return std::as_writable_bytes(s);
}

}  // namespace

// The tensor-parallel group of a rank's models, over its sub-communicator on the activation
// lane; times its all-reduces and puts them on the timeline. Called from whichever worker
// thread runs the pass's serial step, never two at once (WorkerPool::Sync).
class TensorParallelLink final : public TensorParallelGroup {
 public:
  TensorParallelLink(comm::Communicator* comm, Timeline* timeline)
      : comm_(comm), timeline_(timeline) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  Status AllReduce(std::span<std::byte> data, size_t count, hal::DataType type,
                   comm::ReduceOp op) override {
    const auto t0 = std::chrono::steady_clock::now();
    KC_ASSIGN_OR_RETURN(auto work,
                        comm_->Allreduce(data, count, type, op, {.lane = comm::Lane::kActivation}));
    Status s = work->Wait();
    seconds_ += Since(t0);
    if (timeline_ != nullptr) {
      timeline_->Add("tensor-parallel all-reduce", SpanKind::kComm, step_, t0,
                     std::chrono::steady_clock::now());
    }
    return s;
  }
  // The seconds spent since the last call; the step the spans belong to from now.
  double Take(int64_t step) {
    step_ = step;
    return std::exchange(seconds_, 0.0);
  }

 private:
  comm::Communicator* const comm_;
  Timeline* const timeline_;
  double seconds_ = 0;
  int64_t step_ = 0;
};

std::string_view GradSyncName(GradSync sync) {
  switch (sync) {
    case GradSync::kBucketed:
      return "bucketed";

    case GradSync::kPerTensor:
      return "per-tensor";
  }
  return "unknown";
}

Result<GradSync> ParseGradSync(std::string_view name) {
  if (name == "bucketed") return GradSync::kBucketed;
  if (name == "per-tensor") return GradSync::kPerTensor;
  return InvalidArgumentError("grad sync '" + std::string(name) +
                              "': expected bucketed or per-tensor");
}

Trainer::Trainer(TrainerOptions options) : options_(std::move(options)) {}
Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options) {
  KC_LAYER_ENTRY(Layer::kParallel, "trainer");
  KC_CHECK(options.device != nullptr);
  std::unique_ptr<Trainer> t(new Trainer(options));
  KC_RETURN_IF_ERROR(t->Init());
  return t;
}

Status Trainer::Init() {
  const ParallelPlan& plan = options_.plan;
  if (plan.micro_batch_size < 1 || plan.micro_batches < 1) {
    return InvalidArgumentError(
        "trainer: the plan's micro_batch_size and micro_batches must be >= 1");
  }
  options_.spec.batch_per_rank = plan.micro_batch_size;
  const ModelSpec& spec = options_.spec;
  KC_RETURN_IF_ERROR(ValidateModelSpec(spec));
  comm::Communicator* comm = options_.comm;
  const int size = comm != nullptr ? comm->size() : 1;
  if (plan.world() != size) {
    return InvalidArgumentError(
        fmt::format("trainer: the plan ({}) is for t*p*d = {} ranks; this group has {}",
                    PlanToString(plan), plan.world(), size));
  }
  KC_RETURN_IF_ERROR(EngineSupports(plan, options_.device->id().kind).WithContext("trainer"));
  if (options_.device->id().kind == hal::DeviceKind::kCuda) return InitCuda();
  if (options_.precision != Precision::kFp32) {
    return UnimplementedError("trainer: " + std::string(PrecisionName(options_.precision)) +
                              " training runs on CUDA devices only; the CPU engine trains in fp32");
  }
  stages_ = options_.plan.p;
  tp_ = options_.plan.t;
  if (tp_ < 1 || stages_ < 1 || size % (tp_ * stages_) != 0 || stages_ > spec.layers) {
    return InvalidArgumentError("trainer: t=" + std::to_string(tp_) +
                                " and p=" + std::to_string(stages_) + " for " +
                                std::to_string(size) + " ranks and " + std::to_string(spec.layers) +
                                " layers: t * p must divide the ranks and p be at most the layers");
  }
  if (tp_ > 1) KC_RETURN_IF_ERROR(ValidateTensorParallel(spec, tp_));
  const int global_rank = comm != nullptr ? comm->rank() : 0;
  tp_rank_ = global_rank % tp_;
  world_ = size / (tp_ * stages_);
  stage_ = global_rank / tp_ / world_;
  dp_rank_ = global_rank / tp_ % world_;
  KC_RETURN_IF_ERROR(ApplyShare());
  dp_comm_ = comm;
  if (stages_ > 1 || tp_ > 1) KC_RETURN_IF_ERROR(InitGroups());
  if (stages_ > 1) KC_RETURN_IF_ERROR(InitPipeline());
  comm = dp_comm_;
  const int rank = dp_rank_;
  KC_RETURN_IF_ERROR(OpenLoaders());
  // This rank's chunks: the whole model, its stage's layers, or (interleaved) v of the p * v
  // virtual stages' layers; each with as many activation slots as the schedule keeps its
  // micro-batches in flight.
  std::vector<int> bounds = {0, static_cast<int>(spec.layers)};
  if (stages_ > 1) {
    KC_ASSIGN_OR_RETURN(bounds, BalanceStages(spec, stages_ * v_));
  }
  for (int c = 0; c < v_; ++c) {
    GptOptions gpt{.threads = options_.compute_threads,
                   .recompute = options_.plan.recompute,
                   .tensor_parallel = tp_link_.get()};
    if (stages_ > 1) {
      const size_t vs = static_cast<size_t>(c * stages_ + stage_);
      gpt.first_layer = bounds[vs];
      gpt.end_layer = bounds[vs + 1];
      // Activations are held from the forward to the pass that frees them: B, or ZB-H1's W.
      int held = 0;
      for (int in_flight = 0; const PipeOp& op : ops_) {
        if (op.chunk != c || op.kind == PipeOpKind::kBackwardInput) continue;
        in_flight += op.kind == PipeOpKind::kForward ? 1 : -1;
        held = std::max(held, in_flight);
      }
      gpt.slots = std::max(held, 1);
      gpt.split_backward = options_.plan.schedule == Schedule::kZeroBubbleH1;
    }
    KC_ASSIGN_OR_RETURN(std::unique_ptr<Gpt<float>> chunk,
                        Gpt<float>::Create(spec, options_.device, gpt));
    chunk->InitParameters(spec.training.seed);
    if (stages_ > 1 && spec.tied_embeddings && (chunk->has_embedding() || chunk->has_head())) {
      for (size_t i = 0; i < chunk->tensors().size(); ++i) {
        if (chunk->tensors()[i].name != "wte") continue;
        wte_chunk_ = c;
        wte_tensor_ = static_cast<int>(i);
      }
    }
    chunks_.push_back(std::move(chunk));
  }

  // Each stage's activation memory, for every rank to report.
  int64_t activations = 0;
  for (const auto& chunk : chunks_) activations += chunk->activation_bytes();
  stage_activation_bytes_.assign(static_cast<size_t>(stages_), 0);
  stage_activation_bytes_[static_cast<size_t>(stage_)] = activations;
  if (stages_ > 1) {
    std::vector<double> gathered(static_cast<size_t>(stages_), 0.0);
    gathered[static_cast<size_t>(stage_)] = static_cast<double>(activations);
    KC_ASSIGN_OR_RETURN(auto work, pipe_comm_->Allgather(Bytes(std::span<double>(gathered)),
                                                         gathered.size(), hal::DataType::kF64));
    KC_RETURN_IF_ERROR(work->Wait());
    for (size_t i = 0; i < gathered.size(); ++i) {
      stage_activation_bytes_[i] = static_cast<int64_t>(gathered[i]);
    }
  }

  bucket_index_.assign(chunks_.size(), {});
  if (comm != nullptr && world_ > 1) {
    // Every rank starts from rank 0's parameters, as DDP does.
    for (const auto& chunk : chunks_) {
      KC_ASSIGN_OR_RETURN(auto work, comm->Broadcast(Bytes(chunk->params()), 0));
      KC_RETURN_IF_ERROR(work->Wait());
    }
    if (options_.grad_sync != GradSync::kPerTensor) {
      // Registered in backward order (the last chunk first), so buckets fill (and start) as
      // the backward goes.
      const std::vector<TensorSpec> backward = ParameterTensorsBackwardOrder(spec);
      std::vector<std::span<std::byte>> spans;
      for (size_t c = chunks_.size(); c-- > 0;) {
        const std::vector<TensorSpec>& tensors = chunks_[c]->tensors();
        bucket_index_[c].assign(tensors.size(), -1);
        for (const TensorSpec& b : backward) {
          for (size_t i = 0; i < tensors.size(); ++i) {
            if (tensors[i].name != b.name) continue;
            bucket_index_[c][i] = static_cast<int>(spans.size());
            spans.push_back(Bytes(chunks_[c]->grad(static_cast<int>(i))));
          }
        }
      }
      KC_ASSIGN_OR_RETURN(
          buckets_, comm::GradientBuckets::Create(comm, spans,
                                                  {.bucket_bytes = options_.bucket_bytes,
                                                   .dtype = hal::DataType::kF32,
                                                   .op = comm::ReduceOp::kAvg,
                                                   .op_options = {.wire = options_.grad_wire}}));
      buckets_->AdoptViews();
      for (size_t c = 0; c < chunks_.size(); ++c) {
        std::vector<std::span<float>> storage;
        for (int index : bucket_index_[c]) {
          std::span<std::byte> v = buckets_->view(index);
          storage.emplace_back(reinterpret_cast<float*>(v.data()), v.size() / sizeof(float));
        }
        chunks_[c]->SetGradientStorage(std::move(storage));
      }
    }
  }
  // The parameters this rank updates: all of them, or with ZeRO-1 its part of each chunk's
  // arena (ChunkOf, as Allgather splits it), which may cut tensors.
  std::vector<OptimizerSlot<float>> slots;
  for (const auto& chunk : chunks_) {
    const std::vector<TensorSpec>& tensors = chunk->tensors();
    size_t lo = 0, hi = chunk->params().size();
    if (options_.plan.zero_stage == 1 && world_ > 1) {
      const comm::ChunkRange c = comm::ChunkOf(hi, world_, rank);
      lo = c.offset;
      hi = c.offset + c.count;
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const size_t begin = static_cast<size_t>(tensors[i].offset);
      const size_t end = begin + static_cast<size_t>(tensors[i].num_elements);
      const size_t from = std::max(begin, lo), to = std::min(end, hi);
      if (from >= to) continue;
      slots.push_back({chunk->param(static_cast<int>(i)).subspan(from - begin, to - from),
                       chunk->grad(static_cast<int>(i)).subspan(from - begin, to - from),
                       tensors[i].shape.size() == 2});
      slot_refs_.push_back({static_cast<int>(&chunk - chunks_.data()), static_cast<int>(i),
                            static_cast<int64_t>(from - begin), static_cast<int64_t>(to - from)});
    }
  }
  KC_ASSIGN_OR_RETURN(optimizer_,
                      AdamW<float>::Create(spec.training, std::move(slots), options_.device));
  return OkStatus();
}

void Trainer::Abort(Status reason) {
  // The pointers were set by Init, before the trainer was handed out, and never change.
  for (comm::Communicator* c :
       {options_.comm, dp_owned_.get(), tp_comm_.get(), pipe_comm_.get(), embed_comm_.get()}) {
    if (c != nullptr) c->Abort(reason);
  }
}

Status Trainer::ApplyShare() {
  const int64_t b = options_.spec.batch_per_rank, m = options_.plan.micro_batches;
  global_batch_ = options_.global_batch > 0 ? options_.global_batch : b * m * world_;
  KC_ASSIGN_OR_RETURN(BatchShare share, ShareOfBatch(global_batch_, world_, dp_rank_, b, m));
  options_.spec.batch_per_rank = share.micro_batch_size;
  options_.plan.micro_batches = share.micro_batches;
  // Exactly 1 for even shares, so an even split computes what it always did.
  share_weight_ =
      static_cast<double>(share.sequences * world_) / static_cast<double>(global_batch_);
  return OkStatus();
}

Status Trainer::OpenLoaders() {
  const ModelSpec& spec = options_.spec;
  auto loader_options = [&](LoaderOptions o) {
    o.seq_len = spec.seq_len;
    o.batch = spec.batch_per_rank * options_.plan.micro_batches;
    o.rank = dp_rank_;
    o.world_size = world_;
    o.global_batch = global_batch_;
    if (o.seed == 0) o.seed = spec.training.seed;
    return o;
  };
  KC_ASSIGN_OR_RETURN(loader_, OpenDataLoader(loader_options(options_.data)));
  if (loader_->vocab_size() > static_cast<uint32_t>(spec.vocab)) {
    return InvalidArgumentError("model " + spec.name + ": vocab " + std::to_string(spec.vocab) +
                                " is smaller than the data's vocab_size " +
                                std::to_string(loader_->vocab_size()) +
                                " (set vocab to at least that)");
  }
  if (!options_.validation.manifest.empty() || !options_.validation.files.empty()) {
    KC_ASSIGN_OR_RETURN(validation_, OpenDataLoader(loader_options(options_.validation)));
    validation_start_ = validation_->state();
  }
  return OkStatus();
}

Status Trainer::InitCuda() {
  const ModelSpec& spec = options_.spec;
  comm::Communicator* comm = options_.comm;
  world_ = comm != nullptr ? comm->size() : 1;
  dp_rank_ = comm != nullptr ? comm->rank() : 0;
  KC_RETURN_IF_ERROR(ApplyShare());
  dp_comm_ = comm;
  KC_RETURN_IF_ERROR(OpenLoaders());
  KC_ASSIGN_OR_RETURN(cuda_model_, CudaGpt::Create(spec, options_.device,
                                                   {.batch = spec.batch_per_rank,
                                                    .precision = options_.precision}));
  KC_RETURN_IF_ERROR(cuda_model_->InitParameters(spec.training.seed));
  if (world_ > 1) {
    // Every rank starts from rank 0's parameters, as DDP does.
    std::vector<float> params(static_cast<size_t>(cuda_model_->num_parameters()));
    KC_RETURN_IF_ERROR(cuda_model_->GetParameters(params));
    KC_ASSIGN_OR_RETURN(auto work, comm->Broadcast(Bytes(std::span<float>(params)), 0));
    KC_RETURN_IF_ERROR(work->Wait());
    KC_RETURN_IF_ERROR(cuda_model_->SetParameters(params));
    host_grads_.resize(params.size());
  }
  stage_activation_bytes_ = {cuda_model_->activation_bytes()};
  KC_ASSIGN_OR_RETURN(cuda_optimizer_, CudaAdamW::Create(spec.training, cuda_model_.get()));
  return OkStatus();
}

std::vector<StateTensor> Trainer::StateTensors() {
  std::vector<StateTensor> out;
  if (cuda_model_ != nullptr) {
    // A host copy of the device's values and moments, refreshed now.
    const size_t n = static_cast<size_t>(cuda_model_->num_parameters());
    host_state_.resize(3 * n);
    std::span<float> all(host_state_);
    Status s = cuda_model_->GetParameters(all.first(n));
    if (s.ok()) {
      s = hal::CopyDeviceToHost<float>(cuda_model_->stream(), all.subspan(n, 2 * n),
                                       cuda_optimizer_->moments());
    }
    if (s.ok()) s = cuda_model_->Synchronize();
    // A checkpoint of values that did not come back would be wrong: the rank fails instead,
    // and the fault layer recovers the run from the last good checkpoint.
    KC_CHECK(s.ok()) << "trainer: reading the CUDA device's state failed: " << s.ToString();
    for (const TensorSpec& t : cuda_model_->tensors()) {
      const size_t at = static_cast<size_t>(t.offset), count = static_cast<size_t>(t.num_elements);
      out.push_back({.name = t.name,
                     .shape = t.shape,
                     .values = all.subspan(at, count),
                     .moments = {{.offset = 0,
                                  .m = all.subspan(n + at, count),
                                  .v = all.subspan(2 * n + at, count)}}});
    }
    return out;
  }
  std::vector<std::vector<int>> index(chunks_.size());  // chunk, tensor -> entry of out
  const std::vector<TensorSpec> whole = ParameterTensors(options_.spec);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Gpt<float>& chunk = *chunks_[c];
    for (int i = 0; i < static_cast<int>(chunk.tensors().size()); ++i) {
      StateTensor t;
      const TensorSpec& w = whole[static_cast<size_t>(chunk.global_index(i))];
      t.name = w.name;
      t.shape = w.shape;
      t.split = chunk.split(i);
      t.tp_rank = tp_rank_;
      t.tp_size = tp_;
      t.values = chunk.param(i);
      t.second_copy =
          static_cast<int>(c) == wte_chunk_ && i == wte_tensor_ && !chunk.has_embedding();
      index[c].push_back(static_cast<int>(out.size()));
      out.push_back(std::move(t));
    }
  }
  // Moments are AdamW's: every slot's first moments, then every slot's second, in slot order.
  std::span<float> moments = optimizer_->moments();
  const size_t half = moments.size() / 2;
  size_t at = 0;
  for (const SlotRef& r : slot_refs_) {
    const size_t n = static_cast<size_t>(r.count);
    out[static_cast<size_t>(index[static_cast<size_t>(r.chunk)][static_cast<size_t>(r.tensor)])]
        .moments.push_back({r.offset, moments.subspan(at, n), moments.subspan(half + at, n)});
    at += n;
  }
  return out;
}

Status Trainer::RestoreProgress(int64_t steps, const LoaderState& loader) {
  KC_RETURN_IF_ERROR(loader_->Restore(loader));
  step_ = steps;
  if (cuda_model_ != nullptr) {
    cuda_optimizer_->set_steps(steps);
    const size_t n = static_cast<size_t>(cuda_model_->num_parameters());
    if (host_state_.size() != 3 * n) return OkStatus();  // StateTensors was not written
    std::span<const float> all(host_state_);
    KC_RETURN_IF_ERROR(hal::CopyHostToDevice<float>(
        cuda_model_->stream(), cuda_optimizer_->moments(), all.subspan(n, 2 * n)));
    return cuda_model_->SetParameters(all.first(n));  // waits, so host_state_ may change after
  }
  optimizer_->set_steps(steps);
  return OkStatus();
}

int64_t Trainer::arena_bytes() const {
  int64_t bytes = cuda_model_ != nullptr ? cuda_model_->arena_bytes() : 0;
  for (const auto& chunk : chunks_) bytes += chunk->arena_bytes();
  return bytes;
}

Result<double> Trainer::GradNorm() {
  // Over every tensor, not the optimizer's slots: with ZeRO-1 those are this rank's chunk.
  // A tied wte's second copy (on the last stage) is the first's, counted once; a tensor-parallel
  // group's shards add up, its replicated tensors (the same on every member) count once.
  double sums[2] = {0, 0};  // shards, replicated
  for (int c = 0; c < static_cast<int>(chunks_.size()); ++c) {
    Gpt<float>& chunk = *chunks_[static_cast<size_t>(c)];
    for (int i = 0; i < static_cast<int>(chunk.tensors().size()); ++i) {
      if (c == wte_chunk_ && i == wte_tensor_ && !chunk.has_embedding()) continue;
      sums[chunk.split(i) == TpSplit::kReplicated ? 1 : 0] += SquaredNorm<float>(chunk.grad(i));
    }
  }
  if (tp_comm_ != nullptr) {
    KC_ASSIGN_OR_RETURN(auto work,
                        tp_comm_->Allreduce(std::span<double>(sums, 1), comm::ReduceOp::kSum));
    KC_RETURN_IF_ERROR(work->Wait());
  }
  double sum = sums[0] + sums[1];
  if (stages_ > 1) {
    KC_ASSIGN_OR_RETURN(auto work,
                        pipe_comm_->Allreduce(std::span<double>(&sum, 1), comm::ReduceOp::kSum));
    KC_RETURN_IF_ERROR(work->Wait());
  }
  return std::sqrt(sum);
}

Status Trainer::InitGroups() {
  comm::Communicator* comm = options_.comm;
  KC_CHECK(comm != nullptr);
  // Every rank makes the same calls in the same order: its tensor-parallel group, the replicas
  // of its stage and tensor-parallel rank, the stages of its replica and tensor-parallel rank,
  // then the first and last of those (for tied embeddings).
  if (tp_ > 1) {
    KC_ASSIGN_OR_RETURN(tp_comm_, comm->Split(stage_ * world_ + dp_rank_, tp_rank_));
    tp_link_ = std::make_unique<TensorParallelLink>(tp_comm_.get(), options_.timeline);
  }
  KC_ASSIGN_OR_RETURN(dp_owned_, comm->Split(stage_ * tp_ + tp_rank_, dp_rank_));
  dp_comm_ = dp_owned_.get();
  if (stages_ > 1) {
    KC_ASSIGN_OR_RETURN(pipe_comm_, comm->Split(dp_rank_ * tp_ + tp_rank_, stage_));
    const int ends[2] = {0, stages_ - 1};
    KC_ASSIGN_OR_RETURN(embed_comm_, pipe_comm_->SubGroup(ends));
  }
  return OkStatus();
}

Status Trainer::InitPipeline() {
  v_ = options_.plan.schedule == Schedule::kInterleaved ? options_.plan.v : 1;
  if (v_ < 1 || stages_ * v_ > options_.spec.layers) {
    return InvalidArgumentError(
        "trainer: " + std::to_string(stages_) + " stages x " + std::to_string(v_) + " chunks for " +
        std::to_string(options_.spec.layers) + " layers: every chunk needs a layer");
  }
  KC_ASSIGN_OR_RETURN(std::vector<std::vector<PipeOp>> schedule,
                      BuildPipelineSchedule(options_.plan.schedule, stages_,
                                            static_cast<int>(options_.plan.micro_batches), v_));
  ops_ = std::move(schedule[static_cast<size_t>(stage_)]);
  return OkStatus();
}

Status Trainer::RunPipelineOp(const PipeOp& op, std::span<const int32_t> inputs,
                              std::span<const int32_t> targets, double grad_scale,
                              bool last_backward, bool first_backward, double* loss,
                              double* comm_s) {
  using Clock = std::chrono::steady_clock;
  Gpt<float>& model = *chunks_[static_cast<size_t>(op.chunk)];
  const int slot = op.micro_batch % model.slots();
  // The virtual stage: its neighbours are on the previous and next rank of the pipeline
  // (round the ring when interleaved). Messages carry the sending virtual stage in their tag,
  // so each chunk's stream keeps its own order.
  const int vs = op.chunk * stages_ + stage_;
  const bool first = vs == 0, last = vs == stages_ * v_ - 1;
  const int prev = (stage_ + stages_ - 1) % stages_, next = (stage_ + 1) % stages_;
  const comm::OpOptions lane{.lane = comm::Lane::kActivation};
  auto activation_tag = [](int from) { return 2 * static_cast<uint64_t>(from) + 2; };
  auto gradient_tag = [](int from) { return 2 * static_cast<uint64_t>(from) + 3; };
  auto span = [&](const char* name, SpanKind kind, Clock::time_point from) {
    const Clock::time_point now = Clock::now();
    if (options_.timeline != nullptr) options_.timeline->Add(name, kind, step_, from, now);
    return now;
  };
  // Sends are waited for at once: they complete when the bytes are in the peer's ring or its
  // unexpected-message buffer (comm/doc/shm_protocol.md), so this never waits for the peer's
  // schedule, and the waiting hands this rank's core to the transport's progress thread
  // instead of leaving the bytes to it while the next pass computes (on a CPU device the two
  // share the cores: a posted send would trail the compute by a scheduler slice).
  auto send = [&](int peer, std::span<const float> data, uint64_t tag, const char* name) -> Status {
    const Clock::time_point t0 = Clock::now();
    KC_ASSIGN_OR_RETURN(auto work, pipe_comm_->Send(peer, std::as_bytes(data), tag, lane));
    KC_RETURN_IF_ERROR(work->Wait());
    *comm_s += Since(t0);
    span(name, SpanKind::kComm, t0);
    return OkStatus();
  };
  auto receive = [&](int peer, std::span<float> into, uint64_t tag, const char* name) -> Status {
    const Clock::time_point t0 = Clock::now();
    KC_ASSIGN_OR_RETURN(auto work, pipe_comm_->Recv(peer, Bytes(into), tag, lane));
    KC_RETURN_IF_ERROR(work->Wait());
    *comm_s += Since(t0);
    span(name, SpanKind::kComm, t0);
    return OkStatus();
  };
  if (op.kind == PipeOpKind::kForward) {
    if (!first) {
      KC_RETURN_IF_ERROR(
          receive(prev, model.stage_input(slot), activation_tag(vs - 1), "receive activations"));
    }
    const Clock::time_point t0 = Clock::now();
    KC_ASSIGN_OR_RETURN(double micro_loss,
                        model.Forward(slot, first ? inputs : std::span<const int32_t>(),
                                      last ? targets : std::span<const int32_t>(), grad_scale));
    pass_s_ += Since(t0);
    span("forward", SpanKind::kCompute, t0);
    if (last) *loss += micro_loss / static_cast<double>(options_.plan.micro_batches);
    if (!last) {
      KC_RETURN_IF_ERROR(
          send(next, model.stage_output(slot), activation_tag(vs), "send activations"));
    }
    return OkStatus();
  }
  const std::vector<int>& buckets = bucket_index_[static_cast<size_t>(op.chunk)];
  auto mark_ready = [&](int tensor) -> Status {
    if (buckets_ == nullptr || !last_backward) return OkStatus();
    return buckets_->MarkReady(buckets[static_cast<size_t>(tensor)]);
  };
  if (op.kind == PipeOpKind::kBackwardWeight) {  // ZB-H1's W: no neighbour involved
    const Clock::time_point t0 = Clock::now();
    KC_RETURN_IF_ERROR(model.BackwardWeight(slot, !first_backward, mark_ready));
    pass_s_ += Since(t0);
    span("backward weights", SpanKind::kCompute, t0);
    return OkStatus();
  }
  if (!last) {
    KC_RETURN_IF_ERROR(
        receive(next, model.grad_output(), gradient_tag(vs + 1), "receive gradients"));
  }
  const Clock::time_point t0 = Clock::now();
  if (op.kind == PipeOpKind::kBackwardInput) {
    KC_RETURN_IF_ERROR(model.BackwardInput(slot));
  } else {
    KC_RETURN_IF_ERROR(model.Backward(slot, !first_backward, mark_ready));
  }
  pass_s_ += Since(t0);
  span(op.kind == PipeOpKind::kBackwardInput ? "backward inputs" : "backward", SpanKind::kCompute,
       t0);
  if (!first) {
    KC_RETURN_IF_ERROR(send(prev, model.grad_input(), gradient_tag(vs), "send gradients"));
  }
  return OkStatus();
}

Result<double> Trainer::AverageAcrossRanks(double value) {
  if (stages_ > 1) {
    // Only the last stages hold a loss (each tensor-parallel rank the same): sum over every
    // rank, over the replicas.
    if (stage_ != stages_ - 1 || tp_rank_ != 0) value = 0;
    KC_ASSIGN_OR_RETURN(
        auto work, options_.comm->Allreduce(std::span<double>(&value, 1), comm::ReduceOp::kSum));
    KC_RETURN_IF_ERROR(work->Wait());
    return value / world_;
  }
  if (world_ == 1) return value;
  KC_ASSIGN_OR_RETURN(auto work,
                      dp_comm_->Allreduce(std::span<double>(&value, 1), comm::ReduceOp::kAvg));
  KC_RETURN_IF_ERROR(work->Wait());
  return value;
}

Status Trainer::SyncGradients(double* comm_s) {
  const auto t0 = std::chrono::steady_clock::now();
  if (world_ > 1 && buckets_ != nullptr) {
    KC_RETURN_IF_ERROR(buckets_->Finish());
  } else if (world_ > 1) {
    // The baseline: each tensor on its own, after the whole backward, one at a time.
    for (size_t c = chunks_.size(); c-- > 0;) {
      Gpt<float>& chunk = *chunks_[c];
      for (int i = static_cast<int>(chunk.tensors().size()) - 1; i >= 0; --i) {
        KC_ASSIGN_OR_RETURN(auto work, dp_comm_->Allreduce(chunk.grad(i), comm::ReduceOp::kAvg,
                                                           {.wire = options_.grad_wire}));
        KC_RETURN_IF_ERROR(work->Wait());
      }
    }
  }
  if (embed_comm_ != nullptr && wte_chunk_ >= 0 && stages_ > 1) {
    // The two copies of a tied wte add their parts: the embeddings' and the head's.
    KC_ASSIGN_OR_RETURN(auto work, embed_comm_->Allreduce(
                                       chunks_[static_cast<size_t>(wte_chunk_)]->grad(wte_tensor_),
                                       comm::ReduceOp::kSum));
    KC_RETURN_IF_ERROR(work->Wait());
  }
  *comm_s += Since(t0);
  return OkStatus();
}

std::chrono::steady_clock::time_point Trainer::Span(const char* name, SpanKind kind,
                                                    std::chrono::steady_clock::time_point from) {
  const std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
  if (options_.timeline != nullptr) options_.timeline->Add(name, kind, step_, from, now);
  return now;
}

Result<StepStats> Trainer::Step() {
  KC_LAYER_ENTRY(Layer::kParallel, "trainer");
  if (cuda_model_ != nullptr) return StepCuda();
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  StepStats stats;
  stats.step = step_;
  if (tp_link_ != nullptr) tp_link_->Take(step_);
  loader_->Next(&batch_);
  Clock::time_point t = Span("data", SpanKind::kData, t0);
  // Each token's gradient is scaled to its share of the global batch's mean, times d for the
  // replicas' average: the micro-batches add up, the average of the replicas is the weighted
  // mean over every token (with even shares the same as 1 / the rank's tokens).
  const int64_t m = options_.plan.micro_batches;
  const size_t micro_tokens = static_cast<size_t>(chunks_.front()->tokens());
  const double grad_scale = GradScale();
  double loss = 0;
  double comm_s = 0;
  if (stages_ > 1) {
    std::vector<int64_t> backwards(chunks_.size(), 0);  // per chunk, this step
    pass_s_ = 0;
    const Clock::time_point p0 = Clock::now();
    for (const PipeOp& op : ops_) {
      const size_t k = static_cast<size_t>(op.micro_batch);
      // The passes that write parameter gradients: B, or ZB-H1's W.
      const bool writes =
          op.kind == PipeOpKind::kBackward || op.kind == PipeOpKind::kBackwardWeight;
      int64_t& done = backwards[static_cast<size_t>(op.chunk)];
      if (writes) ++done;
      KC_RETURN_IF_ERROR(RunPipelineOp(
          op, std::span<const int32_t>(batch_.inputs).subspan(k * micro_tokens, micro_tokens),
          std::span<const int32_t>(batch_.targets).subspan(k * micro_tokens, micro_tokens),
          grad_scale, writes && done == m, writes && done == 1, &loss, &comm_s));
    }
    // The bubble: the pipeline lasts as long as its slowest stage; each stage's share of that
    // outside its passes.
    double makespan = Since(p0);
    KC_ASSIGN_OR_RETURN(auto max_work, pipe_comm_->Allreduce(std::span<double>(&makespan, 1),
                                                             comm::ReduceOp::kMax));
    KC_RETURN_IF_ERROR(max_work->Wait());
    stats.stage_bubble.assign(static_cast<size_t>(stages_), 0.0);
    stats.stage_bubble[static_cast<size_t>(stage_)] =
        makespan > 0 ? std::max(0.0, 1 - pass_s_ / makespan) : 0;
    KC_ASSIGN_OR_RETURN(auto gather,
                        pipe_comm_->Allgather(Bytes(std::span<double>(stats.stage_bubble)),
                                              stats.stage_bubble.size(), hal::DataType::kF64));
    KC_RETURN_IF_ERROR(gather->Wait());
    t = Clock::now();
  }
  for (int64_t k = 0; k < m && stages_ == 1; ++k) {
    const std::span<const int32_t> in =
        std::span<const int32_t>(batch_.inputs).subspan(k * micro_tokens, micro_tokens);
    const std::span<const int32_t> tg =
        std::span<const int32_t>(batch_.targets).subspan(k * micro_tokens, micro_tokens);
    Gpt<float>& model = *chunks_.front();
    KC_ASSIGN_OR_RETURN(double micro_loss, model.Forward(in, tg, grad_scale));
    loss += micro_loss / static_cast<double>(m);
    t = Span("forward", SpanKind::kCompute, t);
    // Buckets start on the last micro-batch only (DDP's no_sync for the others).
    const bool last = k + 1 == m;
    KC_RETURN_IF_ERROR(model.Backward(k > 0, [&](int tensor) -> Status {
      if (buckets_ == nullptr || !last) return OkStatus();
      const Clock::time_point m0 = Clock::now();
      Status s = buckets_->MarkReady(bucket_index_[0][static_cast<size_t>(tensor)]);
      comm_s += Since(m0);
      Span("mark ready", SpanKind::kComm, m0);
      return s;
    }));
    t = Span("backward", SpanKind::kCompute, t);
  }
  KC_RETURN_IF_ERROR(SyncGradients(&comm_s));
  t = Span(world_ == 1           ? "add tied embedding gradients"
           : buckets_ != nullptr ? "wait for gradient buckets"
                                 : "all-reduce per tensor",
           SpanKind::kComm, t);
  KC_ASSIGN_OR_RETURN(stats.loss, AverageAcrossRanks(loss * share_weight_));
  comm_s += Since(t);
  t = Span("all-reduce loss", SpanKind::kComm, t);
  KC_ASSIGN_OR_RETURN(stats.grad_norm, GradNorm());
  stats.lr = LearningRate(options_.spec.training, step_, options_.total_steps);
  optimizer_->Step(stats.lr, ClipScale(options_.spec.training, stats.grad_norm));
  t = Span("optimizer", SpanKind::kCompute, t);
  if (options_.plan.zero_stage == 1 && world_ > 1) {
    // Every rank updated its part of each model chunk; gather the others'.
    for (const auto& chunk : chunks_) {
      std::span<float> params = chunk->params();
      KC_ASSIGN_OR_RETURN(auto work, dp_comm_->Allgather(std::as_writable_bytes(params),
                                                         params.size(), hal::DataType::kF32));
      KC_RETURN_IF_ERROR(work->Wait());
    }
    comm_s += Since(t);
    Span("all-gather parameters", SpanKind::kComm, t);
  }
  if (tp_link_ != nullptr) {
    stats.tp_comm_s = tp_link_->Take(step_ + 1);
    comm_s += stats.tp_comm_s;
  }
  ++step_;
  stats.step_s = Since(t0);
  stats.comm_exposed_s = comm_s;
  stats.compute_s = stats.step_s - comm_s;
  stats.tokens = global_batch_ * options_.spec.seq_len;
  return stats;
}

double Trainer::GradScale() const {
  return static_cast<double>(world_) / static_cast<double>(global_batch_ * options_.spec.seq_len);
}

Result<StepStats> Trainer::StepCuda() {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  StepStats stats;
  stats.step = step_;
  loader_->Next(&batch_);
  Clock::time_point t = Span("data", SpanKind::kData, t0);
  CudaGpt& model = *cuda_model_;
  const int64_t m = options_.plan.micro_batches;
  const size_t micro_tokens = static_cast<size_t>(model.tokens());
  const double grad_scale = GradScale();
  double loss = 0;
  double comm_s = 0;
  KC_RETURN_IF_ERROR(model.ZeroGradients());
  for (int64_t k = 0; k < m; ++k) {
    const size_t at = static_cast<size_t>(k) * micro_tokens;
    KC_ASSIGN_OR_RETURN(
        double micro_loss,
        model.Forward(std::span<const int32_t>(batch_.inputs).subspan(at, micro_tokens),
                      std::span<const int32_t>(batch_.targets).subspan(at, micro_tokens),
                      grad_scale));
    loss += micro_loss / static_cast<double>(m);
    t = Span("forward", SpanKind::kCompute, t);
    KC_RETURN_IF_ERROR(model.Backward());
    if (k + 1 == m) KC_RETURN_IF_ERROR(model.Synchronize());
    t = Span("backward", SpanKind::kCompute, t);
  }
  if (world_ > 1) {
    // The gradients' average over the replicas, through host memory.
    KC_RETURN_IF_ERROR(hal::CopyDeviceToHost<float>(model.stream(), host_grads_, model.grads()));
    KC_RETURN_IF_ERROR(model.Synchronize());
    KC_ASSIGN_OR_RETURN(auto work,
                        dp_comm_->Allreduce(std::span<float>(host_grads_), comm::ReduceOp::kAvg,
                                            {.wire = options_.grad_wire}));
    KC_RETURN_IF_ERROR(work->Wait());
    KC_RETURN_IF_ERROR(hal::CopyHostToDevice<float>(model.stream(), model.grads(), host_grads_));
    comm_s += std::chrono::duration<double>(Clock::now() - t).count();
    t = Span("all-reduce gradients", SpanKind::kComm, t);
  }
  KC_ASSIGN_OR_RETURN(stats.loss, AverageAcrossRanks(loss * share_weight_));
  comm_s += std::chrono::duration<double>(Clock::now() - t).count();
  t = Span("all-reduce loss", SpanKind::kComm, t);
  KC_ASSIGN_OR_RETURN(const double squares, model.GradSquaredNorm());
  stats.grad_norm = std::sqrt(squares);
  stats.lr = LearningRate(options_.spec.training, step_, options_.total_steps);
  KC_RETURN_IF_ERROR(
      cuda_optimizer_->Step(stats.lr, ClipScale(options_.spec.training, stats.grad_norm)));
  KC_RETURN_IF_ERROR(model.Synchronize());
  Span("optimizer", SpanKind::kCompute, t);
  ++step_;
  stats.step_s = Since(t0);
  stats.comm_exposed_s = comm_s;
  stats.compute_s = stats.step_s - comm_s;
  stats.tokens = global_batch_ * options_.spec.seq_len;
  return stats;
}

Result<double> Trainer::Evaluate(int64_t batches) {
  KC_LAYER_ENTRY(Layer::kParallel, "trainer");
  if (validation_ == nullptr) {
    return FailedPreconditionError("model " + options_.spec.name + ": no validation data");
  }
  // The same batches every time, so evaluations compare.
  KC_RETURN_IF_ERROR(validation_->Restore(validation_start_));
  Batch batch;
  double sum = 0;
  const size_t micro_tokens = static_cast<size_t>(
      cuda_model_ != nullptr ? cuda_model_->tokens() : chunks_.front()->tokens());
  const int64_t m = options_.plan.micro_batches;
  for (int64_t i = 0; i < batches; ++i) {
    validation_->Next(&batch);
    for (int64_t k = 0; k < m; ++k) {
      const std::span<const int32_t> in =
          std::span<const int32_t>(batch.inputs).subspan(k * micro_tokens, micro_tokens);
      const std::span<const int32_t> tg =
          std::span<const int32_t>(batch.targets).subspan(k * micro_tokens, micro_tokens);
      if (cuda_model_ != nullptr) {
        KC_ASSIGN_OR_RETURN(double loss, cuda_model_->Forward(in, tg, 0));
        sum += loss / static_cast<double>(m);
        continue;
      }
      if (stages_ == 1) {
        KC_ASSIGN_OR_RETURN(double loss, chunks_.front()->Forward(in, tg, 0));
        sum += loss / static_cast<double>(m);
        continue;
      }
      // Through every virtual stage in turn, one micro-batch at a time, in slot 0; the last
      // adds its loss / m to the sum.
      double waited = 0;
      for (int c = 0; c < v_; ++c) {
        KC_RETURN_IF_ERROR(
            RunPipelineOp({PipeOpKind::kForward, 0, c}, in, tg, 0, false, false, &sum, &waited));
      }
    }
  }
  return AverageAcrossRanks(batches > 0 ? sum / static_cast<double>(batches) * share_weight_ : 0);
}

}  // namespace kc::parallel
