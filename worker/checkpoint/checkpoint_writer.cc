#include "worker/checkpoint/checkpoint_writer.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/logging.h"
#include "worker/checkpoint/checkpoint_deletion.h"
#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/checkpoint/manifest.h"

namespace lockstep::checkpoint {
namespace {

// Whether two manifests list the same tensors (names, dtypes, shapes, sizes, in order).
bool SameTensors(const Manifest& a, const Manifest& b) {
  if (a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const TensorEntry& x = a.tensors[i];
    const TensorEntry& y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.bytes != y.bytes) {
      return false;
    }
  }
  return true;
}

}  // namespace

CheckpointWriter::CheckpointWriter(Storage& storage, std::string root, int rank, int world_size,
                                   CheckpointWriterOptions options)
    : storage_(storage),
      root_(std::move(root)),
      rank_(rank),
      world_size_(world_size),
      options_(std::move(options)) {}

Status CheckpointWriter::Write(const CheckpointState& state, Deadline deadline) {
  LOCKSTEP_RETURN_IF_ERROR(Commit(state, deadline));
  ApplyRetention(state.step, deadline);
  return OkStatus();
}

Status CheckpointWriter::Commit(const CheckpointState& state, Deadline deadline) {
  if (world_size_ < 1 || rank_ < 0 || rank_ >= world_size_) {
    return InvalidArgumentError("checkpoint writer: rank " + std::to_string(rank_) +
                                " is not in a world of " + std::to_string(world_size_));
  }
  const std::string final_dir = JoinPath(root_, StepDirName(state.step));
  const std::string temp_dir = JoinPath(root_, TempDirName(state.step, options_.attempt_id));

  Manifest manifest = BuildManifest(state, world_size_, /*hash_shards=*/false);
  if (Status table = CheckTensorTable(manifest); !table.ok()) {
    return InvalidArgumentError("checkpoint step " + std::to_string(state.step) + ": " +
                                table.message());
  }

  // A step committed earlier (a retry whose first attempt got through, or a resumed job passing
  // the same step again) needs nothing more if it checks out and holds this state's tensors.
  // Every rank decides from the same evidence, so either all of them skip or all write: rank 0
  // never waits for a shard that a rank skipped (only rank 0 deletes a directory it replaces; a
  // rank that looks after the delete finds nothing and writes too).
  StatusOr<FileInfo> existing = storage_.Stat(final_dir, deadline);
  if (existing.ok()) {
    Manifest committed;
    Status verified =
        CheckStepDir(storage_, final_dir, VerifyLevel::kSizes, &committed, nullptr, deadline);
    if (verified.ok() && SameTensors(committed, manifest)) return OkStatus();
    if (!verified.ok() && verified.code() != StatusCode::kDataLoss &&
        verified.code() != StatusCode::kNotFound) {
      return verified;
    }
    if (rank_ == 0) {
      LOCKSTEP_LOG(WARNING) << "replacing checkpoint of step " << state.step << ": "
                            << (verified.ok() ? "it holds other tensors than this model's"
                                              : verified.message());
      LOCKSTEP_RETURN_IF_ERROR(DeleteStepDir(storage_, root_, state.step, deadline));
    }
  } else if (existing.status().code() != StatusCode::kNotFound) {
    return existing.status();
  }

  const std::string manifest_path = JoinPath(temp_dir, kManifestFileName);
  // Nobody reads a .tmp- directory, so the manifest needs no temporary name of its own (the
  // directory's rename is what makes it visible), and its name is synced with the shards'.
  WriteOptions manifest_options;
  manifest_options.overwrite = true;
  manifest_options.sync_directory = false;
  manifest_options.atomic = false;
  // Only rank 0 needs the checksums (for the manifest). It computes them on a helper thread while
  // it writes its own shard and waits for the others', so a persist costs the longer of hashing
  // and writing, not their sum.
  std::vector<std::string> hashes;
  std::thread hasher;
  if (rank_ == 0) hasher = std::thread([&] { hashes = HashShards(state, manifest); });
  Status written;
  if (rank_ == 0) {
    // The manifest's name is created now, empty, so that the directory sync below, which runs
    // while the shards are still being hashed, covers it too: once the hashes are known, only
    // its content remains to be written and synced before the rename.
    written = storage_.Write(manifest_path, "", manifest_options, deadline);
  }
  if (written.ok()) {
    // Written straight from the snapshot's tensors: no gathered copy of the shard.
    const ShardEntry& own_shard = manifest.shards[rank_];
    WriteOptions shard_options;
    shard_options.overwrite = true;  // a retry of the same snapshot rewrites its shard
    // The shard's content is durable before its name appears (rank 0 may commit as soon as it
    // sees the name with the full size); the name is made durable by rank 0's one sync of the
    // directory before the commit.
    shard_options.sync_directory = false;
    written = storage_
                  .WritePieces(JoinPath(temp_dir, own_shard.file), ShardPieces(state, own_shard),
                               shard_options, deadline)
                  .WithContext("checkpoint step " + std::to_string(state.step));
  }
  if (written.ok() && rank_ == 0) {
    written = WaitForShards(temp_dir, manifest, deadline);
    // Every shard is durable (each was fsync'ed before its rename) and every name in the
    // directory, the manifest's included, exists: one sync makes all the names durable.
    if (written.ok()) written = storage_.SyncDirectory(temp_dir, deadline);
  }
  // Hashing is bounded by the state's size (no storage involved), so this join needs no deadline.
  if (hasher.joinable()) hasher.join();
  LOCKSTEP_RETURN_IF_ERROR(written);
  if (rank_ != 0) return OkStatus();
  for (size_t rank = 0; rank < hashes.size(); ++rank) manifest.shards[rank].checksum = hashes[rank];

  // The manifest's content, in place under the name synced above; the rename (which Rename
  // makes durable) is the commit.
  LOCKSTEP_RETURN_IF_ERROR(
      storage_.Write(manifest_path, SerializeManifest(manifest), manifest_options, deadline));
  Status renamed = storage_.Rename(temp_dir, final_dir, deadline);
  if (renamed.code() == StatusCode::kAlreadyExists) {
    // Committed concurrently (should not happen with one rank 0, but never lose a valid one).
    LOCKSTEP_RETURN_IF_ERROR(
        CheckStepDir(storage_, final_dir, VerifyLevel::kSizes, nullptr, nullptr, deadline));
    Status cleaned = storage_.Delete(temp_dir, /*recursive=*/true, deadline);
    if (!cleaned.ok()) {
      LOCKSTEP_LOG(WARNING) << "checkpoint cleanup: " << cleaned;
    }
  } else if (!renamed.ok()) {
    return renamed;
  }
  LOCKSTEP_LOG(INFO) << "checkpoint of step " << state.step << " committed to "
                     << storage_.Describe() << final_dir << " (" << manifest.total_bytes
                     << " bytes in " << world_size_ << " shards)";
  return OkStatus();
}

