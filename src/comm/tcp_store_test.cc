// What only the TCP store does: real deadlines, launch races, a server going away, and
// clients that break the protocol. The Store contract itself is tested in store_test.cc.
#include "comm/tcp_store.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/notification.h"
#include "comm/internal/store_wire.h"
#include "hal/fd.h"

namespace kc::comm {
namespace {

using ::testing::HasSubstr;

TimePoint In(Duration d) { return std::chrono::steady_clock::now() + d; }
// Bounds calls that should return long before; it only stops a broken test from hanging.
TimePoint Far() { return In(std::chrono::seconds(60)); }

std::unique_ptr<TcpStoreServer> StartServer(int port = 0) {
  Result<std::unique_ptr<TcpStoreServer>> server =
      TcpStoreServer::Start({.bind_address = "127.0.0.1", .port = port});
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<TcpStoreClient> ConnectTo(int port) {
  Result<std::unique_ptr<TcpStoreClient>> client =
      TcpStoreClient::Connect("127.0.0.1", port, In(std::chrono::seconds(30)));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// A loopback socket for speaking raw bytes to the server, or (not connected) for reserving
// a port: bound with SO_REUSEADDR and not listening, so connections to it are refused until
// a server binds the same port and listens.
class RawSocket {
 public:
  RawSocket() : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    // A safety net against a hang, not a timing assertion.
    const timeval limit{.tv_sec = 30, .tv_usec = 0};
    setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  }

  // Reserves a port; returns it.
  int Reserve() {
    const int one = 1;
    setsockopt(fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr = Loopback(0);
    EXPECT_EQ(bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
    return ntohs(addr.sin_port);
  }

  bool Connect(int port) {
    sockaddr_in addr = Loopback(port);
    return connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }

  bool Send(std::string_view bytes) {
    return send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }

  // Reads exactly n bytes; nullopt on end of stream (or error) first.
  std::optional<std::string> Receive(size_t n) {
    std::string out(n, '\0');
    for (size_t got = 0; got < n;) {
      const ssize_t r = recv(fd_.get(), out.data() + got, n - got, 0);
      if (r <= 0) return std::nullopt;
      got += static_cast<size_t>(r);
    }
    return out;
  }

  // True when the peer closed the connection (recv sees end of stream or a reset).
  bool ClosedByPeer() {
    char c;
    return recv(fd_.get(), &c, 1, 0) <= 0 && errno != EAGAIN && errno != EWOULDBLOCK;
  }

  // Reads one reply frame.
  std::optional<internal::Reply> ReceiveReply(std::string* body) {
    std::optional<std::string> header = Receive(internal::kHeaderBytes);
    if (!header.has_value()) return std::nullopt;
    internal::Header h;
    if (!internal::DecodeHeader(reinterpret_cast<const unsigned char*>(header->data()), &h)) {
      return std::nullopt;
    }
    std::optional<std::string> b = Receive(h.body_bytes);
    if (!b.has_value()) return std::nullopt;
    *body = *std::move(b);
    internal::Reply reply;
    if (!internal::DecodeReplyBody(h, *body, &reply)) return std::nullopt;
    return reply;
  }

  void Close() { fd_.Reset(); }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return addr;
  }
  hal::Fd fd_;
};

std::string Frame(const internal::Request& r) {
  std::string frame;
  internal::EncodeRequest(r, &frame);
  return frame;
}

TEST(TcpStoreTest, GetWithAShortRealDeadlineIsDeadlineExceeded) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStoreClient> client = ConnectTo(server->port());
  ASSERT_NE(client, nullptr);
  Result<std::string> got = client->Get("never", In(std::chrono::milliseconds(100)));
  EXPECT_EQ(got.status().code(), ErrorCode::kDeadlineExceeded) << got.status();
  EXPECT_EQ(
      client->Wait(std::vector<std::string>{"never"}, In(std::chrono::milliseconds(100))).code(),
      ErrorCode::kDeadlineExceeded);
  // The connection is still good, and a reply to a call that gave up is never taken for
  // the answer to a later one.
  ASSERT_TRUE(client->Set("never", "late").ok());
  ASSERT_TRUE(client->Set("other", "right").ok());
  EXPECT_EQ(client->Get("other", Far()).value_or(""), "right");
  EXPECT_EQ(client->Get("never", Far()).value_or(""), "late");
}

TEST(TcpStoreTest, AClientStartedBeforeTheServerConnectsOnceItStarts) {
  RawSocket reserved;
  const int port = reserved.Reserve();
  Notification refused;  // the client has been refused at least once
  TcpStoreClientOptions options;
  options.on_retry = [&](const Status&) {
    if (!refused.HasBeenNotified()) refused.Notify();
  };
  std::optional<Result<std::unique_ptr<TcpStoreClient>>> client;
  std::jthread connector(
      [&] { client = TcpStoreClient::Connect("127.0.0.1", port, Far(), options); });
  refused.WaitForNotification();
  std::unique_ptr<TcpStoreServer> server = StartServer(port);
  ASSERT_NE(server, nullptr);
  reserved.Close();
  connector.join();
  ASSERT_TRUE(client->ok()) << client->status();
  ASSERT_TRUE((**client)->Set("k", "v").ok());
  EXPECT_EQ((**client)->Get("k", Far()).value_or(""), "v");
}

TEST(TcpStoreTest, ConnectGivesUpAtItsDeadlineWhenNoServerComes) {
  RawSocket reserved;
  const int port = reserved.Reserve();
  Result<std::unique_ptr<TcpStoreClient>> client =
      TcpStoreClient::Connect("127.0.0.1", port, In(std::chrono::milliseconds(100)));
  EXPECT_EQ(client.status().code(), ErrorCode::kDeadlineExceeded);
  EXPECT_THAT(client.status().message(), HasSubstr("127.0.0.1:" + std::to_string(port)));
}

TEST(TcpStoreTest, ConnectRejectsABadPortOrHost) {
  EXPECT_EQ(TcpStoreClient::Connect("127.0.0.1", 0, Far()).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(TcpStoreClient::Connect("", 5000, Far()).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(TcpStoreServer::Start({.bind_address = "not an address", .port = 0}).status().code(),
            ErrorCode::kInvalidArgument);
}

// A server with a token serves only clients that say it first on their connection (a run's
// store served where other hosts reach it); others get kPermissionDenied and read nothing.
TEST(TcpStoreTest, AServerWithATokenServesOnlyClientsThatSayIt) {
  Result<std::unique_ptr<TcpStoreServer>> server =
      TcpStoreServer::Start({.bind_address = "127.0.0.1", .port = 0, .token = "s3cret"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  auto connect = [&](const std::string& token) {
    return TcpStoreClient::Connect("127.0.0.1", port, In(std::chrono::seconds(30)),
                                   {.token = token});
  };
  Result<std::unique_ptr<TcpStoreClient>> good = connect("s3cret");
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE((*good)->Set("k", "v").ok());
  for (const std::string token : {"", "s3crex", "s3cret-and-more"}) {
    Result<std::unique_ptr<TcpStoreClient>> bad = connect(token);
    ASSERT_TRUE(bad.ok()) << bad.status();  // connecting says nothing yet
    Result<std::string> got = (*bad)->Get("k", Far());
    EXPECT_EQ(got.status().code(), ErrorCode::kPermissionDenied) << token;
    EXPECT_THAT(got.status().message(), HasSubstr("token")) << token;
    EXPECT_EQ((*bad)->Set("k", "forged").code(), ErrorCode::kPermissionDenied) << token;
  }
  Result<std::string> kept = (*good)->Get("k", Far());
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, "v");
  // A client reconnecting (the server restarted on the same port) says it again.
  (*server)->Stop();
  Result<std::unique_ptr<TcpStoreServer>> again =
      TcpStoreServer::Start({.bind_address = "127.0.0.1", .port = port, .token = "s3cret"});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*good)->Set("k", "v2").code(), ErrorCode::kUnavailable);  // the old connection
  EXPECT_TRUE((*good)->Set("k", "v2").ok());
}

TEST(TcpStoreTest, CallsAfterTheServerStopsAreUnavailableNamingTheServer) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStoreClient> client = ConnectTo(server->port());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Set("k", "v").ok());
  server->Stop();
  Result<std::string> got = client->Get("k", Far());
  EXPECT_EQ(got.status().code(), ErrorCode::kUnavailable) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr(client->peer()));
  // The next call tries to reconnect, is refused, and says so.
  Status set = client->Set("k", "v");
  EXPECT_EQ(set.code(), ErrorCode::kUnavailable) << set;
  EXPECT_THAT(set.message(), HasSubstr(client->peer()));
}

TEST(TcpStoreTest, AGetWaitingWhenTheServerStopsIsUnavailable) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStoreClient> client = ConnectTo(server->port());
  ASSERT_NE(client, nullptr);
  std::optional<Result<std::string>> got;
  Notification started;
  std::jthread getter([&] {
    started.Notify();
    got = client->Get("never", Far());
  });
  started.WaitForNotification();
  server->Stop();
  getter.join();
  // Whether the request was parked or not yet sent when the server went, it is refused.
  EXPECT_EQ(got->status().code(), ErrorCode::kUnavailable) << got->status();
}

