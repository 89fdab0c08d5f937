// `kc ckpt`: list, verify and inspect the checkpoints `kc train --checkpoint-dir` writes.
#include "apps/kc/ckpt_command.h"

#include <fmt/format.h>

#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "base/file.h"
#include "fault/checkpoint.h"

namespace kc::app {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

struct CkptArgs {
  std::string path;
  bool json = false;
};

std::string FormatTime(double unix_s) {
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string PlanText(const Json& plan) {
  if (!plan.is_object()) return "?";
  return fmt::format("t={} p={} d={}", plan.value("t", 1), plan.value("p", 1), plan.value("d", 1));
}

int Fail(const Status& s, int code = kExitBadInput) {
  std::cerr << "kc ckpt: " << s.message() << "\n";
  return code;
}

// A directory of checkpoints, or one checkpoint (it has a manifest).
bool IsCheckpoint(const std::string& path) { return fs::exists(fs::path(path) / "MANIFEST.json"); }

int RunLs(const CkptArgs& a) {
  if (!fs::is_directory(a.path)) {
    return Fail(NotFoundError(a.path + ": no such directory"));
  }
  Result<std::vector<fault::CheckpointEntry>> list = fault::ListCheckpoints(a.path);
  if (!list.ok()) return Fail(list.status(), kExitFailure);
  Json rows = Json::array();
  for (const fault::CheckpointEntry& e : *list) {
    Result<Json> m = fault::ReadManifest(e.path);
    Json row = {{"step", e.step}, {"path", e.path}};
    if (!m.ok()) {
      row["error"] = m.status().message();
    } else {
      row["created_unix"] = (*m).value("created_unix", 0.0);
      row["ranks"] = (*m).value("ranks", 0);
      row["plan"] = (*m)["plan"];
      row["model"] = (*m)["model"].value("name", "");
    }
    rows.push_back(row);
  }
  // Directories without a manifest: a checkpoint being written, or an abandoned one.
  Json partial = Json::array();
  std::error_code ec;
  for (const fs::directory_entry& d : fs::directory_iterator(a.path, ec)) {
    const std::string name = d.path().filename().string();
    if (name.rfind("step-", 0) == 0 && !IsCheckpoint(d.path().string())) {
      partial.push_back(d.path().string());
    }
  }
  if (a.json) {
    std::cout << Json{{"checkpoints", rows}, {"uncommitted", partial}}.dump(2) << "\n";
    return kExitOk;
  }
  if (rows.empty()) {
    std::cout << "no checkpoints in " << a.path << "\n";
  } else {
    std::cout << fmt::format("{:>10}  {:<19}  {:>5}  {:<15}  {}\n", "step", "created (UTC)",
                             "ranks", "plan", "model");
    for (const Json& r : rows) {
      if (r.contains("error")) {
        std::cout << fmt::format("{:>10}  unreadable: {}\n", r["step"].get<int64_t>(),
                                 r["error"].get<std::string>());
        continue;
      }
      std::cout << fmt::format("{:>10}  {:<19}  {:>5}  {:<15}  {}\n", r["step"].get<int64_t>(),
                               FormatTime(r["created_unix"].get<double>()), r["ranks"].get<int>(),
                               PlanText(r["plan"]), r["model"].get<std::string>());
    }
    std::cout << "(listed, not verified: kc ckpt verify " << a.path << ")\n";
  }
  for (const Json& p : partial) {
    std::cout << "uncommitted: " << p.get<std::string>()
              << " (no manifest: being written, or abandoned)\n";
  }
  return kExitOk;
}

int RunVerify(const CkptArgs& a) {
  std::vector<fault::CheckpointEntry> targets;
  if (IsCheckpoint(a.path)) {
    targets.push_back({0, a.path});
  } else if (fs::is_directory(a.path)) {
    Result<std::vector<fault::CheckpointEntry>> list = fault::ListCheckpoints(a.path);
    if (!list.ok()) return Fail(list.status(), kExitFailure);
    targets = *list;
    if (targets.empty()) return Fail(NotFoundError("no checkpoints in " + a.path), kExitFailure);
  } else {
    return Fail(NotFoundError(a.path + ": neither a checkpoint nor a directory of them"));
  }
  Json rows = Json::array();
  bool all_ok = true;
  std::string resume;
  for (const fault::CheckpointEntry& e : targets) {
    Result<fault::VerifyReport> r = fault::VerifyCheckpoint(e.path);
    Json row = {{"path", e.path}, {"ok", r.ok()}};
    if (r.ok()) {
      row["ranks"] = r->ranks;
      row["chunks"] = r->chunks;
      row["raw_bytes"] = r->raw_bytes;
      row["stored_bytes"] = r->stored_bytes;
      if (resume.empty()) resume = e.path;
    } else {
      row["error"] = r.status().message();
      all_ok = false;
    }
    rows.push_back(row);
  }
  if (a.json) {
    std::cout << Json{{"checkpoints", rows},
                      {"resume_from", resume.empty() ? Json() : Json(resume)}}
                     .dump(2)
              << "\n";
  } else {
    for (const Json& r : rows) {
      if (r["ok"].get<bool>()) {
        std::cout << fmt::format(
            "ok       {}  ({} ranks, {} chunks, {:.1f} MiB, {:.1f} MiB on disk)\n",
            r["path"].get<std::string>(), r["ranks"].get<int>(), r["chunks"].get<int64_t>(),
            r["raw_bytes"].get<double>() / (1 << 20), r["stored_bytes"].get<double>() / (1 << 20));
      } else {
        std::cout << fmt::format("CORRUPT  {}: {}\n", r["path"].get<std::string>(),
                                 r["error"].get<std::string>());
      }
    }
    if (targets.size() > 1) {
      std::cout << (resume.empty() ? "no checkpoint verifies: kc train cannot resume from here\n"
                                   : "kc train --resume auto would resume from " + resume + "\n");
    }
  }
  return all_ok ? kExitOk : kExitFailure;
}

int RunInspect(const CkptArgs& a) {
  Result<Json> m = fault::ReadManifest(a.path);
  if (!m.ok()) return Fail(m.status(), fs::exists(a.path) ? kExitFailure : kExitBadInput);
  // Per tensor: its shape, and per kind the pieces and values saved.
  struct Tensor {
    std::vector<int64_t> shape;
    std::string split;
    std::map<std::string, std::pair<int64_t, int64_t>> kinds;  // kind -> pieces, values
  };
  std::map<std::string, Tensor> tensors;
  std::vector<std::string> order;
  std::set<std::string> files;
  int64_t raw = 0;
  for (const Json& entry : (*m)["rank_files"]) {
    Result<std::string> text =
        ReadWholeFile((fs::path(a.path) / entry["file"].get<std::string>()).string());
    if (!text.ok()) return Fail(text.status(), kExitFailure);
    Json rank = Json::parse(*text, nullptr, false);
    if (rank.is_discarded()) {
      return Fail(DataLossError(entry["file"].get<std::string>() + ": not JSON"), kExitFailure);
    }
    for (const Json& p : rank["pieces"]) {
      const std::string name = p["tensor"].get<std::string>();
      if (!tensors.count(name)) order.push_back(name);
      Tensor& t = tensors[name];
      t.shape = p["shape"].get<std::vector<int64_t>>();
      t.split = p["split"].get<std::string>();
      auto& [pieces, values] = t.kinds[p["kind"].get<std::string>()];
      ++pieces;
      values += p["count"].get<int64_t>();
      raw += p["count"].get<int64_t>() * 4;
      for (const Json& c : p["chunks"]) files.insert(c["file"].get<std::string>());
    }
  }
  Json out = *m;
  out.erase("rank_files");
  out["tensors"] = Json::array();
  for (const std::string& name : order) {
    const Tensor& t = tensors[name];
    Json kinds = Json::object();
    for (const auto& [kind, pv] : t.kinds) {
      kinds[kind] = {{"pieces", pv.first}, {"values", pv.second}};
    }
    out["tensors"].push_back(
        {{"name", name}, {"shape", t.shape}, {"split", t.split}, {"kinds", kinds}});
  }
  out["raw_bytes"] = raw;
  out["chunk_files"] = files.size();
  if (a.json) {
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  const Json& model = (*m)["model"];
  std::cout << fmt::format("checkpoint  {}\n", a.path);
  std::cout << fmt::format("step        {} (training resumes with step {})\n",
                           (*m)["step"].get<int64_t>(), (*m)["step"].get<int64_t>() + 1);
  std::cout << fmt::format("created     {} UTC\n", FormatTime((*m).value("created_unix", 0.0)));
  std::cout << fmt::format(
      "model       {} ({} layers, hidden {}, {} heads, vocab {}, seq_len {})\n",
      model.value("name", "?"), model.value("layers", 0), model.value("hidden", 0),
      model.value("heads", 0), model.value("vocab", 0), model.value("seq_len", 0));
  std::cout << fmt::format("plan        {} (saved with; any plan of the model loads it)\n",
                           (*m)["plan"].dump());
  std::cout << fmt::format("data        {}\n", (*m)["loader_state"].get<std::string>());
  std::cout << fmt::format("ranks       {} rank files; {} chunk files, {:.1f} MiB of values{}\n",
                           (*m)["ranks"].get<int>(), files.size(),
                           static_cast<double>(raw) / (1 << 20),
                           (*m).value("compress", false) ? ", zstd" : "");
  std::cout << fmt::format("\n{:<28} {:<14} {:<10} {}\n", "tensor", "shape", "split",
                           "saved (pieces/values per kind)");
  for (const std::string& name : order) {
    const Tensor& t = tensors[name];
    std::string shape, kinds;
    for (int64_t d : t.shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    for (const auto& [kind, pv] : t.kinds) {
      kinds += fmt::format("{}{} {}/{}", kinds.empty() ? "" : ", ", kind, pv.first, pv.second);
    }
    std::cout << fmt::format("{:<28} {:<14} {:<10} {}\n", name, shape, t.split, kinds);
  }
  return kExitOk;
}

}  // namespace

void AddCkptCommand(CLI::App& app, Action* action) {
  CLI::App* c = app.add_subcommand(
      "ckpt", "List, verify and inspect checkpoints (kc train --checkpoint-dir)");
  c->require_subcommand(1);
  auto a = std::make_shared<CkptArgs>();
  CLI::App* ls = c->add_subcommand("ls", "The committed checkpoints in a directory, newest first");
  ls->add_option("dir", a->path, "The --checkpoint-dir")->required();
  ls->add_flag("--json", a->json, "JSON instead of a table");
  ls->callback([action, a] { *action = [a] { return RunLs(*a); }; });
  CLI::App* verify = c->add_subcommand(
      "verify",
      "Read every chunk of a checkpoint (or of every one in a directory) and check its XXH3; "
      "exit 1 if any is corrupt");
  verify->add_option("path", a->path, "A checkpoint (DIR/step-N) or a --checkpoint-dir")
      ->required();
  verify->add_flag("--json", a->json, "JSON instead of lines");
  verify->callback([action, a] { *action = [a] { return RunVerify(*a); }; });
  CLI::App* inspect =
      c->add_subcommand("inspect",
                        "A checkpoint's manifest: step, model, plan, data position, "
                        "and what it holds per tensor");
  inspect->add_option("path", a->path, "A checkpoint (DIR/step-N)")->required();
  inspect->add_flag("--json", a->json, "JSON instead of text");
  inspect->callback([action, a] { *action = [a] { return RunInspect(*a); }; });
}

}  // namespace kc::app
