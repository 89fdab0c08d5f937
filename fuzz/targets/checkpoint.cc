// Checkpoints (kc ckpt, kc train --resume, an agent's job resuming): the input is read as a
// manifest and as a rank file; then, as the rank file of a checkpoint whose manifest names it
// (with its hash, as its writer would), verified and restored into a model of two tensors of
// four values, with or without moments. Any answer but a crash, an exception or a read or
// write out of bounds will do.
#include "fault/checkpoint.h"

#include <array>

#include "fault/chunk_delta.h"
#include "fuzz/fuzz_support.h"

namespace {

namespace fs = std::filesystem;

std::span<const std::byte> Bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// One chunk of four zero floats, the file a seed's rank file can name, and the same chunk as
// a delta against it (HASH.xor.zst, whose reference names the first as its base).
const std::string& ChunkFile() {
  static const std::string name = [] {
    const std::string zeros(16, '\0');
    const std::string hash = kc::fault::ContentHash(Bytes(zeros));
    const std::string file = "step-00000001/chunks/" + hash + ".bin";
    kc::fuzz::WriteScratch("ckpt/" + file, zeros);
    const kc::Result<std::string> delta = kc::fault::EncodeDelta(Bytes(zeros), Bytes(zeros));
    if (delta.ok())
      kc::fuzz::WriteScratch("ckpt/step-00000001/chunks/" + hash + ".xor.zst", *delta);
    return file;
  }();
  return name;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = kc::fuzz::Text(data, size);
  kc::fault::ParseManifest(text, "MANIFEST.json").status().IgnoreError();
  kc::fault::ParseRankFile(text, "rank-00000.json").status().IgnoreError();

  ChunkFile();
  const std::string step = kc::fuzz::ScratchDir() + "/ckpt/step-00000001";
  kc::fuzz::WriteScratch("ckpt/step-00000001/rank-00000.json", text);
  const nlohmann::json manifest = {
      {"format", "kc-checkpoint/1"},
      {"step", 1},
      {"loader_state", ""},
      {"plan", nlohmann::json::object()},
      {"model", nlohmann::json::object()},
      {"ranks", 1},
      {"compress", false},
      {"chunk_bytes", 4096},
      {"created_unix", 0},
      {"rank_files",
       {{{"file", "rank-00000.json"}, {"hash", kc::fault::ContentHash(Bytes(text))}}}}};
  kc::fuzz::WriteScratch("ckpt/step-00000001/MANIFEST.json", manifest.dump());
  kc::fault::VerifyCheckpoint(step).status().IgnoreError();
  std::array<float, 4> w{}, b{}, m{}, v{};
  std::vector<kc::parallel::StateTensor> tensors(2);
  tensors[0] = {.name = "w", .shape = {2, 2}, .values = w};
  tensors[1] = {.name = "b", .shape = {4}, .values = b};
  tensors[1].moments.push_back({.offset = 0, .m = m, .v = v});
  kc::fault::RestoreTensors(step, tensors).IgnoreError();  // any answer will do
  return 0;
}
