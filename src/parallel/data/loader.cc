// DataLoader over token shards: window index, per-epoch permutation, rank split, state.
#include "parallel/data/loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>

#include "base/layer_guard.h"
#include "parallel/batch_share.h"
#include "parallel/data/token_shard.h"

namespace kc::parallel {
namespace {

constexpr std::string_view kStateTag = "kc-loader/1";

// SplitMix64 (Steele, Lea, Flood 2014): small, fast, and fully specified.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, range), without modulo bias. REQUIRES: range > 0.
  uint64_t Below(uint64_t range) {
    const uint64_t threshold = (0 - range) % range;
    for (;;) {
      const uint64_t r = Next();
      if (r >= threshold) return r % range;
    }
  }

 private:
  uint64_t state_;
};

uint64_t HashU64(uint64_t hash, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  return Fnv1a64(b, hash);
}

// G: sequences per step over all ranks.
int64_t GlobalBatch(const LoaderOptions& o) {
  return o.global_batch > 0 ? o.global_batch : o.batch * o.world_size;
}

// A window: tokens [start, start + seq_len + 1) of shard `shard`.
struct Window {
  uint32_t shard;
  uint64_t start;
};

class DataLoaderImpl final : public DataLoader {
 public:
  DataLoaderImpl(const LoaderOptions& options, int64_t first,
                 std::vector<std::vector<uint16_t>> shards, std::vector<Window> windows,
                 uint64_t fingerprint, uint32_t vocab_size, int64_t num_tokens)
      : seq_len_(options.seq_len),
        batch_(options.batch),
        first_(first),
        global_batch_(GlobalBatch(options)),
        seed_(options.seed),
        shards_(std::move(shards)),
        windows_(std::move(windows)),
        fingerprint_(fingerprint),
        vocab_size_(vocab_size),
        num_tokens_(num_tokens) {
    Shuffle(0);
  }

  void Next(Batch* batch) override {
    if (position_ + global_batch_ > static_cast<int64_t>(windows_.size())) {
      Shuffle(epoch_ + 1);
      position_ = 0;
    }
    const size_t T = static_cast<size_t>(seq_len_);
    batch->epoch = epoch_;
    batch->step = position_ / global_batch_;
    batch->inputs.resize(static_cast<size_t>(batch_) * T);
    batch->targets.resize(static_cast<size_t>(batch_) * T);
    // This rank's B windows: its share of the step's G permuted windows.
    const int64_t first = position_ + first_;
    for (int64_t b = 0; b < batch_; ++b) {
      const Window& w = windows_[permutation_[static_cast<size_t>(first + b)]];
      const uint16_t* tokens = shards_[w.shard].data() + w.start;
      int32_t* in = batch->inputs.data() + b * T;
      int32_t* tgt = batch->targets.data() + b * T;
      for (size_t t = 0; t < T; ++t) {
        in[t] = tokens[t];
        tgt[t] = tokens[t + 1];
      }
    }
    position_ += global_batch_;
  }

  LoaderState state() const override {
    return {.epoch = epoch_, .position = position_, .fingerprint = fingerprint_};
  }

  Status Restore(const LoaderState& state) override {
    if (state.fingerprint != fingerprint_) {
      return FailedPreconditionError(fmt::format(
          "loader state fingerprint {:016x} is not this loader's {:016x}: other data, seq_len "
          "or seed",
          state.fingerprint, fingerprint_));
    }
    const int64_t windows = static_cast<int64_t>(windows_.size());
    if (state.epoch < 0 || state.position < 0 || state.position > windows ||
        state.position % global_batch_ != 0) {
      return FailedPreconditionError(fmt::format(
          "loader state epoch={} position={} is not a step boundary of a global batch of {} "
          "windows in an epoch of {}",
          state.epoch, state.position, global_batch_, windows));
    }
    if (state.epoch != epoch_) Shuffle(state.epoch);
    position_ = state.position;
    return OkStatus();
  }

  int64_t steps_per_epoch() const override {
    return static_cast<int64_t>(windows_.size()) / global_batch_;
  }
  int64_t num_windows() const override { return static_cast<int64_t>(windows_.size()); }
  int64_t num_tokens() const override { return num_tokens_; }
  uint32_t vocab_size() const override { return vocab_size_; }

