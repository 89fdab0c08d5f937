// A Transport whose peers are reached through different transports: the ranks of this host
// through the shared-memory one, the others through TCP. Each peer has one route.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "comm/transport.h"

namespace kc::comm::internal {

struct Route {
  std::shared_ptr<Transport> transport;  // null for this rank itself
  int peer = -1;                         // the peer's rank in that transport
};

class RoutingTransport final : public Transport {
 public:
  // routes[r] reaches rank r; routes[rank] is unused. `clock` outlives this.
  RoutingTransport(int rank, std::vector<Route> routes, Clock* clock)
      : rank_(rank), routes_(std::move(routes)), clock_(clock) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(routes_.size()); }
  Clock* clock() const override { return clock_; }

  Result<std::shared_ptr<Request>> Send(int peer, uint64_t tag, std::span<const std::byte> data,
                                        Lane lane) override {
    KC_ASSIGN_OR_RETURN(const Route* r, RouteTo(peer));
    return r->transport->Send(r->peer, tag, data, lane);
  }
  Result<std::shared_ptr<Request>> Recv(int peer, uint64_t tag,
                                        std::span<std::byte> data) override {
    KC_ASSIGN_OR_RETURN(const Route* r, RouteTo(peer));
    return r->transport->Recv(r->peer, tag, data);
  }

  Status status() const override {
    for (const Route& r : routes_) {
      if (r.transport == nullptr) continue;
      if (Status s = r.transport->status(); !s.ok()) return s;
    }
    return OkStatus();
  }
  void Abort(Status reason) override {
    for (const Route& r : routes_) {
      if (r.transport != nullptr) r.transport->Abort(reason);
    }
  }
  // Each transport routed through once (several peers share one).
  LinkStats link_stats() const override {
    LinkStats out;
    std::vector<const Transport*> seen;
    for (const Route& r : routes_) {
      if (r.transport == nullptr ||
          std::find(seen.begin(), seen.end(), r.transport.get()) != seen.end()) {
        continue;
      }
      seen.push_back(r.transport.get());
      out += r.transport->link_stats();
    }
    return out;
  }

 private:
  Result<const Route*> RouteTo(int peer) const {
    if (peer < 0 || peer >= size() || peer == rank_ || routes_[peer].transport == nullptr) {
      return InvalidArgumentError("transport: no route to rank " + std::to_string(peer) +
                                  " from rank " + std::to_string(rank_));
    }
    return &routes_[peer];
  }

  const int rank_;
  const std::vector<Route> routes_;
  Clock* const clock_;
};

}  // namespace kc::comm::internal
