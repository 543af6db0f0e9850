#include "operator/controller/informer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <tuple>

#include "common/deadline.h"
#include "common/logging.h"

namespace lockstep::op::controller {
namespace {

constexpr int64_t kFirstBackoffMs = 500;
constexpr int64_t kMaxBackoffMs = 30000;
// A watch the server ends this quickly without sending anything is treated like an error, so a
// misbehaving server cannot make the informer spin.
constexpr double kShortestHealthyWatchSeconds = 1.0;

std::string ResourceVersionOf(const json& object) {
  if (!object.is_object()) return "";
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return "";
  return metadata->value("resourceVersion", "");
}

}  // namespace

std::string ObjectKey(const json& object) {
  if (!object.is_object()) return "";
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return "";
  const std::string ns = metadata->value("namespace", "");
  const std::string name = metadata->value("name", "");
  return ns.empty() ? name : ns + "/" + name;
}

Informer::Informer(kube::KubeClient* client, InformerOptions options)
    : client_(client), options_(std::move(options)) {}

Informer::~Informer() { Stop(); }

void Informer::AddIndex(const std::string& name, IndexFunc index) {
  std::lock_guard<std::mutex> lock(mutex_);
  index_funcs_[name] = std::move(index);
  indices_[name];
}

void Informer::AddHandler(Handler handler) { handlers_.push_back(std::move(handler)); }

void Informer::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
}

void Informer::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Informer::WaitForSync(int64_t timeout_ms) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0)),
                      [this] { return synced_.load(); });
}

bool Informer::HasSynced() const { return synced_.load(); }

Informer::Entry Informer::Pack(const json& object) const {
  Entry entry;
  std::vector<std::uint8_t> packed = json::to_msgpack(object);
  packed.shrink_to_fit();  // the encoder grows its buffer by doubling
  entry.packed = std::make_shared<const std::vector<std::uint8_t>>(std::move(packed));
  entry.resource_version = ResourceVersionOf(object);
  entry.index_values.reserve(index_funcs_.size());
  for (const auto& [name, index] : index_funcs_) entry.index_values.push_back(index(object));
  return entry;
}

ObjectPtr Informer::Unpack(const Packed& packed) {
  // Only this class packs, so the bytes are always well-formed MessagePack.
  return std::make_shared<const json>(json::from_msgpack(*packed));
}

ObjectPtr Informer::Get(const std::string& key) const {
  Packed packed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return nullptr;
    packed = it->second.packed;
  }
  return Unpack(packed);  // outside the lock: readers never hold up the watch
}

std::vector<ObjectPtr> Informer::List() const {
  std::vector<Packed> packed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    packed.reserve(objects_.size());
    for (const auto& [key, entry] : objects_) packed.push_back(entry.packed);
  }
  std::vector<ObjectPtr> objects;
  objects.reserve(packed.size());
  for (const Packed& bytes : packed) objects.push_back(Unpack(bytes));
  return objects;
}

std::vector<ObjectPtr> Informer::ByIndex(const std::string& index, const std::string& value) const {
  std::vector<Packed> packed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto by_index = indices_.find(index);
    if (by_index == indices_.end()) return {};
    auto keys = by_index->second.find(value);
    if (keys == by_index->second.end()) return {};
    for (const std::string& key : keys->second) {
      auto it = objects_.find(key);
      if (it != objects_.end()) packed.push_back(it->second.packed);
    }
  }
  std::vector<ObjectPtr> objects;
  objects.reserve(packed.size());
  for (const Packed& bytes : packed) objects.push_back(Unpack(bytes));
  return objects;
}

std::vector<std::string> Informer::Keys() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> keys;
  keys.reserve(objects_.size());
  for (const auto& entry : objects_) keys.push_back(entry.first);
  return keys;
}

std::map<std::string, size_t> Informer::CountByIndex(const std::string& index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, size_t> counts;
  auto by_index = indices_.find(index);
  if (by_index == indices_.end()) return counts;
  for (const auto& [value, keys] : by_index->second) counts[value] = keys.size();
  return counts;
}

size_t Informer::Size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return objects_.size();
}

std::string Informer::resource_version() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return resource_version_;
}

void Informer::Run() {
  const std::string what =
      "informer " + options_.resource.plural + (options_.ns.empty() ? "" : " in " + options_.ns);
  int64_t backoff_ms = kFirstBackoffMs;
  bool need_list = true;
  bool first_list = true;
  // Interruptible by Stop; the back-off doubles up to its cap and resets on success.
  auto back_off = [&] {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, std::chrono::milliseconds(backoff_ms), [this] { return stop_.load(); });
    backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs);
  };
  while (!stop_) {
    if (need_list) {
      if (!first_list) ++relists_;
      first_list = false;
      Status listed = ListAndReplace();
      if (!listed.ok()) {
        LOCKSTEP_LOG(WARNING) << what << ": list failed, retrying in " << backoff_ms
                              << " ms: " << listed;
        back_off();
        continue;
      }
      need_list = false;
      backoff_ms = kFirstBackoffMs;
    }
    const double started = MonotonicSeconds();
    const std::string version_before = resource_version();
    Status watched = WatchFromLast();
    if (stop_) break;
    if (watched.ok()) {
      const bool quiet_and_short = resource_version() == version_before &&
                                   MonotonicSeconds() - started < kShortestHealthyWatchSeconds;
      if (quiet_and_short) {
        back_off();
      } else {
        backoff_ms = kFirstBackoffMs;
      }
      continue;  // the server ended the watch (its timeout): reopen from the last version
    }
    if (kube::IsGone(watched)) {
      // Our version fell out of the server's window: only a fresh list can say what changed.
      LOCKSTEP_LOG(INFO) << what << ": resourceVersion " << version_before
                         << " is too old, relisting";
      need_list = true;
      continue;
    }
    LOCKSTEP_LOG(WARNING) << what << ": watch failed, reopening in " << backoff_ms
                          << " ms: " << watched;
    back_off();
  }
}

