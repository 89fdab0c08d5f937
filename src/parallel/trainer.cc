#include "parallel/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>
#include <utility>

#include "base/check.h"
#include "base/layer_guard.h"
#include "comm/collectives.h"

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

Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options) {
  KC_LAYER_ENTRY(Layer::kParallel, "trainer");
  KC_CHECK(options.device != nullptr);
  std::unique_ptr<Trainer> t(new Trainer(options));
  KC_RETURN_IF_ERROR(t->Init());
  return t;
}

Status Trainer::Init() {
  const ModelSpec& spec = options_.spec;
  KC_RETURN_IF_ERROR(ValidateModelSpec(spec));
  comm::Communicator* comm = options_.comm;
  world_ = comm != nullptr ? comm->size() : 1;
  const int rank = comm != nullptr ? comm->rank() : 0;
  if (options_.micro_batches < 1 || options_.zero_stage < 0 || options_.zero_stage > 1) {
    return InvalidArgumentError("trainer: micro_batches must be >= 1 and zero_stage 0 or 1");
  }
  auto loader_options = [&](LoaderOptions o) {
    o.seq_len = spec.seq_len;
    o.batch = spec.batch_per_rank * options_.micro_batches;
    o.rank = rank;
    o.world_size = world_;
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
  KC_ASSIGN_OR_RETURN(
      model_, Gpt<float>::Create(spec, options_.device, {.threads = options_.compute_threads}));
  model_->InitParameters(spec.training.seed);
  const std::vector<TensorSpec>& tensors = model_->tensors();

  if (comm != nullptr && world_ > 1) {
    // Every rank starts from rank 0's parameters, as DDP does.
    KC_ASSIGN_OR_RETURN(auto work, comm->Broadcast(Bytes(model_->params()), 0));
    KC_RETURN_IF_ERROR(work->Wait());
    if (options_.grad_sync != GradSync::kPerTensor) {
      // Registered in backward order, so buckets fill (and start) as the backward goes.
      const std::vector<TensorSpec> backward = ParameterTensorsBackwardOrder(spec);
      std::vector<std::span<std::byte>> spans;
      bucket_index_.assign(tensors.size(), -1);
      for (const TensorSpec& b : backward) {
        for (size_t i = 0; i < tensors.size(); ++i) {
          if (tensors[i].name != b.name) continue;
          bucket_index_[i] = static_cast<int>(spans.size());
          spans.push_back(Bytes(model_->grad(static_cast<int>(i))));
        }
      }
      KC_ASSIGN_OR_RETURN(buckets_,
                          comm::GradientBuckets::Create(comm, spans,
                                                        {.bucket_bytes = options_.bucket_bytes,
                                                         .dtype = hal::DataType::kF32,
                                                         .op = comm::ReduceOp::kAvg}));
      buckets_->AdoptViews();
      std::vector<std::span<float>> storage;
      for (size_t i = 0; i < tensors.size(); ++i) {
        std::span<std::byte> v = buckets_->view(bucket_index_[i]);
        storage.emplace_back(reinterpret_cast<float*>(v.data()), v.size() / sizeof(float));
      }
      model_->SetGradientStorage(std::move(storage));
    }
  }
  // The parameters this rank updates: all of them, or with ZeRO-1 its chunk of the arena
  // (ChunkOf, as Allgather splits it), which may cut tensors.
  size_t lo = 0, hi = model_->params().size();
  if (options_.zero_stage == 1 && world_ > 1) {
    const comm::ChunkRange c = comm::ChunkOf(hi, world_, rank);
    lo = c.offset;
    hi = c.offset + c.count;
  }
  std::vector<OptimizerSlot<float>> slots;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t begin = static_cast<size_t>(tensors[i].offset);
    const size_t end = begin + static_cast<size_t>(tensors[i].num_elements);
    const size_t from = std::max(begin, lo), to = std::min(end, hi);
    if (from >= to) continue;
    slots.push_back({model_->param(static_cast<int>(i)).subspan(from - begin, to - from),
                     model_->grad(static_cast<int>(i)).subspan(from - begin, to - from),
                     tensors[i].shape.size() == 2});
  }
  KC_ASSIGN_OR_RETURN(optimizer_,
                      AdamW<float>::Create(spec.training, std::move(slots), options_.device));
  return OkStatus();
}

double Trainer::GradNorm() {
  double sum = 0;
  // Over every tensor, not the optimizer's slots: with ZeRO-1 those are this rank's chunk.
  for (int i = 0; i < static_cast<int>(model_->tensors().size()); ++i) {
    sum += SquaredNorm<float>(model_->grad(i));
  }
  return std::sqrt(sum);
}

Result<double> Trainer::AverageAcrossRanks(double value) {
  if (world_ == 1) return value;
  KC_ASSIGN_OR_RETURN(auto work,
                      options_.comm->Allreduce(std::span<double>(&value, 1), comm::ReduceOp::kAvg));
  KC_RETURN_IF_ERROR(work->Wait());
  return value;
}

