// `kc data prepare`: text files -> byte-level token shards (train and val) plus a manifest.
#include "apps/kc/data_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "parallel/data/loader.h"
#include "parallel/data/token_shard.h"

namespace kc::app {
namespace {

namespace fs = std::filesystem;

struct PrepareArgs {
  std::string out;
  int64_t shard_tokens = int64_t{1} << 24;
  double val_fraction = 0.05;
  int64_t seed = 1;
  std::string doc_separator;
  std::vector<std::string> inputs;
};

// A failure with the exit code it maps to.
struct Failure {
  int exit_code;
  std::string message;
};

// The text files named by `inputs`, directories recursed in name order. Symbolic links met
// while recursing are skipped (they would repeat a file), as is anything under `out`.
std::vector<fs::path> ListInputs(const std::vector<std::string>& inputs, const fs::path& out,
                                 std::vector<Failure>* failures) {
  std::vector<fs::path> files;
  std::error_code ec;
  const fs::path out_abs = fs::weakly_canonical(out, ec);
  auto under_out = [&](const fs::path& p) {
    const fs::path abs = fs::weakly_canonical(p, ec);
    auto [o, a] = std::mismatch(out_abs.begin(), out_abs.end(), abs.begin(), abs.end());
    return o == out_abs.end();
  };
  for (const std::string& input : inputs) {
    const fs::file_status st = fs::status(input, ec);
    if (ec || !fs::exists(st)) {
      failures->push_back({kExitBadInput, fmt::format("{}: no such file or directory", input)});
      continue;
    }
    if (fs::is_regular_file(st)) {
      files.emplace_back(input);
      continue;
    }
    if (!fs::is_directory(st)) {
      failures->push_back({kExitBadInput, fmt::format("{}: not a file or directory", input)});
      continue;
    }
    std::vector<fs::path> found;
    for (fs::recursive_directory_iterator it(input, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->is_symlink() || !it->is_regular_file()) continue;
      if (under_out(it->path())) continue;
      found.push_back(it->path());
    }
    if (ec) {
      failures->push_back({kExitFailure, fmt::format("{}: cannot list: {}", input, ec.message())});
      continue;
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

Status ReadFile(const fs::path& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return UnavailableError(fmt::format("{}: cannot open", path.string()));
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  if (f.bad()) return UnavailableError(fmt::format("{}: read error", path.string()));
  return OkStatus();
}

// Writes `tokens` as shards named PREFIX_NNNNN.tok of at most `shard_tokens` each.
Status WriteSplit(const fs::path& dir, std::string_view prefix, std::span<const uint16_t> tokens,
                  int64_t shard_tokens, std::vector<parallel::ManifestShard>* shards) {
  for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(shard_tokens)) {
    const size_t n = std::min(tokens.size() - begin, static_cast<size_t>(shard_tokens));
    const std::string name = fmt::format("{}_{:05d}.tok", prefix, shards->size());
    KC_RETURN_IF_ERROR(parallel::WriteTokenShard((dir / name).string(), tokens.subspan(begin, n)));
    shards->push_back({name, n});
  }
  return OkStatus();
}

int RunPrepare(const PrepareArgs& args) {
  // Validate every argument before reading anything.
  if (args.shard_tokens < 1) {
    std::cerr << fmt::format("kc: --shard-tokens: must be >= 1, got {}\n", args.shard_tokens);
    return kExitBadInput;
  }
  if (!(args.val_fraction >= 0 && args.val_fraction < 1)) {
    std::cerr << fmt::format("kc: --val-fraction: must be in [0, 1), got {}\n", args.val_fraction);
    return kExitBadInput;
  }
  if (args.seed < 0) {
    std::cerr << fmt::format("kc: --seed: must be >= 0, got {}\n", args.seed);
    return kExitBadInput;
  }
  std::vector<Failure> failures;
  const std::vector<fs::path> files = ListInputs(args.inputs, args.out, &failures);
  for (const Failure& f : failures) std::cerr << "kc: data prepare: " << f.message << "\n";
  if (!failures.empty()) {
    const bool bad_input = std::all_of(failures.begin(), failures.end(), [](const Failure& f) {
      return f.exit_code == kExitBadInput;
    });
    return bad_input ? kExitBadInput : kExitFailure;
  }

  // Read the text files; files containing NUL bytes are binary: rejected when named, skipped
  // when found in a directory.
  std::vector<std::string> texts;
  std::vector<std::string> skipped;
  int64_t text_bytes = 0;
  const std::vector<std::string>& named = args.inputs;
  for (const fs::path& path : files) {
    std::string text;
    if (Status s = ReadFile(path, &text); !s.ok()) {
      std::cerr << "kc: data prepare: " << s.message() << "\n";
      return kExitFailure;
    }
    if (text.find('\0') != std::string::npos) {
      if (std::find(named.begin(), named.end(), path.string()) != named.end()) {
        std::cerr << fmt::format(
            "kc: data prepare: {}: binary file (contains NUL bytes); give text files\n",
            path.string());
        return kExitBadInput;
      }
      skipped.push_back(path.string());
      continue;
    }
    text_bytes += static_cast<int64_t>(text.size());
    texts.push_back(std::move(text));
  }

  // Documents, each followed by the end-of-text token, in an order shuffled by the seed.
  std::vector<std::string_view> docs;
  for (const std::string& text : texts) {
    for (std::string_view d : parallel::SplitDocuments(text, args.doc_separator)) {
      docs.push_back(d);
    }
  }
  if (docs.empty()) {
    std::cerr << "kc: data prepare: the inputs hold no text"
              << (skipped.empty() ? "" : fmt::format(" ({} binary files skipped)", skipped.size()))
              << "\n";
    return kExitBadInput;
  }
  std::vector<uint16_t> tokens;
  tokens.reserve(static_cast<size_t>(text_bytes) + docs.size());
  std::vector<size_t> doc_ends;  // token offset after each document's end-of-text token
  for (uint64_t i :
       parallel::DeterministicPermutation(docs.size(), static_cast<uint64_t>(args.seed))) {
    parallel::ByteTokenize(docs[i], &tokens);
    tokens.push_back(parallel::kByteEotToken);
    doc_ends.push_back(tokens.size());
  }

  // The val split is the first documents of that order, at least val_fraction of the tokens;
  // when that would leave no training tokens, the cut falls inside a document.
  size_t val_tokens = 0;
  if (args.val_fraction > 0) {
    const size_t want = static_cast<size_t>(std::ceil(args.val_fraction * tokens.size()));
    auto it = std::lower_bound(doc_ends.begin(), doc_ends.end(), want);
    val_tokens = it != doc_ends.end() && *it < tokens.size() ? *it : want;
  }
  const std::span<const uint16_t> all(tokens);

  std::error_code ec;
  const fs::path out(args.out);
  fs::create_directories(out, ec);
  if (ec) {
    std::cerr << fmt::format("kc: data prepare: {}: cannot create: {}\n", args.out, ec.message());
    return kExitFailure;
  }
  parallel::TokenManifest manifest;
  Status s = WriteSplit(out, "val", all.first(val_tokens), args.shard_tokens, &manifest.val);
  if (s.ok()) {
    s = WriteSplit(out, "train", all.subspan(val_tokens), args.shard_tokens, &manifest.train);
  }
  if (s.ok()) s = parallel::WriteTokenManifest((out / "manifest.json").string(), manifest);
  if (!s.ok()) {
    std::cerr << "kc: data prepare: " << s.message() << "\n";
    return kExitFailure;
  }
  // Shards of an earlier run into the same directory that this run did not rewrite.
  for (const auto& entry : fs::directory_iterator(out, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".tok") || !(name.starts_with("train_") || name.starts_with("val_"))) {
      continue;
    }
    auto listed = [&](const std::vector<parallel::ManifestShard>& list) {
      return std::any_of(list.begin(), list.end(),
                         [&](const parallel::ManifestShard& m) { return m.file == name; });
    };
    if (!listed(manifest.train) && !listed(manifest.val)) fs::remove(entry.path(), ec);
  }

  if (!skipped.empty()) {
    std::cout << fmt::format("skipped  {} binary file{} (NUL bytes), e.g. {}\n", skipped.size(),
                             skipped.size() == 1 ? "" : "s", skipped.front());
  }
  std::cout << fmt::format("read     {} text file{}, {} bytes, {} document{}\n", texts.size(),
                           texts.size() == 1 ? "" : "s", text_bytes, docs.size(),
                           docs.size() == 1 ? "" : "s");
  std::cout << fmt::format("train    {} tokens in {} shard{}\n", tokens.size() - val_tokens,
                           manifest.train.size(), manifest.train.size() == 1 ? "" : "s");
  std::cout << fmt::format("val      {} tokens in {} shard{}\n", val_tokens, manifest.val.size(),
                           manifest.val.size() == 1 ? "" : "s");
  std::cout << fmt::format("wrote    {}\n", (out / "manifest.json").string());
  return kExitOk;
}

}  // namespace

void AddDataCommand(CLI::App& app, Action* action) {
  CLI::App* data = app.add_subcommand("data", "Prepare training data");
  data->require_subcommand(1);
  CLI::App* prepare = data->add_subcommand(
      "prepare", "Turn text files into byte-level token shards (train and val) and a manifest");
  auto args = std::make_shared<PrepareArgs>();
  prepare->add_option("--out", args->out, "Directory for the shards and manifest.json")->required();
  prepare->add_option("--shard-tokens", args->shard_tokens, "Most tokens per shard")
      ->capture_default_str();
  prepare
      ->add_option("--val-fraction", args->val_fraction,
                   "Fraction of the tokens (whole documents) held out as the val split")
      ->capture_default_str();
  prepare->add_option("--seed", args->seed, "Seed of the document order and the split")
      ->capture_default_str();
  prepare->add_option("--doc-separator", args->doc_separator,
                      "A line exactly this ends a document (e.g. % for fortune files); "
                      "default: each file is one document");
  prepare->add_option("inputs", args->inputs, "Text files and directories (recursed)")->required();
  prepare->callback([action, args] { *action = [args] { return RunPrepare(*args); }; });
}

}  // namespace kc::app
