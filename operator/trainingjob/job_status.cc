#include "operator/trainingjob/job_status.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <set>

#include "common/termination_message.h"
#include "operator/trainingjob/children.h"
#include "operator/trainingjob/pod_agent.h"

namespace lockstep::op::trainingjob {
namespace {

// PyTorchJob's convention for ExitCode: interrupted (SIGINT), killed (SIGKILL: OOM killer,
// preemption) and terminated (SIGTERM: node drain) are not the program's fault.
constexpr int32_t kRetryableSignalExits[] = {130, 137, 143};

bool ParseDigits(const std::string& text, size_t pos, size_t count, int* out) {
  if (pos + count > text.size()) return false;
  int value = 0;
  for (size_t i = pos; i < pos + count; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    value = value * 10 + (text[i] - '0');
  }
  *out = value;
  return true;
}

int DaysInMonth(int year, int month) {
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return month == 2 && leap ? 29 : kDays[month - 1];
}

// The worker container's state of `kind` ("waiting", "terminated") in the pod's status; null when
// the status reports no worker container or the worker is in another state.
// The state `kind` ("terminated", "waiting") of container `name` in the pod's status list
// `list`; nullptr when it is not in that state or not reported.
const json* ContainerState(const json& pod, const char* list, const char* name, const char* kind) {
  if (!pod.is_object()) return nullptr;
  const auto status = pod.find("status");
  if (status == pod.end() || !status->is_object()) return nullptr;
  const auto statuses = status->find(list);
  if (statuses == status->end() || !statuses->is_array()) return nullptr;
  for (const json& container : *statuses) {
    if (!container.is_object() || container.value("name", "") != name) continue;
    const auto state = container.find("state");
    if (state == container.end() || !state->is_object()) return nullptr;
    const auto found = state->find(kind);
    return found != state->end() && found->is_object() ? &*found : nullptr;
  }
  return nullptr;
}

// The worker container's state `kind`. Before the worker starts, the agent's init container
// (pod_agent.h) stands for it: its failed install (terminated with a non-zero exit: the pod
// fails with it) or its waiting on an image that cannot be pulled is the worker's.
const json* WorkerState(const json& pod, const char* kind) {
  if (const json* worker = ContainerState(pod, "containerStatuses", kWorkerContainer, kind)) {
    return worker;
  }
  const json* agent = ContainerState(pod, "initContainerStatuses", kAgentContainer, kind);
  if (agent != nullptr && std::string(kind) == "terminated" && agent->value("exitCode", 0) == 0) {
    return nullptr;  // installed: the worker's own state tells
  }
  return agent;
}

// The worker container's terminated message as the kubelet reported it; "" when none.
std::string TerminatedMessage(const json& pod) {
  const json* terminated = WorkerState(pod, "terminated");
  if (terminated == nullptr) return "";
  const json message = terminated->value("message", json());
  return message.is_string() ? message.get<std::string>() : "";
}

}  // namespace

void SetCondition(json* job_status, const std::string& type, bool status, const std::string& reason,
                  const std::string& message, const std::string& now) {
  if (!job_status->is_object()) *job_status = json::object();
  json& conditions = (*job_status)["conditions"];
  if (!conditions.is_array()) conditions = json::array();
  const std::string status_text = status ? "True" : "False";
  for (json& condition : conditions) {
    if (condition.value("type", "") != type) continue;
    if (condition.value("status", "") != status_text) {
      condition["status"] = status_text;
      condition["lastTransitionTime"] = now;
      condition["lastUpdateTime"] = now;
    } else if (condition.value("reason", "") != reason ||
               condition.value("message", "") != message) {
      condition["lastUpdateTime"] = now;
    }
    condition["reason"] = reason;
    condition["message"] = message;
    return;
  }
  conditions.push_back({{"type", type},
                        {"status", status_text},
                        {"reason", reason},
                        {"message", message},
                        {"lastTransitionTime", now},
                        {"lastUpdateTime", now}});
}

json FindCondition(const json& job_status, const std::string& type) {
  if (!job_status.is_object() || !job_status.contains("conditions") ||
      !job_status["conditions"].is_array()) {
    return json();
  }
  for (const json& condition : job_status["conditions"]) {
    if (condition.is_object() && condition.value("type", "") == type) return condition;
  }
  return json();
}

bool HasCondition(const json& job_status, const std::string& type) {
  const json condition = FindCondition(job_status, type);
  return condition.is_object() && condition.value("status", "") == "True";
}

std::string JobPhase(const json& job_status) { return job_status.value("phase", ""); }

bool JobFinished(const json& job_status) {
  const std::string phase = JobPhase(job_status);
  return phase == "Succeeded" || phase == "Failed";
}

std::string Rfc3339(double unix_seconds) {
  const time_t seconds = static_cast<time_t>(std::floor(unix_seconds));
  struct tm utc {};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

// date-time of RFC 3339 section 5.6: YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM); "t", "z"
// and a space for "T" are accepted as the RFC allows.
double ParseRfc3339(const std::string& text) {
  int year, month, day, hour, minute, second;
  if (text.size() < 20 || !ParseDigits(text, 0, 4, &year) || text[4] != '-' ||
      !ParseDigits(text, 5, 2, &month) || text[7] != '-' || !ParseDigits(text, 8, 2, &day) ||
      (text[10] != 'T' && text[10] != 't' && text[10] != ' ') || !ParseDigits(text, 11, 2, &hour) ||
      text[13] != ':' || !ParseDigits(text, 14, 2, &minute) || text[16] != ':' ||
      !ParseDigits(text, 17, 2, &second)) {
    return -1;
  }
  // Leap second 60 is RFC 3339; it is folded into the next second as POSIX time does.
  if (month < 1 || month > 12 || day < 1 || day > DaysInMonth(year, month) || hour > 23 ||
      minute > 59 || second > 60) {
    return -1;
  }
  size_t pos = 19;
  double fraction = 0;
  if (pos < text.size() && text[pos] == '.') {
    double scale = 0.1;
    size_t digits = 0;
    for (++pos; pos < text.size() && text[pos] >= '0' && text[pos] <= '9'; ++pos, ++digits) {
      fraction += (text[pos] - '0') * scale;
      scale /= 10;
    }
    if (digits == 0) return -1;
  }
  int offset_seconds = 0;
  if (pos < text.size() && (text[pos] == 'Z' || text[pos] == 'z')) {
    ++pos;
  } else if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) {
    int offset_hours, offset_minutes;
    if (!ParseDigits(text, pos + 1, 2, &offset_hours) || pos + 3 >= text.size() ||
        text[pos + 3] != ':' || !ParseDigits(text, pos + 4, 2, &offset_minutes) ||
        offset_hours > 23 || offset_minutes > 59) {
      return -1;
    }
    offset_seconds = (offset_hours * 3600 + offset_minutes * 60) * (text[pos] == '-' ? -1 : 1);
    pos += 6;
  } else {
    return -1;
  }
  if (pos != text.size()) return -1;
  struct tm utc {};
  utc.tm_year = year - 1900;
  utc.tm_mon = month - 1;
  utc.tm_mday = day;
  utc.tm_hour = hour;
  utc.tm_min = minute;
  utc.tm_sec = second;
  const time_t seconds = timegm(&utc);
  const double result = static_cast<double>(seconds) - offset_seconds + fraction;
  return result < 0 ? -1 : result;
}

ExitDecision DecideExit(const spec::RunPolicy& policy, int32_t exit_code) {
  if (exit_code == 0) return ExitDecision::kSucceeded;
  switch (policy.restart_policy) {
    case spec::RestartPolicy::kOnFailure:
      return ExitDecision::kRestart;
    case spec::RestartPolicy::kNever:
      return ExitDecision::kFailJob;
    case spec::RestartPolicy::kExitCode:
      break;
  }
  // No exit code at all (evicted, node lost): nothing the program did, so retry.
  if (exit_code < 0) return ExitDecision::kRestart;
  const auto& listed = policy.retryable_exit_codes;
  const bool retryable =
      std::find(std::begin(kRetryableSignalExits), std::end(kRetryableSignalExits), exit_code) !=
          std::end(kRetryableSignalExits) ||
      std::find(listed.begin(), listed.end(), exit_code) != listed.end();
  return retryable ? ExitDecision::kRestart : ExitDecision::kFailJob;
}

int32_t WorkerExitCode(const json& pod) {
  if (!pod.is_object() || !pod.contains("status") || !pod["status"].is_object()) return -1;
  const json& status = pod["status"];
  // An eviction kills the containers, and what they report then (0 after a graceful SIGTERM,
  // 137) says nothing about the program: the pod is replaced, as retryable.
  if (status.value("reason", "") == "Evicted") return -1;
  const json* terminated = WorkerState(pod, "terminated");
  if (terminated == nullptr) return -1;
  const auto exit_code = terminated->find("exitCode");
  if (exit_code == terminated->end() || !exit_code->is_number_integer()) return -1;
  return exit_code->get<int32_t>();
}

bool IsStuckWaitingReason(const std::string& reason) {
  static const std::set<std::string> kStuck = {"CreateContainerConfigError",
                                               "CreateContainerError", "ErrImagePull",
                                               "ImagePullBackOff", "InvalidImageName"};
  return kStuck.count(reason) > 0;
}

std::string WorkerStuckReason(const json& pod) {
  // The worker's own waiting reason, else its agent's (the worker waits as PodInitializing
  // while an init container cannot start).
  for (const json* waiting :
       {ContainerState(pod, "containerStatuses", kWorkerContainer, "waiting"),
        ContainerState(pod, "initContainerStatuses", kAgentContainer, "waiting")}) {
    if (waiting == nullptr) continue;
    const std::string reason = waiting->value("reason", "");
    if (!IsStuckWaitingReason(reason)) continue;
    const std::string message = waiting->value("message", "");
    return message.empty() ? reason : reason + ": " + message;
  }
  return "";
}

std::string WorkerTerminationMessage(const json& pod) {
  const std::string text = TerminatedMessage(pod);
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) {
    // SIGKILLed by the kernel, the worker wrote nothing: the kubelet's reason is all there is.
    const json* terminated = WorkerState(pod, "terminated");
    if (terminated != nullptr && terminated->value("reason", json()) == "OOMKilled") {
      return "OOMKilled: the container reached its memory limit (spec.resources.memory)";
    }
    return "";
  }
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

std::string WorkerGaveUpMessage(const json& pod) {
  const std::string text = TerminatedMessage(pod);
  const std::string prefix = kGaveUpPrefix;
  if (text.compare(0, prefix.size(), prefix) != 0 || text.size() == prefix.size()) return "";
  return text.substr(prefix.size());
}

double EstimatedSecondsRemaining(int64_t step, int64_t total_steps, int64_t samples,
                                 double samples_per_second) {
  if (step <= 0 || total_steps <= step || samples <= 0 || !(samples_per_second > 0)) return -1;
  const double samples_per_step = static_cast<double>(samples) / static_cast<double>(step);
  return static_cast<double>(total_steps - step) * samples_per_step / samples_per_second;
}

std::string DisplayRate(double per_second) {
  if (!(per_second >= 0)) return "";
  char text[32];
  if (per_second < 9.95) {
    std::snprintf(text, sizeof text, "%.1f", per_second);
  } else {
    std::snprintf(text, sizeof text, "%.0f", std::min(per_second, 1e18));
  }
  return text;
}

std::string DisplayPercent(double share) {
  if (!(share >= 0)) return "";
  char text[32];
  std::snprintf(text, sizeof text, "%.0f%%", std::min(share, 1e6) * 100.0);
  return text;
}

std::string DisplayDuration(double seconds) {
  if (!(seconds >= 0)) return "";
  const int64_t s = static_cast<int64_t>(std::llround(std::min(seconds, 1e15)));
  const int64_t m = s / 60, h = s / 3600, d = s / 86400;
  auto two = [](int64_t major, const char* a, int64_t minor, const char* b) {
    return minor == 0 ? std::to_string(major) + a
                      : std::to_string(major) + a + std::to_string(minor) + b;
  };
  if (s < 120) return std::to_string(s) + "s";
  if (m < 60) return two(m, "m", s % 60, "s");
  if (h < 48) return two(h, "h", m % 60, "m");
  return two(d, "d", h % 24, "h");
}

}  // namespace lockstep::op::trainingjob
