#include "fault/reports.h"

namespace kc::fault {

using Json = nlohmann::json;

StepReport ToStepReport(const parallel::StepStats& s) {
  return {.step = s.step + 1,
          .loss = s.loss,
          .lr = s.lr,
          .grad_norm = s.grad_norm,
          .step_ms = s.step_s * 1e3,
          .compute_ms = s.compute_s * 1e3,
          .comm_exposed_ms = s.comm_exposed_s * 1e3,
          .tp_comm_ms = s.tp_comm_s * 1e3,
          .stage_bubble = s.stage_bubble,
          .tokens = s.tokens,
          .tokens_per_s = static_cast<double>(s.tokens) / s.step_s};
}

CheckpointReport ToCheckpointReport(const SaveStats& c) {
  return {.step = c.step,
          .stall_ms = c.stall_s * 1e3,
          .persist_ms = c.persist_s * 1e3,
          .raw_bytes = c.raw_bytes,
          .bytes_written = c.bytes_written,
          .chunks_written = c.chunks_written,
          .chunks_reused = c.chunks_reused,
          .chunks_delta = c.chunks_delta};
}

namespace {

// One table per report type: its metrics type and its fields, both ways.
struct Encoder {
  Json operator()(const StartReport& r) const {
    return {{"type", "start"},
            {"parameters", r.parameters},
            {"flops_per_token", r.flops_per_token},
            {"grad_buckets", r.grad_buckets},
            {"arena_bytes", r.arena_bytes},
            {"stage_activation_bytes", r.stage_activation_bytes}};
  }
  Json operator()(const ResumeReport& r) const {
    return {{"type", "resume"}, {"step", r.step}, {"checkpoint", r.checkpoint}};
  }
  Json operator()(const StepReport& r) const {
    return {{"type", "step"},
            {"step", r.step},
            {"loss", r.loss},
            {"lr", r.lr},
            {"grad_norm", r.grad_norm},
            {"step_ms", r.step_ms},
            {"compute_ms", r.compute_ms},
            {"comm_exposed_ms", r.comm_exposed_ms},
            {"tp_comm_ms", r.tp_comm_ms},
            {"stage_bubble", r.stage_bubble},
            {"tokens", r.tokens},
            {"tokens_per_s", r.tokens_per_s},
            {"rate_limit_wait_ms", r.rate_limit_wait_ms},
            {"lane_wait_ms", r.lane_wait_ms},
            {"lane_backlog", r.lane_backlog},
            {"retransmits", r.retransmits},
            {"rtt_ms", r.rtt_ms},
            {"memory_copy_ms", r.memory_copy_ms},
            {"memory_copy_bytes", r.memory_copy_bytes}};
  }
  Json operator()(const EvaluationReport& r) const {
    return {{"type", "val"}, {"step", r.step}, {"loss", r.loss}};
  }
  Json operator()(const CheckpointReport& r) const {
    return {{"type", "checkpoint"},
            {"step", r.step},
            {"stall_ms", r.stall_ms},
            {"persist_ms", r.persist_ms},
            {"raw_bytes", r.raw_bytes},
            {"bytes_written", r.bytes_written},
            {"chunks_written", r.chunks_written},
            {"chunks_reused", r.chunks_reused},
            {"chunks_delta", r.chunks_delta}};
  }
  Json operator()(const IntervalReport& r) const {
    return {{"type", "checkpoint_interval"},
            {"step", r.step},
            {"every_steps", r.every_steps},
            {"cost_s", r.cost_s},
            {"interval_s", r.interval_s},
            {"mtbf_s", r.mtbf_s},
            {"source", r.source}};
  }
  Json operator()(const RecoveryReport& r) const {
    return {{"type", "recovery"},
            {"generation", r.generation},
            {"ranks", r.ranks},
            {"d", r.d},
            {"micro_batch_size", r.micro_batch_size},
            {"micro_batches", r.micro_batches},
            {"step", r.step},
            {"source", r.source},
            {"state_bytes_received", r.state_bytes_received},
            {"rebuild_s", r.rebuild_s},
            {"reason", r.reason},
            {"stop", r.stop}};
  }
  Json operator()(const ReadyReport& r) const { return {{"type", "ready"}, {"worker", r.worker}}; }
  Json operator()(const RanksReport& r) const {
    return {
        {"type", "ranks"}, {"step", r.step}, {"workers", r.workers}, {"compute_ms", r.compute_ms}};
  }
};

Result<Report> Decode(const Json& j) {  // nlohmann's accessors throw Json::exception
  const std::string type = j.at("type").get<std::string>();
  if (type == "start") {
    return StartReport{
        .parameters = j.at("parameters").get<int64_t>(),
        .flops_per_token = j.at("flops_per_token").get<double>(),
        .grad_buckets = j.at("grad_buckets").get<int64_t>(),
        .arena_bytes = j.at("arena_bytes").get<int64_t>(),
        .stage_activation_bytes = j.at("stage_activation_bytes").get<std::vector<int64_t>>()};
  }
  if (type == "resume") {
    return ResumeReport{.step = j.at("step").get<int64_t>(),
                        .checkpoint = j.at("checkpoint").get<std::string>()};
  }
  if (type == "step") {
    return StepReport{.step = j.at("step").get<int64_t>(),
                      .loss = j.at("loss").get<double>(),
                      .lr = j.at("lr").get<double>(),
                      .grad_norm = j.at("grad_norm").get<double>(),
                      .step_ms = j.at("step_ms").get<double>(),
                      .compute_ms = j.at("compute_ms").get<double>(),
                      .comm_exposed_ms = j.at("comm_exposed_ms").get<double>(),
                      .tp_comm_ms = j.at("tp_comm_ms").get<double>(),
                      .stage_bubble = j.at("stage_bubble").get<std::vector<double>>(),
                      .tokens = j.at("tokens").get<int64_t>(),
                      .tokens_per_s = j.at("tokens_per_s").get<double>(),
                      .rate_limit_wait_ms = j.value("rate_limit_wait_ms", 0.0),
                      .lane_wait_ms = j.value("lane_wait_ms", std::vector<double>()),
                      .lane_backlog = j.value("lane_backlog", std::vector<int64_t>()),
                      .retransmits = j.value("retransmits", int64_t{0}),
                      .rtt_ms = j.value("rtt_ms", 0.0),
                      .memory_copy_ms = j.value("memory_copy_ms", 0.0),
                      .memory_copy_bytes = j.value("memory_copy_bytes", int64_t{0})};
  }
  if (type == "val") {
    return EvaluationReport{.step = j.at("step").get<int64_t>(),
                            .loss = j.at("loss").get<double>()};
  }
  if (type == "checkpoint") {
    return CheckpointReport{.step = j.at("step").get<int64_t>(),
                            .stall_ms = j.at("stall_ms").get<double>(),
                            .persist_ms = j.at("persist_ms").get<double>(),
                            .raw_bytes = j.at("raw_bytes").get<int64_t>(),
                            .bytes_written = j.at("bytes_written").get<int64_t>(),
                            .chunks_written = j.at("chunks_written").get<int64_t>(),
                            .chunks_reused = j.at("chunks_reused").get<int64_t>(),
                            // Absent in the metrics of runs before delta chunks.
                            .chunks_delta = j.value("chunks_delta", int64_t{0})};
  }
  if (type == "checkpoint_interval") {
    return IntervalReport{.step = j.at("step").get<int64_t>(),
                          .every_steps = j.at("every_steps").get<int64_t>(),
                          .cost_s = j.at("cost_s").get<double>(),
                          .interval_s = j.at("interval_s").get<double>(),
                          .mtbf_s = j.at("mtbf_s").get<double>(),
                          .source = j.value("source", "")};
  }
  if (type == "recovery") {
    return RecoveryReport{.generation = j.at("generation").get<int64_t>(),
                          .ranks = j.at("ranks").get<int>(),
                          .d = j.at("d").get<int>(),
                          .micro_batch_size = j.at("micro_batch_size").get<int64_t>(),
                          .micro_batches = j.at("micro_batches").get<int64_t>(),
                          .step = j.at("step").get<int64_t>(),
                          .source = j.at("source").get<std::string>(),
                          .state_bytes_received = j.at("state_bytes_received").get<int64_t>(),
                          .rebuild_s = j.at("rebuild_s").get<double>(),
                          .reason = j.at("reason").get<std::string>(),
                          .stop = j.at("stop").get<bool>()};
  }
  if (type == "ready") return ReadyReport{.worker = j.at("worker").get<int>()};
  if (type == "ranks") {
    RanksReport r{.step = j.at("step").get<int64_t>(),
                  .workers = j.at("workers").get<std::vector<int>>(),
                  .compute_ms = j.at("compute_ms").get<std::vector<double>>()};
    if (r.workers.size() != r.compute_ms.size()) {
      return InvalidArgumentError("report: ranks: workers and compute_ms differ in length");
    }
    return r;
  }
  return InvalidArgumentError("report: unknown type \"" + type + "\"");
}

}  // namespace

Json ReportToJson(const Report& report) { return std::visit(Encoder{}, report); }

Result<Report> ReportFromJson(const Json& j) {
  try {
    return Decode(j);
  } catch (const Json::exception& e) {
    return InvalidArgumentError(std::string("report: ") + e.what());
  }
}

}  // namespace kc::fault