TEST(TcpStoreTest, ManyClientsWaitingForOneKeyAreAllWoken) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  constexpr int kWaiters = 8;
  std::vector<std::unique_ptr<TcpStoreClient>> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(ConnectTo(server->port()));
  std::unique_ptr<TcpStoreClient> setter = ConnectTo(server->port());
  std::vector<std::optional<Result<std::string>>> got(kWaiters);
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < kWaiters; ++i) {
      threads.emplace_back([&, i] { got[i] = clients[i]->Get("go", Far()); });
    }
    ASSERT_TRUE(setter->Set("go", "now").ok());
  }
  for (const auto& g : got) EXPECT_EQ(g->value_or(""), "now");
}

TEST(TcpStoreTest, ThreadsSharingOneClientEachGetTheirOwnReplies) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStoreClient> client = ConnectTo(server->port());
  ASSERT_NE(client, nullptr);
  std::atomic<int> wrong{0};
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 200; ++i) {
          const std::string key = "t" + std::to_string(t) + "/" + std::to_string(i);
          if (!client->Set(key, key).ok() || client->Get(key, Far()).value_or("") != key) {
            wrong.fetch_add(1);
          }
        }
      });
    }
  }
  EXPECT_EQ(wrong.load(), 0);
}

TEST(TcpStoreTest, MalformedBytesCloseOnlyThatConnection) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStoreClient> good = ConnectTo(server->port());
  ASSERT_NE(good, nullptr);
  ASSERT_TRUE(good->Set("k", "v").ok());

  RawSocket http;
  ASSERT_TRUE(http.Connect(server->port()));
  ASSERT_TRUE(http.Send("GET / HTTP/1.1\r\nHost: store\r\n\r\n"));
  EXPECT_TRUE(http.ClosedByPeer());

  // A well-framed request whose body does not parse (a Set with one field) is malformed too.
  std::string frame = Frame({.op = internal::Op::kDelete, .request_id = 1, .keys = {"k"}});
  frame[16] = static_cast<char>(internal::Op::kSet);
  RawSocket truncated;
  ASSERT_TRUE(truncated.Connect(server->port()));
  ASSERT_TRUE(truncated.Send(frame));
  EXPECT_TRUE(truncated.ClosedByPeer());

  EXPECT_EQ(good->Get("k", Far()).value_or(""), "v");
  std::unique_ptr<TcpStoreClient> later = ConnectTo(server->port());
  ASSERT_NE(later, nullptr);
  EXPECT_EQ(later->Get("k", Far()).value_or(""), "v");
}

