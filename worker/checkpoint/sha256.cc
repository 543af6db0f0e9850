#include "worker/checkpoint/sha256.h"

#include <openssl/evp.h>

#include <cstdlib>

namespace lockstep::checkpoint {

Sha256::Sha256() : context_(EVP_MD_CTX_new()) {
  // Allocation failure or a missing SHA-256 in libcrypto leaves nothing sensible to do.
  if (context_ == nullptr ||
      EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(context_), EVP_sha256(), nullptr) != 1) {
    std::abort();
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(context_)); }

void Sha256::Update(const void* data, size_t size) {
  if (size > 0) EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(context_), data, size);
}

std::string Sha256::FinishHex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_size = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(context_), digest, &digest_size);
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * digest_size);
  for (unsigned int i = 0; i < digest_size; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return hex;
}

std::string Sha256Hex(const void* data, size_t size) {
  Sha256 hasher;
  hasher.Update(data, size);
  return hasher.FinishHex();
}

}  // namespace lockstep::checkpoint
