#include "operator/trainingjob/admission.h"

#include <utility>
#include <vector>

namespace lockstep::op::trainingjob {

using json = nlohmann::json;

json ManifestOf(const json& object) {
  json manifest = {{"apiVersion", object.value("apiVersion", "lockstep.io/v1alpha1")},
                   {"kind", object.value("kind", "TrainingJob")}};
  json meta = json::object();
  const auto m = object.find("metadata");
  if (m != object.end() && m->is_object()) {
    for (const char* field : {"name", "namespace", "labels", "annotations", "uid", "generation"}) {
      if (m->contains(field)) meta[field] = (*m)[field];
    }
  }
  manifest["metadata"] = meta;
  manifest["spec"] = object.value("spec", json::object());
  return manifest;
}

StatusOr<spec::TrainingJob> ParseTrainingJobObject(const json& object) {
  return spec::ParseTrainingJobJson(ManifestOf(object), /*source=*/"");
}

namespace {

constexpr char kV1[] = "admission.k8s.io/v1";
constexpr char kV1beta1[] = "admission.k8s.io/v1beta1";

AdmissionReply Malformed(const std::string& why) {
  AdmissionReply reply;
  reply.http_status = 400;
  reply.body = "not an AdmissionReview: " + why;
  return reply;
}

// metav1.Status for a refusal: 422 Invalid, the message the model's problem lines. No details:
// kubectl prints an Invalid status with details as "field: message" per cause, which would
// reword the lines `lockstep validate` prints; without them it prints the message as it is
// ("The request is invalid: admission webhook ... denied the request: <lines>").
json InvalidStatus(const std::string& problems) {
  return {{"metadata", json::object()},
          {"status", "Failure"},
          {"code", 422},
          {"reason", "Invalid"},
          {"message", problems}};
}

bool SpecChanged(const json& request) {
  const json& object = request["object"];
  const auto old = request.find("oldObject");
  if (old == request.end() || !old->is_object()) return true;
  return old->value("spec", json::object()) != object.value("spec", json::object());
}

// The job the review is about, as it would be stored: the object itself, or for a Scale the
// current job with the Scale's replicas. An error only when the lookup failed.
StatusOr<json> JobUnderReview(const json& request, const TrainingJobLookup& lookup) {
  const json& object = request["object"];
  if (request.value("subResource", "") != "scale") return object;
  const std::string ns = request.value("namespace", "");
  std::string name = request.value("name", "");
  if (name.empty()) name = object.value("metadata", json::object()).value("name", "");
  if (name.empty() || ns.empty()) {
    return InvalidArgumentError("a scale review without the job's namespace and name");
  }
  LOCKSTEP_ASSIGN_OR_RETURN(json job, lookup(ns, name));
  const json spec = object.value("spec", json::object());
  // autoscaling/v1 ScaleSpec.replicas is omitempty: absent means 0.
  job["spec"]["replicas"] = spec.value("replicas", json(0));
  return job;
}

AdmissionReply Review(const std::string& body, const TrainingJobLookup& lookup) {
  const json review = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!review.is_object()) return Malformed("the body is not a JSON object");
  const std::string api_version = review.value("apiVersion", "");
  if (api_version != kV1 && api_version != kV1beta1) {
    return Malformed("apiVersion \"" + api_version + "\" is neither " + kV1 + " nor " + kV1beta1);
  }
  const auto request_it = review.find("request");
  if (request_it == review.end() || !request_it->is_object()) return Malformed("no request");
  const json& request = *request_it;
  const auto uid = request.find("uid");
  if (uid == request.end() || !uid->is_string()) return Malformed("request.uid is missing");

  AdmissionReply reply;
  reply.allowed = true;
  const std::string operation = request.value("operation", "");
  const auto object = request.find("object");
  const bool reviewed = (operation == "CREATE" || operation == "UPDATE") &&
                        object != request.end() && object->is_object() &&
                        (operation == "CREATE" || SpecChanged(request));
  json response = {{"uid", *uid}, {"allowed", true}};
  if (reviewed) {
    StatusOr<json> job = JobUnderReview(request, lookup);
    if (job.status().code() == StatusCode::kInvalidArgument)
      return Malformed(job.status().message());
    if (!job.ok()) {
      reply.http_status = 500;
      reply.allowed = false;
      reply.body = "reading the TrainingJob for its scale: " + job.status().message();
      return reply;
    }
    StatusOr<spec::TrainingJob> parsed = ParseTrainingJobObject(*job);
    if (!parsed.ok()) {
      reply.allowed = false;
      response["allowed"] = false;
      response["status"] = InvalidStatus(parsed.status().message());
    }
  }
  reply.body = {{"apiVersion", api_version}, {"kind", "AdmissionReview"}, {"response", response}};
  return reply;
}

}  // namespace

AdmissionReply ReviewTrainingJobAdmission(const std::string& body,
                                          const TrainingJobLookup& lookup) {
  // Whoever can reach the port can send anything: a field of the wrong type is a bad request,
  // never an exception out of the server's thread.
  try {
    return Review(body, lookup);
  } catch (const json::exception& error) {
    return Malformed(std::string("a field has the wrong type: ") + error.what());
  }
}

}  // namespace lockstep::op::trainingjob
