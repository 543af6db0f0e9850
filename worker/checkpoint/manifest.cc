#include "worker/checkpoint/manifest.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "worker/checkpoint/checksum.h"

namespace lockstep::checkpoint {

int64_t DTypeSize(const std::string& dtype) {
  static const std::map<std::string, int64_t> kSizes = {
      {"f64", 8}, {"f32", 4}, {"f16", 2}, {"bf16", 2}, {"i64", 8}, {"i32", 4},
      {"i16", 2}, {"i8", 1},  {"u8", 1},  {"bool", 1}};
  auto found = kSizes.find(dtype);
  return found == kSizes.end() ? 0 : found->second;
}

std::string StepDirName(int64_t step) {
  char name[40];
  std::snprintf(name, sizeof(name), "step-%012" PRId64, step);
  return name;
}

namespace {

std::optional<int64_t> ParseDigits(const std::string& text) {
  if (text.empty() || text.size() > 18 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(text);
}

}  // namespace

std::optional<int64_t> ParseStepDirName(const std::string& name) {
  static const std::string kPrefix = "step-";
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return std::nullopt;
  return ParseDigits(name.substr(kPrefix.size()));
}

std::string ShardFileName(int rank, int world_size) {
  return "shard-" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".bin";
}

std::string TempDirName(int64_t step, const std::string& attempt_id) {
  return ".tmp-step-" + std::to_string(step) + "-" + attempt_id;
}

std::optional<int64_t> ParseTempDirName(const std::string& name) {
  static const std::string kPrefix = ".tmp-step-";
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return std::nullopt;
  const size_t dash = name.find('-', kPrefix.size());
  return ParseDigits(name.substr(
      kPrefix.size(), dash == std::string::npos ? std::string::npos : dash - kPrefix.size()));
}

std::string DeletingDirName(int64_t step) { return ".deleting-" + StepDirName(step); }

bool IsDeletingDirName(const std::string& name) { return name.rfind(".deleting-", 0) == 0; }

std::string UtcTimestampNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc;
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

Manifest BuildManifest(const CheckpointState& state, int world_size, bool hash_shards) {
  Manifest manifest;
  manifest.step = state.step;
  manifest.epoch = state.epoch;
  manifest.cursor = state.cursor;
  manifest.world_size = world_size;
  manifest.rng_state = state.rng_state;
  manifest.optimizer = state.optimizer;
  manifest.created_at = UtcTimestampNow();
  manifest.lockstep_version = LOCKSTEP_VERSION;
  manifest.tensors = TensorTable(state);
  manifest.total_bytes =
      manifest.tensors.empty() ? 0 : manifest.tensors.back().offset + manifest.tensors.back().bytes;
  for (int rank = 0; rank < world_size; ++rank) {
    ShardEntry shard;
    shard.file = ShardFileName(rank, world_size);
    shard.offset = manifest.total_bytes * rank / world_size;
    shard.bytes = manifest.total_bytes * (rank + 1) / world_size - shard.offset;
    manifest.shards.push_back(shard);
  }
  if (hash_shards) {
    std::vector<std::string> hashes = HashShards(state, manifest);
    for (int rank = 0; rank < world_size; ++rank) {
      manifest.shards[rank].checksum = std::move(hashes[rank]);
    }
  }
  return manifest;
}

std::vector<TensorEntry> TensorTable(const CheckpointState& state) {
  std::vector<TensorEntry> table;
  int64_t offset = 0;
  for (const NamedTensor& tensor : state.tensors) {
    const auto size = static_cast<int64_t>(tensor.bytes.size());
    table.push_back({tensor.name, tensor.dtype, tensor.shape, offset, size});
    offset += size;
  }
  return table;
}

Manifest BuildPartedManifest(const CheckpointState& state,
                             const std::vector<std::vector<TensorEntry>>& parts) {
  CheckpointState metadata;
  metadata.step = state.step;
  metadata.epoch = state.epoch;
  metadata.cursor = state.cursor;
  metadata.rng_state = state.rng_state;
  metadata.optimizer = state.optimizer;
  const int count = static_cast<int>(parts.size());
  Manifest manifest = BuildManifest(metadata, count, /*hash_shards=*/false);
  manifest.stages = count;
  int64_t offset = 0;
  for (int part = 0; part < count; ++part) {
    ShardEntry& shard = manifest.shards[static_cast<size_t>(part)];
    shard.offset = offset;
    for (const TensorEntry& tensor : parts[static_cast<size_t>(part)]) {
      manifest.tensors.push_back({tensor.name, tensor.dtype, tensor.shape, offset, tensor.bytes});
      offset += tensor.bytes;
    }
    shard.bytes = offset - shard.offset;
  }
  manifest.total_bytes = offset;
  return manifest;
}

std::string ShardChecksumFileName(const std::string& shard_file) {
  return shard_file + "." + ShardChecksumField(ShardChecksumOf(kCheckpointFormatVersion));
}

std::vector<std::string> HashShards(const CheckpointState& state, const Manifest& manifest) {
  // One pass over the tensors, feeding each byte to the shard that holds it.
  const ShardChecksum kind = ShardChecksumOf(manifest.format_version);
  std::vector<std::unique_ptr<ShardHasher>> hashers;
  for (size_t rank = 0; rank < manifest.shards.size(); ++rank) {
    hashers.push_back(std::make_unique<ShardHasher>(kind));
  }
  size_t shard_index = 0;
  int64_t position = 0;
  for (const NamedTensor& tensor : state.tensors) {
    size_t done = 0;
    while (done < tensor.bytes.size()) {
      while (position >= manifest.shards[shard_index].offset + manifest.shards[shard_index].bytes)
        ++shard_index;
      const ShardEntry& shard = manifest.shards[shard_index];
      const size_t take = std::min<size_t>(
          tensor.bytes.size() - done, static_cast<size_t>(shard.offset + shard.bytes - position));
      hashers[shard_index]->Update(tensor.bytes.data() + done, take);
      done += take;
      position += static_cast<int64_t>(take);
    }
  }
  std::vector<std::string> hashes;
  for (const auto& hasher : hashers) hashes.push_back(hasher->FinishHex());
  return hashes;
}

std::vector<std::string_view> ShardPieces(const CheckpointState& state, const ShardEntry& shard) {
  std::vector<std::string_view> pieces;
  const int64_t end = shard.offset + shard.bytes;
  int64_t tensor_offset = 0;
  for (const NamedTensor& tensor : state.tensors) {
    const int64_t tensor_end = tensor_offset + static_cast<int64_t>(tensor.bytes.size());
    const int64_t from = std::max(shard.offset, tensor_offset);
    const int64_t to = std::min(end, tensor_end);
    if (from < to) {
      pieces.emplace_back(
          reinterpret_cast<const char*>(tensor.bytes.data()) + (from - tensor_offset),
          static_cast<size_t>(to - from));
    }
    tensor_offset = tensor_end;
  }
  return pieces;
}

namespace {

constexpr char kManifestChecksumField[] = "manifest_sha256";

// The SHA-256 of `json` (without the checksum field) in its compact form; nlohmann::json keeps
// object keys sorted, so the text is the same whether built here or parsed from a file.
std::string ManifestChecksum(const nlohmann::json& json) {
  const std::string text = json.dump();
  return Sha256Hex(reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

}  // namespace

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

Status CheckTensorTable(const Manifest& manifest) {
  std::set<std::string> names;
  int64_t end = 0;
  for (const TensorEntry& tensor : manifest.tensors) {
    const std::string where = "tensor '" + tensor.name + "'";
    if (tensor.name.empty()) return DataLossError("a tensor has an empty name");
    if (!names.insert(tensor.name).second) return DataLossError(where + " appears twice");
    const int64_t element = DTypeSize(tensor.dtype);
    if (element == 0) return DataLossError(where + " has unknown dtype '" + tensor.dtype + "'");
    // The product is bounded by the state's size as it grows, so it cannot overflow.
    int64_t expected = element;
    for (int64_t dim : tensor.shape) {
      if (dim < 0) return DataLossError(where + " has shape " + ShapeText(tensor.shape));
      if (dim != 0 && expected > manifest.total_bytes / dim) {
        expected = -1;
        break;
      }
      expected *= dim;
    }
    if (expected != tensor.bytes) {
      return DataLossError(where + " holds " + std::to_string(tensor.bytes) + " bytes; its shape " +
                           ShapeText(tensor.shape) + " of " + tensor.dtype + " needs " +
                           (expected < 0 ? "more than the state" : std::to_string(expected)));
    }
    if (tensor.offset != end) {
      return DataLossError(where + " begins at byte " + std::to_string(tensor.offset) +
                           ", the previous one ends at " + std::to_string(end) +
                           " (tensors must follow each other without overlap or gap)");
    }
    end += tensor.bytes;
  }
  if (end != manifest.total_bytes) {
    return DataLossError("the tensors cover " + std::to_string(end) + " of the state's " +
                         std::to_string(manifest.total_bytes) + " bytes");
  }
  return OkStatus();
}

std::string SerializeManifest(const Manifest& manifest) {
  nlohmann::json json;
  json["format_version"] = manifest.format_version;
  json["step"] = manifest.step;
  json["epoch"] = manifest.epoch;
  json["data_cursor"] = {{"epoch", manifest.cursor.epoch}, {"offset", manifest.cursor.offset}};
  json["world_size"] = manifest.world_size;
  // Only a pipeline's: a data-parallel manifest is what it always was.
  if (manifest.stages != 1) json["stages"] = manifest.stages;
  json["rng_state"] = manifest.rng_state;
  json["optimizer"] = {{"type", manifest.optimizer.type}, {"step", manifest.optimizer.step}};
  json["total_bytes"] = manifest.total_bytes;
  json["tensors"] = nlohmann::json::array();
  for (const TensorEntry& tensor : manifest.tensors) {
    json["tensors"].push_back({{"name", tensor.name},
                               {"dtype", tensor.dtype},
                               {"shape", tensor.shape},
                               {"offset", tensor.offset},
                               {"bytes", tensor.bytes}});
  }
  json["shards"] = nlohmann::json::array();
  const char* checksum_field = ShardChecksumField(ShardChecksumOf(manifest.format_version));
  for (const ShardEntry& shard : manifest.shards) {
    json["shards"].push_back({{"file", shard.file},
                              {"offset", shard.offset},
                              {"bytes", shard.bytes},
                              {checksum_field, shard.checksum}});
  }
  json["created_at"] = manifest.created_at;
  json["lockstep_version"] = manifest.lockstep_version;
  if (manifest.format_version >= 2) json[kManifestChecksumField] = ManifestChecksum(json);
  return json.dump(1);
}

namespace {

// Reads field `key` of `object` into `out`, or throws a message naming the field.
template <typename T>
void Field(const nlohmann::json& object, const char* key, T* out, const std::string& where) {
  if (!object.is_object() || !object.contains(key)) {
    throw std::runtime_error("missing field '" + where + key + "'");
  }
  try {
    *out = object.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw std::runtime_error("field '" + where + key + "' has the wrong type");
  }
}

}  // namespace

StatusOr<Manifest> ParseManifest(std::string_view text) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    // parse_error::byte is the 1-based position where parsing failed.
    const bool at_end = e.byte >= text.size();
    return DataLossError(std::string(at_end ? "truncated JSON" : "malformed JSON") + " at byte " +
                         std::to_string(e.byte) + " of " + std::to_string(text.size()));
  }
  Manifest manifest;
  try {
    Field(json, "format_version", &manifest.format_version, "");
    if (manifest.format_version < 1 || manifest.format_version > kCheckpointFormatVersion) {
      return DataLossError("format_version " + std::to_string(manifest.format_version) +
                           " is not supported (this build reads 1 to " +
                           std::to_string(kCheckpointFormatVersion) + ")");
    }
    if (manifest.format_version >= 2) {
      std::string recorded;
      Field(json, kManifestChecksumField, &recorded, "");
      json.erase(kManifestChecksumField);
      const std::string computed = ManifestChecksum(json);
      if (recorded != computed) {
        return DataLossError(std::string(kManifestChecksumField) + " mismatch (recorded " +
                             recorded.substr(0, 16) + "..., content " + computed.substr(0, 16) +
                             "...): the manifest was changed after it was written");
      }
    }
    Field(json, "step", &manifest.step, "");
    Field(json, "epoch", &manifest.epoch, "");
    if (!json.contains("data_cursor")) throw std::runtime_error("missing field 'data_cursor'");
    Field(json["data_cursor"], "epoch", &manifest.cursor.epoch, "data_cursor.");
    Field(json["data_cursor"], "offset", &manifest.cursor.offset, "data_cursor.");
    Field(json, "world_size", &manifest.world_size, "");
    if (json.contains("stages")) Field(json, "stages", &manifest.stages, "");
    if (manifest.stages < 1 || (manifest.stages > 1 && manifest.stages != manifest.world_size)) {
      throw std::runtime_error("stages " + std::to_string(manifest.stages) +
                               " does not match world size " + std::to_string(manifest.world_size) +
                               " (each stage writes one shard)");
    }
    Field(json, "rng_state", &manifest.rng_state, "");
    if (!json.contains("optimizer")) throw std::runtime_error("missing field 'optimizer'");
    Field(json["optimizer"], "type", &manifest.optimizer.type, "optimizer.");
    Field(json["optimizer"], "step", &manifest.optimizer.step, "optimizer.");
    Field(json, "total_bytes", &manifest.total_bytes, "");
    Field(json, "created_at", &manifest.created_at, "");
    Field(json, "lockstep_version", &manifest.lockstep_version, "");
    if (!json.contains("tensors") || !json["tensors"].is_array()) {
      throw std::runtime_error("missing field 'tensors'");
    }
    for (const nlohmann::json& entry : json["tensors"]) {
      TensorEntry tensor;
      Field(entry, "name", &tensor.name, "tensors[].");
      Field(entry, "dtype", &tensor.dtype, "tensors[].");
      Field(entry, "shape", &tensor.shape, "tensors[].");
      Field(entry, "offset", &tensor.offset, "tensors[].");
      Field(entry, "bytes", &tensor.bytes, "tensors[].");
      if (tensor.offset < 0 || tensor.bytes < 0 ||
          tensor.offset > manifest.total_bytes - tensor.bytes) {
        throw std::runtime_error("tensor '" + tensor.name + "' lies outside the state");
      }
      manifest.tensors.push_back(std::move(tensor));
    }
    if (Status table = CheckTensorTable(manifest); !table.ok()) return table;
    if (!json.contains("shards") || !json["shards"].is_array()) {
      throw std::runtime_error("missing field 'shards'");
    }
    int64_t covered = 0;
    const char* checksum_field = ShardChecksumField(ShardChecksumOf(manifest.format_version));
    for (const nlohmann::json& entry : json["shards"]) {
      ShardEntry shard;
      Field(entry, "file", &shard.file, "shards[].");
      Field(entry, "offset", &shard.offset, "shards[].");
      Field(entry, "bytes", &shard.bytes, "shards[].");
      Field(entry, checksum_field, &shard.checksum, "shards[].");
      if (shard.offset != covered || shard.bytes < 0 || shard.file.empty() ||
          shard.file.find('/') != std::string::npos) {
        throw std::runtime_error("shard '" + shard.file +
                                 "' does not continue the state where the previous one ended");
      }
      covered += shard.bytes;
      manifest.shards.push_back(std::move(shard));
    }
    if (covered != manifest.total_bytes ||
        static_cast<int>(manifest.shards.size()) != manifest.world_size) {
      throw std::runtime_error("shards do not cover the state (" + std::to_string(covered) +
                               " of " + std::to_string(manifest.total_bytes) + " bytes in " +
                               std::to_string(manifest.shards.size()) + " shards for world size " +
                               std::to_string(manifest.world_size) + ")");
    }
  } catch (const std::runtime_error& e) {
    return DataLossError(e.what());
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(std::string("inconsistent manifest: ") + e.what());
  }
  return manifest;
}

}  // namespace lockstep::checkpoint
