#include "worker/checkpoint/checkpoint_reader.h"

#include <algorithm>
#include <map>

#include "common/logging.h"
#include "worker/checkpoint/checkpoint_deletion.h"
#include "worker/checkpoint/checksum.h"

namespace lockstep::checkpoint {
namespace {

// Damage inside `dir`, named as "step-.../part: problem".
Status Damage(const std::string& dir, const std::string& part, const std::string& problem) {
  return DataLossError(BaseName(dir) + (part.empty() ? "" : "/" + part) + ": " + problem);
}

// Shard `shard` of the checkpoint in `dir`, read whole and checked against its size and checksum.
StatusOr<std::vector<uint8_t>> ReadShard(Storage& storage, const std::string& dir,
                                         const Manifest& manifest, const ShardEntry& shard,
                                         Deadline deadline) {
  // One byte past the manifest's size tells a longer file from a whole one, without reading it all.
  StatusOr<std::vector<uint8_t>> bytes =
      storage.Read(JoinPath(dir, shard.file), 0, shard.bytes + 1, deadline);
  if (bytes.status().code() == StatusCode::kNotFound) {
    return Damage(dir, "", "missing " + shard.file);
  }
  if (!bytes.ok()) return bytes.status();
  if (static_cast<int64_t>(bytes->size()) != shard.bytes) {
    return Damage(dir, shard.file,
                  "size " + std::to_string(bytes->size()) + " bytes, manifest says " +
                      std::to_string(shard.bytes));
  }
  const ShardChecksum kind = ShardChecksumOf(manifest.format_version);
  const std::string checksum = ShardChecksumHex(kind, bytes->data(), bytes->size());
  if (checksum != shard.checksum) {
    return Damage(dir, shard.file,
                  std::string(ShardChecksumField(kind)) + " mismatch (manifest " +
                      shard.checksum.substr(0, 16) + "..., file " + checksum.substr(0, 16) +
                      "...)");
  }
  return bytes;
}

// The manifest's metadata in `state`, with no tensors.
void SetMetadata(const Manifest& manifest, CheckpointState* state) {
  state->step = manifest.step;
  state->epoch = manifest.epoch;
  state->cursor = manifest.cursor;
  state->rng_state = manifest.rng_state;
  state->optimizer = manifest.optimizer;
  state->tensors.clear();
}

}  // namespace

Status CheckStepDir(Storage& storage, const std::string& dir, VerifyLevel level,
                    Manifest* manifest_out, CheckpointState* state, Deadline deadline,
                    const ManifestCheck& accept) {
  StatusOr<std::vector<uint8_t>> manifest_bytes =
      storage.Read(JoinPath(dir, kManifestFileName), 0, -1, deadline);
  if (manifest_bytes.status().code() == StatusCode::kNotFound) {
    return Damage(dir, "", std::string("missing ") + kManifestFileName);
  }
  if (!manifest_bytes.ok()) return manifest_bytes.status();
  StatusOr<Manifest> manifest = ParseManifest(std::string_view(
      reinterpret_cast<const char*>(manifest_bytes->data()), manifest_bytes->size()));
  if (!manifest.ok()) return Damage(dir, kManifestFileName, manifest.status().message());
  const std::optional<int64_t> dir_step = ParseStepDirName(BaseName(dir));
  if (dir_step && *dir_step != manifest->step) {
    return Damage(dir, kManifestFileName,
                  "records step " + std::to_string(manifest->step) + ", not the directory's");
  }
  if (accept) {
    if (Status accepted = accept(*manifest); !accepted.ok()) {
      return Damage(dir, kManifestFileName, accepted.message());
    }
  }

  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, storage.List(dir, deadline));
  std::map<std::string, int64_t> sizes;
  for (const FileInfo& entry : entries) {
    if (!entry.is_dir) sizes[entry.name] = entry.size_bytes;
  }
  for (const ShardEntry& shard : manifest->shards) {
    auto found = sizes.find(shard.file);
    if (found == sizes.end()) return Damage(dir, "", "missing " + shard.file);
    if (found->second != shard.bytes) {
      return Damage(dir, shard.file,
                    "size " + std::to_string(found->second) + " bytes, manifest says " +
                        std::to_string(shard.bytes) +
                        (found->second < shard.bytes ? " (truncated)" : ""));
    }
  }
  if (level == VerifyLevel::kChecksums) {
    std::vector<uint8_t> stream;
    if (state != nullptr) stream.reserve(static_cast<size_t>(manifest->total_bytes));
    for (const ShardEntry& shard : manifest->shards) {
      LOCKSTEP_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                                ReadShard(storage, dir, *manifest, shard, deadline));
      if (state != nullptr) stream.insert(stream.end(), bytes.begin(), bytes.end());
    }
    if (state != nullptr) {
      SetMetadata(*manifest, state);
      for (const TensorEntry& entry : manifest->tensors) {
        NamedTensor tensor;
        tensor.name = entry.name;
        tensor.dtype = entry.dtype;
        tensor.shape = entry.shape;
        tensor.bytes.assign(stream.begin() + entry.offset,
                            stream.begin() + entry.offset + entry.bytes);
        state->tensors.push_back(std::move(tensor));
      }
    }
  }
  if (manifest_out != nullptr) *manifest_out = std::move(manifest).value();
  return OkStatus();
}

StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(Storage& storage, const std::string& root,
                                                      VerifyLevel level, Deadline deadline) {
  StatusOr<std::vector<FileInfo>> entries = storage.List(root, deadline);
  if (entries.status().code() == StatusCode::kNotFound) return std::vector<CheckpointInfo>();
  if (!entries.ok()) return entries.status();
  RemoveInterruptedDeletions(storage, root, *entries, deadline);
  std::vector<CheckpointInfo> checkpoints;
  for (const FileInfo& entry : *entries) {
    const std::optional<int64_t> step = ParseStepDirName(entry.name);
    if (!entry.is_dir || !step) continue;
    CheckpointInfo info;
    info.step = *step;
    info.dir = JoinPath(root, entry.name);
    Manifest manifest;
    Status status = CheckStepDir(storage, info.dir, level, &manifest, nullptr, deadline);
    if (status.ok()) {
      info.valid = true;
      info.world_size = manifest.world_size;
      info.stages = manifest.stages;
      info.total_bytes = manifest.total_bytes;
      info.created_at = manifest.created_at;
    } else if (status.code() == StatusCode::kDataLoss) {
      info.problem = status.message();
    } else {
      return status;
    }
    checkpoints.push_back(std::move(info));
  }
  std::sort(checkpoints.begin(), checkpoints.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step < b.step; });
  return checkpoints;
}

Status VerifyCheckpoint(Storage& storage, const std::string& root, std::optional<int64_t> step,
                        Deadline deadline) {
  if (!step) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> checkpoints,
                              ListCheckpoints(storage, root, VerifyLevel::kSizes, deadline));
    if (checkpoints.empty()) return NotFoundError("no checkpoint under " + root);
    step = checkpoints.back().step;
  }
  const std::string dir = JoinPath(root, StepDirName(*step));
  StatusOr<FileInfo> info = storage.Stat(dir, deadline);
  if (info.status().code() == StatusCode::kNotFound) {
    return NotFoundError("no checkpoint of step " + std::to_string(*step) + " under " + root);
  }
  if (!info.ok()) return info.status();
  return CheckStepDir(storage, dir, VerifyLevel::kChecksums, nullptr, nullptr, deadline);
}

