// A Transport view over a subset of a parent transport's ranks, so that any collective can
// run inside a sub-group (the ranks of one host, the leaders of every host) without a new
// rendezvous. Sub-group traffic is kept apart from the parent's by a salt in the tag.
//
//   KC_ASSIGN_OR_RETURN(auto host, CreateSubgroupTransport(parent, {0, 1, 2, 3}, /*salt=*/7));
//   KC_RETURN_IF_ERROR(Allreduce(*host, {...}));
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "comm/transport.h"

namespace kc::comm {

// Tags of a sub-group view are below 2^48; the view sends them on the parent as
// (uint64_t(salt) << 48) | tag. Traffic on the parent itself should keep its tags below
// 2^48 too (salt 0, reserved for it), so that it never meets a view's messages.
inline constexpr int kSubgroupTagBits = 48;
inline constexpr uint64_t kMaxSubgroupTag = (uint64_t{1} << kSubgroupTagBits) - 1;

// Creates a view of `parent` restricted to `ranks` (parent ranks, distinct, containing
// parent->rank()). Sub-rank i is parent rank ranks[i], in the order given, so every member
// must pass the same `ranks` and `salt`. Views with different salts over the same parent are
// independent; views with equal salts are independent only if their rank sets share no pair
// of ranks that message each other with equal tags (disjoint sets always are).
//
// The view: rank() / size() are the sub-group's; Send/Recv map the peer to ranks[peer] and
// the tag to (salt << 48) | tag, and return kInvalidArgument for a tag above
// kMaxSubgroupTag or a bad peer; clock() and status() are the parent's. Abort aborts the
// PARENT: a failure is sticky for the whole group, not only the sub-group, because the
// parent's channels are shared and a half-failed group cannot be reasoned about.
// Safe for concurrent use (as the parent); immutable after construction.
//
// kInvalidArgument: a null parent, salt 0, an empty `ranks`, a rank out of
// [0, parent->size()), a duplicate, `ranks` without parent->rank(), or a parent that is
// itself a sub-group view (nesting would need two salts in one tag). Sends nothing.
// The view shares ownership of `parent`; a caller that owns the parent elsewhere may pass a
// shared_ptr with a no-op deleter, and must then keep the parent alive as long as the view.
Result<std::unique_ptr<Transport>> CreateSubgroupTransport(std::shared_ptr<Transport> parent,
                                                           std::vector<int> ranks, uint16_t salt);

}  // namespace kc::comm
