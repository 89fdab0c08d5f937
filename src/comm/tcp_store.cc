#include "comm/tcp_store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/layer_guard.h"
#include "base/log.h"
#include "base/mutex.h"
#include "comm/hash_store.h"
#include "comm/internal/store_wire.h"
#include "hal/fd.h"
#include "hal/socket.h"

namespace kc::comm {
namespace {

using hal::HostPort;
using hal::PollTimeoutMs;

using hal::Fd;
using internal::Header;
using internal::kHeaderBytes;
using internal::Op;
using internal::Reply;
using internal::Request;

std::string Errno() { return std::strerror(errno); }

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// ---------------------------------------------------------------------------------------
// Server.

// Connections stop being read while this much of their output is unsent.
constexpr size_t kMaxOutputBacklogBytes = 2 * kMaxValueBytes;
// epoll tags below the first connection id.
constexpr uint64_t kWakeTag = 0;
constexpr uint64_t kListenerTag = 1;
constexpr uint64_t kFirstConnectionId = 2;

// Whether `a` equals the token `b`, in a time that does not depend on where they differ.
bool SameToken(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(1, b.size())]);
  }
  return diff == 0;
}

// One client connection; driven by the server thread only.
struct Connection {
  Connection(uint64_t i, Fd f) : id(i), fd(std::move(f)) {}

  const uint64_t id;
  Fd fd;
  std::string in;     // received bytes not yet parsed
  uint64_t skip = 0;  // body bytes of an oversize request still to be discarded
  std::string out;    // bytes to send; out_sent of them are sent
  size_t out_sent = 0;
  uint32_t events = 0;         // the epoll interest registered now
  std::set<uint64_t> waiters;  // parked requests
  bool broken = false;         // peer closed, I/O error or malformed frame: close it
  bool authenticated = false;  // it said the server's token (kHello)

  size_t backlog() const { return out.size() - out_sent; }
};

// A Get or Wait request parked until its keys exist or its deadline passes.
struct Waiter {
  uint64_t connection = 0;
  uint64_t request_id = 0;
  Op op = Op::kGet;
  std::vector<std::string> keys;
  TimePoint deadline;
};

class TcpStoreServerImpl final : public TcpStoreServer {
 public:
  TcpStoreServerImpl(Fd listen_fd, Fd wake_fd, Fd epoll_fd, int port, std::string token)
      : port_(port),
        token_(std::move(token)),
        listen_fd_(std::move(listen_fd)),
        wake_fd_(std::move(wake_fd)),
        epoll_fd_(std::move(epoll_fd)),
        thread_([this] { Run(); }) {}
  ~TcpStoreServerImpl() override { Stop(); }
  TcpStoreServerImpl(const TcpStoreServerImpl&) = delete;
  TcpStoreServerImpl& operator=(const TcpStoreServerImpl&) = delete;

  int port() const override { return port_; }

  void Stop() override {
    // Concurrent callers wait in call_once until the first has joined the thread.
    std::call_once(stop_once_, [this] {
      const uint64_t one = 1;
      // An eventfd write of 1 cannot fail short of a counter overflow.
      [[maybe_unused]] ssize_t n = write(wake_fd_.get(), &one, sizeof(one));
      thread_.join();
    });
  }

 private:
  void Run();
  void Serve();
  void Accept();
  void Read(Connection& c);
  void Consume(Connection& c);
  void Execute(Connection& c, const Header& h, std::string_view body);
  void Park(Connection& c, const Request& r);
  void KeyChanged(std::string_view key);
  bool TryComplete(uint64_t waiter_id);
  void ExpireWaiters(TimePoint now);
  void RemoveWaiter(uint64_t waiter_id);
  void Send(Connection& c, const Reply& reply);
  void SendError(Connection& c, const Request& r, const Status& s);
  void Flush(Connection& c);
  void Settle(Connection& c);
  void Close(uint64_t id);
  void SetInterest(int fd, uint64_t tag, uint32_t events, int op);

  // Immutable after construction.
  const int port_;
  const std::string token_;  // "": any client

