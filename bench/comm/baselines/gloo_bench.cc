// Gloo baseline for `kc bench comm`: N forked ranks on loopback TCP (gloo::transport::tcp,
// rendezvous through a gloo FileStore in a temp dir) time Gloo's collectives the way
// nccl-tests does and rank 0 prints one JSON line per (algorithm, size).
// Built by bench/comm/compare.py with `c++ ... -lgloo`, never by the product's CMake.
//
// Usage: gloo_bench --ranks 2 --op allreduce --sizes 4K,1M,64M --iters 20 --warmup 5
//            [--algos ring,ring_chunked,halving_doubling,bcube,new_ring,new_bcube]
//            [--budget-s 10] [--timeout-s 300]
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/allreduce_bcube.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier_all_to_all.h"
#include "gloo/broadcast.h"
#include "gloo/config.h"
#include "gloo/math.h"
#include "gloo/reduce.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

namespace {

// Every allreduce algorithm this Gloo (Debian 0.0~git20220518, GLOO_VERSION 0.5.0) ships.
// "ring".."bcube" are the class-based algorithms (construct once, run() per iteration);
// "new_ring"/"new_bcube" are gloo::allreduce() with AllreduceOptions::setAlgorithm.
const std::vector<std::string> kAllreduceAlgos = {"ring",  "ring_chunked", "halving_doubling",
                                                  "bcube", "new_ring",     "new_bcube"};

struct Options {
  int ranks = 2;
  std::string op = "allreduce";
  std::vector<int64_t> sizes_bytes = {4096, 1 << 20, 64 << 20};
  int iters = 20;
  int warmup = 5;
  std::vector<std::string> algos;  // Empty: all for the op.
  std::string host = "127.0.0.1";
  int timeout_s = 300;
  double budget_s = 10;  // Per (algorithm, size) for warmup + timed iterations.
};

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "gloo_bench FATAL: %s\n", why.c_str());
  std::fflush(stderr);
  std::_Exit(2);
}

int64_t ParseSize(std::string_view s) {
  if (s.empty()) Die("empty size");
  int64_t mult = 1;
  char last = s.back();
  if (last == 'K' || last == 'k') mult = int64_t{1} << 10;
  if (last == 'M' || last == 'm') mult = int64_t{1} << 20;
  if (last == 'G' || last == 'g') mult = int64_t{1} << 30;
  if (mult != 1) s.remove_suffix(1);
  std::string digits(s);
  char* end = nullptr;
  long long v = std::strtoll(digits.c_str(), &end, 10);
  if (end == digits.c_str() || *end != '\0' || v < 0) Die("bad size: " + digits);
  return v * mult;
}

std::vector<std::string> Split(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    if (comma > start) out.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value for " + a);
      return argv[++i];
    };
    if (a == "--ranks")
      o.ranks = std::atoi(value().c_str());
    else if (a == "--op")
      o.op = value();
    else if (a == "--sizes") {
      o.sizes_bytes.clear();
      for (const auto& s : Split(value())) o.sizes_bytes.push_back(ParseSize(s));
    } else if (a == "--iters")
      o.iters = std::atoi(value().c_str());
    else if (a == "--warmup")
      o.warmup = std::atoi(value().c_str());
    else if (a == "--algos")
      o.algos = Split(value());
    else if (a == "--host")
      o.host = value();
    else if (a == "--budget-s")
      o.budget_s = std::atof(value().c_str());
    else if (a == "--timeout-s")
      o.timeout_s = std::atoi(value().c_str());
    else
      Die("unknown argument: " + a);
  }
  if (o.ranks < 1) Die("--ranks must be >= 1");
  if (o.iters < 1 || o.warmup < 0) Die("--iters must be >= 1 and --warmup >= 0");
  if (o.op == "allreduce") {
    if (o.algos.empty()) {
      o.algos = kAllreduceAlgos;
      // AllreduceBcube (base 2) returns wrong sums when the world size is not a power of
      // two (seen with 3 ranks), so the default list leaves it out there; asking for it
      // explicitly still runs it and fails validation loudly.
      if ((o.ranks & (o.ranks - 1)) != 0) {
        std::fprintf(stderr, "gloo_bench: skipping algo=bcube at ranks=%d (not a power of 2)\n",
                     o.ranks);
        o.algos.erase(std::find(o.algos.begin(), o.algos.end(), "bcube"));
      }
    }
    for (const auto& a : o.algos) {
      if (std::find(kAllreduceAlgos.begin(), kAllreduceAlgos.end(), a) == kAllreduceAlgos.end()) {
        Die("unknown allreduce algorithm: " + a);
      }
    }
  } else if (o.op == "allgather" || o.op == "broadcast" || o.op == "reduce") {
    o.algos = {"default"};  // One implementation each in this Gloo.
  } else {
    Die("unsupported --op for gloo_bench: " + o.op);
  }
  return o;
}

