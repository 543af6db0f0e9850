// Informer against a real kube-apiserver: the first list, handlers for adds/updates/deletes,
// indices, the transform, watch reopening without duplicate adds, and a relist after a real
// 410 that brings the cache back to the server's state.
#include "operator/controller/informer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "tests/operator/kube/kube_server.h"

namespace lockstep::op::controller {
namespace {

using lockstep::testing::KubeTestEnv;
using op::testing::kConfigMaps;
using op::testing::KubeServer;

struct HandlerCall {
  std::string kind;  // add | update | delete
  std::string key;
  std::string old_value;  // data.v (configmaps) or spec.image (jobs)
  std::string new_value;
};

// Collects handler calls; tests wait on it with a bound.
class Recorder {
 public:
  Informer::Handler Handler(const std::string& field_path) {
    return [this, field_path](const json* old_object, const json* new_object) {
      auto value = [&](const json* object) -> std::string {
        if (object == nullptr) return "";
        const json pointer = object->value(json::json_pointer(field_path), json());
        return pointer.is_string() ? pointer.get<std::string>() : "";
      };
      HandlerCall call{old_object == nullptr   ? "add"
                       : new_object == nullptr ? "delete"
                                               : "update",
                       ObjectKey(new_object != nullptr ? *new_object : *old_object),
                       value(old_object), value(new_object)};
      std::lock_guard<std::mutex> lock(mutex_);
      calls_.push_back(call);
    };
  }
  std::vector<HandlerCall> Calls() {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_;
  }
  int Count(const std::string& kind, const std::string& key) {
    int n = 0;
    for (const HandlerCall& call : Calls()) n += call.kind == kind && call.key == key;
    return n;
  }
  bool WaitFor(const std::string& kind, const std::string& key, int count = 1) {
    return KubeTestEnv::WaitFor([&] { return Count(kind, key) >= count; }, 10000);
  }

 private:
  std::mutex mutex_;
  std::vector<HandlerCall> calls_;
};

TEST(InformerTest, SyncsThenReportsAddsUpdatesAndDeletes) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("informer");
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_TRUE(
        client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, name, {{"v", "1"}})).ok());
  }
  Recorder recorder;
  Informer informer(client.get(), {.resource = kConfigMaps, .ns = ns, .list_page_size = 2});
  informer.AddHandler(recorder.Handler("/data/v"));
  EXPECT_FALSE(informer.HasSynced());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(10000));
  EXPECT_EQ(informer.Size(), 3u);
  EXPECT_EQ(recorder.Calls().size(), 3u);  // synced: the handlers have seen the list
  for (const char* name : {"a", "b", "c"}) EXPECT_EQ(recorder.Count("add", ns + "/" + name), 1);
  EXPECT_FALSE(informer.resource_version().empty());

  ASSERT_TRUE(client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "d", {{"v", "1"}})).ok());
  ASSERT_TRUE(
      client->Patch(kConfigMaps, ns, "a", kube::PatchType::kMerge, {{"data", {{"v", "2"}}}}).ok());
  ASSERT_TRUE(client->Delete(kConfigMaps, ns, "b").ok());
  ASSERT_TRUE(recorder.WaitFor("add", ns + "/d"));
  ASSERT_TRUE(recorder.WaitFor("update", ns + "/a"));
  ASSERT_TRUE(recorder.WaitFor("delete", ns + "/b"));
  for (const HandlerCall& call : recorder.Calls()) {
    if (call.kind == "update") {
      EXPECT_EQ(call.old_value + "->" + call.new_value, "1->2");
    }
    if (call.kind == "delete") {
      EXPECT_EQ(call.old_value, "1");
    }
  }
  ObjectPtr a = informer.Get(ns + "/a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ((*a)["data"]["v"], "2");
  // The cache keeps objects packed; what it gives back is what the server holds, value for value.
  StatusOr<json> served = client->Get(kConfigMaps, ns, "a");
  ASSERT_TRUE(served.ok());
  EXPECT_EQ(*a, *served);
  EXPECT_EQ(informer.Get(ns + "/b"), nullptr);
  EXPECT_EQ(informer.List().size(), 3u);
  informer.Stop();
}

