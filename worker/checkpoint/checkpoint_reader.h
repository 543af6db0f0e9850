// Reading and checking checkpoints (format: checkpoint.h, manifest.h).
//
// A checkpoint is damaged when its manifest is missing, does not parse or fails its own checks
// (its checksum, its tensor table: manifest.h), or a shard is missing, has the wrong size or the
// wrong SHA-256. Damage is reported as DATA_LOSS with a message naming
// the part:
//
//   step-000000000300/shard-1-of-2.bin: xxh3_128 mismatch (manifest 9f86..., file 2c26...)
//   step-000000000300/manifest.json: truncated JSON at byte 120 of 120
//   step-000000000300: missing shard-2-of-4.bin
//
// Any other error (storage unavailable, permission denied) is returned as it is and says nothing
// about the checkpoint: LoadNewestValid never skips a checkpoint because storage was down.
//
// All functions are thread-safe as far as the Storage is; each blocks at most until its deadline.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/storage/storage.h"

namespace lockstep::checkpoint {

enum class VerifyLevel {
  kSizes,      // manifest parses, every shard exists with its size (reads only the manifest)
  kChecksums,  // and every shard's SHA-256 matches (reads every byte)
};

struct CheckpointInfo {
  int64_t step = 0;
  std::string dir;  // absolute path of step-<N>
  bool valid = false;
  std::string problem;  // why not valid
  // From the manifest, when it parsed:
  int world_size = 0;
  int stages = 1;  // pipeline stages that wrote it
  int64_t total_bytes = 0;
  std::string created_at;
};

// Every step-<N> directory under `root`, oldest first, each checked at `level`. An absent root
// is an empty list. ListCheckpoints and LoadNewestValid also finish deletes that a killed process
// left as .deleting- directories (checkpoint_deletion.h; best effort, failures only logged).
StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(Storage& storage, const std::string& root,
                                                      VerifyLevel level, Deadline deadline);

// Checks the checkpoint of `step` (default: the newest step directory, valid or not) with
// checksums. OK, DATA_LOSS naming the damaged part, NOT_FOUND when there is no such checkpoint.
Status VerifyCheckpoint(Storage& storage, const std::string& root, std::optional<int64_t> step,
                        Deadline deadline);

struct SkippedCheckpoint {
  int64_t step = 0;
  std::string problem;
};

struct LoadedCheckpoint {
  CheckpointState state;
  Manifest manifest;
  std::string dir;
  std::vector<SkippedCheckpoint> skipped;  // newer checkpoints found damaged, newest first
};

// The steps of every step-<N> directory under `root`, newest first, unchecked (finishing
// interrupted deletes, as ListCheckpoints does). NOT_FOUND when `root` does not exist.
StatusOr<std::vector<int64_t>> StepsNewestFirst(Storage& storage, const std::string& root,
                                                Deadline deadline);

// What a loader requires of a checkpoint beyond its own consistency, e.g. that its tensors are
// the model's (same names, dtypes and shapes): OK, or the mismatch in words. A checkpoint it
// rejects is treated as damaged (skipped and named), before any shard is read.
using ManifestCheck = std::function<Status(const Manifest&)>;

// Loads the newest checkpoint that verifies with checksums and passes `accept` (when given),
// logging (WARNING) and listing every newer one it skipped as damaged or rejected. NOT_FOUND when
// none is valid (the message lists the damage).
StatusOr<LoadedCheckpoint> LoadNewestValid(Storage& storage, const std::string& root,
                                           Deadline deadline, const ManifestCheck& accept = {});

// Reads the tensors named in `wanted` from the checkpoint in `dir` that `manifest` describes (as
// CheckStepDir gave it): only the shards holding their bytes are read, each checked against its
// size and checksum. A pipeline stage reads its layers this way, from a checkpoint written by any
// number of stages. The state carries the manifest's metadata and those tensors, in the
// manifest's order. DATA_LOSS naming a damaged shard, NOT_FOUND naming a tensor the checkpoint
// lacks, or the storage's errors.
StatusOr<CheckpointState> ReadTensors(Storage& storage, const std::string& dir,
                                      const Manifest& manifest, const std::set<std::string>& wanted,
                                      Deadline deadline);

// Checks the step directory `dir` at `level` (and with `accept`, when given). On success fills
// `manifest` and, when `state` is given (requires kChecksums), the tensors and metadata read back.
Status CheckStepDir(Storage& storage, const std::string& dir, VerifyLevel level, Manifest* manifest,
                    CheckpointState* state, Deadline deadline, const ManifestCheck& accept = {});

}  // namespace lockstep::checkpoint
