#include "apps/kc/train_output.h"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <span>
#include <variant>

#include "api/train_job.h"
#include "base/file.h"
#include "hal/compute.h"
#include "hal/measure.h"

namespace kc::app {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

// Now, in seconds since the epoch: when a record of the metrics or the fault log was written.
double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Why a rank failed, in kc train's words.
std::string Why(const TrainArgs& a, const fault::FaultEvent& e) {
  if (e.silent_s > 0) {
    return fmt::format(
        "sent no heartbeat for {:.1f} s (--heartbeat-timeout {} s): declared failed and killed{}",
        e.silent_s, a.heartbeat_timeout_s, e.hang.empty() ? "" : "; hang report: " + e.hang);
  }
  return e.reason;
}

}  // namespace

TrainProgress::TrainProgress(std::string mode, int64_t steps)
    : mode_(std::move(mode)), total_(steps), every_(std::max<int64_t>(1, steps / 20)) {}

void TrainProgress::OnReport(const fault::Report& report) {
  if (const auto* s = std::get_if<fault::StepReport>(&report)) {
    StepRecord r{.step = s->step,
                 .loss = s->loss,
                 .lr = s->lr,
                 .grad_norm = s->grad_norm,
                 .step_s = s->step_ms / 1e3,
                 .compute_s = s->compute_ms / 1e3,
                 .comm_exposed_s = s->comm_exposed_ms / 1e3,
                 .tp_comm_s = s->tp_comm_ms / 1e3,
                 .tokens = s->tokens,
                 .stage_bubble = s->stage_bubble};
    if (s->memory_copy_bytes > 0)
      memory_copies_.emplace_back(s->memory_copy_ms, s->memory_copy_bytes);
    // After a recovery the steps since the restored state come again: the new ones count.
    while (!steps_.empty() && steps_.back().step >= r.step) steps_.pop_back();
    steps_.push_back(std::move(r));
    Show(s->step == total_ || s->step % every_ == 0);
  } else if (const auto* start = std::get_if<fault::StartReport>(&report)) {
    stage_activation_bytes_ = start->stage_activation_bytes;
  } else if (const auto* c = std::get_if<fault::CheckpointReport>(&report)) {
    checkpoints_.push_back(*c);
  } else if (const auto* resume = std::get_if<fault::ResumeReport>(&report)) {
    resumed_from_ = resume->step;
  } else if (const auto* v = std::get_if<fault::EvaluationReport>(&report)) {
    val_.push_back({v->step, v->loss});
    if (mode_ == "lines") {
      std::cerr << fmt::format("step {}: validation loss {:.4f}\n", v->step, v->loss);
    }
    Show(false);
  }
}

void TrainProgress::OnLine(const std::string& line) {
  ClearBar();
  std::cerr << line << "\n";
  Show(false);
}

void TrainProgress::Finish() { ClearBar(); }

void TrainProgress::Show(bool line_due) {
  if (steps_.empty() || mode_ == "none") return;
  const StepRecord& r = steps_.back();
  // Rate over the last (up to) 20 steps.
  double time = 0, tokens = 0;
  for (size_t i = steps_.size() > 20 ? steps_.size() - 20 : 0; i < steps_.size(); ++i) {
    time += steps_[i].step_s;
    tokens += static_cast<double>(steps_[i].tokens);
  }
  const double rate = time > 0 ? tokens / time : 0;
  const double per_step = time / static_cast<double>(std::min<size_t>(20, steps_.size()));
  const double eta = per_step * static_cast<double>(total_ - r.step);
  const double val = val_.empty() ? -1 : val_.back().loss;
  if (mode_ == "bar") {
    winsize ws{};
    const int width =
        ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20 ? ws.ws_col : 100;
    std::cerr << "\r\033[K" << ProgressLine(r.step, total_, r.loss, val, rate, eta, width - 1)
              << std::flush;
    bar_shown_ = true;
  } else if (mode_ == "lines" && line_due) {
    std::cerr << ProgressLine(r.step, total_, r.loss, val, rate, eta, 120) << "\n";
  }
}
void TrainProgress::ClearBar() {
  if (bar_shown_) std::cerr << "\r\033[K" << std::flush;
  bar_shown_ = false;
}

