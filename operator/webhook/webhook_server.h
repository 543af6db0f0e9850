// WebhookServer: the operator's HTTPS endpoint for the API server's admission webhook calls
// (POST of an AdmissionReview, JSON in and out), on cpprestsdk's listener with TLS from the
// operator's own CA.
//
//   WebhookServerOptions options;
//   options.port = 9443;
//   options.cert_pem = serving.cert_pem + ca.cert_pem;  // leaf first, then the chain
//   options.key_pem = serving.key_pem;
//   LOCKSTEP_ASSIGN_OR_RETURN(auto server, WebhookServer::Start(options, {
//       {"/validate-trainingjob", [](const std::string& body) { return Review(body); }}}));
//
// Requests: only POST of a path in `handlers`, with a Content-Length of at most max_body_bytes
// (413 past it; 411 without one or with a Transfer-Encoding: the API server always sends a
// length); anything else is answered 404/405. cpprestsdk accepts, handshakes and reads bodies on
// its shared I/O pool (which the operator's API clients use too), so nothing here waits there:
// handlers run on review_threads threads of the server's own and may block (a scale review
// reads the job). At most max_queued requests are held at once, from their headers until their
// answer; past it a request is answered 503: the API server's failurePolicy decides, within its
// timeout, instead of a backlog that grows without bound. No per-connection deadline (cpprestsdk
// has none): the API server is the only intended client; a NetworkPolicy keeps others out.
// TLS 1.2 and newer only.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/http/http_endpoint.h"
#include "common/status.h"

namespace lockstep::op::webhook {

struct WebhookServerOptions {
  std::string host = "0.0.0.0";
  int port = 9443;       // 1..65535 (cpprestsdk's listener cannot report a port 0 picked for it)
  std::string cert_pem;  // serving certificate, then its chain
  std::string key_pem;
  // An AdmissionReview of an UPDATE holds the object twice; etcd stores at most 1.5 MiB each.
  size_t max_body_bytes = 4 << 20;
  int review_threads = 2;
  size_t max_queued = 256;
};

// Called on one of the server's threads with the request body; may block briefly.
using WebhookHandler = std::function<http::HttpResponse(const std::string& body)>;

class WebhookServer {
 public:
  // Listens and serves until destroyed. INVALID_ARGUMENT when the certificate or key does not
  // load; UNAVAILABLE naming host:port when it cannot listen.
  static StatusOr<std::unique_ptr<WebhookServer>> Start(
      const WebhookServerOptions& options, std::map<std::string, WebhookHandler> handlers);
  // Stops listening; reviews still queued are answered 503; returns once every thread is done.
  ~WebhookServer();

  int port() const { return options_.port; }

 private:
  struct Listener;  // cpprestsdk's listener, kept out of this header
  struct Review;

  WebhookServer(WebhookServerOptions options, std::map<std::string, WebhookHandler> handlers);
  void Enqueue(std::unique_ptr<Review> review);
  void ServeReviews();

  WebhookServerOptions options_;
  std::map<std::string, WebhookHandler> handlers_;
  std::unique_ptr<Listener> listener_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::unique_ptr<Review>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
  std::atomic<size_t> in_flight_{0};  // requests from their headers until their review ends
};

}  // namespace lockstep::op::webhook
