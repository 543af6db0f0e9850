#include "common/rendezvous/generation_stores.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "common/rendezvous/client.h"
#include "common/rendezvous/kv_store.h"

namespace lockstep::rendezvous {
namespace {

// A key as an error message shows it: keys are the clients' bytes and may be megabytes long or
// not text at all, and the message reaches a job's status, which must be valid UTF-8. Printable
// ASCII as it is, any other byte as \xNN, cut after 64 bytes of the key.
std::string Shown(const std::string& key) {
  constexpr size_t kShown = 64;
  static const char kHex[] = "0123456789abcdef";
  std::string shown;
  for (size_t i = 0; i < key.size() && i < kShown; ++i) {
    const auto byte = static_cast<unsigned char>(key[i]);
    if (byte >= 0x20 && byte < 0x7f && byte != '\\') {
      shown += static_cast<char>(byte);
    } else {
      shown += "\\x";
      shown += kHex[byte >> 4];
      shown += kHex[byte & 0xf];
    }
  }
  if (key.size() > kShown) shown += "... (" + std::to_string(key.size()) + " bytes)";
  return shown;
}

// What a held get costs: its keys, kept by the call and named again in the index of missing
// keys, and a node for each.
size_t WaiterBytes(const std::vector<std::string>& keys) {
  size_t bytes = StoreLimits::kKeyOverheadBytes;
  for (const std::string& key : keys) bytes += 2 * (key.size() + StoreLimits::kKeyOverheadBytes);
  return bytes;
}

}  // namespace

Status GenerationStores::Refuse(const std::string& message) {
  ++refusals_;
  last_refusal_ = message;
  return ResourceExhaustedError(message).WithReason(kReasonStoreLimit);
}

Status GenerationStores::CheckRoom(const std::string& what, size_t added_keys,
                                   size_t added_bytes) {
  if (total_keys_ + added_keys > limits_.max_keys) {
    return Refuse(what + ": the job's store holds " + std::to_string(total_keys_) +
                  " keys, its limit is " + std::to_string(limits_.max_keys));
  }
  if (total_bytes_ + added_bytes > limits_.max_bytes) {
    return Refuse(what + ": the job's store holds " + std::to_string(total_bytes_) + " bytes, " +
                  std::to_string(added_bytes) + " more would pass its limit of " +
                  std::to_string(limits_.max_bytes));
  }
  return OkStatus();
}

Status GenerationStores::Store(const char* call, int64_t generation, const std::string& key,
                               std::string value, Actions& out) {
  auto& generation_keys = keys_[generation];
  auto it = generation_keys.find(key);
  const bool added = it == generation_keys.end();
  const size_t old_bytes = added ? 0 : EntryBytes(key, it->second);
  const size_t new_bytes = EntryBytes(key, value);
  if (new_bytes > old_bytes) {
    LOCKSTEP_RETURN_IF_ERROR(CheckRoom(std::string(call) + " of key " + Shown(key),
                                       added ? 1 : 0, new_bytes - old_bytes));
  }
  bytes_[generation] = bytes_[generation] - old_bytes + new_bytes;
  total_bytes_ = total_bytes_ - old_bytes + new_bytes;
  if (!added) {
    it->second = std::move(value);
    return OkStatus();
  }
  generation_keys.emplace(key, std::move(value));
  ++total_keys_;
  Arrived(generation, key, out);
  return OkStatus();
}

Status GenerationStores::Set(int64_t generation, const std::string& key, const std::string& value,
                             Actions& out) {
  return Store("store set", generation, key, value, out);
}

StatusOr<int64_t> GenerationStores::Add(int64_t generation, const std::string& key, int64_t delta,
                                        Actions& out) {
  int64_t value = 0;
  auto generation_keys = keys_.find(generation);
  if (generation_keys != keys_.end()) {
    auto it = generation_keys->second.find(key);
    if (it != generation_keys->second.end() && !it->second.empty()) {
      const std::string& stored = it->second;
      char* end = nullptr;
      errno = 0;
      value = std::strtoll(stored.c_str(), &end, 10);
      if (errno != 0 || end == stored.c_str() || *end != '\0') {
        return InvalidArgumentError("store add: value of key " + Shown(key) +
                                    " is not an integer");
      }
    }
  }
  value += delta;
  LOCKSTEP_RETURN_IF_ERROR(Store("store add", generation, key, std::to_string(value), out));
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
        Refuse("store get: the job holds " + std::to_string(waiters_.size()) +
               " waiting gets, its limit is " + std::to_string(limits_.max_waiters)),
        {}});
    return;
  }
  waiter.bytes = WaiterBytes(keys);
  if (Status room = CheckRoom("store get of " + std::to_string(keys.size()) + " keys", 0,
                              waiter.bytes);
      !room.ok()) {
    out.push_back(AnswerStoreGet{call, std::move(room), {}});
    return;
  }
  total_bytes_ += waiter.bytes;
  waiter.deadline = now + std::chrono::milliseconds(waiter.timeout_ms);
  waiter.missing = missing.size();
  auto& index = waiting_on_[generation];
  for (const std::string* key : missing) index[*key].push_back(call);
  out.push_back(WakeAt{waiter.deadline});
  waiters_[call] = std::move(waiter);
}