Json CommLimitsJson(const TrainSetup& p) {
  if (!p.rate_limit) return Json();
  Json priority = Json::array();
  for (comm::Lane lane : p.lanes.priority) priority.push_back(std::string(comm::LaneName(lane)));
  return {{"ops_per_second", p.rate_limit->ops_per_second},
          {"bytes_per_second", p.rate_limit->bytes_per_second},
          {"burst_ops", p.rate_limit->burst_ops},
          {"burst_bytes", p.rate_limit->burst_bytes},
          {"lanes",
           {{"chunk_bytes", p.lanes.chunk_bytes},
            {"queue_chunks", p.lanes.queue_chunks},
            {"low_lane_min_share", p.lanes.low_lane_min_share},
            {"priority", priority}}}};
}

bool AppendDoneReports(std::FILE* reports, const std::string& run_id, int64_t step) {
  kc::v1::TrainReport r;
  r.set_run_id(run_id);
  r.mutable_step()->set_step(step);
  kc::v1::TrainReport c = r;
  c.mutable_checkpoint()->set_step(step);
  return api::AppendReport(reports, r) && api::AppendReport(reports, c);
}

bool AppendRunReport(std::FILE* reports, const TrainArgs& a, const TrainSetup& p,
                     const std::optional<kc::v1::HostLoadReport>& start) {
  kc::v1::TrainReport r;
  r.set_run_id(a.run_id);
  kc::v1::RunReport* run = r.mutable_run();
  run->set_model(p.spec.name);
  run->set_ranks(a.ranks);
  run->set_threads_per_rank(p.threads);
  run->set_steps(a.steps);
  run->set_global_batch(p.global_batch);
  run->set_plan(a.plan);
  run->set_predicted_step_s(p.predicted_step_s.value_or(0));
  if (p.rate_limit) *run->mutable_comm_limits() = api::ToCommLimits(*p.rate_limit, p.lanes);
  run->set_device(a.device);
  if (start) *run->mutable_start() = *start;
  return api::AppendReport(reports, r);
}

bool AppendSummaryReport(std::FILE* reports, const std::string& run_id, const Json& summary) {
  auto number = [&](const char* key, double fallback) {
    return summary.contains(key) && summary[key].is_number() ? summary[key].get<double>()
                                                             : fallback;
  };
  kc::v1::TrainReport r;
  r.set_run_id(run_id);
  kc::v1::SummaryReport* s = r.mutable_summary();
  s->set_steps(static_cast<int64_t>(number("steps", 0)));
  s->set_median_step_s(number("step_ms", 0) / 1e3);
  s->set_tokens_per_s(number("tokens_per_s", 0));
  s->set_exposed_comm_share(number("exposed_comm_share", 0));
  s->set_bubble(number("bubble", 0));
  s->set_bubble_ideal(number("bubble_ideal", -1));
  s->set_mfu(number("mfu", 0));
  return api::AppendReport(reports, r);
}

LauncherView::LauncherView(const TrainArgs& a, std::ofstream* metrics, fs::path fault_log,
                           std::string job, TrainProgress* progress, std::FILE* reports,
                           fs::path inspect_answer)
    : a_(a),
      metrics_(metrics),
      fault_log_path_(std::move(fault_log)),
      job_(std::move(job)),
      progress_(progress),
      reports_(reports),
      inspect_answer_(std::move(inspect_answer)),
      interval_steps_(a.checkpoint_every == "auto" ? 0 : std::atoll(a.checkpoint_every.c_str())),
      ranks_(a.ranks) {}

