#include "common/env.h"

#include <cstdlib>
#include <iostream>

namespace lockstep {

std::string EnvString(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  return value;
}

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  long long parsed = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0') {
    std::cerr << "lockstep: ignoring " << name << "=" << value << ": not an integer; using "
              << fallback << "\n";
    return fallback;
  }
  return parsed;
}

double EnvDouble(const char* name, double fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  double parsed = std::strtod(value, &end);
  if (end == value || *end != '\0') {
    std::cerr << "lockstep: ignoring " << name << "=" << value << ": not a number; using "
              << fallback << "\n";
    return fallback;
  }
  return parsed;
}

StatusOr<std::string> RequireEnv(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return NotFoundError(std::string("environment variable ") + name + " is not set");
  }
  return std::string(value);
}

}  // namespace lockstep
