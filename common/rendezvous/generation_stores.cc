#include "common/rendezvous/generation_stores.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace lockstep::rendezvous {

void GenerationStores::Set(int64_t generation, const std::string& key, const std::string& value,
                           Actions& out) {
  keys_[generation][key] = value;
  Wake(generation, out);
}

StatusOr<int64_t> GenerationStores::Add(int64_t generation, const std::string& key, int64_t delta,
                                        Actions& out) {
  std::string& stored = keys_[generation][key];
  int64_t value = 0;
  if (!stored.empty()) {
    char* end = nullptr;
    errno = 0;
    value = std::strtoll(stored.c_str(), &end, 10);
    if (errno != 0 || end == stored.c_str() || *end != '\0') {
      return InvalidArgumentError("store add: value of key " + key + " is not an integer");
    }
  }
  value += delta;
  stored = std::to_string(value);
  Wake(generation, out);
  return value;
}

void GenerationStores::Get(CallId call, int64_t generation, const std::vector<std::string>& keys,
                           int64_t timeout_ms, TimePoint now, Actions& out) {
  Waiter waiter;
  waiter.call = call;
  waiter.generation = generation;
  waiter.keys = keys;
  waiter.timeout_ms = std::max<int64_t>(0, timeout_ms);
  if (TryAnswer(waiter, out)) return;
  if (waiter.timeout_ms == 0) {
    out.push_back(AnswerStoreGet{
        call, DeadlineExceededError("store get: keys missing: " + MissingKeys(waiter)), {}});
    return;
  }
  waiter.deadline = now + std::chrono::milliseconds(waiter.timeout_ms);
  out.push_back(WakeAt{waiter.deadline});
  waiters_[call] = std::move(waiter);
}

void GenerationStores::Cancel(CallId call) { waiters_.erase(call); }

void GenerationStores::Expire(TimePoint now, Actions& out) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    const Waiter& waiter = it->second;
    if (waiter.deadline > now) {
      ++it;
      continue;
    }
    out.push_back(AnswerStoreGet{waiter.call,
                                 DeadlineExceededError("store get: keys still missing after " +
                                                       std::to_string(waiter.timeout_ms) +
                                                       " ms: " + MissingKeys(waiter)),
                                 {}});
    it = waiters_.erase(it);
  }
}

void GenerationStores::DropBefore(int64_t generation, Actions& out) {
  keys_.erase(keys_.begin(), keys_.lower_bound(generation));
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.generation >= generation) {
      ++it;
      continue;
    }
    out.push_back(AnswerStoreGet{it->second.call,
                                 FailedPreconditionError(
                                     "store get: generation " +
                                     std::to_string(it->second.generation) +
                                     " is over and its keys are dropped"),
                                 {}});
    it = waiters_.erase(it);
  }
}

void GenerationStores::FailAll(const Status& status, Actions& out) {
  for (const auto& [call, waiter] : waiters_) out.push_back(AnswerStoreGet{call, status, {}});
  waiters_.clear();
}

bool GenerationStores::TryAnswer(const Waiter& waiter, Actions& out) const {
  auto generation_keys = keys_.find(waiter.generation);
  std::vector<std::string> values;
  values.reserve(waiter.keys.size());
  for (const auto& key : waiter.keys) {
    if (generation_keys == keys_.end()) return false;
    auto it = generation_keys->second.find(key);
    if (it == generation_keys->second.end()) return false;
    values.push_back(it->second);
  }
  out.push_back(AnswerStoreGet{waiter.call, OkStatus(), std::move(values)});
  return true;
}

void GenerationStores::Wake(int64_t generation, Actions& out) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.generation == generation && TryAnswer(it->second, out)) {
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

std::string GenerationStores::MissingKeys(const Waiter& waiter) const {
  auto generation_keys = keys_.find(waiter.generation);
  std::string missing;
  for (const auto& key : waiter.keys) {
    if (generation_keys == keys_.end() || generation_keys->second.count(key) == 0) {
      missing += (missing.empty() ? "" : ", ") + key;
    }
  }
  return missing;
}

}  // namespace lockstep::rendezvous