void LauncherView::Append(kc::v1::TrainReport report) {
  if (reports_ == nullptr) return;
  report.set_run_id(a_.run_id);
  if (!api::AppendReport(reports_, report)) {
    progress_->OnLine(
        fmt::format("kc train: warning: --reports {}: {}", a_.reports, std::strerror(errno)));
  }
}

void LauncherView::OnReport(int, const fault::Report& report) {
  // A line at a time: whoever follows the file sees each record as it happens, with when the
  // launcher had it (as the fault log's).
  Json record = fault::ReportToJson(report);
  record["time_unix"] = UnixSeconds();
  *metrics_ << record.dump() << "\n" << std::flush;
  progress_->OnReport(report);
  // And as typed reports, for kc agent.
  kc::v1::TrainReport out;
  if (const auto* r = std::get_if<fault::StepReport>(&report)) {
    kc::v1::StepReport* step = out.mutable_step();
    step->set_step(r->step);
    step->set_loss(r->loss);
    step->set_tokens_per_s(r->tokens_per_s);
    step->set_step_s(r->step_ms / 1e3);
    step->set_compute_s(r->compute_ms / 1e3);
    step->set_comm_exposed_s(r->comm_exposed_ms / 1e3);
    step->set_rate_limit_wait_s(r->rate_limit_wait_ms / 1e3);
    for (double ms : r->lane_wait_ms) step->add_lane_wait_s(ms / 1e3);
    for (int64_t chunks : r->lane_backlog) step->add_lane_backlog(chunks);
    step->set_retransmits(r->retransmits);
    step->set_rtt_s(r->rtt_ms / 1e3);
    step->set_memory_copy_s(r->memory_copy_ms / 1e3);
    step->set_memory_copy_bytes(r->memory_copy_bytes);
    step->set_ranks(ranks_);
    Append(std::move(out));
  } else if (const auto* c = std::get_if<fault::CheckpointReport>(&report)) {
    kc::v1::CheckpointReport* ck = out.mutable_checkpoint();
    ck->set_step(c->step);
    ck->set_stall_s(c->stall_ms / 1e3);
    ck->set_persist_s(c->persist_ms / 1e3);
    ck->set_interval_steps(interval_steps_);
    ck->set_interval_reason(interval_reason_);
    Append(std::move(out));
  } else if (const auto* k = std::get_if<fault::RanksReport>(&report)) {
    kc::v1::RanksReport* ranks = out.mutable_ranks();
    ranks->set_step(k->step);
    for (size_t w = 0; w < k->workers.size(); ++w) {
      ranks->add_workers(k->workers[w]);
      ranks->add_compute_s(k->compute_ms[w] / 1e3);
    }
    Append(std::move(out));
  } else if (const auto* i = std::get_if<fault::IntervalReport>(&report)) {
    interval_steps_ = i->every_steps;
    interval_reason_ = fmt::format("Young/Daly: cost {:.2f} s, MTBF {:.0f} s ({})", i->cost_s,
                                   i->mtbf_s, i->source);
  }
}

void LauncherView::OnProgress(const fault::ProgressSnapshot& snapshot) {
  kc::v1::TrainReport out;
  *out.mutable_progress() = api::ToProgressReport(snapshot);
  if (!inspect_answer_.empty()) {
    const std::string text = api::ReportJson(out.progress());
    const Status s = WriteFileAtomically(inspect_answer_.string(),
                                         std::as_bytes(std::span(text.data(), text.size())));
    if (!s.ok()) {
      progress_->OnLine(
          fmt::format("kc train: warning: {}: {}", inspect_answer_.string(), s.message()));
    }
  }
  progress_->OnLine(fmt::format(
      "kc train: inspected (request {}): {}", snapshot.request,
      snapshot.hang.empty() ? "no rank waits in a collective" : "hang report: " + snapshot.hang));
  Append(std::move(out));
}

