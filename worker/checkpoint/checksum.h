// Checksums of checkpoint files, as lowercase hex.
//
// A shard's bytes are checked with XXH3-128 (format 3): the checksum guards against storage that
// loses or changes bytes, not against someone who can write the directory (they could rewrite
// the manifest and its own checksum too), so it needs no cryptographic hash. XXH3 runs at memory
// speed (about 10 GB/s on one core here, against 1.5 GB/s for SHA-256 with SHA-NI), and rank 0
// hashes the whole state on every checkpoint. The hex is XXH3-128's canonical (big-endian) form,
// the one `xxhsum -H2` prints. Manifests of formats 1 and 2 carry SHA-256 per shard and are
// still read. The manifest's own checksum stays SHA-256 (it is a few kilobytes).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace lockstep::checkpoint {

enum class ShardChecksum { kSha256, kXxh3_128 };

// What a manifest of `format_version` checks its shards with, and its field name in a shard
// entry ("sha256" or "xxh3_128").
ShardChecksum ShardChecksumOf(int format_version);
const char* ShardChecksumField(ShardChecksum kind);

// Incremental hashing of one shard, which may span several tensors. Not thread-safe.
class ShardHasher {
 public:
  explicit ShardHasher(ShardChecksum kind);
  ~ShardHasher();
  ShardHasher(const ShardHasher&) = delete;
  ShardHasher& operator=(const ShardHasher&) = delete;

  void Update(const void* data, size_t size);
  // The digest in lowercase hex; the hasher must not be used afterwards.
  std::string FinishHex();

 private:
  ShardChecksum kind_;
  void* state_;  // EVP_MD_CTX* or XXH3_state_t*, kept out of the header
};

std::string ShardChecksumHex(ShardChecksum kind, const void* data, size_t size);

// SHA-256 (OpenSSL EVP) of `data`: the manifest's own checksum.
std::string Sha256Hex(const void* data, size_t size);

}  // namespace lockstep::checkpoint