  // Owned by the server thread while it runs; it closes the listener and every connection
  // when it ends, the other descriptors close with the object.
  Fd listen_fd_;
  Fd wake_fd_;  // written by Stop, watched by the server thread
  Fd epoll_fd_;
  bool accept_paused_ = false;  // out of descriptors: the listener is not watched
  HashStore map_;               // real clock; only its non-blocking calls are used
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  uint64_t next_connection_id_ = kFirstConnectionId;
  std::set<uint64_t> dirty_;  // connections with new output or a state change to settle
  std::map<uint64_t, Waiter> waiters_;
  uint64_t next_waiter_id_ = 1;
  std::unordered_map<std::string, std::set<uint64_t>> waiters_by_key_;
  std::set<std::pair<TimePoint, uint64_t>> waiters_by_deadline_;

  std::once_flag stop_once_;
  std::jthread thread_;  // last: joined before the members it uses are destroyed
};

void TcpStoreServerImpl::SetInterest(int fd, uint64_t tag, uint32_t events, int op) {
  epoll_event ev{.events = events, .data = {.u64 = tag}};
  // Fails only for a descriptor that is not open or not registered, which would be a bug.
  KC_CHECK(epoll_ctl(epoll_fd_.get(), op, fd, &ev) == 0) << "epoll_ctl: " << Errno();
}

void TcpStoreServerImpl::Run() {
  Serve();
  // Stopped (or failed): every client sees its connection close and gets kUnavailable, and
  // clients still in the listener's backlog are refused rather than left waiting.
  listen_fd_.Reset();
  waiters_.clear();
  waiters_by_key_.clear();
  waiters_by_deadline_.clear();
  connections_.clear();
}

void TcpStoreServerImpl::Serve() {
  std::vector<epoll_event> events(64);
  for (;;) {
    const int timeout_ms =
        waiters_by_deadline_.empty() ? -1 : PollTimeoutMs(waiters_by_deadline_.begin()->first);
    const int n =
        epoll_wait(epoll_fd_.get(), events.data(), static_cast<int>(events.size()), timeout_ms);
    if (n < 0 && errno != EINTR) {
      KC_LOG(ERROR) << "tcp store server stopped: epoll_wait failed " << log::KV("port", port_)
                    << " " << log::KV("error", Errno());
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) return;  // Stop()
      if (tag == kListenerTag) {
        Accept();
        continue;
      }
      auto it = connections_.find(tag);
      if (it == connections_.end()) continue;  // closed earlier in this batch
      Connection& c = *it->second;
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) Read(c);
      if (events[i].events & EPOLLOUT) Flush(c);
      dirty_.insert(c.id);
    }
    ExpireWaiters(std::chrono::steady_clock::now());
    // Replies may have been queued on any connection (a Set wakes other clients' Gets).
    while (!dirty_.empty()) {
      const uint64_t id = *dirty_.begin();
      dirty_.erase(dirty_.begin());
      auto it = connections_.find(id);
      if (it != connections_.end()) Settle(*it->second);
    }
  }
}

void TcpStoreServerImpl::Accept() {
  for (;;) {
    const int fd = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Stop watching the listener until a connection closes, or it would wake us forever.
        KC_LOG(WARNING) << "tcp store server out of descriptors, pausing accepts "
                        << log::KV("port", port_) << " "
                        << log::KV("connections", connections_.size());
        SetInterest(listen_fd_.get(), kListenerTag, 0, EPOLL_CTL_MOD);
        accept_paused_ = true;
        return;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // EAGAIN: no more pending connections
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // replies go out at once
    const uint64_t id = next_connection_id_++;
    auto c = std::make_unique<Connection>(id, Fd(fd));
    c->events = EPOLLIN;
    SetInterest(fd, id, c->events, EPOLL_CTL_ADD);
    connections_.emplace(id, std::move(c));
  }
}

void TcpStoreServerImpl::Read(Connection& c) {
  // At most 16 reads per turn, so one client sending a large value cannot starve the others.
  char scratch[256 * 1024];
  for (int reads = 0; reads < 16 && !c.broken; ++reads) {
    const ssize_t n = recv(c.fd.get(), scratch, sizeof(scratch), 0);
    if (n > 0) {
      size_t got = static_cast<size_t>(n);
      const char* p = scratch;
      // The body of an oversize request is dropped as it arrives, never buffered.
      const size_t dropped = static_cast<size_t>(std::min<uint64_t>(c.skip, got));
      c.skip -= dropped;
      c.in.append(p + dropped, got - dropped);
      Consume(c);
      if (c.backlog() > kMaxOutputBacklogBytes) return;  // let the client read first
      continue;
    }
    // End of stream, with or without a partial request: the client is gone.
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c.broken = true;
    return;
  }
}

