// What an API server's answer means as a Status: the Kubernetes API conventions' Status object
// (kind: Status, its reason, message and field causes) read into our codes and one message.
//
//   if (http_status >= 300) return StatusFromKubeStatus(http_status, body, raw, "PUT /api/v1/...");
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace lockstep::op::kube {

// The Status reasons decide first (AlreadyExists, Conflict -> ABORTED, Expired and Gone ->
// OUT_OF_RANGE); the HTTP status otherwise (422 -> INVALID_ARGUMENT, 429 -> RESOURCE_EXHAUSTED,
// 5xx -> UNAVAILABLE, ...).
StatusCode CodeForApiStatus(int http_status, const std::string& reason);

// `what` is "VERB /path". The server's Status object carries the message (field causes included
// for 422) and the reason; a body that is not one (a proxy's HTML page) is quoted, shortened.
Status StatusFromKubeStatus(int http_status, const nlohmann::json& body, const std::string& raw,
                            const std::string& what);

}  // namespace lockstep::op::kube
