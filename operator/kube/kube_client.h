// KubeClient: the operator's Kubernetes REST client, on cpprestsdk (no maintained C++ client is
// packaged). Objects travel as nlohmann::json exactly as the API server speaks them.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto client, KubeClient::Create(config, {.qps = 50, .burst = 100}));
//   StatusOr<json> pod = client->Get(resources::kPods, "default", "fashion-worker-0");
//   if (IsNotFound(pod.status())) { ... }
//   LOCKSTEP_RETURN_IF_ERROR(RetryOnConflict([&] { return UpdateTheThing(*client); }));
//
// Errors. Every failure is a Status whose message names the verb, the path and the server's
// own message ("POST /api/v1/namespaces/default/pods: pods \"x\" already exists"). Codes, from
// the HTTP status and the Status object's `reason` (Kubernetes API conventions, "Response
// Status Kind"):
//   400 BadRequest, 422 Invalid  -> INVALID_ARGUMENT (the message keeps the server's field causes)
//   401 -> UNAUTHENTICATED, 403 -> PERMISSION_DENIED, 404 -> NOT_FOUND
//   409 AlreadyExists -> ALREADY_EXISTS; 409 Conflict (stale resourceVersion) -> ABORTED
//   410 Gone / Expired (resourceVersion too old, on a list, a watch or a watch ERROR event)
//       -> OUT_OF_RANGE
//   429 -> RESOURCE_EXHAUSTED (after honouring Retry-After within the deadline)
//   5xx, connection failures -> UNAVAILABLE;  the request's deadline -> DEADLINE_EXCEEDED
// Use the predicates below rather than codes.
//
// Deadlines: every call is bounded by ClientOptions::request_timeout_ms (watches by their
// timeout_seconds plus that). Idempotent verbs (GET, LIST) are retried on UNAVAILABLE and 429
// with back-off inside the deadline; writes are not retried here (the caller's reconcile is).
//
// Rate limit: a token bucket (qps, burst) shared by every call of this client, as client-go's
// rest client has; a call waits for a token (bounded by its deadline). Watches take a token only
// to open.
//
// Thread safety: every method may be called from any thread at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "operator/kube/kube_config.h"
#include "operator/kube/resource.h"

namespace lockstep::op::kube {

using json = nlohmann::json;

struct ClientOptions {
  double qps = 50;  // sustained requests per second; 0: no limit
  int burst = 100;
  int64_t request_timeout_ms = 30000;
  std::string user_agent = "lockstep-operator/0.1";
};

struct ListOptions {
  std::string label_selector;  // "lockstep.io/job-name=fashion"
  std::string field_selector;
  std::string resource_version;  // "" : most recent (quorum read); "0": any (from the cache)
  // Page size. List follows `continue` until the end and returns every item; the page size only
  // bounds each response (memory). 0: one response.
  int64_t limit = 500;
  // Called with each page as it arrives instead of collecting items into ListResult::items
  // (memory: at most one page parsed at a time). The page's items are moved out of the vector.
  std::function<void(std::vector<json>& page)> on_page;
  // Only the first page (with limit 1: whether anything matches), however many follow.
  bool first_page_only = false;
};

struct ListResult {
  std::vector<json> items;        // empty when on_page was given
  std::string resource_version;   // the list's metadata.resourceVersion: where a watch starts
};

enum class WatchEventType { kAdded, kModified, kDeleted, kBookmark };

struct WatchEvent {
  WatchEventType type;
  json object;  // the object; for a bookmark only metadata.resourceVersion is meaningful
};

struct WatchOptions {
  std::string label_selector;
  std::string field_selector;
  std::string resource_version;  // start after this version (from a list or the last event)
  bool allow_bookmarks = true;
  int64_t timeout_seconds = 300;  // the server closes the watch after this (plus jitter)
};

enum class PatchType {
  kMerge,           // application/merge-patch+json (RFC 7386)
  kJson,            // application/json-patch+json (RFC 6902), e.g. a "test" of resourceVersion
  kStrategicMerge,  // application/strategic-merge-patch+json (built-in kinds only)
};

struct DeleteOptions {
  std::string propagation_policy;  // "Background" | "Foreground" | "Orphan" | "" (server default)
  std::string precondition_uid;    // delete only this incarnation
  std::string precondition_resource_version;
  std::optional<int64_t> grace_period_seconds;
};

// Sizes cpprestsdk's process-wide I/O thread pool, which runs every client's sockets and
// continuations (nothing in this client blocks on it). Its default is 40 threads, each with a
// stack and, under load, a malloc arena of its own: about 1 MB of the operator's resident memory
// per 3 threads for no throughput on a few cores (docs/benchmarks.md). Call before the first
// client is created; FAILED_PRECONDITION once the pool exists.
Status InitializeIoThreads(size_t threads);

class KubeClient {
 public:
  static StatusOr<std::unique_ptr<KubeClient>> Create(const KubeConfig& config,
                                                      const ClientOptions& options);
  virtual ~KubeClient() = default;

  virtual StatusOr<json> Get(const Resource& resource, const std::string& ns,
                             const std::string& name, const std::string& subresource = "") = 0;
  // ns empty: every namespace.
  virtual StatusOr<ListResult> List(const Resource& resource, const std::string& ns,
                                    const ListOptions& options) = 0;
  // Streams watch events to on_event until the server closes the watch (OK), on_event returns
  // false (OK), *stop becomes true (CANCELLED, noticed within about 1 s), or an error: OUT_OF_RANGE
  // when the resourceVersion is too old (HTTP 410 or an ERROR event with code 410): relist.
  virtual Status Watch(const Resource& resource, const std::string& ns,
                       const WatchOptions& options,
                       const std::function<bool(const WatchEvent&)>& on_event,
                       const std::atomic<bool>* stop = nullptr) = 0;
  virtual StatusOr<json> Create(const Resource& resource, const std::string& ns,
                                const json& object) = 0;
  // PUT; the object's metadata.resourceVersion makes it conditional (ABORTED when stale).
  virtual StatusOr<json> Update(const Resource& resource, const std::string& ns,
                                const json& object, const std::string& subresource = "") = 0;
  virtual StatusOr<json> Patch(const Resource& resource, const std::string& ns,
                               const std::string& name, PatchType type, const json& patch,
                               const std::string& subresource = "") = 0;
  virtual Status Delete(const Resource& resource, const std::string& ns, const std::string& name,
                        const DeleteOptions& options = {}) = 0;

  // Requests sent so far (each retry counts), for metrics and benchmarks.
  virtual int64_t requests_sent() const = 0;
};

inline bool IsNotFound(const Status& s) { return s.code() == StatusCode::kNotFound; }
inline bool IsAlreadyExists(const Status& s) { return s.code() == StatusCode::kAlreadyExists; }
inline bool IsConflict(const Status& s) { return s.code() == StatusCode::kAborted; }
inline bool IsGone(const Status& s) { return s.code() == StatusCode::kOutOfRange; }
inline bool IsInvalid(const Status& s) { return s.code() == StatusCode::kInvalidArgument; }

// Runs `attempt` until it returns anything but a conflict, at most `attempts` times, with a short
// jittered back-off between tries; the attempt re-reads the object each time.
Status RetryOnConflict(const std::function<Status()>& attempt, int attempts = 5);

}  // namespace lockstep::op::kube
