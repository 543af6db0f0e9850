// TrainingJobReconciler, a job Kueue queues (Kueue's "Run Plain Pods", KEP-976): the job runs as
// one plain pod group (DesiredPod labels its pods). Kueue gates the group's pods until it admits
// the group, never recreates a pod, deletes the group's pods when it preempts it, and counts
// the group finished when all its pods succeeded or, once none runs, when one says it is not
// retriable. What that asks of the operator lives here and in ReconcilePods (replacements of
// pods Kueue no longer counts) and ComputeStatus (the Queued phase).
#include <algorithm>
#include <string>

#include "common/logging.h"
#include "operator/trainingjob/children.h"
#include "operator/trainingjob/pod_cache.h"
#include "operator/trainingjob/reconciler.h"
#include "operator/trainingjob/reconciler_work.h"

namespace lockstep::op::trainingjob {

using json = nlohmann::json;
using controller::ObjectPtr;

namespace {

// A group size annotation's value, 0 when it is not one.
int32_t ParseGroupSize(const std::string& text) {
  if (text.empty() || text.size() > 6 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return 0;
  }
  const int32_t size = std::stoi(text);
  return size <= spec::kMaxReplicas ? size : 0;
}

}  // namespace

// A plain pod group has a name and a fixed size, both written on its pods: Kueue admitted (and
// holds quota for) the count they carry, deletes pods past it and refuses to build a workload
// from pods that disagree on it. So the job's pods join the group its pods in the API belong to,
// at that group's size, until none is left that the group may still count on: a group ends when
// its pods say it may not retry (MarkKueueGroupDone: at the job's end, and at a suspend, which
// frees the quota), and the next pods start a new group under a new name (KueuePodGroupName:
// the generation changed) at spec.replicas. Meanwhile a changed spec.replicas waits, the job
// running as it was admitted, its Scaling condition saying why (ReportQueue).
void TrainingJobReconciler::KueueGroup(Work& w, const std::vector<ObjectPtr>& pods) {
  w.kueue = !KueueQueue(w.job).empty();
  if (!w.kueue) return;
  spec::TrainingJobSpec& spec = w.job.spec;
  // Read from a pod Kueue counts where there is one, else from any the group has.
  std::string group;
  int32_t size = 0;
  for (const ObjectPtr& pod : pods) {
    if (!OwnedBy(*pod, w.job.metadata.uid)) continue;
    if (AnnotationOf(*pod, kKueueRetriableAnnotation) == "false") continue;  // an ended group
    const std::string name = LabelOf(*pod, kKueuePodGroupLabel);
    const int32_t count = ParseGroupSize(AnnotationOf(*pod, kKueuePodGroupCountAnnotation));
    if (name.empty() || count == 0) continue;
    group = name;
    size = count;
    if (KueueCountsPod(*pod)) break;
  }
  w.kueue_group = group.empty() ? KueuePodGroupName(w.job) : group;
  // The group's pods are the workers and the standbys: the standbys stay what the spec says.
  if (size == 0 || size == spec::WorkersToRun(spec)) return;
  w.kueue_spec_replicas = spec.replicas;
  // The group's pods split as the spec says, at least one worker among them.
  spec.elastic.standby = std::min(spec.elastic.standby, size - 1);
  size -= spec.elastic.standby;
  spec.replicas = size;
  if (spec.elastic_set) {
    spec.elastic.min_replicas = std::min(spec.elastic.min_replicas, size);
    spec.elastic.max_replicas = std::max(spec.elastic.max_replicas, size);
  } else {
    spec.elastic.min_replicas = spec.elastic.max_replicas = size;
  }
}

// Kueue ends a group that did not succeed whole only when a pod says it is not retriable; until
// then it holds the group's quota for replacements that will never come. Every pod of a
// finished or suspended job says so (the annotation may go on any pod, and a pod deleted at the
// job's end may be gone before Kueue reads it).
Status TrainingJobReconciler::MarkKueueGroupDone(Work& w) {
  Status first;
  for (const ObjectPtr& pod : deps_.pods->ByIndex(kJobIndex, w.key)) {
    if (!OwnedBy(*pod, w.job.metadata.uid)) continue;
    if (AnnotationOf(*pod, kKueueRetriableAnnotation) == "false") continue;
    const std::string name = (*pod)["metadata"].value("name", "");
    const json patch = {{"metadata", {{"annotations", {{kKueueRetriableAnnotation, "false"}}}}}};
    StatusOr<json> patched = deps_.client->Patch(kube::resources::kPods, w.job.metadata.namespace_,
                                                 name, kube::PatchType::kMerge, patch);
    if (!patched.ok() && !kube::IsNotFound(patched.status()) && first.ok()) {
      first = patched.status().WithContext("marking pod " + name + " not retriable for Kueue");
    }
  }
  return first;
}

}  // namespace lockstep::op::trainingjob
