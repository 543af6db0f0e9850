// Informer: a list+watch mirror of one resource kind, with an indexed in-memory cache and change
// handlers; what client-go's shared informer is, for the operator.
//
//   Informer pods(client, {.resource = resources::kPods,
//                          .label_selector = "lockstep.io/job-name",  // only our pods
//                          .transform = TrimPod});                    // keep what we read
//   pods.AddIndex("job", [](const json& pod) { return std::vector<std::string>{JobKeyOf(pod)}; });
//   pods.AddHandler([&](const json* old_pod, const json* new_pod) { queue.Add(JobKeyOf(...)); });
//   pods.Start();
//   if (!pods.WaitForSync(60000)) ...;
//   for (const auto& pod : pods.ByIndex("job", "default/fashion")) ...
//
// Protocol: List (paged) at the most recent resourceVersion, replace the cache (handlers see
// adds, updates and deletes for the difference), then Watch from the list's resourceVersion with
// bookmarks; every event and bookmark advances the resourceVersion. When the watch closes it is
// reopened from the last resourceVersion; when the server answers 410 Gone (OUT_OF_RANGE) the
// informer relists. Other errors are retried with back-off (capped at 30 s), never given up on.
//
// Keys are "namespace/name" ("name" for cluster-scoped objects). The cache holds each object as
// MessagePack bytes, not as an nlohmann tree: a tree costs about 100 bytes per value (a std::map
// node, its key and the value), its packed form 5 to 10 times less, which is most of what the
// operator holds at 1,000 jobs (docs/benchmarks.md). Get/List/ByIndex unpack on every call (a
// few microseconds for a trimmed pod, tens for a job) and return an object the caller owns;
// Keys and CountByIndex unpack nothing.
//
// Thread safety: Get/List/ByIndex from any thread. Handlers run on the informer's own thread, in
// event order, and must not block (enqueue a key and return). AddIndex/AddHandler before Start.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "operator/kube/kube_client.h"

namespace lockstep::op::controller {

using json = nlohmann::json;
using ObjectPtr = std::shared_ptr<const json>;

// "namespace/name" of an object (metadata), or "name" when it has no namespace.
std::string ObjectKey(const json& object);

struct InformerOptions {
  kube::Resource resource;
  std::string ns;  // "" : every namespace
  std::string label_selector{};
  std::string field_selector{};
  // Applied to every object before it is cached and before handlers see it: drop what the
  // operator never reads (managedFields, most of a pod's spec) so 1,000 jobs fit in a few MB.
  std::function<json(json)> transform{};
  int64_t watch_timeout_seconds = 300;
  int64_t list_page_size = 500;
};

class Informer {
 public:
  // on add: (nullptr, new); on update: (old, new); on delete: (old, nullptr).
  using Handler = std::function<void(const json* old_object, const json* new_object)>;
  using IndexFunc = std::function<std::vector<std::string>(const json& object)>;

  Informer(kube::KubeClient* client, InformerOptions options);
  ~Informer();  // Stop()
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void AddIndex(const std::string& name, IndexFunc index);
  void AddHandler(Handler handler);

  void Start();
  // Stops the watch (within about 1 s) and joins the thread. Idempotent.
  void Stop();
  // True once the first list has been applied; false if timeout_ms passes first.
  bool WaitForSync(int64_t timeout_ms) const;
  bool HasSynced() const;

  ObjectPtr Get(const std::string& key) const;  // nullptr when absent
  std::vector<ObjectPtr> List() const;
  std::vector<ObjectPtr> ByIndex(const std::string& index, const std::string& value) const;
  std::vector<std::string> Keys() const;
  // Index value -> number of cached objects with that value.
  std::map<std::string, size_t> CountByIndex(const std::string& index) const;
  size_t Size() const;

  std::string resource_version() const;
  int64_t relists() const { return relists_.load(); }  // lists after the first (410s, errors)

 private:
  void Run();
  Status ListAndReplace();
  Status WatchFromLast();
  // An object's MessagePack bytes, shared by the cache and readers unpacking them.
  using Packed = std::shared_ptr<const std::vector<std::uint8_t>>;
  // One cached object.
  struct Entry {
    Packed packed;
    std::string resource_version;
    // Its value in each index (in index_funcs_ order), so that removing it from the indices
    // needs no unpacking.
    std::vector<std::vector<std::string>> index_values;
  };
  Entry Pack(const json& object) const;
  static ObjectPtr Unpack(const Packed& packed);
  // Applies a watch event: `object` is the new object (nullptr: deleted, then `deleted` is the
  // last state the server sent).
  void Apply(const std::string& key, const json* object, const json* deleted);
  void IndexLocked(const std::string& key, const Entry* old_entry, const Entry* new_entry);

  kube::KubeClient* client_;
  InformerOptions options_;
  std::map<std::string, IndexFunc> index_funcs_;
  std::vector<Handler> handlers_;

  mutable std::mutex mutex_;
  // Wakes WaitForSync when the first list lands and the back-off sleep when Stop is called.
  mutable std::condition_variable cv_;
  std::unordered_map<std::string, Entry> objects_;
  // index name -> value -> keys
  std::map<std::string, std::unordered_map<std::string, std::set<std::string>>> indices_;
  std::string resource_version_;
  std::atomic<bool> synced_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> relists_{0};
  std::thread thread_;
};

}  // namespace lockstep::op::controller
