// What a user reads when the API server refuses a request: the Status object's message, its
// field causes and reason, or a proxy's page quoted; and the code the operator decides on.
#include "operator/kube/api_status.h"

#include <gtest/gtest.h>

#include <string>

namespace lockstep::op::kube {
namespace {

using json = nlohmann::json;

TEST(ApiStatusTest, AnInvalidObjectNamesEachFieldCauseTheMessageLacks) {
  const json body = {
      {"kind", "Status"},
      {"reason", "Invalid"},
      {"message", "TrainingJob.lockstep.io \"a\" is invalid"},
      {"details",
       {{"causes",
         {{{"field", "spec.replicas"}, {"message", "must be at least 1"}},
          {{"field", "spec.image"}, {"message", "TrainingJob.lockstep.io \"a\" is invalid"}}}}}}};
  const Status status = StatusFromKubeStatus(422, body, body.dump(), "PUT /apis/x");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "PUT /apis/x: TrainingJob.lockstep.io \"a\" is invalid; spec.replicas: must be at "
            "least 1 (Invalid) [HTTP 422]");
}

TEST(ApiStatusTest, TheReasonDecidesBeforeTheHttpStatus) {
  EXPECT_EQ(CodeForApiStatus(409, "AlreadyExists"), StatusCode::kAlreadyExists);
  EXPECT_EQ(CodeForApiStatus(409, "Conflict"), StatusCode::kAborted);
  EXPECT_EQ(CodeForApiStatus(410, "Expired"), StatusCode::kOutOfRange);
  EXPECT_EQ(CodeForApiStatus(500, "Gone"), StatusCode::kOutOfRange);
  EXPECT_EQ(CodeForApiStatus(403, ""), StatusCode::kPermissionDenied);
  EXPECT_EQ(CodeForApiStatus(404, ""), StatusCode::kNotFound);
  EXPECT_EQ(CodeForApiStatus(429, ""), StatusCode::kResourceExhausted);
  EXPECT_EQ(CodeForApiStatus(503, ""), StatusCode::kUnavailable);
  EXPECT_EQ(CodeForApiStatus(302, ""), StatusCode::kUnknown);
}

TEST(ApiStatusTest, ABodyThatIsNoStatusIsQuotedShortened) {
  const std::string page = "<html>" + std::string(400, 'x') + "</html>";
  const Status status = StatusFromKubeStatus(502, json(), page, "GET /api/v1/pods");
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(status.message(), "GET /api/v1/pods: " + page.substr(0, 300) + "... [HTTP 502]");
  EXPECT_EQ(StatusFromKubeStatus(401, json(), "", "GET /api").message(),
            "GET /api: HTTP 401 [HTTP 401]");
}

}  // namespace
}  // namespace lockstep::op::kube
