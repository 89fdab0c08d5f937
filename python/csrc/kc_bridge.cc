// The kc side of the torch backend's bridge: a comm::Store over the process group's store,
// and a comm::Communicator behind torch_bridge::Group.
#include "python/csrc/kc_bridge.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string_view>
#include <thread>
#include <utility>

#include "comm/comm_limits_config.h"
#include "comm/communicator.h"
#include "comm/rate_limit.h"
#include "comm/store.h"

namespace kc::torch_bridge {
namespace {

int64_t MillisUntil(Clock* clock, TimePoint deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock->Now()).count();
  return std::max<int64_t>(left, 1);
}

// A store error as a Status: timeouts are kDeadlineExceeded (what the communicator's
// rendezvous expects), anything else kUnavailable.
Status FromStore(const std::string& error, std::string_view what) {
  if (error.empty()) return OkStatus();
  const std::string message = std::string(what) + ": " + error;
  if (error.rfind("timeout", 0) == 0) return DeadlineExceededError(message);
  return UnavailableError(message);
}

// comm::Store over the process group's store. Deadlines are on the real clock.
class StoreAdapter final : public comm::Store {
 public:
  explicit StoreAdapter(std::shared_ptr<StoreBackend> backend) : backend_(std::move(backend)) {}

  Status Set(std::string_view key, std::string_view value) override {
    return FromStore(backend_->Set(std::string(key), std::string(value)), "store set");
  }
  Result<std::string> Get(std::string_view key, TimePoint deadline) override {
    std::string value;
    KC_RETURN_IF_ERROR(FromStore(
        backend_->Get(std::string(key), MillisUntil(clock(), deadline), &value), "store get"));
    return value;
  }
  Status Wait(std::span<const std::string> keys, TimePoint deadline) override {
    if (keys.empty()) return OkStatus();
    return FromStore(backend_->Wait(std::vector<std::string>(keys.begin(), keys.end()),
                                    MillisUntil(clock(), deadline)),
                     "store wait");
  }
  Result<int64_t> Add(std::string_view key, int64_t delta) override {
    int64_t value = 0;
    KC_RETURN_IF_ERROR(FromStore(backend_->Add(std::string(key), delta, &value), "store add"));
    return value;
  }
  Result<comm::CompareSetResult> CompareSet(std::string_view key,
                                            std::optional<std::string_view> expected,
                                            std::string_view desired) override {
    std::string current;
    KC_RETURN_IF_ERROR(
        FromStore(backend_->CompareSet(std::string(key), std::string(expected.value_or("")),
                                       std::string(desired), &current),
                  "store compare-set"));
    return comm::CompareSetResult{.swapped = current == desired, .current = current};
  }
  Result<bool> Delete(std::string_view key) override {
    bool existed = false;
    KC_RETURN_IF_ERROR(FromStore(backend_->Delete(std::string(key), &existed), "store delete"));
    return existed;
  }
  Result<bool> Check(std::span<const std::string> keys) override {
    bool all = false;
    KC_RETURN_IF_ERROR(FromStore(
        backend_->Check(std::vector<std::string>(keys.begin(), keys.end()), &all), "store check"));
    return all;
  }
  Clock* clock() const override { return Clock::Real(); }

 private:
  const std::shared_ptr<StoreBackend> backend_;
};

class HandleImpl final : public Handle {
 public:
  explicit HandleImpl(std::shared_ptr<comm::Work> work) : work_(std::move(work)) {}
  std::string Wait() override {
    Status s = work_->Wait();
    return s.ok() ? std::string() : s.ToString();
  }

