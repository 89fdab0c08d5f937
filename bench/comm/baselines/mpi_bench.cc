// Open MPI baseline for `kc bench comm`: times MPI collectives the way nccl-tests does and
// prints one JSON line per size on rank 0. Built and launched by bench/comm/compare.py with
// mpicxx and mpirun, never by the product's CMake (see bench/comm/README.md).
//
// Usage: mpirun -np N mpi_bench --op allreduce --sizes 4K,1M,64M --iters 20 --warmup 5
//            [--buffers user|alloc]
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct Options {
  std::string op = "allreduce";
  std::vector<int64_t> sizes_bytes = {4096, 1 << 20, 64 << 20};
  int iters = 20;
  int warmup = 5;
  std::string buffers = "user";  // "user" (malloc) or "alloc" (MPI_Alloc_mem).
};

[[noreturn]] void Die(const std::string& why) {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "mpi_bench rank=%d FATAL: %s\n", rank, why.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::abort();
}

// Parses "4096", "4K", "1M", "2G" (binary multiples, as nccl-tests).
int64_t ParseSize(std::string_view s) {
  if (s.empty()) Die("empty size");
  int64_t mult = 1;
  char last = s.back();
  if (last == 'K' || last == 'k') mult = int64_t{1} << 10;
  if (last == 'M' || last == 'm') mult = int64_t{1} << 20;
  if (last == 'G' || last == 'g') mult = int64_t{1} << 30;
  if (mult != 1) s.remove_suffix(1);
  char* end = nullptr;
  std::string digits(s);
  long long v = std::strtoll(digits.c_str(), &end, 10);
  if (end == digits.c_str() || *end != '\0' || v < 0) Die("bad size: " + digits);
  return v * mult;
}

std::vector<int64_t> ParseSizes(const std::string& list) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    if (comma > start) out.push_back(ParseSize(list.substr(start, comma - start)));
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
    if (a == "--op")
      o.op = value();
    else if (a == "--sizes")
      o.sizes_bytes = ParseSizes(value());
    else if (a == "--iters")
      o.iters = std::atoi(value().c_str());
    else if (a == "--warmup")
      o.warmup = std::atoi(value().c_str());
    else if (a == "--buffers")
      o.buffers = value();
    else
      Die("unknown argument: " + a);
  }
  if (o.op != "allreduce" && o.op != "reduce_scatter" && o.op != "allgather" &&
      o.op != "broadcast" && o.op != "reduce") {
    Die("unknown --op " + o.op);
  }
  if (o.buffers != "user" && o.buffers != "alloc") Die("--buffers must be user or alloc");
  if (o.iters < 1 || o.warmup < 0) Die("--iters must be >= 1 and --warmup >= 0");
  return o;
}

