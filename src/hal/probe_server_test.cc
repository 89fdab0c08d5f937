#include "hal/probe_server.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <thread>
#include <vector>

namespace kc::hal {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

std::unique_ptr<ProbeServer> StartLoopbackServer() {
  Result<std::unique_ptr<ProbeServer>> server =
      ProbeServer::Start({.bind_address = "127.0.0.1",
                          .port = 0,
                          .idle_timeout = std::chrono::seconds(60),
                          .max_connections = 8});
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TcpProbeOptions Small() {
  return {.bandwidth_bytes = 8 * kMiB + 3,  // not a whole number of words or blocks
          .round_trips = 50,
          .timeout = std::chrono::seconds(30),
          .progress = {}};
}

// A socket bound to a loopback port with nothing listening (connections are refused) or
// listening without ever accepting or answering.
struct RawSocket {
  int fd = -1;
  int port = 0;
  explicit RawSocket(bool listening) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (listening) EXPECT_EQ(listen(fd, 4), 0);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port = ntohs(addr.sin_port);
  }
  ~RawSocket() { close(fd); }
};

TEST(ProbeServerTest, MeasuresLoopbackWithVerifiedData) {
  std::unique_ptr<ProbeServer> server = StartLoopbackServer();
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  std::vector<double> progress;
  TcpProbeOptions options = Small();
  options.progress = [&progress](double f, std::string_view) { progress.push_back(f); };
  Result<TcpMeasurement> m = MeasureTcpPeer("127.0.0.1", server->port(), options);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->bytes_delivered, 8 * kMiB + 3);  // acknowledged with a matching checksum
  EXPECT_GT(m->bandwidth, 0);
  EXPECT_TRUE(std::isfinite(m->bandwidth));
  EXPECT_GT(m->latency, 0);
  EXPECT_TRUE(std::isfinite(m->latency));
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), 1.0);
  for (size_t i = 1; i < progress.size(); ++i) EXPECT_GE(progress[i], progress[i - 1]);
  server->Stop();
}

TEST(ProbeServerTest, ServesSeveralClientsAtOnceAndOneAfterAnother) {
  std::unique_ptr<ProbeServer> server = StartLoopbackServer();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  std::vector<Status> results(3);
  {
    std::vector<std::jthread> clients;
    for (int i = 0; i < 3; ++i) {
      clients.emplace_back([&results, i, port] {
        // Streams shorter than, not a multiple of, and a multiple of the client's block.
        const int64_t sizes[] = {1005, 8 * kMiB + 3, 3 * kMiB};
        TcpProbeOptions options = Small();
        options.bandwidth_bytes = sizes[i];
        results[i] = MeasureTcpPeer("localhost", port, options).status();
      });
    }
  }
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s;
  Result<TcpMeasurement> again = MeasureTcpPeer("127.0.0.1", port, Small());
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(ProbeServerTest, AClosedPortIsUnavailable) {
  RawSocket closed(/*listening=*/false);
  Result<TcpMeasurement> m = MeasureTcpPeer("127.0.0.1", closed.port, Small());
  EXPECT_EQ(m.status().code(), ErrorCode::kUnavailable) << m.status();
  EXPECT_THAT(m.status().message(), HasSubstr("127.0.0.1:" + std::to_string(closed.port)));
}

TEST(ProbeServerTest, BadPortsAndHostsAreInvalidArguments) {
  for (int port : {0, -1, 65536}) {
    Result<TcpMeasurement> m = MeasureTcpPeer("127.0.0.1", port, Small());
    EXPECT_EQ(m.status().code(), ErrorCode::kInvalidArgument) << port;
    EXPECT_THAT(m.status().message(), HasSubstr("127.0.0.1:" + std::to_string(port)));
  }
  EXPECT_EQ(MeasureTcpPeer("", 80, Small()).status().code(), ErrorCode::kInvalidArgument);
  TcpProbeOptions bad = Small();
  bad.round_trips = 0;
  EXPECT_EQ(MeasureTcpPeer("127.0.0.1", 80, bad).status().code(), ErrorCode::kInvalidArgument);
}

TEST(ProbeServerTest, APeerThatNeverAnswersHitsTheDeadline) {
  RawSocket silent(/*listening=*/true);  // the kernel completes the handshake; nobody reads
  TcpProbeOptions options = Small();
  options.timeout = std::chrono::milliseconds(200);
  Result<TcpMeasurement> m = MeasureTcpPeer("127.0.0.1", silent.port, options);
  EXPECT_EQ(m.status().code(), ErrorCode::kDeadlineExceeded) << m.status();
}

// Stops the server from the client's progress callback (so on the client's thread, with
// no timing involved) once progress passes `stop_after`, mid-way through a measurement that
// would otherwise run for hours.
Status MeasureWhileStopping(double stop_after) {
  std::unique_ptr<ProbeServer> server = StartLoopbackServer();
  if (server == nullptr) return InternalError("no server");
  TcpProbeOptions options = Small();
  options.round_trips = 1000;
  options.bandwidth_bytes = int64_t{1} << 40;
  options.timeout = std::chrono::seconds(120);
  options.progress = [&server, stop_after](double fraction, std::string_view) {
    if (fraction > stop_after) server->Stop();
  };
  return MeasureTcpPeer("127.0.0.1", server->port(), options).status();
}

TEST(ProbeServerTest, StoppingTheServerRightAfterConnectEndsTheClient) {
  Status s = MeasureWhileStopping(-1);  // at the first update, the connection just made
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable) << s;
}

TEST(ProbeServerTest, StoppingTheServerMidStreamEndsTheClient) {
  Status s = MeasureWhileStopping(0.2);  // pings answered, bytes flowing
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable) << s;
}

TEST(ProbeServerTest, StopIsIdempotentAndConcurrent) {
  std::unique_ptr<ProbeServer> server = StartLoopbackServer();
  ASSERT_NE(server, nullptr);
  {
    std::jthread a([&server] { server->Stop(); });
    std::jthread b([&server] { server->Stop(); });
  }
  server->Stop();
  server.reset();  // the destructor stops again
}

TEST(ProbeServerTest, BadServerOptionsAreRefused) {
  EXPECT_EQ(ProbeServer::Start({.bind_address = "not-an-address",
                                .port = 0,
                                .idle_timeout = std::chrono::seconds(1),
                                .max_connections = 1})
                .status()
                .code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(ProbeServer::Start({.bind_address = "127.0.0.1",
                                .port = 70000,
                                .idle_timeout = std::chrono::seconds(1),
                                .max_connections = 1})
                .status()
                .code(),
            ErrorCode::kInvalidArgument);
}

TEST(ProbeServerTest, ATakenPortIsUnavailable) {
  RawSocket taken(/*listening=*/true);
  Result<std::unique_ptr<ProbeServer>> server =
      ProbeServer::Start({.bind_address = "127.0.0.1",
                          .port = taken.port,
                          .idle_timeout = std::chrono::seconds(1),
                          .max_connections = 1});
  EXPECT_EQ(server.status().code(), ErrorCode::kUnavailable) << server.status();
}

}  // namespace
}  // namespace kc::hal
