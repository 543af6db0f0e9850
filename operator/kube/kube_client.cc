#include "operator/kube/kube_client.h"

#include <cpprest/http_client.h>
#include <cpprest/uri.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <pplx/threadpool.h>

#include <algorithm>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <cmath>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "common/deadline.h"
#include "common/logging.h"
#include "operator/kube/api_status.h"
#include "operator/kube/token_bucket.h"

namespace lockstep::op::kube {
namespace {

using web::http::http_request;
using web::http::http_response;
using web::http::client::http_client;
using web::http::client::http_client_config;

constexpr int64_t kMaxRetryBackoffMs = 2000;
constexpr int64_t kFirstRetryBackoffMs = 100;
// How often a blocked watch looks at its stop flag: the contract promises about 1 s.
constexpr auto kStopPollInterval = std::chrono::milliseconds(100);

double JitteredMs(int64_t base_ms) {
  thread_local std::mt19937 random(std::random_device{}());
  std::uniform_real_distribution<double> jitter(1.0, 1.2);
  return static_cast<double>(base_ms) * jitter(random);
}

// Trusts exactly the kubeconfig's CA (as kubectl does), not the system's roots besides it, and
// presents the client certificate. PEM comes from memory: the client never reads a file.
void ConfigureSslContext(boost::asio::ssl::context& context, const KubeConfig& config,
                         boost::system::error_code* error) {
  if (!config.ca_pem.empty()) {
    // A fresh store drops the default roots cpprestsdk loaded before calling us.
    SSL_CTX_set_cert_store(context.native_handle(), X509_STORE_new());
    context.add_certificate_authority(boost::asio::buffer(config.ca_pem), *error);
    if (*error) return;
  }
  if (!config.client_cert_pem.empty()) {
    context.use_certificate_chain(boost::asio::buffer(config.client_cert_pem), *error);
    if (*error) return;
    context.use_private_key(boost::asio::buffer(config.client_key_pem),
                            boost::asio::ssl::context::pem, *error);
  }
}

std::string UrlEncode(const std::string& value) {
  return utility::conversions::to_utf8string(
      web::uri::encode_data_string(utility::conversions::to_string_t(value)));
}

// Builds "?a=b&c=d" from the non-empty values.
class Query {
 public:
  Query& Add(const std::string& key, const std::string& value) {
    if (value.empty()) return *this;
    text_ += (text_.empty() ? "?" : "&") + key + "=" + UrlEncode(value);
    return *this;
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

struct HttpResult {
  int status = 0;
  std::string body;
  int64_t retry_after_seconds = -1;  // -1: no Retry-After header
};

WatchEventType EventTypeOf(const std::string& type, bool* known) {
  *known = true;
  if (type == "ADDED") return WatchEventType::kAdded;
  if (type == "MODIFIED") return WatchEventType::kModified;
  if (type == "DELETED") return WatchEventType::kDeleted;
  if (type == "BOOKMARK") return WatchEventType::kBookmark;
  *known = false;
  return WatchEventType::kAdded;
}

class RestKubeClient : public KubeClient {
 public:
  RestKubeClient(KubeConfig config, ClientOptions options)
      : config_(std::move(config)),
        options_(std::move(options)),
        limiter_(options_.qps, options_.burst) {}

  Status Init() {
    if (config_.server.empty()) return InvalidArgumentError("kube client: no server address");
    if (config_.client_cert_pem.empty() != config_.client_key_pem.empty()) {
      return InvalidArgumentError("kube client: client certificate and key must come together");
    }
    // Refuse unusable PEM now, with a clear message, rather than on every connection.
    if (!config_.ca_pem.empty() || !config_.client_cert_pem.empty()) {
      try {
        boost::asio::ssl::context context(boost::asio::ssl::context::tls_client);
        boost::system::error_code error;
        ConfigureSslContext(context, config_, &error);
        if (error) {
          return InvalidArgumentError("kube client: CA or client certificate/key PEM: " +
                                      error.message());
        }
      } catch (const std::exception& e) {
        return InvalidArgumentError(std::string("kube client: TLS setup: ") + e.what());
      }
    }
    try {
      client_ = std::make_unique<http_client>(utility::conversions::to_string_t(config_.server),
                                              MakeConfig(options_.request_timeout_ms));
    } catch (const std::exception& e) {
      return InvalidArgumentError("kube client: server \"" + config_.server + "\": " + e.what());
    }
    return OkStatus();
  }

  StatusOr<json> Get(const Resource& resource, const std::string& ns, const std::string& name,
                     const std::string& subresource) override {
    return Call("GET", ObjectPath(resource, ns, name, subresource), "", nullptr, "",
                /*idempotent=*/true);
  }

  StatusOr<ListResult> List(const Resource& resource, const std::string& ns,
                            const ListOptions& options) override {
    ListResult result;
    std::string continue_token;
    const std::string path = CollectionPath(resource, ns);
    do {
      Query query;
      query.Add("labelSelector", options.label_selector)
          .Add("fieldSelector", options.field_selector);
      if (options.limit > 0) query.Add("limit", std::to_string(options.limit));
      // The continue token carries the snapshot's version; the server refuses both at once.
      if (continue_token.empty()) {
        query.Add("resourceVersion", options.resource_version);
      } else {
        query.Add("continue", continue_token);
      }
      LOCKSTEP_ASSIGN_OR_RETURN(json page,
                                Call("GET", path, query.text(), nullptr, "", /*idempotent=*/true));
      const json& metadata = page.contains("metadata") ? page["metadata"] : json::object();
      result.resource_version = metadata.value("resourceVersion", "");
      continue_token = metadata.value("continue", "");
      std::vector<json> items;
      if (page.contains("items") && page["items"].is_array()) {
        items.reserve(page["items"].size());
        // Lists omit each item's kind and apiVersion; handlers expect whole objects.
        for (json& item : page["items"]) {
          if (!item.contains("kind")) item["kind"] = resource.kind;
          if (!item.contains("apiVersion")) item["apiVersion"] = resource.api_version();
          items.push_back(std::move(item));
        }
      }
      if (options.on_page) {
        try {
          options.on_page(items);
        } catch (const std::exception& e) {
          return InternalError("LIST " + path + ": page handler threw: " + e.what());
        }
      } else {
        for (json& item : items) result.items.push_back(std::move(item));
      }
    } while (!continue_token.empty() && !options.first_page_only);
    return result;
  }

  Status Watch(const Resource& resource, const std::string& ns, const WatchOptions& options,
               const std::function<bool(const WatchEvent&)>& on_event,
               const std::atomic<bool>* stop) override {
    Query query;
    query.Add("watch", "true")
        .Add("labelSelector", options.label_selector)
        .Add("fieldSelector", options.field_selector)
        .Add("resourceVersion", options.resource_version);
    if (options.allow_bookmarks) query.Add("allowWatchBookmarks", "true");
    if (options.timeout_seconds > 0) {
      query.Add("timeoutSeconds", std::to_string(options.timeout_seconds));
    }
    const std::string path = CollectionPath(resource, ns);
    const std::string what = "WATCH " + path;
    try {
      return WatchStream(path + query.text(), what, options, on_event, stop);
    } catch (const std::exception& e) {
      return UnavailableError(what + ": " + e.what());
    }
  }

  StatusOr<json> Create(const Resource& resource, const std::string& ns,
                        const json& object) override {
    return Call("POST", CollectionPath(resource, NamespaceFor(resource, ns, object)), "", &object,
                "application/json", /*idempotent=*/false);
  }

  StatusOr<json> Update(const Resource& resource, const std::string& ns, const json& object,
                        const std::string& subresource) override {
    std::string name;
    if (object.contains("metadata") && object["metadata"].is_object()) {
      name = object["metadata"].value("name", "");
    }
    if (name.empty()) return InvalidArgumentError("PUT " + resource.plural + ": no metadata.name");
    return Call("PUT", ObjectPath(resource, NamespaceFor(resource, ns, object), name, subresource),
                "", &object, "application/json", /*idempotent=*/false);
  }

  StatusOr<json> Patch(const Resource& resource, const std::string& ns, const std::string& name,
                       PatchType type, const json& patch, const std::string& subresource) override {
    const char* content_type = type == PatchType::kMerge ? "application/merge-patch+json"
                               : type == PatchType::kJson
                                   ? "application/json-patch+json"
                                   : "application/strategic-merge-patch+json";
    return Call("PATCH", ObjectPath(resource, ns, name, subresource), "", &patch, content_type,
                /*idempotent=*/false);
  }

  Status Delete(const Resource& resource, const std::string& ns, const std::string& name,
                const DeleteOptions& options) override {
    json body = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}};
    if (!options.propagation_policy.empty()) {
      body["propagationPolicy"] = options.propagation_policy;
    }
    if (!options.precondition_uid.empty()) body["preconditions"]["uid"] = options.precondition_uid;
    if (!options.precondition_resource_version.empty()) {
      body["preconditions"]["resourceVersion"] = options.precondition_resource_version;
    }
    if (options.grace_period_seconds) body["gracePeriodSeconds"] = *options.grace_period_seconds;
    return Call("DELETE", ObjectPath(resource, ns, name), "", &body, "application/json",
                /*idempotent=*/false)
        .status();
  }