// A float buffer allocated with malloc (pages touched) or MPI_Alloc_mem.
// Not thread-safe; owned by the rank's main thread.
class Buffer {
 public:
  Buffer(int64_t num_elements, bool use_alloc_mem)
      : num_elements_(num_elements), alloc_mem_(use_alloc_mem) {
    size_t bytes = static_cast<size_t>(num_elements) * sizeof(float);
    if (bytes == 0) bytes = sizeof(float);
    if (alloc_mem_) {
      if (MPI_Alloc_mem(static_cast<MPI_Aint>(bytes), MPI_INFO_NULL, &data_) != MPI_SUCCESS) {
        Die("MPI_Alloc_mem failed");
      }
    } else {
      data_ = static_cast<float*>(std::malloc(bytes));
      if (data_ == nullptr) Die("malloc failed");
    }
    std::memset(data_, 0, bytes);  // Touch every page before timing.
  }
  ~Buffer() {
    if (alloc_mem_)
      MPI_Free_mem(data_);
    else
      std::free(data_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  float* data() { return data_; }
  int64_t size() const { return num_elements_; }

 private:
  int64_t num_elements_;
  bool alloc_mem_;
  float* data_ = nullptr;
};

// Small integers, so every float sum below is exact.
float Pattern(int rank, int64_t i) { return static_cast<float>((rank + 1) * (i % 13 + 1)); }

// One collective with its buffers, for one size. count = elements per rank's input,
// following nccl-tests (allgather: per-rank input; reduce_scatter: per-rank output).
class Collective {
 public:
  Collective(const std::string& op, int64_t size_bytes, int rank, int world, bool alloc)
      : op_(op), rank_(rank), world_(world) {
    int64_t total = size_bytes / static_cast<int64_t>(sizeof(float));
    if (op_ == "reduce_scatter" || op_ == "allgather") total -= total % world_;
    total_elements_ = total;
    chunk_ = (op_ == "reduce_scatter" || op_ == "allgather") ? total / world_ : total;
    int64_t send_n = op_ == "allgather" ? chunk_ : total;
    int64_t recv_n = op_ == "reduce_scatter" ? chunk_ : total;
    send_ = std::make_unique<Buffer>(send_n, alloc);
    if (op_ != "broadcast") recv_ = std::make_unique<Buffer>(recv_n, alloc);
  }

  int64_t size_bytes() const { return total_elements_ * static_cast<int64_t>(sizeof(float)); }
  int64_t count() const { return total_elements_; }

  void Fill() {
    float* s = send_->data();
    for (int64_t i = 0; i < send_->size(); ++i) {
      if (op_ == "allgather")
        s[i] = static_cast<float>(rank_ * 1000 + i % 97);
      else if (op_ == "broadcast")
        s[i] = rank_ == 0 ? Pattern(0, i) : -1.0f;
      else
        s[i] = Pattern(rank_, i);
    }
  }

  void Run() {
    int rc = MPI_SUCCESS;
    int c = static_cast<int>(chunk_);
    if (op_ == "allreduce") {
      rc = MPI_Allreduce(send_->data(), recv_->data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (op_ == "reduce_scatter") {
      rc = MPI_Reduce_scatter_block(send_->data(), recv_->data(), c, MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD);
    } else if (op_ == "allgather") {
      rc = MPI_Allgather(send_->data(), c, MPI_FLOAT, recv_->data(), c, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (op_ == "broadcast") {
      rc = MPI_Bcast(send_->data(), c, MPI_FLOAT, 0, MPI_COMM_WORLD);
    } else {
      rc = MPI_Reduce(send_->data(), recv_->data(), c, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
    }
    if (rc != MPI_SUCCESS) Die(op_ + " returned an error");
  }

  // Checks the output of one Run() after Fill(); returns the number of wrong elements.
  int64_t Check() const {
    int64_t bad = 0;
    const float tri = static_cast<float>(world_ * (world_ + 1) / 2);
    if (op_ == "allreduce" || (op_ == "reduce" && rank_ == 0)) {
      const float* r = recv_->data();
      for (int64_t i = 0; i < chunk_; ++i) bad += r[i] != tri * static_cast<float>(i % 13 + 1);
    } else if (op_ == "reduce_scatter") {
      const float* r = recv_->data();
      for (int64_t i = 0; i < chunk_; ++i) {
        int64_t g = rank_ * chunk_ + i;
        bad += r[i] != tri * static_cast<float>(g % 13 + 1);
      }
    } else if (op_ == "allgather") {
      const float* r = recv_->data();
      for (int64_t i = 0; i < total_elements_; ++i) {
        int64_t src = i / chunk_, j = i % chunk_;
        bad += r[i] != static_cast<float>(src * 1000 + j % 97);
      }
    } else if (op_ == "broadcast") {
      const float* r = send_->data();
      for (int64_t i = 0; i < chunk_; ++i) bad += r[i] != Pattern(0, i);
    }
    return bad;
  }

 private:
  std::string op_;
  int rank_;
  int world_;
  int64_t total_elements_ = 0;
  int64_t chunk_ = 0;  // Elements passed as `count` to MPI.
  std::unique_ptr<Buffer> send_;
  std::unique_ptr<Buffer> recv_;
};

double BusFactor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "reduce_scatter" || op == "allgather") return static_cast<double>(n - 1) / n;
  return 1.0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  Options o = ParseArgs(argc, argv);

  for (int64_t requested : o.sizes_bytes) {
    Collective coll(o.op, requested, rank, world, o.buffers == "alloc");
    // Validate once per size: one run on known inputs, checked on every rank.
    coll.Fill();
    coll.Run();
    int64_t bad = coll.Check(), bad_total = 0;
    MPI_Allreduce(&bad, &bad_total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (bad_total != 0) {
      Die("validation failed op=" + o.op + " size=" + std::to_string(coll.size_bytes()) +
          " wrong_elements=" + std::to_string(bad_total));
    }
    for (int i = 0; i < o.warmup; ++i) coll.Run();
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < o.iters; ++i) coll.Run();
    double mean_s = (MPI_Wtime() - t0) / o.iters, max_s = 0;
    MPI_Reduce(&mean_s, &max_s, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      double algbw = max_s > 0 ? coll.size_bytes() / max_s / 1e9 : 0;
      std::printf(
          "{\"impl\":\"openmpi\",\"op\":\"%s\",\"ranks\":%d,\"transport\":\"shm\","
          "\"buffers\":\"%s\",\"algo\":\"default\",\"dtype\":\"f32\",\"redop\":\"sum\","
          "\"size\":%lld,\"count\":%lld,\"time_us\":%.3f,\"algbw\":%.4f,\"busbw\":%.4f,"
          "\"alloc\":\"%s\",\"iters\":%d,\"warmup\":%d}\n",
          o.op.c_str(), world, o.buffers == "alloc" ? "registered" : "user",
          static_cast<long long>(coll.size_bytes()), static_cast<long long>(coll.count()),
          max_s * 1e6, algbw, algbw * BusFactor(o.op, world),
          o.buffers == "alloc" ? "MPI_Alloc_mem" : "malloc", o.iters, o.warmup);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
