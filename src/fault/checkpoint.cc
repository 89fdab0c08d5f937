#include "fault/checkpoint.h"

#include <fmt/format.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <climits>
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
#include "fault/chunk_delta.h"
#include "parallel/tensor_parallel.h"

namespace kc::fault {
namespace fs = std::filesystem;
using Json = nlohmann::json;
using parallel::StateTensor;
using parallel::TpSplit;

namespace {

constexpr char kManifestFormat[] = "kc-checkpoint/1";
// Version 2 added delta chunks (a reference's "base"); version 1 files read the same.
constexpr char kRankFormat[] = "kc-checkpoint-rank/2";
constexpr char kRankFormatV1[] = "kc-checkpoint-rank/1";
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
  if (name.size() <= 5 || name.size() > 5 + 18 || name.compare(0, 5, "step-") != 0) return -1;
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

// Typed reads of a checkpoint's JSON, each naming FILE and the key's path in its error.
class JsonFields {
 public:
  explicit JsonFields(const std::string& file) : file_(file) {}

  Status Bad(std::string_view path, std::string_view what) const {
    return DataLossError(fmt::format("{}: {}: {}", file_, path, what));
  }
  Result<const Json*> Member(const Json& obj, std::string_view key, std::string_view path) const {
    if (!obj.is_object()) return Bad(path, "expected an object");
    auto it = obj.find(key);
    if (it == obj.end()) return Bad(Join(path, key), "missing");
    return &*it;
  }
  Result<int64_t> Int(const Json& obj, std::string_view key, std::string_view path, int64_t lo,
                      int64_t hi) const {
    KC_ASSIGN_OR_RETURN(const Json* v, Member(obj, key, path));
    if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX) ||
        v->get<int64_t>() < lo || v->get<int64_t>() > hi) {
      return Bad(Join(path, key),
                 fmt::format("expected an integer in [{}, {}], got {}", lo, hi, Shown(*v)));
    }
    return v->get<int64_t>();
  }
  Result<std::string> String(const Json& obj, std::string_view key, std::string_view path) const {
    KC_ASSIGN_OR_RETURN(const Json* v, Member(obj, key, path));
    if (!v->is_string()) return Bad(Join(path, key), "expected a string, got " + Shown(*v));
    return v->get<std::string>();
  }
  // A string that `ok` accepts, `what` saying what it must be.
  Result<std::string> String(const Json& obj, std::string_view key, std::string_view path,
                             bool (*ok)(std::string_view), std::string_view what) const {
    KC_ASSIGN_OR_RETURN(std::string v, String(obj, key, path));
    if (!ok(v)) return Bad(Join(path, key), fmt::format("expected {}, got {}", what, Shown(v)));
    return v;
  }
  Result<const Json*> Array(const Json& obj, std::string_view key, std::string_view path) const {
    KC_ASSIGN_OR_RETURN(const Json* v, Member(obj, key, path));
    if (!v->is_array()) return Bad(Join(path, key), "expected a list, got " + Shown(*v));
    return v;
  }
  static std::string Join(std::string_view path, std::string_view key) {
    return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
  }
  static std::string Element(std::string_view path, size_t i) {
    return fmt::format("{}[{}]", path, i);
  }

 private:
  static std::string Shown(const Json& v) {
    std::string text = v.dump(-1, ' ', true, Json::error_handler_t::replace);
    return text.size() > 40 ? text.substr(0, 40) + "..." : text;
  }
  const std::string& file_;  // the caller's, which outlives this
};

bool IsHexDigits(std::string_view s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}
bool IsContentHash(std::string_view s) { return IsHexDigits(s, 32); }
bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}
// rank-NNNNN.json, as RankFileName writes it.
bool IsRankFileName(std::string_view s) {
  return s.starts_with("rank-") && s.ends_with(".json") && s.size() > 10 &&
         IsDigits(s.substr(5, s.size() - 10));
}
// step-N/chunks/HASH.bin, .zst or .xor.zst: a chunk under the checkpoint directory, never
// outside it.
bool IsChunkFileName(std::string_view s) {
  const size_t slash = s.find('/');
  if (slash == std::string_view::npos || !s.starts_with("step-") ||
      !IsDigits(s.substr(5, slash - 5))) {
    return false;
  }
  std::string_view rest = s.substr(slash + 1);
  if (!rest.starts_with("chunks/")) return false;
  rest.remove_prefix(7);
  if (rest.ends_with(".xor.zst")) return IsContentHash(rest.substr(0, rest.size() - 8));
  return (rest.ends_with(".bin") || rest.ends_with(".zst")) &&
         IsContentHash(rest.substr(0, rest.size() - 4));
}
bool IsKind(std::string_view s) { return s == "param" || s == "exp_avg" || s == "exp_avg_sq"; }
bool IsNonEmpty(std::string_view s) { return !s.empty(); }

