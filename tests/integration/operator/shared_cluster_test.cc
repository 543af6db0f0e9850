// Shared clusters, against a real kube-apiserver 1.20.2: spec.placement, and a TrainingJob that
// Kueue queues, which runs as one of Kueue's plain pod groups. Kueue itself does not run here
// (it needs Kubernetes 1.27), so these tests play Kueue's documented steps through the API, as
// Kueue does them (Kueue's "Run Plain Pods" and KEP-976; its pod integration,
// pkg/controller/jobs/pod):
//  - its webhook adds the finalizer kueue.x-k8s.io/managed to every pod of a group, and the
//    scheduling gate kueue.x-k8s.io/admission. The 1.20 server has no scheduling gates, so a
//    gated pod is played by what kube-scheduler (1.26+) writes for one: PodScheduled False,
//    reason SchedulingGated (KEP-3521). Admission removes the gate; the pod then runs.
//  - a preemption writes the pod condition TerminationTarget True and deletes the group's pods;
//  - it removes its finalizer from a pod it no longer counts once a replacement exists, and from
//    a preempted pod;
//  - it never recreates a pod; the owner does, and the replacement joins the group.
// No kubelet runs either: the tests write the pods' status, as a kubelet would.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/integration/operator/operator_harness.h"

namespace lockstep::testing {
namespace {

constexpr int64_t kWaitMs = 30000;
constexpr char kQueue[] = "team-a";
constexpr char kFinalizer[] = "kueue.x-k8s.io/managed";

class SharedClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_ = OperatorHarness::Get();
    ASSERT_NE(h_, nullptr);
    ns_ = h_->NewNamespace("kueue");
    OperatorOptions options;
    options.watch_namespace = ns_;
    std::string error;
    op_ = h_->StartOperator(options, &error);
    ASSERT_NE(op_, nullptr) << error;
  }
  void TearDown() override {
    if (HasFailure() && op_) std::cerr << "operator log:\n" << op_->LogTail() << "\n";
  }

  // The job, labelled with Kueue's LocalQueue as a Kueue user labels a Job.
  json QueuedJob(const std::string& name, int replicas) {
    json job = JobManifest(name, replicas);
    job["metadata"]["labels"] = {{"kueue.x-k8s.io/queue-name", kQueue}};
    return job;
  }
  std::string PodPath(const std::string& name) {
    return "/api/v1/namespaces/" + ns_ + "/pods/" + name;
  }
  static std::string Name(const json& pod) { return pod["metadata"]["name"]; }
  static bool Terminating(const json& pod) { return pod["metadata"].contains("deletionTimestamp"); }
  // The job's pods that are not being deleted, once there are `count` of them whose names are
  // not in `old` (the pods they replace).
  std::vector<json> WaitForLivePods(const std::string& job, size_t count,
                                    const std::set<std::string>& old = {}) {
    std::vector<json> live;
    const bool ok = OperatorHarness::WaitFor(
        [&] {
          live.clear();
          for (const json& pod : h_->Pods(ns_, job)) {
            if (!Terminating(pod) && !old.count(Name(pod))) live.push_back(pod);
          }
          return live.size() == count;
        },
        kWaitMs);
    EXPECT_TRUE(ok) << "expected " << count << " live pods of " << job << ", have " << live.size();
    return live;
  }
  // Whether, within kWaitMs, the job's pods (their number accepted by `count_ok`) all carry
  // kueue.x-k8s.io/retriable-in-group: "false".
  bool PodsSayTheGroupIsOver(const std::string& job, const std::function<bool(size_t)>& count_ok) {
    return OperatorHarness::WaitFor(
        [&] {
          std::vector<json> pods = h_->Pods(ns_, job);
          if (!count_ok(pods.size())) return false;
          for (const json& pod : pods) {
            const json annotations = pod["metadata"].value("annotations", json::object());
            if (annotations.value("kueue.x-k8s.io/retriable-in-group", "") != "false") {
              return false;
            }
          }
          return true;
        },
        kWaitMs);
  }
  json WaitForJob(const std::string& name, const std::function<bool(const json&)>& predicate,
                  const std::string& what) {
    return h_->ExpectJob(ns_, name, predicate, what, kWaitMs);
  }

