#include "operator/check/installation_check.h"

#include <cpprest/http_client.h>
#include <nlohmann/json.hpp>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <future>
#include <memory>

#include "common/rendezvous/client.h"

namespace lockstep::op::check {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct HttpAnswer {
  int status = 0;
  std::string body;
  uint64_t refused_length = 0;  // the answer said it was this long, past kMaxAnswerBytes
};

// One request within timeout_ms, all of it: cpprestsdk's own timeout restarts with every step
// (connect, handshake, each read), so a server that trickles could hold it longer; the request
// is cancelled at the deadline instead. With a CA, the server's certificate must chain to exactly
// that CA and name `server_name` or else the URL's host (cpprestsdk checks both, and takes the
// name it verifies and sends as SNI from the Host header); without one, http:// only. An answer
// that says it is over kMaxAnswerBytes is refused before it is read.
constexpr uint64_t kMaxAnswerBytes = 16 << 20;

StatusOr<HttpAnswer> Request(const std::string& method, const std::string& url,
                             const std::string& body, const std::string& ca_pem,
                             const std::string& server_name, int64_t timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 1));
  web::http::client::http_client_config config;
  config.set_timeout(std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 1)));
  if (!ca_pem.empty()) {
    config.set_ssl_context_callback([ca_pem](boost::asio::ssl::context& context) {
      // A fresh store drops the system's roots: only the operator's CA is trusted.
      SSL_CTX_set_cert_store(context.native_handle(), X509_STORE_new());
      boost::system::error_code error;  // a CA that does not load fails the handshake
      context.add_certificate_authority(boost::asio::buffer(ca_pem), error);
    });
  }
  const std::string what = method + " " + url;
  auto promise = std::make_shared<std::promise<StatusOr<HttpAnswer>>>();
  std::future<StatusOr<HttpAnswer>> future = promise->get_future();
  pplx::cancellation_token_source cancel;
  try {
    web::http::client::http_client client(utility::conversions::to_string_t(url), config);
    web::http::http_request request(utility::conversions::to_string_t(method));
    if (!body.empty()) request.set_body(body, "application/json");
    if (!server_name.empty()) request.headers().add("Host", server_name);
    client.request(request, cancel.get_token())
        .then([](web::http::http_response response) -> pplx::task<HttpAnswer> {
          HttpAnswer answer;
          answer.status = response.status_code();
          const uint64_t length = response.headers().content_length();
          if (length > kMaxAnswerBytes) {
            answer.refused_length = length;
            return pplx::task_from_result(answer);
          }
          return response.extract_utf8string(/*ignore_content_type=*/true)
              .then([answer](const std::string& text) mutable {
                answer.body = text;
                return answer;
              });
        })
        .then([promise, what](pplx::task<HttpAnswer> task) {
          try {
            HttpAnswer answer = task.get();
            if (answer.refused_length > 0) {
              promise->set_value(FailedPreconditionError(
                  what + " answered " + std::to_string(answer.refused_length) +
                  " bytes, more than " + std::to_string(kMaxAnswerBytes)));
            } else {
              promise->set_value(std::move(answer));
            }
          } catch (const pplx::task_canceled&) {
            promise->set_value(DeadlineExceededError(what + ": no answer within the deadline"));
          } catch (const std::exception& e) {
            promise->set_value(UnavailableError(what + ": " + e.what()));
          }
        });
  } catch (const std::exception& e) {
    return InvalidArgumentError(what + ": " + e.what());
  }
  if (future.wait_until(deadline) == std::future_status::timeout) {
    cancel.cancel();
    future.wait();  // cancellation closes the connection; nothing may outlive this frame
    return DeadlineExceededError(what + ": no answer within " + std::to_string(timeout_ms) +
                                 " ms");
  }
  return future.get();
}

CheckResult Timed(const std::string& name, const std::function<Status(std::string*)>& check) {
  CheckResult result;
  result.name = name;
  const auto start = Clock::now();
  result.status = check(&result.detail);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

// What the API server would send for `kubectl apply` of a job with replicas -1.
std::string BadJobReview(const std::string& ns) {
  const json job = {{"apiVersion", "lockstep.io/v1alpha1"},
                    {"kind", "TrainingJob"},
                    {"metadata", {{"name", "lockstep-installation-check"}, {"namespace", ns}}},
                    {"spec", {{"replicas", -1}}}};
  const json review = {
      {"apiVersion", "admission.k8s.io/v1"},
      {"kind", "AdmissionReview"},
      {"request",
       {{"uid", "lockstep-installation-check"},
        {"kind", {{"group", "lockstep.io"}, {"version", "v1alpha1"}, {"kind", "TrainingJob"}}},
        {"resource",
         {{"group", "lockstep.io"}, {"version", "v1alpha1"}, {"resource", "trainingjobs"}}},
        {"operation", "CREATE"},
        {"namespace", ns},
        {"name", "lockstep-installation-check"},
        {"object", job}}}};
  return review.dump();
}

}  // namespace