constexpr int64_t kMaxRanks = 1 << 20;
constexpr int64_t kMaxElements = int64_t{1} << 40;

// `text` as a JSON object whose "format" is `format` (`what` names the kind of file).
// `text` as a JSON object whose "format" is `format`, or `also` where given (an older version
// read the same).
Result<Json> ParseJson(std::string_view text, const std::string& file, std::string_view format,
                       std::string_view what, std::string_view also = {}) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(file + ": not a JSON object (truncated or changed)");
  }
  const Json f = j.value("format", Json());
  if (f != format && (also.empty() || f != also)) {
    return DataLossError(fmt::format("{}: not a {} {}", file, format, what));
  }
  return j;
}

// A chunk reference at `at`, and its bases (`depth` deep already).
Result<ChunkRef> ParseChunkRef(const JsonFields& f, const Json& c, const std::string& at,
                               int depth) {
  ChunkRef ref;
  KC_ASSIGN_OR_RETURN(ref.file, f.String(c, "file", at, IsChunkFileName,
                                         "STEP-DIR/chunks/HASH.bin, .zst or .xor.zst"));
  KC_ASSIGN_OR_RETURN(ref.hash, f.String(c, "hash", at, IsContentHash, "32 hex digits"));
  KC_ASSIGN_OR_RETURN(ref.bytes, f.Int(c, "bytes", at, 0, kMaxChunkBytes));
  if (ref.bytes % 4 != 0) {
    return f.Bad(JsonFields::Join(at, "bytes"), "expected a multiple of 4 (whole values)");
  }
  const bool delta = ref.file.ends_with(".xor.zst");
  auto base = c.find("base");
  if (!delta) {
    if (base != c.end()) return f.Bad(JsonFields::Join(at, "base"), "only a delta has a base");
    return ref;
  }
  if (base == c.end()) return f.Bad(JsonFields::Join(at, "base"), "missing (the file is a delta)");
  const std::string base_at = JsonFields::Join(at, "base");
  if (depth + 1 >= kMaxDeltaChain) {
    return f.Bad(base_at, fmt::format("more than {} bases deep", kMaxDeltaChain));
  }
  KC_ASSIGN_OR_RETURN(ChunkRef b, ParseChunkRef(f, *base, base_at, depth + 1));
  if (b.bytes != ref.bytes) {
    return f.Bad(JsonFields::Join(base_at, "bytes"),
                 fmt::format("expected the delta's {} bytes, got {}", ref.bytes, b.bytes));
  }
  ref.base.push_back(std::move(b));
  return ref;
}

Result<PieceIndex> ParsePiece(const JsonFields& f, const Json& p, const std::string& at) {
  PieceIndex piece;
  KC_ASSIGN_OR_RETURN(piece.tensor, f.String(p, "tensor", at, IsNonEmpty, "a tensor's name"));
  KC_ASSIGN_OR_RETURN(piece.kind,
                      f.String(p, "kind", at, IsKind, "\"param\", \"exp_avg\" or \"exp_avg_sq\""));
  KC_ASSIGN_OR_RETURN(const Json* shape, f.Array(p, "shape", at));
  int64_t elements = 1;
  for (size_t i = 0; i < shape->size(); ++i) {
    const Json& d = (*shape)[i];
    const std::string dim = JsonFields::Element(JsonFields::Join(at, "shape"), i);
    if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > kMaxElements ||
        (d.get<int64_t>() > 0 && elements > kMaxElements / d.get<int64_t>())) {
      return f.Bad(dim,
                   fmt::format("expected a dimension, the tensor at most {} values", kMaxElements));
    }
    piece.shape.push_back(d.get<int64_t>());
    elements *= d.get<int64_t>();
  }
  KC_ASSIGN_OR_RETURN(const std::string split, f.String(p, "split", at));
  bool known = false;
  for (TpSplit s : {TpSplit::kReplicated, TpSplit::kVocab, TpSplit::kRows, TpSplit::kQkvRows,
                    TpSplit::kColumns}) {
    if (parallel::TpSplitName(s) == split) {
      piece.split = s;
      known = true;
    }
  }
  if (!known) return f.Bad(JsonFields::Join(at, "split"), "expected a tensor-parallel split");
  KC_ASSIGN_OR_RETURN(const int64_t tp_size, f.Int(p, "tp_size", at, 1, 4096));
  KC_ASSIGN_OR_RETURN(const int64_t tp_rank, f.Int(p, "tp_rank", at, 0, tp_size - 1));
  piece.tp_size = static_cast<int>(tp_size);
  piece.tp_rank = static_cast<int>(tp_rank);
  KC_ASSIGN_OR_RETURN(piece.offset, f.Int(p, "offset", at, 0, kMaxElements));
  KC_ASSIGN_OR_RETURN(piece.count, f.Int(p, "count", at, 0, kMaxElements));
  KC_ASSIGN_OR_RETURN(const Json* chunks, f.Array(p, "chunks", at));
  for (size_t i = 0; i < chunks->size(); ++i) {
    const std::string c = JsonFields::Element(JsonFields::Join(at, "chunks"), i);
    KC_ASSIGN_OR_RETURN(ChunkRef ref, ParseChunkRef(f, (*chunks)[i], c, 0));
    piece.chunks.push_back(std::move(ref));
  }
  return piece;
}

