// The restart accounting of restart_protocol.h: which generation endings use up a restart, when
// the agents give up, and the hand-over of failures through the ending generation's store.
#include "worker/agent/restart_protocol.h"

#include <gtest/gtest.h>

#include "common/rendezvous/kv_store.h"

namespace lockstep::agent {
namespace {

FailureRecord Failure(int shell_status, const std::string& description) {
  FailureRecord failure;
  failure.member_id = "ddp-worker-1";
  failure.rank = 1;
  failure.shell_status = shell_status;
  failure.description = description;
  return failure;
}

RestartBudget Budget(int32_t backoff_limit,
                     spec::RestartPolicy policy = spec::RestartPolicy::kOnFailure) {
  RestartBudget budget;
  budget.policy = policy;
  budget.backoff_limit = backoff_limit;
  budget.initial_backoff_ms = 1000;
  budget.max_backoff_ms = 4000;
  return budget;
}

TEST(RestartProtocol, MembershipChangeDoesNotUseARestart) {
  const GenerationPlan plan = DecideNextGeneration(Budget(3), 2, std::nullopt);
  EXPECT_FALSE(plan.give_up);
  EXPECT_EQ(plan.restart_count, 2);
  EXPECT_EQ(plan.backoff_ms, 0);
}

TEST(RestartProtocol, FailureUsesOneRestart) {
  const GenerationPlan plan = DecideNextGeneration(Budget(3), 0, Failure(1, "exit code 1"));
  EXPECT_FALSE(plan.give_up);
  EXPECT_EQ(plan.restart_count, 1);
  EXPECT_EQ(plan.backoff_ms, 0) << "the first restart is immediate";
}

TEST(RestartProtocol, BackoffFollowsTheMemberThatKeepsFailingNotTheJob) {
  FailureRecord again = Failure(1, "exit code 1");
  again.member_failures = 3;
  EXPECT_EQ(DecideNextGeneration(Budget(9), 4, again).backoff_ms, 2000)
      << "a member's third failure waits";
  FailureRecord other = Failure(137, "signal 9 (Killed)");
  other.member_failures = 1;
  EXPECT_EQ(DecideNextGeneration(Budget(9), 4, other).backoff_ms, 0)
      << "another member's first failure is replaced at once after 4 restarts of the job";
  EXPECT_EQ(DecodeFailure(EncodeFailure(again))->member_failures, 3);
}

TEST(RestartProtocol, GivesUpWhenBackoffLimitIsUsedWithTheFailuresStatus) {
  const GenerationPlan plan = DecideNextGeneration(Budget(2), 2, Failure(137, "signal 9 (Killed)"));
  EXPECT_TRUE(plan.give_up);
  EXPECT_EQ(plan.exit_status, 137);
  EXPECT_NE(plan.message.find("restarts exhausted"), std::string::npos) << plan.message;
  EXPECT_NE(plan.message.find("signal 9 (Killed)"), std::string::npos) << plan.message;
  EXPECT_NE(plan.message.find("ddp-worker-1"), std::string::npos) << plan.message;
}

TEST(RestartProtocol, BackoffLimitZeroMeansNoRestart) {
  EXPECT_TRUE(DecideNextGeneration(Budget(0), 0, Failure(3, "exit code 3")).give_up);
}

TEST(RestartProtocol, NeverPolicyGivesUpOnFirstFailure) {
  const GenerationPlan plan =
      DecideNextGeneration(Budget(5, spec::RestartPolicy::kNever), 0, Failure(1, "exit code 1"));
  EXPECT_TRUE(plan.give_up);
  EXPECT_NE(plan.message.find("Never"), std::string::npos);
}

TEST(RestartProtocol, ExitCodePolicyRetriesOnlyRetryableStatuses) {
  RestartBudget budget = Budget(5, spec::RestartPolicy::kExitCode);
  budget.retryable_exit_codes = {42};
  EXPECT_FALSE(DecideNextGeneration(budget, 0, Failure(137, "signal 9")).give_up);
  EXPECT_FALSE(DecideNextGeneration(budget, 0, Failure(143, "signal 15")).give_up);
  EXPECT_FALSE(DecideNextGeneration(budget, 0, Failure(42, "exit code 42")).give_up);
  const GenerationPlan plan = DecideNextGeneration(budget, 0, Failure(1, "exit code 1"));
  EXPECT_TRUE(plan.give_up);
  EXPECT_EQ(plan.exit_status, 1);
}

TEST(RestartProtocol, BackoffDoublesFromTheSecondRestartUpToTheCap) {
  const RestartBudget budget = Budget(10);
  EXPECT_EQ(BackoffMs(budget, 1), 0);
  EXPECT_EQ(BackoffMs(budget, 2), 1000);
  EXPECT_EQ(BackoffMs(budget, 3), 2000);
  EXPECT_EQ(BackoffMs(budget, 4), 4000);
  EXPECT_EQ(BackoffMs(budget, 9), 4000);
}

TEST(RestartProtocol, PlanAndFailureRoundTrip) {
  GenerationPlan plan;
  plan.generation = 4;
  plan.master_addr = "10.0.0.7";
  plan.master_port = 29511;
  plan.restart_count = 2;
  plan.backoff_ms = 1000;
  plan.give_up = true;
  plan.exit_status = 3;
  plan.message = "restarts exhausted";
  StatusOr<GenerationPlan> decoded = DecodePlan(EncodePlan(plan));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->generation, 4);
  EXPECT_EQ(decoded->master_addr, "10.0.0.7");
  EXPECT_EQ(decoded->master_port, 29511);
  EXPECT_EQ(decoded->restart_count, 2);
  EXPECT_TRUE(decoded->give_up);
  EXPECT_EQ(decoded->exit_status, 3);
  EXPECT_FALSE(DecodePlan("{\"generation\": 1}").ok());
  StatusOr<FailureRecord> failure = DecodeFailure(EncodeFailure(Failure(127, "not found")));
  ASSERT_TRUE(failure.ok());
  EXPECT_EQ(failure->shell_status, 127);
  EXPECT_EQ(failure->member_id, "ddp-worker-1");
}

TEST(RestartProtocol, TheFailedCommandsLastLinesReachTheGiveUpMessageNewestKept) {
  FailureRecord failure = Failure(2, "exit code 2");
  failure.last_lines = {"Traceback (most recent call last):", "  File \"/app/train.py\", line 3",
                        "ModuleNotFoundError: No module named 'torchvision'"};
  RestartBudget never;
  never.policy = spec::RestartPolicy::kNever;
  GenerationPlan plan = DecideNextGeneration(never, 0, failure);
  EXPECT_EQ(plan.message,
            "spec.runPolicy.restartPolicy is Never; last failure: rank 1 (ddp-worker-1): exit code "
            "2; its last lines: Traceback (most recent call last): |   File \"/app/train.py\", "
            "line 3 | ModuleNotFoundError: No module named 'torchvision'");
  // Through the store and back.
  StatusOr<FailureRecord> decoded = DecodeFailure(EncodeFailure(failure));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->last_lines, failure.last_lines);
  // However much it wrote, the message stays within what the operator quotes; the end is kept.
  failure.last_lines.assign(40, std::string(200, 'x'));
  failure.last_lines.back() = "ValueError: the last word";
  plan = DecideNextGeneration(never, 0, failure);
  EXPECT_LE(plan.message.size(), 200 + kQuotedLinesBytes);
  EXPECT_EQ(plan.message.substr(plan.message.size() - 25), "ValueError: the last word");
}

