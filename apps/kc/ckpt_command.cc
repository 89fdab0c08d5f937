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
#include "parallel/tensor_parallel.h"

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

// `obj`'s `key` as text, whatever its type ("?" when absent): a checkpoint's plan and model are
// what its writer put there.
std::string Field(const Json& obj, const char* key) {
  if (!obj.is_object() || !obj.contains(key)) return "?";
  const Json& v = obj[key];
  return Printable(v.is_string() ? v.get<std::string>()
                                 : v.dump(-1, ' ', false, Json::error_handler_t::replace));
}

std::string PlanText(const Json& plan) {
  if (!plan.is_object()) return "?";
  return fmt::format("t={} p={} d={}", Field(plan, "t"), Field(plan, "p"), Field(plan, "d"));
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
    Result<fault::Manifest> m = fault::ReadManifest(e.path);
    Json row = {{"step", e.step}, {"path", e.path}};
    if (!m.ok()) {
      row["error"] = m.status().message();
    } else {
      row["created_unix"] = m->created_unix;
      row["ranks"] = m->ranks;
      row["plan"] = m->plan;
      row["model"] = Field(m->model, "name");
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
    std::cout << Json{{"checkpoints", rows}, {"uncommitted", partial}}.dump(
                     2, ' ', false, Json::error_handler_t::replace)
              << "\n";
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
                                 Printable(r["error"].get<std::string>()));
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
                     .dump(2, ' ', false, Json::error_handler_t::replace)
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
                                 Printable(r["error"].get<std::string>()));
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
  Result<fault::Manifest> m = fault::ReadManifest(a.path);
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
  for (const fault::Manifest::RankFile& entry : m->rank_files) {
    const std::string path = (fs::path(a.path) / entry.file).string();
    Result<std::string> text = ReadWholeFile(path);
    if (!text.ok()) return Fail(text.status(), kExitFailure);
    Result<fault::RankIndex> rank = fault::ParseRankFile(*text, path);
    if (!rank.ok()) return Fail(rank.status(), kExitFailure);
    for (const fault::PieceIndex& p : rank->pieces) {
      if (!tensors.count(p.tensor)) order.push_back(p.tensor);
      Tensor& t = tensors[p.tensor];
      t.shape = p.shape;
      t.split = parallel::TpSplitName(p.split);
      auto& [pieces, values] = t.kinds[p.kind];
      ++pieces;
      values += p.count;
      raw += p.count * 4;
      for (const fault::ChunkRef& c : p.chunks) fault::AddChunkFiles(c, &files);
    }
  }
  Json out = {{"step", m->step},
              {"loader_state", m->loader_state},
              {"plan", m->plan},
              {"model", m->model},
              {"ranks", m->ranks},
              {"compress", m->compress},
              {"chunk_bytes", m->chunk_bytes},
              {"created_unix", m->created_unix}};
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
    std::cout << out.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
    return kExitOk;
  }
  const Json& model = m->model;
  std::cout << fmt::format("checkpoint  {}\n", a.path);
  std::cout << fmt::format("step        {} (training resumes with step {})\n", m->step,
                           m->step + 1);
  std::cout << fmt::format("created     {} UTC\n", FormatTime(m->created_unix));
  std::cout << fmt::format(
      "model       {} ({} layers, hidden {}, {} heads, vocab {}, seq_len {})\n",
      Field(model, "name"), Field(model, "layers"), Field(model, "hidden"), Field(model, "heads"),
      Field(model, "vocab"), Field(model, "seq_len"));
  std::cout << fmt::format("plan        {} (saved with; any plan of the model loads it)\n",
                           Printable(m->plan.dump(-1, ' ', false, Json::error_handler_t::replace)));
  std::cout << fmt::format("data        {}\n", Printable(m->loader_state));
  std::cout << fmt::format("ranks       {} rank files; {} chunk files, {:.1f} MiB of values{}\n",
                           m->ranks, files.size(), static_cast<double>(raw) / (1 << 20),
                           m->compress ? ", zstd" : "");
  std::cout << fmt::format("\n{:<28} {:<14} {:<10} {}\n", "tensor", "shape", "split",
                           "saved (pieces/values per kind)");
  for (const std::string& name : order) {
    const Tensor& t = tensors[name];
    std::string shape, kinds;
    for (int64_t d : t.shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    for (const auto& [kind, pv] : t.kinds) {
      kinds += fmt::format("{}{} {}/{}", kinds.empty() ? "" : ", ", kind, pv.first, pv.second);
    }
    std::cout << fmt::format("{:<28} {:<14} {:<10} {}\n", Printable(name), shape, t.split,
                             Printable(kinds));
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
