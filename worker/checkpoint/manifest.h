// manifest.json: the record that makes a checkpoint directory readable and checkable.
//
//   {"format_version": 3, "step": 500, "epoch": 1, "data_cursor": {"epoch": 1, "offset": 3200},
//    "world_size": 2, "rng_state": "...", "optimizer": {"type": "sgd", "step": 500},
//    "total_bytes": 1048576,
//    "tensors": [{"name": "w0", "dtype": "f32", "shape": [784, 256], "offset": 0,
//                 "bytes": 802816}, ...],
//    "shards": [{"file": "shard-0-of-2.bin", "offset": 0, "bytes": 524288,
//                "xxh3_128": "9f86d0..."}, ...],
//    "created_at": "2026-11-21T21:50:03Z", "lockstep_version": "0.1.0",
//    "manifest_sha256": "c0ffee..."}
//
// A pipeline's checkpoint adds "stages": P (absent: 1). Its shards are not an even split of the
// stream but the stages' parts: shard s holds stage s's tensors (stage 0's also the trainer's),
// written by that stage of replica 0, so world_size (the writers) is P. Tensors are named by
// layer either way, so a reader takes them by name whatever wrote them: a checkpoint written with
// P stages resumes with any other number, data parallelism included, and older readers read it.
//
// Tensor and shard offsets are positions in the state stream (checkpoint.h): tensors cover it
// contiguously in order, and so do shards in rank order. Each shard carries the checksum of its
// bytes (checksum.h: "xxh3_128" from format 3, "sha256" before). manifest_sha256 is the SHA-256
// of the manifest's JSON without that field, compact (nlohmann::json::dump(), keys sorted), so
// any edit of the manifest after it was written is detected (in the manner of PyTorch DCP's
// checked metadata).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "worker/checkpoint/checkpoint.h"

namespace lockstep::checkpoint {

struct TensorEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in the state stream
  int64_t bytes = 0;
};

struct ShardEntry {
  std::string file;
  int64_t offset = 0;  // in the state stream
  int64_t bytes = 0;
  std::string checksum;  // lowercase hex, of the manifest's ShardChecksumOf(format_version)
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;
  int64_t epoch = 0;
  DataCursor cursor;
  int world_size = 1;
  int stages = 1;  // pipeline stages that wrote it (shard s: stage s), 1 without a pipeline
  std::string rng_state;
  OptimizerInfo optimizer;
  int64_t total_bytes = 0;
  std::vector<TensorEntry> tensors;
  std::vector<ShardEntry> shards;
  std::string created_at;  // UTC, ISO 8601
  std::string lockstep_version;
};

// The manifest of `state` split over `world_size` shards. With `hash_shards` every shard's
// checksum is computed (reads the whole state once); otherwise it stays empty.
Manifest BuildManifest(const CheckpointState& state, int world_size, bool hash_shards);

// The manifest of a checkpoint written in parts (a pipeline's stages): part p holds the tensors
// `parts[p]` lists (names, dtypes and shapes; their offsets are recomputed), in that order, and is
// shard p of parts.size(); `stages` is parts.size(). Metadata from `state`; checksums empty.
Manifest BuildPartedManifest(const CheckpointState& state,
                             const std::vector<std::vector<TensorEntry>>& parts);

// The tensor entries of `state`, in order, offsets from 0 (the table of a part, or of a whole
// state).
std::vector<TensorEntry> TensorTable(const CheckpointState& state);

// "shard-1-of-4.bin.xxh3_128": the file in which the writer of a part leaves its shard's
// checksum for rank 0, which builds the manifest (checkpoint_writer.h); left in the checkpoint.
std::string ShardChecksumFileName(const std::string& shard_file);

// The checksum (lowercase hex) of each shard of `manifest`, which must have been built from
// `state`; one pass over the state.
std::vector<std::string> HashShards(const CheckpointState& state, const Manifest& manifest);

// Shard `shard`'s bytes as slices of the tensors, in order (for Storage::WritePieces; no copy).
// Valid while `state` is unchanged.
std::vector<std::string_view> ShardPieces(const CheckpointState& state, const ShardEntry& shard);

std::string SerializeManifest(const Manifest& manifest);

// DATA_LOSS naming the problem ("truncated JSON at byte 120", "missing field 'shards'",
// "manifest_sha256 mismatch", "tensor 'w1' begins at byte 40, the previous one ends at 64") for
// anything that is not a consistent manifest: its checksum, and its tensor table against itself
// (CheckTensorTable). The one check that `ckpt verify`, `ckpt ls` and the loader share.
StatusOr<Manifest> ParseManifest(std::string_view text);

// The tensor table's own consistency: names non-empty and unique, known dtypes, bytes = product
// of shape x dtype size, tensors contiguous from byte 0 to total_bytes. DATA_LOSS naming the
// first tensor that breaks it. The writer checks a state's table the same way before writing.
Status CheckTensorTable(const Manifest& manifest);

// "[784,256]": a tensor's shape as messages name it.
std::string ShapeText(const std::vector<int64_t>& shape);

// "2026-11-21T21:50:03Z" for now.
std::string UtcTimestampNow();

}  // namespace lockstep::checkpoint
