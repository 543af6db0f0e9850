// SHA-256 of byte ranges (OpenSSL EVP), as lowercase hex: the integrity check of checkpoint shards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep::checkpoint {

// Incremental hashing, for a shard that spans several tensors. Not thread-safe.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size);
  // 64 lowercase hex digits; the hasher must not be used afterwards.
  std::string FinishHex();

 private:
  void* context_;  // EVP_MD_CTX*, kept out of the header
};

std::string Sha256Hex(const void* data, size_t size);

}  // namespace lockstep::checkpoint
