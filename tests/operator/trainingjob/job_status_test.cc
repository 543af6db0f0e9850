// TrainingJob status decisions (operator/trainingjob/job_status.h): conditions keep their
// transition times, what a finished worker means under each restart policy, how a pod's exit is
// read, and RFC 3339 times as Kubernetes writes them.
#include "operator/trainingjob/job_status.h"

#include <gtest/gtest.h>

#include <cmath>

#include <string>

#include "operator/trainingjob/children.h"
#include "operator/trainingjob/pod_agent.h"

namespace lockstep::op::trainingjob {
namespace {

constexpr char kT0[] = "2026-11-22T10:00:00Z";
constexpr char kT1[] = "2026-11-22T10:05:00Z";
constexpr char kT2[] = "2026-11-22T10:10:00Z";

json Condition(const json& status, const std::string& type) {
  for (const json& condition : status["conditions"]) {
    if (condition["type"] == type) return condition;
  }
  return nullptr;
}

TEST(ConditionsTest, NewConditionStartsWithBothTimes) {
  json status = json::object();
  SetCondition(&status, kCreated, true, "PodsCreated", "2 pods", kT0);
  EXPECT_TRUE(HasCondition(status, kCreated));
  EXPECT_EQ(Condition(status, kCreated), json({{"type", "Created"},
                                               {"status", "True"},
                                               {"reason", "PodsCreated"},
                                               {"message", "2 pods"},
                                               {"lastTransitionTime", kT0},
                                               {"lastUpdateTime", kT0}}));
}

TEST(ConditionsTest, TransitionTimeMovesOnlyWhenStatusChanges) {
  json status = json::object();
  SetCondition(&status, kRunning, true, "Training", "generation 1", kT0);
  // Same status, new message: only lastUpdateTime moves.
  SetCondition(&status, kRunning, true, "Training", "generation 2", kT1);
  json running = Condition(status, kRunning);
  EXPECT_EQ(running["lastTransitionTime"], kT0);
  EXPECT_EQ(running["lastUpdateTime"], kT1);
  EXPECT_EQ(running["message"], "generation 2");
  // Nothing changes: nothing moves (a status write would be a no-op).
  json before = status;
  SetCondition(&status, kRunning, true, "Training", "generation 2", kT2);
  EXPECT_EQ(status, before);
  // Status flips: both move.
  SetCondition(&status, kRunning, false, "Restarting", "worker 1 exited 137", kT2);
  running = Condition(status, kRunning);
  EXPECT_EQ(running["status"], "False");
  EXPECT_EQ(running["lastTransitionTime"], kT2);
  EXPECT_EQ(running["lastUpdateTime"], kT2);
  EXPECT_FALSE(HasCondition(status, kRunning));
}

TEST(ConditionsTest, EachTypeIsKeptOnceAndIndependently) {
  json status = {{"phase", "Running"}};
  SetCondition(&status, kCreated, true, "a", "", kT0);
  SetCondition(&status, kRunning, true, "b", "", kT0);
  SetCondition(&status, kCreated, true, "c", "", kT1);
  ASSERT_EQ(status["conditions"].size(), 2u);
  EXPECT_EQ(status["phase"], "Running");
  EXPECT_EQ(Condition(status, kCreated)["reason"], "c");
  EXPECT_EQ(Condition(status, kRunning)["reason"], "b");
  EXPECT_FALSE(HasCondition(status, kSucceeded));
  EXPECT_FALSE(HasCondition(json(nullptr), kCreated));
  EXPECT_FALSE(HasCondition(json::object(), kCreated));
}

TEST(DecideExitTest, EachPolicyDecidesEachExitCode) {
  struct Case {
    spec::RestartPolicy policy;
    std::vector<int32_t> retryable;
    int32_t exit_code;
    ExitDecision expected;
  };
  using P = spec::RestartPolicy;
  using D = ExitDecision;
  const Case cases[] = {
      {P::kOnFailure, {}, 0, D::kSucceeded},    {P::kOnFailure, {}, 1, D::kRestart},
      {P::kOnFailure, {}, 2, D::kRestart},      {P::kOnFailure, {}, 137, D::kRestart},
      {P::kOnFailure, {}, -1, D::kRestart},     {P::kNever, {}, 0, D::kSucceeded},
      {P::kNever, {}, 1, D::kFailJob},          {P::kNever, {}, 137, D::kFailJob},
      {P::kNever, {}, 143, D::kFailJob},        {P::kNever, {}, -1, D::kFailJob},
      {P::kExitCode, {}, 0, D::kSucceeded},     {P::kExitCode, {}, 1, D::kFailJob},
      {P::kExitCode, {}, 2, D::kFailJob},       {P::kExitCode, {}, 130, D::kRestart},
      {P::kExitCode, {}, 137, D::kRestart},     {P::kExitCode, {}, 143, D::kRestart},
      {P::kExitCode, {}, 139, D::kFailJob},     {P::kExitCode, {}, -1, D::kRestart},
      {P::kExitCode, {3, 42}, 42, D::kRestart}, {P::kExitCode, {3, 42}, 3, D::kRestart},
      {P::kExitCode, {3, 42}, 4, D::kFailJob},
  };
  for (const Case& c : cases) {
    spec::RunPolicy policy;
    policy.restart_policy = c.policy;
    policy.retryable_exit_codes = c.retryable;
    EXPECT_EQ(DecideExit(policy, c.exit_code), c.expected)
        << spec::ToString(c.policy) << " exit " << c.exit_code;
  }
}

json PodWithWorkerState(const json& state, const std::string& phase = "Failed") {
  return {{"status",
           {{"phase", phase},
            {"containerStatuses",
             json::array({{{"name", "log-shipper"}, {"state", {{"terminated", {{"exitCode", 9}}}}}},
                          {{"name", "worker"}, {"state", state}}})}}}};
}

TEST(WorkerExitCodeTest, ReadsTheWorkerContainersTermination) {
  EXPECT_EQ(WorkerExitCode(PodWithWorkerState({{"terminated", {{"exitCode", 137}}}})), 137);
  EXPECT_EQ(WorkerExitCode(PodWithWorkerState({{"terminated", {{"exitCode", 0}}}}, "Succeeded")),
            0);
  EXPECT_EQ(WorkerExitCode(PodWithWorkerState({{"running", {{"startedAt", kT0}}}}, "Running")), -1);
  EXPECT_EQ(WorkerExitCode(
                PodWithWorkerState({{"waiting", {{"reason", "ContainerCreating"}}}}, "Pending")),
            -1);
  EXPECT_EQ(WorkerExitCode(json::parse(R"({"status":{"phase":"Pending"}})")), -1);
  EXPECT_EQ(WorkerExitCode(json::object()), -1);
}

TEST(WorkerExitCodeTest, EvictedPodHasNoExitCode) {
  // As the kubelet reports an eviction: phase Failed, reason Evicted, no container exit...
  EXPECT_EQ(WorkerExitCode(json::parse(R"({"status":{"phase":"Failed","reason":"Evicted",
      "message":"The node was low on resource: memory."}})")),
            -1);
  // ...or with the containers killed on the way out: still not the program's exit.
  json evicted = PodWithWorkerState({{"terminated", {{"exitCode", 137}}}});
  evicted["status"]["reason"] = "Evicted";
  EXPECT_EQ(WorkerExitCode(evicted), -1);
  spec::RunPolicy exit_code_policy;
  exit_code_policy.restart_policy = spec::RestartPolicy::kExitCode;
  EXPECT_EQ(DecideExit(exit_code_policy, WorkerExitCode(evicted)), ExitDecision::kRestart);
}

TEST(WorkerStuckReasonTest, NamesAWorkerThatCannotStartWithoutAChange) {
  // As the kubelet reports a root image under runAsNonRoot (kuberuntime's verifyRunAsNonRoot).
  const std::string root = "container has runAsNonRoot and image will run as root (pod: "
                           "\"mnist-worker-0_team-a(uid)\", container: worker)";
  EXPECT_EQ(WorkerStuckReason(PodWithWorkerState(
                {{"waiting", {{"reason", "CreateContainerConfigError"}, {"message", root}}}},
                "Pending")),
            "CreateContainerConfigError: " + root);
  EXPECT_EQ(WorkerStuckReason(PodWithWorkerState({{"waiting", {{"reason", "ImagePullBackOff"}}}},
                                                 "Pending")),
            "ImagePullBackOff");
  // Starting, running or done: nothing to say.
  EXPECT_EQ(WorkerStuckReason(PodWithWorkerState({{"waiting", {{"reason", "ContainerCreating"}}}},
                                                 "Pending")),
            "");
  EXPECT_EQ(WorkerStuckReason(PodWithWorkerState({{"running", {{"startedAt", kT0}}}}, "Running")),
            "");
  EXPECT_EQ(WorkerStuckReason(PodWithWorkerState({{"terminated", {{"exitCode", 1}}}})), "");
  EXPECT_EQ(WorkerStuckReason(json::parse(R"({"status":{"phase":"Pending"}})")), "");
}

TEST(Rfc3339Test, FormatsUtcSecondsAsKubernetesDoes) {
  EXPECT_EQ(Rfc3339(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(Rfc3339(1795341600), "2026-11-22T10:00:00Z");
  EXPECT_EQ(Rfc3339(1795341600.9), "2026-11-22T10:00:00Z");  // truncated, as metav1.Time is
  EXPECT_EQ(Rfc3339(951782400), "2000-02-29T00:00:00Z");
}

TEST(Rfc3339Test, ParsesWhatItFormatsAndTheFractionalAndOffsetForms) {
  for (double t : {0.0, 951782400.0, 1795341600.0, 4102444799.0}) {
    EXPECT_DOUBLE_EQ(ParseRfc3339(Rfc3339(t)), t) << Rfc3339(t);
  }
  EXPECT_DOUBLE_EQ(ParseRfc3339("2026-11-22T10:00:00.250000Z"), 1795341600.25);
  EXPECT_DOUBLE_EQ(ParseRfc3339("2026-11-22T10:00:00.5Z"), 1795341600.5);
  EXPECT_DOUBLE_EQ(ParseRfc3339("2026-11-22T11:00:00+01:00"), 1795341600);
  EXPECT_DOUBLE_EQ(ParseRfc3339("2026-11-22T05:30:00-04:30"), 1795341600);
  EXPECT_DOUBLE_EQ(ParseRfc3339("2026-11-22t10:00:00z"), 1795341600);
}

TEST(Rfc3339Test, RejectsWhatIsNotRfc3339) {
  for (const char* text :
       {"", "yesterday", "2026-11-22", "2026-11-22T10:00:00", "2026-11-22T10:00Z",
        "2026-13-01T00:00:00Z", "2026-02-29T00:00:00Z", "2026-11-31T00:00:00Z",
        "2026-11-22T24:00:00Z", "2026-11-22T10:60:00Z", "2026-11-22T10:00:00.Z",
        "2026-11-22T10:00:00+0100", "2026-11-22T10:00:00Z trailing", "2026/11/22T10:00:00Z"}) {
    EXPECT_EQ(ParseRfc3339(text), -1) << text;
  }
}

TEST(JobStatusTest, TimeLeftComesFromTheReportedPaceAndIsUnknownUntilItCanBe) {
  // 64 samples a step, 320 samples/s: 5 steps/s; 90 steps left take 18 s.
  EXPECT_DOUBLE_EQ(EstimatedSecondsRemaining(10, 100, 640, 320.0), 18.0);
  EXPECT_EQ(EstimatedSecondsRemaining(10, 0, 640, 320.0), -1) << "no total_steps";
  EXPECT_EQ(EstimatedSecondsRemaining(10, 100, 0, 320.0), -1) << "no samples";
  EXPECT_EQ(EstimatedSecondsRemaining(10, 100, 640, 0.0), -1) << "no rate yet";
  EXPECT_EQ(EstimatedSecondsRemaining(100, 100, 6400, 320.0), -1) << "done";
  EXPECT_EQ(EstimatedSecondsRemaining(0, 100, 0, 0.0), -1);
}

TEST(JobStatusTest, KubectlGetShowsRatesAsWholeNumbersSharesAsPercentagesAndTimeAsAnAge) {
  EXPECT_EQ(DisplayRate(37603.77835859647), "37604");
  EXPECT_EQ(DisplayRate(12.4), "12");
  EXPECT_EQ(DisplayRate(2.46), "2.5") << "a slow job keeps a decimal";
  EXPECT_EQ(DisplayRate(9.96), "10");
  EXPECT_EQ(DisplayRate(0), "0.0");
  EXPECT_EQ(DisplayPercent(0.15708127699991847), "16%");
  EXPECT_EQ(DisplayPercent(1.0), "100%");
  EXPECT_EQ(DisplayPercent(0.004), "0%");
  EXPECT_EQ(DisplayDuration(45.4), "45s");
  EXPECT_EQ(DisplayDuration(119), "119s") << "as kubectl's ages: seconds below two minutes";
  EXPECT_EQ(DisplayDuration(250), "4m10s");
  EXPECT_EQ(DisplayDuration(300), "5m");
  EXPECT_EQ(DisplayDuration(7500), "2h5m");
  EXPECT_EQ(DisplayDuration(3 * 86400 + 4 * 3600 + 59), "3d4h");
  for (double bad : {-1.0, std::nan("")}) {
    EXPECT_EQ(DisplayRate(bad), "");
    EXPECT_EQ(DisplayPercent(bad), "");
    EXPECT_EQ(DisplayDuration(bad), "");
  }
}

// A failed pod whose `container` terminated as `terminated` says.
json FailedPod(const std::string& container, const json& terminated) {
  return json{{"status",
               {{"phase", "Failed"},
                {"containerStatuses",
                 json::array({{{"name", container}, {"state", {{"terminated", terminated}}}}})}}}};
}

TEST(JobStatusTest, AGiveUpIsReadFromTheWorkersTerminationMessageOnly) {
  const auto pod = FailedPod;
  EXPECT_EQ(WorkerGaveUpMessage(pod(kWorkerContainer,
                                    {{"exitCode", 1},
                                     {"message", "lockstep: gave up: restarts exhausted: 3 of 3"}})),
            "restarts exhausted: 3 of 3");
  EXPECT_EQ(WorkerGaveUpMessage(pod(kWorkerContainer, {{"exitCode", 1}, {"message", "oom"}})), "")
      << "a program's own message is not a give-up";
  EXPECT_EQ(WorkerGaveUpMessage(pod("sidecar", {{"exitCode", 1},
                                                {"message", "lockstep: gave up: x"}})),
            "");
  EXPECT_EQ(WorkerGaveUpMessage(pod(kWorkerContainer, {{"exitCode", 1}, {"message", 7}})), "");
  EXPECT_EQ(WorkerGaveUpMessage(json::object()), "");
}

TEST(JobStatusTest, TheWorkersErrorIsItsTerminationMessage) {
  const auto pod = FailedPod;
  EXPECT_EQ(WorkerTerminationMessage(pod(kWorkerContainer,
                                         {{"exitCode", 2},
                                          {"message", "cannot open file:///data/x.gz\n"}})),
            "cannot open file:///data/x.gz");
  EXPECT_EQ(WorkerTerminationMessage(pod(kWorkerContainer, {{"exitCode", 2}, {"message", " \n"}})),
            "");
  EXPECT_EQ(WorkerTerminationMessage(pod("sidecar", {{"exitCode", 1}, {"message", "x"}})), "")
      << "another container's message is not the worker's";
  EXPECT_EQ(WorkerTerminationMessage(pod(kWorkerContainer, {{"exitCode", 1}})), "");
  EXPECT_EQ(WorkerTerminationMessage(json::object()), "");
}

// The kernel's OOM killer leaves the worker no time to write its error: the kubelet's reason is
// what says why, and a message of the worker's own still comes first.
TEST(JobStatusTest, AWorkerKilledForMemoryIsSaidToBe) {
  const auto pod = FailedPod;
  EXPECT_EQ(WorkerTerminationMessage(
                pod(kWorkerContainer, {{"exitCode", 137}, {"reason", "OOMKilled"}})),
            "OOMKilled: the container reached its memory limit (spec.resources.memory)");
  EXPECT_EQ(WorkerTerminationMessage(pod(kWorkerContainer, {{"exitCode", 137},
                                                            {"reason", "OOMKilled"},
                                                            {"message", "its own words"}})),
            "its own words");
  EXPECT_EQ(WorkerTerminationMessage(pod(kWorkerContainer, {{"exitCode", 137}, {"reason", "Error"}})),
            "");
  EXPECT_EQ(WorkerTerminationMessage(pod("sidecar", {{"exitCode", 137}, {"reason", "OOMKilled"}})),
            "")
      << "another container's end is not the worker's";
}

// A pod whose agent init container (pod_agent.h) terminated as `terminated`, its worker still
// waiting to start.
json PodWithAgentInit(const json& terminated) {
  return json{{"status",
               {{"phase", "Failed"},
                {"initContainerStatuses", json::array({{{"name", kAgentContainer},
                                                        {"state", {{"terminated", terminated}}}}})},
                {"containerStatuses",
                 json::array({{{"name", kWorkerContainer},
                               {"state", {{"waiting", {{"reason", "PodInitializing"}}}}}}})}}}};
}

TEST(JobStatusTest, AnAgentThatCannotBeInstalledIsTheWorkersFailureAndGivesUp) {
  const json failed = PodWithAgentInit(
      {{"exitCode", 1},
       {"message",
        "lockstep: gave up: cannot install the Lockstep agent into the pod's volume "
        "(/lockstep-volume): cannot create /lockstep-volume/bin: Permission denied"}});
  EXPECT_EQ(WorkerExitCode(failed), 1);
  EXPECT_EQ(WorkerGaveUpMessage(failed),
            "cannot install the Lockstep agent into the pod's volume (/lockstep-volume): cannot "
            "create /lockstep-volume/bin: Permission denied");
  // Installed: what follows is the worker's own business.
  EXPECT_EQ(WorkerExitCode(PodWithAgentInit({{"exitCode", 0}})), -1);
  EXPECT_EQ(WorkerGaveUpMessage(PodWithAgentInit({{"exitCode", 0}, {"message", "x"}})), "");
}

TEST(JobStatusTest, AnAgentImageThatCannotBePulledIsWhyTheWorkerCannotStart) {
  const json pod = {
      {"status",
       {{"phase", "Pending"},
        {"initContainerStatuses",
         json::array({{{"name", kAgentContainer},
                       {"state",
                        {{"waiting",
                          {{"reason", "ErrImagePull"},
                           {"message", "pull access denied for lockstep-agent"}}}}}}})},
        // What the kubelet says of the worker meanwhile.
        {"containerStatuses",
         json::array({{{"name", kWorkerContainer},
                       {"state", {{"waiting", {{"reason", "PodInitializing"}}}}}}})}}}};
  EXPECT_EQ(WorkerStuckReason(pod), "ErrImagePull: pull access denied for lockstep-agent");
}

}  // namespace
}  // namespace lockstep::op::trainingjob
