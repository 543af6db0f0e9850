// Reading a cached worker pod (operator/trainingjob/pod_cache.h): what holds it back, what
// stopped it, whether Kueue counts it; and that the informer's trim keeps what those read.
#include "operator/trainingjob/pod_cache.h"

#include <gtest/gtest.h>

#include <string>

#include "operator/trainingjob/job_status.h"

namespace lockstep::op::trainingjob {
namespace {

using json = nlohmann::json;

json PodWith(json spec, json status, json metadata = json::object()) {
  metadata["name"] = "mnist-worker-0";
  return {
      {"metadata", std::move(metadata)}, {"spec", std::move(spec)}, {"status", std::move(status)}};
}

TEST(SchedulingGatedByTest, NamesTheGatesOfTheSpec) {
  const json pod = PodWith({{"schedulingGates", json::array({{{"name", "kueue.x-k8s.io/admission"}},
                                                             {{"name", "example.com/quota"}}})}},
                           {{"phase", "Pending"}});
  EXPECT_EQ(SchedulingGatedBy(pod), "kueue.x-k8s.io/admission, example.com/quota");
}

TEST(SchedulingGatedByTest, ReadsTheSchedulersConditionWhereTheServerShowsNoGates) {
  const json gated =
      PodWith(json::object(), {{"phase", "Pending"},
                               {"conditions", json::array({{{"type", "PodScheduled"},
                                                            {"status", "False"},
                                                            {"reason", "SchedulingGated"}}})}});
  EXPECT_EQ(SchedulingGatedBy(gated), "a scheduling gate");
  const json unschedulable =
      PodWith(json::object(), {{"phase", "Pending"},
                               {"conditions", json::array({{{"type", "PodScheduled"},
                                                            {"status", "False"},
                                                            {"reason", "Unschedulable"}}})}});
  EXPECT_EQ(SchedulingGatedBy(unschedulable), "");
  EXPECT_EQ(SchedulingGatedBy(PodWith(json::object(), {{"phase", "Running"}})), "");
}

TEST(DisruptedByTest, NamesTheClustersReasonAndIgnoresConditionsThatAreNotTrue) {
  const json preempted = PodWith(
      json::object(), {{"phase", "Failed"},
                       {"conditions", json::array({{{"type", "DisruptionTarget"},
                                                    {"status", "True"},
                                                    {"reason", "PreemptionByScheduler"},
                                                    {"message", "preempted by team-b/x"}}})}});
  EXPECT_EQ(DisruptedBy(preempted), "PreemptionByScheduler: preempted by team-b/x");
  const json kueue =
      PodWith(json::object(), {{"phase", "Running"},
                               {"conditions", json::array({{{"type", "TerminationTarget"},
                                                            {"status", "True"},
                                                            {"reason", "WorkloadEvicted"}}})}});
  EXPECT_EQ(DisruptedBy(kueue), "WorkloadEvicted");
  const json cleared = PodWith(
      json::object(),
      {{"phase", "Failed"},
       {"conditions",
        json::array({{{"type", "DisruptionTarget"}, {"status", "False"}, {"reason", "x"}}})}});
  EXPECT_EQ(DisruptedBy(cleared), "");
}

TEST(KueueCountsPodTest, CountsWhatCanStillRunOrSucceeded) {
  const json deleting = {{"deletionTimestamp", "2026-11-26T10:00:00Z"}};
  EXPECT_TRUE(KueueCountsPod(PodWith(json::object(), {{"phase", "Pending"}})));
  EXPECT_TRUE(KueueCountsPod(PodWith(json::object(), {{"phase", "Succeeded"}})));
  EXPECT_FALSE(KueueCountsPod(PodWith(json::object(), {{"phase", "Failed"}})));
  // Deleted before it was scheduled: it can never run.
  EXPECT_FALSE(KueueCountsPod(PodWith(json::object(), {{"phase", "Pending"}}, deleting)));
  // Deleted on its node: it runs until its kubelet stops it.
  EXPECT_TRUE(KueueCountsPod(PodWith({{"nodeName", "n1"}}, {{"phase", "Running"}}, deleting)));
}

TEST(TrimPodTest, KeepsWhatTheQueueAndDisruptionReadersNeed) {
  json pod = PodWith({{"nodeName", "n1"},
                      {"schedulingGates", json::array({{{"name", "kueue.x-k8s.io/admission"}}})},
                      {"containers", json::array({{{"name", "worker"}}})}},
                     {{"phase", "Failed"},
                      {"conditions", json::array({{{"type", "Ready"}, {"status", "False"}},
                                                  {{"type", "Initialized"}, {"status", "True"}},
                                                  {{"type", "DisruptionTarget"},
                                                   {"status", "True"},
                                                   {"reason", "EvictionByEvictionAPI"},
                                                   {"message", "drained"}}})}},
                     {{"creationTimestamp", "2026-11-26T10:00:00Z"},
                      {"annotations",
                       {{"kueue.x-k8s.io/pod-group-total-count", "4"},
                        {"kueue.x-k8s.io/retriable-in-group", "false"},
                        {"example.com/big", std::string(4096, 'x')}}}});
  const json trimmed = TrimPod(pod);
  EXPECT_EQ(SchedulingGatedBy(trimmed), SchedulingGatedBy(pod));
  EXPECT_EQ(DisruptedBy(trimmed), "EvictionByEvictionAPI: drained");
  EXPECT_EQ(CreationTimestampOf(trimmed), "2026-11-26T10:00:00Z");
  EXPECT_EQ(AnnotationOf(trimmed, "kueue.x-k8s.io/pod-group-total-count"), "4");
  EXPECT_EQ(AnnotationOf(trimmed, "kueue.x-k8s.io/retriable-in-group"), "false");
  EXPECT_EQ(AnnotationOf(trimmed, "example.com/big"), "");
  EXPECT_FALSE(IsReady(trimmed));
  EXPECT_FALSE(trimmed["spec"].contains("containers"));
  EXPECT_EQ(trimmed["status"]["conditions"].size(), 2u);  // Ready and DisruptionTarget
}

TEST(TrimPodTest, KeepsTheWorkersExitCodeMessageAndTheKubeletsReason) {
  json pod = PodWith({{"containers", json::array({{{"name", "worker"}}})}},
                     {{"phase", "Failed"},
                      {"containerStatuses",
                       json::array({{{"name", "worker"},
                                     {"image", "registry.example/worker:1"},
                                     {"state",
                                      {{"terminated",
                                        {{"exitCode", 137},
                                         {"reason", "OOMKilled"},
                                         {"startedAt", "2026-11-26T10:00:00Z"}}}}}}})}});
  const json trimmed = TrimPod(pod);
  EXPECT_EQ(WorkerExitCode(trimmed), 137);
  EXPECT_EQ(WorkerTerminationMessage(trimmed),
            "OOMKilled: the container reached its memory limit (spec.resources.memory)");
  const json& kept = trimmed["status"]["containerStatuses"][0]["state"]["terminated"];
  EXPECT_FALSE(kept.contains("startedAt")) << kept.dump();
}

}  // namespace
}  // namespace lockstep::op::trainingjob