void TcpStoreServerImpl::Consume(Connection& c) {
  size_t pos = 0;
  // Parsing pauses while a large reply backlog is unsent (Settle resumes it), so a client
  // that pipelines requests without reading cannot make the server buffer without bound.
  while (!c.broken && c.skip == 0 && c.backlog() <= kMaxOutputBacklogBytes &&
         c.in.size() - pos >= kHeaderBytes) {
    Header h;
    if (!internal::DecodeHeader(reinterpret_cast<const unsigned char*>(c.in.data() + pos), &h) ||
        h.code != ErrorCode::kOk) {
      c.broken = true;  // not a store client, or out of step: hang up
      break;
    }
    if (h.body_bytes > internal::kMaxRequestBodyBytes) {
      // Answer now and drop the body as it comes; the connection stays usable.
      Send(c, {.op = h.op,
               .request_id = h.request_id,
               .code = ErrorCode::kInvalidArgument,
               .message = "store " + std::string(internal::OpName(h.op)) + ": request of " +
                          std::to_string(h.body_bytes) + " bytes exceeds the limit of " +
                          std::to_string(internal::kMaxRequestBodyBytes)});
      pos += kHeaderBytes;
      const size_t dropped = std::min<size_t>(h.body_bytes, c.in.size() - pos);
      pos += dropped;
      c.skip = h.body_bytes - dropped;
      continue;
    }
    if (c.in.size() - pos < kHeaderBytes + h.body_bytes) {
      c.in.reserve(pos + kHeaderBytes + h.body_bytes);
      break;  // the rest of the body has not arrived
    }
    Execute(c, h, std::string_view(c.in).substr(pos + kHeaderBytes, h.body_bytes));
    pos += kHeaderBytes + h.body_bytes;
  }
  c.in.erase(0, pos);
}

void TcpStoreServerImpl::Send(Connection& c, const Reply& reply) {
  internal::EncodeReply(reply, &c.out);
  dirty_.insert(c.id);
}

void TcpStoreServerImpl::SendError(Connection& c, const Request& r, const Status& s) {
  const std::string message = s.message();
  Send(c, {.op = r.op, .request_id = r.request_id, .code = s.code(), .message = message});
}

void TcpStoreServerImpl::Execute(Connection& c, const Header& h, std::string_view body) {
  Request r;
  if (!internal::DecodeRequestBody(h, body, &r)) {
    c.broken = true;  // fields overrun the body, or bytes are left over
    return;
  }
  if (Status s = internal::CheckRequestLimits(r); !s.ok()) return SendError(c, r, s);
  Reply reply{.op = r.op, .request_id = r.request_id};
  if (r.op == Op::kHello) {
    if (!token_.empty() && !SameToken(r.keys[0], token_)) {
      return SendError(c, r, PermissionDeniedError("store hello: not this store's token"));
    }
    c.authenticated = true;
    return Send(c, reply);
  }
  if (!token_.empty() && !c.authenticated) {
    return SendError(c, r,
                     PermissionDeniedError("store " + std::string(internal::OpName(r.op)) +
                                           ": this store takes only clients with its token"));
  }
  switch (r.op) {
    case Op::kHello:
      return;  // answered above
    case Op::kSet: {
      if (Status s = map_.Set(r.keys[0], r.value); !s.ok()) return SendError(c, r, s);
      Send(c, reply);
      KeyChanged(r.keys[0]);
      return;
    }
    case Op::kGet: {
      std::optional<std::string> value = map_.Peek(r.keys[0]);
      if (!value.has_value()) return Park(c, r);
      reply.value = *value;
      Send(c, reply);
      return;
    }
    case Op::kWait: {
      const std::vector<std::string> keys(r.keys.begin(), r.keys.end());
      Result<bool> all = map_.Check(keys);
      if (!all.ok()) return SendError(c, r, all.status());
      if (!*all) return Park(c, r);
      Send(c, reply);
      return;
    }
    case Op::kAdd: {
      Result<int64_t> v = map_.Add(r.keys[0], r.delta);
      if (!v.ok()) return SendError(c, r, v.status());
      reply.number = *v;
      Send(c, reply);
      KeyChanged(r.keys[0]);
      return;
    }
    case Op::kCompareSet: {
      Result<CompareSetResult> cs = map_.CompareSet(r.keys[0], r.expected, r.value);
      if (!cs.ok()) return SendError(c, r, cs.status());
      reply.flag = cs->swapped;
      reply.present = cs->current.has_value();
      if (reply.present) reply.value = *cs->current;
      Send(c, reply);
      if (cs->swapped) KeyChanged(r.keys[0]);
      return;
    }
    case Op::kDelete: {
      Result<bool> existed = map_.Delete(r.keys[0]);
      if (!existed.ok()) return SendError(c, r, existed.status());
      reply.flag = *existed;
      Send(c, reply);
      return;
    }
    case Op::kCheck: {
      const std::vector<std::string> keys(r.keys.begin(), r.keys.end());
      Result<bool> all = map_.Check(keys);
      if (!all.ok()) return SendError(c, r, all.status());
      reply.flag = *all;
      Send(c, reply);
      return;
    }
  }
}