void LauncherView::OnFault(const fault::FaultEvent& e) {
  Json event = e.ToJson();
  event["time_unix"] = UnixSeconds();
  event["job"] = job_;
  if (!fault_log_.is_open()) fault_log_.open(fault_log_path_, std::ios::app);
  fault_log_ << event.dump() << "\n" << std::flush;
  kc::v1::TrainReport out;
  *out.mutable_fault() = api::ToFaultReport(e);
  out.set_generation(e.generation);
  Append(std::move(out));
  using Kind = fault::FaultEvent::Kind;
  if (e.kind != Kind::kDetected && e.ranks > 0) ranks_ = e.ranks;
  if (e.kind == Kind::kRecovered || e.kind == Kind::kStopped) recoveries_.push_back(e);
  if (e.kind == Kind::kDetected && e.generation >= 0 && !e.below_minimum) {
    progress_->OnLine(
        fmt::format("kc train: worker {} failed: {}; generation {} goes on with {} rank{} (d={})",
                    e.worker, Why(a_, e), e.generation, e.ranks, e.ranks == 1 ? "" : "s", e.d));
  } else if (e.kind == Kind::kResized) {
    progress_->OnLine(fmt::format("kc train: resizing: {}", e.reason));
  } else if (e.kind == Kind::kJoined) {
    progress_->OnLine(
        fmt::format("kc train: worker {} joined: generation {} goes on with {} ranks (d={})",
                    e.worker, e.generation, e.ranks, e.d));
  }
}

void LauncherView::OnOutput(int worker, const std::string& line) {
  progress_->OnLine(fmt::format("[rank {}] {}", worker, line));
}

void LauncherView::OnReplacement(int worker, const Status& started) {
  progress_->OnLine(started.ok() ? fmt::format("kc train: started replacement worker {}", worker)
                                 : fmt::format("kc train: warning: cannot start replacement "
                                               "worker {}: {}",
                                               worker, started.message()));
}

std::string DescribeFailure(const TrainArgs& a, const TrainSetup& p, const fault::RunOutcome& o) {
  if (!o.cause) return fmt::format("{}; the other ranks were stopped", o.error.message());
  const fault::FaultEvent& e = *o.cause;
  if (!e.below_minimum) {
    return fmt::format("rank {}{} {}; the other ranks were stopped", e.worker,
                       e.silent_s > 0 ? "" : " failed:", Why(a, e));
  }
  const int tp = p.tensor_parallel * p.pipeline_stages;
  std::string usable;
  if (e.usable != e.alive) {
    usable =
        tp > 1 ? fmt::format(" ({} of them make whole replicas of t*p = {} ranks)", e.usable, tp)
               : fmt::format(" (global batch {} splits over {} of them)", p.global_batch, e.usable);
  }
  return fmt::format(
      "worker {} failed: {}; {} worker{} left{}, below --min-ranks {}: the job stopped{}", e.worker,
      Why(a, e), e.alive, e.alive == 1 ? "" : "s", usable, e.min_ranks,
      a.checkpoint_dir.empty() ? " (no --checkpoint-dir: the steps since the start are lost)"
      : e.ranks == 0
          ? " (no whole replica survived to save: the same command resumes from the newest "
            "checkpoint in --checkpoint-dir)"
          : " with a checkpoint of the state that survived (run the command again to resume "
            "from it)");
}

