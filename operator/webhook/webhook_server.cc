#include "operator/webhook/webhook_server.h"

#include <cpprest/http_listener.h>

#include <algorithm>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <exception>
#include <utility>

#include "common/logging.h"

namespace lockstep::op::webhook {

namespace listener = web::http::experimental::listener;
using web::http::http_request;
using web::http::methods;
using web::http::status_code;

struct WebhookServer::Listener {
  std::unique_ptr<listener::http_listener> http;
};

struct WebhookServer::Review {
  http_request request;
  const WebhookHandler* handler = nullptr;
  std::string body;
  std::shared_ptr<void> done;  // releases the request's in-flight count when the review ends
};

namespace {

// Loads the serving certificate and key into `context`; false with `error` set when either does
// not load. Never throws (cpprestsdk calls it for each connection, where a throw is lost).
bool ConfigureContext(boost::asio::ssl::context& context, const std::string& cert_pem,
                      const std::string& key_pem, boost::system::error_code* error) {
  namespace ssl = boost::asio::ssl;
  context.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                          ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                          ssl::context::no_tlsv1_1 | ssl::context::single_dh_use,
                      *error);
  if (*error) return false;
  context.use_certificate_chain(boost::asio::buffer(cert_pem), *error);
  if (*error) return false;
  context.use_private_key(boost::asio::buffer(key_pem), ssl::context::pem, *error);
  return !*error;
}

// Never waits: the callers run on cpprestsdk's shared I/O pool (which every API client of the
// operator uses too), and a wait there for a send that needs the same pool could starve it.
void Reply(http_request& request, int status, const std::string& content_type,
           const std::string& body) {
  const std::string path = request.relative_uri().path();
  try {
    request.reply(static_cast<status_code>(status), body, content_type)
        .then([path](pplx::task<void> sent) {
          try {
            sent.get();
          } catch (const std::exception& error) {
            // The API server hung up (its timeout passed); it applies the failure policy itself.
            LOCKSTEP_LOG(WARNING) << "admission webhook: answering " << path << ": "
                                  << error.what();
          }
        });
  } catch (const std::exception& error) {
    LOCKSTEP_LOG(WARNING) << "admission webhook: answering " << path << ": " << error.what();
  }
}

}  // namespace

WebhookServer::WebhookServer(WebhookServerOptions options,
                             std::map<std::string, WebhookHandler> handlers)
    : options_(std::move(options)), handlers_(std::move(handlers)) {}

