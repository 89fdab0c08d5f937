#include "api/train_job.h"

#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "base/file.h"

namespace kc::api {
namespace {

constexpr std::array kSchedules = {parallel::Schedule::kGpipe, parallel::Schedule::k1F1B,
                                   parallel::Schedule::kInterleaved,
                                   parallel::Schedule::kZeroBubbleH1};

// The largest report a reader takes: a report is a few hundred bytes.
constexpr uint64_t kMaxReportBytes = 1 << 20;

std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

}  // namespace

kc::v1::TrainPlan ToTrainPlan(const parallel::ParallelPlan& p) {
  kc::v1::TrainPlan out;
  out.set_t(p.t);
  out.set_p(p.p);
  out.set_d(p.d);
  out.set_micro_batch_size(p.micro_batch_size);
  out.set_micro_batches(p.micro_batches);
  out.set_schedule(std::string(parallel::ScheduleName(p.schedule)));
  out.set_v(p.v);
  out.set_recompute(p.recompute);
  out.set_zero_stage(p.zero_stage);
  return out;
}

Result<parallel::ParallelPlan> FromTrainPlan(const kc::v1::TrainPlan& in) {
  parallel::ParallelPlan p{.t = in.t(),
                           .p = in.p(),
                           .d = in.d(),
                           .micro_batch_size = in.micro_batch_size(),
                           .micro_batches = in.micro_batches(),
                           .v = in.v(),
                           .recompute = in.recompute(),
                           .zero_stage = in.zero_stage()};
  bool known = false;
  for (parallel::Schedule s : kSchedules) {
    if (parallel::ScheduleName(s) == in.schedule()) {
      p.schedule = s;
      known = true;
    }
  }
  if (!known) {
    return InvalidArgumentError(fmt::format(
        "plan.schedule: \"{}\": expected gpipe, 1f1b, interleaved or zb-h1", in.schedule()));
  }
  return p;
}

kc::v1::TrainJob ToTrainJob(const JobSpec& s) {
  kc::v1::TrainJob j;
  j.set_name(s.name);
  j.set_team(s.team);
  j.set_job_class(s.job_class);
  j.set_model_yaml(s.model_yaml);
  j.set_data(s.data);
  j.set_steps(s.command.empty() ? s.steps : 0);
  j.set_global_batch(s.global_batch);
  if (!s.plan.empty()) {
    // The spec's plan was read from the plan flag's form; one that does not read back is not
    // a plan (CheckedJobSpec refuses the job).
    if (Result<parallel::ParallelPlan> p = parallel::ParsePlanFlag(s.plan); p.ok()) {
      *j.mutable_plan() = ToTrainPlan(*p);
    }
  }
  kc::v1::ElasticPolicy* e = j.mutable_elastic();
  e->set_max_devices(s.ranks);
  e->set_min_devices(s.min_devices > 0 ? s.min_devices : s.ranks);
  e->set_elastic(s.min_devices > 0 && s.min_devices < s.ranks);
  e->set_max_restarts(s.max_restarts);
  e->set_restart_backoff_s(s.restart_backoff_s);
  e->set_max_replacements(s.ranks);
  kc::v1::CheckpointPolicy* c = j.mutable_checkpoint();
  c->set_dir(s.checkpoint_dir);
  if (s.checkpoint_auto) {
    c->set_scheduler_advised(true);
  } else {
    c->set_every_steps(s.checkpoint_every);
  }
  c->set_keep(s.checkpoint_keep);
  c->set_compress(s.checkpoint_compress);
  c->set_memory_copy_every(s.memory_copy_every);
  if (s.command.empty()) j.set_grad_wire(s.grad_wire);
  j.mutable_heartbeat()->set_period_s(s.heartbeat_period_s);
  j.mutable_heartbeat()->set_timeout_s(s.heartbeat_timeout_s);
  j.set_expected_hours(s.expected_hours);
  j.set_storage_gb(s.storage_gb);
  for (const std::string& arg : s.command) j.add_command(arg);
  j.set_workdir(s.workdir);
  for (const auto& [name, value] : s.env) {
    kc::v1::EnvVar* v = j.add_env();
    v->set_name(name);
    v->set_value(value);
  }
  return j;
}

JobSpec JobSpecOf(const kc::v1::TrainJob& j) {
  JobSpec s;
  s.name = j.name();
  s.team = j.team();
  s.job_class = j.job_class().empty() ? "normal" : j.job_class();
  s.model_yaml = j.model_yaml();
  s.command.assign(j.command().begin(), j.command().end());
  s.workdir = j.workdir();
  for (const kc::v1::EnvVar& v : j.env()) s.env.emplace_back(v.name(), v.value());
  s.ranks = j.elastic().max_devices();
  s.min_devices = j.elastic().min_devices() < s.ranks ? j.elastic().min_devices() : 0;
  if (j.has_plan()) {
    if (Result<parallel::ParallelPlan> p = FromTrainPlan(j.plan()); p.ok()) {
      s.plan = parallel::PlanToString(*p);
    } else {
      s.plan = j.plan().schedule();  // not a plan: CheckedJobSpec says so
    }
  }
  s.steps = j.command().empty() ? j.steps() : s.steps;
  s.global_batch = j.global_batch();
  s.checkpoint_auto = j.checkpoint().scheduler_advised();
  s.checkpoint_every = j.checkpoint().every_steps();
  s.checkpoint_dir = j.checkpoint().dir();
  if (j.checkpoint().keep() > 0) s.checkpoint_keep = j.checkpoint().keep();
  s.checkpoint_compress = j.checkpoint().compress();
  s.memory_copy_every = j.checkpoint().memory_copy_every();
  if (!j.grad_wire().empty()) s.grad_wire = j.grad_wire();
  if (j.heartbeat().period_s() > 0) s.heartbeat_period_s = j.heartbeat().period_s();
  if (j.heartbeat().timeout_s() > 0) s.heartbeat_timeout_s = j.heartbeat().timeout_s();
  if (!j.command().empty()) s.heartbeat_timeout_s = j.heartbeat().timeout_s();  // 0: none
  s.max_restarts = j.elastic().max_restarts();
  s.restart_backoff_s = j.elastic().restart_backoff_s();
  s.expected_hours = j.expected_hours();
  s.storage_gb = j.storage_gb();
  s.data = j.data();
  return s;
}

Result<JobSpec> CheckedJobSpec(const kc::v1::TrainJob& j) {
  if (!j.command().empty()) {
    // What only a model job has, which the spec of a command job does not carry.
    for (auto [key, set] : {std::pair{"model_yaml", !j.model_yaml().empty()},
                            {"plan", j.has_plan()},
                            {"data", !j.data().empty()},
                            {"steps", j.steps() != 0},
                            {"global_batch", j.global_batch() != 0}}) {
      if (set) {
        return InvalidArgumentError(fmt::format(
            "job: {}: only for a model job (a command job's program trains as it will)", key));
      }
    }
  }
  if (j.has_plan()) {
    if (Result<parallel::ParallelPlan> p = FromTrainPlan(j.plan()); !p.ok()) {
      return InvalidArgumentError(fmt::format("job: {}", p.status().message()));
    }
  }
  if (j.elastic().min_devices() > j.elastic().max_devices()) {
    return InvalidArgumentError(fmt::format("job: min_devices: {} is above max_devices ({})",
                                            j.elastic().min_devices(), j.elastic().max_devices()));
  }
  // Every other rule is the job file's: the spec, in the form kcd stored before the typed
  // job, goes through the job file's checks (ranges, paths, the model, the plan).
  return ParseJobSpec(JobSpecText(JobSpecOf(j)), "job");
}

std::string StoredJobText(const JobSpec& spec) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(ToTrainJob(spec), &out, o);  // cannot fail
  return out;
}

