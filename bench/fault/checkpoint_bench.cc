// Checkpoint persistence against the disk, in one process: a training state of --mib MiB
// (values and two moments, in tensors of a GPT's sizes) is saved with the checkpoint writer,
// then saved again unchanged, then with one tensor changed; and the same bytes are written as
// one file with the same durable write (write, fsync, rename): the disk's sequential rate.
// Prints one JSON object.
//
//   kc_checkpoint_bench [--mib 128] [--dir DIR] [--compress]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "base/file.h"
#include "fault/checkpoint.h"

namespace {

using kc::parallel::StateTensor;
namespace fs = std::filesystem;

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 128;
  std::string dir = "kc_checkpoint_bench";
  bool compress = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) {
      mib = std::atoll(argv[++i]);
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--compress") {
      compress = true;
    } else {
      std::cerr << "usage: kc_checkpoint_bench [--mib N] [--dir DIR] [--compress]\n";
      return 2;
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  // Tensors of 1 MiB-ish values each, a third of the state: values, then two moments.
  const int64_t values = mib * (1 << 20) / 4 / 3;
  const int64_t per_tensor = 256 * 1024;
  std::vector<std::vector<float>> storage;
  std::vector<StateTensor> tensors;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int64_t left = values, i = 0; left > 0; left -= per_tensor, ++i) {
    const int64_t n = std::min(left, per_tensor);
    for (int k = 0; k < 3; ++k) {
      storage.emplace_back(static_cast<size_t>(n));
      for (float& x : storage.back()) x = normal(gen);
    }
  }
  for (size_t i = 0; i < storage.size(); i += 3) {
    StateTensor t;
    t.name = "h." + std::to_string(i / 3) + ".mlp.fc.weight";
    t.shape = {static_cast<int64_t>(storage[i].size())};
    t.values = storage[i];
    t.moments.push_back({0, storage[i + 1], storage[i + 2]});
    tensors.push_back(std::move(t));
  }
  auto writer = kc::fault::CheckpointWriter::Create(
      {.dir = dir + "/ckpt", .keep = 3, .compress = compress}, 0, 1, nullptr);
  if (!writer.ok()) {
    std::cerr << writer.status() << "\n";
    return 1;
  }
  nlohmann::json out = {{"state_mib", mib}, {"compress", compress}};
  auto save = [&](int64_t step, const char* name) -> bool {
    kc::Status s = (*writer)->Save(tensors, {}, {.step = step});
    if (s.ok()) s = (*writer)->Wait();
    if (!s.ok()) {
      std::cerr << name << ": " << s << "\n";
      return false;
    }
    const kc::fault::SaveStats st = (*writer)->last_stats();
    out[name] = {{"stall_s", st.stall_s},
                 {"persist_s", st.persist_s},
                 {"raw_bytes", st.raw_bytes},
                 {"bytes_written", st.bytes_written},
                 {"chunks_written", st.chunks_written},
                 {"chunks_reused", st.chunks_reused},
                 {"persist_mib_per_s",
                  static_cast<double>(st.raw_bytes) / (1 << 20) / std::max(st.persist_s, 1e-9)}};
    return true;
  };
  if (!save(1, "first")) return 1;
  if (!save(2, "unchanged")) return 1;
  storage[0][0] += 1.0f;  // one tensor's values
  if (!save(3, "one_tensor_changed")) return 1;
  // The disk: the same bytes as one file, written durably.
  std::vector<char> blob(static_cast<size_t>(values) * 3 * sizeof(float));
  for (size_t i = 0, at = 0; i < storage.size(); ++i) {
    std::memcpy(blob.data() + at, storage[i].data(), storage[i].size() * sizeof(float));
    at += storage[i].size() * sizeof(float);
  }
  const auto t0 = std::chrono::steady_clock::now();
  kc::Status s =
      kc::WriteFileDurably(dir + "/sequential.bin", std::string_view(blob.data(), blob.size()));
  const double disk_s = Since(t0);
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  out["disk_sequential_mib_per_s"] = static_cast<double>(blob.size()) / (1 << 20) / disk_s;
  out["persist_vs_disk"] = out["first"]["persist_mib_per_s"].get<double>() /
                           out["disk_sequential_mib_per_s"].get<double>();
  fs::remove_all(dir, ec);
  std::cout << out.dump(2) << "\n";
  return 0;
}
