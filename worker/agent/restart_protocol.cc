#include "worker/agent/restart_protocol.h"

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/logging.h"

namespace lockstep::agent {

bool IsRetryableExit(int shell_status, const std::vector<int32_t>& retryable_exit_codes) {
  if (shell_status == 130 || shell_status == 137 || shell_status == 143) return true;
  return std::find(retryable_exit_codes.begin(), retryable_exit_codes.end(), shell_status) !=
         retryable_exit_codes.end();
}

int64_t BackoffMs(const RestartBudget& budget, int32_t restart_count) {
  if (restart_count <= 1) return 0;
  int64_t backoff = budget.initial_backoff_ms;
  for (int32_t i = 2; i < restart_count && backoff < budget.max_backoff_ms; ++i) backoff *= 2;
  return std::min(backoff, budget.max_backoff_ms);
}

namespace {

// "; its last lines: A | B | C": the lines, newest kept when they exceed kQuotedLinesBytes; ""
// when there are none.
std::string QuoteLastLines(const std::vector<std::string>& lines) {
  std::string quoted;
  for (auto line = lines.rbegin(); line != lines.rend(); ++line) {
    const std::string part = quoted.empty() ? *line : *line + " | " + quoted;
    if (part.size() > kQuotedLinesBytes) break;
    quoted = part;
  }
  return quoted.empty() ? "" : "; its last lines: " + quoted;
}

}  // namespace

GenerationPlan DecideNextGeneration(const RestartBudget& budget, int32_t restarts_before,
                                    const std::optional<FailureRecord>& failure) {
  GenerationPlan plan;
  plan.restart_count = restarts_before;
  if (!failure.has_value()) return plan;  // a membership change costs no restart

  const std::string last = "last failure: rank " + std::to_string(failure->rank) + " (" +
                           failure->member_id + "): " + failure->description +
                           QuoteLastLines(failure->last_lines);
  auto give_up = [&](const std::string& why) {
    plan.give_up = true;
    plan.exit_status = failure->shell_status != 0 ? failure->shell_status : 1;
    plan.message = why + "; " + last;
  };
  switch (budget.policy) {
    case spec::RestartPolicy::kNever:
      give_up("spec.runPolicy.restartPolicy is Never");
      return plan;
    case spec::RestartPolicy::kExitCode:
      if (!IsRetryableExit(failure->shell_status, budget.retryable_exit_codes)) {
        give_up("exit status " + std::to_string(failure->shell_status) +
                " is not retryable under spec.runPolicy.restartPolicy ExitCode");
        return plan;
      }
      break;
    case spec::RestartPolicy::kOnFailure:
      break;
  }
  if (restarts_before >= budget.backoff_limit) {
    give_up("restarts exhausted: " + std::to_string(restarts_before) + " of " +
            std::to_string(budget.backoff_limit) + " (spec.runPolicy.backoffLimit) used");
    return plan;
  }
  plan.restart_count = restarts_before + 1;
  // The back-off belongs to the member that keeps failing: another member's first failure is
  // replaced at once however many restarts the job has had.
  plan.backoff_ms = BackoffMs(
      budget, failure->member_failures > 0 ? failure->member_failures : plan.restart_count);
  plan.message = last;
  return plan;
}

std::string EncodePlan(const GenerationPlan& plan) {
  return nlohmann::json{{"generation", plan.generation},   {"master_addr", plan.master_addr},
                        {"master_port", plan.master_port}, {"restart_count", plan.restart_count},
                        {"backoff_ms", plan.backoff_ms},   {"give_up", plan.give_up},
                        {"exit_status", plan.exit_status}, {"message", plan.message}}
      .dump();
}

StatusOr<GenerationPlan> DecodePlan(const std::string& text) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return InvalidArgumentError("exec plan: not a JSON object: " + text);
  try {
    GenerationPlan plan;
    plan.generation = doc.at("generation").get<int64_t>();
    plan.master_addr = doc.at("master_addr").get<std::string>();
    plan.master_port = doc.at("master_port").get<int32_t>();
    plan.restart_count = doc.at("restart_count").get<int32_t>();
    plan.backoff_ms = doc.at("backoff_ms").get<int64_t>();
    plan.give_up = doc.at("give_up").get<bool>();
    plan.exit_status = doc.at("exit_status").get<int>();
    plan.message = doc.at("message").get<std::string>();
    return plan;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("exec plan: ") + e.what());
  }
}

std::string EncodeFailure(const FailureRecord& failure) {
  return nlohmann::json{{"member_id", failure.member_id},
                        {"rank", failure.rank},
                        {"shell_status", failure.shell_status},
                        {"description", failure.description},
                        {"member_failures", failure.member_failures},
                        {"last_lines", failure.last_lines}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

StatusOr<FailureRecord> DecodeFailure(const std::string& text) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return InvalidArgumentError("exec failure: not a JSON object: " + text);
  try {
    FailureRecord failure;
    failure.member_id = doc.at("member_id").get<std::string>();
    failure.rank = doc.at("rank").get<int32_t>();
    failure.shell_status = doc.at("shell_status").get<int>();
    failure.description = doc.at("description").get<std::string>();
    failure.member_failures = doc.value("member_failures", 0);
    // Absent from an older agent's record; anything but strings is left out.
    const nlohmann::json lines = doc.value("last_lines", nlohmann::json::array());
    for (const nlohmann::json& line : lines.is_array() ? lines : nlohmann::json::array()) {
      if (line.is_string()) failure.last_lines.push_back(line.get<std::string>());
    }
    return failure;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("exec failure: ") + e.what());
  }
}

Status RecordFailure(rendezvous::KeyValueStore& ending_generation, const FailureRecord& failure,
                     int64_t timeout_ms) {
  LOCKSTEP_ASSIGN_OR_RETURN(int64_t count, ending_generation.Add(kFailuresKey, 1, timeout_ms));
  if (count == 1) {
    LOCKSTEP_RETURN_IF_ERROR(
        ending_generation.Set(kFirstFailureKey, EncodeFailure(failure), timeout_ms));
  }
  return OkStatus();
}

PreviousGeneration ReadPreviousGeneration(rendezvous::KeyValueStore& previous, int64_t timeout_ms) {
  PreviousGeneration result;
  if (auto plan = previous.Get({kPlanKey}, 0); plan.ok()) {
    if (auto decoded = DecodePlan((*plan)[0]); decoded.ok()) {
      result.restart_count = decoded->restart_count;
      if (decoded->give_up) result.gave_up = *decoded;
    }
  }
  auto failures = previous.Get({kFailuresKey}, 0);
  if (!failures.ok() || std::atoll((*failures)[0].c_str()) <= 0) return result;
  FailureRecord unknown;
  unknown.description = "a command failed (its details were not recorded)";
  unknown.member_id = "?";
  result.failure = unknown;
  if (auto first = previous.Get({kFirstFailureKey}, timeout_ms); first.ok()) {
    if (auto decoded = DecodeFailure((*first)[0]); decoded.ok()) result.failure = *decoded;
  }
  return result;
}

}  // namespace lockstep::agent