Result<kc::v1::TrainJob> ReadStoredTrainJob(std::string_view text,
                                            const std::string& display_name) {
  kc::v1::TrainJob job;
  if (google::protobuf::util::JsonStringToMessage(std::string(text), &job).ok()) return job;
  // Stored before the typed job: its JSON spec.
  KC_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(text, display_name));
  return ToTrainJob(spec);
}

Result<JobSpec> ReadStoredJob(std::string_view text, const std::string& display_name) {
  KC_ASSIGN_OR_RETURN(kc::v1::TrainJob job, ReadStoredTrainJob(text, display_name));
  return JobSpecOf(job);
}

kc::v1::CommLimits ToCommLimits(const comm::RateLimit& limit, const comm::LaneOptions& lanes) {
  kc::v1::CommLimits out;
  out.set_ops_per_second(limit.ops_per_second);
  out.set_bytes_per_second(limit.bytes_per_second);
  out.set_burst_ops(limit.burst_ops);
  out.set_burst_bytes(limit.burst_bytes);
  out.set_lane_chunk_bytes(lanes.chunk_bytes);
  out.set_lane_queue_chunks(lanes.queue_chunks);
  out.set_low_lane_min_share(lanes.low_lane_min_share);
  for (comm::Lane lane : lanes.priority) out.add_lane_priority(std::string(comm::LaneName(lane)));
  return out;
}

