#include "common/rendezvous/generation_stores.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "common/rendezvous/kv_store.h"

namespace lockstep::rendezvous {

void GenerationStores::Set(int64_t generation, const std::string& key, const std::string& value,
                           Actions& out) {
  const bool added = keys_[generation].insert_or_assign(key, value).second;
  if (added) Arrived(generation, key, out);
}

StatusOr<int64_t> GenerationStores::Add(int64_t generation, const std::string& key, int64_t delta,
                                        Actions& out) {
  auto [it, added] = keys_[generation].try_emplace(key);
  std::string& stored = it->second;
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
  if (added) Arrived(generation, key, out);
  return value;
}

void GenerationStores::Get(CallId call, int64_t generation, const std::vector<std::string>& keys,
                           int64_t timeout_ms, TimePoint now, Actions& out, ByteRange range) {
  Waiter waiter;
  waiter.call = call;
  waiter.generation = generation;
  waiter.keys = keys;
  waiter.range = range;
  waiter.timeout_ms = std::max<int64_t>(0, timeout_ms);
  auto generation_keys = keys_.find(generation);
  std::vector<const std::string*> missing;
  for (const auto& key : keys) {
    if (generation_keys == keys_.end() || generation_keys->second.count(key) == 0) {
      missing.push_back(&key);
    }
  }
  if (missing.empty()) {
    Answer(waiter, out);
    return;
  }
  if (waiter.timeout_ms == 0) {
    out.push_back(AnswerStoreGet{
        call, DeadlineExceededError("store get: keys missing: " + MissingKeys(waiter)), {}});
    return;
  }
  waiter.deadline = now + std::chrono::milliseconds(waiter.timeout_ms);
  waiter.missing = missing.size();
  auto& index = waiting_on_[generation];
  for (const std::string* key : missing) index[*key].push_back(call);
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
  waiting_on_.erase(waiting_on_.begin(), waiting_on_.lower_bound(generation));
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
  waiting_on_.clear();
}

void GenerationStores::Answer(const Waiter& waiter, Actions& out) const {
  const auto& generation_keys = keys_.at(waiter.generation);
  std::vector<std::string> values;
  values.reserve(waiter.keys.size());
  for (const auto& key : waiter.keys) {
    const std::string& value = generation_keys.at(key);
    values.push_back(waiter.range.length == 0
                         ? value
                         : ValueRange(value, waiter.range.offset, waiter.range.length));
  }
  out.push_back(AnswerStoreGet{waiter.call, OkStatus(), std::move(values)});
}

void GenerationStores::Arrived(int64_t generation, const std::string& key, Actions& out) {
  auto index = waiting_on_.find(generation);
  if (index == waiting_on_.end()) return;
  auto calls = index->second.find(key);
  if (calls == index->second.end()) return;
  for (CallId call : calls->second) {
    auto waiter = waiters_.find(call);
    if (waiter == waiters_.end() || --waiter->second.missing > 0) continue;
    Answer(waiter->second, out);
    waiters_.erase(waiter);
  }
  index->second.erase(calls);
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