 private:
  void Shuffle(int64_t epoch) {
    epoch_ = epoch;
    permutation_ = DeterministicPermutation(
        windows_.size(),
        HashU64(HashU64(0xcbf29ce484222325ULL, seed_), static_cast<uint64_t>(epoch)));
  }

  // Immutable after construction.
  const int64_t seq_len_;
  const int64_t batch_;
  const int64_t first_;  // this rank's first window within a step's
  const int64_t global_batch_;
  const uint64_t seed_;
  const std::vector<std::vector<uint16_t>> shards_;
  const std::vector<Window> windows_;
  const uint64_t fingerprint_;
  const uint32_t vocab_size_;
  const int64_t num_tokens_;

  // Where the loader stands.
  int64_t epoch_ = 0;
  int64_t position_ = 0;
  std::vector<uint64_t> permutation_;  // of windows_, for epoch_
};

Status CheckOptions(const LoaderOptions& o) {
  if (o.manifest.empty() == o.files.empty()) {
    return InvalidArgumentError("loader: give either a manifest or shard files, not both or none");
  }
  if (!o.manifest.empty() && o.split != "train" && o.split != "val") {
    return InvalidArgumentError(
        fmt::format("loader: split: expected \"train\" or \"val\", got \"{}\"", o.split));
  }
  if (o.seq_len < 1) {
    return InvalidArgumentError(fmt::format("loader: seq_len: must be >= 1, got {}", o.seq_len));
  }
  if (o.batch < 1) {
    return InvalidArgumentError(fmt::format("loader: batch: must be >= 1, got {}", o.batch));
  }
  if (o.world_size < 1) {
    return InvalidArgumentError(
        fmt::format("loader: world_size: must be >= 1, got {}", o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgumentError(
        fmt::format("loader: rank: must be in 0..{}, got {}", o.world_size - 1, o.rank));
  }
  if (o.global_batch < 0) {
    return InvalidArgumentError(
        fmt::format("loader: global_batch: must be >= 0, got {}", o.global_batch));
  }
  return OkStatus();
}

}  // namespace

std::string LoaderState::Serialize() const {
  return fmt::format("{} epoch={} position={} fingerprint={:016x}", kStateTag, epoch, position,
                     fingerprint);
}

Result<LoaderState> LoaderState::Parse(std::string_view text) {
  auto bad = [&] {
    return InvalidArgumentError(
        fmt::format("not a loader state: \"{}\" (expected \"{} epoch=E position=P "
                    "fingerprint=HEX\")",
                    text.substr(0, 120), kStateTag));
  };
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  if (!text.starts_with(kStateTag)) return bad();
  text.remove_prefix(kStateTag.size());
  LoaderState s;
  struct Field {
    std::string_view key;
    int base;
    uint64_t value = 0;
  };
  Field fields[] = {{" epoch=", 10}, {" position=", 10}, {" fingerprint=", 16}};
  for (Field& f : fields) {
    if (!text.starts_with(f.key)) return bad();
    text.remove_prefix(f.key.size());
    const char* end = text.data() + std::min(text.size(), text.find(' '));
    auto [ptr, ec] = std::from_chars(text.data(), end, f.value, f.base);
    if (ec != std::errc() || ptr != end || ptr == text.data()) return bad();
    text.remove_prefix(static_cast<size_t>(ptr - text.data()));
  }
  if (!text.empty() || fields[0].value > INT64_MAX || fields[1].value > INT64_MAX) return bad();
  s.epoch = static_cast<int64_t>(fields[0].value);
  s.position = static_cast<int64_t>(fields[1].value);
  s.fingerprint = fields[2].value;
  return s;
}

std::vector<uint64_t> DeterministicPermutation(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = i;
  SplitMix64 rng(seed);
  for (uint64_t i = n; i > 1; --i) std::swap(p[i - 1], p[rng.Below(i)]);
  return p;
}

Result<std::unique_ptr<DataLoader>> OpenDataLoader(const LoaderOptions& options) {
  KC_LAYER_ENTRY(Layer::kParallel, "data");
  KC_RETURN_IF_ERROR(CheckOptions(options));
  int64_t first = static_cast<int64_t>(options.rank) * options.batch;
  if (options.global_batch > 0) {
    KC_ASSIGN_OR_RETURN(BatchShare share,
                        ShareOfBatch(options.global_batch, options.world_size, options.rank, 1, 1));
    if (share.sequences != options.batch) {
      return InvalidArgumentError(fmt::format(
          "loader: batch {} is not rank {}'s share of a global batch of {} over {} ranks ({})",
          options.batch, options.rank, options.global_batch, options.world_size, share.sequences));
    }
    first = share.offset;
  }
  // The shard files, and the token counts the manifest promises for them.
  std::vector<std::string> paths = options.files;
  std::vector<int64_t> expected_tokens(paths.size(), -1);
  std::string source = "the shard files";
  if (!options.manifest.empty()) {
    KC_ASSIGN_OR_RETURN(TokenManifest m, ReadTokenManifest(options.manifest));
    const std::vector<ManifestShard>& list = options.split == "train" ? m.train : m.val;
    if (list.empty()) {
      return InvalidArgumentError(fmt::format("{}: no {} shards", options.manifest, options.split));
    }
    const std::filesystem::path dir = std::filesystem::path(options.manifest).parent_path();
    for (const ManifestShard& s : list) {
      paths.push_back((dir / s.file).string());
      expected_tokens.push_back(static_cast<int64_t>(s.tokens));
    }
    source = fmt::format("the {} split of {}", options.split, options.manifest);
  }

  std::vector<std::vector<uint16_t>> shards;
  std::vector<Window> windows;
  uint64_t fingerprint =
      HashU64(HashU64(0xcbf29ce484222325ULL, options.seed), static_cast<uint64_t>(options.seq_len));
  uint32_t vocab_size = 0;
  int64_t num_tokens = 0;
  uint64_t longest = 0;
  std::string longest_path;
  const uint64_t T = static_cast<uint64_t>(options.seq_len);
  for (size_t i = 0; i < paths.size(); ++i) {
    KC_ASSIGN_OR_RETURN(TokenShard shard, ReadTokenShard(paths[i]));
    const TokenShardHeader& h = shard.header;
    if (expected_tokens[i] >= 0 && static_cast<uint64_t>(expected_tokens[i]) != h.token_count) {
      return DataLossError(fmt::format("{}: holds {} tokens but {} lists {}", paths[i],
                                       h.token_count, options.manifest, expected_tokens[i]));
    }
    if (i == 0) vocab_size = h.vocab_size;
    if (h.vocab_size != vocab_size) {
      return DataLossError(fmt::format("{}: vocab size {} differs from {} in {}", paths[i],
                                       h.vocab_size, vocab_size, paths[0]));
    }
    fingerprint = HashU64(HashU64(fingerprint, h.token_count), h.payload_checksum);
    if (h.token_count > longest || longest_path.empty()) {
      longest = h.token_count;
      longest_path = paths[i];
    }
    num_tokens += static_cast<int64_t>(h.token_count);
    // Windows start every T tokens and need T + 1.
    const uint64_t count = h.token_count > T ? (h.token_count - 1) / T : 0;
    for (uint64_t k = 0; k < count; ++k) {
      windows.push_back({static_cast<uint32_t>(shards.size()), k * T});
    }
    shards.push_back(std::move(shard.tokens));
  }
  if (windows.empty()) {
    return InvalidArgumentError(fmt::format(
        "seq_len {} is longer than the data: a sequence needs {} tokens, and the longest shard "
        "in {} ({}) has {}",
        options.seq_len, T + 1, source, longest_path, longest));
  }
  const int64_t global_batch = GlobalBatch(options);
  if (static_cast<int64_t>(windows.size()) < global_batch) {
    return InvalidArgumentError(
        options.global_batch > 0
            ? fmt::format("{} holds {} sequences of seq_len {}, fewer than one global batch of {}",
                          source, windows.size(), options.seq_len, global_batch)
            : fmt::format("{} holds {} sequences of seq_len {}, fewer than one global batch of {} "
                          "(batch {} x world_size {})",
                          source, windows.size(), options.seq_len, global_batch, options.batch,
                          options.world_size));
  }
  return std::unique_ptr<DataLoader>(new DataLoaderImpl(
      options, first, std::move(shards), std::move(windows), fingerprint, vocab_size, num_tokens));
}

}  // namespace kc::parallel