TEST(InformerTest, TransformAppliesBeforeCachingAndIndicesFollowChanges) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("index");
  ASSERT_TRUE(
      client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "x1", {}, {{"job", "x"}})).ok());
  ASSERT_TRUE(
      client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "y1", {}, {{"job", "y"}})).ok());
  ASSERT_TRUE(client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "nolabel")).ok());

  InformerOptions options{.resource = kConfigMaps, .ns = ns, .label_selector = "job"};
  options.transform = [](json object) {
    object["metadata"].erase("managedFields");
    object["metadata"]["annotations"]["trimmed"] = "yes";
    return object;
  };
  Informer informer(client.get(), options);
  std::mutex mutex;
  std::vector<std::string> handler_trimmed;
  informer.AddHandler([&](const json*, const json* new_object) {
    if (new_object == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex);
    handler_trimmed.push_back((*new_object)["metadata"]["annotations"].value("trimmed", ""));
  });
  informer.AddIndex("job", [](const json& object) {
    const json& labels = object["metadata"].value("labels", json::object());
    return labels.contains("job") ? std::vector<std::string>{labels["job"].get<std::string>()}
                                  : std::vector<std::string>{};
  });
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(10000));
  EXPECT_EQ(informer.Size(), 2u);  // the label selector reached the server
  ASSERT_EQ(informer.ByIndex("job", "x").size(), 1u);
  ObjectPtr x1 = informer.ByIndex("job", "x")[0];
  EXPECT_FALSE((*x1)["metadata"].contains("managedFields"));
  EXPECT_EQ((*x1)["metadata"]["annotations"]["trimmed"], "yes");

  // Relabel y1 to x: the index follows; a new object arrives transformed through the watch.
  ASSERT_TRUE(client
                  ->Patch(kConfigMaps, ns, "y1", kube::PatchType::kMerge,
                          {{"metadata", {{"labels", {{"job", "x"}}}}}})
                  .ok());
  ASSERT_TRUE(
      client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "x2", {}, {{"job", "x"}})).ok());
  ASSERT_TRUE(
      KubeTestEnv::WaitFor([&] { return informer.ByIndex("job", "x").size() == 3; }, 10000));
  EXPECT_TRUE(informer.ByIndex("job", "y").empty());
  ObjectPtr x2 = informer.Get(ns + "/x2");
  ASSERT_NE(x2, nullptr);
  EXPECT_FALSE((*x2)["metadata"].contains("managedFields"));
  std::vector<std::string> keys = informer.Keys();
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{ns + "/x1", ns + "/x2", ns + "/y1"}));
  EXPECT_EQ(informer.CountByIndex("job"), (std::map<std::string, size_t>{{"x", 3}}));
  // A delete leaves the index too.
  ASSERT_TRUE(client->Delete(kConfigMaps, ns, "x1").ok());
  ASSERT_TRUE(
      KubeTestEnv::WaitFor([&] { return informer.ByIndex("job", "x").size() == 2; }, 10000));
  EXPECT_EQ(informer.CountByIndex("job"), (std::map<std::string, size_t>{{"x", 2}}));
  std::lock_guard<std::mutex> lock(mutex);
  for (const std::string& trimmed : handler_trimmed) EXPECT_EQ(trimmed, "yes");
  EXPECT_EQ(handler_trimmed.size(), 4u);  // 2 adds, 1 update, 1 add (the delete has no new)
}

TEST(InformerTest, ReopensClosedWatchesWithoutDuplicateAdds) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("reopen");
  ASSERT_TRUE(client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "first")).ok());
  Recorder recorder;
  Informer informer(client.get(), {.resource = kConfigMaps, .ns = ns, .watch_timeout_seconds = 2});
  informer.AddHandler(recorder.Handler("/data/v"));
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(10000));
  const int64_t requests_after_sync = client->requests_sent();
  // The server ends each watch after 2 s; wait until the informer has reopened it twice.
  ASSERT_TRUE(KubeTestEnv::WaitFor(
      [&] { return client->requests_sent() >= requests_after_sync + 2; }, 15000));
  ASSERT_TRUE(client->Create(kConfigMaps, ns, KubeServer::ConfigMap(ns, "second")).ok());
  ASSERT_TRUE(recorder.WaitFor("add", ns + "/second"));
  ASSERT_TRUE(KubeTestEnv::WaitFor(
      [&] { return client->requests_sent() >= requests_after_sync + 3; }, 15000));
  EXPECT_EQ(recorder.Count("add", ns + "/first"), 1);
  EXPECT_EQ(recorder.Count("add", ns + "/second"), 1);
  EXPECT_EQ(recorder.Calls().size(), 2u);
  EXPECT_EQ(informer.relists(), 0);
  informer.Stop();
}

// Passes everything to the real client, except that it can cut the informer off (drop events
// and hold watches open requests, as a partitioned network would) and then have it come back
// from resourceVersion "1", which the server's watch cache answers with a real 410 Expired.
class PartitionedClient : public kube::KubeClient {
 public:
  explicit PartitionedClient(kube::KubeClient* real) : real_(real) {}

