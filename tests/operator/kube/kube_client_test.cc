// KubeClient against a real kube-apiserver 1.20.2 + etcd (tests/support/kube): authentication,
// every verb, the error mapping of kube_client.h, paging, watches (order, stop, 410), the
// client-side rate limit and deadlines. Bookmarks are not tested here: kube-apiserver 1.20.2
// sent none in a 90 s watch with allowWatchBookmarks and a newer version to report (its watches
// carry no deadline, so the cacher never schedules one); the client parses them all the same.
#include "operator/kube/kube_client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/operator/kube/kube_server.h"

namespace lockstep::op::kube {
namespace {

using testing::kConfigMaps;
using testing::KubeServer;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(KubeClientTest, KubeconfigOfTheTestServerLoadsAndAuthenticates) {
  LOCKSTEP_REQUIRE_KUBE();
  StatusOr<KubeConfig> config = LoadKubeconfig(KubeServer::kube()->kubeconfig());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, KubeServer::kube()->server());
  EXPECT_FALSE(config->ca_pem.empty());
  EXPECT_EQ(config->token, KubeServer::kube()->token());
  auto client = KubeClient::Create(*config, {});
  ASSERT_TRUE(client.ok()) << client.status();
  // Listing namespaces needs an authenticated admin and nothing else from the fresh server.
  StatusOr<ListResult> namespaces = (*client)->List(testing::kNamespaces, "", {});
  ASSERT_TRUE(namespaces.ok()) << namespaces.status();
  EXPECT_FALSE(namespaces->resource_version.empty());
}

TEST(KubeClientTest, ConfigMapCreateGetUpdatePatchListDelete) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("crud");

  StatusOr<json> created =
      client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "settings", {{"a", "1"}}));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE((*created)["metadata"]["uid"].get<std::string>().empty());

  StatusOr<json> got = client->Get(kConfigMaps, ns, "settings");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)["data"]["a"], "1");

  json changed = *got;
  changed["data"]["a"] = "2";
  StatusOr<json> updated = client->Update(kConfigMaps, ns, changed);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ((*updated)["data"]["a"], "2");
  EXPECT_NE((*updated)["metadata"]["resourceVersion"], (*got)["metadata"]["resourceVersion"]);

  StatusOr<json> patched = client->Patch(kConfigMaps, ns, "settings", PatchType::kMerge,
                                         {{"data", {{"b", "3"}, {"a", nullptr}}}});
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ((*patched)["data"], json({{"b", "3"}}));

  StatusOr<json> strategic = client->Patch(kConfigMaps, ns, "settings", PatchType::kStrategicMerge,
                                           {{"metadata", {{"labels", {{"tier", "x"}}}}}});
  ASSERT_TRUE(strategic.ok()) << strategic.status();
  EXPECT_EQ((*strategic)["metadata"]["labels"]["tier"], "x");

  StatusOr<ListResult> list = client->List(kConfigMaps, ns, {});
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->items.size(), 1u);
  EXPECT_EQ(list->items[0]["kind"], "ConfigMap");  // filled in: lists omit it
  EXPECT_FALSE(list->resource_version.empty());

  ASSERT_TRUE(client->Delete(kConfigMaps, ns, "settings").ok());
  EXPECT_TRUE(IsNotFound(client->Get(kConfigMaps, ns, "settings").status()));
}

TEST(KubeClientTest, PodIsCreatedAndStaysPendingWithoutAKubelet) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("pods");
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", "worker-0"}, {"labels", {{"app", "lockstep"}}}}},
              {"spec", {{"containers", {{{"name", "worker"}, {"image", "busybox"}}}}}}};
  StatusOr<json> created = client->Create(resources::kPods, ns, pod);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ((*created)["status"]["phase"], "Pending");
  StatusOr<json> patched =
      client->Patch(resources::kPods, ns, "worker-0", PatchType::kStrategicMerge,
                    {{"metadata", {{"annotations", {{"lockstep.io/rank", "0"}}}}}});
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ((*patched)["metadata"]["annotations"]["lockstep.io/rank"], "0");
  // No kubelet confirms the deletion: grace period 0 removes the pod at once.
  DeleteOptions now;
  now.grace_period_seconds = 0;
  ASSERT_TRUE(client->Delete(resources::kPods, ns, "worker-0", now).ok());
  EXPECT_TRUE(IsNotFound(client->Get(resources::kPods, ns, "worker-0").status()));
}