TEST(TcpStoreTest, AClientVanishingMidRequestLeavesTheServerServing) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const std::string value(100000, 'x');
  const std::string set =
      Frame({.op = internal::Op::kSet, .request_id = 1, .keys = {"half"}, .value = value});
  RawSocket half;
  ASSERT_TRUE(half.Connect(server->port()));
  ASSERT_TRUE(half.Send(std::string_view(set).substr(0, set.size() / 2)));
  half.Close();

  // One that parks a Get and goes: its waiter must be dropped, not answered.
  RawSocket parked;
  ASSERT_TRUE(parked.Connect(server->port()));
  ASSERT_TRUE(parked.Send(
      Frame({.op = internal::Op::kGet, .request_id = 7, .timeout_ms = 60000, .keys = {"later"}})));
  // A Check on the same connection is answered after the Get was parked: the server handles
  // a connection's requests in order.
  ASSERT_TRUE(parked.Send(Frame({.op = internal::Op::kCheck, .request_id = 8, .keys = {"later"}})));
  std::string body;
  std::optional<internal::Reply> check = parked.ReceiveReply(&body);
  ASSERT_TRUE(check.has_value());
  EXPECT_EQ(check->request_id, 8u);
  parked.Close();

  std::unique_ptr<TcpStoreClient> client = ConnectTo(server->port());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Set("later", "v").ok());
  EXPECT_EQ(client->Get("later", Far()).value_or(""), "v");
  EXPECT_FALSE(client->Check(std::vector<std::string>{"half"}).value_or(true));
}

