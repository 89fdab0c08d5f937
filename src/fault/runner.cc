#include "fault/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/layer_guard.h"
#include "sched/checkpoint_advice.h"

namespace kc::fault {

nlohmann::json ModelFingerprint(const parallel::ModelSpec& spec) {
  return {{"name", spec.name},
          {"layers", spec.layers},
          {"hidden", spec.hidden},
          {"heads", spec.heads},
          {"ffn_hidden", spec.ffn_hidden},
          {"vocab", spec.vocab},
          {"seq_len", spec.seq_len},
          {"tied_embeddings", spec.tied_embeddings}};
}

Result<std::unique_ptr<ResilientRunner>> ResilientRunner::Create(parallel::Trainer* trainer,
                                                                 const RunnerOptions& options) {
  if (options.steps < 1) {
    return InvalidArgumentError("runner: steps " + std::to_string(options.steps) +
                                " must be at least 1");
  }
  if (options.mtbf_s < 0 || (options.mtbf_s > 0 && options.checkpoint.dir.empty())) {
    return InvalidArgumentError(
        "runner: a checkpoint interval from the MTBF needs an MTBF above "
        "0 and a checkpoint directory");
  }
  if (options.checkpoint_every < 0) {
    return InvalidArgumentError("checkpoint every " + std::to_string(options.checkpoint_every) +
                                " steps: must be 0 (at the end only) or more");
  }
  std::unique_ptr<ResilientRunner> r(new ResilientRunner(trainer, options));
  if (!options.checkpoint.dir.empty()) {
    KC_ASSIGN_OR_RETURN(r->writer_, CheckpointWriter::Create(options.checkpoint, options.rank,
                                                             options.ranks, options.store));
  }
  return r;
}

Result<int64_t> ResilientRunner::Restore() {
  KC_LAYER_ENTRY(Layer::kFault, "runner");
  const std::string& path = options_.resume_from;
  KC_ASSIGN_OR_RETURN(const Manifest manifest, ReadManifest(path));
  const nlohmann::json& saved = manifest.model;
  // In the order a person reads a model file; the name may differ (a renamed file loads).
  for (const char* key :
       {"layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len", "tied_embeddings"}) {
    if (!options_.model.contains(key)) continue;
    const nlohmann::json& value = options_.model[key];
    if (!saved.contains(key) || saved[key] != value) {
      return InvalidArgumentError(path + ": saved from a model with " + key + " " +
                                  (saved.contains(key) ? saved[key].dump() : std::string("unset")) +
                                  ", this one has " + value.dump() +
                                  " (a checkpoint loads into the same model only)");
    }
  }
  const int64_t step = manifest.step;
  if (step >= options_.steps) {
    return InvalidArgumentError(path + " is at step " + std::to_string(step) +
                                ", which already reaches the " + std::to_string(options_.steps) +
                                " steps asked for; ask for more steps to train on");
  }
  std::vector<parallel::StateTensor> tensors = trainer_->StateTensors();
  KC_RETURN_IF_ERROR(RestoreTensors(path, tensors));
  KC_ASSIGN_OR_RETURN(parallel::LoaderState loader,
                      parallel::LoaderState::Parse(manifest.loader_state));
  KC_RETURN_IF_ERROR(trainer_->RestoreProgress(step, loader).WithContext(path));
  return step;
}

Status ResilientRunner::Checkpoint(const RunnerCallbacks& callbacks) {
  const int64_t done = trainer_->steps_done();
  CheckpointInfo info{.step = done,
                      .loader_state = trainer_->loader().state().Serialize(),
                      .plan = options_.plan,
                      .model = options_.model};
  const std::vector<parallel::StateTensor> tensors = trainer_->StateTensors();
  Status previous = writer_->Save(tensors, Owner(), info);
  KC_RETURN_IF_ERROR(previous.WithContext("checkpoint"));
  // The previous checkpoint is persisted now: report it.
  const SaveStats last = writer_->last_stats();
  if (last.step >= 0 && last.step > reported_ && last.step != done && callbacks.on_checkpoint) {
    callbacks.on_checkpoint(last);
    reported_ = last.step;
  }
  return OkStatus();
}

Result<int64_t> ResilientRunner::NextInterval(const RunnerCallbacks& callbacks) {
  const int64_t done = trainer_->steps_done();
  const std::string key = "kc/checkpoint/interval/" + std::to_string(done);
  if (options_.rank != 0) {  // rank 0's choice, so that every rank saves at the same steps
    const TimePoint deadline = options_.store->clock()->Now() + std::chrono::minutes(10);
    for (;;) {
      if (abandoned_.load(std::memory_order_acquire)) {
        return AbortedError("checkpoint interval: the group was abandoned");
      }
      // In short waits, so that Abandon is noticed.
      Result<std::string> value = options_.store->Get(
          key, std::min(deadline, options_.store->clock()->Now() + std::chrono::milliseconds(200)));
      if (value.ok()) return std::stoll(*value);
      if (value.status().code() != ErrorCode::kDeadlineExceeded ||
          options_.store->clock()->Now() >= deadline) {
        return value.status();
      }
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const SaveStats last = writer_->last_stats();
  int64_t steps = 1;  // until a persisted checkpoint has been measured: the next step
  if (last.step >= 0 && !clean_steps_.empty()) {
    const double step_s = median(clean_steps_);
    double cost_s = last.stall_s + last.persist_s;  // no overlapped step measured yet
    if (!busy_steps_.empty()) {
      // The stall, plus the overlapped steps' slowdown over the persist's length.
      const double slowdown = std::max(0.0, median(busy_steps_) / step_s - 1.0);
      cost_s = last.stall_s + slowdown * last.persist_s;
    }
    const double interval_s = sched::YoungDalyInterval(cost_s, options_.mtbf_s);
    steps = std::clamp<int64_t>(std::llround(interval_s / step_s), 1, options_.steps);
    if (callbacks.on_interval) callbacks.on_interval(steps, cost_s, interval_s);
  }
  if (options_.ranks > 1) KC_RETURN_IF_ERROR(options_.store->Set(key, std::to_string(steps)));
  return steps;
}

Ownership ResilientRunner::Owner() const {
  return {.dp_rank = trainer_->dp_rank(),
          .tp_rank = trainer_->tp_rank(),
          .zero = trainer_->zero_stage() == 1};
}

void ResilientRunner::Abandon() {
  abandoned_.store(true, std::memory_order_release);
  if (writer_ != nullptr) writer_->Abandon();
}

Status ResilientRunner::SaveNow(const RunnerCallbacks& callbacks) {
  KC_LAYER_ENTRY(Layer::kFault, "runner");
  if (writer_ == nullptr) return FailedPreconditionError("no checkpoint directory");
  KC_RETURN_IF_ERROR(Checkpoint(callbacks));
  KC_RETURN_IF_ERROR(writer_->Wait().WithContext("checkpoint"));
  const SaveStats last = writer_->last_stats();
  if (last.step >= 0 && last.step > reported_ && callbacks.on_checkpoint) {
    callbacks.on_checkpoint(last);
    reported_ = last.step;
  }
  return OkStatus();
}

Status ResilientRunner::Run(const RunnerCallbacks& callbacks) {
  KC_LAYER_ENTRY(Layer::kFault, "runner");
  if (writer_ != nullptr) writer_->Prepare(trainer_->StateTensors(), Owner());
  next_checkpoint_ = trainer_->steps_done() + 1;
  bool stopped = false;
  while (!stopped && trainer_->steps_done() < options_.steps) {
    const bool busy = writer_ != nullptr && writer_->persisting();
    KC_ASSIGN_OR_RETURN(parallel::StepStats stats, trainer_->Step());
    std::vector<double>& times = busy ? busy_steps_ : clean_steps_;
    times.push_back(stats.step_s);
    if (times.size() > 32) times.erase(times.begin());
    if (callbacks.on_step) KC_RETURN_IF_ERROR(callbacks.on_step(stats));
    const int64_t done = trainer_->steps_done();
    stopped = callbacks.stop_after && done < options_.steps && callbacks.stop_after(done);
    const bool due = stopped || done == options_.steps ||
                     (options_.mtbf_s > 0
                          ? done >= next_checkpoint_
                          : options_.checkpoint_every > 0 && done % options_.checkpoint_every == 0);
    if (writer_ != nullptr && due) {
      KC_RETURN_IF_ERROR(Checkpoint(callbacks));
      if (options_.mtbf_s > 0) {
        KC_ASSIGN_OR_RETURN(int64_t steps, NextInterval(callbacks));
        next_checkpoint_ = done + steps;
      }
    }
    if (callbacks.after_step) KC_RETURN_IF_ERROR(callbacks.after_step(done));
  }
  if (writer_ != nullptr) {
    KC_RETURN_IF_ERROR(writer_->Wait().WithContext("checkpoint"));
    const SaveStats last = writer_->last_stats();
    if (last.step >= 0 && last.step > reported_ && callbacks.on_checkpoint) {
      callbacks.on_checkpoint(last);
    }
  }
  if (stopped) {
    return CancelledError(fmt::format(
        "stopped on request after step {}{}", trainer_->steps_done(),
        writer_ != nullptr ? ", with a checkpoint of it" : " (no checkpoint directory)"));
  }
  return OkStatus();
}

}  // namespace kc::fault