TEST(KubeClientTest, ServerErrorsMapToTheirCodesWithTheServersMessage) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("errors");

  Status missing = client->Get(kConfigMaps, ns, "missing").status();
  EXPECT_TRUE(IsNotFound(missing)) << missing;
  EXPECT_NE(missing.message().find("GET /api/v1/namespaces/" + ns + "/configmaps/missing"),
            std::string::npos)
      << missing;
  EXPECT_NE(missing.message().find("configmaps \"missing\" not found"), std::string::npos)
      << missing;

  ASSERT_TRUE(client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "once")).ok());
  Status twice = client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "once")).status();
  EXPECT_TRUE(IsAlreadyExists(twice)) << twice;
  EXPECT_NE(twice.message().find("already exists"), std::string::npos) << twice;

  // Two writers from the same version: the second is stale.
  StatusOr<json> read = client->Get(kConfigMaps, ns, "once");
  ASSERT_TRUE(read.ok());
  json first = *read, second = *read;
  first["data"] = {{"writer", "first"}};
  second["data"] = {{"writer", "second"}};
  ASSERT_TRUE(client->Update(kConfigMaps, ns, first).ok());
  Status stale = client->Update(kConfigMaps, ns, second).status();
  EXPECT_TRUE(IsConflict(stale)) << stale;

  Status invalid =
      client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "Not_A_Valid_Name")).status();
  EXPECT_TRUE(IsInvalid(invalid)) << invalid;
  EXPECT_NE(invalid.message().find("metadata.name"), std::string::npos) << invalid;
}

TEST(KubeClientTest, WrongTokenIsUnauthenticated) {
  LOCKSTEP_REQUIRE_KUBE();
  KubeConfig config = KubeServer::Config();
  config.token = "not-the-token";
  auto client = KubeClient::Create(config, {});
  ASSERT_TRUE(client.ok());
  Status status = (*client)->List(testing::kNamespaces, "", {}).status();
  EXPECT_EQ(status.code(), StatusCode::kUnauthenticated) << status;
  EXPECT_EQ(status.message().find("not-the-token"), std::string::npos);  // never echo a token
}

// A service account the API server itself issues a token for (TokenRequest), bound to no role:
// authenticated, but RBAC allows it nothing.
TEST(KubeClientTest, UserWithoutRbacIsPermissionDenied) {
  LOCKSTEP_REQUIRE_KUBE();
  auto admin = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("rbac");
  json account = {
      {"apiVersion", "v1"}, {"kind", "ServiceAccount"}, {"metadata", {{"name", "nobody"}}}};
  ASSERT_TRUE(admin->Create(testing::kServiceAccounts, ns, account).ok());
  auto token = KubeServer::kube()->Request(
      "POST", "/api/v1/namespaces/" + ns + "/serviceaccounts/nobody/token",
      {{"apiVersion", "authentication.k8s.io/v1"},
       {"kind", "TokenRequest"},
       {"spec", json::object()}});
  ASSERT_EQ(token.status, 201) << token.raw;
  KubeConfig config = KubeServer::Config();
  config.token = token.body["status"]["token"];
  auto client = KubeClient::Create(config, {});
  ASSERT_TRUE(client.ok());
  Status status = (*client)->List(kConfigMaps, ns, {}).status();
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  EXPECT_NE(status.message().find("forbidden"), std::string::npos) << status;
}