  int64_t requests_sent() const override { return requests_sent_.load(); }

 private:
  // The object's own namespace when the caller passes none (a namespaced kind needs one).
  static std::string NamespaceFor(const Resource& resource, const std::string& ns,
                                  const json& object) {
    if (!ns.empty() || !resource.namespaced) return ns;
    if (object.contains("metadata") && object["metadata"].is_object()) {
      return object["metadata"].value("namespace", "");
    }
    return "";
  }

  http_client_config MakeConfig(int64_t timeout_ms) const {
    http_client_config config;
    config.set_timeout(std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 1)));
    config.set_validate_certificates(!config_.insecure_skip_tls_verify);
    KubeConfig tls = config_;
    config.set_ssl_context_callback([tls](boost::asio::ssl::context& context) {
      boost::system::error_code error;  // validated in Init; never throw into cpprestsdk
      ConfigureSslContext(context, tls, &error);
    });
    return config;
  }

  http_request MakeRequest(const std::string& method, const std::string& path_and_query,
                           const json* body, const std::string& content_type) const {
    http_request request(utility::conversions::to_string_t(method));
    request.set_request_uri(utility::conversions::to_string_t(path_and_query));
    auto& headers = request.headers();
    headers.add("Accept", "application/json");
    headers.add("User-Agent", options_.user_agent);
    if (!config_.token.empty()) headers.add("Authorization", "Bearer " + config_.token);
    if (body != nullptr) request.set_body(body->dump(), content_type);
    return request;
  }

