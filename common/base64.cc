// OpenSSL's EVP_EncodeBlock and EVP_DecodeBlock (libcrypto, which the build links already), with
// what they leave to the caller: whitespace inside the text, the length check, and the zero bytes
// EVP_DecodeBlock writes for the padding.
#include "common/base64.h"

#include <openssl/evp.h>

#include <algorithm>
#include <climits>

namespace lockstep {

std::string Base64Encode(const std::string& bytes) {
  if (bytes.empty()) return "";
  std::string out((bytes.size() + 2) / 3 * 4 + 1, '\0');  // + 1: EVP_EncodeBlock's final NUL
  const int written = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                      reinterpret_cast<const unsigned char*>(bytes.data()),
                                      static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(std::max(written, 0)));
  return out;
}

StatusOr<std::string> Base64Decode(const std::string& text) {
  std::string symbols;
  symbols.reserve(text.size());
  for (char c : text) {
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') symbols.push_back(c);
  }
  if (symbols.size() % 4 != 0) return InvalidArgumentError("not base64: bad length");
  if (symbols.size() > static_cast<size_t>(INT_MAX))
    return InvalidArgumentError("not base64: too long");
  if (symbols.empty()) return std::string();
  // '=' only as the last one or two symbols: EVP_DecodeBlock does not check where it stands.
  const size_t first_pad = symbols.find('=');
  const size_t padding = first_pad == std::string::npos ? 0 : symbols.size() - first_pad;
  if (padding > 2 || symbols.find_first_not_of('=', first_pad) != std::string::npos) {
    return InvalidArgumentError("not base64: '=' before the end at offset " +
                                std::to_string(first_pad));
  }
  std::string out(symbols.size() / 4 * 3, '\0');
  const int written = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                      reinterpret_cast<const unsigned char*>(symbols.data()),
                                      static_cast<int>(symbols.size()));
  if (written < 0) return InvalidArgumentError("not base64: a character outside the alphabet");
  out.resize(static_cast<size_t>(written) - padding);
  return out;
}

}  // namespace lockstep
