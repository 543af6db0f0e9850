// HttpEndpoint: a small HTTP/1.1 server for the observability endpoints of Lockstep's processes:
// Prometheus /metrics in the worker and the exec agent, and /metrics, /healthz and /readyz in the
// operator.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto endpoint, HttpEndpoint::Start("0.0.0.0", 9400, {
//       {"/metrics", PrometheusHandler(registry)},
//       {"/healthz", [] { return HttpResponse{200, "text/plain", "ok\n"}; }}}));
//
// Why not prometheus-cpp's Exposer: it runs civetweb, whose threads are created with a fixed
// 100 KiB stack (compiled into Debian's libcivetweb). glibc refuses a thread stack smaller than
// the process's static TLS, and a worker with OpenBLAS, and on a GPU cuBLAS/cuBLASLt, carries up
// to about 170 KiB of it, so the Exposer cannot start in our binaries ("null context when constructing
// CivetServer"). prometheus-cpp still owns the registry and the text format; this only serves it.
//
// One thread serves up to 32 connections at once with non-blocking sockets and poll(2). Each
// connection has one 5 s deadline for its whole exchange (not per byte), a request is at most
// 16 KiB, and when 32 are open the oldest one still sending its request is closed to admit a new
// one (a response being written is never cut): a client that trickles bytes or holds connections
// half-open cannot keep a scraper out, and costs bounded memory.
// Handlers run on that thread. Only GET and HEAD; every response closes the connection.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"

namespace prometheus {
class Registry;
}

namespace lockstep::http {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Called on the endpoint's thread for each request of its path; must not block for long.
using HttpHandler = std::function<HttpResponse()>;

class HttpEndpoint {
 public:
  // Listens on host:port (port 0: a free port) and serves `handlers` by exact path until the
  // endpoint is destroyed. A busy port is UNAVAILABLE naming host:port.
  static StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& host, int port,
                                                       std::map<std::string, HttpHandler> handlers);
  // Stops serving and closes every connection; returns promptly.
  ~HttpEndpoint();

  int port() const { return port_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Connection;

  HttpEndpoint() = default;
  void Serve();
  // Reads what has arrived and writes what it can; false when the connection is to be closed
  // (answered, gone, or broken).
  bool Progress(Connection& connection);
  // The whole response text to a complete request.
  std::string Respond(const std::string& request) const;

  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // a pipe: writing to it ends Serve
  int port_ = 0;
  std::map<std::string, HttpHandler> handlers_;
  struct Thread;
  std::unique_ptr<Thread> thread_;
};

// Serves the registry in Prometheus' text exposition format (version 0.0.4).
HttpHandler PrometheusHandler(std::shared_ptr<prometheus::Registry> registry);

}  // namespace lockstep::http