Status CheckpointWriter::WaitForShards(const std::string& temp_dir, const Manifest& manifest,
                                       Deadline deadline) {
  int64_t pause_ms = std::max<int64_t>(1, options_.poll_initial_ms);
  for (size_t rank = 1; rank < manifest.shards.size(); ++rank) {
    const ShardEntry& shard = manifest.shards[rank];
    const std::string path = JoinPath(temp_dir, shard.file);
    for (;;) {
      StatusOr<FileInfo> info = storage_.Stat(path, deadline);
      if (info.ok() && info->size_bytes == shard.bytes) break;
      if (!info.ok() && info.status().code() != StatusCode::kNotFound &&
          info.status().code() != StatusCode::kDeadlineExceeded) {
        return info.status();
      }
      if (deadline.remaining_ms() <= pause_ms) {
        return DeadlineExceededError("checkpoint step " + std::to_string(manifest.step) +
                                     ": rank " + std::to_string(rank) + " did not write " +
                                     shard.file + " in time");
      }
      // Polling stands in for a message from rank `rank`: the writers share nothing but storage.
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
      pause_ms = std::min(pause_ms * 2, std::max<int64_t>(1, options_.poll_max_ms));
    }
  }
  return OkStatus();
}

void CheckpointWriter::ApplyRetention(int64_t committed_step, Deadline deadline) {
  if (rank_ != 0) return;
  StatusOr<std::vector<FileInfo>> entries = storage_.List(root_, deadline);
  if (!entries.ok()) {
    LOCKSTEP_LOG(WARNING) << "checkpoint retention: " << entries.status();
    return;
  }
  RemoveInterruptedDeletions(storage_, root_, *entries, deadline);
  std::vector<int64_t> steps;
  for (const FileInfo& entry : *entries) {
    if (!entry.is_dir) continue;
    const std::optional<int64_t> temp_step = ParseTempDirName(entry.name);
    if (temp_step && *temp_step <= committed_step) {
      // An abandoned attempt: nothing will ever complete it.
      Status deleted = storage_.Delete(JoinPath(root_, entry.name), true, deadline);
      if (!deleted.ok() && deleted.code() != StatusCode::kNotFound) {
        LOCKSTEP_LOG(WARNING) << "checkpoint retention: " << deleted;
      }
    }
    if (const std::optional<int64_t> step = ParseStepDirName(entry.name)) steps.push_back(*step);
  }
  if (options_.keep <= 0) return;
  std::sort(steps.rbegin(), steps.rend());
  int valid_kept = 0;
  for (int64_t step : steps) {
    const std::string dir = JoinPath(root_, StepDirName(step));
    if (valid_kept >= options_.keep) {
      Status deleted = DeleteStepDir(storage_, root_, step, deadline);
      if (deleted.ok()) {
        LOCKSTEP_LOG(INFO) << "checkpoint retention: deleted " << dir;
      } else {
        LOCKSTEP_LOG(WARNING) << "checkpoint retention: " << deleted;
      }
      continue;
    }
    Status status = CheckStepDir(storage_, dir, VerifyLevel::kSizes, nullptr, nullptr, deadline);
    if (status.ok()) {
      ++valid_kept;
    } else if (status.code() != StatusCode::kDataLoss) {
      // Cannot tell whether it is valid: stop rather than delete what might be needed.
      LOCKSTEP_LOG(WARNING) << "checkpoint retention stopped: " << status;
      return;
    }
  }
}

}  // namespace lockstep::checkpoint