void TcpStoreServerImpl::Park(Connection& c, const Request& r) {
  const uint64_t id = next_waiter_id_++;
  const auto timeout = std::chrono::milliseconds(std::min(r.timeout_ms, internal::kMaxTimeoutMs));
  Waiter w{.connection = c.id,
           .request_id = r.request_id,
           .op = r.op,
           .keys = std::vector<std::string>(r.keys.begin(), r.keys.end()),
           .deadline = std::chrono::steady_clock::now() + timeout};
  for (const std::string& k : w.keys) waiters_by_key_[k].insert(id);
  waiters_by_deadline_.emplace(w.deadline, id);
  c.waiters.insert(id);
  waiters_.emplace(id, std::move(w));
}

void TcpStoreServerImpl::KeyChanged(std::string_view key) {
  auto it = waiters_by_key_.find(std::string(key));
  if (it == waiters_by_key_.end()) return;
  // Completing a waiter edits the index, so walk a copy.
  const std::vector<uint64_t> ids(it->second.begin(), it->second.end());
  for (uint64_t id : ids) TryComplete(id);
}

bool TcpStoreServerImpl::TryComplete(uint64_t waiter_id) {
  auto it = waiters_.find(waiter_id);
  if (it == waiters_.end()) return false;
  const Waiter& w = it->second;
  Connection& c = *connections_.at(w.connection);
  Reply reply{.op = w.op, .request_id = w.request_id};
  std::optional<std::string> value;
  if (w.op == Op::kGet) {
    value = map_.Peek(w.keys[0]);
    if (!value.has_value()) return false;
    reply.value = *value;
  } else {
    for (const std::string& k : w.keys) {
      if (!map_.Peek(k).has_value()) return false;
    }
  }
  Send(c, reply);
  RemoveWaiter(waiter_id);
  return true;
}

void TcpStoreServerImpl::ExpireWaiters(TimePoint now) {
  while (!waiters_by_deadline_.empty() && waiters_by_deadline_.begin()->first <= now) {
    const uint64_t id = waiters_by_deadline_.begin()->second;
    const Waiter& w = waiters_.at(id);
    std::string missing;
    for (const std::string& k : w.keys) {
      if (!map_.Peek(k).has_value()) {
        missing = k;
        break;
      }
    }
    const std::string message = "store " + std::string(internal::OpName(w.op)) +
                                " key=" + internal::QuoteKey(missing) +
                                ": not set before the deadline";
    Send(*connections_.at(w.connection), {.op = w.op,
                                          .request_id = w.request_id,
                                          .code = ErrorCode::kDeadlineExceeded,
                                          .message = message});
    RemoveWaiter(id);
  }
}

void TcpStoreServerImpl::RemoveWaiter(uint64_t waiter_id) {
  auto it = waiters_.find(waiter_id);
  if (it == waiters_.end()) return;
  const Waiter& w = it->second;
  for (const std::string& k : w.keys) {
    auto by_key = waiters_by_key_.find(k);
    if (by_key == waiters_by_key_.end()) continue;
    by_key->second.erase(waiter_id);
    if (by_key->second.empty()) waiters_by_key_.erase(by_key);
  }
  waiters_by_deadline_.erase({w.deadline, waiter_id});
  if (auto c = connections_.find(w.connection); c != connections_.end()) {
    c->second->waiters.erase(waiter_id);
  }
  waiters_.erase(it);
}

