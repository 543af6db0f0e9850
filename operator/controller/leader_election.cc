#include "operator/controller/leader_election.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <random>

#include "common/deadline.h"
#include "common/logging.h"

namespace lockstep::op::controller {
namespace {

using json = nlohmann::json;

// metav1.MicroTime's wire format: RFC 3339 in UTC with exactly six fractional digits.
std::string MicroTimeNow() {
  const auto now = std::chrono::system_clock::now();
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(micros / 1000000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[64];
  const size_t n = std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(text + n, sizeof(text) - n, ".%06lldZ", static_cast<long long>(micros % 1000000));
  return text;
}

// A field that may be absent or null (holderIdentity is a pointer in the Go type).
std::string StringField(const json& object, const char* name) {
  auto it = object.find(name);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

int64_t IntField(const json& object, const char* name) {
  auto it = object.find(name);
  return it != object.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

}  // namespace

LeaderElector::LeaderElector(kube::KubeClient* client, LeaderElectionOptions options)
    : client_(client), options_(std::move(options)) {}

LeaderElector::~LeaderElector() { Stop(); }

void LeaderElector::Run(std::function<void()> on_started_leading,
                        std::function<void()> on_stopped_leading) {
  if (thread_.joinable()) return;
  on_started_ = std::move(on_started_leading);
  on_stopped_ = std::move(on_stopped_leading);
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void LeaderElector::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LeaderElector::SleepFor(int64_t ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stop_.load(); });
}

void LeaderElector::Loop() {
  const std::string lease =
      options_.lease_namespace + "/" + options_.lease_name + " as " + options_.identity;
  std::mt19937 random(std::random_device{}());
  std::uniform_real_distribution<double> jitter(1.0, 1.2);
  double last_renewed_at = 0;
  while (!stop_) {
    const bool held = TryAcquireOrRenew();
    const double now = MonotonicSeconds();
    if (held) {
      last_renewed_at = now;
      if (!leader_) {
        leader_ = true;
        LOCKSTEP_LOG(INFO) << "leader election " << lease << ": became leader";
        if (on_started_) on_started_();
      }
    } else if (leader_) {
      // Another holder on the record means the lease is gone now; otherwise we may keep trying
      // until renew_deadline_ms, which ends before anyone else may take the lease over.
      const bool taken = !observed_holder_.empty() && observed_holder_ != options_.identity;
      if (taken || (now - last_renewed_at) * 1000.0 >= options_.renew_deadline_ms) {
        leader_ = false;
        LOCKSTEP_LOG(WARNING) << "leader election " << lease << ": lost the lease"
                              << (taken ? " to " + observed_holder_ : " (renew deadline passed)");
        if (on_stopped_) on_stopped_();
      }
    }
    // Candidates spread their retries so that they do not collide on every attempt.
    const double factor = leader_ ? 1.0 : jitter(random);
    SleepFor(static_cast<int64_t>(options_.retry_period_ms * factor));
  }
  if (leader_) {
    Release();
    leader_ = false;
    LOCKSTEP_LOG(INFO) << "leader election " << lease << ": released the lease";
    if (on_stopped_) on_stopped_();
  }
}

std::string LeaderElector::ObservedLeader() const {
  std::lock_guard<std::mutex> lock(holder_mutex_);
  return observed_holder_;
}

void LeaderElector::SetObservedHolder(const std::string& holder) {
  std::lock_guard<std::mutex> lock(holder_mutex_);
  observed_holder_ = holder;
}

bool LeaderElector::TryAcquireOrRenew() {
  const std::string now_text = MicroTimeNow();
  const int64_t duration_seconds = std::max<int64_t>(1, (options_.lease_duration_ms + 999) / 1000);
  StatusOr<json> current =
      client_->Get(kube::resources::kLeases, options_.lease_namespace, options_.lease_name);
  if (kube::IsNotFound(current.status())) {
    json lease = {
        {"apiVersion", "coordination.k8s.io/v1"},
        {"kind", "Lease"},
        {"metadata", {{"name", options_.lease_name}, {"namespace", options_.lease_namespace}}},
        {"spec",
         {{"holderIdentity", options_.identity},
          {"leaseDurationSeconds", duration_seconds},
          {"acquireTime", now_text},
          {"renewTime", now_text},
          {"leaseTransitions", 0}}}};
    StatusOr<json> created =
        client_->Create(kube::resources::kLeases, options_.lease_namespace, lease);
    if (!created.ok()) {
      // AlreadyExists: another candidate created it first; we look again next round.
      LOCKSTEP_LOG(DEBUG) << "leader election: creating the lease: " << created.status();
      return false;
    }
    observed_spec_ = created->value("spec", json::object());
    observed_at_ = MonotonicSeconds();
    SetObservedHolder(options_.identity);
    return true;
  }
  if (!current.ok()) {
    LOCKSTEP_LOG(WARNING) << "leader election: reading the lease: " << current.status();
    return false;
  }
  const json spec = current->contains("spec") && (*current)["spec"].is_object() ? (*current)["spec"]
                                                                                : json::object();
  if (spec != observed_spec_) {
    observed_spec_ = spec;
    observed_at_ = MonotonicSeconds();
  }
  const std::string holder = StringField(spec, "holderIdentity");
  SetObservedHolder(holder);
  const bool held_by_other = !holder.empty() && holder != options_.identity;
  if (held_by_other && (MonotonicSeconds() - observed_at_) * 1000.0 < options_.lease_duration_ms) {
    return false;  // the holder renewed within its lease, as far as our clock can tell
  }

  json next = spec;
  next["holderIdentity"] = options_.identity;
  next["leaseDurationSeconds"] = duration_seconds;
  next["renewTime"] = now_text;
  if (holder != options_.identity) {
    next["acquireTime"] = now_text;
    next["leaseTransitions"] = IntField(spec, "leaseTransitions") + 1;
  } else if (!next.contains("acquireTime") || next["acquireTime"].is_null()) {
    next["acquireTime"] = now_text;
  }
  json lease = *current;
  lease["spec"] = next;  // metadata.resourceVersion stays: the Update is conditional
  StatusOr<json> updated =
      client_->Update(kube::resources::kLeases, options_.lease_namespace, lease);
  if (!updated.ok()) {
    if (!kube::IsConflict(updated.status())) {
      LOCKSTEP_LOG(WARNING) << "leader election: updating the lease: " << updated.status();
    }
    return false;  // a conflict: someone else wrote the lease first
  }
  observed_spec_ = updated->value("spec", json::object());
  observed_at_ = MonotonicSeconds();
  SetObservedHolder(options_.identity);
  return true;
}

void LeaderElector::Release() {
  // Conflicts are retried: a release that silently fails makes the standby wait a full lease.
  Status released = kube::RetryOnConflict([&]() -> Status {
    StatusOr<json> current =
        client_->Get(kube::resources::kLeases, options_.lease_namespace, options_.lease_name);
    if (!current.ok()) return current.status();
    json& spec = (*current)["spec"];
    if (!spec.is_object() || StringField(spec, "holderIdentity") != options_.identity) {
      return OkStatus();  // no longer ours: nothing to release
    }
    const std::string now_text = MicroTimeNow();
    spec["holderIdentity"] = "";
    spec["leaseDurationSeconds"] = 1;
    spec["acquireTime"] = now_text;
    spec["renewTime"] = now_text;
    return client_->Update(kube::resources::kLeases, options_.lease_namespace, *current).status();
  });
  if (!released.ok()) {
    LOCKSTEP_LOG(WARNING) << "leader election: releasing the lease: " << released;
    return;
  }
  SetObservedHolder("");  // as written: none holds it
}

}  // namespace lockstep::op::controller