Status FromCommLimits(const kc::v1::CommLimits& in, comm::RateLimit* limit,
                      comm::LaneOptions* lanes) {
  *limit = {.ops_per_second = in.ops_per_second(),
            .bytes_per_second = in.bytes_per_second(),
            .burst_ops = in.burst_ops(),
            .burst_bytes = in.burst_bytes()};
  KC_RETURN_IF_ERROR(comm::ValidateRateLimit(*limit).WithContext("comm_limits"));
  lanes->chunk_bytes = in.lane_chunk_bytes();
  lanes->queue_chunks = in.lane_queue_chunks();
  lanes->low_lane_min_share = in.low_lane_min_share();
  if (in.lane_priority_size() != comm::kNumLanes) {
    return InvalidArgumentError(fmt::format("comm_limits: lane_priority: {} lanes, expected {}",
                                            in.lane_priority_size(), comm::kNumLanes));
  }
  for (int i = 0; i < comm::kNumLanes; ++i) {
    std::optional<comm::Lane> lane = comm::LaneFromName(in.lane_priority(i));
    if (!lane) {
      return InvalidArgumentError(
          fmt::format("comm_limits: lane_priority: unknown lane \"{}\"", in.lane_priority(i)));
    }
    lanes->priority[static_cast<size_t>(i)] = *lane;
  }
  return comm::ValidateLaneOptions(*lanes).WithContext("comm_limits");
}

Status WriteTrainRun(const std::string& path, const kc::v1::TrainRun& run) {
  std::string bytes;
  if (!run.SerializeToString(&bytes)) return InternalError(path + ": cannot serialize the run");
  return WriteFileAtomically(path, Bytes(bytes));
}

Result<kc::v1::TrainRun> ReadTrainRun(const std::string& path) {
  KC_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  kc::v1::TrainRun run;
  if (!run.ParseFromString(bytes) || !run.has_job() || !run.has_assignment()) {
    return InvalidArgumentError(fmt::format(
        "{}: not a run file (kc.v1.TrainRun, as kc agent writes it beside a run)", path));
  }
  return run;
}

kc::v1::ProgressReport ToProgressReport(const fault::ProgressSnapshot& s) {
  using Json = nlohmann::json;
  kc::v1::ProgressReport out;
  out.set_request(s.request);
  out.set_hang(s.hang);
  for (int w : s.workers) {
    kc::v1::ProgressReport::Rank* rank = out.add_ranks();
    rank->set_worker(w);
    const auto text = s.progress.find(w);
    if (text == s.progress.end()) continue;
    const Json groups = Json::parse(text->second, nullptr, /*allow_exceptions=*/false);
    if (!groups.is_array()) continue;
    rank->set_published(true);
    for (const Json& g : groups) {
      if (!g.is_object()) continue;
      kc::v1::ProgressReport::Group* group = rank->add_groups();
      group->set_group(g.value("group", std::string()));
      group->set_for_s(g.value("for_s", 0.0));
      const Json recent = g.value("recent", Json::array());
      for (const Json& o : recent) {
        if (!o.is_object()) continue;
        kc::v1::ProgressReport::Op* op = group->add_ops();
        op->set_op(o.value("op", std::string()));
        op->set_seq(o.value("seq", uint64_t{0}));
        op->set_bytes(o.value("bytes", int64_t{0}));
        op->set_ago_s(o.value("ago_s", 0.0));
        op->set_took_s(o.value("took_s", -1.0));
      }
    }
  }
  return out;
}

