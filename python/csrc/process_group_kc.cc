// The torch.distributed backend "kc": a c10d::ProcessGroup whose collectives run on kc's
// communicator (shared memory between the ranks of a host, TCP between hosts, kc's lanes and
// rate limits), for CPU tensors. `import kuangchao.torch` registers it; then
// torch.distributed.init_process_group("kc") works as with "gloo", DDP included.
//
// Compiled as C++17 against PyTorch's headers (Debian's python3-torch / libtorch-dev 1.13);
// kc itself is behind kc_bridge.h. Each operation is enqueued on the communicator; its Work's
// wait() waits on kc directly, and its future (what DDP's reducer chains on) is completed by
// the first of that wait and a completion thread that finishes the operations in order.
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "python/csrc/kc_bridge.h"

namespace kc::torch_bridge {
namespace {

// kc's store calls over a c10d::Store (the process group's PrefixStore).
class C10dStore final : public StoreBackend {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  std::string Set(const std::string& key, const std::string& value) override {
    return Guard([&] { store_->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
  }
  std::string Get(const std::string& key, int64_t timeout_ms, std::string* value) override {
    return Guard([&] {
      store_->wait({key}, std::chrono::milliseconds(timeout_ms));
      const std::vector<uint8_t> v = store_->get(key);
      value->assign(v.begin(), v.end());
    });
  }
  std::string Wait(const std::vector<std::string>& keys, int64_t timeout_ms) override {
    return Guard([&] { store_->wait(keys, std::chrono::milliseconds(timeout_ms)); });
  }
  std::string Add(const std::string& key, int64_t delta, int64_t* value) override {
    return Guard([&] { *value = store_->add(key, delta); });
  }
  std::string CompareSet(const std::string& key, const std::string& expected,
                         const std::string& desired, std::string* current) override {
    return Guard([&] {
      const std::vector<uint8_t> v =
          store_->compareSet(key, std::vector<uint8_t>(expected.begin(), expected.end()),
                             std::vector<uint8_t>(desired.begin(), desired.end()));
      current->assign(v.begin(), v.end());
    });
  }
  std::string Delete(const std::string& key, bool* existed) override {
    return Guard([&] { *existed = store_->deleteKey(key); });
  }
  std::string Check(const std::vector<std::string>& keys, bool* all) override {
    return Guard([&] { *all = store_->check(keys); });
  }

 private:
  // The store's exceptions as messages; its waits report timeouts in their text.
  template <typename F>
  static std::string Guard(F&& f) {
    try {
      f();
      return std::string();
    } catch (const std::exception& e) {
      const std::string what = e.what();
      if (what.find("imeout") != std::string::npos || what.find("imed out") != std::string::npos) {
        return "timeout: " + what;
      }
      return what;
    }
  }

  const c10::intrusive_ptr<c10d::Store> store_;
};

Dtype ToDtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return Dtype::kF32;
    case at::kDouble:
      return Dtype::kF64;
    case at::kInt:
      return Dtype::kI32;
    case at::kLong:
      return Dtype::kI64;
    case at::kBFloat16:
      return Dtype::kBf16;
    default:
      TORCH_CHECK(false, "backend kc: tensors of ", t.scalar_type(),
                  " are not supported (float32, float64, int32, int64, bfloat16 are)");
  }
}

Op ToOp(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return Op::kSum;
    case c10d::ReduceOp::AVG:
      return Op::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return Op::kProd;
    case c10d::ReduceOp::MIN:
      return Op::kMin;
    case c10d::ReduceOp::MAX:
      return Op::kMax;
    default:
      TORCH_CHECK(false, "backend kc: reduce op ", static_cast<int>(op.op_),
                  " is not supported (sum, avg, product, min, max are)");
  }
}

void CheckTensor(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "backend kc: tensors must be on the CPU, got ", t.device());
  TORCH_CHECK(t.is_contiguous(), "backend kc: tensors must be contiguous");
}

