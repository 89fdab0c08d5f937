// The rendezvous store's wire protocol (src/comm/doc/store_protocol.md), as the TCP store's
// server and client read it: the input is a stream of frames. Each header and body is decoded
// as a request (then its limits checked and, when it passes, applied to a store as the server
// would) and as a reply; what decodes re-encodes to the same bytes.
#include "comm/internal/store_wire.h"

#include "comm/hash_store.h"
#include "fuzz/fuzz_support.h"

namespace {

using kc::comm::internal::Header;
using kc::comm::internal::Op;
using kc::comm::internal::Reply;
using kc::comm::internal::Request;

// What the server does with a request it accepted (never waiting: deadlines are now).
void Apply(kc::comm::HashStore& store, const Request& r) {
  const kc::TimePoint now = store.clock()->Now();
  std::vector<std::string> keys(r.keys.begin(), r.keys.end());
  switch (r.op) {
    case Op::kSet:
      store.Set(r.keys[0], r.value).IgnoreError();
      break;
    case Op::kGet:
      store.Get(r.keys[0], now).status().IgnoreError();
      break;
    case Op::kWait:
      store.Wait(keys, now).IgnoreError();
      break;
    case Op::kAdd:
      store.Add(r.keys[0], r.delta).status().IgnoreError();
      break;
    case Op::kCompareSet:
      store.CompareSet(r.keys[0], r.expected, r.value).status().IgnoreError();
      break;
    case Op::kDelete:
      store.Delete(r.keys[0]).status().IgnoreError();
      break;
    case Op::kHello:  // a connection's token: nothing in the map changes
      break;
    case Op::kCheck:
      store.Check(keys).status().IgnoreError();
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kc::comm::HashStore store;
  std::string_view in = kc::fuzz::Text(data, size);
  while (in.size() >= kc::comm::internal::kHeaderBytes) {
    Header h;
    if (!kc::comm::internal::DecodeHeader(reinterpret_cast<const unsigned char*>(in.data()), &h)) {
      return 0;  // the server closes the connection
    }
    in.remove_prefix(kc::comm::internal::kHeaderBytes);
    if (h.body_bytes > in.size()) return 0;  // the rest of the frame never came
    const std::string_view body = in.substr(0, h.body_bytes);
    in.remove_prefix(h.body_bytes);
    Request r;
    if (h.code == kc::ErrorCode::kOk && kc::comm::internal::DecodeRequestBody(h, body, &r)) {
      std::string again;
      kc::comm::internal::EncodeRequest(r, &again);
      if (again.substr(kc::comm::internal::kHeaderBytes) != body) abort();
      if (kc::comm::internal::CheckRequestLimits(r).ok()) Apply(store, r);
    }
    Reply reply;
    if (kc::comm::internal::DecodeReplyBody(h, body, &reply)) {
      std::string again;
      kc::comm::internal::EncodeReply(reply, &again);
    }
  }
  return 0;
}
