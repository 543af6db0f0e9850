#include "worker/checkpoint/checkpoint_writer.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include "common/logging.h"
#include "worker/checkpoint/checkpoint_deletion.h"
#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/checkpoint/checksum.h"

namespace lockstep::checkpoint {
namespace {

// Whether two manifests list the same tensors (names, dtypes, shapes), in whatever order: a
// step written by a pipeline of another depth holds the same state. With `parted`, the sample
// counts are left out: only the writer of the part that holds them knows whether it keeps them,
// and every writer must come to the same verdict.
bool SameTensors(const Manifest& a, const Manifest& b, bool parted) {
  auto table = [parted](const Manifest& m) {
    std::map<std::string, std::pair<std::string, std::vector<int64_t>>> tensors;
    for (const TensorEntry& t : m.tensors) {
      if (!parted || t.name != "accounting/sample_counts") tensors[t.name] = {t.dtype, t.shape};
    }
    return tensors;
  };
  return table(a) == table(b);
}

// Whether `table` lists the same tensors as `expected`, in order; the first difference otherwise.
std::string PartMismatch(const std::vector<TensorEntry>& table,
                         const std::vector<TensorEntry>& expected) {
  for (size_t i = 0; i < std::max(table.size(), expected.size()); ++i) {
    if (i >= table.size()) return "it lacks tensor '" + expected[i].name + "'";
    if (i >= expected.size()) return "it has tensor '" + table[i].name + "' beyond the part's";
    const TensorEntry& x = table[i];
    const TensorEntry& y = expected[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape) {
      return "its tensor " + std::to_string(i) + " is '" + x.name + "' " + x.dtype +
             ShapeText(x.shape) + ", the part's '" + y.name + "' " + y.dtype + ShapeText(y.shape);
    }
  }
  return "";
}

// A checksum file's content: the hex and a newline, nothing else. Shorter is a file still being
// written in place (as on HDFS): nullopt, wait. Anything else is DATA_LOSS naming `path`.
StatusOr<std::optional<std::string>> ParseChecksumFile(const std::vector<uint8_t>& bytes,
                                                       const std::string& path) {
  const std::string text(bytes.begin(), bytes.end());
  const size_t digits = ShardChecksumHex(ShardChecksumOf(kCheckpointFormatVersion), "", 0).size();
  if (text.size() < digits + 1) return std::optional<std::string>();
  if (text.size() != digits + 1 || text.back() != '\n' ||
      text.find_first_not_of("0123456789abcdef") != digits) {
    return DataLossError(path + ": not a checksum (" + std::to_string(digits) +
                         " hex digits and a newline)");
  }
  return std::optional<std::string>(text.substr(0, digits));
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

  if (parted()) {
    if (options_.parts.size() != static_cast<size_t>(world_size_)) {
      return InvalidArgumentError("checkpoint writer: " + std::to_string(options_.parts.size()) +
                                  " parts for " + std::to_string(world_size_) + " writers");
    }
    const std::string mismatch =
        PartMismatch(TensorTable(state), options_.parts[static_cast<size_t>(rank_)]);
    if (!mismatch.empty()) {
      return InvalidArgumentError("checkpoint step " + std::to_string(state.step) + ": part " +
                                  std::to_string(rank_) + "'s state does not match: " + mismatch);
    }
  }
  Manifest manifest = parted() ? BuildPartedManifest(state, options_.parts)
                               : BuildManifest(state, world_size_, /*hash_shards=*/false);
  if (Status table = CheckTensorTable(manifest); !table.ok()) {
    return InvalidArgumentError("checkpoint step " + std::to_string(state.step) + ": " +
                                table.message());
  }
  // This rank's shard, as a range of the state it holds: the state's own stream is a part's
  // (from byte 0) when written in parts, else the whole one.
  ShardEntry own_shard = manifest.shards[static_cast<size_t>(rank_)];
  if (parted()) own_shard.offset = 0;

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
    if (verified.ok() && SameTensors(committed, manifest, parted())) return OkStatus();
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
  // Rank 0 needs every checksum (for the manifest): it hashes the whole state, or in parts its
  // own, the others hashing theirs. Hashing runs on a helper thread while the rank writes its
  // shard (and rank 0 waits for the others'), so a persist costs the longer of hashing and
  // writing, not their sum.
  std::vector<std::string> hashes;
  std::thread hasher;
  if (parted()) {
    hasher = std::thread([&] { hashes = HashShards(state, BuildManifest(state, 1, false)); });
  } else if (rank_ == 0) {
    hasher = std::thread([&] { hashes = HashShards(state, manifest); });
  }
  Status written;
  if (rank_ == 0) {
    // The manifest's name is created now, empty, so that the directory sync below, which runs
    // while the shards are still being hashed, covers it too: once the hashes are known, only
    // its content remains to be written and synced before the rename.
    written = storage_.Write(manifest_path, "", manifest_options, deadline);
  }
  if (written.ok()) {
    // Written straight from the snapshot's tensors: no gathered copy of the shard.
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
  if (parted() && rank_ != 0) {
    // After the shard, so that rank 0, which waits for this file, finds the shard whole.
    WriteOptions checksum_options;
    checksum_options.overwrite = true;
    checksum_options.sync_directory = false;
    return storage_
        .Write(JoinPath(temp_dir, ShardChecksumFileName(own_shard.file)), hashes[0] + "\n",
               checksum_options, deadline)
        .WithContext("checkpoint step " + std::to_string(state.step));
  }
  if (rank_ != 0) return OkStatus();
  if (parted()) {
    manifest.shards[0].checksum = hashes[0];
  } else {
    for (size_t rank = 0; rank < hashes.size(); ++rank) {
      manifest.shards[rank].checksum = hashes[rank];
    }
  }

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

Status CheckpointWriter::WaitForShards(const std::string& temp_dir, Manifest& manifest,
                                       Deadline deadline) {
  int64_t pause_ms = std::max<int64_t>(1, options_.poll_initial_ms);
  // Whether the shard is there whole: its checksum file written (parts), then its size.
  auto arrived = [&](ShardEntry& shard) -> StatusOr<bool> {
    if (parted()) {
      const std::string path = JoinPath(temp_dir, ShardChecksumFileName(shard.file));
      // A checksum file is a line; more than a page is not one.
      StatusOr<std::vector<uint8_t>> text = storage_.Read(path, 0, 4096, deadline);
      if (!text.ok()) return text.status();
      LOCKSTEP_ASSIGN_OR_RETURN(std::optional<std::string> checksum,
                                ParseChecksumFile(*text, path));
      if (!checksum) return false;
      shard.checksum = *checksum;
    }
    LOCKSTEP_ASSIGN_OR_RETURN(FileInfo info,
                              storage_.Stat(JoinPath(temp_dir, shard.file), deadline));
    return info.size_bytes == shard.bytes;
  };
  for (size_t rank = 1; rank < manifest.shards.size(); ++rank) {
    ShardEntry& shard = manifest.shards[rank];
    for (;;) {
      StatusOr<bool> there = arrived(shard);
      if (there.ok() && *there) break;
      if (!there.ok() && there.status().code() != StatusCode::kNotFound &&
          there.status().code() != StatusCode::kDeadlineExceeded) {
        return there.status();
      }
      if (deadline.remaining_ms() <= pause_ms) {
        return DeadlineExceededError("checkpoint step " + std::to_string(manifest.step) + ": " +
                                     (parted() ? "the writer of part " : "rank ") +
                                     std::to_string(rank) + " did not write " + shard.file +
                                     (parted() ? " and its checksum" : "") + " in time");
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