const at::Tensor& One(const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(tensors.size() == 1, "backend kc: one tensor per call, got ", tensors.size());
  CheckTensor(tensors[0]);
  return tensors[0];
}

std::unique_ptr<Handle> Check(std::unique_ptr<Handle> handle, const std::string& error) {
  TORCH_CHECK(handle != nullptr, "backend kc: ", error);
  return handle;
}

class ProcessGroupKc final : public c10d::ProcessGroup {
 public:
  ProcessGroupKc(std::unique_ptr<Group> group, int rank, int size)
      : ProcessGroup(rank, size), group_(std::move(group)) {
    completer_ = std::thread([this] { Complete(); });
  }
  ~ProcessGroupKc() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    completer_.join();
    group_.reset();
  }

  const std::string getBackendName() const override { return "kc"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const at::Tensor& t = One(tensors);
    std::string error;
    return Enqueue(Check(group_->Broadcast(t.data_ptr(), t.nbytes(),
                                           static_cast<int>(opts.rootRank), Lane::kControl, &error),
                         error),
                   tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const at::Tensor& t = One(tensors);
    std::string error;
    return Enqueue(Check(group_->Allreduce(t.data_ptr(), static_cast<size_t>(t.numel()), ToDtype(t),
                                           ToOp(opts.reduceOp), Lane::kGradient, &error),
                         error),
                   tensors);
  }

  // Several tensors of one dtype: one all-reduce over their concatenation.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "backend kc: allreduce_coalesced of no tensors");
    for (const at::Tensor& t : tensors) {
      CheckTensor(t);
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                  "backend kc: allreduce_coalesced of tensors of different dtypes");
    }
    at::Tensor flat = at::cat(Flattened(tensors));
    std::string error;
    auto handle =
        Check(group_->Allreduce(flat.data_ptr(), static_cast<size_t>(flat.numel()), ToDtype(flat),
                                ToOp(opts.reduceOp), Lane::kGradient, &error),
              error);
    std::vector<at::Tensor> outputs = tensors;
    return Enqueue(std::move(handle), outputs, [flat, outputs]() mutable {
      int64_t at = 0;
      for (at::Tensor& t : outputs) {
        t.view({-1}).copy_(flat.narrow(0, at, t.numel()));
        at += t.numel();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const at::Tensor& t = One(tensors);
    std::string error;
    return Enqueue(Check(group_->Reduce(t.data_ptr(), static_cast<size_t>(t.numel()), ToDtype(t),
                                        ToOp(opts.reduceOp), static_cast<int>(opts.rootRank),
                                        Lane::kGradient, &error),
                         error),
                   tensors);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    const at::Tensor& in = One(inputs);
    TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()),
                "backend kc: allgather needs one list of ", getSize(), " output tensors");
    for (const at::Tensor& o : outputs[0]) {
      TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                  "backend kc: allgather outputs must match the input's size and dtype");
    }
    at::Tensor buffer = at::empty({getSize() * in.numel()}, in.options());
    buffer.narrow(0, getRank() * in.numel(), in.numel()).copy_(in.view({-1}));
    std::string error;
    auto handle = Check(group_->Allgather(buffer.data_ptr(), static_cast<size_t>(buffer.numel()),
                                          ToDtype(in), Lane::kGradient, &error),
                        error);
    std::vector<at::Tensor> outs = outputs[0];
    const int64_t n = in.numel();
    return Enqueue(std::move(handle), outs, [buffer, outs, n]() mutable {
      for (size_t r = 0; r < outs.size(); ++r) {
        outs[r].view({-1}).copy_(buffer.narrow(0, static_cast<int64_t>(r) * n, n));
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    CheckTensor(output);
    CheckTensor(input);
    TORCH_CHECK(
        output.numel() == getSize() * input.numel() && output.scalar_type() == input.scalar_type(),
        "backend kc: _allgather_base output must hold size() inputs");
    output.view({-1}).narrow(0, getRank() * input.numel(), input.numel()).copy_(input.view({-1}));
    std::string error;
    std::vector<at::Tensor> outs = {output};
    return Enqueue(Check(group_->Allgather(output.data_ptr(), static_cast<size_t>(output.numel()),
                                           ToDtype(output), Lane::kGradient, &error),
                         error),
                   outs);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor& out = One(outputs);
    TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()),
                "backend kc: reduce_scatter needs one list of ", getSize(), " input tensors");
    at::Tensor buffer = at::cat(Flattened(inputs[0]));
    TORCH_CHECK(buffer.numel() == getSize() * out.numel(),
                "backend kc: reduce_scatter inputs must each match the output's size");
    std::string error;
    auto handle =
        Check(group_->ReduceScatter(buffer.data_ptr(), static_cast<size_t>(buffer.numel()),
                                    ToDtype(out), ToOp(opts.reduceOp), Lane::kGradient, &error),
              error);
    at::Tensor o = out;
    const int64_t rank = getRank();
    return Enqueue(std::move(handle), outputs, [buffer, o, rank]() mutable {
      o.view({-1}).copy_(buffer.narrow(0, rank * o.numel(), o.numel()));
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    CheckTensor(output);
    CheckTensor(input);
    TORCH_CHECK(input.numel() == getSize() * output.numel(),
                "backend kc: _reduce_scatter_base input must hold size() outputs");
    at::Tensor buffer = input.clone();
    std::string error;
    auto handle =
        Check(group_->ReduceScatter(buffer.data_ptr(), static_cast<size_t>(buffer.numel()),
                                    ToDtype(output), ToOp(opts.reduceOp), Lane::kGradient, &error),
              error);
    at::Tensor o = output;
    const int64_t rank = getRank();
    std::vector<at::Tensor> outs = {output};
    return Enqueue(std::move(handle), outs, [buffer, o, rank]() mutable {
      o.view({-1}).copy_(buffer.narrow(0, rank * o.numel(), o.numel()));
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    std::string error;
    std::vector<at::Tensor> none;
    return Enqueue(Check(group_->Barrier(&error), error), none);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    const at::Tensor& t = One(tensors);
    std::string error;
    return Enqueue(
        Check(group_->Send(t.data_ptr(), t.nbytes(), dst, static_cast<uint64_t>(tag), &error),
              error),
        tensors);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    const at::Tensor& t = One(tensors);
    std::string error;
    return Enqueue(
        Check(group_->Recv(t.data_ptr(), t.nbytes(), src, static_cast<uint64_t>(tag), &error),
              error),
        tensors);
  }

  std::string allreduce_algorithm(int64_t bytes) const { return group_->AllreduceAlgorithm(bytes); }

 private:
  // One operation: the kc handle, and what completing it means for torch.
  struct Op {
    std::unique_ptr<Handle> handle;
    c10::intrusive_ptr<c10::ivalue::Future> future;
    std::vector<at::Tensor> outputs;
    std::function<void()> after;  // copies results into the outputs, when there is a copy
    std::mutex mu;
    bool finished = false;     // guarded by mu
    std::exception_ptr error;  // guarded by mu; set once finished

    // Waits for the kc operation and, the first time, copies its results and completes the
    // future. Any number of threads may call it: each returns once it is finished.
    void Finish() {
      const std::string failure = handle->Wait();  // concurrent waits are fine
      bool complete = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (finished) return;
        finished = true;
        if (!failure.empty()) {
          error = std::make_exception_ptr(std::runtime_error("backend kc: " + failure));
        } else {
          try {
            if (after) after();
            complete = true;
          } catch (...) {
            error = std::current_exception();
          }
        }
      }
      // Outside the lock: the future's callbacks (DDP's) may enqueue more work.
      if (complete) {
        future->markCompleted(c10::IValue(outputs));
      } else {
        future->setError(error);
      }
    }
  };

  // The Work torch gets: wait() waits on kc directly (no hand-off to another thread on the
  // path of a blocking collective); getFuture() is completed by whichever finishes first.
  class WorkKc final : public c10d::Work {
   public:
    explicit WorkKc(std::shared_ptr<Op> op) : op_(std::move(op)) {}
    bool isCompleted() override {
      std::lock_guard<std::mutex> lock(op_->mu);
      return op_->finished;
    }
    bool isSuccess() const override {
      std::lock_guard<std::mutex> lock(op_->mu);
      return op_->finished && !op_->error;
    }
    std::exception_ptr exception() const override {
      std::lock_guard<std::mutex> lock(op_->mu);
      return op_->error;
    }
    std::vector<at::Tensor> result() override { return op_->outputs; }
    bool wait(std::chrono::milliseconds /* kc's own deadline bounds it */) override {
      op_->Finish();
      std::lock_guard<std::mutex> lock(op_->mu);
      if (op_->error) std::rethrow_exception(op_->error);
      return true;
    }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return op_->future; }

   private:
    const std::shared_ptr<Op> op_;
  };

  static std::vector<at::Tensor> Flattened(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> flat;
    for (const at::Tensor& t : tensors) flat.push_back(t.reshape({-1}));
    return flat;
  }

  c10::intrusive_ptr<c10d::Work> Enqueue(std::unique_ptr<Handle> handle,
                                         const std::vector<at::Tensor>& outputs,
                                         std::function<void()> after = nullptr) {
    auto op = std::make_shared<Op>();
    op->handle = std::move(handle);
    op->future =
        c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    op->outputs = outputs;
    op->after = std::move(after);
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(op);
    }
    cv_.notify_one();
    return c10::make_intrusive<WorkKc>(std::move(op));
  }

  // Finishes the operations in order, so that futures nobody waits on directly (DDP's) are
  // completed: kc completes a group's operations in the order enqueued.
  void Complete() {
    for (;;) {
      std::shared_ptr<Op> op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
        if (pending_.empty()) return;  // stopping, and nothing left
        op = std::move(pending_.front());
        pending_.pop_front();
      }
      op->Finish();
    }
  }

  std::unique_ptr<Group> group_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> pending_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::thread completer_;                    // started last, joined first
};