  void Partition() {
    std::lock_guard<std::mutex> lock(mutex_);
    partitioned_ = true;
  }
  void HealFromAVersionTooOld() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      partitioned_ = false;
      stale_next_watch_ = true;
    }
    changed_.notify_all();
  }
  int held_watches() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_watches_;
  }

  StatusOr<json> Get(const kube::Resource& r, const std::string& ns, const std::string& name,
                     const std::string& sub) override {
    return real_->Get(r, ns, name, sub);
  }
  StatusOr<kube::ListResult> List(const kube::Resource& r, const std::string& ns,
                                  const kube::ListOptions& options) override {
    return real_->List(r, ns, options);
  }
  Status Watch(const kube::Resource& r, const std::string& ns, const kube::WatchOptions& options,
               const std::function<bool(const kube::WatchEvent&)>& on_event,
               const std::atomic<bool>* stop) override {
    kube::WatchOptions sent = options;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (partitioned_) {
        ++held_watches_;
        while (partitioned_ && !(stop && stop->load())) {
          changed_.wait_for(lock, std::chrono::milliseconds(100));
        }
        if (stop && stop->load()) return CancelledError("stopped");
      }
      if (stale_next_watch_) {
        sent.resource_version = "1";
        stale_next_watch_ = false;
      }
    }
    return real_->Watch(
        r, ns, sent,
        [&](const kube::WatchEvent& event) {
          std::lock_guard<std::mutex> lock(mutex_);
          return partitioned_ ? false : on_event(event);  // lost with the connection
        },
        stop);
  }
  StatusOr<json> Create(const kube::Resource& r, const std::string& ns,
                        const json& object) override {
    return real_->Create(r, ns, object);
  }
  StatusOr<json> Update(const kube::Resource& r, const std::string& ns, const json& object,
                        const std::string& sub) override {
    return real_->Update(r, ns, object, sub);
  }
  StatusOr<json> Patch(const kube::Resource& r, const std::string& ns, const std::string& name,
                       kube::PatchType type, const json& patch, const std::string& sub) override {
    return real_->Patch(r, ns, name, type, patch, sub);
  }
  Status Delete(const kube::Resource& r, const std::string& ns, const std::string& name,
                const kube::DeleteOptions& options) override {
    return real_->Delete(r, ns, name, options);
  }
  int64_t requests_sent() const override { return real_->requests_sent(); }

 private:
  kube::KubeClient* real_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool partitioned_ = false;
  bool stale_next_watch_ = false;
  int held_watches_ = 0;
};

TEST(InformerTest, RelistsAfterGoneAndConvergesToTheServersState) {
  LOCKSTEP_REQUIRE_KUBE();
  ASSERT_EQ(KubeServer::InstallTrainingJobCrd(), "");
  auto real = KubeServer::AdminClient();
  PartitionedClient client(real.get());
  const std::string ns = KubeServer::NewNamespace("relist");
  const auto& jobs = kube::resources::kTrainingJobs;
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_TRUE(client.Create(jobs, ns, KubeServer::TrainingJob(ns, name)).ok());
  }
  Recorder recorder;
  Informer informer(&client, {.resource = jobs, .ns = ns});
  informer.AddHandler(recorder.Handler("/spec/image"));
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(10000));
  ASSERT_EQ(informer.Size(), 3u);

  client.Partition();
  ASSERT_TRUE(client.Delete(jobs, ns, "a", {}).ok());
  // The informer lost the event with its connection and is waiting to reconnect.
  ASSERT_TRUE(KubeTestEnv::WaitFor([&] { return client.held_watches() >= 1; }, 10000));
  ASSERT_TRUE(client.Delete(jobs, ns, "b", {}).ok());
  ASSERT_TRUE(client
                  .Patch(jobs, ns, "c", kube::PatchType::kMerge,
                         {{"spec", {{"image", "registry.example/worker:2"}}}}, "")
                  .ok());
  ASSERT_TRUE(client.Create(jobs, ns, KubeServer::TrainingJob(ns, "d")).ok());
  EXPECT_EQ(recorder.Calls().size(), 3u);  // nothing seen while partitioned
  client.HealFromAVersionTooOld();

  ASSERT_TRUE(recorder.WaitFor("delete", ns + "/a"));
  ASSERT_TRUE(recorder.WaitFor("delete", ns + "/b"));
  ASSERT_TRUE(recorder.WaitFor("update", ns + "/c"));
  ASSERT_TRUE(recorder.WaitFor("add", ns + "/d"));
  EXPECT_GE(informer.relists(), 1);
  for (const HandlerCall& call : recorder.Calls()) {
    if (call.kind == "update") {
      EXPECT_EQ(call.new_value, "registry.example/worker:2");
    }
  }
  StatusOr<kube::ListResult> server = real->List(jobs, ns, {});
  ASSERT_TRUE(server.ok());
  std::set<std::string> server_keys, cached_keys;
  for (const json& item : server->items) server_keys.insert(ObjectKey(item));
  for (const ObjectPtr& object : informer.List()) cached_keys.insert(ObjectKey(*object));
  EXPECT_EQ(cached_keys, server_keys);
  EXPECT_EQ(cached_keys, (std::set<std::string>{ns + "/c", ns + "/d"}));
  informer.Stop();
}

TEST(InformerTest, StopEndsTheWatchPromptly) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("stop");
  Informer informer(client.get(), {.resource = kConfigMaps, .ns = ns});
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(10000));
  const auto start = std::chrono::steady_clock::now();
  informer.Stop();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
  informer.Stop();  // idempotent
}

}  // namespace
}  // namespace lockstep::op::controller
