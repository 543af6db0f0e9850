#include "common/rendezvous/generation_stores.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "common/rendezvous/kv_store.h"

namespace lockstep::rendezvous {

Status GenerationStores::CheckRoom(const char* call, const std::string& key, size_t added_keys,
                                   size_t added_bytes) const {
  if (total_keys_ + added_keys > limits_.max_keys) {
    return ResourceExhaustedError(std::string(call) + " of key " + key +
                                  ": the job's store holds " + std::to_string(total_keys_) +
                                  " keys, its limit is " + std::to_string(limits_.max_keys));
  }
  if (total_bytes_ + added_bytes > limits_.max_bytes) {
    return ResourceExhaustedError(
        std::string(call) + " of key " + key + ": the job's store holds " +
        std::to_string(total_bytes_) + " bytes, " + std::to_string(added_bytes) +
        " more would pass its limit of " + std::to_string(limits_.max_bytes));
  }
  return OkStatus();
}

Status GenerationStores::Set(int64_t generation, const std::string& key, const std::string& value,
                             Actions& out) {
  auto& generation_keys = keys_[generation];
  auto it = generation_keys.find(key);
  const size_t old_bytes = it == generation_keys.end() ? 0 : EntryBytes(key, it->second);
  const size_t new_bytes = EntryBytes(key, value);
  if (new_bytes > old_bytes) {
    LOCKSTEP_RETURN_IF_ERROR(
        CheckRoom("store set", key, it == generation_keys.end() ? 1 : 0, new_bytes - old_bytes));
  }
  bytes_[generation] = bytes_[generation] - old_bytes + new_bytes;
  total_bytes_ = total_bytes_ - old_bytes + new_bytes;
  if (it != generation_keys.end()) {
    it->second = value;
    return OkStatus();
  }
  generation_keys.emplace(key, value);
  ++total_keys_;
  Arrived(generation, key, out);
  return OkStatus();
}

StatusOr<int64_t> GenerationStores::Add(int64_t generation, const std::string& key, int64_t delta,
                                        Actions& out) {
  auto& generation_keys = keys_[generation];
  auto it = generation_keys.find(key);
  const bool added = it == generation_keys.end();
  int64_t value = 0;
  if (!added && !it->second.empty()) {
    const std::string& stored = it->second;
    char* end = nullptr;
    errno = 0;
    value = std::strtoll(stored.c_str(), &end, 10);
    if (errno != 0 || end == stored.c_str() || *end != '\0') {
      return InvalidArgumentError("store add: value of key " + key + " is not an integer");
    }
  }
  value += delta;
  std::string text = std::to_string(value);
  const size_t old_bytes = added ? 0 : EntryBytes(key, it->second);
  const size_t new_bytes = EntryBytes(key, text);
  if (new_bytes > old_bytes) {
    LOCKSTEP_RETURN_IF_ERROR(CheckRoom("store add", key, added ? 1 : 0, new_bytes - old_bytes));
  }
  bytes_[generation] = bytes_[generation] - old_bytes + new_bytes;
  total_bytes_ = total_bytes_ - old_bytes + new_bytes;
  if (!added) {
    it->second = std::move(text);
    return value;
  }
  generation_keys.emplace(key, std::move(text));
  ++total_keys_;
  Arrived(generation, key, out);
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
  if (waiters_.size() >= limits_.max_waiters) {
    out.push_back(AnswerStoreGet{
        call,
        ResourceExhaustedError("store get: the job holds " + std::to_string(waiters_.size()) +
                               " waiting gets, its limit is " +
                               std::to_string(limits_.max_waiters)),
        {}});
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
  for (auto it = keys_.begin(); it != keys_.end() && it->first < generation; ++it) {
    total_keys_ -= it->second.size();
  }
  for (auto it = bytes_.begin(); it != bytes_.end() && it->first < generation; ++it) {
    total_bytes_ -= it->second;
  }
  keys_.erase(keys_.begin(), keys_.lower_bound(generation));
  bytes_.erase(bytes_.begin(), bytes_.lower_bound(generation));
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