Status Informer::ListAndReplace() {
  std::unordered_map<std::string, Entry> listed;
  kube::ListOptions list_options;
  list_options.label_selector = options_.label_selector;
  list_options.field_selector = options_.field_selector;
  list_options.limit = options_.list_page_size;
  list_options.on_page = [&](std::vector<json>& page) {
    for (json& item : page) {
      json object = options_.transform ? options_.transform(std::move(item)) : std::move(item);
      listed[ObjectKey(object)] = Pack(object);
    }
  };
  StatusOr<kube::ListResult> list = client_->List(options_.resource, options_.ns, list_options);
  if (!list.ok()) return list.status();

  // The difference between the cache and the list is what the handlers have missed:
  // (key, old, new), unpacked once the lock is released.
  std::vector<std::tuple<std::string, Entry, Entry>> changes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, entry] : listed) {
      auto cached = objects_.find(key);
      if (cached == objects_.end()) {
        changes.emplace_back(key, Entry{}, entry);
      } else if (cached->second.resource_version != entry.resource_version) {
        changes.emplace_back(key, cached->second, entry);
      }
    }
    for (const auto& [key, entry] : objects_) {
      if (listed.count(key) == 0) changes.emplace_back(key, entry, Entry{});
    }
    for (const auto& [key, old_entry, new_entry] : changes) {
      IndexLocked(key, old_entry.packed ? &old_entry : nullptr,
                  new_entry.packed ? &new_entry : nullptr);
    }
    objects_ = std::move(listed);
    resource_version_ = list->resource_version;
  }
  if (!handlers_.empty()) {
    for (const auto& [key, old_entry, new_entry] : changes) {
      const ObjectPtr old_object = old_entry.packed ? Unpack(old_entry.packed) : nullptr;
      const ObjectPtr new_object = new_entry.packed ? Unpack(new_entry.packed) : nullptr;
      for (const Handler& handler : handlers_) {
        try {
          handler(old_object.get(), new_object.get());
        } catch (const std::exception& e) {
          LOCKSTEP_LOG(ERROR) << "informer handler threw on " << key << ": " << e.what();
        }
      }
    }
  }
  if (!synced_) {
    // Synced means the handlers have seen the first list, as client-go's HasSynced does.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      synced_ = true;
    }
    cv_.notify_all();
  }
  return OkStatus();
}

Status Informer::WatchFromLast() {
  kube::WatchOptions watch_options;
  watch_options.label_selector = options_.label_selector;
  watch_options.field_selector = options_.field_selector;
  watch_options.resource_version = resource_version();
  watch_options.allow_bookmarks = true;
  watch_options.timeout_seconds = options_.watch_timeout_seconds;
  auto on_event = [this](const kube::WatchEvent& event) {
    const std::string version = ResourceVersionOf(event.object);
    if (event.type == kube::WatchEventType::kBookmark) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!version.empty()) resource_version_ = version;
      return !stop_.load();
    }
    const json object = options_.transform ? options_.transform(event.object) : event.object;
    const std::string key = ObjectKey(object);
    if (event.type == kube::WatchEventType::kDeleted) {
      Apply(key, nullptr, &object);
    } else {
      Apply(key, &object, nullptr);
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!version.empty()) resource_version_ = version;
    }
    return !stop_.load();
  };
  return client_->Watch(options_.resource, options_.ns, watch_options, on_event, &stop_);
}

void Informer::Apply(const std::string& key, const json* object, const json* deleted) {
  std::optional<Entry> previous;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto cached = objects_.find(key);
    if (cached != objects_.end()) previous = cached->second;
    // A delete of an object the cache never held still tells handlers what went away.
    if (!previous && object == nullptr && handlers_.empty()) return;
    if (object != nullptr) {
      Entry entry = Pack(*object);
      IndexLocked(key, previous ? &*previous : nullptr, &entry);
      objects_[key] = std::move(entry);
    } else if (cached != objects_.end()) {
      IndexLocked(key, &*previous, nullptr);
      objects_.erase(cached);
    }
  }
  if (handlers_.empty()) return;
  // The old object as the cache held it (for a delete of an unknown object: as the server sent).
  ObjectPtr old_object = previous ? Unpack(previous->packed) : nullptr;
  const json* old_view = old_object ? old_object.get() : deleted;
  for (const Handler& handler : handlers_) {
    try {
      handler(old_view, object);
    } catch (const std::exception& e) {
      LOCKSTEP_LOG(ERROR) << "informer handler threw on " << key << ": " << e.what();
    }
  }
}

void Informer::IndexLocked(const std::string& key, const Entry* old_entry,
                           const Entry* new_entry) {
  size_t i = 0;
  for (auto& [name, values] : indices_) {
    if (old_entry != nullptr && i < old_entry->index_values.size()) {
      for (const std::string& value : old_entry->index_values[i]) {
        auto it = values.find(value);
        if (it == values.end()) continue;
        it->second.erase(key);
        if (it->second.empty()) values.erase(it);
      }
    }
    if (new_entry != nullptr && i < new_entry->index_values.size()) {
      for (const std::string& value : new_entry->index_values[i]) values[value].insert(key);
    }
    ++i;
  }
}

}  // namespace lockstep::op::controller