std::string Env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

c10::intrusive_ptr<c10d::ProcessGroup> CreateProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const std::chrono::duration<float>& timeout) {
  GroupOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout_ms =
      static_cast<int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
  o.transport = Env("KC_TRANSPORT", "auto");
  o.comm_limits_path = Env("KC_COMM_LIMITS");
  o.job_name = Env("KC_JOB_NAME", Env("TORCHELASTIC_RUN_ID").c_str());
  std::string error;
  if (const std::string beat_file = Env("KC_HEARTBEAT_FILE"); !beat_file.empty()) {
    // Under kc run --heartbeat-timeout: this process beats for its rank from now on.
    const double period = std::strtod(Env("KC_HEARTBEAT_PERIOD", "1").c_str(), nullptr);
    error = StartHeartbeat(beat_file, period > 0 ? period : 1.0);
    TORCH_CHECK(error.empty(), "backend kc: heartbeats (KC_HEARTBEAT_FILE): ", error);
  }
  std::unique_ptr<Group> group = Group::Create(std::make_shared<C10dStore>(store), o, &error);
  TORCH_CHECK(group != nullptr, "backend kc: cannot form the group: ", error);
  return c10::make_intrusive<ProcessGroupKc>(std::move(group), rank, size);
}

}  // namespace
}  // namespace kc::torch_bridge

PYBIND11_MODULE(_kc_torch, m) {
  m.doc() = "kc's torch.distributed backend (import kuangchao.torch registers it as \"kc\")";
  m.def("create_process_group", &kc::torch_bridge::CreateProcessGroup,
        "The process group torch.distributed makes for backend \"kc\"");
  m.def(
      "allreduce_algorithm",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, int64_t bytes) {
        auto* kc = dynamic_cast<kc::torch_bridge::ProcessGroupKc*>(pg.get());
        TORCH_CHECK(kc != nullptr, "not a process group of backend kc");
        return kc->allreduce_algorithm(bytes);
      },
      "The algorithm kc runs an all-reduce of this many bytes with");
}