 private:
  const std::shared_ptr<comm::Work> work_;
};

hal::DataType ToKc(Dtype d) {
  switch (d) {
    case Dtype::kF32:
      return hal::DataType::kF32;
    case Dtype::kF64:
      return hal::DataType::kF64;
    case Dtype::kI32:
      return hal::DataType::kI32;
    case Dtype::kI64:
      return hal::DataType::kI64;
    case Dtype::kBf16:
      return hal::DataType::kBf16;
  }
  return hal::DataType::kF32;
}

comm::ReduceOp ToKc(Op op) {
  switch (op) {
    case Op::kSum:
      return comm::ReduceOp::kSum;
    case Op::kAvg:
      return comm::ReduceOp::kAvg;
    case Op::kProd:
      return comm::ReduceOp::kProd;
    case Op::kMin:
      return comm::ReduceOp::kMin;
    case Op::kMax:
      return comm::ReduceOp::kMax;
  }
  return comm::ReduceOp::kSum;
}

comm::Lane ToKc(Lane lane) {
  switch (lane) {
    case Lane::kGradient:
      return comm::Lane::kGradient;
    case Lane::kActivation:
      return comm::Lane::kActivation;
    case Lane::kControl:
      return comm::Lane::kControl;
    case Lane::kTelemetry:
      return comm::Lane::kTelemetry;
  }
  return comm::Lane::kGradient;
}

std::span<std::byte> Bytes(void* data, size_t count, Dtype dtype) {
  return {static_cast<std::byte*>(data), count * hal::DataTypeSize(ToKc(dtype))};
}

// What a kc call returned, as the bridge's handle or error.
std::unique_ptr<Handle> Out(Result<std::shared_ptr<comm::Work>> work, std::string* error) {
  if (!work.ok()) {
    *error = work.status().ToString();
    return nullptr;
  }
  return std::make_unique<HandleImpl>(*std::move(work));
}

class GroupImpl final : public Group {
 public:
  // Members in destruction order last to first: the communicator before the store it uses.
  std::unique_ptr<StoreAdapter> store;
  std::unique_ptr<comm::RateLimiter> limiter;
  std::unique_ptr<comm::Communicator> comm;

  std::unique_ptr<Handle> Allreduce(void* data, size_t count, Dtype dtype, Op op, Lane lane,
                                    std::string* error) override {
    return Out(comm->Allreduce(Bytes(data, count, dtype), count, ToKc(dtype), ToKc(op),
                               {.lane = ToKc(lane)}),
               error);
  }
  std::unique_ptr<Handle> Allgather(void* data, size_t count, Dtype dtype, Lane lane,
                                    std::string* error) override {
    return Out(comm->Allgather(Bytes(data, count, dtype), count, ToKc(dtype), {.lane = ToKc(lane)}),
               error);
  }
  std::unique_ptr<Handle> ReduceScatter(void* data, size_t count, Dtype dtype, Op op, Lane lane,
                                        std::string* error) override {
    return Out(comm->ReduceScatter(Bytes(data, count, dtype), count, ToKc(dtype), ToKc(op),
                                   {.lane = ToKc(lane)}),
               error);
  }
  std::unique_ptr<Handle> Reduce(void* data, size_t count, Dtype dtype, Op op, int root, Lane lane,
                                 std::string* error) override {
    return Out(comm->Reduce(Bytes(data, count, dtype), count, ToKc(dtype), ToKc(op), root,
                            {.lane = ToKc(lane)}),
               error);
  }
  std::unique_ptr<Handle> Broadcast(void* data, size_t bytes, int root, Lane lane,
                                    std::string* error) override {
    return Out(comm->Broadcast({static_cast<std::byte*>(data), bytes}, root, {.lane = ToKc(lane)}),
               error);
  }
  std::unique_ptr<Handle> Barrier(std::string* error) override {
    return Out(comm->Barrier({.lane = comm::Lane::kControl}), error);
  }
  std::unique_ptr<Handle> Send(const void* data, size_t bytes, int peer, uint64_t tag,
                               std::string* error) override {
    return Out(comm->Send(peer, {static_cast<const std::byte*>(data), bytes}, tag,
                          {.lane = comm::Lane::kActivation}),
               error);
  }
  std::unique_ptr<Handle> Recv(void* data, size_t bytes, int peer, uint64_t tag,
                               std::string* error) override {
    return Out(comm->Recv(peer, {static_cast<std::byte*>(data), bytes}, tag,
                          {.lane = comm::Lane::kActivation}),
               error);
  }
  std::string AllreduceAlgorithm(int64_t bytes) const override {
    return std::string(comm::AlgorithmName(comm->ChooseAllreduce(bytes)));
  }
};

// A group name unique on this host: it names the shared-memory segments, which every process
// group of every job on the host shares a namespace with. Rank 0 draws it; the others read it.
Result<std::string> GroupName(comm::Store& store, int rank, TimePoint deadline) {
  constexpr std::string_view kKey = "kc/torch/group";
  if (rank == 0) {
    std::random_device random;
    const std::string name = "torch-" + std::to_string(getpid()) + "-" + std::to_string(random());
    KC_RETURN_IF_ERROR(store.Set(kKey, name));
    return name;
  }
  return store.Get(kKey, deadline);
}

Result<std::unique_ptr<Group>> CreateGroup(std::shared_ptr<StoreBackend> backend,
                                           const GroupOptions& o) {
  auto group = std::make_unique<GroupImpl>();
  group->store = std::make_unique<StoreAdapter>(std::move(backend));
  const std::optional<comm::TransportKind> transport = comm::TransportKindFromName(o.transport);
  if (!transport) {
    return InvalidArgumentError("transport " + o.transport + ": expected auto, shm or tcp");
  }
  if (!o.comm_limits_path.empty()) {
    KC_ASSIGN_OR_RETURN(comm::CommLimits limits, comm::LoadCommLimits(o.comm_limits_path));
    KC_ASSIGN_OR_RETURN(group->limiter,
                        comm::RateLimiter::Create(limits.ForJob(o.job_name), Clock::Real()));
  }
  const Duration timeout = std::chrono::milliseconds(o.timeout_ms);
  KC_ASSIGN_OR_RETURN(std::string name,
                      GroupName(*group->store, o.rank, Clock::Real()->Now() + timeout));
  KC_ASSIGN_OR_RETURN(group->comm,
                      comm::Communicator::Create({.store = group->store.get(),
                                                  .group = name,
                                                  .rank = o.rank,
                                                  .size = o.size,
                                                  .transport = *transport,
                                                  .connect_timeout = timeout,
                                                  .timeout = timeout,
                                                  .rate_limiter = group->limiter.get()}));
  return std::unique_ptr<Group>(std::move(group));
}

}  // namespace