  // One exchange, bounded by the deadline; never throws. Transport failures are UNAVAILABLE.
  StatusOr<HttpResult> Exchange(const std::string& method, const std::string& path_and_query,
                                const json* body, const std::string& content_type,
                                Deadline deadline, const std::string& what) {
    auto promise = std::make_shared<std::promise<StatusOr<HttpResult>>>();
    std::future<StatusOr<HttpResult>> future = promise->get_future();
    pplx::cancellation_token_source cancel;
    try {
      http_request request = MakeRequest(method, path_and_query, body, content_type);
      client_->request(request, cancel.get_token())
          .then([](http_response response) {
            return response.extract_vector().then([response](std::vector<unsigned char> bytes) {
              HttpResult result;
              result.status = response.status_code();
              result.body.assign(bytes.begin(), bytes.end());
              const auto& headers = response.headers();
              auto retry_after = headers.find("Retry-After");
              if (retry_after != headers.end()) {
                try {
                  result.retry_after_seconds = std::stoll(retry_after->second);
                } catch (const std::exception&) {
                  result.retry_after_seconds = 1;  // an HTTP date: wait a little
                }
              }
              return result;
            });
          })
          .then([promise, what](pplx::task<HttpResult> task) {
            try {
              promise->set_value(task.get());
            } catch (const pplx::task_canceled&) {
              promise->set_value(DeadlineExceededError(what + ": deadline passed"));
            } catch (const std::exception& e) {
              promise->set_value(UnavailableError(what + ": " + e.what()));
            }
          });
    } catch (const std::exception& e) {
      return InvalidArgumentError(what + ": " + e.what());
    }
    if (future.wait_until(deadline.at()) == std::future_status::timeout) {
      cancel.cancel();
      future.wait();  // cancellation closes the connection; nothing may outlive this frame
      return DeadlineExceededError(what + ": no answer within the deadline");
    }
    return future.get();
  }

