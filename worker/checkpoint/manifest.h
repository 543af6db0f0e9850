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