void TcpStoreServerImpl::Flush(Connection& c) {
  while (c.backlog() > 0) {
    const ssize_t n = send(c.fd.get(), c.out.data() + c.out_sent, c.backlog(), MSG_NOSIGNAL);
    if (n > 0) {
      c.out_sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    c.broken = true;
    return;
  }
  if (c.out_sent == c.out.size()) {
    c.out.clear();
    c.out_sent = 0;
  } else if (c.out_sent > c.out.size() / 2) {
    c.out.erase(0, c.out_sent);
    c.out_sent = 0;
  }
}

// Sends what can be sent, then closes a broken connection or updates what epoll watches.
void TcpStoreServerImpl::Settle(Connection& c) {
  if (!c.broken) Flush(c);
  if (c.broken) return Close(c.id);
  const uint32_t want =
      (c.backlog() <= kMaxOutputBacklogBytes ? EPOLLIN : 0) | (c.backlog() > 0 ? EPOLLOUT : 0);
  if (want != c.events) {
    c.events = want;
    SetInterest(c.fd.get(), c.id, want, EPOLL_CTL_MOD);
    // Requests left unparsed while the backlog was large are parsed now, without a new event.
    if ((want & EPOLLIN) && !c.in.empty()) {
      Consume(c);
      dirty_.insert(c.id);
    }
  }
}

void TcpStoreServerImpl::Close(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  // Its parked requests go with it.
  const std::set<uint64_t> waiters = it->second->waiters;
  for (uint64_t w : waiters) RemoveWaiter(w);
  SetInterest(it->second->fd.get(), id, 0, EPOLL_CTL_DEL);
  connections_.erase(it);
  if (accept_paused_) {
    accept_paused_ = false;
    SetInterest(listen_fd_.get(), kListenerTag, EPOLLIN, EPOLL_CTL_MOD);
  }
}

// ---------------------------------------------------------------------------------------
// Client.

// One connection attempt, bounded by `deadline` (hal::ConnectTcp's codes).
Result<Fd> ConnectOnce(const std::string& host, int port, TimePoint deadline) {
  return hal::ConnectTcp(host, port, deadline, "tcp store");
}

class TcpStoreClientImpl final : public TcpStoreClient {
 public:
  TcpStoreClientImpl(std::string host, int port, std::string peer, Fd fd,
                     const TcpStoreClientOptions& options)
      : host_(std::move(host)),
        port_(port),
        peer_(std::move(peer)),
        options_(options),
        fd_(std::move(fd)),
        hello_due_(!options.token.empty()) {}
  TcpStoreClientImpl(const TcpStoreClientImpl&) = delete;
  TcpStoreClientImpl& operator=(const TcpStoreClientImpl&) = delete;

  const std::string& peer() const override { return peer_; }
  Clock* clock() const override { return Clock::Real(); }

  Status Set(std::string_view key, std::string_view value) override {
    KC_LAYER_ENTRY(Layer::kComm, "store");
    KC_RETURN_IF_ERROR(internal::ValidateKey("store set", key));
    KC_RETURN_IF_ERROR(internal::ValidateValue("store set", key, value));
    std::string body;
    Reply reply;
    return Call({.op = Op::kSet, .keys = {key}, .value = value}, OpDeadline(), &body, &reply);
  }

  Result<std::string> Get(std::string_view key, TimePoint deadline) override {
    KC_LAYER_ENTRY(Layer::kComm, "store");
    KC_RETURN_IF_ERROR(internal::ValidateKey("store get", key));
    std::string body;
    Reply reply;
    KC_RETURN_IF_ERROR(Call({.op = Op::kGet, .keys = {key}}, deadline, &body, &reply));
    return std::string(reply.value);
  }

  Status Wait(std::span<const std::string> keys, TimePoint deadline) override {
    KC_LAYER_ENTRY(Layer::kComm, "store");
    for (const std::string& k : keys) KC_RETURN_IF_ERROR(internal::ValidateKey("store wait", k));
    if (keys.empty()) return OkStatus();
    std::string body;
    Reply reply;
    return Call({.op = Op::kWait, .keys = {keys.begin(), keys.end()}}, deadline, &body, &reply);
  }

  Result<int64_t> Add(std::string_view key, int64_t delta) override {
    KC_LAYER_ENTRY(Layer::kComm, "store");
    KC_RETURN_IF_ERROR(internal::ValidateKey("store add", key));
    std::string body;
    Reply reply;
    KC_RETURN_IF_ERROR(
        Call({.op = Op::kAdd, .delta = delta, .keys = {key}}, OpDeadline(), &body, &reply));
    return reply.number;
  }

  Result<CompareSetResult> CompareSet(std::string_view key,
                                      std::optional<std::string_view> expected,
                                      std::string_view desired) override {
    KC_LAYER_ENTRY(Layer::kComm, "store");
    KC_RETURN_IF_ERROR(internal::ValidateKey("store compare_set", key));
    KC_RETURN_IF_ERROR(internal::ValidateValue("store compare_set", key, desired));
    if (expected.has_value()) {
      KC_RETURN_IF_ERROR(internal::ValidateValue("store compare_set", key, *expected));
    }
    std::string body;
    Reply reply;
    KC_RETURN_IF_ERROR(
        Call({.op = Op::kCompareSet, .keys = {key}, .value = desired, .expected = expected},
             OpDeadline(), &body, &reply));
    CompareSetResult r{.swapped = reply.flag, .current = std::nullopt};
    if (reply.present) r.current = std::string(reply.value);
    return r;
  }

  Result<bool> Delete(std::string_view key) override {
    KC_LAYER_ENTRY(Layer::kComm, "store");
    KC_RETURN_IF_ERROR(internal::ValidateKey("store delete", key));
    std::string body;
    Reply reply;
    KC_RETURN_IF_ERROR(Call({.op = Op::kDelete, .keys = {key}}, OpDeadline(), &body, &reply));
    return reply.flag;
  }

  Result<bool> Check(std::span<const std::string> keys) override {
    KC_LAYER_ENTRY(Layer::kComm, "store");
    for (const std::string& k : keys) KC_RETURN_IF_ERROR(internal::ValidateKey("store check", k));
    if (keys.empty()) return true;
    std::string body;
    Reply reply;
    KC_RETURN_IF_ERROR(
        Call({.op = Op::kCheck, .keys = {keys.begin(), keys.end()}}, OpDeadline(), &body, &reply));
    return reply.flag;
  }

 private:
  TimePoint OpDeadline() const { return std::chrono::steady_clock::now() + options_.timeout; }

  // Sends `r` and waits for its reply until `deadline`. On success *reply holds the decoded
  // reply, its views pointing into *body. An error reply becomes its Status.
  Status Call(Request r, TimePoint deadline, std::string* body, Reply* reply);
  // The rest of Call, run by the thread holding the call slot.
  Status CallLocked(Request& r, TimePoint deadline, std::string* body, Reply* reply);
  Status WriteAll(std::string_view frame, TimePoint deadline);
  Status ReadReply(const Request& r, TimePoint deadline, std::string* body, Reply* reply);
  // Closes the connection (the next call reconnects) and returns kUnavailable.
  Status Lost(std::string_view why);

  // Immutable after construction.
  const std::string host_;
  const int port_;
  const std::string peer_;
  const TcpStoreClientOptions options_;

  Mutex mu_;
  CondVar slot_free_;
  bool busy_ KC_GUARDED_BY(mu_) = false;  // a call holds the connection

  // Used only by the thread holding the call slot (busy_ set by it), which orders every
  // access through mu_.
  Fd fd_;             // invalid after a failure until the next call reconnects
  std::string rbuf_;  // received bytes not yet parsed
  uint64_t next_request_id_ = 1;
  bool hello_due_ = false;  // the connection has not said the token yet
};

Status TcpStoreClientImpl::Call(Request r, TimePoint deadline, std::string* body, Reply* reply) {
  {
    MutexLock lock(&mu_);
    if (!AwaitWithDeadline(Clock::Real(), &slot_free_, &mu_, deadline,
                           [this]() KC_REQUIRES(mu_) { return !busy_; })) {
      return DeadlineExceededError("tcp store " + peer_ + " " +
                                   std::string(internal::OpName(r.op)) +
                                   ": the deadline passed while another call used the client");
    }
    busy_ = true;
  }
  Status s = CallLocked(r, deadline, body, reply);
  {
    MutexLock lock(&mu_);
    busy_ = false;
  }
  slot_free_.Signal();
  return s;
}

Status TcpStoreClientImpl::CallLocked(Request& r, TimePoint deadline, std::string* body,
                                      Reply* reply) {
  const std::string what = "tcp store " + peer_ + " " + std::string(internal::OpName(r.op));
  if (std::chrono::steady_clock::now() >= deadline) {
    return DeadlineExceededError(what + ": the deadline passed before the request was sent");
  }
  if (!fd_.valid()) {
    Result<Fd> fd = ConnectOnce(host_, port_, deadline);
    if (!fd.ok()) {
      if (fd.status().code() == ErrorCode::kDeadlineExceeded) return fd.status();
      return UnavailableError("tcp store " + peer_ +
                              ": reconnecting failed: " + fd.status().message());
    }
    fd_ = *std::move(fd);
    rbuf_.clear();
    hello_due_ = !options_.token.empty();
  }
  if (hello_due_ && r.op != Op::kHello) {
    // Every connection says the token first; a refusal is the caller's answer.
    Request hello{.op = Op::kHello, .keys = {options_.token}};
    std::string hello_body;
    Reply hello_reply;
    KC_RETURN_IF_ERROR(CallLocked(hello, deadline, &hello_body, &hello_reply));
    hello_due_ = false;
  }
  r.request_id = next_request_id_++;
  if (r.op == Op::kGet || r.op == Op::kWait) {
    // The server gives up at (about) the same moment; a reply that comes after we did is
    // recognised as stale by its request id and dropped by a later call.
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    r.timeout_ms = static_cast<uint64_t>(std::max<int64_t>(left.count(), 0));
  }
  std::string frame;
  internal::EncodeRequest(r, &frame);
  if (frame.size() - kHeaderBytes > internal::kMaxRequestBodyBytes) {
    return InvalidArgumentError(what + ": request of " + std::to_string(frame.size()) +
                                " bytes exceeds the limit of " +
                                std::to_string(internal::kMaxRequestBodyBytes));
  }
  KC_RETURN_IF_ERROR(WriteAll(frame, deadline).WithContext(what));
  KC_RETURN_IF_ERROR(ReadReply(r, deadline, body, reply).WithContext(what));
  if (reply->code != ErrorCode::kOk) {
    return Status(reply->code, "tcp store " + peer_ + ": " + std::string(reply->message));
  }
  return OkStatus();
}

Status TcpStoreClientImpl::Lost(std::string_view why) {
  fd_.Reset();
  rbuf_.clear();
  return UnavailableError(std::string(why) + " (the next call reconnects)");
}

Status TcpStoreClientImpl::WriteAll(std::string_view frame, TimePoint deadline) {
  size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t n = send(fd_.get(), frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{.fd = fd_.get(), .events = POLLOUT, .revents = 0};
      const int r = poll(&pfd, 1, PollTimeoutMs(deadline));
      if (r == 0) {
        // Half a request on the wire would put the stream out of step: start over.
        if (sent > 0) fd_.Reset();
        return DeadlineExceededError("the deadline passed while sending the request");
      }
      continue;  // writable, or an error the next send reports
    }
    return Lost("connection lost: " + Errno());
  }
  return OkStatus();
}