float Pattern(int rank, int64_t i) { return static_cast<float>((rank + 1) * (i % 13 + 1)); }

double BusFactor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "reduce_scatter" || op == "allgather") return static_cast<double>(n - 1) / n;
  return 1.0;
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);
const ReduceFn kSumF32 = &gloo::sum<float>;

// One collective bound to its buffers for one size. Run() does one iteration.
// Not thread-safe; owned by the rank's main thread. `context` outlives it (owned by RunRank).
class Collective {
 public:
  Collective(const std::shared_ptr<gloo::Context>& context, const std::string& op,
             const std::string& algo, int64_t size_bytes)
      : context_(context), op_(op), algo_(algo) {
    const int n = context->size;
    int64_t total = size_bytes / static_cast<int64_t>(sizeof(float));
    if (op_ == "allgather") total -= total % n;
    total_ = total;
    // User memory: plain vectors, every page touched by the value-initialisation.
    data_.assign(std::max<int64_t>(total, 1), 0.0f);
    if (op_ == "allgather") in_.assign(std::max<int64_t>(total / n, 1), 0.0f);
    if (op_ == "reduce") in_.assign(std::max<int64_t>(total, 1), 0.0f);
    const int count = static_cast<int>(total);
    std::vector<float*> ptrs = {data_.data()};
    if (op_ == "allreduce") {
      if (algo_ == "ring") {
        algorithm_ = std::make_unique<gloo::AllreduceRing<float>>(context, ptrs, count);
      } else if (algo_ == "ring_chunked") {
        algorithm_ = std::make_unique<gloo::AllreduceRingChunked<float>>(context, ptrs, count);
      } else if (algo_ == "halving_doubling") {
        algorithm_ = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context, ptrs, count);
      } else if (algo_ == "bcube") {
        algorithm_ = std::make_unique<gloo::AllreduceBcube<float>>(context, ptrs, count);
      } else {
        allreduce_ = std::make_unique<gloo::AllreduceOptions>(context);
        allreduce_->setOutput(data_.data(), total_);
        allreduce_->setAlgorithm(algo_ == "new_ring" ? gloo::AllreduceOptions::Algorithm::RING
                                                     : gloo::AllreduceOptions::Algorithm::BCUBE);
        allreduce_->setReduceFunction(kSumF32);
      }
    } else if (op_ == "allgather") {
      allgather_ = std::make_unique<gloo::AllgatherOptions>(context);
      allgather_->setInput(in_.data(), total_ / n);
      allgather_->setOutput(data_.data(), total_);
    } else if (op_ == "broadcast") {
      broadcast_ = std::make_unique<gloo::BroadcastOptions>(context);
      broadcast_->setRoot(0);
      broadcast_->setOutput(data_.data(), total_);
    } else {
      reduce_ = std::make_unique<gloo::ReduceOptions>(context);
      reduce_->setRoot(0);
      reduce_->setInput(in_.data(), total_);
      reduce_->setOutput(data_.data(), total_);
      reduce_->setReduceFunction(kSumF32);
    }
  }

  int64_t size_bytes() const { return total_ * static_cast<int64_t>(sizeof(float)); }
  int64_t count() const { return total_; }

  // Options-based calls get a fresh tag each time, as PyTorch's ProcessGroupGloo does, so
  // a fast rank's next call never shares a slot with a slow rank's current one.
  void Run() {
    const uint32_t tag = next_tag_++;
    if (algorithm_) {
      algorithm_->run();
    } else if (allreduce_) {
      allreduce_->setTag(tag);
      gloo::allreduce(*allreduce_);
    } else if (allgather_) {
      allgather_->setTag(tag);
      gloo::allgather(*allgather_);
    } else if (broadcast_) {
      broadcast_->setTag(tag);
      gloo::broadcast(*broadcast_);
    } else {
      reduce_->setTag(tag);
      gloo::reduce(*reduce_);
    }
  }

  // Fills known inputs (validate=true) or zeros, so repeated in-place sums stay finite.
  void Fill(bool validate) {
    const int rank = context_->rank;
    if (!validate) {
      std::fill(data_.begin(), data_.end(), 0.0f);
      std::fill(in_.begin(), in_.end(), 0.0f);
      return;
    }
    if (op_ == "allreduce") {
      for (int64_t i = 0; i < total_; ++i) data_[i] = Pattern(rank, i);
    } else if (op_ == "allgather") {
      for (size_t i = 0; i < in_.size(); ++i) in_[i] = static_cast<float>(rank * 1000 + i % 97);
    } else if (op_ == "broadcast") {
      for (int64_t i = 0; i < total_; ++i) data_[i] = rank == 0 ? Pattern(0, i) : -1.0f;
    } else {
      for (int64_t i = 0; i < total_; ++i) in_[i] = Pattern(rank, i);
    }
  }

  // Wrong elements after one Run() on Fill(true) inputs.
  int64_t Check() const {
    const int n = context_->size, rank = context_->rank;
    const float tri = static_cast<float>(n * (n + 1) / 2);
    int64_t bad = 0;
    if (op_ == "allreduce" || (op_ == "reduce" && rank == 0)) {
      for (int64_t i = 0; i < total_; ++i) bad += data_[i] != tri * static_cast<float>(i % 13 + 1);
    } else if (op_ == "allgather") {
      const int64_t chunk = total_ / n;
      for (int64_t i = 0; i < total_; ++i) {
        bad += data_[i] != static_cast<float>((i / chunk) * 1000 + (i % chunk) % 97);
      }
    } else if (op_ == "broadcast") {
      for (int64_t i = 0; i < total_; ++i) bad += data_[i] != Pattern(0, i);
    }
    return bad;
  }

 private:
  std::shared_ptr<gloo::Context> context_;
  std::string op_;
  std::string algo_;
  int64_t total_ = 0;
  std::vector<float> data_;  // Output (and in-place input for allreduce/broadcast).
  std::vector<float> in_;    // Separate input for allgather/reduce.
  uint32_t next_tag_ = 1;
  std::unique_ptr<gloo::Algorithm> algorithm_;
  std::unique_ptr<gloo::AllreduceOptions> allreduce_;
  std::unique_ptr<gloo::AllgatherOptions> allgather_;
  std::unique_ptr<gloo::BroadcastOptions> broadcast_;
  std::unique_ptr<gloo::ReduceOptions> reduce_;
};

