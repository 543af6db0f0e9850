// CheckpointWriter: writes one checkpoint (checkpoint.h) from every rank of a data-parallel job.
//
// In data parallelism every rank holds the same full state, so the ranks split the writing
// without talking to each other:
//   - rank r writes shard r of W into R/.tmp-step-<N>-<attempt>/;
//   - rank 0, which can compute every shard's size and SHA-256 from its own copy, waits until each
//     shard exists with its size (polling Stat with back-off, bounded by the deadline), writes
//     manifest.json, renames the directory to R/step-<N>, then applies retention.
// Ranks other than 0 return once their shard is written; only rank 0's OK means "committed".
//
// A pipeline's ranks hold different tensors (a stage's layers each), so its checkpoint is
// written in parts (options.parts; manifest.h): the writer of part p (one rank per stage) writes
// its tensors as shard p, hashes them and leaves the checksum beside the shard
// (ShardChecksumFileName); rank 0 waits for every part's checksum file, checks the shard's size
// and builds the manifest from the parts' tables and those checksums. Nothing but storage passes
// between the writers either way.
//
//   CheckpointWriter writer(*storage, "/ckpt/job", rank, world_size, {.keep = 3,
//                           .attempt_id = "g" + std::to_string(generation)});
//   LOCKSTEP_RETURN_IF_ERROR(writer.Write(state, Deadline::AfterMs(600000)));
//
// Retention (rank 0, after a commit): keeps the newest `keep` valid checkpoints (valid: manifest
// parses and every shard has its size; checksums are not read here), deletes every step
// directory older than the oldest kept one, and every .tmp- directory of a step not newer than the
// committed one. Damaged directories newer than that are left for inspection. Step directories
// are deleted through DeleteStepDir (renamed to .deleting- first, checkpoint_deletion.h), so a
// kill mid-delete never leaves a partial step-<N>; leftover .deleting- directories are removed.
// Retention failures are logged, never returned: the checkpoint is committed.
//
// Not thread-safe: one Write at a time per writer (AsyncCheckpointer guarantees it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/storage/storage.h"

namespace lockstep::checkpoint {

struct CheckpointWriterOptions {
  // Checkpoints retained; 0 keeps every one.
  int keep = 3;
  // Names the temporary directory; must be the same on every rank of one write and differ
  // between attempts that could leave different bytes behind (the rendezvous generation is a
  // good choice). A retry of the same snapshot may reuse it: its shards are rewritten.
  std::string attempt_id = "0";
  // Rank 0's polling for the other ranks' shards: first and largest pause.
  int64_t poll_initial_ms = 10;
  int64_t poll_max_ms = 500;
  // A checkpoint written in parts: every part's tensors (names, dtypes, shapes), in part order.
  // This writer's `rank` is then its part and `world_size` their number, and the state it writes
  // holds its own part's tensors only. Empty: every rank holds the whole state and writes the
  // byte range of its shard.
  std::vector<std::vector<TensorEntry>> parts = {};
};

class CheckpointWriter {
 public:
  // `storage` must outlive the writer. `root` is an absolute path in `storage`.
  CheckpointWriter(Storage& storage, std::string root, int rank, int world_size,
                   CheckpointWriterOptions options = {});

  // Writes `state` as step state.step (see the file comment for the split between ranks), then
  // applies retention: Commit, then ApplyRetention.
  Status Write(const CheckpointState& state, Deadline deadline);

  // The write alone: OK means committed (rank 0) or this rank's shard written (the others).
  // Blocks until done or `deadline`. A step that is already committed (and valid) is OK.
  // Errors: the storage's (UNAVAILABLE after its own retries, PERMISSION_DENIED, ...), or
  // DEADLINE_EXCEEDED naming the shard rank 0 still waits for.
  Status Commit(const CheckpointState& state, Deadline deadline);

  // Retention after `committed_step` was committed (rank 0; nothing on the other ranks). It is
  // housekeeping, not part of making the checkpoint durable, so callers time it apart (and may
  // run it later). Failures are logged, never returned: the checkpoint is committed.
  void ApplyRetention(int64_t committed_step, Deadline deadline);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::string& root() const { return root_; }

 private:
  // Rank 0: until every other shard is in `temp_dir` with its size and, for a checkpoint written
  // in parts, its checksum file, whose checksums it then fills into `manifest`.
  Status WaitForShards(const std::string& temp_dir, Manifest& manifest, Deadline deadline);
  bool parted() const { return !options_.parts.empty(); }

  Storage& storage_;
  std::string root_;
  int rank_;
  int world_size_;
  CheckpointWriterOptions options_;
};

}  // namespace lockstep::checkpoint