// What a checkpoint's chunks take on disk: each file counted once.
struct StoredTally {
  std::set<std::string> files;
  int64_t bytes = 0;
};

// Reads chunk `ref` under `dir`, decompressed (a delta: decoded against its base, read first),
// and checks its hash.
Status ReadChunk(const fs::path& dir, const ChunkRef& ref, std::vector<std::byte>* out,
                 StoredTally* tally = nullptr) {
  Result<std::string> data = ReadWholeFile((dir / ref.file).string());
  if (!data.ok()) return DataLossError("chunk " + ref.file + ": " + data.status().message());
  if (tally != nullptr && tally->files.insert(ref.file).second) {
    tally->bytes += static_cast<int64_t>(data->size());
  }
  if (!ref.base.empty()) {
    std::vector<std::byte> base;
    Status st = ReadChunk(dir, ref.base.front(), &base, tally);
    if (!st.ok()) {
      return DataLossError("chunk " + ref.file + ": its base: " + std::string(st.message()));
    }
    st = DecodeDelta(*data, base, out);
    if (!st.ok()) return DataLossError("chunk " + ref.file + ": " + std::string(st.message()));
  } else if (ref.file.ends_with(".zst")) {
    // The frame says how big it is: nothing is allocated for a size the chunk does not have.
    const unsigned long long size = ZSTD_getFrameContentSize(data->data(), data->size());
    if (size != static_cast<unsigned long long>(ref.bytes)) {
      return DataLossError("chunk " + ref.file + ": does not decompress to its " +
                           std::to_string(ref.bytes) + " bytes");
    }
    out->resize(static_cast<size_t>(ref.bytes));
    const size_t n = ZSTD_decompress(out->data(), out->size(), data->data(), data->size());
    if (ZSTD_isError(n) || static_cast<int64_t>(n) != ref.bytes) {
      return DataLossError("chunk " + ref.file + ": does not decompress to its " +
                           std::to_string(ref.bytes) + " bytes (" +
                           (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size") + ")");
    }
  } else {
    if (static_cast<int64_t>(data->size()) != ref.bytes) {
      return DataLossError("chunk " + ref.file + ": " + std::to_string(data->size()) +
                           " bytes, expected " + std::to_string(ref.bytes) + " (truncated?)");
    }
    out->resize(static_cast<size_t>(ref.bytes));
    std::copy_n(reinterpret_cast<const std::byte*>(data->data()), data->size(), out->data());
  }
  if (ContentHash(*out) != ref.hash) {
    return DataLossError("chunk " + ref.file + ": checksum mismatch (its content changed)");
  }
  return OkStatus();
}

// A rank file of the checkpoint at `path`, checked against the manifest's hash.
Result<RankIndex> ReadRankFile(const fs::path& path, const Manifest::RankFile& entry) {
  Result<std::string> text = ReadWholeFile((path / entry.file).string());
  if (!text.ok()) return DataLossError(entry.file + ": " + text.status().message());
  if (ContentHash(Bytes(*text)) != entry.hash) {
    return DataLossError(entry.file +
                         ": checksum mismatch against the manifest (changed or truncated)");
  }
  return ParseRankFile(*text, entry.file);
}

// Every rank file of the checkpoint at `path`, verified.
Result<std::vector<RankIndex>> ReadRankFiles(const fs::path& path, const Manifest& manifest) {
  std::vector<RankIndex> out;
  for (const Manifest::RankFile& entry : manifest.rank_files) {
    KC_ASSIGN_OR_RETURN(RankIndex r, ReadRankFile(path, entry));
    out.push_back(std::move(r));
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
  if (options.full_every < 1) {
    return InvalidArgumentError("checkpoint full_every " + std::to_string(options.full_every) +
                                ": must be at least 1 (1: every save full)");
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
  const size_t total = ListPieces(tensors, owner);
  snapshot_.assign(total, 0.0f);
  base_.assign(total, 0.0f);  // the second save copies into it (the first's becomes the base)
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

const std::vector<ChunkRef>* CheckpointWriter::BaseRefs(size_t piece) const {
  if (piece >= base_refs_.size() || base_pieces_.size() != pieces_.size()) return nullptr;
  const Piece& a = pieces_[piece];
  const Piece& b = base_pieces_[piece];
  const bool same = a.tensor == b.tensor && a.kind == b.kind && a.tp_rank == b.tp_rank &&
                    a.tp_size == b.tp_size && a.offset == b.offset && a.count == b.count;
  return same ? &base_refs_[piece] : nullptr;
}

namespace {

Json ChunkRefJson(const ChunkRef& ref) {
  Json j = {{"file", ref.file}, {"hash", ref.hash}, {"bytes", ref.bytes}};
  if (!ref.base.empty()) j["base"] = ChunkRefJson(ref.base.front());
  return j;
}

}  // namespace

Status CheckpointWriter::Persist() {
  if (options_.on_persist) options_.on_persist(info_.step);
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path root = options_.dir;
  const std::string step_dir = StepDirName(info_.step);
  // Deltas against the previous save, unless this save is due to be a full one.
  const bool delta = !base_refs_.empty() && base_depth_ + 1 < options_.full_every;
  std::unordered_map<std::string, ChunkRef> written;   // hash -> reference, this checkpoint
  std::unordered_map<std::string, ChunkRef> previous;  // hash -> reference, the previous one
  for (const std::vector<ChunkRef>& refs : base_refs_) {
    // A full save references no delta: a chain is never longer than the saves since a full one.
    for (const ChunkRef& r : refs) {
      if (delta || r.base.empty()) previous.emplace(r.hash, r);
    }
  }
  std::vector<std::vector<ChunkRef>> refs_now(pieces_.size());
  std::vector<char> compressed;
  std::vector<std::string> fresh;  // chunk files written now
  Json pieces = Json::array();
  for (size_t pi = 0; pi < pieces_.size(); ++pi) {
    const Piece& p = pieces_[pi];
    const std::vector<ChunkRef>* bases = delta ? BaseRefs(pi) : nullptr;
    Json chunks = Json::array();
    const auto* base = reinterpret_cast<const std::byte*>(snapshot_.data() + p.at);
    const int64_t bytes = p.count * static_cast<int64_t>(sizeof(float));
    size_t ci = 0;
    for (int64_t off = 0; off < bytes; off += options_.chunk_bytes, ++ci) {
      const std::span<const std::byte> data(
          base + off, static_cast<size_t>(std::min(options_.chunk_bytes, bytes - off)));
      const std::string hash = ContentHash(data);
      ChunkRef ref;
      if (auto it = written.find(hash); it != written.end()) {
        ref = it->second;
        ++stats_.chunks_reused;
      } else if (auto prev = previous.find(hash); prev != previous.end()) {
        ref = prev->second;
        ++stats_.chunks_reused;
      } else {
        ref = {.hash = hash, .bytes = static_cast<int64_t>(data.size())};
        std::span<const std::byte> out = data;
        std::string encoded;
        if (bases != nullptr && ci < bases->size() && (*bases)[ci].bytes == ref.bytes) {
          const auto* was =
              reinterpret_cast<const std::byte*>(base_.data() + base_pieces_[pi].at) + off;
          KC_ASSIGN_OR_RETURN(encoded, EncodeDelta(data, std::span(was, data.size())));
          if (encoded.size() < data.size()) {  // else a whole chunk is smaller
            ref.file = step_dir + "/chunks/" + hash + ".xor.zst";
            ref.base.push_back((*bases)[ci]);
            out = std::as_bytes(std::span<const char>(encoded));
            ++stats_.chunks_delta;
          }
        }
        if (ref.file.empty()) {
          ref.file = step_dir + "/chunks/" + hash + (options_.compress ? ".zst" : ".bin");
          if (options_.compress) {
            compressed.resize(ZSTD_compressBound(data.size()));
            const size_t n =
                ZSTD_compress(compressed.data(), compressed.size(), data.data(), data.size(), 1);
            if (ZSTD_isError(n)) {
              return InternalError(std::string("zstd: ") + ZSTD_getErrorName(n));
            }
            out = std::as_bytes(std::span<const char>(compressed.data(), n));
          }
        }
        // Synced all together below, before the rank file that names them.
        fresh.push_back((root / ref.file).string());
        KC_RETURN_IF_ERROR(WriteFileAtomically(fresh.back(), out));
        ++stats_.chunks_written;
        stats_.bytes_written += static_cast<int64_t>(out.size());
      }
      written.emplace(hash, ref);
      chunks.push_back(ChunkRefJson(ref));
      refs_now[pi].push_back(std::move(ref));
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
  // This save is durable: the next one is encoded against it. (snapshot_ is rewritten whole
  // by the next Save.)
  base_.swap(snapshot_);
  base_pieces_ = pieces_;
  base_refs_ = std::move(refs_now);
  base_depth_ = delta ? base_depth_ + 1 : 0;

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

Result<Manifest> ParseManifest(std::string_view text, const std::string& file) {
  KC_ASSIGN_OR_RETURN(const Json j, ParseJson(text, file, kManifestFormat, "manifest"));
  const JsonFields f(file);
  Manifest m;
  KC_ASSIGN_OR_RETURN(m.step, f.Int(j, "step", "", 0, INT64_MAX / 2));
  KC_ASSIGN_OR_RETURN(m.loader_state, f.String(j, "loader_state", ""));
  for (auto [key, out] : {std::pair{"plan", &m.plan}, {"model", &m.model}}) {
    KC_ASSIGN_OR_RETURN(const Json* v, f.Member(j, key, ""));
    if (!v->is_object()) return f.Bad(key, "expected an object");
    *out = *v;
  }
  KC_ASSIGN_OR_RETURN(const int64_t ranks, f.Int(j, "ranks", "", 1, kMaxRanks));
  m.ranks = static_cast<int>(ranks);
  KC_ASSIGN_OR_RETURN(const Json* compress, f.Member(j, "compress", ""));
  if (!compress->is_boolean()) return f.Bad("compress", "expected true or false");
  m.compress = compress->get<bool>();
  KC_ASSIGN_OR_RETURN(m.chunk_bytes, f.Int(j, "chunk_bytes", "", 4, kMaxChunkBytes));
  KC_ASSIGN_OR_RETURN(const Json* created, f.Member(j, "created_unix", ""));
  if (!created->is_number() || !(created->get<double>() >= 0 && created->get<double>() < 1e12)) {
    return f.Bad("created_unix", "expected seconds since the Unix epoch");
  }
  m.created_unix = created->get<double>();
  KC_ASSIGN_OR_RETURN(const Json* rank_files, f.Array(j, "rank_files", ""));
  if (rank_files->empty() || static_cast<int64_t>(rank_files->size()) > kMaxRanks) {
    return f.Bad("rank_files", "expected one file per rank");
  }
  for (size_t i = 0; i < rank_files->size(); ++i) {
    const std::string at = JsonFields::Element("rank_files", i);
    Manifest::RankFile r;
    KC_ASSIGN_OR_RETURN(r.file,
                        f.String((*rank_files)[i], "file", at, IsRankFileName, "rank-N.json"));
    KC_ASSIGN_OR_RETURN(r.hash,
                        f.String((*rank_files)[i], "hash", at, IsContentHash, "32 hex digits"));
    m.rank_files.push_back(std::move(r));
  }
  return m;
}

Result<RankIndex> ParseRankFile(std::string_view text, const std::string& file) {
  KC_ASSIGN_OR_RETURN(const Json j, ParseJson(text, file, kRankFormat, "file", kRankFormatV1));
  const JsonFields f(file);
  RankIndex r;
  KC_ASSIGN_OR_RETURN(const int64_t rank, f.Int(j, "rank", "", 0, kMaxRanks - 1));
  r.rank = static_cast<int>(rank);
  KC_ASSIGN_OR_RETURN(const Json* pieces, f.Array(j, "pieces", ""));
  for (size_t i = 0; i < pieces->size(); ++i) {
    KC_ASSIGN_OR_RETURN(PieceIndex p,
                        ParsePiece(f, (*pieces)[i], JsonFields::Element("pieces", i)));
    r.pieces.push_back(std::move(p));
  }
  return r;
}

Result<Manifest> ReadManifest(const std::string& path) {
  const std::string file = (fs::path(path) / kManifest).string();
  Result<std::string> text = ReadWholeFile(file);
  if (!text.ok()) return DataLossError(text.status().message());
  return ParseManifest(*text, file);
}

Result<VerifyReport> VerifyCheckpoint(const std::string& path) {
  KC_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(path));
  VerifyReport report;
  const fs::path root = fs::path(path).parent_path();
  KC_ASSIGN_OR_RETURN(std::vector<RankIndex> ranks, ReadRankFiles(path, manifest));
  report.ranks = static_cast<int>(ranks.size());
  std::vector<std::byte> buf;
  std::set<std::string> seen;
  StoredTally stored;
  for (const RankIndex& rank : ranks) {
    for (const PieceIndex& piece : rank.pieces) {
      ++report.pieces;
      int64_t bytes = 0;
      for (const ChunkRef& ref : piece.chunks) {
        bytes += ref.bytes;
        if (!seen.insert(ref.file).second) continue;
        KC_RETURN_IF_ERROR(ReadChunk(root, ref, &buf, &stored));
        ++report.chunks;
        report.raw_bytes += static_cast<int64_t>(buf.size());
      }
      if (bytes != piece.count * 4) {
        return DataLossError(RankFileName(rank.rank) + ": piece of " + piece.tensor + " has " +
                             std::to_string(bytes) + " bytes of chunks for " +
                             std::to_string(piece.count) + " values");
      }
    }
  }
  report.stored_bytes = stored.bytes;
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
  KC_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(path));
  KC_ASSIGN_OR_RETURN(std::vector<RankIndex> ranks, ReadRankFiles(path, manifest));
  const fs::path root = fs::path(path).parent_path();
  std::multimap<std::pair<std::string, std::string>, const PieceIndex*> pieces;  // tensor, kind
  for (const RankIndex& rank : ranks) {
    for (const PieceIndex& piece : rank.pieces) {
      pieces.emplace(std::make_pair(piece.tensor, piece.kind), &piece);
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
    // Every piece of it was cut one way: one split, one tensor-parallel size.
    std::map<std::pair<int, int>, std::pair<std::vector<float>, int64_t>> shards;
    const TpSplit split = first->second->split;
    const int tp_size = first->second->tp_size;
    const int64_t shard_n = Elements(parallel::ShardShape(t.shape, split, tp_size));
    for (auto it = first; it != last; ++it) {
      const PieceIndex& p = *it->second;
      if (p.shape != t.shape) {
        return InvalidArgumentError(path + ": tensor " + t.name + " has shape " +
                                    Json(p.shape).dump() + " there, " + Json(t.shape).dump() +
                                    " in this model");
      }
      if (p.split != split || p.tp_size != tp_size) {
        return DataLossError(path + ": the pieces of " + t.name + " disagree on how it was split");
      }
      auto& [shard, filled] = shards[{tp_size, p.tp_rank}];
      shard.resize(static_cast<size_t>(shard_n));
      int64_t at = p.offset;
      for (const ChunkRef& ref : p.chunks) {
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

void AddChunkFiles(const ChunkRef& ref, std::set<std::string>* files) {
  for (const ChunkRef* r = &ref; r != nullptr; r = r->base.empty() ? nullptr : &r->base.front()) {
    files->insert(r->file);
  }
}

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
      Result<Manifest> manifest = ReadManifest(e.path);
      if (!manifest.ok()) continue;  // corrupt: nothing of it is worth keeping for it
      Result<std::vector<RankIndex>> ranks = ReadRankFiles(e.path, *manifest);
      if (!ranks.ok()) continue;
      for (const RankIndex& rank : *ranks) {
        for (const PieceIndex& piece : rank.pieces) {
          for (const ChunkRef& ref : piece.chunks) AddChunkFiles(ref, &referenced);
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
