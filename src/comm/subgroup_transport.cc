#include "comm/subgroup_transport.h"

#include <string>
#include <utility>

namespace kc::comm {
namespace {

// Immutable after construction, hence safe for concurrent use wherever the parent is.
class SubgroupTransport final : public Transport {
 public:
  SubgroupTransport(std::shared_ptr<Transport> parent, std::vector<int> ranks, int rank,
                    uint16_t salt)
      : parent_(std::move(parent)), ranks_(std::move(ranks)), rank_(rank), salt_(salt) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  Clock* clock() const override { return parent_->clock(); }

  Result<std::shared_ptr<Request>> Send(int peer, uint64_t tag, std::span<const std::byte> data,
                                        Lane lane) override {
    KC_RETURN_IF_ERROR(CheckPeerAndTag("send", peer, tag));
    return parent_->Send(ranks_[static_cast<size_t>(peer)], ParentTag(tag), data, lane);
  }
  Result<std::shared_ptr<Request>> Recv(int peer, uint64_t tag,
                                        std::span<std::byte> data) override {
    KC_RETURN_IF_ERROR(CheckPeerAndTag("recv", peer, tag));
    return parent_->Recv(ranks_[static_cast<size_t>(peer)], ParentTag(tag), data);
  }

  Status status() const override { return parent_->status(); }
  LinkStats link_stats() const override { return parent_->link_stats(); }
  void Abort(Status reason) override { parent_->Abort(std::move(reason)); }

 private:
  Status CheckPeerAndTag(std::string_view what, int peer, uint64_t tag) const {
    if (peer < 0 || peer >= size() || peer == rank_) {
      return InvalidArgumentError("subgroup " + std::string(what) + ": bad peer " +
                                  std::to_string(peer) + " (rank " + std::to_string(rank_) +
                                  " of " + std::to_string(size()) + ")");
    }
    if (tag > kMaxSubgroupTag) {
      return InvalidArgumentError("subgroup " + std::string(what) + ": tag " + std::to_string(tag) +
                                  " does not fit in 48 bits");
    }
    return OkStatus();
  }
  uint64_t ParentTag(uint64_t tag) const { return (uint64_t{salt_} << kSubgroupTagBits) | tag; }

  // Shared with the creator; outlives every request this view posts on it.
  const std::shared_ptr<Transport> parent_;
  const std::vector<int> ranks_;  // sub-rank -> parent rank
  const int rank_;                // this endpoint's sub-rank
  const uint16_t salt_;
};

}  // namespace

Result<std::unique_ptr<Transport>> CreateSubgroupTransport(std::shared_ptr<Transport> parent,
                                                           std::vector<int> ranks, uint16_t salt) {
  if (parent == nullptr) return InvalidArgumentError("subgroup: null parent transport");
  if (salt == 0) return InvalidArgumentError("subgroup: salt 0 is reserved for the parent");
  if (dynamic_cast<SubgroupTransport*>(parent.get()) != nullptr) {
    return InvalidArgumentError("subgroup: the parent is itself a sub-group view");
  }
  if (ranks.empty()) return InvalidArgumentError("subgroup: no ranks");
  const int n = parent->size();
  std::vector<bool> seen(static_cast<size_t>(n), false);
  int own = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= n) {
      return InvalidArgumentError("subgroup: rank " + std::to_string(r) + " outside [0, " +
                                  std::to_string(n) + ")");
    }
    if (seen[static_cast<size_t>(r)]) {
      return InvalidArgumentError("subgroup: rank " + std::to_string(r) + " listed twice");
    }
    seen[static_cast<size_t>(r)] = true;
    if (r == parent->rank()) own = static_cast<int>(i);
  }
  if (own < 0) {
    return InvalidArgumentError("subgroup: ranks do not contain this rank " +
                                std::to_string(parent->rank()));
  }
  return std::unique_ptr<Transport>(
      std::make_unique<SubgroupTransport>(std::move(parent), std::move(ranks), own, salt));
}

}  // namespace kc::comm