void GenerationStores::Cancel(CallId call) {
  auto it = waiters_.find(call);
  if (it == waiters_.end()) return;
  Forget(it->second);
  waiters_.erase(it);
}

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
    Forget(waiter);
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
    total_bytes_ -= it->second.bytes;  // its index went with its generation
    it = waiters_.erase(it);
  }
}

void GenerationStores::FailAll(const Status& status, Actions& out) {
  for (const auto& [call, waiter] : waiters_) {
    out.push_back(AnswerStoreGet{call, status, {}});
    total_bytes_ -= waiter.bytes;
  }
  waiters_.clear();
  waiting_on_.clear();
}

void GenerationStores::Answer(const Waiter& waiter, Actions& out) {
  const auto& generation_keys = keys_.at(waiter.generation);
  size_t answer_bytes = 0;
  for (const auto& key : waiter.keys) {
    const size_t size = generation_keys.at(key).size();
    const size_t cut = waiter.range.offset >= size ? 0 : size - waiter.range.offset;
    answer_bytes += waiter.range.length == 0 ? size : std::min(cut, waiter.range.length);
  }
  if (answer_bytes > limits_.max_answer_bytes) {
    out.push_back(AnswerStoreGet{
        waiter.call,
        Refuse("store get of " + std::to_string(waiter.keys.size()) +
               " keys: the answer would be " + std::to_string(answer_bytes) + " bytes, more than " +
               std::to_string(limits_.max_answer_bytes) +
               " (ask for fewer keys, or a range of each)"),
        {}});
    return;
  }
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

void GenerationStores::Forget(const Waiter& waiter) {
  total_bytes_ -= waiter.bytes;
  auto index = waiting_on_.find(waiter.generation);
  if (index == waiting_on_.end()) return;
  auto generation_keys = keys_.find(waiter.generation);
  for (const std::string& key : waiter.keys) {
    if (generation_keys != keys_.end() && generation_keys->second.count(key) != 0) continue;
    auto calls = index->second.find(key);
    if (calls == index->second.end()) continue;  // a repeat of a key already taken out
    std::vector<CallId>& ids = calls->second;
    ids.erase(std::remove(ids.begin(), ids.end(), waiter.call), ids.end());
    if (ids.empty()) index->second.erase(calls);
  }
  if (index->second.empty()) waiting_on_.erase(index);
}

void GenerationStores::Arrived(int64_t generation, const std::string& key, Actions& out) {
  auto index = waiting_on_.find(generation);
  if (index == waiting_on_.end()) return;
  auto calls = index->second.find(key);
  if (calls == index->second.end()) return;
  const std::vector<CallId> ids = std::move(calls->second);
  index->second.erase(calls);
  for (CallId call : ids) {
    auto waiter = waiters_.find(call);
    if (waiter == waiters_.end() || --waiter->second.missing > 0) continue;
    total_bytes_ -= waiter->second.bytes;
    Answer(waiter->second, out);
    waiters_.erase(waiter);
  }
  if (index->second.empty()) waiting_on_.erase(index);
}

std::string GenerationStores::MissingKeys(const Waiter& waiter) const {
  auto generation_keys = keys_.find(waiter.generation);
  std::string missing;
  for (const auto& key : waiter.keys) {
    if (generation_keys == keys_.end() || generation_keys->second.count(key) == 0) {
      missing += (missing.empty() ? "" : ", ") + Shown(key);
      if (missing.size() > 1024) return missing + ", ...";
    }
  }
  return missing;
}

}  // namespace lockstep::rendezvous