std::string StartHeartbeat(const std::string& path, double period_s) {
  // kc run reads the file's modification time (fault::FileBeat); the thread is the process's,
  // joined at exit. (kc's fault layer, whose Heartbeat does the same, is not linked into this
  // module: its libraries are not built position-independent.)
  struct Beat {
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;
    std::thread thread;
    ~Beat() {
      {
        std::lock_guard<std::mutex> lock(mu);
        stop = true;
      }
      cv.notify_all();
      if (thread.joinable()) thread.join();
    }
  };
  auto touch = [path] {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY, 0644);
    if (fd < 0) return std::string(strerror(errno));
    const int rc = futimens(fd, nullptr);
    const int error = errno;
    close(fd);
    return rc == 0 ? std::string() : std::string(strerror(error));
  };
  static std::mutex mu;
  static std::unique_ptr<Beat> beat;
  std::lock_guard<std::mutex> lock(mu);
  if (beat != nullptr) return "";
  if (std::string e = touch(); !e.empty()) return path + ": " + e;  // the first beat, at once
  beat = std::make_unique<Beat>();
  const auto period = std::chrono::duration<double>(period_s);
  beat->thread = std::thread([b = beat.get(), touch, period] {
    std::unique_lock<std::mutex> lock(b->mu);
    while (!b->cv.wait_for(lock, period, [b] { return b->stop; })) {
      lock.unlock();
      touch();  // a failure is kc run's to see: the beats stop
      lock.lock();
    }
  });
  return "";
}

std::unique_ptr<Group> Group::Create(std::shared_ptr<StoreBackend> store,
                                     const GroupOptions& options, std::string* error) {
  Result<std::unique_ptr<Group>> group = CreateGroup(std::move(store), options);
  if (!group.ok()) {
    *error = group.status().ToString();
    return nullptr;
  }
  return *std::move(group);
}

}  // namespace kc::torch_bridge