  // Kueue's webhook: the pod is managed, and kept until Kueue has counted it.
  void KueueManages(const std::string& pod) {
    auto r = h_->kube().Request(
        "PATCH", PodPath(pod),
        {{"metadata",
          {{"labels", {{"kueue.x-k8s.io/managed", "true"}}}, {"finalizers", {kFinalizer}}}}},
        "application/merge-patch+json");
    ASSERT_EQ(r.status, 200) << r.raw;
  }
  // Kueue lets go of the pod (its finalizer removed); a pod being deleted then goes.
  void KueueFinalizes(const std::string& pod) {
    auto r = h_->kube().Request("PATCH", PodPath(pod), {{"metadata", {{"finalizers", nullptr}}}},
                                "application/merge-patch+json");
    ASSERT_EQ(r.status, 200) << r.raw;
  }
  // kube-scheduler's binding: the pod then has a node, so deleting it leaves it Terminating until
  // its kubelet (here: the test) has stopped it.
  void Bind(const std::string& pod) {
    auto r = h_->kube().Request(
        "POST", PodPath(pod) + "/binding",
        {{"apiVersion", "v1"},
         {"kind", "Binding"},
         {"metadata", {{"name", pod}}},
         {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", "node-a"}}}});
    ASSERT_EQ(r.status, 201) << r.raw;
  }
  // The kubelet's end of a deletion: the containers stopped, the pod deleted with grace 0 (it
  // goes once no finalizer holds it).
  void KubeletStops(const std::string& pod) {
    ASSERT_TRUE(h_->SetPodTerminated(ns_, pod, 143));
    auto r = h_->kube().Request("DELETE", PodPath(pod), {{"gracePeriodSeconds", 0}});
    ASSERT_TRUE(r.status == 200 || r.status == 404) << r.raw;
  }
  // The pod waits behind Kueue's scheduling gate, as kube-scheduler reports it.
  void Gated(const std::string& pod) {
    const json status = {{"phase", "Pending"},
                         {"conditions", json::array({{{"type", "PodScheduled"},
                                                      {"status", "False"},
                                                      {"reason", "SchedulingGated"},
                                                      {"message",
                                                       "Scheduling is blocked due to "
                                                       "non-empty scheduling gates"}}})}};
    auto r = h_->kube().Request("PATCH", PodPath(pod) + "/status", {{"status", status}},
                                "application/merge-patch+json");
    ASSERT_EQ(r.status, 200) << r.raw;
  }
  // Kueue's Stop for a preempted group's pod: TerminationTarget, then a delete.
  void KueuePreempts(const std::string& pod) {
    const json condition = {{"type", "TerminationTarget"},
                            {"status", "True"},
                            {"reason", "Preempted"},
                            {"message", "Preempted to accommodate a workload of higher priority"}};
    json current = h_->Pod(ns_, pod);
    ASSERT_FALSE(current.is_null());
    json conditions = current["status"].value("conditions", json::array());
    conditions.push_back(condition);
    auto r = h_->kube().Request("PATCH", PodPath(pod) + "/status",
                                {{"status", {{"conditions", conditions}}}},
                                "application/merge-patch+json");
    ASSERT_EQ(r.status, 200) << r.raw;
    r = h_->kube().Request("DELETE", PodPath(pod));
    ASSERT_EQ(r.status, 200) << r.raw;
  }

  OperatorHarness* h_ = nullptr;
  std::string ns_;
  std::unique_ptr<OperatorProcess> op_;
};

TEST_F(SharedClusterTest, AQueuedJobsPodsFormOneGroupAndTheJobIsQueuedUntilKueueAdmitsIt) {
  json manifest = QueuedJob("queued", 2);
  manifest["spec"]["runPolicy"] = {{"activeDeadlineSeconds", 3600}};
  auto created = h_->Apply(ns_, manifest);
  ASSERT_EQ(created.status, 201) << created.raw;
  const std::string uid = created.body["metadata"]["uid"];
  std::vector<json> pods = WaitForLivePods("queued", 2);
  ASSERT_EQ(pods.size(), 2u);
  for (const json& pod : pods) {
    const json& labels = pod["metadata"]["labels"];
    EXPECT_EQ(labels["kueue.x-k8s.io/queue-name"], kQueue);
    EXPECT_EQ(labels["kueue.x-k8s.io/pod-group-name"], "queued-" + uid.substr(0, 8) + "-1");
    EXPECT_EQ(pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"], "2");
    KueueManages(Name(pod));
    Gated(Name(pod));
  }

  json job = WaitForJob(
      "queued", [](const json& j) { return Phase(j) == "Queued"; }, "Queued");
  json queued = Condition(job, "Queued");
  EXPECT_EQ(queued["status"], "True");
  EXPECT_EQ(queued["reason"], "SchedulingGated");
  EXPECT_NE(queued["message"].get<std::string>().find("2 of 2 worker pods"), std::string::npos)
      << queued.dump();
  EXPECT_NE(queued["message"].get<std::string>().find("LocalQueue team-a"), std::string::npos)
      << queued.dump();
  // The queue is not run time: the deadline has not started.
  EXPECT_FALSE(job["status"].contains("startTime")) << job["status"].dump();

  for (const json& pod : pods) ASSERT_TRUE(h_->SetPodRunning(ns_, Name(pod)));  // admitted
  job = WaitForJob(
      "queued", [](const json& j) { return Condition(j, "Queued").value("status", "") == "False"; },
      "admitted");
  EXPECT_EQ(Condition(job, "Queued")["reason"], "Admitted");
  EXPECT_NE(Phase(job), "Queued");
  EXPECT_TRUE(job["status"].contains("startTime"));
}

// A queued parameter-server job's servers wait with its workers: started at once, they would
// hold their CPU and memory, outside Kueue's quota, for as long as the workers queue.
TEST_F(SharedClusterTest, AQueuedJobsParameterServersStartOnlyOnceKueueAdmitsItsWorkers) {
  json manifest = ParameterServerManifest("queued-ps", 2);
  manifest["metadata"]["labels"] = {{"kueue.x-k8s.io/queue-name", kQueue}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  std::vector<json> workers = WaitForLivePods("queued-ps", 2);
  ASSERT_EQ(workers.size(), 2u);
  for (const json& pod : workers) {
    EXPECT_NE(pod["metadata"]["labels"].value("lockstep.io/replica-type", ""), "ps");
    KueueManages(Name(pod));
    Gated(Name(pod));
  }
  json job = WaitForJob(
      "queued-ps", [](const json& j) { return Phase(j) == "Queued"; }, "Queued");
  // Every reconcile up to this one has looked at the servers; none was created.
  EXPECT_EQ(h_->Pods(ns_, "queued-ps").size(), 2u) << "a server started while the workers queued";
  EXPECT_EQ(job["status"]["parameterServers"].value("ready", -1), 0) << job["status"].dump();

  for (const json& pod : workers) ASSERT_TRUE(h_->SetPodRunning(ns_, Name(pod)));  // admitted
  std::vector<json> pods = WaitForLivePods("queued-ps", 4);
  int servers = 0;
  for (const json& pod : pods) {
    if (pod["metadata"]["labels"].value("lockstep.io/replica-type", "") != "ps") continue;
    ++servers;
    // Not members of the group Kueue admitted: it would wait for them to be admitted too.
    EXPECT_FALSE(pod["metadata"]["labels"].contains("kueue.x-k8s.io/pod-group-name"));
  }
  EXPECT_EQ(servers, 2);
}

TEST_F(SharedClusterTest, APreemptedGroupIsReplacedOnceWithoutCountingAFailureAndTheJobFinishes) {
  json manifest = QueuedJob("preempt", 2);
  // Any failure counted would fail the job.
  manifest["spec"]["runPolicy"] = {{"restartPolicy", "OnFailure"}, {"backoffLimit", 0}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  std::set<std::string> preempted;
  std::string group;
  for (const json& pod : WaitForLivePods("preempt", 2)) {
    KueueManages(Name(pod));
    Bind(Name(pod));
    ASSERT_TRUE(h_->SetPodRunning(ns_, Name(pod)));
    preempted.insert(Name(pod));
    group = pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"];
  }
  WaitForJob(
      "preempt", [](const json& j) { return j["status"]["replicas"].value("ready", 0) == 2; },
      "had 2 ready workers");

  for (const std::string& pod : preempted) KueuePreempts(pod);
  // Terminating on their node, the pods still run and Kueue still counts them: the reconcile
  // that sees none of them active creates nothing (it would count what it created as active).
  json job = WaitForJob(
      "preempt", [](const json& j) { return j["status"]["replicas"].value("active", -1) == 0; },
      "saw its pods terminating");
  EXPECT_EQ(WaitForLivePods("preempt", 0, preempted).size(), 0u);
  // Stopped, they are Failed and no longer counted, while Kueue's finalizer keeps them in the
  // API: their replacements take names of their own and join the group (gated until admitted).
  for (const std::string& pod : preempted) KubeletStops(pod);
  std::vector<json> replacements = WaitForLivePods("preempt", 2, preempted);
  ASSERT_EQ(replacements.size(), 2u);
  std::set<std::string> indices;
  for (const json& pod : replacements) {
    indices.insert(pod["metadata"]["labels"]["lockstep.io/replica-index"].get<std::string>());
    EXPECT_EQ(pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], kQueue);
    EXPECT_EQ(pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"], "2");
    EXPECT_EQ(pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"], group);
    EXPECT_EQ(pod["spec"]["hostname"],
              "preempt-worker-" +
                  pod["metadata"]["labels"]["lockstep.io/replica-index"].get<std::string>());
    KueueManages(Name(pod));
    Gated(Name(pod));
  }
  EXPECT_EQ(indices, (std::set<std::string>{"0", "1"}));
  job = WaitForJob(
      "preempt", [](const json& j) { return Phase(j) == "Queued"; }, "queued again");
  EXPECT_EQ(job["status"].value("restarts", 0), 0);
  EXPECT_FALSE(job["status"].contains("startTime"));

  for (const std::string& pod : preempted) KueueFinalizes(pod);
  for (const json& pod : replacements) ASSERT_TRUE(h_->SetPodRunning(ns_, Name(pod)));
  for (const json& pod : replacements) ASSERT_TRUE(h_->SetPodTerminated(ns_, Name(pod), 0));
  job = WaitForJob(
      "preempt", [](const json& j) { return Phase(j) == "Succeeded"; }, "Succeeded");
  EXPECT_EQ(job["status"].value("restarts", 0), 0);
  // Replaced once: the preempted pods are gone and nothing else was created.
  std::set<std::string> names;
  for (const json& pod : h_->Pods(ns_, "preempt")) names.insert(Name(pod));
  std::set<std::string> expected;
  for (const json& pod : replacements) expected.insert(Name(pod));
  EXPECT_EQ(names, expected);
}

TEST_F(SharedClusterTest, AFailedWorkerHeldByKueueIsReplacedAtOnceAndAFailedJobEndsItsGroup) {
  json manifest = QueuedJob("failing", 2);
  manifest["spec"]["runPolicy"] = {{"restartPolicy", "ExitCode"}, {"backoffLimit", 3}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  for (const json& pod : WaitForLivePods("failing", 2)) {
    KueueManages(Name(pod));
    ASSERT_TRUE(h_->SetPodRunning(ns_, Name(pod)));
  }
  ASSERT_TRUE(h_->SetPodTerminated(ns_, "failing-worker-1", 137));  // SIGKILL: retryable
  // Deleted and counted, but held by Kueue's finalizer until a replacement exists: the
  // replacement cannot wait for its name.
  std::vector<json> live = WaitForLivePods("failing", 2, {"failing-worker-1"});
  std::string replacement;
  for (const json& pod : live) {
    if (Name(pod) != "failing-worker-0") replacement = Name(pod);
  }
  ASSERT_EQ(replacement.rfind("failing-worker-1-", 0), 0u) << replacement;
  json held = h_->Pod(ns_, "failing-worker-1");
  ASSERT_FALSE(held.is_null());
  EXPECT_TRUE(Terminating(held));
  json job = WaitForJob(
      "failing", [](const json& j) { return j["status"].value("restarts", 0) == 1; },
      "counted the failure");
  const std::string started = job["status"].value("startTime", "");
  ASSERT_FALSE(started.empty()) << job["status"].dump();
  // The replacement waits at the gate of a group Kueue admitted (Kueue lifts it at once): the
  // job is not queued again and its deadline goes on. Worker 0 turning unready afterwards makes
  // the reconcile that reports it one that saw the gate.
  KueueManages(replacement);
  Gated(replacement);
  auto unready = h_->kube().Request(
      "PATCH", PodPath("failing-worker-0") + "/status",
      {{"status", {{"conditions", json::array({{{"type", "Ready"}, {"status", "False"}}})}}}},
      "application/merge-patch+json");
  ASSERT_EQ(unready.status, 200) << unready.raw;
  job = WaitForJob(
      "failing", [](const json& j) { return j["status"]["replicas"].value("ready", -1) == 0; },
      "saw worker 0 unready");
  EXPECT_NE(Phase(job), "Queued");
  EXPECT_NE(Condition(job, "Queued").value("status", ""), "True");
  EXPECT_EQ(job["status"].value("startTime", ""), started);
  KueueFinalizes("failing-worker-1");  // Kueue lets the failed pod go once it is replaced
  ASSERT_TRUE(h_->SetPodRunning(ns_, replacement));

  ASSERT_TRUE(h_->SetPodTerminated(ns_, "failing-worker-0", 1));  // a bug: not retryable
  job = WaitForJob(
      "failing", [](const json& j) { return Phase(j) == "Failed"; }, "Failed");
  EXPECT_EQ(Condition(job, "Failed")["reason"], "PodFailed");
  EXPECT_EQ(job["status"].value("restarts", 0), 1);
  // Kueue holds the group's quota for replacements until a pod says the group may not retry.
  EXPECT_TRUE(PodsSayTheGroupIsOver("failing", [](size_t pods) { return pods > 0; }));
}

TEST_F(SharedClusterTest, ASuspendEndsTheGroupAndTheResumeQueuesANewOneAtTheNewSize) {
  ASSERT_EQ(h_->Apply(ns_, QueuedJob("pause", 2)).status, 201);
  std::set<std::string> old;
  std::string group;
  for (const json& pod : WaitForLivePods("pause", 2)) {
    KueueManages(Name(pod));
    ASSERT_TRUE(h_->SetPodRunning(ns_, Name(pod)));
    old.insert(Name(pod));
    group = pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"];
  }
  ASSERT_EQ(h_->PatchJobSpec(ns_, "pause", {{"runPolicy", {{"suspend", true}}}}).status, 200);
  WaitForJob(
      "pause", [](const json& j) { return Phase(j) == "Suspended"; }, "Suspended");
  // Every pod says the group may not retry, so that Kueue ends it and frees its quota; Kueue's
  // finalizer keeps them in the API meanwhile.
  ASSERT_TRUE(PodsSayTheGroupIsOver("pause", [](size_t pods) { return pods == 2; }));

  ASSERT_EQ(h_->Scale(ns_, "pause", 3).status, 200);
  ASSERT_EQ(h_->PatchJobSpec(ns_, "pause", {{"runPolicy", {{"suspend", false}}}}).status, 200);
  // A new group, at the new size, while the old pods still linger.
  std::vector<json> fresh = WaitForLivePods("pause", 3, old);
  ASSERT_EQ(fresh.size(), 3u);
  for (const json& pod : fresh) {
    EXPECT_NE(pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"], group);
    EXPECT_EQ(pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"], "3");
  }
  EXPECT_EQ(fresh[0]["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"],
            fresh[2]["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"]);
}

TEST_F(SharedClusterTest, ScalingAQueuedJobKeepsTheGroupKueueAdmittedAndSaysWhy) {
  ASSERT_EQ(h_->Apply(ns_, QueuedJob("fixed", 2)).status, 201);
  for (const json& pod : WaitForLivePods("fixed", 2))
    ASSERT_TRUE(h_->SetPodRunning(ns_, Name(pod)));
  ASSERT_EQ(h_->Scale(ns_, "fixed", 3).status, 200);
  json job = WaitForJob(
      "fixed",
      [](const json& j) {
        return Condition(j, "Scaling").value("reason", "") == "KueuePodGroupSizeFixed";
      },
      "said why it does not scale");
  EXPECT_EQ(Condition(job, "Scaling")["status"], "False");
  EXPECT_NE(Condition(job, "Scaling")["message"].get<std::string>().find("spec.replicas is 3"),
            std::string::npos);
  EXPECT_EQ(job["status"]["replicas"]["desired"], 2);
  // The reconcile that wrote the condition created no pod.
  EXPECT_EQ(h_->Pods(ns_, "fixed").size(), 2u);
}

TEST_F(SharedClusterTest, AWorkerTheSchedulerPreemptedIsReplacedWithoutCountingARestart) {
  json manifest = JobManifest("disrupted", 2);  // not queued: a disruption is never a failure
  manifest["spec"]["runPolicy"] = {{"restartPolicy", "OnFailure"}, {"backoffLimit", 0}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  std::map<std::string, std::string> uids;
  for (const json& pod : WaitForLivePods("disrupted", 2)) {
    ASSERT_TRUE(h_->SetPodRunning(ns_, Name(pod)));
    uids[Name(pod)] = pod["metadata"]["uid"];
  }
  // What the scheduler and the kubelet write for a preempted pod (Kubernetes 1.26+), in one
  // write so that the operator never sees the failure without its cause.
  const json status = {
      {"phase", "Failed"},
      {"conditions", json::array({{{"type", "Ready"}, {"status", "False"}},
                                  {{"type", "DisruptionTarget"},
                                   {"status", "True"},
                                   {"reason", "PreemptionByScheduler"},
                                   {"message", "team-b/urgent: preempting to run"}}})},
      {"containerStatuses",
       json::array({{{"name", "worker"},
                     {"ready", false},
                     {"restartCount", 0},
                     {"image", "lockstep-worker:test"},
                     {"imageID", ""},
                     {"state", {{"terminated", {{"exitCode", 143}, {"reason", "Error"}}}}}}})}};
  auto r = h_->kube().Request("PATCH", PodPath("disrupted-worker-1") + "/status",
                              {{"status", status}}, "application/merge-patch+json");
  ASSERT_EQ(r.status, 200) << r.raw;
  const bool replaced = OperatorHarness::WaitFor(
      [&] {
        json pod = h_->Pod(ns_, "disrupted-worker-1");
        return !pod.is_null() && pod["metadata"]["uid"] != uids["disrupted-worker-1"];
      },
      kWaitMs);
  EXPECT_TRUE(replaced);
  json job = h_->GetJob(ns_, "disrupted");
  EXPECT_NE(Phase(job), "Failed") << job["status"].dump();
  EXPECT_EQ(job["status"].value("restarts", 0), 0);
}

TEST_F(SharedClusterTest, APlacementOnALevelNoNodeCarriesSaysSoRatherThanLeavingPodsPending) {
  json manifest = JobManifest("nolevel", 2);
  manifest["spec"]["placement"] = {{"topology", "topology.lockstep.io/no-such-level"}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  json job = WaitForJob(
      "nolevel",
      [](const json& j) {
        return Condition(j, "Running").value("reason", "") == "NoNodeHasTopologyLevel";
      },
      "said that no node has the level");
  EXPECT_EQ(Condition(job, "Running")["status"], "False");
  EXPECT_NE(Condition(job, "Running")["message"].get<std::string>().find(
                "no node carries the label topology.lockstep.io/no-such-level"),
            std::string::npos)
      << Condition(job, "Running").dump();
  const bool warned = OperatorHarness::WaitFor(
      [&] {
        for (const json& e : h_->Events(ns_, "nolevel")) {
          if (e.value("reason", "") == "NoNodeHasTopologyLevel") return true;
        }
        return false;
      },
      kWaitMs);
  EXPECT_TRUE(warned);
  // The pods ask to stay with each other across the level.
  for (const json& pod : WaitForLivePods("nolevel", 2)) {
    const json& terms =
        pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    ASSERT_EQ(terms.size(), 1u) << pod["spec"].dump();
    EXPECT_EQ(terms[0]["topologyKey"], "topology.lockstep.io/no-such-level");
  }
}

TEST_F(SharedClusterTest, APlacementOnALevelANodeCarriesRaisesNoComplaint) {
  const std::string node = "rack-node-" + ns_;
  auto created = h_->kube().Request(
      "POST", "/api/v1/nodes",
      {{"apiVersion", "v1"},
       {"kind", "Node"},
       {"metadata", {{"name", node}, {"labels", {{"topology.lockstep.io/test-rack", "r1"}}}}}});
  ASSERT_EQ(created.status, 201) << created.raw;
  json manifest = JobManifest("level", 1);
  manifest["spec"]["placement"] = {{"topology", "topology.lockstep.io/test-rack"}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  WaitForLivePods("level", 1);
  // Once its pods exist the job has been reconciled past the check.
  json job = WaitForJob(
      "level", [](const json& j) { return Phase(j) == "Created"; }, "Created");
  EXPECT_NE(Condition(job, "Running").value("reason", ""), "NoNodeHasTopologyLevel");
  for (const json& e : h_->Events(ns_, "level")) {
    EXPECT_NE(e.value("reason", ""), "NoNodeHasTopologyLevel") << e.dump();
  }
  h_->kube().Request("DELETE", "/api/v1/nodes/" + node);
}

}  // namespace
}  // namespace lockstep::testing