TEST(KubeClientTest, JsonPatchWhoseTestFailsIsRefusedAndChangesNothing) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("jsonpatch");
  StatusOr<json> created =
      client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "cm", {{"k", "v"}}));
  ASSERT_TRUE(created.ok());
  const std::string version = (*created)["metadata"]["resourceVersion"];

  json guarded =
      json::array({{{"op", "test"}, {"path", "/metadata/resourceVersion"}, {"value", version}},
                   {{"op", "replace"}, {"path", "/data/k"}, {"value", "w"}}});
  StatusOr<json> applied = client->Patch(kConfigMaps, ns, "cm", PatchType::kJson, guarded);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ((*applied)["data"]["k"], "w");

  // The same guard again: the version moved on, so the test op fails. 1.20 answers 422 Invalid
  // with a generic message (no details), hence INVALID_ARGUMENT, not a conflict.
  StatusOr<json> refused = client->Patch(kConfigMaps, ns, "cm", PatchType::kJson, guarded);
  EXPECT_TRUE(IsInvalid(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("PATCH /api/v1/namespaces/" + ns + "/configmaps/cm"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ((*client->Get(kConfigMaps, ns, "cm"))["data"]["k"], "w");
}

TEST(KubeClientTest, TrainingJobStatusIsWrittenThroughTheStatusSubresource) {
  LOCKSTEP_REQUIRE_KUBE();
  ASSERT_EQ(KubeServer::InstallTrainingJobCrd(), "");
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("status");
  StatusOr<json> job =
      client->Create(resources::kTrainingJobs, ns, KubeServer::TrainingJob(ns, "fashion"));
  ASSERT_TRUE(job.ok()) << job.status();

  json with_status = *job;
  with_status["status"] = {{"phase", "Running"}, {"restarts", 1}};
  with_status["spec"]["replicas"] = 7;  // ignored by /status
  StatusOr<json> updated = client->Update(resources::kTrainingJobs, ns, with_status, "status");
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ((*updated)["status"]["phase"], "Running");
  EXPECT_EQ((*updated)["spec"]["replicas"], 2);

  StatusOr<json> patched = client->Patch(resources::kTrainingJobs, ns, "fashion", PatchType::kMerge,
                                         {{"status", {{"phase", "Succeeded"}}}}, "status");
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ((*patched)["status"]["phase"], "Succeeded");
  EXPECT_EQ((*patched)["status"]["restarts"], 1);

  StatusOr<json> read = client->Get(resources::kTrainingJobs, ns, "fashion", "status");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)["status"]["phase"], "Succeeded");

  Status bad_phase = client
                         ->Patch(resources::kTrainingJobs, ns, "fashion", PatchType::kMerge,
                                 {{"status", {{"phase", "Dancing"}}}}, "status")
                         .status();
  EXPECT_TRUE(IsInvalid(bad_phase)) << bad_phase;
  EXPECT_NE(bad_phase.message().find("status.phase"), std::string::npos) << bad_phase;
}

TEST(KubeClientTest, DeletePreconditionsAndPropagationPolicyReachTheServer) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("delete");
  ASSERT_TRUE(client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "cm")).ok());

  DeleteOptions other_incarnation;
  other_incarnation.precondition_uid = "00000000-0000-0000-0000-000000000000";
  Status refused = client->Delete(kConfigMaps, ns, "cm", other_incarnation);
  EXPECT_TRUE(IsConflict(refused)) << refused;
  EXPECT_NE(refused.message().find("the UID in the precondition"), std::string::npos) << refused;
  ASSERT_TRUE(client->Get(kConfigMaps, ns, "cm").ok());

  // Foreground: the server marks the object and leaves it to the garbage collector (which
  // does not run here), so the policy is visible on the object.
  DeleteOptions foreground;
  foreground.propagation_policy = "Foreground";
  foreground.precondition_uid = (*client->Get(kConfigMaps, ns, "cm"))["metadata"]["uid"];
  ASSERT_TRUE(client->Delete(kConfigMaps, ns, "cm", foreground).ok());
  StatusOr<json> marked = client->Get(kConfigMaps, ns, "cm");
  ASSERT_TRUE(marked.ok()) << marked.status();
  EXPECT_TRUE(marked->at("metadata").contains("deletionTimestamp"));
  EXPECT_EQ(marked->at("metadata")["finalizers"], json::array({"foregroundDeletion"}));
  // Acting as the garbage collector: dropping the finalizer completes the deletion.
  ASSERT_TRUE(client
                  ->Patch(kConfigMaps, ns, "cm", PatchType::kMerge,
                          {{"metadata", {{"finalizers", nullptr}}}})
                  .ok());
  EXPECT_TRUE(IsNotFound(client->Get(kConfigMaps, ns, "cm").status()));

  Status bad_policy =
      client->Delete(kConfigMaps, ns, "whatever", DeleteOptions{"Sideways", "", "", {}});
  EXPECT_FALSE(bad_policy.ok());
}