Status Trainer::SyncGradients(double* comm_s) {
  if (world_ == 1) return OkStatus();
  const auto t0 = std::chrono::steady_clock::now();
  if (buckets_ != nullptr) {
    KC_RETURN_IF_ERROR(buckets_->Finish());
  } else {
    // The baseline: each tensor on its own, after the whole backward, one at a time.
    const std::vector<TensorSpec>& tensors = model_->tensors();
    for (int i = static_cast<int>(tensors.size()) - 1; i >= 0; --i) {
      KC_ASSIGN_OR_RETURN(auto work,
                          options_.comm->Allreduce(model_->grad(i), comm::ReduceOp::kAvg));
      KC_RETURN_IF_ERROR(work->Wait());
    }
  }
  *comm_s += Since(t0);
  return OkStatus();
}

Result<StepStats> Trainer::Step() {
  KC_LAYER_ENTRY(Layer::kParallel, "trainer");
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  // Records [from, now) on the timeline, if any, and returns now.
  auto span = [&](const char* name, SpanKind kind, Clock::time_point from) {
    const Clock::time_point now = Clock::now();
    if (options_.timeline != nullptr) options_.timeline->Add(name, kind, step_, from, now);
    return now;
  };
  StepStats stats;
  stats.step = step_;
  loader_->Next(&batch_);
  Clock::time_point t = span("data", SpanKind::kData, t0);
  // Each micro-batch's gradient is scaled to its share of the rank's mean; they add up.
  const int64_t m = options_.micro_batches;
  const size_t micro_tokens = static_cast<size_t>(model_->tokens());
  const double grad_scale = 1.0 / static_cast<double>(micro_tokens * m);
  double loss = 0;
  double comm_s = 0;
  for (int64_t k = 0; k < m; ++k) {
    const std::span<const int32_t> in =
        std::span<const int32_t>(batch_.inputs).subspan(k * micro_tokens, micro_tokens);
    const std::span<const int32_t> tg =
        std::span<const int32_t>(batch_.targets).subspan(k * micro_tokens, micro_tokens);
    KC_ASSIGN_OR_RETURN(double micro_loss, model_->Forward(in, tg, grad_scale));
    loss += micro_loss / static_cast<double>(m);
    t = span("forward", SpanKind::kCompute, t);
    // Buckets start on the last micro-batch only (DDP's no_sync for the others).
    const bool last = k + 1 == m;
    KC_RETURN_IF_ERROR(model_->Backward(k > 0, [&](int tensor) -> Status {
      if (buckets_ == nullptr || !last) return OkStatus();
      const Clock::time_point m0 = Clock::now();
      Status s = buckets_->MarkReady(bucket_index_[tensor]);
      comm_s += Since(m0);
      span("mark ready", SpanKind::kComm, m0);
      return s;
    }));
    t = span("backward", SpanKind::kCompute, t);
  }
  KC_RETURN_IF_ERROR(SyncGradients(&comm_s));
  t = span(buckets_ != nullptr ? "wait for gradient buckets" : "all-reduce per tensor",
           SpanKind::kComm, t);
  KC_ASSIGN_OR_RETURN(stats.loss, AverageAcrossRanks(loss));
  comm_s += Since(t);
  t = span("all-reduce loss", SpanKind::kComm, t);
  stats.grad_norm = GradNorm();
  stats.lr = LearningRate(options_.spec.training, step_, options_.total_steps);
  optimizer_->Step(stats.lr, ClipScale(options_.spec.training, stats.grad_norm));
  t = span("optimizer", SpanKind::kCompute, t);
  if (options_.zero_stage == 1 && world_ > 1) {
    // Every rank updated its chunk; gather the others'.
    std::span<float> params = model_->params();
    KC_ASSIGN_OR_RETURN(auto work, options_.comm->Allgather(std::as_writable_bytes(params),
                                                            params.size(), hal::DataType::kF32));
    KC_RETURN_IF_ERROR(work->Wait());
    comm_s += Since(t);
    span("all-gather parameters", SpanKind::kComm, t);
  }
  ++step_;
  stats.step_s = Since(t0);
  stats.comm_exposed_s = comm_s;
  stats.compute_s = stats.step_s - comm_s;
  stats.tokens = static_cast<int64_t>(micro_tokens) * m * world_;
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
  const size_t micro_tokens = static_cast<size_t>(model_->tokens());
  const int64_t m = options_.micro_batches;
  for (int64_t i = 0; i < batches; ++i) {
    validation_->Next(&batch);
    for (int64_t k = 0; k < m; ++k) {
      KC_ASSIGN_OR_RETURN(
          double loss,
          model_->Forward(
              std::span<const int32_t>(batch.inputs).subspan(k * micro_tokens, micro_tokens),
              std::span<const int32_t>(batch.targets).subspan(k * micro_tokens, micro_tokens), 0));
      sum += loss / static_cast<double>(m);
    }
  }
  return AverageAcrossRanks(batches > 0 ? sum / static_cast<double>(batches) : 0);
}

}  // namespace kc::parallel