Status TcpStoreClientImpl::ReadReply(const Request& r, TimePoint deadline, std::string* body,
                                     Reply* reply) {
  for (;;) {
    // Parse every complete frame buffered; skip replies to calls that gave up earlier.
    while (rbuf_.size() >= kHeaderBytes) {
      Header h;
      if (!internal::DecodeHeader(reinterpret_cast<const unsigned char*>(rbuf_.data()), &h) ||
          h.body_bytes > internal::kMaxReplyBodyBytes) {
        fd_.Reset();
        rbuf_.clear();
        return DataLossError("malformed reply header: is this a kc store server?");
      }
      if (rbuf_.size() < kHeaderBytes + h.body_bytes) break;
      if (h.request_id != r.request_id) {
        rbuf_.erase(0, kHeaderBytes + h.body_bytes);
        continue;
      }
      body->assign(rbuf_, kHeaderBytes, h.body_bytes);
      rbuf_.erase(0, kHeaderBytes + h.body_bytes);
      if (h.op != r.op || !internal::DecodeReplyBody(h, *body, reply)) {
        fd_.Reset();
        rbuf_.clear();
        return DataLossError("malformed reply body");
      }
      return OkStatus();
    }
    pollfd pfd{.fd = fd_.get(), .events = POLLIN, .revents = 0};
    const int p = poll(&pfd, 1, PollTimeoutMs(deadline));
    if (p == 0) {
      // The connection stays: a late reply is skipped by its request id.
      return DeadlineExceededError("no reply before the deadline");
    }
    if (p < 0) {
      if (errno == EINTR) continue;
      return Lost("poll: " + Errno());
    }
    char chunk[64 * 1024];
    const ssize_t n = recv(fd_.get(), chunk, sizeof(chunk), 0);
    if (n > 0) {
      rbuf_.append(chunk, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return Lost("the server closed the connection");
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
    return Lost("connection lost: " + Errno());
  }
}

}  // namespace

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    const TcpStoreServerOptions& options) {
  KC_LAYER_ENTRY(Layer::kComm, "store");
  const std::string where = "tcp store server " + HostPort(options.bind_address, options.port);
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgumentError(where + ": port must be 0 to 65535");
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* raw = nullptr;
  const std::string port_str = std::to_string(options.port);
  if (const int rc = getaddrinfo(options.bind_address.c_str(), port_str.c_str(), &hints, &raw);
      rc != 0) {
    return InvalidArgumentError(where + ": bad bind address: " + gai_strerror(rc));
  }
  AddrInfo address(raw);
  Fd fd(socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
               address->ai_protocol));
  if (!fd.valid()) return UnavailableError(where + ": socket: " + Errno());
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd.get(), address->ai_addr, address->ai_addrlen) != 0) {
    const std::string what = where + ": bind: " + Errno();
    if (errno == EACCES) return PermissionDeniedError(what);
    if (errno == EADDRNOTAVAIL) return InvalidArgumentError(what);
    return UnavailableError(what);
  }
  if (listen(fd.get(), SOMAXCONN) != 0) return UnavailableError(where + ": listen: " + Errno());
  sockaddr_storage bound = {};
  socklen_t len = sizeof(bound);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return InternalError(where + ": getsockname: " + Errno());
  }
  const int port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  Fd wake(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake.valid()) return ResourceExhaustedError(where + ": eventfd: " + Errno());
  Fd epoll(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return ResourceExhaustedError(where + ": epoll_create1: " + Errno());
  for (auto [watched, tag] : {std::pair{wake.get(), kWakeTag}, std::pair{fd.get(), kListenerTag}}) {
    epoll_event ev{.events = EPOLLIN, .data = {.u64 = tag}};
    if (epoll_ctl(epoll.get(), EPOLL_CTL_ADD, watched, &ev) != 0) {
      return ResourceExhaustedError(where + ": epoll_ctl: " + Errno());
    }
  }
  try {
    return std::unique_ptr<TcpStoreServer>(std::make_unique<TcpStoreServerImpl>(
        std::move(fd), std::move(wake), std::move(epoll), port, options.token));
  } catch (const std::system_error& e) {  // the thread could not be started
    return ResourceExhaustedError(where + ": " + e.what());
  }
}

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(
    std::string_view host, int port, TimePoint deadline, const TcpStoreClientOptions& options) {
  KC_LAYER_ENTRY(Layer::kComm, "store");
  const std::string peer = HostPort(host, port);
  if (host.empty()) return InvalidArgumentError("tcp store " + peer + ": empty host name");
  if (port < 1 || port > 65535) {
    return InvalidArgumentError("tcp store " + peer + ": port must be 1 to 65535");
  }
  if (options.timeout <= Duration::zero() || options.initial_backoff <= Duration::zero() ||
      options.max_backoff < options.initial_backoff) {
    return InvalidArgumentError("tcp store " + peer +
                                ": timeout and backoffs must be positive, max >= initial");
  }
  const std::string host_str(host);
  Duration backoff = options.initial_backoff;
  for (;;) {
    Result<Fd> fd = ConnectOnce(host_str, port, deadline);
    if (fd.ok()) {
      return std::unique_ptr<TcpStoreClient>(
          std::make_unique<TcpStoreClientImpl>(host_str, port, peer, *std::move(fd), options));
    }
    if (fd.status().code() == ErrorCode::kInvalidArgument) return fd.status();
    const TimePoint now = std::chrono::steady_clock::now();
    if (now >= deadline || fd.status().code() == ErrorCode::kDeadlineExceeded) {
      return DeadlineExceededError(
          "tcp store " + peer +
          ": no server before the deadline; last error: " + fd.status().message());
    }
    if (options.on_retry) options.on_retry(fd.status());
    // Backoff between attempts, not synchronisation: a refused port offers nothing to wait
    // on, and the launcher may start the server at any moment.
    std::this_thread::sleep_until(std::min(now + backoff, deadline));
    backoff = std::min(2 * backoff, options.max_backoff);
  }
}

}  // namespace kc::comm