void PrintSummary(const TrainArgs& a, const TrainSetup& p, const TrainProgress& m, int faults,
                  const std::vector<fault::FaultEvent>& recoveries, double peak_per_core,
                  const fs::path& metrics_path, const fs::path& plot_path, Json* summary_json) {
  const TrainSummary s = Summarise(m.steps());
  const double flops_per_token = parallel::TrainingFlopsPerToken(p.spec);
  // The units the peak is per: cores, or on GPUs the GPUs the ranks use.
  // Oversubscribed (more threads than cores): the peak is that of the cores there are.
  const int cores = p.cuda ? std::min(a.ranks, std::max(p.gpus, 1))
                           : std::min(a.ranks * p.threads, static_cast<int>(p.cpus.size()));
  const double achieved = s.tokens_per_s * flops_per_token;
  const double mfu = peak_per_core > 0 ? achieved / (cores * peak_per_core) : 0;
  const int64_t global = p.global_batch;
  std::string val;
  if (!m.val().empty()) val = fmt::format(" (validation {:.4f})", m.val().back().loss);
  std::cout << fmt::format(
      "kc train: {} ({:.2f} M parameters), {} rank{} x {} thread{}, {} steps, global batch {} x {} "
      "= {} tokens, {}\n",
      p.spec.name, parallel::ParameterCount(p.spec) / 1e6, a.ranks, a.ranks == 1 ? "" : "s",
      p.threads, p.threads == 1 ? "" : "s", s.steps, global, p.spec.seq_len,
      global * p.spec.seq_len, a.ranks > 1 ? fmt::format("grad sync {}", a.grad_sync) : "one rank");
  std::cout << fmt::format("  loss            {:.4f} -> {:.4f}{}\n", s.first_loss, s.last_loss,
                           val);
  std::cout << fmt::format("  throughput      {:.0f} tokens/s (steady state: steps {}-{})\n",
                           s.tokens_per_s, s.steps - s.measured_steps + 1, s.steps);
  std::cout << fmt::format("  step time       {:.1f} ms (median){}\n", s.step_ms_median,
                           p.predicted_step_s ? fmt::format("; the planner predicted {:.1f} ms",
                                                            *p.predicted_step_s * 1e3)
                                              : "");
  std::cout << fmt::format(
      "  device util     {:.1f}% (compute time / step time; the seed asks for >= 80%)\n",
      100 * s.device_utilisation);
  std::cout << fmt::format(
      "  exposed comm    {:.1f}% of step time, {:.2f} ms per step (median {:.2f}; the seed flags "
      "> 40%)\n",
      100 * s.exposed_comm_share, s.comm_exposed_ms, s.comm_exposed_ms_median);
  if (p.tensor_parallel > 1) {
    std::cout << fmt::format(
        "  tensor parallel t={}: {:.2f} ms per step in its all-reduces (median; 2 per block each "
        "way, plus the embeddings', the loss's and the head's)\n",
        p.tensor_parallel, s.tp_comm_ms_median);
  }
  // GPipe and 1F1B idle (p - 1) / (m + p - 1) of the time; interleaving divides the idle
  // part by v; ZB-H1 by 3 when the forward and the two backward halves cost the same.
  const bool interleaved = p.schedule == parallel::Schedule::kInterleaved;
  const bool zero_bubble = p.schedule == parallel::Schedule::kZeroBubbleH1;
  const int64_t v = interleaved ? p.virtual_stages : zero_bubble ? 3 : 1;
  const double ideal_bubble = static_cast<double>(p.pipeline_stages - 1) /
                              static_cast<double>(v * p.micro_batches + p.pipeline_stages - 1);
  double mean_bubble = 0;
  if (!s.stage_bubble.empty()) {
    std::string stages;
    for (size_t i = 0; i < s.stage_bubble.size(); ++i) {
      stages += fmt::format(", stage {} {:.1f}%", i, 100 * s.stage_bubble[i]);
      mean_bubble += s.stage_bubble[i] / static_cast<double>(s.stage_bubble.size());
    }
    std::cout << fmt::format(
        "  pipeline bubble {:.1f}%{} (median per stage; {} = {:.1f}% with p={} m={}{})\n",
        100 * mean_bubble, stages,
        interleaved   ? "(p-1)/(vm+p-1)"
        : zero_bubble ? "(p-1)/(3m+p-1), equal passes"
                      : "(p-1)/(m+p-1)",
        100 * ideal_bubble, p.pipeline_stages, p.micro_batches,
        interleaved ? fmt::format(" v={}", v) : "");
  }
  if (m.stage_activation_bytes().size() > 1) {
    std::string stages;
    for (size_t i = 0; i < m.stage_activation_bytes().size(); ++i) {
      stages += fmt::format("{}stage {} {:.1f} MiB", i == 0 ? "" : ", ", i,
                            static_cast<double>(m.stage_activation_bytes()[i]) / (1 << 20));
    }
    std::cout << fmt::format("  activations     {} (the micro-batches each stage holds at once)\n",
                             stages);
  }
  if (peak_per_core > 0 && p.cuda) {
    std::cout << fmt::format(
        "  MFU             {:.1f}% ({:.1f} TFLOP/s of {} GPU{} x {:.1f} TFLOP/s {} matrix product "
        "measured now)\n",
        100 * mfu, achieved / 1e12, cores, cores == 1 ? "" : "s", peak_per_core / 1e12,
        a.precision);
  } else if (peak_per_core > 0) {
    std::cout << fmt::format(
        "  MFU             {:.1f}% ({:.1f} GFLOP/s of {} core{} x {:.1f} GFLOP/s sgemm measured "
        "now)\n",
        100 * mfu, achieved / 1e9, cores, cores == 1 ? "" : "s", peak_per_core / 1e9);
  }
  // Checkpoints: the step's stall (the copy to memory) against the step, and what the
  // background persist wrote.
  std::vector<double> stalls;
  double written = 0, raw = 0, persist_ms = 0;
  int64_t reused = 0, deltas = 0, chunks = 0;
  std::string at;
  for (const fault::CheckpointReport& c : m.checkpoints()) {
    stalls.push_back(c.stall_ms);
    written += static_cast<double>(c.bytes_written);
    raw += static_cast<double>(c.raw_bytes);
    deltas += c.chunks_delta;
    persist_ms = std::max(persist_ms, c.persist_ms);
    reused += c.chunks_reused;
    chunks += c.chunks_written + c.chunks_reused;
    at += (at.empty() ? "" : ", ") + std::to_string(c.step);
  }
  std::sort(stalls.begin(), stalls.end());
  const double stall_ms = stalls.empty() ? 0 : stalls[stalls.size() / 2];
  if (m.resumed_from() >= 0) {
    std::cout << fmt::format("  resumed         from step {} ({})\n", m.resumed_from(), a.resume);
  }
  if (!stalls.empty()) {
    std::cout << fmt::format(
        "  checkpoints     {} (steps {}) in {}: step stall {:.1f} ms median ({:.1f}% of a step), "
        "persist up to {:.0f} ms in the background, {:.1f} MiB written ({:.0f}% of the "
        "state saved), {} of {} chunks unchanged, {} stored as deltas\n",
        stalls.size(), at, a.checkpoint_dir, stall_ms,
        s.step_ms_median > 0 ? 100 * stall_ms / s.step_ms_median : 0.0, persist_ms,
        written / (1 << 20), raw > 0 ? 100 * written / raw : 0.0, reused, chunks, deltas);
  }
  if (!m.memory_copies().empty()) {
    // In-memory copies: what each took on rank 0 against a step, and what rank 0 holds.
    std::vector<double> took;
    for (const auto& [ms, bytes] : m.memory_copies()) took.push_back(ms);
    std::sort(took.begin(), took.end());
    const double copy_ms = took[took.size() / 2];
    std::cout << fmt::format(
        "  memory copies   {} (every {} steps): {:.1f} ms median ({:.1f}% of a step), rank 0 "
        "holds {:.1f} MiB (its own state and a peer's)\n",
        took.size(), p.memory_copy_every, copy_ms,
        s.step_ms_median > 0 ? 100 * copy_ms / s.step_ms_median : 0.0,
        static_cast<double>(m.memory_copies().back().second) / (1 << 20));
  }
  if (faults > 0) {
    std::string what;
    for (const fault::FaultEvent& r : recoveries) {
      what += fmt::format("; generation {} with {} rank{} from {} in {:.2f} s, {} step{} lost",
                          r.generation, r.ranks, r.ranks == 1 ? "" : "s",
                          r.source == "memory" ? "in-memory copies" : r.source,
                          r.duration_s.value_or(0.0), r.steps_lost.value_or(0),
                          r.steps_lost.value_or(0) == 1 ? "" : "s");
    }
    std::cout << fmt::format("  faults          {}{}\n", faults, what);
  }
  std::cout << fmt::format("  wall time       {}\n", FormatDuration(s.total_s));
  std::cout << fmt::format("  metrics         {}\n  plot            {}\n", metrics_path.string(),
                           plot_path.string());
  if (!a.trace.empty()) std::cout << fmt::format("  trace           {}\n", a.trace);
  *summary_json = {
      {"type", "summary"},
      {"faults", faults},
      {"model", p.spec.name},
      {"ranks", a.ranks},
      {"threads_per_rank", p.threads},
      {"steps", s.steps},
      {"global_batch", global},
      {"grad_sync", a.grad_sync},
      {"first_loss", s.first_loss},
      {"last_loss", s.last_loss},
      {"val_loss", m.val().empty() ? Json(nullptr) : Json(m.val().back().loss)},
      {"tokens_per_s", s.tokens_per_s},
      {"step_ms", s.step_ms_median},
      {"device_utilisation", s.device_utilisation},
      {"exposed_comm_share", s.exposed_comm_share},
      {"comm_exposed_ms", s.comm_exposed_ms},
      {"comm_exposed_ms_median", s.comm_exposed_ms_median},
      {"tp_comm_ms_median", p.tensor_parallel > 1 ? Json(s.tp_comm_ms_median) : Json()},
      {"stage_bubble", s.stage_bubble},
      {"bubble", p.pipeline_stages > 1 ? Json(mean_bubble) : Json()},
      {"bubble_ideal", p.pipeline_stages > 1 ? Json(ideal_bubble) : Json()},
      {"flops_per_token", flops_per_token},
      {"sgemm_flops_per_core", p.cuda ? 0.0 : peak_per_core},
      {"device", a.device},
      {"precision", a.precision},
      {"gpu_flops", p.cuda ? peak_per_core : 0.0},
      {"mfu", mfu},
      {"measured_steps", s.measured_steps},
      {"checkpoints", static_cast<int64_t>(stalls.size())},
      {"checkpoint_stall_ms", stalls.empty() ? Json() : Json(stall_ms)},
      {"resumed_from", m.resumed_from() >= 0 ? Json(m.resumed_from()) : Json()},
      {"wall_s", s.total_s}};
}

