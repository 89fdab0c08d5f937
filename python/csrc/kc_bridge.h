// The seam between the torch.distributed backend "kc" (process_group_kc.cc, compiled as C++17
// against PyTorch's headers) and kc's communicator (kc_bridge.cc, C++20). PyTorch 1.13's
// headers do not compile as C++20 with clang and libstdc++ 12, and kc's headers need C++20, so
// neither side includes the other's: this header uses the standard library of C++17 alone.
//
// Errors come back as a message (empty: success); the torch side turns them into exceptions,
// as c10d backends do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kc::torch_bridge {

enum class Dtype { kF32, kF64, kI32, kI64, kBf16 };
enum class Op { kSum, kAvg, kProd, kMin, kMax };
// Which of kc's priority lanes an operation travels on (comm/lanes.h).
enum class Lane { kGradient, kActivation, kControl, kTelemetry };

// The rendezvous store of the process group (torch's c10d::Store), seen through plain calls.
// Each returns "" on success, else why; a wait that runs out of time returns a message
// starting with "timeout". Safe for concurrent use.
class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  virtual std::string Set(const std::string& key, const std::string& value) = 0;
  virtual std::string Get(const std::string& key, int64_t timeout_ms, std::string* value) = 0;
  virtual std::string Wait(const std::vector<std::string>& keys, int64_t timeout_ms) = 0;
  virtual std::string Add(const std::string& key, int64_t delta, int64_t* value) = 0;
  // Stores `desired` if the value is `expected` ("" also matches an absent key).
  virtual std::string CompareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired, std::string* current) = 0;
  virtual std::string Delete(const std::string& key, bool* existed) = 0;
  virtual std::string Check(const std::vector<std::string>& keys, bool* all) = 0;
};

// One operation in flight. Wait blocks until it completes (or its deadline, which every kc
// operation has) and returns "" or the error. Safe for concurrent use.
class Handle {
 public:
  virtual ~Handle() = default;
  virtual std::string Wait() = 0;
};

struct GroupOptions {
  int rank = 0;
  int size = 1;
  int64_t timeout_ms = 30 * 60 * 1000;  // of every operation, and of the rendezvous
  // "auto" (shared memory on one host, TCP between hosts), "shm" or "tcp".
  std::string transport = "auto";
  // The admin's communication limits file (comm/comm_limits_config.h) and the job name its
  // per-job limits are looked up by; empty: no rate limit.
  std::string comm_limits_path;
  std::string job_name;
};

// A kc communicator for one torch process group. Every call enqueues one collective (all
// ranks call the same ones in the same order, as with any process group) and returns its
// Handle, or null with `*error` set for bad arguments. Memory passed in must stay valid
// until the handle's Wait returns. Safe for concurrent use.
class Group {
 public:
  // Rendezvous through `store` (shared; it must hold this group's keys alone, as c10d's
  // PrefixStore gives each process group). Blocks until every rank has come, or the timeout.
  static std::unique_ptr<Group> Create(std::shared_ptr<StoreBackend> store,
                                       const GroupOptions& options, std::string* error);
  virtual ~Group() = default;

  virtual std::unique_ptr<Handle> Allreduce(void* data, size_t count, Dtype dtype, Op op, Lane lane,
                                            std::string* error) = 0;
  // data: size() chunks of `count / size()` elements; rank r's chunk is in place on entry and
  // every chunk is on exit (ReduceScatter: rank r's chunk holds the reduction on exit).
  virtual std::unique_ptr<Handle> Allgather(void* data, size_t count, Dtype dtype, Lane lane,
                                            std::string* error) = 0;
  virtual std::unique_ptr<Handle> ReduceScatter(void* data, size_t count, Dtype dtype, Op op,
                                                Lane lane, std::string* error) = 0;
  virtual std::unique_ptr<Handle> Reduce(void* data, size_t count, Dtype dtype, Op op, int root,
                                         Lane lane, std::string* error) = 0;
  virtual std::unique_ptr<Handle> Broadcast(void* data, size_t bytes, int root, Lane lane,
                                            std::string* error) = 0;
  virtual std::unique_ptr<Handle> Barrier(std::string* error) = 0;
  virtual std::unique_ptr<Handle> Send(const void* data, size_t bytes, int peer, uint64_t tag,
                                       std::string* error) = 0;
  virtual std::unique_ptr<Handle> Recv(void* data, size_t bytes, int peer, uint64_t tag,
                                       std::string* error) = 0;
  // The algorithm kc chooses for an all-reduce of `bytes` ("ring", "direct", ...).
  virtual std::string AllreduceAlgorithm(int64_t bytes) const = 0;
};

// The heartbeats `kc run --heartbeat-timeout` asks of its ranks (KC_HEARTBEAT_FILE, every
// KC_HEARTBEAT_PERIOD seconds): a thread of kc's touches the file, from the first call for the
// life of the process (later calls do nothing). "" or why not.
std::string StartHeartbeat(const std::string& path, double period_s);

}  // namespace kc::torch_bridge
