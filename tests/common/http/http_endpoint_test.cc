#include "common/http/http_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace lockstep::http {
namespace {

// A connected socket to 127.0.0.1:port that sends nothing yet (-1 when unreachable).
int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` to 127.0.0.1:port and returns the whole response ("" when unreachable).
std::string Exchange(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  timeval deadline{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &deadline, sizeof(deadline));
  EXPECT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
  close(fd);
  return response;
}

std::string Get(int port, const std::string& path) {
  return Exchange(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n");
}

// An endpoint on a free port whose /metrics says "up 1".
StatusOr<std::unique_ptr<HttpEndpoint>> StartUpMetrics() {
  return HttpEndpoint::Start(
      "127.0.0.1", 0, {{"/metrics", [] { return HttpResponse{200, "text/plain", "up 1\n"}; }}});
}

// Whether the server has closed `fd` (a read finds the end), without waiting.
bool ClosedByServer(int fd) {
  char byte;
  return recv(fd, &byte, 1, MSG_DONTWAIT) == 0;
}

TEST(HttpEndpointTest, ServesRegisteredPathsAndRefusesOthers) {
  auto endpoint =
      HttpEndpoint::Start("127.0.0.1", 0, {{"/healthz", [] {
                                              return HttpResponse{200, "text/plain", "ok\n"};
                                            }}});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  ASSERT_GT(port, 0);

  const std::string ok = Get(port, "/healthz?verbose=1");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Length: 3\r\n"), std::string::npos) << ok;
  EXPECT_EQ(ok.substr(ok.size() - 3), "ok\n");

  EXPECT_EQ(Get(port, "/nothing").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(Exchange(port, "POST /healthz HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(Exchange(port, "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  const std::string head = Exchange(port, "HEAD /healthz HTTP/1.1\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << "HEAD carries no body";
}

TEST(HttpEndpointTest, ServesAPrometheusRegistryInTextFormat) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& counter = prometheus::BuildCounter()
                      .Name("lockstep_test_total")
                      .Help("a test counter")
                      .Register(*registry)
                      .Add({{"job", "default/x"}});
  counter.Increment(3);
  auto endpoint = HttpEndpoint::Start("127.0.0.1", 0, {{"/metrics", PrometheusHandler(registry)}});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const std::string text = Get((*endpoint)->port(), "/metrics");
  EXPECT_NE(text.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << text;
  EXPECT_NE(text.find("lockstep_test_total{job=\"default/x\"} 3"), std::string::npos) << text;
}

TEST(HttpEndpointTest, BusyPortIsUnavailableNamingIt) {
  auto first = HttpEndpoint::Start("127.0.0.1", 0, {});
  ASSERT_TRUE(first.ok());
  const int port = (*first)->port();
  auto second = HttpEndpoint::Start("127.0.0.1", port, {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << second.status();
}

TEST(HttpEndpointTest, ClientsHoldingConnectionsOpenDoNotDelayAScrape) {
  auto endpoint = StartUpMetrics();
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  // Twenty clients that connect and say nothing, one that has sent half a request line.
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(Connect(port));
  const int trickling = Connect(port);
  ASSERT_EQ(write(trickling, "GET /met", 8), 8);

  // Served one at a time, this scrape would wait for every one of them to time out.
  EXPECT_NE(Get(port, "/metrics").find("up 1"), std::string::npos);
  for (int fd : idle) EXPECT_FALSE(ClosedByServer(fd)) << "still within its deadline";
  for (int fd : idle) close(fd);
  close(trickling);
}

TEST(HttpEndpointTest, MoreOpenConnectionsThanItServesCloseTheOldestNotTheNewScrape) {
  auto endpoint = StartUpMetrics();
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  // More than the backlog of the old server (64) and than the connections it serves (32).
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(Connect(port));
  EXPECT_NE(Get(port, "/metrics").find("up 1"), std::string::npos);
  EXPECT_TRUE(ClosedByServer(idle.front())) << "the oldest makes room";
  for (int fd : idle) close(fd);
}

TEST(HttpEndpointTest, AClientTricklingBytesIsClosedAtItsDeadlineForTheWholeRequest) {
  auto endpoint = HttpEndpoint::Start("127.0.0.1", 0, {});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int fd = Connect((*endpoint)->port());
  ASSERT_GE(fd, 0);
  // A byte every 100 ms never lets a per-byte timeout (the old 5 s) pass; the request's own
  // deadline (5 s for the whole of it) does. Bounded: 200 bytes, 20 s.
  bool closed = false;
  for (int i = 0; i < 200 && !closed; ++i) {
    closed = send(fd, "G", 1, MSG_NOSIGNAL) != 1 || ClosedByServer(fd);
    if (!closed) {
      pollfd wait_for_close{fd, POLLIN, 0};
      poll(&wait_for_close, 1, 100);
      closed = ClosedByServer(fd);
    }
  }
  EXPECT_TRUE(closed) << "the trickling client kept its connection for 20 s";
  close(fd);
}

TEST(HttpEndpointTest, StopsServingWhenDestroyed) {
  int port = 0;
  {
    auto endpoint = HttpEndpoint::Start("127.0.0.1", 0, {});
    ASSERT_TRUE(endpoint.ok());
    port = (*endpoint)->port();
  }
  EXPECT_EQ(Get(port, "/"), "");
}

}  // namespace
}  // namespace lockstep::http