// Max and sum of `v` over ranks; the result lands on every rank.
double MaxOverRanks(const std::shared_ptr<gloo::Context>& context, double v) {
  std::vector<double*> ptrs = {&v};
  gloo::AllreduceRing<double>(context, ptrs, 1, gloo::ReductionFunction<double>::max).run();
  return v;
}

double SumOverRanks(const std::shared_ptr<gloo::Context>& context, double v) {
  std::vector<double*> ptrs = {&v};
  gloo::AllreduceRing<double>(context, ptrs, 1, gloo::ReductionFunction<double>::sum).run();
  return v;
}

struct Row {
  std::string algo;
  int64_t size_bytes;
  int64_t count;
  double time_s;
  int iters;  // As run: fewer than --iters when capped by --budget-s, 0 = validation call.
  int warmup;
};

void RunRank(const Options& o, int rank, const std::string& store_dir) {
  gloo::transport::tcp::attr attr(o.host.c_str());
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto rctx = std::make_shared<gloo::rendezvous::Context>(rank, o.ranks);
  rctx->setTimeout(std::chrono::seconds(o.timeout_s));
  gloo::rendezvous::FileStore store(store_dir);
  rctx->connectFullMesh(store, device);
  std::shared_ptr<gloo::Context> context = rctx;

  for (int64_t requested : o.sizes_bytes) {
    std::vector<Row> rows;
    for (const auto& algo : o.algos) {
      Collective coll(context, o.op, algo, requested);
      // Validate once per (algorithm, size) on known inputs, then time on zeros.
      coll.Fill(true);
      auto v0 = std::chrono::steady_clock::now();
      coll.Run();
      std::chrono::duration<double> first = std::chrono::steady_clock::now() - v0;
      if (SumOverRanks(context, static_cast<double>(coll.Check())) != 0) {
        Die("validation failed op=" + o.op + " algo=" + algo +
            " size=" + std::to_string(coll.size_bytes()) + " rank=" + std::to_string(rank));
      }
      // Some algorithms are pathologically slow in some shapes (new_ring at 4 ranks takes
      // seconds per MB here). Fit warmup+iters into --budget-s; if even one call does not
      // fit, report the validation call's time with iters=0.
      const double first_s = MaxOverRanks(context, first.count());
      int iters = o.iters, warmup = o.warmup;
      if (first_s * (iters + warmup) > o.budget_s) {
        warmup = 0;
        iters = static_cast<int>(o.budget_s / first_s);
        iters = std::min(iters, o.iters);
      }
      double mean_s = first_s;
      if (iters > 0) {
        coll.Fill(false);
        for (int i = 0; i < warmup; ++i) coll.Run();
        gloo::BarrierAllToAll(context).run();
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) coll.Run();
        std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - t0;
        mean_s = MaxOverRanks(context, elapsed.count() / iters);
      }
      rows.push_back({algo, coll.size_bytes(), coll.count(), mean_s, iters, warmup});
    }
    if (rank != 0) continue;
    auto best = std::min_element(rows.begin(), rows.end(),
                                 [](const Row& a, const Row& b) { return a.time_s < b.time_s; });
    for (const Row& r : rows) {
      double algbw = r.time_s > 0 ? r.size_bytes / r.time_s / 1e9 : 0;
      std::printf(
          "{\"impl\":\"gloo\",\"op\":\"%s\",\"ranks\":%d,\"transport\":\"tcp\","
          "\"buffers\":\"user\",\"algo\":\"%s\",\"dtype\":\"f32\",\"redop\":\"sum\","
          "\"size\":%lld,\"count\":%lld,\"time_us\":%.3f,\"algbw\":%.4f,\"busbw\":%.4f,"
          "\"best\":%s,\"iters\":%d,\"warmup\":%d}\n",
          o.op.c_str(), o.ranks, r.algo.c_str(), static_cast<long long>(r.size_bytes),
          static_cast<long long>(r.count), r.time_s * 1e6, algbw, algbw * BusFactor(o.op, o.ranks),
          &r == &*best ? "true" : "false", r.iters, r.warmup);
    }
    std::fflush(stdout);
  }
  gloo::BarrierAllToAll(context).run();
}

}  // namespace

int main(int argc, char** argv) {
  Options o = ParseArgs(argc, argv);
  char tmpl[] = "/tmp/gloo_bench.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Die("mkdtemp failed");
  const std::string store_dir = tmpl;

  // Fork every rank before any thread exists (gloo's tcp device starts its loop thread).
  std::vector<pid_t> children;
  for (int rank = 0; rank < o.ranks; ++rank) {
    pid_t pid = fork();
    if (pid < 0) Die("fork failed");
    if (pid == 0) {
      int rc = 0;
      try {
        RunRank(o, rank, store_dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gloo_bench rank=%d FATAL: %s\n", rank, e.what());
        rc = 3;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(rc);  // Skip static destructors inherited from the parent.
    }
    children.push_back(pid);
  }

  int failures = 0;
  for (size_t live = children.size(); live > 0; --live) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failures++ == 0) {
      // One rank failed: the others would block until the timeout, so stop them now.
      for (pid_t c : children) {
        if (c != pid) kill(c, SIGTERM);
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(store_dir, ec);
  if (failures > 0) {
    std::fprintf(stderr, "gloo_bench: %d rank(s) failed\n", failures);
    return 1;
  }
  return 0;
}