StatusOr<std::unique_ptr<WebhookServer>> WebhookServer::Start(
    const WebhookServerOptions& options, std::map<std::string, WebhookHandler> handlers) {
  if (options.port < 1 || options.port > 65535) {
    return InvalidArgumentError("webhook port " + std::to_string(options.port) +
                                " is not in 1..65535");
  }
  {
    boost::asio::ssl::context probe(boost::asio::ssl::context::tls_server);
    boost::system::error_code error;
    if (!ConfigureContext(probe, options.cert_pem, options.key_pem, &error)) {
      return InvalidArgumentError("webhook serving certificate or key does not load: " +
                                  error.message());
    }
  }
  std::unique_ptr<WebhookServer> server(new WebhookServer(options, std::move(handlers)));
  for (int i = 0; i < std::max(1, options.review_threads); ++i) {
    server->threads_.emplace_back([s = server.get()] { s->ServeReviews(); });
  }

  listener::http_listener_config config;
  const std::string cert = options.cert_pem, key = options.key_pem;
  config.set_ssl_context_callback([cert, key](boost::asio::ssl::context& context) {
    boost::system::error_code error;  // loaded once in Start already; never throw here
    if (!ConfigureContext(context, cert, key, &error)) {
      LOCKSTEP_LOG(ERROR) << "admission webhook TLS: " << error.message();
    }
  });
  const std::string address = options.host + ":" + std::to_string(options.port);
  server->listener_ = std::make_unique<Listener>();
  try {
    server->listener_->http = std::make_unique<listener::http_listener>(
        web::uri(utility::conversions::to_string_t("https://" + address)), config);
    server->listener_->http->support([s = server.get()](http_request request) {
      const std::string path = request.relative_uri().path();
      // Counted from the headers on, so that bodies being read are bounded too, and the
      // destructor waits for every continuation that still holds `s`.
      if (s->in_flight_.fetch_add(1) >= s->options_.max_queued) {
        s->in_flight_.fetch_sub(1);
        Reply(request, 503, "text/plain", "admission webhook busy\n");
        return;
      }
      // Released (the count decremented) when the last holder lets go: an early answer
      // below, or the review's end.
      std::shared_ptr<void> done(static_cast<void*>(s), [](void* server) {
        static_cast<WebhookServer*>(server)->in_flight_.fetch_sub(1);
      });
      auto handler = s->handlers_.find(path);
      if (handler == s->handlers_.end()) {
        Reply(request, 404, "text/plain", "no webhook at " + path + "\n");
        return;
      }
      if (request.method() != methods::POST) {
        Reply(request, 405, "text/plain", "only POST\n");
        return;
      }
      const auto& headers = request.headers();
      if (headers.has(web::http::header_names::transfer_encoding)) {
        // A chunked body would be read whole, whatever Content-Length says.
        Reply(request, 411, "text/plain", "Transfer-Encoding refused; send Content-Length\n");
        return;
      }
      if (!headers.has(web::http::header_names::content_length)) {
        Reply(request, 411, "text/plain", "Content-Length required\n");
        return;
      }
      if (headers.content_length() > s->options_.max_body_bytes) {
        Reply(request, 413, "text/plain",
              "body over " + std::to_string(s->options_.max_body_bytes) + " bytes\n");
        return;
      }
      auto review = std::make_shared<std::unique_ptr<Review>>(std::make_unique<Review>());
      (*review)->request = request;
      (*review)->handler = &handler->second;
      request.extract_utf8string(/*ignore_content_type=*/true)
          .then([s, review, done](pplx::task<std::string> body) {
            try {
              (*review)->body = body.get();
            } catch (const std::exception& error) {
              Reply((*review)->request, 400, "text/plain",
                    std::string("reading the body: ") + error.what() + "\n");
              return;
            }
            (*review)->done = done;
            s->Enqueue(std::move(*review));
          });
    });
    server->listener_->http->open().wait();
  } catch (const std::exception& error) {
    server->listener_.reset();  // nothing listens; the destructor stops the threads
    return UnavailableError("admission webhook cannot listen on " + address + ": " + error.what());
  }
  return server;
}

void WebhookServer::Enqueue(std::unique_ptr<Review> review) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_ && queue_.size() < options_.max_queued) {
      queue_.push_back(std::move(review));
      ready_.notify_one();
      return;
    }
  }
  Reply(review->request, 503, "text/plain", "admission webhook busy or stopping\n");
}

void WebhookServer::ServeReviews() {
  while (true) {
    std::unique_ptr<Review> review;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      review = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_) {
        lock.unlock();
        Reply(review->request, 503, "text/plain", "admission webhook stopping\n");
        continue;
      }
    }
    http::HttpResponse response;
    try {
      response = (*review->handler)(review->body);
    } catch (const std::exception& error) {
      response = {500, "text/plain", std::string("admission review failed: ") + error.what()};
    }
    Reply(review->request, response.status, response.content_type, response.body);
  }
}

WebhookServer::~WebhookServer() {
  // Queued reviews are answered (503) before the listener closes; reviews arriving meanwhile are
  // answered 503 by Enqueue. After the close, body reads still in flight may call Enqueue:
  // wait (bounded) until none holds the server.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (std::thread& thread : threads_) thread.join();
  if (listener_ && listener_->http) {
    try {
      listener_->http->close().wait();
    } catch (const std::exception& error) {
      LOCKSTEP_LOG(WARNING) << "closing the admission webhook: " << error.what();
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (in_flight_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace lockstep::op::webhook
