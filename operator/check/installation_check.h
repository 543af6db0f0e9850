// `lockstep-operator check`: what `helm test` runs in a pod beside an installed operator, to say
// that the installation answers as workers and the API server will need it to:
//  - the admission webhook, through its Service over TLS from the operator's CA, refuses a
//    TrainingJob with a bad field, naming the field (the API server's call, made by hand);
//  - the rendezvous service, through its Service over TLS from the same CA, answers a member of
//    no job with NOT_FOUND (what a worker's first call meets before its job is served);
//  - the metrics Service serves Prometheus text with the operator's own metrics.
// Each check has its own deadline, all of the call (the HTTP ones are cancelled at it); every
// check runs even after one fails, and each result names what was called and what came back.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep::op::check {

struct CheckOptions {
  // https://<release>-webhook.<namespace>.svc:443/validate-trainingjob; empty: not checked (the
  // chart's webhook.enabled is false).
  std::string webhook_url;
  // The name the webhook's certificate must carry, sent as the Host (and TLS server name), when
  // the URL holds an address: the API server's "<service>.<namespace>.svc". Empty: the URL's host.
  std::string webhook_server_name;
  std::string rendezvous_address;  // host:port of the rendezvous Service
  std::string metrics_url;         // http://<release>-metrics.<namespace>.svc:<port>/metrics
  std::string ca_pem;              // the operator's CA (ca.crt of its Secret)
  std::string namespace_name = "default";  // the namespace the reviewed job claims
  int64_t timeout_ms = 20000;             // each check's deadline
};

struct CheckResult {
  std::string name;  // "webhook", "rendezvous", "metrics"
  Status status;     // OK: what it saw is in `detail`
  std::string detail;
  double seconds = 0;
};

// Runs every check in turn; `done`, when given, is called with each result as soon as it is known
// (so that a pod killed at its deadline has printed what it learnt).
std::vector<CheckResult> CheckInstallation(
    const CheckOptions& options, const std::function<void(const CheckResult&)>& done = nullptr);

// A check's line ("ok     webhook      0.12 s  refused ..."), and the verdict after all of them:
// "all N checks passed" or "M of N checks failed".
std::string CheckLine(const CheckResult& result);
std::string CheckVerdict(const std::vector<CheckResult>& results);

// The parts, for tests.
CheckResult CheckWebhook(const CheckOptions& options);
CheckResult CheckRendezvous(const CheckOptions& options);
CheckResult CheckMetrics(const CheckOptions& options);

}  // namespace lockstep::op::check