  // Rate limit, send, map errors, retry what may be retried, all inside one deadline.
  StatusOr<json> Call(const std::string& method, const std::string& path, const std::string& query,
                      const json* body, const std::string& content_type, bool idempotent) {
    const std::string what = method + " " + path;
    const Deadline deadline = Deadline::AfterMs(options_.request_timeout_ms);
    int64_t backoff_ms = kFirstRetryBackoffMs;
    while (true) {
      LOCKSTEP_RETURN_IF_ERROR(limiter_.Wait(deadline, nullptr).WithContext(what));
      ++requests_sent_;
      StatusOr<HttpResult> exchanged =
          Exchange(method, path + query, body, content_type, deadline, what);
      Status failure;
      int64_t wait_ms = -1;  // -1: do not retry
      if (!exchanged.ok()) {
        failure = exchanged.status();
        if (failure.code() == StatusCode::kUnavailable && deadline.expired()) {
          // The transport failed because the deadline cut it short (cpprestsdk ends a TLS
          // handshake in flight with "Error in SSL handshake"): the deadline is the cause, and
          // the transport's words say where it was.
          return DeadlineExceededError(what + ": deadline passed (" + failure.message() + ")");
        }
        if (failure.code() == StatusCode::kUnavailable && idempotent) wait_ms = backoff_ms;
      } else if (exchanged->status >= 200 && exchanged->status < 300) {
        if (exchanged->body.empty()) return json::object();
        json parsed = json::parse(exchanged->body, nullptr, /*allow_exceptions=*/false);
        if (parsed.is_discarded()) return UnavailableError(what + ": response is not JSON");
        return parsed;
      } else {
        const HttpResult& result = *exchanged;
        const json parsed = json::parse(result.body, nullptr, /*allow_exceptions=*/false);
        failure = StatusFromKubeStatus(result.status, parsed, result.body, what);
        // A 429 was refused before any processing (max-in-flight, priority and fairness), so
        // even a write may be sent again once the server says when.
        if (result.status == 429) {
          wait_ms =
              result.retry_after_seconds >= 0 ? result.retry_after_seconds * 1000 : backoff_ms;
        } else if (failure.code() == StatusCode::kUnavailable && idempotent) {
          wait_ms =
              result.retry_after_seconds >= 0 ? result.retry_after_seconds * 1000 : backoff_ms;
        }
      }
      if (wait_ms < 0) return failure;
      const double sleep_ms = JitteredMs(std::max<int64_t>(wait_ms, 1));
      if (sleep_ms >= deadline.remaining_ms()) return failure;
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(sleep_ms * 1000)));
      backoff_ms = std::min(backoff_ms * 2, kMaxRetryBackoffMs);
    }
  }

  // Waits on `future` in short steps so that *stop and the deadline are noticed.
  template <typename T>
  static std::future_status WaitStoppable(std::future<T>& future, Deadline deadline,
                                          const std::atomic<bool>* stop, bool* stopped) {
    *stopped = false;
    while (true) {
      const auto until = std::min(deadline.at(), Deadline::Clock::now() + kStopPollInterval);
      if (future.wait_until(until) == std::future_status::ready) return std::future_status::ready;
      if (stop != nullptr && stop->load()) {
        *stopped = true;
        return std::future_status::timeout;
      }
      if (deadline.expired()) return std::future_status::timeout;
    }
  }

  Status WatchStream(const std::string& path_and_query, const std::string& what,
                     const WatchOptions& options,
                     const std::function<bool(const WatchEvent&)>& on_event,
                     const std::atomic<bool>* stop) {
    const Deadline open_deadline = Deadline::AfterMs(options_.request_timeout_ms);
    const int64_t total_ms =
        std::max<int64_t>(options.timeout_seconds, 0) * 1000 + options_.request_timeout_ms;
    const Deadline deadline = Deadline::AfterMs(total_ms);
    LOCKSTEP_RETURN_IF_ERROR(limiter_.Wait(open_deadline, stop).WithContext(what));
    ++requests_sent_;

    // A watch holds its connection for minutes; its own client keeps it out of the shared pool
    // and gives it an inactivity timeout longer than the server's own.
    auto client = std::make_shared<http_client>(utility::conversions::to_string_t(config_.server),
                                                MakeConfig(total_ms));
    pplx::cancellation_token_source cancel;
    auto response_promise = std::make_shared<std::promise<http_response>>();
    std::future<http_response> response_future = response_promise->get_future();
    client->request(MakeRequest("GET", path_and_query, nullptr, ""), cancel.get_token())
        .then([response_promise](pplx::task<http_response> task) {
          try {
            response_promise->set_value(task.get());
          } catch (...) {
            response_promise->set_exception(std::current_exception());
          }
        });
    // Cancels the request and waits for cpprestsdk to let go of it before the client goes.
    auto abandon = [&](Status status) {
      cancel.cancel();
      response_future.wait();
      return status;
    };

    bool stopped = false;
    if (WaitStoppable(response_future, open_deadline, stop, &stopped) !=
        std::future_status::ready) {
      return abandon(stopped ? CancelledError(what + ": stopped")
                             : DeadlineExceededError(what + ": no response within the deadline"));
    }
    http_response response;
    try {
      response = response_future.get();
    } catch (const pplx::task_canceled&) {
      return DeadlineExceededError(what + ": cancelled");
    } catch (const std::exception& e) {
      return UnavailableError(what + ": " + e.what());
    }

    if (response.status_code() != 200) {
      std::string raw;
      try {
        auto body_task = response.extract_vector();
        std::vector<unsigned char> bytes = body_task.get();
        raw.assign(bytes.begin(), bytes.end());
      } catch (const std::exception&) {
      }
      const json parsed = json::parse(raw, nullptr, /*allow_exceptions=*/false);
      return StatusFromKubeStatus(response.status_code(), parsed, raw, what);
    }

    Status result = ReadEvents(response, what, deadline, on_event, stop);
    // Done early (stop, on_event false, an error): close the connection instead of draining it.
    cancel.cancel();
    try {
      response.content_ready().wait();
    } catch (const std::exception&) {
    }
    return result;
  }

  // The API server frames a JSON watch as one WatchEvent object per line.
  Status ReadEvents(http_response& response, const std::string& what, Deadline deadline,
                    const std::function<bool(const WatchEvent&)>& on_event,
                    const std::atomic<bool>* stop) {
    concurrency::streams::streambuf<uint8_t> body = response.body().streambuf();
    std::string pending;
    std::vector<uint8_t> chunk(64 * 1024);
    while (true) {
      // Take what has arrived without blocking; otherwise wait (stoppably) for one more byte.
      size_t available = body.in_avail();
      if (available > 0) {
        // At most what is available: the read completes at once.
        size_t n = 0;
        try {
          n = body.getn(chunk.data(), std::min(available, chunk.size())).get();
        } catch (const std::exception& e) {
          return UnavailableError(what + ": stream broken: " + e.what());
        }
        pending.append(chunk.begin(), chunk.begin() + n);
      } else {
        auto byte_promise = std::make_shared<std::promise<int>>();
        std::future<int> byte_future = byte_promise->get_future();
        body.bumpc().then([byte_promise](pplx::task<int> task) {
          try {
            byte_promise->set_value(task.get());
          } catch (...) {
            byte_promise->set_exception(std::current_exception());
          }
        });
        bool stopped = false;
        if (WaitStoppable(byte_future, deadline, stop, &stopped) != std::future_status::ready) {
          return stopped ? CancelledError(what + ": stopped")
                         : DeadlineExceededError(what + ": watch outlived its deadline");
        }
        int byte = -1;
        try {
          byte = byte_future.get();
        } catch (const std::exception& e) {
          return UnavailableError(what + ": stream broken: " + e.what());
        }
        if (byte == concurrency::streams::streambuf<uint8_t>::traits::eof()) {
          // End of body: the server closed the watch (OK) or the connection broke.
          try {
            response.content_ready().get();
          } catch (const std::exception& e) {
            return UnavailableError(what + ": stream broken: " + e.what());
          }
          return OkStatus();
        }
        pending.push_back(static_cast<char>(byte));
      }
      size_t newline;
      while ((newline = pending.find('\n')) != std::string::npos) {
        std::string line = pending.substr(0, newline);
        pending.erase(0, newline + 1);
        if (line.empty()) continue;
        if (stop != nullptr && stop->load()) return CancelledError(what + ": stopped");
        bool keep_going = true;
        LOCKSTEP_RETURN_IF_ERROR(HandleEventLine(line, what, on_event, &keep_going));
        if (!keep_going) return OkStatus();
      }
    }
  }

  static Status HandleEventLine(const std::string& line, const std::string& what,
                                const std::function<bool(const WatchEvent&)>& on_event,
                                bool* keep_going) {
    json parsed = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_object()) {
      return UnavailableError(what + ": a watch event is not JSON");
    }
    const std::string type = parsed.value("type", "");
    json& object = parsed["object"];
    if (type == "ERROR") {
      // The object is a Status; code 410 (reason Expired) means relist.
      const int code = object.is_object() ? object.value("code", 500) : 500;
      return StatusFromKubeStatus(code, object, line, what);
    }
    bool known = false;
    WatchEvent event{EventTypeOf(type, &known), std::move(object)};
    if (!known) return UnavailableError(what + ": unknown watch event type \"" + type + "\"");
    try {
      *keep_going = on_event(event);
    } catch (const std::exception& e) {
      return InternalError(what + ": event handler threw: " + e.what());
    }
    return OkStatus();
  }

  KubeConfig config_;
  ClientOptions options_;
  TokenBucket limiter_;
  std::unique_ptr<http_client> client_;
  std::atomic<int64_t> requests_sent_{0};
};

}  // namespace

StatusOr<std::unique_ptr<KubeClient>> KubeClient::Create(const KubeConfig& config,
                                                         const ClientOptions& options) {
  auto client = std::make_unique<RestKubeClient>(config, options);
  LOCKSTEP_RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<KubeClient>(std::move(client));
}

Status RetryOnConflict(const std::function<Status()>& attempt, int attempts) {
  Status status;
  int64_t backoff_ms = 10;
  for (int i = 0; i < std::max(1, attempts); ++i) {
    if (i > 0) {
      std::this_thread::sleep_for(
          std::chrono::microseconds(static_cast<int64_t>(JitteredMs(backoff_ms) * 1000)));
      backoff_ms *= 2;
    }
    status = attempt();
    if (!IsConflict(status)) return status;
  }
  return status;
}

Status InitializeIoThreads(size_t threads) {
  if (threads == 0) return InvalidArgumentError("I/O threads: must be at least 1");
  try {
    crossplat::threadpool::initialize_with_threads(threads);
  } catch (const std::exception& e) {
    return FailedPreconditionError(std::string("I/O threads: ") + e.what());
  }
  return OkStatus();
}

}  // namespace lockstep::op::kube
