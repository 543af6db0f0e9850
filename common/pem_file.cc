#include "common/pem_file.h"

#include <fstream>

#include "common/env.h"

namespace lockstep {

StatusOr<std::string> PemFileNamedBy(const char* variable, const std::string& needle,
                                     const std::string& what) {
  const std::string path = EnvString(variable, "");
  if (path.empty()) return std::string();
  return PemFile(path, needle, what, variable);
}

StatusOr<std::string> PemFile(const std::string& path, const std::string& needle,
                              const std::string& what, const std::string& named_by) {
  const std::string& variable = named_by;
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError(std::string(variable) + ": cannot read " + path);
  // A certificate chain or a key is a few KiB.
  constexpr std::streamsize kMaxBytes = 1 << 20;
  std::string pem(static_cast<size_t>(kMaxBytes) + 1, '\0');
  in.read(pem.data(), kMaxBytes + 1);
  pem.resize(static_cast<size_t>(in.gcount()));
  if (in.bad()) return InvalidArgumentError(std::string(variable) + ": cannot read " + path);
  if (pem.size() > static_cast<size_t>(kMaxBytes)) {
    return InvalidArgumentError(std::string(variable) + ": " + path + " is over 1 MiB");
  }
  if (pem.find(needle) == std::string::npos) {
    return InvalidArgumentError(std::string(variable) + ": " + path + " holds no " + what);
  }
  return pem;
}

}  // namespace lockstep
