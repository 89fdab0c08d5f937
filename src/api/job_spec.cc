#include "api/job_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/config.h"
#include "base/file.h"
#include "fault/launch_env.h"
#include "hal/device.h"
#include "parallel/engine_support.h"
#include "parallel/model_spec.h"
#include "parallel/plan.h"

namespace kc::api {
namespace {

namespace fs = std::filesystem;

// What is wrong with a job-supplied path, if anything.
std::optional<std::string> PathProblem(std::string_view path) {
  const fs::path p(path);
  if (path.empty()) return "expected a path";
  if (p.is_absolute()) return "expected a relative path (job paths are under the agent's roots)";
  for (const fs::path& part : p) {
    if (part == "..")
      return "expected a path without \"..\" (job paths stay under the agent's roots)";
  }
  return std::nullopt;
}

// Why `name` may not be set by a command job's env, if so: not a variable name, or one of the
// launch environment's (kc run sets those per rank).
std::optional<std::string> EnvNameProblem(std::string_view name) {
  const bool valid =
      !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
      std::all_of(name.begin(), name.end(),
                  [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  if (!valid) return "expected a variable name (letters, digits and _, not first a digit)";
  if (fault::IsLaunchVariable(name)) return "set by the launch for each rank; a job cannot set it";
  return std::nullopt;
}

// The keys both forms share; `model` (a path) or `model_yaml` (its text) is read by the
// caller.
JobSpec ReadCommon(config::Map root) {
  JobSpec s;
  s.name = root.String("name");
  if (s.name.empty()) root.Reject("name", "expected a non-empty name");
  s.team = root.OptionalString("team", "");
  s.job_class = root.OptionalChoice("class", "normal", {"high", "normal", "preemptible"});
  s.ranks = static_cast<int>(root.OptionalInt("ranks", 1, config::InRange(1, 4096)));
  if (root.Has("max_devices")) {
    const int max_devices =
        static_cast<int>(root.OptionalInt("max_devices", 1, config::InRange(1, 4096)));
    if (root.Has("ranks") && max_devices != s.ranks) {
      root.Reject("max_devices", fmt::format("{} differs from ranks ({}): ranks is shorthand for "
                                             "min_devices and max_devices; give one or the others",
                                             max_devices, s.ranks));
    }
    s.ranks = max_devices;
  }
  s.min_devices = static_cast<int>(root.OptionalInt("min_devices", 0, config::InRange(0, 4096)));
  if (s.min_devices > s.ranks) {
    root.Reject("min_devices", fmt::format("{} is above max_devices ({})", s.min_devices, s.ranks));
  }
  if (s.min_devices == s.ranks) s.min_devices = 0;
  s.plan = root.OptionalString("plan", "");
  s.steps = root.OptionalInt("steps", 100, config::Positive());
  s.global_batch = root.OptionalInt("global_batch", 0, config::NonNegative());
  // A number of steps, or auto (the interval kcd's scheduler advises).
  const std::string every = root.OptionalString("checkpoint_every", "0");
  if (every == "auto") {
    s.checkpoint_auto = true;
  } else if (every.empty() || every.find_first_not_of("0123456789") != std::string::npos) {
    root.Reject("checkpoint_every",
                fmt::format("expected a number of steps or auto, got \"{}\"", every));
  } else {
    s.checkpoint_every = root.OptionalInt("checkpoint_every", 0, config::NonNegative());
  }
  s.max_restarts = static_cast<int>(root.OptionalInt("max_restarts", 3, config::InRange(0, 100)));
  s.restart_backoff_s = root.OptionalDouble("restart_backoff", 10, config::InRange(0, 3600));
  s.expected_hours = root.OptionalDouble(
      "expected_hours", 1, {.min = 0, .max = kMaxExpectedHours, .min_exclusive = true});
  s.storage_gb = root.OptionalDouble("storage_gb", 0, config::InRange(0, kMaxStorageGb));
  for (auto [key, out] : {std::pair{"data", &s.data}, {"checkpoint_dir", &s.checkpoint_dir}}) {
    *out = root.OptionalString(key, "");
    if (!out->empty()) {
      if (std::optional<std::string> why = PathProblem(*out)) root.Reject(key, *why);
    }
  }
  s.checkpoint_keep =
      static_cast<int>(root.OptionalInt("checkpoint_keep", 3, config::InRange(1, 1000)));
  s.checkpoint_compress = root.OptionalBool("checkpoint_compress", false);
  if (const std::string copies = root.OptionalString("memory_copy_every", "auto");
      copies != "auto") {
    if (copies.empty() || copies.find_first_not_of("0123456789") != std::string::npos) {
      root.Reject(
          "memory_copy_every",
          fmt::format("expected a number of steps (0: no copies) or auto, got \"{}\"", copies));
    } else {
      const int64_t copy_every =
          root.OptionalInt("memory_copy_every", 0, config::InRange(0, 1000000));
      s.memory_copy_every = copy_every == 0 ? -1 : copy_every;
    }
  }
  s.grad_wire = root.OptionalString("grad_wire", "fp32");
  if (s.grad_wire != "fp32" && s.grad_wire != "bf16") {
    root.Reject("grad_wire", fmt::format("expected fp32 or bf16, got \"{}\"", s.grad_wire));
  }
  s.heartbeat_period_s =
      root.OptionalDouble("heartbeat_period", 1, {.min = 0, .max = 60, .min_exclusive = true});
  // A command job's program beats only if it is asked to (kc run --heartbeat-timeout): none by
  // default.
  const bool command_job = root.Has("command");
  s.heartbeat_timeout_s =
      root.OptionalDouble("heartbeat_timeout", command_job ? 0 : 30, config::InRange(0, 3600));
  if (s.heartbeat_timeout_s < 2 * s.heartbeat_period_s &&
      !(command_job && s.heartbeat_timeout_s == 0)) {
    root.Reject("heartbeat_timeout", fmt::format("{} s is less than two heartbeat periods ({} s)",
                                                 s.heartbeat_timeout_s, 2 * s.heartbeat_period_s));
  }
  if (root.Has("command")) {
    s.command = root.StringList("command");
    if (s.command.empty() || s.command[0].empty()) {
      root.Reject("command", "expected the program and its arguments, e.g. [python3, train.py]");
    }
    s.workdir = root.OptionalString("workdir", "");
    if (!s.workdir.empty()) {
      if (std::optional<std::string> why = PathProblem(s.workdir)) root.Reject("workdir", *why);
    }
    if (root.Has("env")) {
      config::Map env = root.OptionalMap("env");
      for (const std::string& name : env.Keys()) {
        const std::string value = env.String(name);
        if (std::optional<std::string> why = EnvNameProblem(name)) {
          env.Reject(name, *why);
          continue;
        }
        s.env.emplace_back(name, value);
      }
    }
    // What only a model job has.
    for (const char* key : {"plan", "global_batch", "data", "steps", "checkpoint_keep",
                            "checkpoint_compress", "memory_copy_every", "grad_wire"}) {
      if (root.Has(key)) {
        root.Reject(key, "only for a model job (a command job's program trains as it will)");
      }
    }
  } else {
    for (const char* key : {"workdir", "env"}) {
      if (root.Has(key)) root.Reject(key, "only for a command job (command: [PROGRAM, ARGS...])");
    }
  }
  if (!s.checkpoint_dir.empty() && IsReservedCheckpointDir(s.checkpoint_dir)) {
    root.Reject("checkpoint_dir",
                "expected a directory outside jobs/ and agent/ (the agent keeps each job's own "
                "checkpoints under jobs/, the default)");
  }
  return s;
}

// The model text must be a valid model: checked here so a bad one is refused at submission.
Status CheckModel(const JobSpec& s, std::string_view where) {
  Result<parallel::ModelSpec> m = parallel::LoadModelSpecFromString(s.model_yaml, "model");
  if (!m.ok()) return InvalidArgumentError(fmt::format("{}: {}", where, m.status().message()));
  return OkStatus();
}

// A plan the job gives must cut its model over its ranks and be one the engine runs (on CPU
// slices, as agents run jobs): why not, for the key `plan`.
std::optional<std::string> PlanProblem(const JobSpec& s) {
  if (s.plan.empty()) return std::nullopt;
  Result<parallel::ParallelPlan> plan = parallel::ParsePlanFlag(s.plan);
  if (!plan.ok()) return std::string(plan.status().message());
  Result<parallel::ModelSpec> m = parallel::LoadModelSpecFromString(s.model_yaml, "model");
  if (!m.ok()) return std::nullopt;  // the model's own error is reported for its key
  // An elastic job's plan is for a size in [min_devices, ranks]: kcd writes the plan for the
  // size it starts the job at into the spec its agent receives.
  const int world = plan->t * plan->p * plan->d;
  const bool elastic_size =
      s.command.empty() && s.min_devices > 0 && world >= s.min_devices && world <= s.ranks;
  if (Status v = parallel::ValidatePlan(*plan, *m, elastic_size ? world : s.ranks, s.global_batch);
      !v.ok()) {
    return std::string(v.message());
  }
  if (Status e = parallel::EngineSupports(*plan, hal::DeviceKind::kCpu); !e.ok()) {
    return std::string(e.message());
  }
  if (plan->zero_stage > 0 && s.min_devices > 0 && s.checkpoint_every == 0 && !s.checkpoint_auto) {
    return std::string(
        "zero_stage 1 with min_devices needs checkpoint_every: a lost rank's part of the "
        "optimizer state comes back from the newest checkpoint");
  }
  return std::nullopt;
}

}  // namespace

bool IsReservedCheckpointDir(std::string_view path) {
  const fs::path normal = fs::path(path).lexically_normal();
  if (normal.empty()) return false;
  const fs::path first = *normal.begin();
  return first == "jobs" || first == "agent";
}

Status CheckRelativePath(std::string_view key, std::string_view path) {
  if (std::optional<std::string> why = PathProblem(path)) {
    return InvalidArgumentError(fmt::format("{}: {}, got \"{}\"", key, *why, path));
  }
  return OkStatus();
}

Result<JobSpec> LoadJobFile(const std::string& path) {
  KC_ASSIGN_OR_RETURN(config::Document doc, config::Document::LoadFile(path));
  config::Map root = doc.root();
  JobSpec s = ReadCommon(root);
  const bool command = root.Has("command");
  const std::string model = command ? "" : root.String("model");
  if (command && root.Has("model")) {
    root.Reject("model", "a job runs a model or a command, not both");
  }
  std::optional<std::string> model_error;
  if (!model.empty()) {
    const fs::path model_path = fs::path(path).parent_path() / model;
    // A model file is a small text file: not a device, a pipe or a file without end.
    std::error_code ec;
    const bool regular = fs::is_regular_file(model_path, ec);
    const uintmax_t size = regular ? fs::file_size(model_path, ec) : 0;
    Result<std::string> text =
        !regular || ec          ? Result<std::string>(NotFoundError("not a regular file"))
        : size > kMaxModelBytes ? Result<std::string>(InvalidArgumentError("too large"))
                                : ReadWholeFile(model_path.string());
    if (!text.ok()) {
      root.Reject("model",
                  fmt::format("cannot read the model file {} ({}; a model file is a "
                              "regular file of at most {} bytes)",
                              model_path.string(), text.status().message(), kMaxModelBytes));
    } else {
      s.model_yaml = *std::move(text);
      Result<parallel::ModelSpec> m =
          parallel::LoadModelSpecFromString(s.model_yaml, model_path.string());
      if (!m.ok()) model_error = m.status().message();
    }
  }
  if (!model_error && !s.model_yaml.empty()) {
    if (std::optional<std::string> why = PlanProblem(s)) root.Reject("plan", *why);
  }
  KC_RETURN_IF_ERROR(doc.Finish());
  if (model_error) {
    return InvalidArgumentError(fmt::format("{}: model: {}", path, *model_error));
  }
  return s;
}

std::string JobSpecText(const JobSpec& s) {
  nlohmann::ordered_json j = {
      {"name", s.name},
      {"team", s.team},
      {"class", s.job_class},
      {"ranks", s.ranks},
      {"min_devices", s.min_devices},
      {"plan", s.plan},
      {"steps", s.steps},
      {"global_batch", s.global_batch},
      {"checkpoint_every", s.checkpoint_every},
      {"max_restarts", s.max_restarts},
      {"restart_backoff", s.restart_backoff_s},
      {"expected_hours", s.expected_hours},
      {"storage_gb", s.storage_gb},
      {"data", s.data},
      {"checkpoint_dir", s.checkpoint_dir},
      {"checkpoint_keep", s.checkpoint_keep},
      {"checkpoint_compress", s.checkpoint_compress},
      {"memory_copy_every", s.memory_copy_every > 0   ? nlohmann::ordered_json(s.memory_copy_every)
                            : s.memory_copy_every < 0 ? nlohmann::ordered_json(0)
                                                      : nlohmann::ordered_json("auto")},
      {"grad_wire", s.grad_wire},
      {"heartbeat_period", s.heartbeat_period_s},
      {"heartbeat_timeout", s.heartbeat_timeout_s},
      {"model_yaml", s.model_yaml}};
  if (s.checkpoint_auto) j["checkpoint_every"] = "auto";
  if (!s.command.empty()) {
    // A command job: no model, nor what only a model job has.
    for (const char* key :
         {"plan", "steps", "global_batch", "data", "model_yaml", "checkpoint_keep",
          "checkpoint_compress", "memory_copy_every", "grad_wire"}) {
      j.erase(key);
    }
    if (s.heartbeat_timeout_s == 0) {  // no heartbeats asked of its program
      j.erase("heartbeat_period");
      j.erase("heartbeat_timeout");
    }
    j["command"] = s.command;
    if (!s.workdir.empty()) j["workdir"] = s.workdir;
    if (!s.env.empty()) {
      nlohmann::ordered_json env = nlohmann::ordered_json::object();
      for (const auto& [name, value] : s.env) env[name] = value;
      j["env"] = env;
    }
  }
  return j.dump();
}

Result<JobSpec> ParseJobSpec(std::string_view text, std::string display_name) {
  // JSON is YAML: the same strict reader checks both forms.
  KC_ASSIGN_OR_RETURN(config::Document doc, config::Document::LoadString(text, display_name));
  config::Map root = doc.root();
  JobSpec s = ReadCommon(root);
  const bool command = root.Has("command");
  s.model_yaml = command ? "" : root.String("model_yaml");
  if (command && root.Has("model_yaml")) {
    root.Reject("model_yaml", "a job runs a model or a command, not both");
  }
  if (std::optional<std::string> why = PlanProblem(s)) root.Reject("plan", *why);
  KC_RETURN_IF_ERROR(doc.Finish());
  if (!command) KC_RETURN_IF_ERROR(CheckModel(s, display_name + ": model_yaml"));
  return s;
}

}  // namespace kc::api
