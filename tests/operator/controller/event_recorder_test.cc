// EventRecorder against a real kube-apiserver: the Event's fields, and repeats folded into one
// Event's count.
#include "operator/controller/event_recorder.h"

#include <gtest/gtest.h>

#include "tests/operator/kube/kube_server.h"

namespace lockstep::op::controller {
namespace {

using op::testing::kConfigMaps;
using op::testing::KubeServer;
using json = nlohmann::json;

std::vector<json> EventsAbout(kube::KubeClient& client, const std::string& ns,
                              const std::string& name) {
  kube::ListOptions options;
  options.field_selector = "involvedObject.name=" + name;
  StatusOr<kube::ListResult> list = client.List(kube::resources::kEvents, ns, options);
  EXPECT_TRUE(list.ok()) << list.status();
  return list.ok() ? list->items : std::vector<json>{};
}

TEST(EventRecorderTest, RecordedEventCarriesTheObjectReasonMessageAndSource) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("events");
  StatusOr<json> object = client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "job"));
  ASSERT_TRUE(object.ok());
  EventRecorder recorder(client.get(), "lockstep-operator");
  recorder.Record(*object, EventType::kWarning, "FailedCreatePod",
                  "creating pod job-worker-2: quota exceeded");
  ASSERT_TRUE(recorder.Flush(10000));

  std::vector<json> events = EventsAbout(*client, ns, "job");
  ASSERT_EQ(events.size(), 1u);
  const json& event = events[0];
  EXPECT_EQ(event["type"], "Warning");
  EXPECT_EQ(event["reason"], "FailedCreatePod");
  EXPECT_EQ(event["message"], "creating pod job-worker-2: quota exceeded");
  EXPECT_EQ(event["source"]["component"], "lockstep-operator");
  EXPECT_EQ(event["reportingComponent"], "lockstep-operator");
  EXPECT_EQ(event["count"], 1);
  EXPECT_EQ(event["involvedObject"]["kind"], "ConfigMap");
  EXPECT_EQ(event["involvedObject"]["apiVersion"], "v1");
  EXPECT_EQ(event["involvedObject"]["namespace"], ns);
  EXPECT_EQ(event["involvedObject"]["uid"], (*object)["metadata"]["uid"]);
  EXPECT_FALSE(event["firstTimestamp"].get<std::string>().empty());
  EXPECT_EQ(event["firstTimestamp"], event["lastTimestamp"]);
  EXPECT_EQ(recorder.dropped(), 0);
}

TEST(EventRecorderTest, RepeatsUpdateOneEventsCount) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("repeats");
  StatusOr<json> object = client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "job"));
  ASSERT_TRUE(object.ok());
  EventRecorder recorder(client.get(), "lockstep-operator");
  for (int i = 0; i < 5; ++i) {
    recorder.Record(*object, EventType::kNormal, "Restarting", "worker 1 exited with code 137");
  }
  recorder.Record(*object, EventType::kNormal, "Restarting", "worker 2 exited with code 1");
  ASSERT_TRUE(recorder.Flush(10000));

  std::vector<json> events = EventsAbout(*client, ns, "job");
  ASSERT_EQ(events.size(), 2u);
  std::map<std::string, int> counts;
  for (const json& event : events) counts[event["message"]] = event["count"];
  EXPECT_EQ(counts["worker 1 exited with code 137"], 5);
  EXPECT_EQ(counts["worker 2 exited with code 1"], 1);
}

}  // namespace
}  // namespace lockstep::op::controller