StatusOr<std::vector<int64_t>> StepsNewestFirst(Storage& storage, const std::string& root,
                                                Deadline deadline) {
  StatusOr<std::vector<FileInfo>> entries = storage.List(root, deadline);
  if (entries.status().code() == StatusCode::kNotFound) {
    return NotFoundError("no checkpoint under " + root + " (it does not exist)");
  }
  if (!entries.ok()) return entries.status();
  RemoveInterruptedDeletions(storage, root, *entries, deadline);
  std::vector<int64_t> steps;
  for (const FileInfo& entry : *entries) {
    const std::optional<int64_t> step = ParseStepDirName(entry.name);
    if (entry.is_dir && step) steps.push_back(*step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

StatusOr<LoadedCheckpoint> LoadNewestValid(Storage& storage, const std::string& root,
                                           Deadline deadline, const ManifestCheck& accept) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<int64_t> steps, StepsNewestFirst(storage, root, deadline));
  LoadedCheckpoint loaded;
  for (int64_t step : steps) {
    const std::string dir = JoinPath(root, StepDirName(step));
    Status status = CheckStepDir(storage, dir, VerifyLevel::kChecksums, &loaded.manifest,
                                 &loaded.state, deadline, accept);
    if (status.ok()) {
      loaded.dir = dir;
      return loaded;
    }
    if (status.code() != StatusCode::kDataLoss) return status;
    LOCKSTEP_LOG(WARNING) << "skipping damaged checkpoint: " << status.message();
    loaded.skipped.push_back({step, status.message()});
  }
  std::string message = "no valid checkpoint under " + root;
  for (const SkippedCheckpoint& skipped : loaded.skipped) message += "; " + skipped.problem;
  return NotFoundError(message);
}

StatusOr<CheckpointState> ReadTensors(Storage& storage, const std::string& dir,
                                      const Manifest& manifest, const std::set<std::string>& wanted,
                                      Deadline deadline) {
  std::set<std::string> missing = wanted;
  // The shards that hold a wanted tensor's bytes: shards and tensors both cover the stream in
  // order, so one pass pairs them.
  std::vector<bool> needed(manifest.shards.size(), false);
  for (const TensorEntry& tensor : manifest.tensors) {
    if (missing.erase(tensor.name) == 0) continue;
    for (size_t k = 0; k < manifest.shards.size(); ++k) {
      const ShardEntry& shard = manifest.shards[k];
      if (shard.offset < tensor.offset + tensor.bytes && tensor.offset < shard.offset + shard.bytes)
        needed[k] = true;
    }
  }
  if (!missing.empty()) {
    return NotFoundError(BaseName(dir) + " has no tensor " + *missing.begin());
  }
  CheckpointState state;
  SetMetadata(manifest, &state);
  std::vector<const TensorEntry*> entries;
  for (const TensorEntry& entry : manifest.tensors) {
    if (wanted.count(entry.name) == 0) continue;
    entries.push_back(&entry);
    state.tensors.push_back(NamedTensor{entry.name, entry.dtype, entry.shape, {}});
    state.tensors.back().bytes.resize(static_cast<size_t>(entry.bytes));
  }
  // One shard at a time, checked, its part of each wanted tensor copied out and the shard let go:
  // at most one shard beside the tensors (a tensor may span shards when the stream was split
  // evenly over data-parallel ranks).
  for (size_t k = 0; k < needed.size(); ++k) {
    if (!needed[k]) continue;
    const ShardEntry& shard = manifest.shards[k];
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                              ReadShard(storage, dir, manifest, shard, deadline));
    for (size_t t = 0; t < entries.size(); ++t) {
      const TensorEntry& entry = *entries[t];
      const int64_t from = std::max(entry.offset, shard.offset);
      const int64_t to = std::min(entry.offset + entry.bytes, shard.offset + shard.bytes);
      if (from >= to) continue;
      std::copy(bytes.begin() + (from - shard.offset), bytes.begin() + (to - shard.offset),
                state.tensors[t].bytes.begin() + (from - entry.offset));
    }
  }
  return state;
}

}  // namespace lockstep::checkpoint
