// Cutting text to a byte budget without splitting a character: Kubernetes refuses a status or a
// termination message that is not valid UTF-8.
#pragma once

#include <cstddef>
#include <string>

namespace lockstep {

// At most `max_bytes` bytes of `text`, cut before a UTF-8 continuation byte.
inline std::string Utf8Prefix(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t end = max_bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

}  // namespace lockstep
