// The validating webhook's decision (operator/trainingjob/admission.h), table-tested with the
// AdmissionReview documents the API server sends (admission.k8s.io/v1 and v1beta1): what is
// refused is what `lockstep validate` refuses, with the same lines; unchanged specs, status-free
// updates and other operations pass; `kubectl scale` is checked against the job's elastic range.
#include "operator/trainingjob/admission.h"

#include <gtest/gtest.h>

#include <string>

namespace lockstep::op::trainingjob {
namespace {

using json = nlohmann::json;

json Job(const json& spec) {
  return {{"apiVersion", "lockstep.io/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata",
           {{"name", "fashion"},
            {"namespace", "team-a"},
            {"uid", "8c1b6f52-0000-4000-8000-000000000001"},
            {"resourceVersion", "12"},
            {"managedFields", json::array({{{"manager", "kubectl"}}})}}},
          {"spec", spec}};
}

json ValidSpec() {
  return {{"replicas", 4},
          {"elastic", {{"minReplicas", 2}, {"maxReplicas", 8}}},
          {"command", {"python3", "train.py"}}};
}

json Review(const std::string& operation, const json& object, const json& old_object = nullptr,
            const std::string& api_version = "admission.k8s.io/v1") {
  json request = {
      {"uid", "705ab4f5-6393-11e8-b7cc-42010a800002"},
      {"kind", {{"group", "lockstep.io"}, {"version", "v1alpha1"}, {"kind", "TrainingJob"}}},
      {"resource",
       {{"group", "lockstep.io"}, {"version", "v1alpha1"}, {"resource", "trainingjobs"}}},
      {"name", "fashion"},
      {"namespace", "team-a"},
      {"operation", operation},
      {"userInfo", {{"username", "alice"}}},
      {"object", object},
      {"dryRun", false}};
  if (!old_object.is_null()) request["oldObject"] = old_object;
  return {{"apiVersion", api_version}, {"kind", "AdmissionReview"}, {"request", request}};
}

json ScaleReview(const std::string& operation, int replicas, int old_replicas) {
  auto scale = [](int n) {
    return json{{"apiVersion", "autoscaling/v1"},
                {"kind", "Scale"},
                {"metadata", {{"name", "fashion"}, {"namespace", "team-a"}}},
                {"spec", {{"replicas", n}}},
                {"status", {{"replicas", 4}}}};
  };
  json review = Review(operation, scale(replicas), scale(old_replicas));
  review["request"]["kind"] = {{"group", "autoscaling"}, {"version", "v1"}, {"kind", "Scale"}};
  review["request"]["subResource"] = "scale";
  return review;
}

TrainingJobLookup NoLookup() {
  return [](const std::string& ns, const std::string& name) -> StatusOr<json> {
    ADD_FAILURE() << "unexpected lookup of " << ns << "/" << name;
    return NotFoundError("unexpected");
  };
}

TrainingJobLookup LookupReturning(const json& job, int* calls) {
  return [job, calls](const std::string& ns, const std::string& name) -> StatusOr<json> {
    ++*calls;
    EXPECT_EQ(ns, "team-a");
    EXPECT_EQ(name, "fashion");
    return job;
  };
}

AdmissionReply Answer(const json& review, const TrainingJobLookup& lookup = NoLookup()) {
  return ReviewTrainingJobAdmission(review.dump(), lookup);
}

// What the parser says of the same spec, as `lockstep validate` prints it without the file name.
std::string ValidateMessage(const json& spec) {
  StatusOr<spec::TrainingJob> parsed = ParseTrainingJobObject(Job(spec));
  return parsed.ok() ? "" : parsed.status().message();
}

TEST(AdmissionTest, ValidJobIsAllowedAndTheUidEchoed) {
  AdmissionReply reply = Answer(Review("CREATE", Job(ValidSpec())));
  ASSERT_EQ(reply.http_status, 200) << reply.body;
  EXPECT_TRUE(reply.allowed);
  EXPECT_EQ(reply.body["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(reply.body["kind"], "AdmissionReview");
  EXPECT_EQ(reply.body["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
  EXPECT_EQ(reply.body["response"]["allowed"], true);
  EXPECT_FALSE(reply.body["response"].contains("status"));
}

TEST(AdmissionTest, CrossFieldRuleIsRefusedWithTheValidateMessageAndItsField) {
  json spec = ValidSpec();
  spec["elastic"] = {{"minReplicas", 5}, {"maxReplicas", 4}};
  AdmissionReply reply = Answer(Review("CREATE", Job(spec)));
  ASSERT_EQ(reply.http_status, 200) << reply.body;
  EXPECT_FALSE(reply.allowed);
  const json& response = reply.body["response"];
  EXPECT_EQ(response["allowed"], false);
  EXPECT_EQ(response["status"]["code"], 422);
  EXPECT_EQ(response["status"]["reason"], "Invalid");
  const std::string message = response["status"]["message"];
  EXPECT_EQ(message, ValidateMessage(spec));
  EXPECT_NE(message.find("spec.elastic.minReplicas"), std::string::npos) << message;
  // No details: kubectl would print them as "field: message" pairs instead of these lines.
  EXPECT_FALSE(response["status"].contains("details"));
}

TEST(AdmissionTest, EveryProblemIsListedOnePerLine) {
  json spec = ValidSpec();
  spec["replicas"] = 9;                   // above maxReplicas
  spec["trainer"] = {{"batchSize", 64}};  // and both trainer and command
  AdmissionReply reply = Answer(Review("CREATE", Job(spec)));
  ASSERT_FALSE(reply.allowed);
  const std::string message = reply.body["response"]["status"]["message"];
  EXPECT_EQ(message, ValidateMessage(spec));
  EXPECT_NE(message.find('\n'), std::string::npos) << message;
}

TEST(AdmissionTest, ServerBookkeepingIsNotTakenForUnknownFields) {
  json job = Job(ValidSpec());
  job["status"] = {{"phase", "Running"}};
  job["metadata"]["creationTimestamp"] = "2026-11-25T10:00:00Z";
  job["metadata"]["finalizers"] = {"example.com/keep"};
  EXPECT_TRUE(Answer(Review("CREATE", job)).allowed);
}

TEST(AdmissionTest, UpdateThatBreaksARuleIsRefused) {
  json spec = ValidSpec();
  spec["replicas"] = 1;  // below minReplicas 2
  AdmissionReply reply = Answer(Review("UPDATE", Job(spec), Job(ValidSpec())));
  EXPECT_FALSE(reply.allowed);
  EXPECT_NE(std::string(reply.body["response"]["status"]["message"]).find("spec.replicas"),
            std::string::npos);
}

TEST(AdmissionTest, UpdateThatLeavesTheSpecAloneIsAllowedEvenForAnInvalidJob) {
  // A job stored before a rule existed (or while the webhook was off) can still be labelled,
  // finalized and deleted.
  json spec = ValidSpec();
  spec["elastic"] = {{"minReplicas", 5}, {"maxReplicas", 4}};
  json labelled = Job(spec);
  labelled["metadata"]["labels"] = {{"team", "vision"}};
  EXPECT_TRUE(Answer(Review("UPDATE", labelled, Job(spec))).allowed);
}

TEST(AdmissionTest, DeleteIsAllowedWithoutReadingTheObject) {
  json review = Review("DELETE", nullptr, Job(ValidSpec()));
  review["request"].erase("object");
  EXPECT_TRUE(Answer(review).allowed);
}

TEST(AdmissionTest, V1beta1ReviewIsAnsweredInV1beta1) {
  json spec = ValidSpec();
  spec["replicas"] = 0;
  AdmissionReply reply = Answer(Review("CREATE", Job(spec), nullptr, "admission.k8s.io/v1beta1"));
  EXPECT_FALSE(reply.allowed);
  EXPECT_EQ(reply.body["apiVersion"], "admission.k8s.io/v1beta1");
}

TEST(AdmissionTest, ScaleWithinTheElasticRangeIsAllowed) {
  int calls = 0;
  AdmissionReply reply =
      Answer(ScaleReview("UPDATE", 8, 4), LookupReturning(Job(ValidSpec()), &calls));
  EXPECT_TRUE(reply.allowed) << reply.body;
  EXPECT_EQ(calls, 1);
}

TEST(AdmissionTest, ScaleOutsideTheElasticRangeIsRefusedNamingReplicas) {
  int calls = 0;
  AdmissionReply reply =
      Answer(ScaleReview("UPDATE", 9, 4), LookupReturning(Job(ValidSpec()), &calls));
  ASSERT_EQ(reply.http_status, 200);
  EXPECT_FALSE(reply.allowed);
  json spec = ValidSpec();
  spec["replicas"] = 9;
  EXPECT_EQ(reply.body["response"]["status"]["message"], ValidateMessage(spec));
}

TEST(AdmissionTest, ScaleToZeroIsReadFromAnOmittedReplicas) {
  // autoscaling/v1 omits replicas 0; 0 is below every job's minimum.
  int calls = 0;
  json review = ScaleReview("UPDATE", 0, 4);
  review["request"]["object"]["spec"].erase("replicas");
  AdmissionReply reply = Answer(review, LookupReturning(Job(ValidSpec()), &calls));
  EXPECT_FALSE(reply.allowed);
}

TEST(AdmissionTest, ScaleToTheSameCountNeedsNoLookup) {
  EXPECT_TRUE(Answer(ScaleReview("UPDATE", 4, 4)).allowed);
}

TEST(AdmissionTest, FailedLookupFailsTheReviewSoTheFailurePolicyDecides) {
  AdmissionReply reply =
      Answer(ScaleReview("UPDATE", 6, 4), [](const std::string&, const std::string&) {
        return StatusOr<json>(UnavailableError("GET trainingjobs/fashion: connection refused"));
      });
  EXPECT_EQ(reply.http_status, 500);
  EXPECT_FALSE(reply.allowed);
  EXPECT_NE(reply.body.get<std::string>().find("connection refused"), std::string::npos);
}

TEST(AdmissionTest, MalformedReviewsAreBadRequestsNamingWhy) {
  EXPECT_EQ(ReviewTrainingJobAdmission("{", NoLookup()).http_status, 400);
  EXPECT_EQ(ReviewTrainingJobAdmission("[]", NoLookup()).http_status, 400);
  json wrong_version = Review("CREATE", Job(ValidSpec()), nullptr, "admission.k8s.io/v2");
  AdmissionReply reply = Answer(wrong_version);
  EXPECT_EQ(reply.http_status, 400);
  EXPECT_NE(reply.body.get<std::string>().find("admission.k8s.io/v2"), std::string::npos);
  json no_uid = Review("CREATE", Job(ValidSpec()));
  no_uid["request"].erase("uid");
  EXPECT_EQ(Answer(no_uid).http_status, 400);
}

TEST(AdmissionTest, FieldsOfTheWrongTypeAreBadRequestsNotCrashes) {
  for (const std::string& body :
       {std::string(R"({"apiVersion": 1, "request": {}})"),
        std::string(R"({"apiVersion": "admission.k8s.io/v1", "request": {"uid": "u",)"
                    R"( "operation": 7, "object": {"metadata": "x", "spec": []}}})"),
        std::string(R"({"apiVersion": "admission.k8s.io/v1", "request": {"uid": "u",)"
                    R"( "operation": "CREATE", "object": {"apiVersion": [], "spec": {}}}})")}) {
    SCOPED_TRACE(body);
    AdmissionReply reply = ReviewTrainingJobAdmission(body, NoLookup());
    EXPECT_EQ(reply.http_status, 400) << reply.body;
  }
}

TEST(AdmissionTest, ScaleWithoutTheJobsNameIsABadRequest) {
  json review = ScaleReview("UPDATE", 6, 4);
  review["request"].erase("name");
  review["request"]["object"]["metadata"].erase("name");
  EXPECT_EQ(Answer(review).http_status, 400);
}

}  // namespace
}  // namespace lockstep::op::trainingjob
