// The checkpoint format: what a checkpoint holds and where its parts lie.
//
// A checkpoint of step N under root R is the directory
//
//   R/step-<N zero-padded to 12>/
//     shard-<r>-of-<W>.bin   W shards: the byte ranges [floor(r*T/W), floor((r+1)*T/W)) of the
//                            state stream, the concatenation of every tensor's bytes in order
//                            (T bytes in all); written by rank r of a world of W
//     manifest.json          written last (manifest.h): step, epoch, data cursor, world size, RNG
//                            state, optimizer, each tensor's place in the stream, each shard's
//                            size and SHA-256
//
// It is assembled under R/.tmp-step-<N>-<attempt>/ and renamed into place once the manifest is
// there, so a directory named step-N is complete from its first appearance. Anything under a
// .tmp- name is an unfinished (or abandoned) write and is never read. Deleting runs the other way
// round (checkpoint_deletion.h): step-N is first renamed to .deleting-step-N, then deleted, so a
// process killed mid-delete never leaves a partial step-N behind.
//
// Optimizer state (momentum, Adam moments) travels as ordinary tensors (by convention named
// "optimizer/<parameter>"); OptimizerInfo records what they belong to.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::checkpoint {

struct NamedTensor {
  std::string name;            // unique within a checkpoint
  std::string dtype;           // one of DTypeSize's: "f32", "f16", "bf16", "i64", "i32", "u8", ...
  std::vector<int64_t> shape;  // bytes.size() == product of shape x DTypeSize(dtype)
  std::vector<uint8_t> bytes;  // the tensor's content, in the trainer's own layout
};

// Where the data order stands: the next sample is position `offset` of epoch `epoch`'s
// permutation.
struct DataCursor {
  int64_t epoch = 0;
  int64_t offset = 0;
};

struct OptimizerInfo {
  std::string type;  // "sgd", "adamw"
  int64_t step = 0;  // the optimizer's own step count (Adam's bias correction uses it)
};

// Everything a training job needs to continue from a step boundary.
struct CheckpointState {
  int64_t step = 0;
  int64_t epoch = 0;
  DataCursor cursor;
  std::string rng_state;  // opaque to the checkpoint
  OptimizerInfo optimizer;
  std::vector<NamedTensor> tensors;
};

// 2: the manifest carries manifest_sha256 (manifest.h). 3: shards are checked with XXH3-128
// instead of SHA-256 (checksum.h). Versions 1 and 2 are still read.
inline constexpr int kCheckpointFormatVersion = 3;
inline constexpr char kManifestFileName[] = "manifest.json";

// Bytes per element of a tensor dtype; 0 for a name that is not one.
int64_t DTypeSize(const std::string& dtype);

// "step-000000000500"
std::string StepDirName(int64_t step);
// The step of a "step-<digits>" name; nullopt for any other name.
std::optional<int64_t> ParseStepDirName(const std::string& name);
// "shard-1-of-4.bin"
std::string ShardFileName(int rank, int world_size);
// ".tmp-step-500-<attempt>"
std::string TempDirName(int64_t step, const std::string& attempt_id);
// The step of a ".tmp-step-<N>-..." name; nullopt for any other name.
std::optional<int64_t> ParseTempDirName(const std::string& name);
// ".deleting-step-000000000500": where step-000000000500 goes while it is deleted.
std::string DeletingDirName(int64_t step);
// Whether `name` is a ".deleting-..." name.
bool IsDeletingDirName(const std::string& name);

}  // namespace lockstep::checkpoint