CheckResult CheckWebhook(const CheckOptions& options) {
  return Timed("webhook", [&](std::string* detail) -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(HttpAnswer answer,
                              Request("POST", options.webhook_url,
                                      BadJobReview(options.namespace_name), options.ca_pem,
                                      options.webhook_server_name, options.timeout_ms));
    if (answer.status != 200) {
      return FailedPreconditionError("POST " + options.webhook_url + " answered HTTP " +
                                     std::to_string(answer.status) + ": " +
                                     answer.body.substr(0, 300));
    }
    const json review = json::parse(answer.body, nullptr, /*allow_exceptions=*/false);
    const json response = review.is_object() ? review.value("response", json()) : json();
    if (!response.is_object() || !response.contains("allowed")) {
      return FailedPreconditionError("POST " + options.webhook_url +
                                     " answered no AdmissionReview response: " +
                                     answer.body.substr(0, 300));
    }
    const std::string message =
        response.value("status", json::object()).value("message", std::string());
    if (response["allowed"] != false || message.find("spec.replicas") == std::string::npos) {
      return FailedPreconditionError(
          "the webhook did not refuse a TrainingJob with spec.replicas -1 naming the field: " +
          response.dump().substr(0, 300));
    }
    *detail = "refused a TrainingJob with spec.replicas -1 (\"" +
              message.substr(0, message.find('\n')) + "\")";
    return OkStatus();
  });
}

CheckResult CheckRendezvous(const CheckOptions& options) {
  return Timed("rendezvous", [&](std::string* detail) -> Status {
    rendezvous::ClientOptions client;
    client.address = options.rendezvous_address;
    client.job = options.namespace_name + "/lockstep-installation-check";
    client.token = "not-a-job-token";
    client.member_id = "lockstep-installation-check";
    client.tls_ca_pem = options.ca_pem;
    client.rpc_timeout_ms = options.timeout_ms;
    client.reconnect_timeout_ms = 0;
    LOCKSTEP_ASSIGN_OR_RETURN(auto connected, rendezvous::RendezvousClient::Connect(client));
    const Status left = connected->Leave(/*completed=*/false, rendezvous::ProgressReport{});
    if (left.code() != StatusCode::kNotFound) {
      return FailedPreconditionError("a member of no job at " + options.rendezvous_address +
                                     " got " + (left.ok() ? "OK" : left.ToString()) +
                                     ", where the service answers NOT_FOUND");
    }
    *detail = "answered a member of no job with NOT_FOUND" +
              std::string(options.ca_pem.empty() ? "" : ", over TLS from the operator's CA");
    return OkStatus();
  });
}

CheckResult CheckMetrics(const CheckOptions& options) {
  return Timed("metrics", [&](std::string* detail) -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(HttpAnswer answer,
                              Request("GET", options.metrics_url, "", "", "", options.timeout_ms));
    if (answer.status != 200) {
      return FailedPreconditionError("GET " + options.metrics_url + " answered HTTP " +
                                     std::to_string(answer.status));
    }
    int families = 0;
    for (size_t at = answer.body.find("# TYPE lockstep_operator_"); at != std::string::npos;
         at = answer.body.find("# TYPE lockstep_operator_", at + 1)) {
      ++families;
    }
    if (families == 0) {
      return FailedPreconditionError("GET " + options.metrics_url +
                                     " served no lockstep_operator_ metric");
    }
    *detail = "served " + std::to_string(families) + " lockstep_operator_ metrics";
    return OkStatus();
  });
}

std::vector<CheckResult> CheckInstallation(
    const CheckOptions& options, const std::function<void(const CheckResult&)>& done) {
  std::vector<CheckResult> results;
  auto run = [&](CheckResult (*check)(const CheckOptions&)) {
    results.push_back(check(options));
    if (done) done(results.back());
  };
  if (!options.webhook_url.empty()) run(CheckWebhook);
  run(CheckRendezvous);
  run(CheckMetrics);
  return results;
}

std::string CheckLine(const CheckResult& result) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%6.2f s", result.seconds);
  return std::string(result.status.ok() ? "ok     " : "FAILED ") + result.name +
         std::string(result.name.size() < 11 ? 11 - result.name.size() : 1, ' ') + seconds +
         "  " + (result.status.ok() ? result.detail : result.status.message()) + "\n";
}

std::string CheckVerdict(const std::vector<CheckResult>& results) {
  int failed = 0;
  for (const CheckResult& result : results) {
    if (!result.status.ok()) ++failed;
  }
  return failed == 0 ? "all " + std::to_string(results.size()) + " checks passed\n"
                     : std::to_string(failed) + " of " + std::to_string(results.size()) +
                           " checks failed\n";
}

}  // namespace lockstep::op::check
