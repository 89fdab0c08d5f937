// `kc bench comm`'s arguments and their check: what the command and each of its rank
// processes parse, turned into the plan they measure (bench_command.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "comm/collectives.h"
#include "comm/communicator.h"
#include "hal/compute.h"
#include "hal/topology.h"

namespace kc::app {

struct BenchArgs {
  int ranks = 2;
  std::string sizes = "4K,64K,1M,16M,64M";
  std::string op = "allreduce";
  std::string dtype = "f32";
  std::string redop = "sum";
  std::string algo = "auto";
  std::string wire = "f32";  // all-reduce: what travels, f32 or bf16 (comm::WireFormat)
  std::string transport = "auto";
  std::string buffers = "user";
  int iters = 20;
  int warmup = 5;
  std::string format = "table";
  std::string hosts;  // comma list, one per rank of the world
  double timeout_s = 60;
  bool check = true;
  std::string store;  // host:port
  int world = 0;      // 0: ranks
  int first_rank = 0;
  std::string bind = "127.0.0.1";
  std::string group;
  int worker_rank = -1;  // internal: this process is that rank
  std::string flood;     // size of a telemetry-lane all-reduce kept running meanwhile
  // "RANK:stop" or "RANK:kill": that rank stops (SIGSTOP: silent, its sockets open) or dies
  // (SIGKILL) before its first measured operation: the drills that show no rank and no
  // launcher waits for ever.
  std::string inject_fault;
  // core: pin each rank to one CPU when they fit (as mpirun); auto: only on the direct
  // shared-memory path, where no progress thread needs a CPU of its own; none.
  std::string cpu_bind = "auto";
  int local_rank = 0;  // internal: index of this worker among this run's ranks
  // An inventory (docs/user-guide/inventory.md): rank r runs as its device r, on that
  // device's host unless --hosts says otherwise, and --algo auto chooses each all-reduce by
  // the inventory's cost model, as `kc topo report --inventory` advises.
  std::string inventory;
};

// The checked arguments.
struct Plan {
  std::vector<int64_t> sizes;
  std::vector<std::string> ops;
  hal::DataType dtype;
  comm::ReduceOp redop;
  comm::Algorithm algo;
  comm::WireFormat wire = comm::WireFormat::kNative;
  comm::TransportKind transport;
  bool registered;
  int world;
  std::vector<std::string> hosts;                 // empty: the machine's name for every rank
  std::shared_ptr<const hal::Topology> topology;  // --inventory
  int64_t flood_bytes = 0;
  int fault_rank = -1;  // --inject-fault
  int fault_signal = 0;
};

// Parses and checks `a`; kInvalidArgument naming the argument.
Result<Plan> Check(const BenchArgs& a);

// nccl-tests' bus bandwidth factor of `op` over n ranks.
double BusFactor(const std::string& op, int n);

}  // namespace kc::app
