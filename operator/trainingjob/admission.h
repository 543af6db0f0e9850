// Admission of TrainingJobs: the validating webhook's decision, and the one way the operator reads
// a TrainingJob API object into the spec model. Pure: no I/O except through the caller's lookup,
// so every rule is table-tested without a cluster.
//
//   AdmissionReply reply = ReviewTrainingJobAdmission(body, [&](const std::string& ns,
//                                                               const std::string& name) {
//     return client->Get(kube::resources::kTrainingJobs, ns, name);
//   });
//   respond with reply.http_status and reply.body.dump()
//
// What is refused is exactly what `lockstep validate` refuses on the manifest alone (the spec
// model's ParseTrainingJobJson: cross-field rules such as elastic.minReplicas <= replicas <=
// elastic.maxReplicas, which the CRD's structural schema cannot state), with the same messages,
// one per line, each naming its field. Checks that need the data files or a GPU stay with the
// worker: they exist only in the pod.
//
// The AdmissionReview protocol (admission.k8s.io/v1 and v1beta1; Kubernetes "Dynamic Admission
// Control"): the API server POSTs a review whose request carries uid, operation, object and (on
// UPDATE) oldObject; the answer is a review of the same apiVersion whose response echoes the uid
// and says allowed, or not with a metav1.Status (422 Invalid and the message) that the API server
// returns to the client, the message prefixed by the webhook's name.
//
// Which requests:
//  - CREATE of a TrainingJob: validated.
//  - UPDATE of a TrainingJob: validated only when the spec changed, so a job that a newer rule
//    would refuse can still be labelled, annotated, finalized and deleted.
//  - CREATE/UPDATE of trainingjobs/scale (`kubectl scale`): the object is an autoscaling/v1
//    Scale; the job is read through `lookup`, given the Scale's spec.replicas, and validated.
//  - Anything else (DELETE, CONNECT, another kind): allowed; the webhook's rules do not send them.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/spec/training_job.h"
#include "common/status.h"

namespace lockstep::op::trainingjob {

// The job as ParseTrainingJobJson reads a manifest: what the user wrote (with the server's
// defaults), without the server's bookkeeping (status, managedFields, resourceVersion, ...).
nlohmann::json ManifestOf(const nlohmann::json& object);

// ParseTrainingJobJson(ManifestOf(object)): INVALID_ARGUMENT whose message lists every problem,
// one per line, each starting with the field's path ("spec.elastic.minReplicas (5) > ...").
StatusOr<spec::TrainingJob> ParseTrainingJobObject(const nlohmann::json& object);

// Reads the current TrainingJob namespace/name (for a Scale review). May block (an API call);
// its error makes the review fail (HTTP 500), so the webhook's failurePolicy decides.
using TrainingJobLookup =
    std::function<StatusOr<nlohmann::json>(const std::string& ns, const std::string& name)>;

struct AdmissionReply {
  int http_status = 200;  // 400: the body is not an AdmissionReview; 500: lookup failed
  nlohmann::json body;    // the AdmissionReview to send back (on 200), else a plain message
  bool allowed = false;   // for metrics: what response.allowed says (false on errors)
};

// The answer to one AdmissionReview POSTed by the API server. `body` is the raw request body.
AdmissionReply ReviewTrainingJobAdmission(const std::string& body, const TrainingJobLookup& lookup);

}  // namespace lockstep::op::trainingjob