Status JoinTrace(const std::string& trace, int ranks) {
  std::ofstream out(trace, std::ios::trunc);
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  for (int r = 0; r < ranks; ++r) {
    const std::string part = TracePart(trace, r);
    std::ifstream in(part);
    if (!in) return NotFoundError("rank " + std::to_string(r) + " wrote no trace (" + part + ")");
    if (r > 0) out << ",\n";
    out << in.rdbuf();
    in.close();
    fs::remove(part);
  }
  out << "\n]}\n";
  out.close();
  if (!out) return InternalError("cannot write " + trace);
  return OkStatus();
}

Result<double> MeasureGpuFlops(const TrainSetup& p) {
  hal::DeviceDescriptor d{.id = "local/gpu0", .kind = hal::DeviceKind::kCuda, .host = "local"};
  KC_ASSIGN_OR_RETURN(std::unique_ptr<hal::ComputeDevice> device, hal::OpenComputeDevice(d));
  return hal::MeasureGemmFlops(
      *device, {.type = p.precision == parallel::Precision::kBf16 ? hal::DataType::kBf16
                                                                  : hal::DataType::kF32});
}

std::string TracePart(const std::string& trace, int rank) {
  return fmt::format("{}.rank{}.part", trace, rank);
}

}  // namespace kc::app