TEST(KubeClientTest, PagedListFollowsContinueToTheEnd) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("paging");
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(
        client
            ->Create(kConfigMaps, ns,
                     KubeServer::ConfigMap(ns, "cm-" + std::to_string(i), {}, {{"set", "paged"}}))
            .ok());
  }
  ListOptions options;
  options.limit = 2;
  options.label_selector = "set=paged";
  const int64_t before = client->requests_sent();
  StatusOr<ListResult> list = client->List(kConfigMaps, ns, options);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->items.size(), 7u);
  EXPECT_EQ(client->requests_sent() - before, 4);  // 2 + 2 + 2 + 1

  int pages = 0;
  size_t seen = 0;
  options.on_page = [&](std::vector<json>& page) {
    ++pages;
    seen += page.size();
  };
  StatusOr<ListResult> streamed = client->List(kConfigMaps, ns, options);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(pages, 4);
  EXPECT_EQ(seen, 7u);
  EXPECT_TRUE(streamed->items.empty());
}

TEST(KubeClientTest, WatchSeesAddModifyDeleteInOrder) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("watch");
  StatusOr<ListResult> list = client->List(kConfigMaps, ns, {});
  ASSERT_TRUE(list.ok());

  std::mutex mutex;
  std::vector<std::pair<WatchEventType, std::string>> events;
  std::atomic<bool> stop{false};
  Status watched;
  std::thread watcher([&] {
    WatchOptions options;
    options.resource_version = list->resource_version;
    options.timeout_seconds = 60;
    watched = client->Watch(
        kConfigMaps, ns, options,
        [&](const WatchEvent& event) {
          if (event.type == WatchEventType::kBookmark) return true;
          std::lock_guard<std::mutex> lock(mutex);
          events.emplace_back(event.type, event.object["data"].value("v", ""));
          return event.type != WatchEventType::kDeleted;
        },
        &stop);
  });
  ASSERT_TRUE(client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "w", {{"v", "1"}})).ok());
  ASSERT_TRUE(
      client->Patch(kConfigMaps, ns, "w", PatchType::kMerge, {{"data", {{"v", "2"}}}}).ok());
  ASSERT_TRUE(client->Delete(kConfigMaps, ns, "w").ok());
  const bool done = lockstep::testing::KubeTestEnv::WaitFor(
      [&] {
        std::lock_guard<std::mutex> lock(mutex);
        return events.size() >= 3;
      },
      10000);
  stop = true;
  watcher.join();
  ASSERT_TRUE(done);
  EXPECT_TRUE(watched.ok()) << watched;  // on_event returned false after DELETED
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0], std::make_pair(WatchEventType::kAdded, std::string("1")));
  EXPECT_EQ(events[1], std::make_pair(WatchEventType::kModified, std::string("2")));
  EXPECT_EQ(events[2].first, WatchEventType::kDeleted);
}

// A version older than the watch cache's window is answered with 410 Expired: the cache of a
// custom resource starts when its CRD is installed, long after resourceVersion 1.
TEST(KubeClientTest, WatchFromAVersionTooOldIsOutOfRange) {
  LOCKSTEP_REQUIRE_KUBE();
  ASSERT_EQ(KubeServer::InstallTrainingJobCrd(), "");
  auto client = KubeServer::AdminClient();
  WatchOptions options;
  options.resource_version = "1";
  options.timeout_seconds = 10;
  int events = 0;
  Status status = client->Watch(resources::kTrainingJobs, "", options, [&](const WatchEvent&) {
    ++events;
    return true;
  });
  EXPECT_TRUE(IsGone(status)) << status;
  EXPECT_NE(status.message().find("too old resource version"), std::string::npos) << status;
  EXPECT_EQ(events, 0);
}

TEST(KubeClientTest, WatchReturnsCancelledSoonAfterStop) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("stop");
  std::atomic<bool> stop{false};
  std::atomic<bool> returned{false};
  std::atomic<int> seen{0};
  Status status;
  std::thread watcher([&] {
    WatchOptions options;
    options.timeout_seconds = 300;
    status = client->Watch(
        kConfigMaps, ns, options,
        [&](const WatchEvent&) {
          ++seen;
          return true;
        },
        &stop);
    returned = true;
  });
  // The watch is established (it delivered an event) and idle before it is asked to stop.
  ASSERT_TRUE(client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "seen")).ok());
  const bool delivered =
      lockstep::testing::KubeTestEnv::WaitFor([&] { return seen.load() > 0; }, 30000);
  if (!delivered || returned.load()) {
    stop = true;
    watcher.join();
    FAIL() << "the watch delivered " << seen.load() << " events and "
           << (returned.load() ? "returned: " + status.ToString() : "is still open");
  }
  const auto stopped_at = Clock::now();
  stop = true;
  watcher.join();
  EXPECT_LT(SecondsSince(stopped_at), 2.0);
  EXPECT_EQ(status.code(), StatusCode::kCancelled) << status;
}

