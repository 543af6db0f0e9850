#include "worker/checkpoint/checksum.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <cstdint>
#include <cstdlib>

namespace lockstep::checkpoint {
namespace {

std::string Hex(const unsigned char* digest, size_t size) {
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return hex;
}

}  // namespace

ShardChecksum ShardChecksumOf(int format_version) {
  return format_version >= 3 ? ShardChecksum::kXxh3_128 : ShardChecksum::kSha256;
}

const char* ShardChecksumField(ShardChecksum kind) {
  return kind == ShardChecksum::kXxh3_128 ? "xxh3_128" : "sha256";
}

ShardHasher::ShardHasher(ShardChecksum kind) : kind_(kind), state_(nullptr) {
  // Allocation failure or a missing algorithm in the library leaves nothing sensible to do.
  if (kind_ == ShardChecksum::kXxh3_128) {
    XXH3_state_t* state = XXH3_createState();
    if (state == nullptr || XXH3_128bits_reset(state) != XXH_OK) std::abort();
    state_ = state;
  } else {
    EVP_MD_CTX* context = EVP_MD_CTX_new();
    if (context == nullptr || EVP_DigestInit_ex(context, EVP_sha256(), nullptr) != 1) {
      std::abort();
    }
    state_ = context;
  }
}

ShardHasher::~ShardHasher() {
  if (kind_ == ShardChecksum::kXxh3_128) {
    XXH3_freeState(static_cast<XXH3_state_t*>(state_));
  } else {
    EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(state_));
  }
}

void ShardHasher::Update(const void* data, size_t size) {
  if (size == 0) return;
  if (kind_ == ShardChecksum::kXxh3_128) {
    XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, size);
  } else {
    EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(state_), data, size);
  }
}

std::string ShardHasher::FinishHex() {
  if (kind_ == ShardChecksum::kXxh3_128) {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_)));
    return Hex(canonical.digest, sizeof(canonical.digest));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_size = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(state_), digest, &digest_size);
  return Hex(digest, digest_size);
}

std::string ShardChecksumHex(ShardChecksum kind, const void* data, size_t size) {
  ShardHasher hasher(kind);
  hasher.Update(data, size);
  return hasher.FinishHex();
}

std::string Sha256Hex(const void* data, size_t size) {
  return ShardChecksumHex(ShardChecksum::kSha256, data, size);
}

}  // namespace lockstep::checkpoint
