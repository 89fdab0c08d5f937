#include "fault/checkpoint.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "base/file.h"
#include "base/layer_guard.h"
#include "parallel/tensor_parallel.h"

namespace kc::fault {
namespace fs = std::filesystem;
using Json = nlohmann::json;
using parallel::StateTensor;
using parallel::TpSplit;

namespace {

constexpr char kManifestFormat[] = "kc-checkpoint/1";
constexpr char kRankFormat[] = "kc-checkpoint-rank/1";
constexpr char kManifest[] = "MANIFEST.json";

std::string StepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

std::string RankFileName(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.json", rank);
  return name;
}

// The step of a directory named step-N; -1 for any other name.
int64_t StepOf(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::span<const std::byte> Bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Reads chunk `ref` ({"file", "hash", "bytes"}) under `dir`, decompressed, and checks its hash.
Status ReadChunk(const fs::path& dir, const Json& ref, std::vector<std::byte>* out,
                 int64_t* stored = nullptr) {
  const std::string file = ref.at("file").get<std::string>();
  const int64_t bytes = ref.at("bytes").get<int64_t>();
  Result<std::string> data = ReadWholeFile((dir / file).string());
  if (!data.ok()) return DataLossError("chunk " + file + ": " + data.status().message());
  if (stored != nullptr) *stored += static_cast<int64_t>(data->size());
  out->resize(static_cast<size_t>(bytes));
  if (file.ends_with(".zst")) {
    const size_t n = ZSTD_decompress(out->data(), out->size(), data->data(), data->size());
    if (ZSTD_isError(n) || static_cast<int64_t>(n) != bytes) {
      return DataLossError("chunk " + file + ": does not decompress to its " +
                           std::to_string(bytes) + " bytes (" +
                           (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size") + ")");
    }
  } else {
    if (static_cast<int64_t>(data->size()) != bytes) {
      return DataLossError("chunk " + file + ": " + std::to_string(data->size()) +
                           " bytes, expected " + std::to_string(bytes) + " (truncated?)");
    }
    std::copy_n(reinterpret_cast<const std::byte*>(data->data()), data->size(), out->data());
  }
  if (ContentHash(*out) != ref.at("hash").get<std::string>()) {
    return DataLossError("chunk " + file + ": checksum mismatch (its content changed)");
  }
  return OkStatus();
}

// A rank file of the checkpoint at `path`, checked against the manifest's hash.
Result<Json> ReadRankFile(const fs::path& path, const Json& entry) {
  const std::string file = entry.at("file").get<std::string>();
  Result<std::string> text = ReadWholeFile((path / file).string());
  if (!text.ok()) return DataLossError(file + ": " + text.status().message());
  if (ContentHash(Bytes(*text)) != entry.at("hash").get<std::string>()) {
    return DataLossError(file + ": checksum mismatch against the manifest (changed or truncated)");
  }
  Json j = Json::parse(*text, nullptr, false);
  if (j.is_discarded() || j.value("format", "") != kRankFormat) {
    return DataLossError(file + ": not a " + std::string(kRankFormat) + " file");
  }
  return j;
}

// Every rank file of the checkpoint at `path`, verified.
Result<std::vector<Json>> ReadRankFiles(const fs::path& path, const Json& manifest) {
  std::vector<Json> out;
  for (const Json& entry : manifest.at("rank_files")) {
    KC_ASSIGN_OR_RETURN(Json j, ReadRankFile(path, entry));
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace

std::string ContentHash(std::span<const std::byte> data) {
  const XXH128_hash_t h = XXH3_128bits(data.data(), data.size());
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return hex;
}

// ---------------------------------------------------------------------------------------------
// Writing.

struct CheckpointWriter::Piece {
  std::string tensor;
  const char* kind = "param";  // "param", "exp_avg", "exp_avg_sq"
  std::vector<int64_t> shape;
  TpSplit split = TpSplit::kReplicated;
  int tp_rank = 0;
  int tp_size = 1;
  int64_t offset = 0;  // into the shard
  int64_t count = 0;
  size_t at = 0;  // into snapshot_
};

CheckpointWriter::CheckpointWriter(CheckpointOptions options, int rank, int ranks,
                                   comm::Store* store)
    : options_(std::move(options)), rank_(rank), ranks_(ranks), store_(store) {
  last_.step = -1;  // none persisted yet
}

Result<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(const CheckpointOptions& options,
                                                                   int rank, int ranks,
                                                                   comm::Store* store) {
  if (options.dir.empty()) return InvalidArgumentError("checkpoint directory: empty path");
  if (options.keep < 1) {
    return InvalidArgumentError("checkpoint keep " + std::to_string(options.keep) +
                                ": must be at least 1");
  }
  if (options.chunk_bytes < 4096 || options.chunk_bytes % 4 != 0) {
    return InvalidArgumentError("checkpoint chunk size " + std::to_string(options.chunk_bytes) +
                                ": must be a multiple of 4 of at least 4096 bytes");
  }
  if (ranks > 1 && store == nullptr) {
    return InvalidArgumentError("checkpoints of several ranks need the rendezvous store");
  }
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) {
    return UnavailableError("checkpoint directory " + options.dir + ": " + ec.message());
  }
  return std::unique_ptr<CheckpointWriter>(new CheckpointWriter(options, rank, ranks, store));
}

CheckpointWriter::~CheckpointWriter() { (void)Wait(); }

Status CheckpointWriter::Wait() {
  if (persist_.joinable()) {
    persist_.join();
    last_ = stats_;
  }
  return std::exchange(persist_status_, OkStatus());
}

SaveStats CheckpointWriter::last_stats() const { return last_; }

size_t CheckpointWriter::ListPieces(std::span<const StateTensor> tensors, const Ownership& owner) {
  pieces_.clear();
  size_t total = 0;
  auto add = [&](const StateTensor& t, const char* kind, int64_t offset, int64_t count) {
    pieces_.push_back({t.name, kind, t.shape, t.split, t.tp_rank, t.tp_size, offset, count, total});
    total += static_cast<size_t>(count);
  };
  for (const StateTensor& t : tensors) {
    if (t.second_copy || (t.split == TpSplit::kReplicated && owner.tp_rank != 0)) continue;
    if (!owner.zero && owner.dp_rank != 0) continue;
    if (!owner.zero) add(t, "param", 0, static_cast<int64_t>(t.values.size()));
    for (const StateTensor::Moments& m : t.moments) {
      const int64_t n = static_cast<int64_t>(m.m.size());
      if (owner.zero) add(t, "param", m.offset, n);
      add(t, "exp_avg", m.offset, n);
      add(t, "exp_avg_sq", m.offset, n);
    }
  }
  return total;
}

void CheckpointWriter::Prepare(std::span<const StateTensor> tensors, const Ownership& owner) {
  (void)Wait();
  snapshot_.assign(ListPieces(tensors, owner), 0.0f);
}

Status CheckpointWriter::Save(std::span<const StateTensor> tensors, const Ownership& owner,
                              const CheckpointInfo& info) {
  KC_LAYER_ENTRY(Layer::kFault, "checkpoint");
  const auto t0 = std::chrono::steady_clock::now();
  Status previous = Wait();
  const size_t total = ListPieces(tensors, owner);
  snapshot_.resize(total);
  size_t i = 0;
  for (const StateTensor& t : tensors) {
    if (t.second_copy || (t.split == TpSplit::kReplicated && owner.tp_rank != 0)) continue;
    if (!owner.zero && owner.dp_rank != 0) continue;
    auto copy = [&](std::span<const float> from) {
      std::copy(from.begin(), from.end(),
                snapshot_.begin() + static_cast<ptrdiff_t>(pieces_[i++].at));
    };
    if (!owner.zero) copy(t.values);
    for (const StateTensor::Moments& m : t.moments) {
      if (owner.zero) copy(t.values.subspan(static_cast<size_t>(m.offset), m.m.size()));
      copy(m.m);
      copy(m.v);
    }
  }
  info_ = info;
  stats_ = {.step = info.step, .raw_bytes = static_cast<int64_t>(total * sizeof(float))};
  stats_.stall_s = Since(t0);
  persisting_.store(true, std::memory_order_release);
  persist_ = std::thread([this] {
    persist_status_ = Persist();
    persisting_.store(false, std::memory_order_release);
  });
  return previous;
}

Status CheckpointWriter::Persist() {
  if (options_.on_persist) options_.on_persist(info_.step);
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path root = options_.dir;
  const std::string step_dir = StepDirName(info_.step);
  std::unordered_map<std::string, std::string> written;  // hash -> file, this checkpoint
  std::unordered_map<std::string, std::string> previous(previous_.begin(), previous_.end());
  std::vector<char> compressed;
  std::vector<std::string> fresh;  // chunk files written now
  Json pieces = Json::array();
  for (const Piece& p : pieces_) {
    Json chunks = Json::array();
    const auto* base = reinterpret_cast<const std::byte*>(snapshot_.data() + p.at);
    const int64_t bytes = p.count * static_cast<int64_t>(sizeof(float));
    for (int64_t off = 0; off < bytes; off += options_.chunk_bytes) {
      const std::span<const std::byte> data(
          base + off, static_cast<size_t>(std::min(options_.chunk_bytes, bytes - off)));
      const std::string hash = ContentHash(data);
      std::string file;
      if (auto it = written.find(hash); it != written.end()) {
        file = it->second;
        ++stats_.chunks_reused;
      } else if (auto prev = previous.find(hash); prev != previous.end()) {
        file = prev->second;
        ++stats_.chunks_reused;
      } else {
        file = step_dir + "/chunks/" + hash + (options_.compress ? ".zst" : ".bin");
        std::span<const std::byte> out = data;
        if (options_.compress) {
          compressed.resize(ZSTD_compressBound(data.size()));
          const size_t n =
              ZSTD_compress(compressed.data(), compressed.size(), data.data(), data.size(), 1);
          if (ZSTD_isError(n)) {
            return InternalError(std::string("zstd: ") + ZSTD_getErrorName(n));
          }
          out = std::as_bytes(std::span<const char>(compressed.data(), n));
        }
        // Synced all together below, before the rank file that names them.
        fresh.push_back((root / file).string());
        KC_RETURN_IF_ERROR(WriteFileAtomically(fresh.back(), out));
        ++stats_.chunks_written;
        stats_.bytes_written += static_cast<int64_t>(out.size());
      }
      written.emplace(hash, file);
      chunks.push_back({{"file", file}, {"hash", hash}, {"bytes", data.size()}});
    }
    pieces.push_back({{"tensor", p.tensor},
                      {"kind", p.kind},
                      {"shape", p.shape},
                      {"split", parallel::TpSplitName(p.split)},
                      {"tp_rank", p.tp_rank},
                      {"tp_size", p.tp_size},
                      {"offset", p.offset},
                      {"count", p.count},
                      {"chunks", std::move(chunks)}});
  }
  KC_RETURN_IF_ERROR(SyncFiles(fresh));
  const std::string rank_text =
      Json{{"format", kRankFormat}, {"rank", rank_}, {"pieces", std::move(pieces)}}.dump(1);
  const std::string rank_file = RankFileName(rank_);
  KC_RETURN_IF_ERROR(WriteFileDurably((root / step_dir / rank_file).string(), rank_text));
  const std::string rank_hash = ContentHash(Bytes(rank_text));
  previous_.assign(written.begin(), written.end());

  // The commit: rank 0 writes the manifest once every rank's file is durable.
  const std::string key_prefix = "kc/checkpoint/" + step_dir + "/";
  if (ranks_ > 1) KC_RETURN_IF_ERROR(store_->Set(key_prefix + std::to_string(rank_), rank_hash));
  if (rank_ == 0) {
    Json rank_files = Json::array();
    for (int r = 0; r < ranks_; ++r) {
      std::string hash = rank_hash;
      if (r != 0) {
        const TimePoint deadline = store_->clock()->Now() + std::chrono::minutes(30);
        for (;;) {
          if (abandoned_.load(std::memory_order_acquire)) {
            // The group is gone, but the rank may have committed its file before it went.
            const std::string keys[1] = {key_prefix + std::to_string(r)};
            Result<bool> there = store_->Check(keys);
            if (!there.ok() || !*there) {
              return AbortedError("checkpoint " + step_dir + ": abandoned before rank " +
                                  std::to_string(r) + "'s file was committed");
            }
          }
          // In short waits, so that Abandon is noticed.
          Result<std::string> h = store_->Get(
              key_prefix + std::to_string(r),
              std::min(deadline, store_->clock()->Now() + std::chrono::milliseconds(200)));
          if (h.ok()) {
            hash = *h;
            break;
          }
          if (h.status().code() != ErrorCode::kDeadlineExceeded ||
              store_->clock()->Now() >= deadline) {
            return h.status();
          }
        }
      }
      rank_files.push_back({{"file", RankFileName(r)}, {"hash", hash}});
    }
    const Json manifest = {{"format", kManifestFormat},
                           {"step", info_.step},
                           {"loader_state", info_.loader_state},
                           {"plan", info_.plan},
                           {"model", info_.model},
                           {"ranks", ranks_},
                           {"compress", options_.compress},
                           {"chunk_bytes", options_.chunk_bytes},
                           {"created_unix", std::chrono::duration<double>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count()},
                           {"rank_files", std::move(rank_files)}};
    KC_RETURN_IF_ERROR(WriteFileDurably((root / step_dir / kManifest).string(), manifest.dump(1)));
    KC_RETURN_IF_ERROR(PruneCheckpoints(options_.dir, options_.keep));
  }
  stats_.persist_s = Since(t0);
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Reading.

Result<std::vector<CheckpointEntry>> ListCheckpoints(const std::string& dir) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const int64_t step = StepOf(e.path());
    if (step < 0 || !fs::exists(e.path() / kManifest)) continue;
    out.push_back({step, e.path().string()});
  }
  if (ec) return UnavailableError("checkpoint directory " + dir + ": " + ec.message());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  return out;
}

Result<Json> ReadManifest(const std::string& path) {
  const std::string file = (fs::path(path) / kManifest).string();
  Result<std::string> text = ReadWholeFile(file);
  if (!text.ok()) return DataLossError(text.status().message());
  Json j = Json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(file + ": not JSON (truncated or changed)");
  }
  if (j.value("format", "") != kManifestFormat || !j.contains("rank_files") ||
      !j.contains("step")) {
    return DataLossError(file + ": not a " + std::string(kManifestFormat) + " manifest");
  }
  return j;
}

Result<VerifyReport> VerifyCheckpoint(const std::string& path) {
  KC_ASSIGN_OR_RETURN(Json manifest, ReadManifest(path));
  VerifyReport report;
  const fs::path root = fs::path(path).parent_path();
  KC_ASSIGN_OR_RETURN(std::vector<Json> ranks, ReadRankFiles(path, manifest));
  report.ranks = static_cast<int>(ranks.size());
  std::vector<std::byte> buf;
  std::set<std::string> seen;
  for (const Json& rank : ranks) {
    for (const Json& piece : rank.at("pieces")) {
      ++report.pieces;
      int64_t bytes = 0;
      for (const Json& ref : piece.at("chunks")) {
        bytes += ref.at("bytes").get<int64_t>();
        if (!seen.insert(ref.at("file").get<std::string>()).second) continue;
        KC_RETURN_IF_ERROR(ReadChunk(root, ref, &buf, &report.stored_bytes));
        ++report.chunks;
        report.raw_bytes += static_cast<int64_t>(buf.size());
      }
      if (bytes != piece.at("count").get<int64_t>() * 4) {
        return DataLossError(RankFileName(rank.at("rank").get<int>()) + ": piece of " +
                             piece.at("tensor").get<std::string>() + " has " +
                             std::to_string(bytes) + " bytes of chunks for " +
                             std::to_string(piece.at("count").get<int64_t>()) + " values");
      }
    }
  }
  return report;
}

Result<CheckpointEntry> LatestGoodCheckpoint(const std::string& dir,
                                             std::vector<std::string>* skipped) {
  KC_ASSIGN_OR_RETURN(std::vector<CheckpointEntry> all, ListCheckpoints(dir));
  for (const CheckpointEntry& e : all) {
    Result<VerifyReport> r = VerifyCheckpoint(e.path);
    if (r.ok()) return e;
    if (skipped != nullptr) skipped->push_back(e.path + ": " + r.status().message());
  }
  return NotFoundError("no good checkpoint in " + dir +
                       (all.empty() ? "" : " (" + std::to_string(all.size()) + " corrupt)"));
}

Status RestoreTensors(const std::string& path, std::span<StateTensor> tensors) {
  KC_LAYER_ENTRY(Layer::kFault, "checkpoint");
  KC_ASSIGN_OR_RETURN(Json manifest, ReadManifest(path));
  KC_ASSIGN_OR_RETURN(std::vector<Json> ranks, ReadRankFiles(path, manifest));
  const fs::path root = fs::path(path).parent_path();
  std::multimap<std::pair<std::string, std::string>, const Json*> pieces;  // (tensor, kind)
  for (const Json& rank : ranks) {
    for (const Json& piece : rank.at("pieces")) {
      pieces.emplace(std::make_pair(piece.at("tensor").get<std::string>(),
                                    piece.at("kind").get<std::string>()),
                     &piece);
    }
  }
  std::vector<std::byte> buf;
  // The whole tensor `t.name` of `kind`, from its pieces.
  auto assemble = [&](const StateTensor& t, const std::string& kind,
                      std::vector<float>* whole) -> Status {
    const auto [first, last] = pieces.equal_range({t.name, kind});
    if (first == last) {
      return InvalidArgumentError(path + ": has no " + kind + " of tensor " + t.name);
    }
    whole->assign(static_cast<size_t>(Elements(t.shape)), 0.0f);
    // Shards by (tp_size, tp_rank, split): each filled from its ranges, then put in place.
    std::map<std::pair<int, int>, std::pair<std::vector<float>, int64_t>> shards;
    TpSplit split = TpSplit::kReplicated;
    int tp_size = 1;
    for (auto it = first; it != last; ++it) {
      const Json& p = *it->second;
      if (p.at("shape").get<std::vector<int64_t>>() != t.shape) {
        return InvalidArgumentError(path + ": tensor " + t.name + " has shape " +
                                    p.at("shape").dump() + " there, " + Json(t.shape).dump() +
                                    " in this model");
      }
      const std::string split_name = p.at("split").get<std::string>();
      for (TpSplit s : {TpSplit::kReplicated, TpSplit::kVocab, TpSplit::kRows, TpSplit::kQkvRows,
                        TpSplit::kColumns}) {
        if (parallel::TpSplitName(s) == split_name) split = s;
      }
      tp_size = p.at("tp_size").get<int>();
      const int tp_rank = p.at("tp_rank").get<int>();
      auto& [shard, filled] = shards[{tp_size, tp_rank}];
      const int64_t shard_n = Elements(parallel::ShardShape(t.shape, split, tp_size));
      shard.resize(static_cast<size_t>(shard_n));
      int64_t at = p.at("offset").get<int64_t>();
      for (const Json& ref : p.at("chunks")) {
        KC_RETURN_IF_ERROR(ReadChunk(root, ref, &buf));
        const int64_t n = static_cast<int64_t>(buf.size() / sizeof(float));
        if (at + n > shard_n) {
          return DataLossError(path + ": a piece of " + t.name + " runs past its shard");
        }
        std::memcpy(shard.data() + at, buf.data(), buf.size());
        at += n;
        filled += n;
      }
    }
    const int64_t shard_n = Elements(parallel::ShardShape(t.shape, split, tp_size));
    const int need = split == TpSplit::kReplicated ? 1 : tp_size;
    int complete = 0;
    for (auto& [key, value] : shards) {
      if (value.second != shard_n) continue;
      ++complete;
      parallel::InsertShard<float>(value.first, t.shape, split, key.second, key.first, *whole);
    }
    if (complete < need) {
      return DataLossError(path + ": the " + kind + " of tensor " + t.name + " is incomplete (" +
                           std::to_string(complete) + " of " + std::to_string(need) +
                           " shards whole)");
    }
    return OkStatus();
  };
  std::vector<float> whole, shard;
  for (StateTensor& t : tensors) {
    KC_RETURN_IF_ERROR(assemble(t, "param", &whole));
    parallel::ExtractShard<float>(whole, t.shape, t.split, t.tp_rank, t.tp_size, t.values);
    if (t.moments.empty()) continue;
    for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
      KC_RETURN_IF_ERROR(assemble(t, kind, &whole));
      shard.resize(t.values.size());
      parallel::ExtractShard<float>(whole, t.shape, t.split, t.tp_rank, t.tp_size, shard);
      for (StateTensor::Moments& m : t.moments) {
        std::span<float> to = std::string_view(kind) == "exp_avg" ? m.m : m.v;
        std::copy_n(shard.begin() + m.offset, to.size(), to.begin());
      }
    }
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Retention.

Status PruneCheckpoints(const std::string& dir, int keep) {
  KC_ASSIGN_OR_RETURN(std::vector<CheckpointEntry> committed, ListCheckpoints(dir));
  if (committed.empty()) return OkStatus();
  const int64_t newest = committed.front().step;
  std::set<std::string> kept_paths;
  std::set<std::string> referenced;  // chunk files, relative to dir
  for (size_t i = 0; i < committed.size(); ++i) {
    const CheckpointEntry& e = committed[i];
    if (static_cast<int>(i) < keep) {
      kept_paths.insert(fs::path(e.path).filename().string());
      Result<Json> manifest = ReadManifest(e.path);
      if (!manifest.ok()) continue;  // corrupt: nothing of it is worth keeping for it
      Result<std::vector<Json>> ranks = ReadRankFiles(e.path, *manifest);
      if (!ranks.ok()) continue;
      for (const Json& rank : *ranks) {
        for (const Json& piece : rank.at("pieces")) {
          for (const Json& ref : piece.at("chunks")) referenced.insert(ref.at("file"));
        }
      }
      continue;
    }
    // Past retention: no longer a checkpoint (the manifest goes first).
    std::error_code ec;
    fs::remove(fs::path(e.path) / kManifest, ec);
  }
  std::error_code ec;
  for (const fs::directory_entry& d : fs::directory_iterator(dir, ec)) {
    const int64_t step = StepOf(d.path());
    if (step < 0 || step > newest) continue;  // not ours, or in progress
    const std::string name = d.path().filename().string();
    const bool kept = kept_paths.count(name) > 0;
    std::error_code ec2;
    for (const fs::directory_entry& f : fs::directory_iterator(d.path() / "chunks", ec2)) {
      if (!referenced.count(name + "/chunks/" + f.path().filename().string())) {
        fs::remove(f.path(), ec2);
      }
    }
    if (kept) continue;
    for (const fs::directory_entry& f : fs::directory_iterator(d.path(), ec2)) {
      if (f.is_regular_file()) fs::remove(f.path(), ec2);
    }
    if (fs::is_empty(d.path() / "chunks", ec2)) fs::remove(d.path() / "chunks", ec2);
    fs::remove(d.path(), ec2);  // only when empty: chunks still referenced stay
  }
  if (ec) return UnavailableError("checkpoint directory " + dir + ": " + ec.message());
  return OkStatus();
}

}  // namespace kc::fault
