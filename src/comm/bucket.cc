#include "comm/bucket.h"

#include <cstring>
#include <string>
#include <utility>

#include "base/layer_guard.h"

namespace kc::comm {
namespace {

class GradientBucketsImpl final : public GradientBuckets {
 public:
  struct Bucket {
    std::shared_ptr<Buffer> buffer;
    size_t bytes = 0;
    int pending = 0;  // tensors not yet ready this step
    std::shared_ptr<Work> work;
  };
  struct Slot {
    std::span<std::byte> tensor;
    int bucket = 0;
    size_t offset = 0;  // bytes into the bucket
    bool ready = false;
  };

  GradientBucketsImpl(Communicator* comm, BucketOptions options)
      : comm_(comm), options_(std::move(options)) {}

  Status Init(std::span<const std::span<std::byte>> tensors) {
    const size_t esize = hal::DataTypeSize(options_.dtype);
    if (esize == 0) return InvalidArgumentError("gradient buckets: unknown dtype");
    if (options_.bucket_bytes <= 0) {
      return InvalidArgumentError("gradient buckets: bucket_bytes must be positive, got " +
                                  std::to_string(options_.bucket_bytes));
    }
    std::vector<size_t> sizes;
    for (size_t i = 0; i < tensors.size(); ++i) {
      KC_RETURN_IF_ERROR(CheckBuffer("gradient buckets: tensor " + std::to_string(i), tensors[i],
                                     tensors[i].size() / esize, options_.dtype));
      if (tensors[i].size() % esize != 0) {
        return InvalidArgumentError("gradient buckets: tensor " + std::to_string(i) + " holds " +
                                    std::to_string(tensors[i].size()) +
                                    " bytes, not a whole number of " +
                                    std::string(hal::DataTypeName(options_.dtype)));
      }
      const size_t limit = static_cast<size_t>(options_.bucket_bytes);
      if (sizes.empty() || (sizes.back() > 0 && sizes.back() + tensors[i].size() > limit)) {
        sizes.push_back(0);
      }
      // Keep every tensor 64-byte aligned inside its bucket.
      const size_t offset = (sizes.back() + 63) / 64 * 64;
      slots_.push_back(
          {.tensor = tensors[i], .bucket = static_cast<int>(sizes.size()) - 1, .offset = offset});
      sizes.back() = offset + tensors[i].size();
    }
    for (size_t bytes : sizes) {
      Bucket b;
      b.bytes = bytes;
      KC_ASSIGN_OR_RETURN(b.buffer, comm_->Allocate(bytes));
      buckets_.push_back(std::move(b));
    }
    for (const Slot& s : slots_) ++buckets_[s.bucket].pending;
    return OkStatus();
  }

  int num_buckets() const override { return static_cast<int>(buckets_.size()); }
  int bucket_of(int tensor) const override { return slots_.at(tensor).bucket; }
  std::span<std::byte> view(int tensor) override {
    const Slot& s = slots_.at(tensor);
    return buckets_[s.bucket].buffer->bytes().subspan(s.offset, s.tensor.size());
  }

  void AdoptViews() override {
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) slots_[i].tensor = view(i);
  }

  Status MarkReady(int tensor) override {
    KC_LAYER_ENTRY(Layer::kComm, "communicator");
    if (tensor < 0 || tensor >= static_cast<int>(slots_.size())) {
      return InvalidArgumentError("gradient buckets: tensor " + std::to_string(tensor) +
                                  " outside [0, " + std::to_string(slots_.size()) + ")");
    }
    Slot& s = slots_[tensor];
    if (s.ready) {
      return FailedPreconditionError("gradient buckets: tensor " + std::to_string(tensor) +
                                     " marked ready twice in one step");
    }
    std::span<std::byte> v = view(tensor);
    if (v.data() != s.tensor.data() && !v.empty()) {
      std::memcpy(v.data(), s.tensor.data(), v.size());
    }
    s.ready = true;
    --buckets_[s.bucket].pending;
    // Start complete buckets in index order only, so every rank submits the same sequence.
    while (next_launch_ < num_buckets() && buckets_[next_launch_].pending == 0) {
      Bucket& b = buckets_[next_launch_];
      const size_t esize = hal::DataTypeSize(options_.dtype);
      KC_ASSIGN_OR_RETURN(b.work,
                          comm_->Allreduce(b.buffer->bytes().first(b.bytes), b.bytes / esize,
                                           options_.dtype, options_.op, options_.op_options));
      ++next_launch_;
    }
    return OkStatus();
  }

  Status Finish() override {
    KC_LAYER_ENTRY(Layer::kComm, "communicator");
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i].ready) {
        return FailedPreconditionError("gradient buckets: tensor " + std::to_string(i) +
                                       " was not marked ready this step");
      }
    }
    Status first;
    for (int b = 0; b < num_buckets(); ++b) {
      if (buckets_[b].work == nullptr) {  // its start failed in MarkReady
        if (first.ok())
          first = comm_->status().ok()
                      ? InternalError("gradient bucket " + std::to_string(b) + " never started")
                      : comm_->status();
        continue;
      }
      Status s = buckets_[b].work->Wait();
      if (first.ok() && !s.ok()) first = s.WithContext("gradient bucket " + std::to_string(b));
      buckets_[b].work.reset();
    }
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
      Slot& s = slots_[i];
      std::span<std::byte> v = view(i);
      if (first.ok() && v.data() != s.tensor.data() && !v.empty()) {
        std::memcpy(s.tensor.data(), v.data(), v.size());
      }
      s.ready = false;
      ++buckets_[s.bucket].pending;
    }
    next_launch_ = 0;
    return first;
  }

 private:
  Communicator* const comm_;
  const BucketOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
  int next_launch_ = 0;  // buckets [0, next_launch_) have started this step
};

}  // namespace

Result<std::unique_ptr<GradientBuckets>> GradientBuckets::Create(
    Communicator* comm, std::span<const std::span<std::byte>> tensors,
    const BucketOptions& options) {
  if (comm == nullptr) return InvalidArgumentError("gradient buckets: communicator is null");
  auto b = std::make_unique<GradientBucketsImpl>(comm, options);
  KC_RETURN_IF_ERROR(b->Init(tensors));
  return std::unique_ptr<GradientBuckets>(std::move(b));
}

Status AllreduceCoalesced(Communicator& comm, std::span<const std::span<std::byte>> tensors,
                          const BucketOptions& options) {
  KC_ASSIGN_OR_RETURN(std::unique_ptr<GradientBuckets> b,
                      GradientBuckets::Create(&comm, tensors, options));
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) KC_RETURN_IF_ERROR(b->MarkReady(i));
  return b->Finish();
}

}  // namespace kc::comm
