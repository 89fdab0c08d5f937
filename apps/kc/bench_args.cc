#include "apps/kc/bench_args.h"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <string_view>

#include "hal/inventory.h"

namespace kc::app {
namespace {

using comm::Algorithm;
using comm::ReduceOp;
using comm::TransportKind;
using hal::DataType;

const std::vector<std::string> kOps = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                       "reduce",    "sendrecv",       "barrier"};

Result<std::vector<int64_t>> ParseSizes(const std::string& list) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(start, end - start);
    int64_t mult = 1;
    if (!item.empty()) {
      const char suffix = static_cast<char>(std::toupper(static_cast<unsigned char>(item.back())));
      if (suffix == 'K' || suffix == 'M' || suffix == 'G') {
        mult = suffix == 'K' ? 1 << 10 : suffix == 'M' ? 1 << 20 : int64_t{1} << 30;
        item.pop_back();
      }
    }
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || v < 0) {
      return InvalidArgumentError("--sizes: \"" + list.substr(start, end - start) +
                                  "\" is not a size (bytes, with an optional K, M or G)");
    }
    out.push_back(v * mult);
    start = end + 1;
  }
  return out;
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::optional<DataType> DataTypeFromName(std::string_view name) {
  for (DataType t :
       {DataType::kF32, DataType::kF64, DataType::kI32, DataType::kI64, DataType::kBf16}) {
    if (hal::DataTypeName(t) == name) return t;
  }
  return std::nullopt;
}

std::optional<ReduceOp> ReduceOpFromName(std::string_view name) {
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
    if (comm::ReduceOpName(op) == name) return op;
  }
  return std::nullopt;
}

// Everything the arguments say, checked.

}  // namespace

