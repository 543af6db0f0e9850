#include "operator/kube/api_status.h"

namespace lockstep::op::kube {

using json = nlohmann::json;

StatusCode CodeForApiStatus(int http_status, const std::string& reason) {
  if (reason == "AlreadyExists") return StatusCode::kAlreadyExists;
  if (reason == "Conflict") return StatusCode::kAborted;
  if (reason == "Expired" || reason == "Gone") return StatusCode::kOutOfRange;
  switch (http_status) {
    case 400:
    case 406:
    case 413:
    case 415:
    case 422:
      return StatusCode::kInvalidArgument;
    case 401:
      return StatusCode::kUnauthenticated;
    case 403:
      return StatusCode::kPermissionDenied;
    case 404:
      return StatusCode::kNotFound;
    case 405:
      return StatusCode::kUnimplemented;
    case 409:
      return StatusCode::kAborted;
    case 410:
      return StatusCode::kOutOfRange;
    case 429:
      return StatusCode::kResourceExhausted;
    default:
      break;
  }
  if (http_status >= 500) return StatusCode::kUnavailable;
  return StatusCode::kUnknown;
}

Status StatusFromKubeStatus(int http_status, const json& body, const std::string& raw,
                            const std::string& what) {
  std::string reason;
  std::string message;
  if (body.is_object() && body.value("kind", "") == "Status") {
    reason = body.value("reason", "");
    message = body.value("message", "");
  }
  if (message.empty()) {
    message = raw.size() > 300 ? raw.substr(0, 300) + "..." : raw;
    if (message.empty()) message = "HTTP " + std::to_string(http_status);
  }
  std::string text = what + ": " + message;
  // Field causes the message does not already spell out (it usually does for 422).
  if (body.is_object() && body.contains("details") && body["details"].is_object()) {
    const json& causes = body["details"].value("causes", json::array());
    for (const json& cause : causes) {
      if (!cause.is_object()) continue;
      const std::string field = cause.value("field", "");
      const std::string cause_message = cause.value("message", "");
      if (cause_message.empty() || message.find(cause_message) != std::string::npos) continue;
      text += "; " + (field.empty() ? "" : field + ": ") + cause_message;
    }
  }
  if (!reason.empty() && message.find(reason) == std::string::npos) text += " (" + reason + ")";
  return Status(CodeForApiStatus(http_status, reason),
                text + " [HTTP " + std::to_string(http_status) + "]");
}

}  // namespace lockstep::op::kube