TEST(KubeClientTest, RateLimiterSpacesRequestsAtQps) {
  LOCKSTEP_REQUIRE_KUBE();
  ClientOptions options;
  options.qps = 10;
  options.burst = 1;
  auto client = KubeServer::AdminClient(options);
  const auto start = Clock::now();
  ListOptions one_response;
  one_response.limit = 0;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(client->List(testing::kNamespaces, "", one_response).ok());
  }
  // One token at once, then one every 100 ms: 19 waits.
  EXPECT_GE(SecondsSince(start), 1.85);
}

TEST(KubeClientTest, RequestsEndAtTheirDeadline) {
  LOCKSTEP_REQUIRE_KUBE();
  ClientOptions options;
  options.request_timeout_ms = 1;
  auto client = KubeServer::AdminClient(options);
  Status status = client->List(kConfigMaps, "", {}).status();
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status;
}

TEST(KubeClientTest, RetryOnConflictRereadsAndSucceeds) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("retry");
  ASSERT_TRUE(client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "c", {{"n", "0"}})).ok());
  int attempts = 0;
  Status status = RetryOnConflict([&]() -> Status {
    ++attempts;
    LOCKSTEP_ASSIGN_OR_RETURN(json current, client->Get(kConfigMaps, ns, "c"));
    if (attempts == 1) {  // another writer slips in between our read and our write
      LOCKSTEP_RETURN_IF_ERROR(
          client->Patch(kConfigMaps, ns, "c", PatchType::kMerge, {{"data", {{"other", "x"}}}})
              .status());
    }
    current["data"]["n"] = "1";
    return client->Update(kConfigMaps, ns, current).status();
  });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(attempts, 2);
  json final = *client->Get(kConfigMaps, ns, "c");
  EXPECT_EQ(final["data"]["n"], "1");
  EXPECT_EQ(final["data"]["other"], "x");
}

// TLS: an unusable PEM is refused up front; a CA that did not sign the server's certificate
// fails the handshake (verification is on); skipping verification explicitly still works.
TEST(KubeClientTest, TlsVerifiesTheServerAgainstTheConfiguredCa) {
  LOCKSTEP_REQUIRE_KUBE();
  KubeConfig config = KubeServer::Config();
  config.ca_pem = "-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n";
  EXPECT_TRUE(IsInvalid(KubeClient::Create(config, {}).status()));

  const std::string dir = KubeServer::kube()->dir() + "/other-ca";
  std::filesystem::create_directories(dir);
  const std::string command =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=other "
      "-keyout " +
      dir + "/ca.key -out " + dir + "/ca.crt 2>/dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0);
  std::ifstream in(dir + "/ca.crt");
  config.ca_pem.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  ClientOptions options;
  options.request_timeout_ms = 5000;
  auto untrusted = KubeClient::Create(config, options);
  ASSERT_TRUE(untrusted.ok()) << untrusted.status();
  Status refused = (*untrusted)->List(testing::kNamespaces, "", {}).status();
  EXPECT_FALSE(refused.ok());
  // The handshake fails (retried as UNAVAILABLE) until the deadline.
  EXPECT_TRUE(refused.code() == StatusCode::kUnavailable ||
              refused.code() == StatusCode::kDeadlineExceeded)
      << refused;

  config.ca_pem.clear();
  config.insecure_skip_tls_verify = true;
  auto insecure = KubeClient::Create(config, {});
  ASSERT_TRUE(insecure.ok());
  EXPECT_TRUE((*insecure)->List(testing::kNamespaces, "", {}).ok());
}

}  // namespace
}  // namespace lockstep::op::kube

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new lockstep::op::testing::KubeServer);
  return RUN_ALL_TESTS();
}