TEST(TcpStoreTest, TheServerAnswersOversizeRequestsWithInvalidArgumentAndKeepsTheConnection) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  RawSocket raw;
  ASSERT_TRUE(raw.Connect(server->port()));
  std::string body;

  // Sent raw, so the client's own checks do not stop it first.
  const std::string long_key(kMaxKeyBytes + 1, 'k');
  ASSERT_TRUE(raw.Send(
      Frame({.op = internal::Op::kSet, .request_id = 1, .keys = {long_key}, .value = "v"})));
  std::optional<internal::Reply> reply = raw.ReceiveReply(&body);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->request_id, 1u);
  EXPECT_EQ(reply->code, ErrorCode::kInvalidArgument);

  const std::string big_value(kMaxValueBytes + 1, 'v');
  ASSERT_TRUE(raw.Send(
      Frame({.op = internal::Op::kSet, .request_id = 2, .keys = {"k"}, .value = big_value})));
  reply = raw.ReceiveReply(&body);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->request_id, 2u);
  EXPECT_EQ(reply->code, ErrorCode::kInvalidArgument);

  ASSERT_TRUE(
      raw.Send(Frame({.op = internal::Op::kSet, .request_id = 3, .keys = {"k"}, .value = "ok"})));
  reply = raw.ReceiveReply(&body);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->request_id, 3u);
  EXPECT_EQ(reply->code, ErrorCode::kOk);

  // A body over the frame limit is answered at once from its header and then skipped.
  std::string header(internal::kHeaderBytes, '\0');
  internal::EncodeHeader({.body_bytes = static_cast<uint32_t>(internal::kMaxRequestBodyBytes + 1),
                          .request_id = 4,
                          .op = internal::Op::kSet},
                         reinterpret_cast<unsigned char*>(header.data()));
  ASSERT_TRUE(raw.Send(header));
  reply = raw.ReceiveReply(&body);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->request_id, 4u);
  EXPECT_EQ(reply->code, ErrorCode::kInvalidArgument);
}

TEST(TcpStoreTest, WireRequestsRoundTrip) {
  const internal::Request in{.op = internal::Op::kCompareSet,
                             .request_id = 99,
                             .keys = {"key"},
                             .value = "desired",
                             .expected = std::string_view("")};
  const std::string frame = Frame(in);
  internal::Header h;
  ASSERT_TRUE(internal::DecodeHeader(reinterpret_cast<const unsigned char*>(frame.data()), &h));
  EXPECT_EQ(h.body_bytes, frame.size() - internal::kHeaderBytes);
  internal::Request out;
  ASSERT_TRUE(
      internal::DecodeRequestBody(h, std::string_view(frame).substr(internal::kHeaderBytes), &out));
  EXPECT_EQ(out.request_id, 99u);
  EXPECT_EQ(out.keys, std::vector<std::string_view>{"key"});
  EXPECT_EQ(out.value, "desired");
  ASSERT_TRUE(out.expected.has_value());  // expected "" differs from expected absent
  EXPECT_EQ(*out.expected, "");
  // One byte short or one byte over is malformed.
  EXPECT_FALSE(internal::DecodeRequestBody(
      h, std::string_view(frame).substr(internal::kHeaderBytes, h.body_bytes - 1), &out));
  EXPECT_FALSE(internal::DecodeRequestBody(
      h, std::string(frame.substr(internal::kHeaderBytes)) + "x", &out));
}

}  // namespace
}  // namespace kc::comm