TEST(RestartProtocol, TwoFailuresInOneGenerationCountOnceAndKeepTheFirst) {
  auto store = rendezvous::NewInMemoryStore();
  GenerationPlan plan;
  plan.restart_count = 1;
  ASSERT_TRUE(store->Set(kPlanKey, EncodePlan(plan), 1000).ok());
  ASSERT_TRUE(RecordFailure(*store, Failure(137, "signal 9 (Killed)"), 1000).ok());
  FailureRecord second = Failure(1, "exit code 1");
  second.member_id = "ddp-worker-0";
  second.rank = 0;
  ASSERT_TRUE(RecordFailure(*store, second, 1000).ok());

  const PreviousGeneration previous = ReadPreviousGeneration(*store, 1000);
  ASSERT_TRUE(previous.restart_count.has_value());
  EXPECT_EQ(*previous.restart_count, 1);
  ASSERT_TRUE(previous.failure.has_value());
  EXPECT_EQ(previous.failure->description, "signal 9 (Killed)");
  const GenerationPlan next =
      DecideNextGeneration(Budget(3), *previous.restart_count, previous.failure);
  EXPECT_EQ(next.restart_count, 2) << "one failed generation is one restart";
}

TEST(RestartProtocol, GenerationWithoutFailuresReadsAsMembershipChange) {
  auto store = rendezvous::NewInMemoryStore();
  const PreviousGeneration previous = ReadPreviousGeneration(*store, 10);
  EXPECT_FALSE(previous.restart_count.has_value());
  EXPECT_FALSE(previous.failure.has_value());
}

// Agents that gave up exit; in a cluster the operator may start replacement pods. Their
// generation reads the give-up and gives up the same way, without a start.
TEST(RestartProtocol, AGenerationThatGaveUpIsReadAsGivenUpByTheNext) {
  auto store = rendezvous::NewInMemoryStore();
  GenerationPlan gave_up;
  gave_up.generation = 5;
  gave_up.restart_count = 3;
  gave_up.give_up = true;
  gave_up.exit_status = 3;
  gave_up.message = "restarts exhausted: 3 of 3 (spec.runPolicy.backoffLimit) used";
  ASSERT_TRUE(store->Set(kPlanKey, EncodePlan(gave_up), 1000).ok());
  const PreviousGeneration previous = ReadPreviousGeneration(*store, 10);
  ASSERT_TRUE(previous.gave_up.has_value());
  EXPECT_TRUE(previous.gave_up->give_up);
  EXPECT_EQ(previous.gave_up->exit_status, 3);
  EXPECT_EQ(previous.gave_up->message, gave_up.message);
  EXPECT_FALSE(previous.failure.has_value()) << "no command ran in it";
}

}  // namespace
}  // namespace lockstep::agent
