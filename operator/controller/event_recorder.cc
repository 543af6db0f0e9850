#include "operator/controller/event_recorder.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <vector>

#include "common/deadline.h"
#include "common/logging.h"

namespace lockstep::op::controller {
namespace {

using json = nlohmann::json;

// Repeats within this window update one Event (client-go's aggregation window).
constexpr double kAggregationWindowSeconds = 600;
// Remembered (object, type, reason, message) tuples before old ones are dropped.
constexpr size_t kMaxRemembered = 4096;
constexpr size_t kMaxMessageBytes = 1024;
constexpr int64_t kDrainOnDestructionMs = 5000;

// metav1.Time's wire format: RFC 3339, seconds, UTC.
std::string TimeNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string StringAt(const json& object, const char* name) {
  auto it = object.find(name);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string HostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

}  // namespace

struct EventRecorder::Pending {
  json involved_object;
  std::string ns;
  EventType type;
  std::string reason;
  std::string message;
  std::string timestamp;
};

struct EventRecorder::State {
  std::mutex mutex;
  std::condition_variable work;      // something queued, or stop
  std::condition_variable progress;  // processed advanced (Flush)
  std::deque<Pending> queue;
  bool stop = false;
  int64_t recorded = 0;   // Record calls
  int64_t processed = 0;  // written, failed or dropped
  int64_t dropped = 0;
  std::thread thread;

  // Writer-thread only: what each repeated event became.
  struct Seen {
    std::string event_name;
    int64_t count = 0;
    double last_at = 0;  // MonotonicSeconds
  };
  std::map<std::string, Seen> seen;
  std::string instance = HostName();
};

EventRecorder::EventRecorder(kube::KubeClient* client, std::string component, size_t max_queued)
    : client_(client),
      component_(std::move(component)),
      max_queued_(max_queued == 0 ? 1 : max_queued),
      state_(std::make_unique<State>()) {
  state_->thread = std::thread([this] { Loop(); });
}

EventRecorder::~EventRecorder() {
  Flush(kDrainOnDestructionMs);
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->work.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

void EventRecorder::Record(const nlohmann::json& object, EventType type, const std::string& reason,
                           const std::string& message) {
  Pending pending;
  const json metadata = object.contains("metadata") && object["metadata"].is_object()
                            ? object["metadata"]
                            : json::object();
  pending.involved_object = {{"apiVersion", StringAt(object, "apiVersion")},
                             {"kind", StringAt(object, "kind")},
                             {"name", StringAt(metadata, "name")},
                             {"namespace", StringAt(metadata, "namespace")},
                             {"uid", StringAt(metadata, "uid")},
                             {"resourceVersion", StringAt(metadata, "resourceVersion")}};
  // A cluster-scoped object's events go to "default", as client-go's recorder does.
  pending.ns = StringAt(metadata, "namespace");
  if (pending.ns.empty()) pending.ns = "default";
  pending.type = type;
  pending.reason = reason;
  pending.message =
      message.size() > kMaxMessageBytes ? message.substr(0, kMaxMessageBytes) : message;
  pending.timestamp = TimeNow();
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->stop) return;
    if (state_->queue.size() >= max_queued_) {
      state_->queue.pop_front();
      ++state_->dropped;
      ++state_->processed;
    }
    state_->queue.push_back(std::move(pending));
    ++state_->recorded;
  }
  state_->work.notify_one();
}

bool EventRecorder::Flush(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  const int64_t target = state_->recorded;
  return state_->progress.wait_for(lock,
                                   std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)),
                                   [&] { return state_->processed >= target; });
}

int64_t EventRecorder::dropped() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->dropped;
}

void EventRecorder::Loop() {
  while (true) {
    Pending pending;
    {
      std::unique_lock<std::mutex> lock(state_->mutex);
      state_->work.wait(lock, [&] { return state_->stop || !state_->queue.empty(); });
      if (state_->stop) return;
      pending = std::move(state_->queue.front());
      state_->queue.pop_front();
    }

    const json& involved = pending.involved_object;
    const std::string type = pending.type == EventType::kWarning ? "Warning" : "Normal";
    const std::string what =
        pending.ns + "/" + involved.value("name", "") + " " + type + " " + pending.reason;
    const std::string key = pending.ns + "\n" + involved.value("kind", "") + "\n" +
                            involved.value("name", "") + "\n" + involved.value("uid", "") + "\n" +
                            type + "\n" + pending.reason + "\n" + pending.message;
    const double now = MonotonicSeconds();
    bool written = false;

    auto seen = state_->seen.find(key);
    if (seen != state_->seen.end() && now - seen->second.last_at < kAggregationWindowSeconds) {
      // A repeat: bump the existing Event instead of creating another.
      const json patch = {{"count", seen->second.count + 1}, {"lastTimestamp", pending.timestamp}};
      StatusOr<json> patched =
          client_->Patch(kube::resources::kEvents, pending.ns, seen->second.event_name,
                         kube::PatchType::kMerge, patch);
      if (patched.ok()) {
        seen->second.count += 1;
        seen->second.last_at = now;
        written = true;
      } else if (!kube::IsNotFound(patched.status())) {
        LOCKSTEP_LOG(WARNING) << "event " << what << ": " << patched.status();
        written = true;  // not retried: events are best effort
      }
      // Not found (the Event expired or was deleted): create a fresh one below.
    }

    if (!written) {
      const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
      char suffix[32];
      std::snprintf(suffix, sizeof(suffix), ".%llx", static_cast<unsigned long long>(nanos));
      const std::string name = involved.value("name", "event") + suffix;
      json event = {{"apiVersion", "v1"},
                    {"kind", "Event"},
                    {"metadata", {{"name", name}, {"namespace", pending.ns}}},
                    {"involvedObject", involved},
                    {"reason", pending.reason},
                    {"message", pending.message},
                    {"type", type},
                    {"source", {{"component", component_}}},
                    {"firstTimestamp", pending.timestamp},
                    {"lastTimestamp", pending.timestamp},
                    {"count", 1},
                    {"reportingComponent", component_},
                    {"reportingInstance", state_->instance}};
      StatusOr<json> created = client_->Create(kube::resources::kEvents, pending.ns, event);
      if (created.ok()) {
        if (state_->seen.size() >= kMaxRemembered) {
          for (auto it = state_->seen.begin(); it != state_->seen.end();) {
            it = now - it->second.last_at >= kAggregationWindowSeconds ? state_->seen.erase(it)
                                                                       : std::next(it);
          }
          if (state_->seen.size() >= kMaxRemembered) state_->seen.clear();
        }
        state_->seen[key] = State::Seen{name, 1, now};
      } else {
        LOCKSTEP_LOG(WARNING) << "event " << what << ": " << created.status();
      }
    }

    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      ++state_->processed;
    }
    state_->progress.notify_all();
  }
}

}  // namespace lockstep::op::controller