Status WriteInspectRequest(const std::string& dir, int64_t request) {
  const std::string text = nlohmann::json{{"request", request}}.dump() + "\n";
  return WriteFileAtomically((std::filesystem::path(dir) / kInspectRequestFile).string(),
                             std::as_bytes(std::span(text.data(), text.size())));
}

kc::v1::HostLoadReport ToHostLoadReport(const hal::HostLoad& load, const std::string& host,
                                        int64_t request) {
  kc::v1::HostLoadReport out;
  out.set_request(request);
  out.set_host(host);
  out.set_window_s(load.window_s);
  out.set_copy_bytes_per_s(load.copy_bytes_per_s);
  for (const hal::CoreLoad& c : load.cores) {
    kc::v1::HostLoadReport::Core* core = out.add_cores();
    core->set_cpu(c.cpu);
    core->set_busy(c.busy);
    core->set_run(c.run);
    core->set_steal(c.steal);
    core->set_sgemm_flops(c.sgemm_flops);
  }
  for (const hal::OtherProcess& p : load.others) {
    kc::v1::HostLoadReport::Process* other = out.add_others();
    other->set_pid(p.pid);
    other->set_command(p.command);
    other->set_cpu_share(p.cpu_share);
    other->set_cpu(p.cpu);
  }
  return out;
}

std::string ReportJson(const google::protobuf::Message& report) {
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(report, &text, options).ok()) return "{}";
  return text;
}

kc::v1::FaultReport ToFaultReport(const fault::FaultEvent& e) {
  kc::v1::FaultReport r;
  r.set_event(std::string(e.EventName()));
  r.set_worker(e.worker);
  r.set_reason(e.reason);
  r.set_ranks(e.ranks);
  r.set_step(e.step);
  if (e.steps_lost) r.set_steps_lost(*e.steps_lost);
  if (e.duration_s) r.set_duration_s(*e.duration_s);
  r.set_generation(e.generation);
  r.set_source(e.source);
  r.set_d(e.d);
  r.set_below_minimum(e.below_minimum);
  r.set_hang(e.hang);
  r.set_rebuild_s(e.rebuild_s);
  return r;
}

std::string FaultReportJson(const kc::v1::FaultReport& report) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(report, &out, o);  // cannot fail
  return out;
}

bool AppendReport(std::FILE* out, const kc::v1::TrainReport& report) {
  const std::string body = report.SerializeAsString();
  std::string framed;
  for (uint64_t n = body.size();; n >>= 7) {  // the byte count as a varint
    const auto low = static_cast<char>(n & 0x7f);
    if (n < 0x80) {
      framed.push_back(low);
      break;
    }
    framed.push_back(static_cast<char>(low | 0x80));
  }
  framed += body;
  return std::fwrite(framed.data(), 1, framed.size(), out) == framed.size() &&
         std::fflush(out) == 0;
}

Status ReadNewReports(const std::string& path, int64_t* offset,
                      const std::function<void(const kc::v1::TrainReport&)>& each) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return OkStatus();  // not written yet
  in.seekg(*offset);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = 0;
  while (at < bytes.size()) {
    uint64_t size = 0;
    size_t p = at;
    bool whole = false;
    for (int shift = 0; p < bytes.size() && shift < 64; shift += 7) {
      const auto b = static_cast<unsigned char>(bytes[p++]);
      size |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) {
        whole = true;
        break;
      }
    }
    if (!whole && p - at >= 10) size = kMaxReportBytes + 1;  // no varint ends there
    if (size > kMaxReportBytes) {
      return DataLossError(
          fmt::format("{}: at byte {}: not a report (a length of {} bytes)", path, *offset, size));
    }
    if (!whole || bytes.size() - p < size) break;  // being written
    kc::v1::TrainReport report;
    if (!report.ParseFromArray(bytes.data() + p, static_cast<int>(size))) {
      return DataLossError(fmt::format("{}: at byte {}: not a report", path, *offset));
    }
    *offset += static_cast<int64_t>(p + size - at);
    at = p + size;
    each(report);
  }
  return OkStatus();
}

}  // namespace kc::api