Result<Plan> Check(const BenchArgs& a) {
  Plan p;
  KC_ASSIGN_OR_RETURN(p.sizes, ParseSizes(a.sizes));
  if (a.op == "all") {
    p.ops = kOps;
  } else if (std::find(kOps.begin(), kOps.end(), a.op) != kOps.end() || a.op == "wire") {
    p.ops = {a.op};
  } else {
    return InvalidArgumentError("--op: unknown operation \"" + a.op +
                                "\" (allreduce, reduce_scatter, allgather, broadcast, reduce, "
                                "sendrecv, barrier, all)");
  }
  std::optional<DataType> t = DataTypeFromName(a.dtype);
  if (!t)
    return InvalidArgumentError("--dtype: unknown \"" + a.dtype + "\" (f32 f64 i32 i64 bf16)");
  p.dtype = *t;
  std::optional<ReduceOp> r = ReduceOpFromName(a.redop);
  if (!r)
    return InvalidArgumentError("--redop: unknown \"" + a.redop + "\" (sum prod min max avg)");
  p.redop = *r;
  if (p.redop == ReduceOp::kAvg && !comm::IsFloating(p.dtype)) {
    return InvalidArgumentError("--redop avg needs a floating --dtype");
  }
  std::optional<Algorithm> al = comm::AlgorithmFromName(a.algo);
  if (!al) {
    return InvalidArgumentError("--algo: unknown \"" + a.algo +
                                "\" (auto ring recursive_doubling hierarchical direct)");
  }
  p.algo = *al;
  if (a.wire != "f32" && a.wire != "bf16") {
    return InvalidArgumentError("--wire: unknown \"" + a.wire + "\" (f32 bf16)");
  }
  if (a.wire == "bf16") {
    if (p.dtype != DataType::kF32 || (p.redop != ReduceOp::kSum && p.redop != ReduceOp::kAvg)) {
      return InvalidArgumentError(
          "--wire bf16: carries f32 sums and averages (--dtype f32, "
          "--redop sum or avg)");
    }
    p.wire = comm::WireFormat::kBf16;
  }
  std::optional<TransportKind> k = comm::TransportKindFromName(a.transport);
  if (!k)
    return InvalidArgumentError("--transport: unknown \"" + a.transport + "\" (auto shm tcp)");
  p.transport = *k;
  if (a.buffers != "user" && a.buffers != "registered") {
    return InvalidArgumentError("--buffers: \"" + a.buffers + "\" is not user or registered");
  }
  p.registered = a.buffers == "registered";
  if (a.ranks < 1) return InvalidArgumentError("--ranks must be at least 1");
  p.world = a.world > 0 ? a.world : a.ranks;
  if (a.first_rank < 0 || a.first_rank + a.ranks > p.world) {
    return InvalidArgumentError(fmt::format("--first-rank {} --ranks {} do not fit --world {}",
                                            a.first_rank, a.ranks, p.world));
  }
  if (!a.hosts.empty()) {
    p.hosts = SplitList(a.hosts);
    if (static_cast<int>(p.hosts.size()) != p.world) {
      return InvalidArgumentError(
          fmt::format("--hosts names {} hosts for {} ranks", p.hosts.size(), p.world));
    }
  }
  if (!a.inventory.empty()) {
    Result<hal::TopologySpec> spec = hal::LoadInventory(a.inventory);
    if (!spec.ok()) return InvalidArgumentError("--inventory: " + spec.status().message());
    Result<hal::Topology> topology = hal::Topology::Build(*std::move(spec));
    if (!topology.ok()) {
      return InvalidArgumentError("--inventory " + a.inventory + ": " +
                                  topology.status().message());
    }
    if (topology->num_devices() < p.world) {
      return InvalidArgumentError(fmt::format("--inventory {}: {} devices for {} ranks",
                                              a.inventory, topology->num_devices(), p.world));
    }
    p.topology = std::make_shared<const hal::Topology>(*std::move(topology));
    if (p.hosts.empty()) {
      for (int device = 0; device < p.world; ++device) {
        p.hosts.push_back(p.topology->hosts()[p.topology->host_of(device)].name);
      }
    }
  }
  if (a.iters < 1 || a.warmup < 0) return InvalidArgumentError("--iters >= 1, --warmup >= 0");
  if (a.cpu_bind != "auto" && a.cpu_bind != "core" && a.cpu_bind != "none") {
    return InvalidArgumentError("--cpu-bind: \"" + a.cpu_bind + "\" is not auto, core or none");
  }
  if (a.format != "table" && a.format != "json") {
    return InvalidArgumentError("--format: \"" + a.format + "\" is not table or json");
  }
  if (a.timeout_s <= 0) return InvalidArgumentError("--timeout must be positive");
  if (!a.flood.empty()) {
    Result<std::vector<int64_t>> f = ParseSizes(a.flood);
    if (!f.ok() || f->size() != 1) {
      return InvalidArgumentError("--flood: \"" + a.flood + "\" is not one size");
    }
    p.flood_bytes = f->front();
  }
  if (!a.inject_fault.empty()) {
    const size_t colon = a.inject_fault.find(':');
    const std::string how = colon == std::string::npos ? "" : a.inject_fault.substr(colon + 1);
    int rank = -1;
    const char* end = a.inject_fault.data() + (colon == std::string::npos ? 0 : colon);
    const auto [ptr, ec] = std::from_chars(a.inject_fault.data(), end, rank);
    if (ec != std::errc() || ptr != end || rank < 0 || rank >= p.world ||
        (how != "stop" && how != "kill")) {
      return InvalidArgumentError(fmt::format(
          "--inject-fault: expected RANK:stop or RANK:kill with RANK below the world size {}, "
          "got \"{}\"",
          p.world, a.inject_fault));
    }
    p.fault_rank = rank;
    p.fault_signal = how == "stop" ? SIGSTOP : SIGKILL;
  }
  return p;
}

double BusFactor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "reduce_scatter" || op == "allgather") return static_cast<double>(n - 1) / n;
  return 1.0;
}

}  // namespace kc::app
